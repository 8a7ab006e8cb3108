// fp32 precision of the CPU backward against a naive fp32 implementation (the same loops as the
// float64 reference, in float: tests/common/reference.hpp), by FlashAttention's rule: within
// twice the naive error plus a floor, over a sweep of shapes at ordinary logits.
//
// The floor is the larger of the fp32 atol and what the saved LSE itself costs: the backward
// recomputes P = exp(S - LSE) from an fp32 LSE, which is rounded to 2^-24 |LSE|, so every
// probability may be off by that much relatively, however exactly the rest is computed. The
// naive implementation normalizes each row itself and pays nothing of the kind. (At large
// logits, |LSE| in the hundreds, that term dominates: docs/reliability.md, fp32 precision.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cpu/harness.hpp"

using namespace flashattn_test;

namespace {

struct Shape {
  int64_t seqlen_q, seqlen_k;
};

Case make(Shape s, int64_t d, bool causal) {
  Case c;
  c.dtype = FLASHATTN_DTYPE_FLOAT32;
  c.seqlen_q = s.seqlen_q;
  c.seqlen_k = s.seqlen_k;
  c.heads_q = 2;
  c.heads_kv = 1;
  c.head_dim = d;
  c.causal = causal;
  c.seed = static_cast<uint64_t>(s.seqlen_q * 7 + s.seqlen_k * 13 + d * 3 + (causal ? 1 : 0));
  return c;
}

// Multiplies every element by f (q and k by the same f: logits grow by f^2).
void stretch(HostTensor* t, double f) {
  std::vector<double> x = t->to_double();
  for (double& e : x) e *= f;
  t->from_double(x);
}

double lse_rounding(const std::vector<double>& lse) {
  return std::ldexp(max_abs(lse), -24);
}

}  // namespace

TEST_SUITE("cpu_precision") {
  TEST_CASE("fp32 backward within twice a naive fp32 backward's error at ordinary logits") {
    const Shape shapes[] = {{1, 1}, {1, 200}, {17, 17}, {64, 64}, {65, 63}, {100, 300}, {256, 256},
                            {300, 100}};
    // Inputs ~ N(0, f^2): logits scale * q.k have a standard deviation of about f^2.
    const double stretches[] = {1.0, 2.0};
    static const bool verbose = std::getenv("FLASHATTN_TEST_VERBOSE") != nullptr;
    int cases = 0;
    double worst_ratio = 0.0;
    for (double f : stretches)
      for (const Shape& s : shapes)
        for (int64_t d : {8, 32, 64, 128})
          for (bool causal : {false, true}) {
            const Case c = make(s, d, causal);
            Inputs in = make_inputs(c);
            stretch(&in.q, f);
            stretch(&in.k, f);
            const RefProblem p = c.ref();
            const auto q = in.q.to_double(), k = in.k.to_double(), v = in.v.to_double();
            const auto g = in.dout.to_double();
            std::vector<double> ref[3], naive[3], out, lse;
            reference_forward(p, q, k, v, &out, &lse);
            reference_backward(p, q, k, v, g, &ref[0], &ref[1], &ref[2]);
            naive_fp32_backward(p, q, k, v, g, &naive[0], &naive[1], &naive[2]);
            const double floor = std::max(dtype_atol(FLASHATTN_DTYPE_FLOAT32), lse_rounding(lse));
            CpuContext ctx;
            for (flashattn_algorithm_t alg :
                 {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
              const ForwardResult fwd = run_forward(ctx.get(), c, in, alg);
              const BackwardResult r = run_backward(ctx.get(), c, in, fwd, alg);
              const std::vector<double> got[3] = {r.dq.to_double(), r.dk.to_double(),
                                                  r.dv.to_double()};
              const char* const names[3] = {"dq", "dk", "dv"};
              for (int w = 0; w < 3; ++w) {
                const char* algorithm = alg == FLASHATTN_ALGORITHM_FLASH ? "flash " : "standard ";
                const std::string what = std::string(algorithm) + names[w];
                const Comparison cmp = check_rule(what, got[w], naive[w], ref[w], floor);
                if (verbose) {
                  std::printf("%s logits x%g | %s\n", c.name().c_str(), f * f,
                              cmp.message.c_str());
                }
                CHECK_MESSAGE(cmp.ok, c.name(), " logits x", f * f, ": ", cmp.message);
                const Comparison base = check_close(what, naive[w], ref[w], 0.0);
                if (base.error > 0) worst_ratio = std::max(worst_ratio, cmp.error / base.error);
              }
              ++cases;
            }
          }
    MESSAGE(cases << " cases; the largest error is " << worst_ratio << " x the naive fp32 one");
  }
}
