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
template <class Real>
Real row_probs(const RefProblem& p, const Index& ix, const std::vector<Real>& q,
               const std::vector<Real>& k, int64_t b, int64_t i, int64_t h,
               std::vector<Real>* prob) {
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  const int64_t n = visible(p, i);
  const Real scale = static_cast<Real>(p.scale);
  std::fill(prob->begin(), prob->end(), Real(0));
  if (n == 0) return -std::numeric_limits<Real>::infinity();
  Real mx = -std::numeric_limits<Real>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    Real s = 0;
    for (int64_t x = 0; x < p.head_dim; ++x) s += q[ix.q(b, i, h, x)] * k[ix.k(b, j, hk, x)];
    (*prob)[j] = s * scale;
    mx = std::max(mx, (*prob)[j]);
  }
  Real sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    (*prob)[j] = std::exp((*prob)[j] - mx);
    sum += (*prob)[j];
  }
  for (int64_t j = 0; j < n; ++j) (*prob)[j] /= sum;
  return mx + std::log(sum);
}

template <class Real>
std::vector<Real> as(const std::vector<double>& x) {
  return std::vector<Real>(x.begin(), x.end());
}

void widen(const std::vector<float>& from, std::vector<double>* to) {
  if (to != nullptr) to->assign(from.begin(), from.end());
}

template <class Real>
void forward_in(const RefProblem& p, const std::vector<Real>& q, const std::vector<Real>& k,
                const std::vector<Real>& v, std::vector<Real>* out, std::vector<Real>* lse) {
  const Index ix{p};
  out->assign(q.size(), Real(0));
  if (lse != nullptr) lse->assign(static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q), Real(0));
  std::vector<Real> prob(static_cast<size_t>(p.seqlen_k));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / (p.heads_q / p.heads_kv);
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const Real l = row_probs(p, ix, q, k, b, i, h, &prob);
        if (lse != nullptr) (*lse)[ix.lse(b, h, i)] = l;
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          if (prob[j] == Real(0)) continue;
          for (int64_t x = 0; x < p.head_dim; ++x)
            (*out)[ix.q(b, i, h, x)] += prob[j] * v[ix.k(b, j, hk, x)];
        }
      }
    }
}

template <class Real>
void backward_in(const RefProblem& p, const std::vector<Real>& q, const std::vector<Real>& k,
                 const std::vector<Real>& v, const std::vector<Real>& dout, std::vector<Real>* dq,
                 std::vector<Real>* dk, std::vector<Real>* dv) {
  const Index ix{p};
  const Real scale = static_cast<Real>(p.scale);
  dq->assign(q.size(), Real(0));
  dk->assign(k.size(), Real(0));
  dv->assign(v.size(), Real(0));
  std::vector<Real> prob(static_cast<size_t>(p.seqlen_k));
  std::vector<Real> dprob(static_cast<size_t>(p.seqlen_k));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / (p.heads_q / p.heads_kv);
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        row_probs(p, ix, q, k, b, i, h, &prob);
        const int64_t n = visible(p, i);
        // dP_j = dO . v_j; dS_j = P_j (dP_j - sum_l P_l dP_l)
        Real dot = 0;
        for (int64_t j = 0; j < n; ++j) {
          Real s = 0;
          for (int64_t x = 0; x < p.head_dim; ++x)
            s += dout[ix.q(b, i, h, x)] * v[ix.k(b, j, hk, x)];
          dprob[j] = s;
          dot += prob[j] * s;
        }
        for (int64_t j = 0; j < n; ++j) {
          const Real ds = prob[j] * (dprob[j] - dot) * scale;
          for (int64_t x = 0; x < p.head_dim; ++x) {
            (*dq)[ix.q(b, i, h, x)] += ds * k[ix.k(b, j, hk, x)];
            (*dk)[ix.k(b, j, hk, x)] += ds * q[ix.q(b, i, h, x)];
            (*dv)[ix.k(b, j, hk, x)] += prob[j] * dout[ix.q(b, i, h, x)];
          }
        }
      }
    }
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
  forward_in<double>(p, q, k, v, out, lse);
}

void reference_backward(const RefProblem& p, const std::vector<double>& q,
                        const std::vector<double>& k, const std::vector<double>& v,
                        const std::vector<double>& dout, std::vector<double>* dq,
                        std::vector<double>* dk, std::vector<double>* dv) {
  backward_in<double>(p, q, k, v, dout, dq, dk, dv);
}

void naive_fp32_forward(const RefProblem& p, const std::vector<double>& q,
                        const std::vector<double>& k, const std::vector<double>& v,
                        std::vector<double>* out, std::vector<double>* lse) {
  std::vector<float> o, l;
  forward_in<float>(p, as<float>(q), as<float>(k), as<float>(v), &o, lse != nullptr ? &l : nullptr);
  widen(o, out);
  widen(l, lse);
}

void naive_fp32_backward(const RefProblem& p, const std::vector<double>& q,
                         const std::vector<double>& k, const std::vector<double>& v,
                         const std::vector<double>& dout, std::vector<double>* dq,
                         std::vector<double>* dk, std::vector<double>* dv) {
  std::vector<float> gq, gk, gv;
  backward_in<float>(p, as<float>(q), as<float>(k), as<float>(v), as<float>(dout), &gq, &gk, &gv);
  widen(gq, dq);
  widen(gk, dk);
  widen(gv, dv);
}

}  // namespace flashattn_test
