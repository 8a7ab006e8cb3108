// A float64 reference of attention, forward and backward, for the numerics tests of every
// backend, with every variant of the header: sliding window, softcap, ALiBi, attention sinks,
// a head_dim of v of its own, variable-length batches. Plain loops over contiguous double
// arrays; the same loops in float are the naive fp32 implementation that fp32 results are
// measured against. Depends on nothing but the standard library.
//
// Layouts: a fixed-length batch is q [B, Nq, Hq, D], k [B, Nk, Hkv, D], v [B, Nk, Hkv, Dv],
// out [B, Nq, Hq, Dv], lse [B, Hq, Nq]. A variable-length batch (seqlens_q non-empty) packs the
// same as q [total_q, Hq, D], k [total_k, Hkv, D], ... and lse [Hq, total_q], sequence b owning
// the rows after those of sequences 0 .. b-1.
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
  int64_t head_dim_v = 0;  // 0: head_dim
  double scale = 1.0;   // pass the fp32 value the library uses (see library_scale)
  bool causal = false;  // bottom-right aligned: key j hidden from query i when j > i + Nk - Nq
  // The sliding window: key j visible to query i when i + diag - left <= j <= i + diag + right
  // (-1: unbounded on that side); both -1 is no window. Combined with causal as the header says.
  int64_t window_left = -1;
  int64_t window_right = -1;
  double softcap = 0.0;       // 0: none; else s -> c tanh(s / c)
  std::vector<double> alibi;  // empty, [Hq], or [B, Hq] (alibi_per_batch)
  bool alibi_per_batch = false;
  std::vector<double> sinks;  // empty or [Hq]
  // A variable-length batch: the lengths of its `batch` sequences (seqlen_q / seqlen_k unused).
  std::vector<int64_t> seqlens_q, seqlens_k;

  int64_t dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  bool varlen() const { return !seqlens_q.empty(); }
  int64_t total_q() const;
  int64_t total_k() const;
};

// The scale a library call uses for softmax_scale = `requested` (0: 1/sqrt(head_dim)), as the
// fp32 value it is, widened to double.
double library_scale(int64_t head_dim, float requested = 0.0f);

// out and lse (natural log) in the layouts above. A row that sees no key gets output 0 and LSE
// -inf, a sink notwithstanding.
void reference_forward(const RefProblem& p, const std::vector<double>& q,
                       const std::vector<double>& k, const std::vector<double>& v,
                       std::vector<double>* out, std::vector<double>* lse);

// Gradients of sum(out * dout): dq like q, dk like k, dv like v (summed over the query heads of
// a GQA group), and with sinks (dsinks not null) their gradient [Hq]. Rows that see no key
// contribute nothing.
void reference_backward(const RefProblem& p, const std::vector<double>& q,
                        const std::vector<double>& k, const std::vector<double>& v,
                        const std::vector<double>& dout, std::vector<double>* dq,
                        std::vector<double>* dk, std::vector<double>* dv,
                        std::vector<double>* dsinks = nullptr);

// The same two computations in float arithmetic throughout (inputs converted to float, results
// widened back): what a plain, unfused fp32 implementation achieves, the yardstick of the 2x rule
// for fp32.
void naive_fp32_forward(const RefProblem& p, const std::vector<double>& q,
                        const std::vector<double>& k, const std::vector<double>& v,
                        std::vector<double>* out, std::vector<double>* lse);
void naive_fp32_backward(const RefProblem& p, const std::vector<double>& q,
                         const std::vector<double>& k, const std::vector<double>& v,
                         const std::vector<double>& dout, std::vector<double>* dq,
                         std::vector<double>* dk, std::vector<double>* dv,
                         std::vector<double>* dsinks = nullptr);

}  // namespace flashattn_test
