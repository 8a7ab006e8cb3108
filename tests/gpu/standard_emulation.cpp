#include "standard_emulation.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/tensors.hpp"

namespace gpu_test {

using flashattn_test::RefProblem;
using flashattn_test::round_to;

namespace {

struct Index {
  const RefProblem& p;
  size_t q(int64_t b, int64_t i, int64_t h) const {
    return static_cast<size_t>(((b * p.seqlen_q + i) * p.heads_q + h) * p.head_dim);
  }
  size_t k(int64_t b, int64_t j, int64_t h) const {
    return static_cast<size_t>(((b * p.seqlen_k + j) * p.heads_kv + h) * p.head_dim);
  }
};

int64_t visible(const RefProblem& p, int64_t i) {
  if (!p.causal) return p.seqlen_k;
  return std::min(p.seqlen_k, std::max<int64_t>(0, i + p.seqlen_k - p.seqlen_q + 1));
}

double dot(const double* a, const double* b, int64_t n) {
  double s = 0.0;
  for (int64_t x = 0; x < n; ++x) s += a[x] * b[x];
  return s;
}

// P of one row as the GPU stores it (dtype), zeros past the visible keys; returns the LSE.
double row_probabilities(const RefProblem& p, flashattn_dtype_t dtype, const Index& ix,
                         const std::vector<double>& q, const std::vector<double>& k, int64_t b,
                         int64_t i, int64_t h, std::vector<double>* prob) {
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  const int64_t n = visible(p, i);
  std::fill(prob->begin(), prob->end(), 0.0);
  if (n == 0) return -std::numeric_limits<double>::infinity();
  const float scale = static_cast<float>(p.scale);
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    // S = alpha * (Q K^T) in fp32
    const float s = scale * static_cast<float>(dot(&q[ix.q(b, i, h)], &k[ix.k(b, j, hk)], p.head_dim));
    (*prob)[j] = s;
    mx = std::max(mx, (*prob)[j]);
  }
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    (*prob)[j] = std::exp((*prob)[j] - mx);
    sum += (*prob)[j];
  }
  for (int64_t j = 0; j < n; ++j) (*prob)[j] = round_to(dtype, (*prob)[j] / sum);
  return mx + std::log(sum);
}

}  // namespace

void emulate_standard_forward(const RefProblem& p, flashattn_dtype_t dtype,
                              const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, std::vector<double>* out,
                              std::vector<double>* lse) {
  const Index ix{p};
  out->assign(q.size(), 0.0);
  lse->assign(static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q), 0.0);
  std::vector<double> prob(static_cast<size_t>(p.seqlen_k));
  std::vector<double> acc(static_cast<size_t>(p.head_dim));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / (p.heads_q / p.heads_kv);
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        (*lse)[static_cast<size_t>((b * p.heads_q + h) * p.seqlen_q + i)] =
            row_probabilities(p, dtype, ix, q, k, b, i, h, &prob);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          if (prob[j] == 0.0) continue;
          const double* vr = &v[ix.k(b, j, hk)];
          for (int64_t x = 0; x < p.head_dim; ++x) acc[x] += prob[j] * vr[x];
        }
        double* o = &(*out)[ix.q(b, i, h)];
        for (int64_t x = 0; x < p.head_dim; ++x) o[x] = round_to(dtype, acc[x]);
      }
    }
}

void emulate_standard_backward(const RefProblem& p, flashattn_dtype_t dtype,
                               const std::vector<double>& q, const std::vector<double>& k,
                               const std::vector<double>& v, const std::vector<double>& dout,
                               std::vector<double>* dq,
                               std::vector<double>* dk, std::vector<double>* dv) {
  const Index ix{p};
  dq->assign(q.size(), 0.0);
  dk->assign(k.size(), 0.0);
  dv->assign(v.size(), 0.0);
  std::vector<double> prob(static_cast<size_t>(p.seqlen_k));
  const int64_t d = p.head_dim;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / (p.heads_q / p.heads_kv);
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        row_probabilities(p, dtype, ix, q, k, b, i, h, &prob);
        const double* dor = &dout[ix.q(b, i, h)];
        const double* qr = &q[ix.q(b, i, h)];
        double* dqr = &(*dq)[ix.q(b, i, h)];
        // dP in fp32 (the GEMM's output), D = rowsum(P * dP) over the keys with P != 0.
        std::vector<double> dp(static_cast<size_t>(p.seqlen_k), 0.0);
        double row_d = 0.0;
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          if (prob[j] == 0.0) continue;
          dp[j] = static_cast<float>(dot(dor, &v[ix.k(b, j, hk)], d));
          row_d += prob[j] * dp[j];
        }
        row_d = static_cast<float>(row_d);
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          // P is zero past the mask, and so are dS and P's share of dV.
          if (prob[j] == 0.0) continue;
          const double ds = round_to(dtype, prob[j] * (dp[j] - row_d));
          const double* kr = &k[ix.k(b, j, hk)];
          double* dkr = &(*dk)[ix.k(b, j, hk)];
          double* dvr = &(*dv)[ix.k(b, j, hk)];
          for (int64_t x = 0; x < d; ++x) {
            dqr[x] += ds * kr[x];
            dkr[x] += ds * qr[x];
            dvr[x] += prob[j] * dor[x];
          }
        }
      }
    }
  const float scale = static_cast<float>(p.scale);
  for (double& x : *dq) x = round_to(dtype, static_cast<double>(scale * static_cast<float>(x)));
  for (double& x : *dk) x = round_to(dtype, static_cast<double>(scale * static_cast<float>(x)));
  for (double& x : *dv) x = round_to(dtype, x);
}

double emulation_tolerance(flashattn_dtype_t dtype, const std::vector<double>& ref, double ulps) {
  double m = 0.0;
  for (double x : ref)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  // A floor for results that are (nearly) all zero, e.g. dq when every row sees one key
  // (dS = P (dP - D) is then fp32 round-off, zero in the emulation).
  m = std::max(m, 0x1p-6);
  const int mantissa = dtype == FLASHATTN_DTYPE_BFLOAT16 ? 7 : dtype == FLASHATTN_DTYPE_FLOAT16 ? 10 : 23;
  const double ulp = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(m))) - mantissa);
  return ulps * ulp;
}

}  // namespace gpu_test
