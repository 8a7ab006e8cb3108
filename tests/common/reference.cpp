#include "common/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flashattn_test {
namespace {

// Where one sequence's rows lie in the packed layout, and its lengths.
struct Seq {
  int64_t q0, nq, k0, nk;
};

Seq seq_of(const RefProblem& p, int64_t b) {
  if (!p.varlen()) return Seq{b * p.seqlen_q, p.seqlen_q, b * p.seqlen_k, p.seqlen_k};
  Seq s{0, p.seqlens_q[static_cast<size_t>(b)], 0, p.seqlens_k[static_cast<size_t>(b)]};
  for (int64_t c = 0; c < b; ++c) {
    s.q0 += p.seqlens_q[static_cast<size_t>(c)];
    s.k0 += p.seqlens_k[static_cast<size_t>(c)];
  }
  return s;
}

struct Index {
  const RefProblem& p;
  // Packed rows: (row * heads + h) * dim + x.
  size_t q(int64_t row, int64_t h, int64_t x) const {
    return static_cast<size_t>((row * p.heads_q + h) * p.head_dim + x);
  }
  size_t k(int64_t row, int64_t h, int64_t x) const {
    return static_cast<size_t>((row * p.heads_kv + h) * p.head_dim + x);
  }
  size_t v(int64_t row, int64_t h, int64_t x) const {
    return static_cast<size_t>((row * p.heads_kv + h) * p.dv() + x);
  }
  size_t o(int64_t row, int64_t h, int64_t x) const {
    return static_cast<size_t>((row * p.heads_q + h) * p.dv() + x);
  }
  size_t lse(int64_t b, const Seq& s, int64_t h, int64_t i) const {
    if (p.varlen()) return static_cast<size_t>(h * p.total_q() + s.q0 + i);
    return static_cast<size_t>((b * p.heads_q + h) * p.seqlen_q + i);
  }
};

bool visible(const RefProblem& p, const Seq& s, int64_t i, int64_t j) {
  const int64_t diag = s.nk - s.nq;
  if (p.causal && j > i + diag) return false;
  if (p.window_left >= 0 && j < i + diag - p.window_left) return false;
  if (p.window_right >= 0 && j > i + diag + p.window_right) return false;
  return true;
}

// One row's probabilities into `prob` (size nk; 0 where hidden), and the softcap's derivative
// 1 - tanh^2 per key into `dcap`. Returns the LSE (-inf for a row that sees no key) and sets
// *p_sink to the sink's probability.
template <class Real>
Real row_probs(const RefProblem& p, const Index& ix, const std::vector<Real>& q,
               const std::vector<Real>& k, int64_t b, const Seq& s, int64_t i, int64_t h,
               std::vector<Real>* prob, std::vector<Real>* dcap, Real* p_sink) {
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  const Real scale = static_cast<Real>(p.scale);
  const Real cap = static_cast<Real>(p.softcap);
  const Real slope =
      p.alibi.empty()
          ? Real(0)
          : static_cast<Real>(p.alibi[static_cast<size_t>(p.alibi_per_batch ? b * p.heads_q + h : h)]);
  const Real ninf = -std::numeric_limits<Real>::infinity();
  prob->assign(static_cast<size_t>(s.nk), Real(0));
  dcap->assign(static_cast<size_t>(s.nk), Real(1));
  *p_sink = Real(0);
  std::vector<bool> seen(static_cast<size_t>(s.nk));
  Real mx = ninf;
  bool any = false;
  for (int64_t j = 0; j < s.nk; ++j) {
    if (!visible(p, s, i, j)) continue;
    seen[static_cast<size_t>(j)] = any = true;
    Real x = 0;
    for (int64_t d = 0; d < p.head_dim; ++d) x += q[ix.q(s.q0 + i, h, d)] * k[ix.k(s.k0 + j, hk, d)];
    x *= scale;
    if (cap > 0) {
      const Real t = std::tanh(x / cap);
      x = cap * t;
      (*dcap)[static_cast<size_t>(j)] = Real(1) - t * t;
    }
    x -= slope * static_cast<Real>(std::abs(i + (s.nk - s.nq) - j));
    (*prob)[static_cast<size_t>(j)] = x;
    mx = std::max(mx, x);
  }
  if (!any) return ninf;
  const bool sink = !p.sinks.empty();
  const Real sink_logit = sink ? static_cast<Real>(p.sinks[static_cast<size_t>(h)]) : ninf;
  if (sink) mx = std::max(mx, sink_logit);
  Real sum = sink ? std::exp(sink_logit - mx) : Real(0);
  for (int64_t j = 0; j < s.nk; ++j) {
    if (!seen[static_cast<size_t>(j)]) continue;
    (*prob)[static_cast<size_t>(j)] = std::exp((*prob)[static_cast<size_t>(j)] - mx);
    sum += (*prob)[static_cast<size_t>(j)];
  }
  for (int64_t j = 0; j < s.nk; ++j) (*prob)[static_cast<size_t>(j)] /= sum;
  if (sink) *p_sink = std::exp(sink_logit - mx) / sum;
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
  const int64_t dv = p.dv();
  out->assign(static_cast<size_t>(p.total_q() * p.heads_q * dv), Real(0));
  if (lse != nullptr) lse->assign(static_cast<size_t>(p.heads_q * p.total_q()), Real(0));
  std::vector<Real> prob, dcap;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Seq s = seq_of(p, b);
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / (p.heads_q / p.heads_kv);
      for (int64_t i = 0; i < s.nq; ++i) {
        Real p_sink;
        const Real l = row_probs(p, ix, q, k, b, s, i, h, &prob, &dcap, &p_sink);
        if (lse != nullptr) (*lse)[ix.lse(b, s, h, i)] = l;
        for (int64_t j = 0; j < s.nk; ++j) {
          if (prob[static_cast<size_t>(j)] == Real(0)) continue;
          for (int64_t x = 0; x < dv; ++x)
            (*out)[ix.o(s.q0 + i, h, x)] += prob[static_cast<size_t>(j)] * v[ix.v(s.k0 + j, hk, x)];
        }
      }
    }
  }
}

