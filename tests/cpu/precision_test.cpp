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

  TEST_CASE("fp32 variants within the rule of a naive fp32 implementation of them") {
    // The naive loops compute the softcap with std::tanh in float: the library's own tanh, the
    // window, ALiBi and the sinks must cost no more than that (3x with a softcap, 2x without).
    struct Variant {
      const char* name;
      float softcap;
      bool alibi, sinks, window;
    } variants[] = {{"none", 0.0f, false, false, false}, {"softcap 1", 1.0f, false, false, false},
                    {"softcap 20", 20.0f, false, false, false},
                    {"alibi", 0.0f, true, false, false},
                    {"sinks", 0.0f, false, true, false},
                    {"window + softcap + alibi + sinks", 4.0f, true, true, true}};
    for (const Variant& var : variants)
      for (const Shape& s : {Shape{65, 63}, Shape{100, 300}, Shape{1, 200}})
        for (int64_t d : {8, 64}) {
          Case c = make(s, d, true);
          // Logits of a few units (inputs stretched by 2, as above), which a cap of 1 bends.
          c.softcap = var.softcap;
          c.alibi = var.alibi ? Slopes::PerHead : Slopes::None;
          c.sinks = var.sinks;
          if (var.window) {
            c.window = true;
            c.window_left = 30;
            c.window_right = -1;
          }
          INFO(var.name << ": " << c.name());
          Inputs in = make_inputs(c);
          stretch(&in.q, 2.0);
          stretch(&in.k, 2.0);
          const RefProblem p = in.ref(c);
          const auto q = in.q.to_double(), k = in.k.to_double(), v = in.v.to_double();
          const auto g = in.dout.to_double();
          std::vector<double> ref_out, ref_lse, naive_out, naive_lse, ref[4], naive[4];
          reference_forward(p, q, k, v, &ref_out, &ref_lse);
          naive_fp32_forward(p, q, k, v, &naive_out, &naive_lse);
          reference_backward(p, q, k, v, g, &ref[0], &ref[1], &ref[2], c.sinks ? &ref[3] : nullptr);
          naive_fp32_backward(p, q, k, v, g, &naive[0], &naive[1], &naive[2],
                              c.sinks ? &naive[3] : nullptr);
          const double factor = c.softcap > 0 ? kSoftcapRuleFactor : kRuleFactor;
          const double floor = std::max(dtype_atol(FLASHATTN_DTYPE_FLOAT32), lse_rounding(ref_lse));
          CpuContext ctx;
          for (flashattn_algorithm_t alg :
               {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
            const ForwardResult fwd = run_forward(ctx.get(), c, in, alg);
            const BackwardResult r = run_backward(ctx.get(), c, in, fwd, alg);
            const Comparison out =
                check_rule("out", fwd.out.to_double(), naive_out, ref_out, floor, factor);
            CHECK_MESSAGE(out.ok, out.message);
            const std::vector<double> got[4] = {r.dq.to_double(), r.dk.to_double(),
                                                r.dv.to_double(),
                                                c.sinks ? r.dsinks.to_double() : std::vector<double>()};
            const char* const names[4] = {"dq", "dk", "dv", "dsinks"};
            for (int w = 0; w < (c.sinks ? 4 : 3); ++w) {
              const Comparison cmp = check_rule(names[w], got[w], naive[w], ref[w], floor, factor);
              CHECK_MESSAGE(cmp.ok, cmp.message);
            }
          }
        }
  }
}
