#include "common/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flashattn_test {
namespace {

struct Index {
  const RefProblem& p;
  size_t q(int64_t b, int64_t i, int64_t h, int64_t x) const {
    return static_cast<size_t>(((b * p.seqlen_q + i) * p.heads_q + h) * p.head_dim + x);
  }
  size_t k(int64_t b, int64_t j, int64_t h, int64_t x) const {
    return static_cast<size_t>(((b * p.seqlen_k + j) * p.heads_kv + h) * p.head_dim + x);
  }
  size_t lse(int64_t b, int64_t h, int64_t i) const {
    return static_cast<size_t>((b * p.heads_q + h) * p.seqlen_q + i);
  }
};

// Keys [0, visible) are seen by query i.
int64_t visible(const RefProblem& p, int64_t i) {
  if (!p.causal) return p.seqlen_k;
  return std::min(p.seqlen_k, std::max<int64_t>(0, i + p.seqlen_k - p.seqlen_q + 1));
}

// Probabilities of one row into `prob` (size Nk, zeros past the visible keys); returns the LSE.
double row_probs(const RefProblem& p, const Index& ix, const std::vector<double>& q,
                 const std::vector<double>& k, int64_t b, int64_t i, int64_t h,
                 std::vector<double>* prob) {
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  const int64_t n = visible(p, i);
  std::fill(prob->begin(), prob->end(), 0.0);
  if (n == 0) return -std::numeric_limits<double>::infinity();
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    double s = 0.0;
    for (int64_t x = 0; x < p.head_dim; ++x) s += q[ix.q(b, i, h, x)] * k[ix.k(b, j, hk, x)];
    (*prob)[j] = s * p.scale;
    mx = std::max(mx, (*prob)[j]);
  }
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    (*prob)[j] = std::exp((*prob)[j] - mx);
    sum += (*prob)[j];
  }
  for (int64_t j = 0; j < n; ++j) (*prob)[j] /= sum;
  return mx + std::log(sum);
}

}  // namespace

double library_scale(int64_t head_dim, float requested) {
  const float s = requested != 0.0f
                      ? requested
                      : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  return static_cast<double>(s);
}

void reference_forward(const RefProblem& p, const std::vector<double>& q,
                       const std::vector<double>& k, const std::vector<double>& v,
                       std::vector<double>* out, std::vector<double>* lse) {
  const Index ix{p};
  out->assign(q.size(), 0.0);
  if (lse != nullptr) lse->assign(static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q), 0.0);
  std::vector<double> prob(static_cast<size_t>(p.seqlen_k));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / (p.heads_q / p.heads_kv);
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const double l = row_probs(p, ix, q, k, b, i, h, &prob);
        if (lse != nullptr) (*lse)[ix.lse(b, h, i)] = l;
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          if (prob[j] == 0.0) continue;
          for (int64_t x = 0; x < p.head_dim; ++x)
            (*out)[ix.q(b, i, h, x)] += prob[j] * v[ix.k(b, j, hk, x)];
        }
      }
    }
}

void reference_backward(const RefProblem& p, const std::vector<double>& q,
                        const std::vector<double>& k, const std::vector<double>& v,
                        const std::vector<double>& dout, std::vector<double>* dq,
                        std::vector<double>* dk, std::vector<double>* dv) {
  const Index ix{p};
  dq->assign(q.size(), 0.0);
  dk->assign(k.size(), 0.0);
  dv->assign(v.size(), 0.0);
  std::vector<double> prob(static_cast<size_t>(p.seqlen_k));
  std::vector<double> dprob(static_cast<size_t>(p.seqlen_k));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / (p.heads_q / p.heads_kv);
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        row_probs(p, ix, q, k, b, i, h, &prob);
        const int64_t n = visible(p, i);
        // dP_j = dO . v_j; dS_j = P_j (dP_j - sum_l P_l dP_l)
        double dot = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          double s = 0.0;
          for (int64_t x = 0; x < p.head_dim; ++x)
            s += dout[ix.q(b, i, h, x)] * v[ix.k(b, j, hk, x)];
          dprob[j] = s;
          dot += prob[j] * s;
        }
        for (int64_t j = 0; j < n; ++j) {
          const double ds = prob[j] * (dprob[j] - dot) * p.scale;
          for (int64_t x = 0; x < p.head_dim; ++x) {
            (*dq)[ix.q(b, i, h, x)] += ds * k[ix.k(b, j, hk, x)];
            (*dk)[ix.k(b, j, hk, x)] += ds * q[ix.q(b, i, h, x)];
            (*dv)[ix.k(b, j, hk, x)] += prob[j] * dout[ix.q(b, i, h, x)];
          }
        }
      }
    }
}

}  // namespace flashattn_test
