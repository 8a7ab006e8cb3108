// Forward numerics of the CPU backend against the float64 reference.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "cpu/harness.hpp"

using namespace flashattn_test;

namespace {

constexpr flashattn_dtype_t F32 = FLASHATTN_DTYPE_FLOAT32;
constexpr flashattn_dtype_t F16 = FLASHATTN_DTYPE_FLOAT16;
constexpr flashattn_dtype_t BF16 = FLASHATTN_DTYPE_BFLOAT16;

Case make(flashattn_dtype_t dtype, int64_t b, int64_t nq, int64_t nk, int64_t hq, int64_t hkv,
          int64_t d, bool causal = false) {
  const uint64_t seed = static_cast<uint64_t>(nq * 131 + nk * 7 + d * 3 + (causal ? 1 : 0) +
                                            static_cast<int>(dtype) * 1000);
  return shaped_case(dtype, b, nq, nk, hq, hkv, d, causal, seed);
}

}  // namespace

TEST_SUITE("cpu_forward") {
  TEST_CASE("head dims 1 to 256, every dtype, sizes that are not tile multiples") {
    // Every head dim the issue names, each dtype several times, causal and not.
    const Case cases[] = {
        make(F32, 2, 17, 17, 2, 2, 1),          make(F16, 2, 63, 65, 2, 1, 7, true),
        make(BF16, 1, 64, 64, 3, 3, 32),        make(F32, 2, 65, 63, 2, 2, 40, true),
        make(F16, 1, 113, 203, 2, 2, 64, true), make(BF16, 1, 203, 113, 2, 1, 80, true),
        make(F32, 2, 239, 1, 2, 2, 96),         make(F16, 1, 1, 239, 4, 2, 128),
        make(BF16, 1, 799, 3, 1, 1, 200, true), make(F32, 1, 128, 130, 2, 2, 256),
        make(BF16, 2, 1, 1, 1, 1, 64),          make(F16, 1, 70, 129, 1, 1, 256, true),
        make(F32, 1, 96, 97, 2, 1, 7, true),    make(BF16, 1, 33, 300, 2, 2, 128, true),
    };
    for (const Case& c : cases) check_forward(c);
  }

  TEST_CASE("long sequences: 1023 x 1024") {
    check_forward(make(BF16, 1, 1023, 1024, 1, 1, 64, true));
    check_forward(make(F32, 1, 1024, 1023, 1, 1, 32));
  }

  TEST_CASE("causal: seqlen_q < seqlen_k, == and > (rows that see no key)") {
    check_forward(make(F32, 1, 40, 150, 2, 2, 16, true));
    check_forward(make(F16, 1, 150, 150, 2, 2, 16, true));
    // Nq > Nk: the first Nq - Nk rows see no key: output exactly 0, LSE -inf, never NaN.
    check_forward(make(F32, 2, 150, 40, 2, 2, 16, true));
    check_forward(make(BF16, 1, 200, 70, 1, 1, 64, true));
    check_forward(make(F16, 1, 9, 1, 1, 1, 8, true));
    // One thread: items of four query tiles each (the last one ragged), some of whose tiles see
    // no key at all while others of the same item do.
    Case one = make(F32, 1, 1100, 500, 1, 1, 16, true);
    one.threads = 1;
    check_forward(one);
  }

  TEST_CASE("GQA and MQA") {
    check_forward(make(F32, 2, 70, 90, 6, 2, 32));
    check_forward(make(BF16, 1, 70, 90, 6, 3, 64, true));
    check_forward(make(F16, 2, 33, 130, 4, 1, 48, true));  // MQA
  }

  TEST_CASE("custom softmax scale") {
    for (float scale : {0.5f, 2.0f, -0.3f}) {
      Case c = make(F32, 1, 77, 140, 2, 2, 24, scale > 1.0f);
      c.scale = scale;
      check_forward(c);
      c.dtype = BF16;
      check_forward(c);
    }
  }

  TEST_CASE("strided views: padded, packed QKV, broadcast batch") {
    Case c = make(F16, 2, 67, 67, 4, 2, 40, true);
    for (Layout layout : {Layout::Padded, Layout::PackedQKV, Layout::BroadcastKV}) {
      c.layout = layout;
      check_forward(c);
    }
    Case d = make(F32, 3, 20, 130, 2, 1, 64);
    d.layout = Layout::BroadcastKV;
    check_forward(d);
    d.layout = Layout::Padded;
    d.dtype = BF16;
    check_forward(d);
  }

  TEST_CASE("a later key tile holds the row maximum") {
    // Every query is close to one direction u; key 250 (tile 3) is a large multiple of u and key
    // 100 (tile 1) a smaller one, so the running maximum grows twice and earlier partial sums must
    // be rescaled by tiny factors.
    for (flashattn_dtype_t dtype : {F32, BF16}) {
      Case c = make(dtype, 1, 70, 300, 2, 2, 32);
      INFO(c.name());
      CpuContext ctx;
      Inputs in = make_inputs(c);
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t x = 0; x < c.head_dim; ++x) {
          const double u = (x % 3 == 0) ? 1.0 : -0.5;
          for (int64_t i = 0; i < c.seqlen_q; ++i)
            in.q.set(0, i, h, x, u + 0.1 * in.q.get(0, i, h, x));
          in.k.set(0, 100, h, x, 2.0 * u);
          in.k.set(0, 250, h, x, 4.0 * u);
        }
      }
      std::vector<double> ref_out, ref_lse;
      reference_forward(c.ref(), in.q.to_double(), in.k.to_double(), in.v.to_double(), &ref_out,
                        &ref_lse);
      const ForwardResult flash = run_forward(ctx.get(), c, in, FLASHATTN_ALGORITHM_FLASH);
      const ForwardResult standard = run_forward(ctx.get(), c, in, FLASHATTN_ALGORITHM_STANDARD);
      // The planted key dominates: the output is nearly v[250], far from a plain average.
      CHECK(std::fabs(ref_out[0] - in.v.get(0, 250, 0, 0)) < 0.05);
      const auto f_out = flash.out.to_double(), s_out = standard.out.to_double();
      const Comparison out = check_rule("out", f_out, s_out, ref_out, dtype_atol(dtype));
      CHECK_MESSAGE(out.ok, out.message);
      const Comparison lse = check_rule("lse", flash.lse.to_double(), standard.lse.to_double(),
                                        ref_lse, dtype_atol(F32));
      CHECK_MESSAGE(lse.ok, lse.message);
    }
  }

  TEST_CASE("poisoned outputs are overwritten, and the LSE is optional") {
    Case c = make(BF16, 2, 90, 100, 3, 3, 24, true);
    c.layout = Layout::Padded;
    CpuContext ctx;
    const Inputs in = make_inputs(c);
    for (flashattn_algorithm_t alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
      const ForwardResult with = run_forward(ctx.get(), c, in, alg, true);
      const ForwardResult without = run_forward(ctx.get(), c, in, alg, false);
      const Comparison nan = check_no_nan("out", with.out.to_double());
      CHECK_MESSAGE(nan.ok, nan.message);
      // Without an LSE view the LSE stays poisoned and the output is the same, bit for bit.
      CHECK(std::isnan(without.lse.to_double()[0]));
      const auto a = with.out.to_double(), b = without.out.to_double();
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
    }
  }

  TEST_CASE("decode: one query against many keys") {
    check_forward(make(F16, 3, 1, 1000, 8, 2, 128));
    check_forward(make(F32, 1, 1, 5, 2, 2, 256, true));
  }

}  // TEST_SUITE
