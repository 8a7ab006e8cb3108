// The one interface through which the API layer reaches a backend. A backend never includes
// another backend's headers; the API layer never includes a backend's internals.
#pragma once

#include <cstddef>
#include <memory>

#include "core/problem.hpp"
#include "core/ring.hpp"

namespace flashattn {

class Backend {
 public:
  virtual ~Backend() = default;

  virtual flashattn_backend_t kind() const = 0;
  virtual int device() const = 0;  // CUDA ordinal, -1 for the CPU
  // The CPU kernel copy the backend runs (NONE where it runs none).
  virtual flashattn_cpu_kernels_t cpu_kernels() const { return FLASHATTN_CPU_KERNELS_NONE; }

  // Throws Error(FLASHATTN_ERROR_UNSUPPORTED, why) when the problem cannot run here.
  virtual void check_supported(const Problem& p, bool backward) const = 0;
  // Bytes of scratch memory forward/backward need for p (after check_supported passed).
  virtual size_t workspace_size(const Problem& p, bool backward) const = 0;

  virtual void forward(const ForwardArgs& args, Workspace ws) = 0;
  virtual void backward(const BackwardArgs& args, Workspace ws) = 0;

  // Throws Error(FLASHATTN_ERROR_UNSUPPORTED, why) when a merge of this dtype cannot run here.
  virtual void check_merge_supported(DType dtype) const = 0;
  // The validated merge; no workspace: a merge needs none.
  virtual void merge(const MergeArgs& args) = 0;

  // Context parallelism (lib/parallel): the elementwise steps between its attention calls, in
  // order with them (on the context's stream for CUDA).
  virtual void ring_op(const RingOp& op) = 0;
  // A transport over the caller's NCCL communicator (comm, an ncclComm_t of `ranks` ranks, this
  // one `rank`), checked against it. Throws UNSUPPORTED where there is no NCCL (the CPU).
  virtual std::unique_ptr<RingTransport> make_nccl_transport(void* comm, int64_t ranks,
                                                             int64_t rank) = 0;

  // Memory in the backend's space, 256-byte aligned. allocate throws OUT_OF_MEMORY or
  // DEVICE_OUT_OF_MEMORY; deallocate waits for enqueued work that may use the memory.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr) noexcept = 0;
  // Synchronous copies between host memory and backend memory, after enqueued work.
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;

  // Throws INVALID_MEMORY when [ptr, ptr + bytes) cannot be memory this backend may touch
  // (a host pointer given to CUDA, memory of another device, a range past its allocation).
  // `name` names the argument in the message.
  virtual void check_memory(const void* ptr, size_t bytes, const char* name) const = 0;

  virtual void set_stream(void* stream) = 0;
  virtual void* stream() const = 0;
  virtual void synchronize() = 0;
  virtual void set_num_threads(int n) = 0;
};

std::unique_ptr<Backend> make_cpu_backend();
// Throws BACKEND_UNAVAILABLE when CUDA is not compiled in or the device cannot be used.
std::unique_ptr<Backend> make_cuda_backend(int device);
// Usable CUDA devices; 0 when CUDA is not compiled in or there is no driver. Never throws.
int cuda_device_count() noexcept;

}  // namespace flashattn
