// The check of context parallelism, shared by the CPU and GPU tests: `ranks` threads, each with
// its own context (a CpRank the test makes: a CPU context, a CUDA context on one device, or one
// per GPU with NCCL), run flashattn_cp_forward and flashattn_cp_backward on their shards of one
// sequence; the gathered out, lse, dq, dk, dv (and the ranks' summed dsinks) are compared with
// one call over the whole sequence by the tolerance rule against the float64 reference.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <flashattn/flashattn.h>

#include "common/tensors.hpp"

namespace flashattn_test {

// Shared memory between the rank threads, for exchange transports: each exchange posts the
// rank's send buffer, waits for every rank, copies the previous rank's with `copy` (memcpy, or
// cudaMemcpy for device memory), and waits again before any buffer is reused.
class SharedRing {
 public:
  using Copy = std::function<void(void* dst, const void* src, size_t bytes)>;
  SharedRing(int ranks, Copy copy);
  // 0, or 1 when the ranks disagree on the size.
  int exchange(int rank, const void* send, void* recv, size_t bytes);

 private:
  struct Posted {
    const void* data = nullptr;
    size_t bytes = 0;
  };
  void barrier();
  int ranks_;
  Copy copy_;
  std::vector<Posted> posted_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int waiting_ = 0;
  int generation_ = 0;
};

// What an exchange function's user pointer points to.
struct RankLink {
  SharedRing* ring = nullptr;
  int rank = 0;
  int calls = 0;
  int fail_with = 0;  // nonzero: the exchange returns it instead of exchanging
};
int ring_exchange(void* user, const void* send, void* recv, size_t bytes);

struct CpCase {
  flashattn_dtype_t dtype = FLASHATTN_DTYPE_FLOAT32;
  int ranks = 2;
  int64_t layout = FLASHATTN_CP_LAYOUT_CONTIGUOUS;
  int64_t batch = 2, n = 8, hq = 4, hkv = 2, d = 16, dv = 8;  // n: each rank's tokens
  bool causal = false;
  int32_t window = 0, window_left = 0, window_right = 0;
  float softcap = 0.0f;
  bool sinks = false;
  bool caller_workspace = false;

  int64_t tokens() const { return ranks * n; }
  std::string label() const;
};

// The global token of rank `rank`'s local row i, as the header's layouts say.
int64_t cp_global_row(const CpCase& c, int rank, int64_t i);

// One rank's context and memory, made in (and used by) the rank's thread.
class CpRank {
 public:
  virtual ~CpRank() = default;
  virtual flashattn_context_t context() = 0;
  // A copy of t in the context's memory (the host tensor itself on the CPU).
  virtual flashattn_tensor_t place(const HostTensor& t) = 0;
  // The context's copy of t back into t.
  virtual void fetch(HostTensor& t) = 0;
  // Workspace of `bytes` in the context's memory.
  virtual void* workspace(size_t bytes) = 0;
  // Sets cp's transport for this rank (link: for an exchange over `ring`).
  virtual void set_transport(flashattn_cp_args_t* cp, RankLink* link) = 0;
};
// Makes rank r's CpRank (r = -1: the context of the one call over the whole sequence).
using CpRankFactory = std::function<std::unique_ptr<CpRank>(int rank)>;

// Runs the case and checks every result (doctest CHECKs).
void check_cp(const CpCase& c, const CpRankFactory& make_rank, const SharedRing::Copy& copy);

}  // namespace flashattn_test
