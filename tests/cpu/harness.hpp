// Runs the library's CPU forward and backward on host tensors through the C API, and checks
// the results against the float64 reference by the rule of tests/common/tolerance.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <flashattn/flashattn.h>

#include "common/reference.hpp"
#include "common/tensors.hpp"
#include "common/tolerance.hpp"

namespace flashattn_test {

// A CPU context for one test, destroyed at scope exit.
class CpuContext {
 public:
  explicit CpuContext(int threads = 2);
  ~CpuContext();
  CpuContext(const CpuContext&) = delete;
  CpuContext& operator=(const CpuContext&) = delete;
  flashattn_context_t get() const { return ctx_; }

 private:
  flashattn_context_t ctx_ = nullptr;
};

enum class Layout {
  Contiguous,
  Padded,       // every tensor, outputs included, with gaps between heads, rows, batches
  PackedQKV,    // q, k, v slices of one [B, N, Hq + 2 Hkv, D] allocation (needs Nq == Nk)
  BroadcastKV,  // k and v with batch stride 0
};

enum class Slopes { None, PerHead, PerBatchHead };

struct Case {
  flashattn_dtype_t dtype = FLASHATTN_DTYPE_FLOAT32;
  int64_t batch = 1, seqlen_q = 1, seqlen_k = 1, heads_q = 1, heads_kv = 1, head_dim = 1;
  int64_t head_dim_v = 0;  // 0: head_dim
  bool causal = false;
  float scale = 0.0f;  // as passed in the options (0: 1/sqrt(head_dim))
  Layout layout = Layout::Contiguous;
  uint64_t seed = 1;
  int threads = 2;
  // The variants (the defaults: none).
  bool window = false;
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  Slopes alibi = Slopes::None;
  bool sinks = false;
  int64_t num_splits = 0;  // options.num_splits (0: the library chooses)
  // A variable-length batch of `batch` sequences of these lengths (seqlen_q / seqlen_k are then
  // the max lengths passed, at least the longest); empty: a fixed-length batch.
  std::vector<int64_t> seqlens_q, seqlens_k;

  bool varlen() const { return !seqlens_q.empty(); }
  int64_t dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  // Whether the call needs flashattn_forward_ex (tensors of variants).
  bool needs_args() const { return varlen() || alibi != Slopes::None || sinks; }
  int64_t total_q() const;
  int64_t total_k() const;
  std::string name() const;
  RefProblem ref() const;  // the slopes and sinks come from make_inputs: see Inputs::ref
};

// A case of these sizes, every variant off; the seed is the suite's own (each keeps its inputs).
Case shaped_case(flashattn_dtype_t dtype, int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                 int64_t heads_q, int64_t heads_kv, int64_t head_dim, bool causal, uint64_t seed);

// The tensors of one case. For a variable-length batch the storage is [1, total, heads, d] (and
// the LSE [1, Hq, total_q]); the calls see it as [total, heads, d] ([Hq, total_q]).
struct Inputs {
  HostTensor q, k, v, dout;
  HostTensor alibi, sinks;  // fp32; empty tensors when the case has none
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;
  RefProblem ref(const Case& c) const;  // c.ref() with these slopes and sinks
};
Inputs make_inputs(const Case& c);
// Output-shaped tensors (like out, or like k / v) in the case's layout, poisoned with NaN.
HostTensor make_output(const Case& c, bool like_k, int64_t head_dim);

struct ForwardResult {
  HostTensor out, lse;
};
struct BackwardResult {
  HostTensor dq, dk, dv, dsinks;  // dsinks only with sinks
};

flashattn_options_t options_for(const Case& c, flashattn_algorithm_t algorithm);

// Forward into poisoned outputs; CHECKs the status and that nothing outside the views changed.
ForwardResult run_forward(flashattn_context_t ctx, const Case& c, const Inputs& in,
                          flashattn_algorithm_t algorithm, bool with_lse = true);
BackwardResult run_backward(flashattn_context_t ctx, const Case& c, const Inputs& in,
                            const ForwardResult& fwd, flashattn_algorithm_t algorithm);

// Each query row of the case (in the LSE's order) with where its output row lies.
struct QueryRow {
  size_t lse;          // index into the LSE's elements
  int64_t b, i, h;     // out.get(b, i, h, x)
};
std::vector<QueryRow> query_rows(const Case& c);

// What the standard algorithm may miss the reference by: output rounding to the dtype plus
// fp32 accumulation, relative to the largest magnitude.
double standard_tolerance(flashattn_dtype_t dtype, const std::vector<double>& ref);

// Flash and standard forward against the reference: the rule for out and LSE, no NaN, fully
// masked rows exactly 0 / -inf, and standard within a plain bound of the reference.
void check_forward(const Case& c);
// Flash and standard backward against the reference gradients by the rule.
void check_backward(const Case& c);

// FLASHATTN_CPU_ISA's names of the CPU kernel copies, in flashattn_cpu_kernels_t's order from
// FLASHATTN_CPU_KERNELS_GENERIC on.
constexpr const char* kCpuKernelsNames[] = {"generic", "avx2", "avx512", "avx512bf16", "amx"};
static_assert(sizeof(kCpuKernelsNames) / sizeof(kCpuKernelsNames[0]) ==
                  FLASHATTN_CPU_KERNELS_AMX - FLASHATTN_CPU_KERNELS_GENERIC + 1,
              "a name for every copy");

}  // namespace flashattn_test
