// A float64 reference of attention, forward and backward, for the numerics tests of every
// backend. Plain loops over contiguous [batch, seqlen, heads, head_dim] double arrays; the LSE
// is [batch, heads_q, seqlen_q]. The same loops in float are the naive fp32 implementation that
// fp32 results are measured against. Depends on nothing but the standard library.
#pragma once

#include <cstdint>
#include <vector>

namespace flashattn_test {

struct RefProblem {
  int64_t batch = 1;
  int64_t seqlen_q = 1;
  int64_t seqlen_k = 1;
  int64_t heads_q = 1;
  int64_t heads_kv = 1;
  int64_t head_dim = 1;
  double scale = 1.0;   // pass the fp32 value the library uses (see library_scale)
  bool causal = false;  // bottom-right aligned: key j hidden from query i when j > i + Nk - Nq
};

// The scale a library call uses for softmax_scale = `requested` (0: 1/sqrt(head_dim)), as the
// fp32 value it is, widened to double.
double library_scale(int64_t head_dim, float requested = 0.0f);

// out: [B, Nq, Hq, D]; lse: [B, Hq, Nq] natural log. A row that sees no key gets output 0 and
// LSE -inf.
void reference_forward(const RefProblem& p, const std::vector<double>& q,
                       const std::vector<double>& k, const std::vector<double>& v,
                       std::vector<double>* out, std::vector<double>* lse);

// Gradients of sum(out * dout): dq like q, dk and dv like k (summed over the query heads of a
// GQA group). Rows that see no key contribute nothing.
void reference_backward(const RefProblem& p, const std::vector<double>& q,
                        const std::vector<double>& k, const std::vector<double>& v,
                        const std::vector<double>& dout, std::vector<double>* dq,
                        std::vector<double>* dk, std::vector<double>* dv);

// The same two computations in float arithmetic throughout (inputs converted to float, results
// widened back): what a plain, unfused fp32 implementation achieves, the yardstick of the 2x rule
// for fp32.
void naive_fp32_forward(const RefProblem& p, const std::vector<double>& q,
                        const std::vector<double>& k, const std::vector<double>& v,
                        std::vector<double>* out, std::vector<double>* lse);
void naive_fp32_backward(const RefProblem& p, const std::vector<double>& q,
                         const std::vector<double>& k, const std::vector<double>& v,
                         const std::vector<double>& dout, std::vector<double>* dq,
                         std::vector<double>* dk, std::vector<double>* dv);

}  // namespace flashattn_test
