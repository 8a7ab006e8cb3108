// What the GPU tests of the attention variants share: a case with every variant of
// flashattn_args_t (window, softcap, ALiBi, sinks, a head_dim of v of its own, variable-length
// batches) and its layouts; host inputs and the float64 reference; the calls through
// flashattn_forward_ex / flashattn_backward_ex on the CUDA context (views in device memory,
// offsets too) or on a CPU context; the verdict of the expectation table on each call (a pass
// the table expects that answers UNSUPPORTED fails, one it does not expect is reported skipped
// with the library's message); and the checks of one case by the tolerance rule.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gpu_harness.hpp"

namespace gpu_variants {

using flashattn_test::HostTensor;

enum class Slopes { None, PerHead, PerBatchHead };

enum class Layout {
  Contiguous,  // tight [B, N, H, D]; rows are not 16-byte aligned when D is not a multiple of 8
  Aligned,     // head stride D rounded up to a multiple of 8, plus 8; gaps of 16 and 24 elements
               // after each row and batch: strided, 16-byte aligned rows whatever D is
  Unaligned,   // gaps of 3, 5 and 7 elements (rows not 16-byte aligned)
  PackedQKV,   // q, k, v slices of one [B, N, Hq + 2 Hkv, D] tensor (Nq == Nk, Dv == D)
};

struct Case {
  std::string label;
  flashattn_dtype_t dtype = FLASHATTN_DTYPE_BFLOAT16;
  int64_t b = 1, nq = 1, nk = 1, hq = 1, hkv = 1, d = 64;
  int64_t dv = 0;  // 0: d
  bool causal = false;
  float scale = 0.0f;  // options.softmax_scale (0: 1/sqrt(d))
  bool window = false;
  int32_t left = -1, right = -1;
  float softcap = 0.0f;
  Slopes alibi = Slopes::None;
  bool sinks = false;
  bool want_dsinks = true;  // with sinks: the backward asks for dsinks
  // A variable-length batch of lq.size() sequences (b, nq, nk are then unused); max_seqlen_q
  // and max_seqlen_k are the longest lengths plus `slack`.
  std::vector<int64_t> lq, lk;
  int64_t slack = 0;
  Layout layout = Layout::Contiguous;
  int32_t num_splits = 0;  // options.num_splits (0: the library chooses)
  uint64_t seed = 1;

  bool varlen() const { return !lq.empty(); }
  int64_t head_dim_v() const { return dv > 0 ? dv : d; }
  int64_t batch() const { return varlen() ? static_cast<int64_t>(lq.size()) : b; }
  int64_t total_q() const;
  int64_t total_k() const;
  int64_t max_q() const;  // max_seqlen_q of a variable-length batch, else nq
  int64_t max_k() const;
  std::string name() const;
};

// Builders, each returning a copy with one more property.
Case make(flashattn_dtype_t dtype, int64_t b, int64_t nq, int64_t nk, int64_t hq, int64_t hkv,
          int64_t d, bool causal = false);
Case windowed(Case c, int32_t left, int32_t right);
Case softcapped(Case c, float cap);
Case with_alibi(Case c, Slopes slopes = Slopes::PerHead);
Case with_sinks(Case c);
Case with_dv(Case c, int64_t dv);
Case laid_out(Case c, Layout layout);
Case varlen(Case c, std::vector<int64_t> lq, std::vector<int64_t> lk, int64_t slack = 0);

// ---- Expectations -----------------------------------------------------------------------------

// What a case may ask for beyond plain (causal) attention with GQA.
enum Variant {
  kWindow,  // a sliding window that is not just the causal mask
  kSoftcap,
  kAlibiPerHead,   // slopes [Hq]
  kAlibiPerBatch,  // slopes [B, Hq]
  kSinks,          // sinks (and, in the backward, dsinks)
  kHeadDimV,       // a head_dim of v that differs from q's
  kOddHeadDim,     // a head_dim (of q or of v) that is not a multiple of 8
  kVarlen,         // cu_seqlens_q / cu_seqlens_k
  kVariantCount
};
std::string variant_name(Variant v);
std::vector<Variant> variants_of(const Case& c);

// Who computes a pass: the standard algorithm (cuBLAS), or one of the two flash kernel families.
enum class Family { Standard, FlashSm90, FlashSm80 };
enum class Pass { Forward, Backward };
std::string family_name(Family f);
std::string pass_name(Pass p);

// Defined beside the table in test_variants.cpp: is `v` expected to be supported by `f` in `p`?
bool expected(Family f, Pass p, Variant v);
// Every variant of c expected for (f, p).
bool expected_for(Family f, Pass p, const Case& c);

// The family that runs a pass of `algorithm` on device 0. The flash path on Hopper (sm_90) runs
// the Hopper kernels (the backward, which exists for head dims 64, 128 and 256, on the next
// larger one for 96 and 192); on other devices, and with FLASHATTN_TEST_FORCE_SM80=1 in a
// FLASHATTN_TEST_HOOKS build, the sm80 (mma.sync) kernels run.
Family family_of(flashattn_algorithm_t algorithm, Pass pass, const Case& c);
// The line the suite prints first: the device, whether the sm80 kernels are forced.
void print_family_banner();

// Counts what a test case ran and skipped, says each distinct skip reason once (MESSAGE), and
// prints a summary at the end.
class Tally {
 public:
  explicit Tally(const char* what) : what_(what) {}
  ~Tally();
  Tally(const Tally&) = delete;
  Tally& operator=(const Tally&) = delete;
  void ran() { ++ran_; }
  // Not in the table and UNSUPPORTED: reported as skipped with the library's message.
  void skipped(Family f, Pass p, const Case& c, const std::string& reason);
  // Ran although the table does not expect it: the table can be widened.
  void beyond_table(Family f, Pass p, const Case& c);

