// Shared by the API tests: small host problems, poisoning, a float64 reference, and a check that
// a rejected call returned the right status, named the argument and wrote nothing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <flashattn/flashattn.h>

namespace api_test {

inline std::string status_name(flashattn_status_t s) { return flashattn_status_string(s); }

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Checks that `call` returned `want` and that the thread's message contains `needle`.
#define EXPECT_STATUS(call, want, needle)                                              \
  do {                                                                                 \
    const flashattn_status_t got_status_ = (call);                                     \
    const std::string got_message_ = flashattn_last_error();                           \
    INFO("call: " #call);                                                              \
    INFO("message: " << got_message_);                                                \
    CHECK(api_test::status_name(got_status_) == api_test::status_name(want));          \
    CHECK_MESSAGE(api_test::contains(got_message_, needle), "expected \"" << (needle) \
                                                                  << "\" in the message"); \
  } while (0)

// Checks success and an empty message.
#define EXPECT_OK(call)                                                           \
  do {                                                                            \
    const flashattn_status_t got_status_ = (call);                                \
    INFO("call: " #call);                                                         \
    INFO("message: " << flashattn_last_error());                                  \
    CHECK(api_test::status_name(got_status_) == "FLASHATTN_SUCCESS");             \
    CHECK(std::string(flashattn_last_error()).empty());                           \
  } while (0)

#define REQUIRE_OK(call)                                                          \
  do {                                                                            \
    const flashattn_status_t got_status_ = (call);                                \
    INFO("call: " #call);                                                         \
    INFO("message: " << flashattn_last_error());                                  \
    REQUIRE(api_test::status_name(got_status_) == "FLASHATTN_SUCCESS");           \
  } while (0)

// A CPU context that is destroyed with the test.
class Context {
 public:
  explicit Context(flashattn_backend_t backend = FLASHATTN_BACKEND_CPU) {
    REQUIRE_OK(flashattn_context_create(&ctx_, backend, 0));
  }
  ~Context() { flashattn_context_destroy(ctx_); }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  operator flashattn_context_t() const { return ctx_; }

 private:
  flashattn_context_t ctx_ = nullptr;
};

// A byte pattern no computation writes: every float made of it is a NaN.
constexpr unsigned char kPoison = 0xFF;

template <class T>
void poison(std::vector<T>& v) {
  std::memset(v.data(), kPoison, v.size() * sizeof(T));
}

template <class T>
bool all_poison(const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(T); ++i) {
    if (p[i] != kPoison) return false;
  }
  return true;
}

inline void fill_random(std::vector<float>& v, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : v) x = dist(gen);
}

inline flashattn_tensor_t view4(void* data, flashattn_dtype_t dtype, int64_t b, int64_t n,
                                int64_t h, int64_t d) {
  flashattn_tensor_t t;
  std::memset(&t, 0, sizeof t);
  REQUIRE_OK(flashattn_tensor_4d(&t, data, dtype, b, n, h, d));
  return t;
}

inline flashattn_tensor_t view_lse(float* data, int64_t b, int64_t h, int64_t n) {
  flashattn_tensor_t t;
  std::memset(&t, 0, sizeof t);
  REQUIRE_OK(flashattn_tensor_lse(&t, data, b, h, n));
  return t;
}

struct Shape {
  int64_t batch = 2;
  int64_t seqlen_q = 5;
  int64_t seqlen_k = 7;
  int64_t heads_q = 4;
  int64_t heads_kv = 2;
  int64_t head_dim = 16;

  int64_t q_elems() const { return batch * seqlen_q * heads_q * head_dim; }
  int64_t kv_elems() const { return batch * seqlen_k * heads_kv * head_dim; }
  int64_t lse_elems() const { return batch * heads_q * seqlen_q; }
};

// A contiguous fp32 forward problem in host memory, inputs random, outputs poisoned.
struct Forward {
  Shape s;
  std::vector<float> q, k, v, out, lse;
  flashattn_tensor_t tq, tk, tv, tout, tlse;

  explicit Forward(Shape shape = Shape(), uint32_t seed = 1)
      : s(shape),
        q(s.q_elems()),
        k(s.kv_elems()),
        v(s.kv_elems()),
        out(s.q_elems()),
        lse(s.lse_elems()) {
    fill_random(q, seed);
    fill_random(k, seed + 1);
    fill_random(v, seed + 2);
    poison(out);
    poison(lse);
    tq = view4(q.data(), FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    tk = view4(k.data(), FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    tv = view4(v.data(), FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    tout = view4(out.data(), FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    tlse = view_lse(lse.data(), s.batch, s.heads_q, s.seqlen_q);
  }

  flashattn_status_t run(flashattn_context_t ctx, const flashattn_options_t* o = nullptr) {
    return flashattn_forward(ctx, &tq, &tk, &tv, &tout, &tlse, o, nullptr, 0);
  }
  bool untouched() const { return all_poison(out) && all_poison(lse); }
};

// A contiguous fp32 backward problem: out and lse hold values of the right shape (their
// numerical meaning does not matter to validation), gradients poisoned.
struct Backward : Forward {
  std::vector<float> dout, dq, dk, dv;
  flashattn_tensor_t tdout, tdq, tdk, tdv;

  explicit Backward(Shape shape = Shape(), uint32_t seed = 11)
      : Forward(shape, seed), dout(s.q_elems()), dq(s.q_elems()), dk(s.kv_elems()),
        dv(s.kv_elems()) {
    fill_random(out, seed + 3);
    fill_random(lse, seed + 4);
    fill_random(dout, seed + 5);
    poison(dq);
    poison(dk);
    poison(dv);
    tdout = view4(dout.data(), FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    tdq = view4(dq.data(), FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    tdk = view4(dk.data(), FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    tdv = view4(dv.data(), FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
  }

  flashattn_status_t run(flashattn_context_t ctx, const flashattn_options_t* o = nullptr) {
    return flashattn_backward(ctx, &tq, &tk, &tv, &tout, &tdout, &tlse, &tdq, &tdk, &tdv, o,
                              nullptr, 0);
  }
  bool grads_untouched() const { return all_poison(dq) && all_poison(dk) && all_poison(dv); }
};

// Element (b, n, h, d) of a strided fp32 view.
inline float at(const flashattn_tensor_t& t, int64_t b, int64_t n, int64_t h, int64_t d) {
  const float* p = static_cast<const float*>(t.data);
  return p[b * t.strides[0] + n * t.strides[1] + h * t.strides[2] + d * t.strides[3]];
}

// softmax(scale q k^T + causal mask) v in float64, from fp32 views of any strides. A query row
// with no key left gets output 0 and LSE -inf.
struct Reference {
  std::vector<double> out;  // [b, nq, hq, d] contiguous
  std::vector<double> lse;  // [b, hq, nq] contiguous
};

inline Reference reference_forward(const flashattn_tensor_t& q, const flashattn_tensor_t& k,
                                   const flashattn_tensor_t& v, double scale, bool causal) {
  const int64_t B = q.shape[0], Nq = q.shape[1], Hq = q.shape[2], D = q.shape[3];
  const int64_t Nk = k.shape[1], Hkv = k.shape[2];
  if (scale == 0.0) scale = 1.0 / std::sqrt(double(D));
  Reference r;
  r.out.assign(B * Nq * Hq * D, 0.0);
  r.lse.assign(B * Hq * Nq, 0.0);
  std::vector<double> s(Nk);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      for (int64_t i = 0; i < Nq; ++i) {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < Nk; ++j) {
          if (causal && j > i + Nk - Nq) {
            s[j] = -std::numeric_limits<double>::infinity();
            continue;
          }
          double dot = 0;
          for (int64_t x = 0; x < D; ++x) dot += double(at(q, b, i, h, x)) * at(k, b, j, hk, x);
          s[j] = dot * scale;
          m = std::max(m, s[j]);
        }
        double* o = &r.out[((b * Nq + i) * Hq + h) * D];
        if (m == -std::numeric_limits<double>::infinity()) {
          r.lse[(b * Hq + h) * Nq + i] = m;
          continue;
        }
        double l = 0;
        for (int64_t j = 0; j < Nk; ++j) {
          const double p = std::exp(s[j] - m);  // exp(-inf) = 0 for masked keys
          l += p;
          for (int64_t x = 0; x < D; ++x) o[x] += p * at(v, b, j, hk, x);
        }
        for (int64_t x = 0; x < D; ++x) o[x] /= l;
        r.lse[(b * Hq + h) * Nq + i] = m + std::log(l);
      }
    }
  }
  return r;
}

// Largest |got - want| over a strided fp32 [b, n, h, d] view against a contiguous reference.
inline double max_error(const flashattn_tensor_t& got, const std::vector<double>& want) {
  const int64_t B = got.shape[0], N = got.shape[1], H = got.shape[2], D = got.shape[3];
  double worst = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const double e =
              std::fabs(double(at(got, b, n, h, d)) - want[((b * N + n) * H + h) * D + d]);
          if (std::isnan(e)) return e;  // an unwritten (poisoned) element fails any bound
          worst = std::max(worst, e);
        }
  return worst;
}

inline double max_error_lse(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e =
        (std::isinf(want[i]) && got[i] == want[i]) ? 0.0 : std::fabs(got[i] - want[i]);
    if (std::isnan(e)) return e;
    worst = std::max(worst, e);
  }
  return worst;
}

// Largest |a - b| of two vectors of the same size (NaN if either holds a NaN there).
inline double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::quiet_NaN();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(double(a[i]) - b[i]);
    if (std::isnan(e)) return e;
    worst = std::max(worst, e);
  }
  return worst;
}

// Two runs of the same computation: equal but for the last bits (a NaN or a size mismatch
// differs).
inline bool differs(const std::vector<float>& a, const std::vector<float>& b) {
  return !(max_diff(a, b) <= 1e-6);
}

// fp32 flash against a float64 reference on these small problems: a few ulps of the output's
// magnitude (<= 1) times the accumulation length.
constexpr double kFp32Tolerance = 1e-5;

}  // namespace api_test
