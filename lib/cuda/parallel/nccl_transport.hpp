// The ring's transport on CUDA: NCCL send/recv on a stream of the context's own, ordered
// against the context's stream by events. NCCL is not linked: libnccl.so.2 is opened on first
// use (the copy the process already loaded to create its communicator).
#pragma once

#include <cstdint>
#include <memory>

#include <cuda_runtime.h>

#include "core/ring.hpp"

namespace flashattn {
namespace cuda {

// The stream and events the transfers use, made on first use and kept by the backend (so that a
// warm context allocates nothing per call).
class RingStreams {
 public:
  static constexpr int kSlots = 4;  // exchanges in flight at once (the ring has at most 2)
  explicit RingStreams(int device);
  ~RingStreams();
  RingStreams(const RingStreams&) = delete;
  RingStreams& operator=(const RingStreams&) = delete;

  cudaStream_t stream() const { return stream_; }
  cudaEvent_t ready(int slot) const { return ready_[slot]; }
  cudaEvent_t done(int slot) const { return done_[slot]; }

 private:
  void release() noexcept;

  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_[kSlots] = {};
  cudaEvent_t done_[kSlots] = {};
};

// Checks comm against ranks, rank and device (INVALID_ARGUMENT), and that NCCL can be loaded
// (UNSUPPORTED, with the loader's message).
std::unique_ptr<RingTransport> make_nccl_transport(RingStreams& streams, cudaStream_t compute,
                                                   void* comm, int64_t ranks, int64_t rank,
                                                   int device);

}  // namespace cuda
}  // namespace flashattn
