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

struct Case {
  flashattn_dtype_t dtype = FLASHATTN_DTYPE_FLOAT32;
  int64_t batch = 1, seqlen_q = 1, seqlen_k = 1, heads_q = 1, heads_kv = 1, head_dim = 1;
  bool causal = false;
  float scale = 0.0f;  // as passed in the options (0: 1/sqrt(head_dim))
  Layout layout = Layout::Contiguous;
  uint64_t seed = 1;
  int threads = 2;

  std::string name() const;
  RefProblem ref() const;
};

struct Inputs {
  HostTensor q, k, v, dout;
};
Inputs make_inputs(const Case& c);
// Output-shaped tensors (like q, or like k) in the case's layout, poisoned with NaN.
HostTensor make_output(const Case& c, bool like_k);

struct ForwardResult {
  HostTensor out, lse;
};
struct BackwardResult {
  HostTensor dq, dk, dv;
};

flashattn_options_t options_for(const Case& c, flashattn_algorithm_t algorithm);

// Forward into poisoned outputs; CHECKs the status and that nothing outside the views changed.
ForwardResult run_forward(flashattn_context_t ctx, const Case& c, const Inputs& in,
                          flashattn_algorithm_t algorithm, bool with_lse = true);
BackwardResult run_backward(flashattn_context_t ctx, const Case& c, const Inputs& in,
                            const ForwardResult& fwd, flashattn_algorithm_t algorithm);

// What the standard algorithm may miss the reference by: output rounding to the dtype plus
// fp32 accumulation, relative to the largest magnitude.
double standard_tolerance(flashattn_dtype_t dtype, const std::vector<double>& ref);

// Flash and standard forward against the reference: the rule for out and LSE, no NaN, fully
// masked rows exactly 0 / -inf, and standard within a plain bound of the reference.
void check_forward(const Case& c);
// Flash and standard backward against the reference gradients by the rule.
void check_backward(const Case& c);

}  // namespace flashattn_test