template <class Real>
void backward_in(const RefProblem& p, const std::vector<Real>& q, const std::vector<Real>& k,
                 const std::vector<Real>& v, const std::vector<Real>& dout, std::vector<Real>* dq,
                 std::vector<Real>* dk, std::vector<Real>* dv, std::vector<Real>* dsinks) {
  const Index ix{p};
  const Real scale = static_cast<Real>(p.scale);
  const int64_t hdv = p.dv();
  dq->assign(q.size(), Real(0));
  dk->assign(k.size(), Real(0));
  dv->assign(v.size(), Real(0));
  if (dsinks != nullptr) dsinks->assign(static_cast<size_t>(p.heads_q), Real(0));
  std::vector<Real> prob, dcap, dprob;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Seq s = seq_of(p, b);
    dprob.assign(static_cast<size_t>(s.nk), Real(0));
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / (p.heads_q / p.heads_kv);
      for (int64_t i = 0; i < s.nq; ++i) {
        Real p_sink;
        const Real l = row_probs(p, ix, q, k, b, s, i, h, &prob, &dcap, &p_sink);
        if (std::isinf(l)) continue;  // a row that sees no key
        // dP_j = dO . v_j; dS_j = P_j (dP_j - sum_l P_l dP_l), times the softcap's derivative.
        Real dot = 0;
        for (int64_t j = 0; j < s.nk; ++j) {
          if (prob[static_cast<size_t>(j)] == Real(0)) continue;
          Real e = 0;
          for (int64_t x = 0; x < hdv; ++x) e += dout[ix.o(s.q0 + i, h, x)] * v[ix.v(s.k0 + j, hk, x)];
          dprob[static_cast<size_t>(j)] = e;
          dot += prob[static_cast<size_t>(j)] * e;
        }
        // The sink is a key of value 0: its dP is 0, so d sink = P_sink (0 - dot).
        if (dsinks != nullptr) (*dsinks)[static_cast<size_t>(h)] -= p_sink * dot;
        for (int64_t j = 0; j < s.nk; ++j) {
          const size_t jj = static_cast<size_t>(j);
          if (prob[jj] == Real(0)) continue;
          const Real ds = prob[jj] * (dprob[jj] - dot) * dcap[jj] * scale;
          for (int64_t x = 0; x < p.head_dim; ++x) {
            (*dq)[ix.q(s.q0 + i, h, x)] += ds * k[ix.k(s.k0 + j, hk, x)];
            (*dk)[ix.k(s.k0 + j, hk, x)] += ds * q[ix.q(s.q0 + i, h, x)];
          }
          for (int64_t x = 0; x < hdv; ++x)
            (*dv)[ix.v(s.k0 + j, hk, x)] += prob[jj] * dout[ix.o(s.q0 + i, h, x)];
        }
      }
    }
  }
}

}  // namespace

int64_t RefProblem::total_q() const {
  if (!varlen()) return batch * seqlen_q;
  int64_t t = 0;
  for (int64_t n : seqlens_q) t += n;
  return t;
}

int64_t RefProblem::total_k() const {
  if (!varlen()) return batch * seqlen_k;
  int64_t t = 0;
  for (int64_t n : seqlens_k) t += n;
  return t;
}

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
                        std::vector<double>* dk, std::vector<double>* dv,
                        std::vector<double>* dsinks) {
  backward_in<double>(p, q, k, v, dout, dq, dk, dv, dsinks);
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
                         std::vector<double>* dk, std::vector<double>* dv,
                         std::vector<double>* dsinks) {
  std::vector<float> gq, gk, gv, gs;
  backward_in<float>(p, as<float>(q), as<float>(k), as<float>(v), as<float>(dout), &gq, &gk, &gv,
                     dsinks != nullptr ? &gs : nullptr);
  widen(gq, dq);
  widen(gk, dk);
  widen(gv, dv);
  widen(gs, dsinks);
}

}  // namespace flashattn_test