 private:
  void once(const std::string& key, const std::string& text);
  const char* what_;
  int ran_ = 0, skipped_ = 0, beyond_ = 0;
  std::map<std::string, int> seen_;
};

// ---- Inputs and calls -------------------------------------------------------------------------

// The tensors of a case. A variable-length batch is stored as [1, total, H, D] (its LSE as
// [1, Hq, total_q]); the calls see [total, H, D] ([Hq, total_q]).
struct Inputs {
  HostTensor q, k, v, dout;
  HostTensor alibi, sinks;  // fp32; empty unless the case has them
  std::vector<int32_t> cu_q, cu_k;
  flashattn_test::RefProblem ref;  // the case's problem with these slopes and sinks
};
Inputs make_inputs(const Case& c);

// An output (or dout) shaped like q's rows (like_k: like k's) with `head_dim`, in the case's
// layout (PackedQKV: contiguous), poisoned with NaN.
HostTensor make_output(const Case& c, bool like_k, int64_t head_dim);
HostTensor make_lse(const Case& c);

struct Results {
  HostTensor out, lse;            // forward
  HostTensor dq, dk, dv, dsinks;  // backward (dsinks only with sinks and want_dsinks)
};

struct CallStatus {
  flashattn_status_t query = FLASHATTN_SUCCESS;  // flashattn_supported_ex
  flashattn_status_t call = FLASHATTN_SUCCESS;   // the pass itself (only when the query said yes)
  std::string message;                           // the library's message for the first refusal
};

// One pass of `algorithm` with every output poisoned first, on the CUDA context (device) or a
// CPU context; the backward reads `fwd`'s out and lse. CHECKs that nothing outside the output
// views changed.
CallStatus run_pass(flashattn_context_t ctx, bool device, Pass pass, const Case& c,
                    const Inputs& in, flashattn_algorithm_t algorithm, int deterministic,
                    const Results* fwd, Results* r);

// run_pass on the CUDA context, judged by the table: true when the pass ran (results in *r);
// false after a failure (expected, but refused) or a report (skipped).
bool attempt(Tally& tally, Pass pass, const Case& c, const Inputs& in,
             flashattn_algorithm_t algorithm, int deterministic, const Results* fwd, Results* r);

// The float64 forward's out and lse in the case's dtype and layout: what every backward reads.
Results reference_forward_results(const Case& c, const Inputs& in, std::vector<double>* out,
                                  std::vector<double>* lse);

// The whole check of one case: forward and backward of both algorithms on the CUDA context.
// The standard result within a few units of the dtype of float64; the flash result by the rule
// against float64 with the standard result as base (the CPU backend's standard algorithm in
// the same dtype when the CUDA one does not run the case), 3x with a softcap; no NaN; rows that
// see no key exactly 0 (out, dq) and -inf (lse).
void check_case(const Case& c, Tally& tally);

// The rule's factor for c (3 with a softcap: see variant_harness.cpp).
double rule_factor(const Case& c);

}  // namespace gpu_variants
