// Backward numerics of the CPU backend: against the float64 reference gradients by the rule,
// and against central finite differences of a scalar loss on tiny fp32 problems.
#include <doctest/doctest.h>

#include <cmath>

#include "cpu/harness.hpp"

using namespace flashattn_test;

namespace {

constexpr flashattn_dtype_t F32 = FLASHATTN_DTYPE_FLOAT32;
constexpr flashattn_dtype_t F16 = FLASHATTN_DTYPE_FLOAT16;
constexpr flashattn_dtype_t BF16 = FLASHATTN_DTYPE_BFLOAT16;

Case make(flashattn_dtype_t dtype, int64_t b, int64_t nq, int64_t nk, int64_t hq, int64_t hkv,
          int64_t d, bool causal = false) {
  const uint64_t seed = static_cast<uint64_t>(nq * 31 + nk * 17 + d * 5 + (causal ? 2 : 0) +
                                            static_cast<int>(dtype) * 100);
  return shaped_case(dtype, b, nq, nk, hq, hkv, d, causal, seed);
}

// sum(out * w) from the float64 reference forward.
double loss(const RefProblem& p, const std::vector<double>& q, const std::vector<double>& k,
            const std::vector<double>& v, const std::vector<double>& w) {
  std::vector<double> out;
  reference_forward(p, q, k, v, &out, nullptr);
  double s = 0.0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * w[i];
  return s;
}

// Central differences of the loss with respect to every element of x (one of q, k, v).
std::vector<double> finite_differences(const RefProblem& p, std::vector<double> q,
                                       std::vector<double> k, std::vector<double> v,
                                       const std::vector<double>& w, int which) {
  std::vector<double>& x = which == 0 ? q : which == 1 ? k : v;
  std::vector<double> grad(x.size());
  const double h = 1e-5;
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss(p, q, k, v, w);
    x[i] = keep - h;
    const double down = loss(p, q, k, v, w);
    x[i] = keep;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

}  // namespace

TEST_SUITE("cpu_backward") {
  TEST_CASE("against the reference: head dims, dtypes, sizes that are not tile multiples") {
    const Case cases[] = {
        make(F32, 2, 17, 17, 2, 2, 1),          make(F16, 1, 63, 65, 2, 1, 7, true),
        make(BF16, 1, 65, 64, 2, 2, 40),        make(F32, 1, 113, 203, 2, 2, 64, true),
        make(F16, 1, 203, 113, 2, 1, 96, true), make(BF16, 2, 239, 1, 2, 2, 128),
        make(F32, 1, 1, 239, 2, 2, 200),        make(F16, 1, 70, 70, 1, 1, 256, true),
        make(BF16, 1, 799, 3, 1, 1, 80, true),  make(F32, 1, 64, 64, 2, 2, 32, true),
        make(BF16, 1, 100, 140, 1, 1, 32),      make(F16, 2, 40, 52, 2, 2, 80),
    };
    for (const Case& c : cases) check_backward(c);
  }

  TEST_CASE("long keys split into chunks, and many heads in one chunk") {
    // One (batch, kv head): the keys are split into many chunks whose partial dQ are summed.
    check_backward(make(F32, 1, 200, 1100, 1, 1, 32, true));
    check_backward(make(BF16, 1, 1023, 1024, 1, 1, 64, true));
    // 16 (batch, kv head) pairs: one chunk each.
    check_backward(make(F16, 4, 90, 200, 4, 4, 16));
  }

  TEST_CASE("more (batch, KV head) groups than one slice of the workspace holds") {
    // A group here is 4 heads x 1024 rows, 9.5 MiB of packed rows and partial dQ at d32: 26 of
    // the 32 groups fill the flash backward's 256 MiB slice, the other 6 run in a second one.
    check_backward(make(F32, 4, 1024, 64, 32, 8, 32));
    check_backward(make(BF16, 4, 1024, 64, 32, 8, 32, true));  // most rows see no key
  }

  TEST_CASE("causal with rows that see no key: their dq is 0, keys nobody sees get dk = dv = 0") {
    check_backward(make(F32, 2, 150, 40, 2, 2, 16, true));
    check_backward(make(BF16, 1, 40, 150, 2, 2, 16, true));
    Case c = make(F32, 1, 100, 30, 1, 1, 8, true);
    CpuContext ctx;
    const Inputs in = make_inputs(c);
    const ForwardResult fwd = run_forward(ctx.get(), c, in, FLASHATTN_ALGORITHM_FLASH);
    const BackwardResult g = run_backward(ctx.get(), c, in, fwd, FLASHATTN_ALGORITHM_FLASH);
    for (int64_t i = 0; i < 70; ++i)
      for (int64_t x = 0; x < 8; ++x) CHECK(g.dq.get(0, i, 0, x) == 0.0);
  }

  TEST_CASE("GQA and MQA: dk and dv summed over the group") {
    check_backward(make(F32, 2, 50, 70, 6, 2, 32, true));
    check_backward(make(BF16, 1, 70, 90, 4, 1, 64));
    check_backward(make(F16, 1, 66, 66, 8, 2, 24, true));
  }

  TEST_CASE("custom scale and strided views") {
    Case c = make(F32, 2, 45, 45, 4, 2, 24, true);
    c.scale = 0.7f;
    for (Layout layout : {Layout::Contiguous, Layout::Padded, Layout::PackedQKV}) {
      c.layout = layout;
      check_backward(c);
    }
    Case b = make(BF16, 3, 30, 80, 2, 1, 40);
    b.scale = -0.25f;
    b.layout = Layout::BroadcastKV;
    check_backward(b);
  }

  TEST_CASE("fp32 backward against finite differences of sum(out * w)") {
    const Case cases[] = {
        make(F32, 1, 5, 7, 2, 1, 3, false),
        make(F32, 1, 6, 4, 2, 2, 5, true),  // Nq > Nk: two rows see no key
        make(F32, 2, 3, 9, 1, 1, 4, true),
    };
    for (Case c : cases) {
      c.scale = 0.8f;
      INFO(c.name());
      CpuContext ctx;
      const Inputs in = make_inputs(c);
      const RefProblem p = c.ref();
      const auto q = in.q.to_double(), k = in.k.to_double(), v = in.v.to_double();
      const auto w = in.dout.to_double();
      std::vector<double> ref[3];
      reference_backward(p, q, k, v, w, &ref[0], &ref[1], &ref[2]);
      for (flashattn_algorithm_t alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
        const ForwardResult fwd = run_forward(ctx.get(), c, in, alg);
        const BackwardResult g = run_backward(ctx.get(), c, in, fwd, alg);
        const std::vector<double> got[3] = {g.dq.to_double(), g.dk.to_double(), g.dv.to_double()};
        const char* names[3] = {"dq", "dk", "dv"};
        for (int which = 0; which < 3; ++which) {
          const auto fd = finite_differences(p, q, k, v, w, which);
          // The reference's analytic gradient is the finite difference to float64 precision...
          const Comparison exact =
              check_close(std::string("reference ") + names[which], ref[which], fd, 1e-7);
          CHECK_MESSAGE(exact.ok, exact.message);
          // ...and the library's fp32 gradient is it to fp32 precision.
          const Comparison lib =
              check_close(names[which], got[which], fd, 2e-5 * std::max(1.0, max_abs(fd)));
          CHECK_MESSAGE(lib.ok, lib.message);
        }
      }
    }
  }

}  // TEST_SUITE
