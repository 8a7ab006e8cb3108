// The attention variants on the CUDA backend: both algorithms (standard through cuBLAS, flash on
// the Hopper and the sm80 kernels), forward and backward (dq, dk, dv, dsinks), fp16 and bf16,
// against the float64 reference by the tolerance rule with the standard result as base (3x with
// a softcap: variant_harness.cpp says why). Each variant alone (windows, softcap, ALiBi per head
// and per (batch, head), sinks, d_v != d, head dims that are not multiples of 8, packed and
// unaligned views, variable-length batches) with GQA, then combinations; shapes across tile
// boundaries; a variable-length batch against its sequences run one by one; deterministic
// backwards with variants on.
//
// The variants reach the kernels one by one: the table below says which the suite expects of
// each algorithm, kernel family and pass. A pass the table expects that answers UNSUPPORTED
// fails; one it does not expect is reported skipped with the library's message (and one that
// runs anyway is checked all the same, with a note that the table can grow).
//
// On a GPU machine, from a build with -DFLASHATTN_TEST_HOOKS=ON (tests/gpu/CMakeLists.txt):
//   ctest --test-dir build-gpu -R gpu_variants -j 4 -V
//   FLASHATTN_TEST_FORCE_SM80=1 build-gpu/tests/gpu/gpu_tests --test-suite='gpu_variants*'
// the second judging the flash passes as the sm80 kernels' (the banner line says which).
#include <cmath>
#include <cstring>

#include "variant_harness.hpp"

using namespace gpu_variants;

// ---- The expectation table ------------------------------------------------------------------
//
// One row per variant; a column per algorithm or kernel family and pass. Y: expected to be
// supported (UNSUPPORTED fails the case); N: not yet (UNSUPPORTED is reported as skipped).
// "flash sm90" are the Hopper kernels (on an H200 without FLASHATTN_TEST_FORCE_SM80; its backward
// at head dims 96 and 192 the kernel of the next larger one), "flash sm80" the mma.sync kernels (every other
// device, and Hopper with FLASHATTN_TEST_FORCE_SM80=1 in a FLASHATTN_TEST_HOOKS build). A case
// is expected to run a pass when every variant it uses is expected there.
namespace {

constexpr bool Y = true, N = false;

struct Expectation {
  Variant variant;
  bool standard_fwd, standard_bwd, sm90_fwd, sm90_bwd, sm80_fwd, sm80_bwd;
};

// clang-format off
const Expectation kExpectations[] = {
  //                  standard      flash sm90    flash sm80
  //                  fwd  bwd      fwd  bwd      fwd  bwd
  {kWindow,           Y,   Y,       Y,   Y,       Y,   Y},
  {kSoftcap,          Y,   Y,       Y,   Y,       Y,   Y},
  {kAlibiPerHead,     Y,   Y,       Y,   Y,       Y,   Y},
  {kAlibiPerBatch,    Y,   Y,       Y,   Y,       Y,   Y},
  {kSinks,            Y,   Y,       Y,   Y,       Y,   Y},
  {kHeadDimV,         Y,   Y,       Y,   Y,       Y,   Y},
  {kOddHeadDim,       Y,   Y,       Y,   Y,       Y,   Y},
  {kVarlen,           Y,   Y,       Y,   Y,       Y,   Y},
};
// clang-format on

static_assert(sizeof kExpectations / sizeof kExpectations[0] == kVariantCount,
              "one row per variant");

constexpr flashattn_dtype_t F16 = FLASHATTN_DTYPE_FLOAT16;
constexpr flashattn_dtype_t BF16 = FLASHATTN_DTYPE_BFLOAT16;
const flashattn_dtype_t kDtypes[] = {F16, BF16};

}  // namespace

namespace gpu_variants {

bool expected(Family f, Pass p, Variant v) {
  for (const Expectation& e : kExpectations) {
    if (e.variant != v) continue;
    const bool fwd = p == Pass::Forward;
    switch (f) {
      case Family::Standard: return fwd ? e.standard_fwd : e.standard_bwd;
      case Family::FlashSm90: return fwd ? e.sm90_fwd : e.sm90_bwd;
      case Family::FlashSm80: return fwd ? e.sm80_fwd : e.sm80_bwd;
    }
  }
  return false;  // a variant without a row (the table's own test fails then)
}

}  // namespace gpu_variants

namespace {

void check(const Case& c, Tally& tally) { check_case(c, tally); }

// One sequence of a variable-length case as a fixed-length case of batch 1: the same variants
// (per-(batch, head) slopes become that sequence's per-head slopes) and the same values.
struct Single {
  Case c;
  Inputs in;
};

Single single_of(const Case& whole, const Inputs& win, size_t b) {
  int64_t q0 = 0, k0 = 0;
  for (size_t s = 0; s < b; ++s) {
    q0 += whole.lq[s];
    k0 += whole.lk[s];
  }
  Single one;
  one.c = whole;
  one.c.lq.clear();
  one.c.lk.clear();
  one.c.slack = 0;
  one.c.b = 1;
  one.c.nq = whole.lq[b];
  one.c.nk = whole.lk[b];
  if (whole.alibi == Slopes::PerBatchHead) one.c.alibi = Slopes::PerHead;
  one.in = make_inputs(one.c);
  const int64_t D = whole.d, Dv = whole.head_dim_v();
  for (int64_t i = 0; i < one.c.nq; ++i)
    for (int64_t h = 0; h < whole.hq; ++h) {
      for (int64_t x = 0; x < D; ++x) one.in.q.set(0, i, h, x, win.q.get(0, q0 + i, h, x));
      for (int64_t x = 0; x < Dv; ++x) one.in.dout.set(0, i, h, x, win.dout.get(0, q0 + i, h, x));
    }
  for (int64_t j = 0; j < one.c.nk; ++j)
    for (int64_t h = 0; h < whole.hkv; ++h) {
      for (int64_t x = 0; x < D; ++x) one.in.k.set(0, j, h, x, win.k.get(0, k0 + j, h, x));
      for (int64_t x = 0; x < Dv; ++x) one.in.v.set(0, j, h, x, win.v.get(0, k0 + j, h, x));
    }
  if (whole.alibi != Slopes::None) {
    std::vector<double> slopes(static_cast<size_t>(whole.hq));
    const std::vector<double> all = win.alibi.to_double();
    const size_t row = whole.alibi == Slopes::PerBatchHead ? b : 0;
    for (size_t h = 0; h < slopes.size(); ++h) slopes[h] = all[row * slopes.size() + h];
    one.in.alibi.from_double(slopes);
    one.in.ref.alibi = slopes;
  }
  if (whole.sinks) {
    one.in.sinks.from_double(win.sinks.to_double());
    one.in.ref.sinks = win.sinks.to_double();
  }
  return one;
}

bool identical(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

// A variable-length batch against its sequences run one by one, for one algorithm: every result
// of the batch by the rule against float64 with the one-by-one results as base. (Whether the two
// agree bit for bit depends on the kernel and tiles a variable-length launch picks, which the
// header does not promise; it is reported, not asserted.)
void check_against_singles(const Case& whole, flashattn_algorithm_t alg, Tally& tally) {
  CAPTURE(whole.name());
  const std::string algorithm = alg == FLASHATTN_ALGORITHM_FLASH ? "flash" : "standard";
  CAPTURE(algorithm);
  const Inputs in = make_inputs(whole);
  std::vector<double> o_ref, lse_ref;
  const Results ref_fwd = reference_forward_results(whole, in, &o_ref, &lse_ref);
  Results wf, wb;
  const bool fwd_ran = attempt(tally, Pass::Forward, whole, in, alg, 0, nullptr, &wf);
  const bool bwd_ran = attempt(tally, Pass::Backward, whole, in, alg, 0, &ref_fwd, &wb);
  if (!fwd_ran && !bwd_ran) return;

  const int64_t Hq = whole.hq, Hkv = whole.hkv, D = whole.d, Dv = whole.head_dim_v();
  const int64_t tq = whole.total_q();
  // The one-by-one results packed like the batch's; where a sequence cannot run alone (no
  // query or no key) the reference's values, which are exact there (0, or -inf for the LSE).
  std::vector<double> g_ref[4];
  flashattn_test::reference_backward(in.ref, in.q.to_double(), in.k.to_double(), in.v.to_double(),
                                     in.dout.to_double(), &g_ref[0], &g_ref[1], &g_ref[2],
                                     whole.sinks ? &g_ref[3] : nullptr);
  std::vector<double> out = o_ref, lse = lse_ref,
                      grads[4] = {g_ref[0], g_ref[1], g_ref[2],
                                  std::vector<double>(g_ref[3].size())};
  bool singles_ran = true;
  int64_t q0 = 0, k0 = 0;
  for (size_t b = 0; b < whole.lq.size(); ++b) {
    const int64_t nq = whole.lq[b], nk = whole.lk[b];
    if (nq > 0 && nk > 0) {
      const Single one = single_of(whole, in, b);
      Results sf, sb, one_fwd;
      // The backward of the sequence reads the batch's forward values of its rows.
      one_fwd.out = make_output(one.c, false, Dv);
      one_fwd.lse = make_lse(one.c);
      for (int64_t i = 0; i < nq; ++i)
        for (int64_t h = 0; h < Hq; ++h) {
          for (int64_t x = 0; x < Dv; ++x)
            one_fwd.out.set(0, i, h, x, ref_fwd.out.get(0, q0 + i, h, x));
          one_fwd.lse.set(0, h, i, 0, ref_fwd.lse.get(0, h, q0 + i));
        }
      if (fwd_ran && attempt(tally, Pass::Forward, one.c, one.in, alg, 0, nullptr, &sf)) {
        for (int64_t i = 0; i < nq; ++i)
          for (int64_t h = 0; h < Hq; ++h) {
            for (int64_t x = 0; x < Dv; ++x)
              out[static_cast<size_t>(((q0 + i) * Hq + h) * Dv + x)] = sf.out.get(0, i, h, x);
            lse[static_cast<size_t>(h * tq + q0 + i)] = sf.lse.get(0, h, i);
          }
      } else {
        singles_ran = false;
      }
      if (bwd_ran && attempt(tally, Pass::Backward, one.c, one.in, alg, 0, &one_fwd, &sb)) {
        for (int64_t i = 0; i < nq; ++i)
          for (int64_t h = 0; h < Hq; ++h)
            for (int64_t x = 0; x < D; ++x)
              grads[0][static_cast<size_t>(((q0 + i) * Hq + h) * D + x)] = sb.dq.get(0, i, h, x);
        for (int64_t j = 0; j < nk; ++j)
          for (int64_t h = 0; h < Hkv; ++h) {
            for (int64_t x = 0; x < D; ++x)
              grads[1][static_cast<size_t>(((k0 + j) * Hkv + h) * D + x)] = sb.dk.get(0, j, h, x);
            for (int64_t x = 0; x < Dv; ++x)
              grads[2][static_cast<size_t>(((k0 + j) * Hkv + h) * Dv + x)] = sb.dv.get(0, j, h, x);
          }
        if (whole.sinks && whole.want_dsinks) {
          const std::vector<double> ds = sb.dsinks.to_double();
          for (size_t h = 0; h < ds.size(); ++h) grads[3][h] += ds[h];
        }
      } else {
        singles_ran = false;
      }
    }
    q0 += nq;
    k0 += whole.lk[b];
  }
  if (!singles_ran) return;  // reported by attempt (skipped or failed)
  const double factor = rule_factor(whole);
  const auto rule = [&](const char* what, const std::vector<double>& got,
                        const std::vector<double>& base, const std::vector<double>& ref,
                        flashattn_dtype_t floor_dtype) {
    const flashattn_test::Comparison cmp = flashattn_test::check_rule(
        what, got, base, ref, flashattn_test::dtype_atol(floor_dtype), factor);
    CHECK_MESSAGE(cmp.ok, cmp.message);
    return identical(got, base);
  };
  if (fwd_ran) {
    const bool same_out =
        rule("batch out (base: one by one)", wf.out.to_double(), out, o_ref, whole.dtype);
    const bool same_lse = rule("batch lse (base: one by one)", wf.lse.to_double(), lse, lse_ref,
                               FLASHATTN_DTYPE_FLOAT32);
    MESSAGE(family_name(family_of(alg, Pass::Forward, whole))
            << " forward, batch against one by one: "
            << std::string(same_out && same_lse ? "bit-identical"
                                                   : "equal by the rule, not bit for bit"));
  }
  if (bwd_ran) {
    const char* names[4] = {"batch dq (base: one by one)", "batch dk (base: one by one)",
                            "batch dv (base: one by one)", "batch dsinks (base: one by one)"};
    const HostTensor* got[4] = {&wb.dq, &wb.dk, &wb.dv, &wb.dsinks};
    const int n = whole.sinks && whole.want_dsinks ? 4 : 3;
    for (int i = 0; i < n; ++i) {
      rule(names[i], got[i]->to_double(), grads[i], g_ref[i],
           i == 3 ? FLASHATTN_DTYPE_FLOAT32 : whole.dtype);
    }
  }
}

// deterministic = 1: two backwards of each algorithm give the same bytes of dq, dk, dv and
// dsinks.
void check_deterministic(const Case& c, Tally& tally) {
  CAPTURE(c.name());
  const Inputs in = make_inputs(c);
  std::vector<double> o_ref, lse_ref;
  const Results fwd = reference_forward_results(c, in, &o_ref, &lse_ref);
  for (flashattn_algorithm_t alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
    const std::string algorithm = alg == FLASHATTN_ALGORITHM_FLASH ? "flash" : "standard";
    CAPTURE(algorithm);
    Results runs[2];
    if (!attempt(tally, Pass::Backward, c, in, alg, /*deterministic=*/1, &fwd, &runs[0])) continue;
    if (!attempt(tally, Pass::Backward, c, in, alg, /*deterministic=*/1, &fwd, &runs[1])) continue;
    CHECK_MESSAGE(gpu_test::same_bytes(runs[0].dq, runs[1].dq), "dq differs between runs");
    CHECK_MESSAGE(gpu_test::same_bytes(runs[0].dk, runs[1].dk), "dk differs between runs");
    CHECK_MESSAGE(gpu_test::same_bytes(runs[0].dv, runs[1].dv), "dv differs between runs");
    if (c.sinks) {
      CHECK_MESSAGE(gpu_test::same_bytes(runs[0].dsinks, runs[1].dsinks),
                    "dsinks differs between runs");
    }
    // The runs computed something: no NaN left of the poison, and not all zero.
    const std::vector<double> dq = runs[0].dq.to_double();
    const flashattn_test::Comparison nan = flashattn_test::check_no_nan("dq", dq);
    CHECK_MESSAGE(nan.ok, nan.message);
    CHECK_MESSAGE(flashattn_test::max_abs(dq) > 0, "dq is all zero");
  }
}

}  // namespace

TEST_SUITE("gpu_variants_table") {
  TEST_CASE("the expectation table has one row per variant, each once") {
    print_family_banner();
    for (int v = 0; v < kVariantCount; ++v) {
      int rows = 0;
      for (const Expectation& e : kExpectations) rows += e.variant == static_cast<Variant>(v);
      CHECK_MESSAGE(rows == 1, variant_name(static_cast<Variant>(v)) << ": " << rows << " rows");
    }
  }
}

TEST_SUITE("gpu_variants_window") {
  TEST_CASE("sliding windows: left, right, both, with causal, wider than the sequence, GQA") {
    Tally tally("windows");
    for (flashattn_dtype_t dt : kDtypes) {
      check(windowed(make(dt, 2, 130, 130, 4, 2, 64), 17, -1), tally);          // left only
      check(windowed(make(dt, 1, 129, 127, 2, 2, 128), -1, 3), tally);          // right only
      check(windowed(make(dt, 1, 77, 300, 4, 1, 64), 64, 5), tally);            // both, Nq < Nk
      check(windowed(make(dt, 1, 150, 90, 2, 1, 128, true), 9, 9), tally);      // causal caps right
      check(windowed(make(dt, 2, 65, 63, 2, 2, 64, true), 1000, 1000), tally);  // wider, causal
      check(windowed(make(dt, 1, 63, 129, 4, 2, 64), 1000, 1000), tally);       // wider, no causal
      check(windowed(make(dt, 1, 65, 65, 2, 2, 64), 0, 0), tally);              // one key per row
    }
    // A long causal sequence with a narrow window: most key tiles are outside every row's reach.
    check(windowed(make(BF16, 1, 1000, 1000, 2, 1, 64, true), 100, -1), tally);
    check(windowed(make(F16, 1, 1000, 1000, 2, 1, 128), 30, 70), tally);
  }

  TEST_CASE("windows that leave some rows no key") {
    Tally tally("windows, rows with no key");
    for (flashattn_dtype_t dt : kDtypes) {
      // No causal, Nq > Nk: rows i < 100 reach only keys j <= i - 130 + 30 < 0.
      check(windowed(make(dt, 1, 200, 70, 2, 1, 64), 0, 30), tally);
      // Causal with a left bound, Nq > Nk: rows 0 .. 259 see no key.
      check(windowed(make(dt, 1, 300, 40, 2, 2, 128, true), 5, -1), tally);
      // A right bound only, Nq > Nk, GQA: rows i < 129 - 63 - 10 = 56 see no key.
      check(windowed(make(dt, 2, 129, 63, 4, 2, 64), -1, 10), tally);
    }
  }
}

TEST_SUITE("gpu_variants_logits") {
  TEST_CASE("softcap: caps that bend ordinary and large logits, causal, GQA, decode") {
    Tally tally("softcap");
    for (flashattn_dtype_t dt : kDtypes) {
      Case c = make(dt, 2, 67, 131, 4, 2, 64, true);
      c.scale = 1.0f;  // logits of a few units: a cap of 2 bends them
      check(softcapped(c, 2.0f), tally);
      check(softcapped(make(dt, 1, 129, 65, 2, 2, 128), 30.0f), tally);
      check(softcapped(make(dt, 2, 1, 300, 4, 1, 64), 0.5f), tally);  // decode
    }
  }

  TEST_CASE("ALiBi: per head and per (batch, head), causal and not, Nq != Nk, GQA") {
    Tally tally("alibi");
    for (flashattn_dtype_t dt : kDtypes) {
      check(with_alibi(make(dt, 2, 90, 90, 4, 2, 64, true)), tally);
      check(with_alibi(make(dt, 2, 50, 170, 4, 2, 128), Slopes::PerBatchHead), tally);
      // Nq > Nk, causal: rows with no key.
      check(with_alibi(make(dt, 3, 170, 50, 2, 1, 64, true), Slopes::PerBatchHead), tally);
      check(with_alibi(make(dt, 1, 63, 257, 2, 2, 256)), tally);
    }
  }

  TEST_CASE("attention sinks and dsinks: GQA, a row with no visible key, decode") {
    Tally tally("sinks");
    for (flashattn_dtype_t dt : kDtypes) {
      check(with_sinks(make(dt, 2, 70, 90, 4, 2, 64)), tally);
      // Causal, Nq > Nk: 110 rows see no key (output 0, LSE -inf, whatever the sink).
      check(with_sinks(make(dt, 1, 150, 40, 2, 2, 128, true)), tally);
      check(with_sinks(make(dt, 3, 1, 129, 4, 1, 64)), tally);  // decode
    }
    // The backward without dsinks (NULL: not wanted) still takes the sinks into account.
    Case no_grad = with_sinks(make(BF16, 1, 100, 130, 4, 2, 64, true));
    no_grad.want_dsinks = false;
    check(no_grad, tally);
  }
}

TEST_SUITE("gpu_variants_shapes") {
  TEST_CASE("a head_dim of v of its own: 192/128, 128/64, 64/128, 256/64") {
    Tally tally("d_v != d");
    const int64_t pairs[][2] = {{192, 128}, {128, 64}};
    for (flashattn_dtype_t dt : kDtypes) {
      bool causal = dt == F16;
      for (const auto& pr : pairs) {
        check(with_dv(make(dt, 2, 65, 97, 4, 2, pr[0], causal), pr[1]), tally);
        causal = !causal;
      }
    }
    check(with_dv(make(BF16, 1, 129, 63, 2, 1, 64, true), 128), tally);
    check(with_dv(make(F16, 1, 127, 300, 2, 2, 256), 64), tally);
  }

  TEST_CASE("head dims that are not multiples of 8: 1, 33, 100, 255, alone and with variants") {
    Tally tally("odd head dims");
    int n = 0;
    for (int64_t d : {1, 33, 100, 255}) {
      const flashattn_dtype_t dt = kDtypes[n++ % 2];
      // Rows padded to 16 bytes (the flash kernels need it; they pad the head dim inside).
      check(laid_out(make(dt, 2, 70, 83, 4, 2, d, n % 2 == 0), Layout::Aligned), tally);
      check(laid_out(with_sinks(with_alibi(
                         softcapped(windowed(make(dt, 1, 129, 65, 2, 1, d, true), 20, 3), 5.0f))),
                     Layout::Aligned),
            tally);
    }
    // d and d_v both odd, and different.
    check(laid_out(with_dv(make(BF16, 1, 65, 127, 2, 2, 33), 100), Layout::Aligned), tally);
    check(laid_out(with_dv(make(F16, 1, 63, 63, 2, 1, 100, true), 1), Layout::Aligned), tally);
  }

  TEST_CASE("packed and unaligned views: packed QKV, tight odd head dims, odd gaps") {
    // Views whose rows are not 16-byte aligned: the standard algorithm takes them as they are,
    // the flash path through aligned copies in the workspace.
    Tally tally("packed and unaligned views");
    for (flashattn_dtype_t dt : kDtypes) {
      Case p = laid_out(
          with_sinks(softcapped(windowed(make(dt, 2, 67, 67, 4, 2, 64, true), 16, -1), 10.0f)),
          Layout::PackedQKV);
      check(p, tally);
      check(varlen(p, {30, 67, 1}, {30, 67, 1}), tally);
    }
    check(laid_out(make(BF16, 1, 100, 100, 4, 2, 40), Layout::PackedQKV), tally);
    // Packed with a head dim of 33: tight rows of 66 bytes.
    check(laid_out(with_alibi(make(F16, 1, 90, 90, 2, 1, 33, true)), Layout::PackedQKV), tally);
    // Contiguous, tight head dims 33 and 100 (200 bytes: not a multiple of 16).
    check(with_sinks(make(BF16, 2, 70, 83, 2, 1, 33)), tally);
    check(windowed(make(F16, 1, 129, 65, 2, 2, 100, true), 8, -1), tally);
    // Gaps of 3, 5 and 7 elements.
    check(laid_out(with_alibi(windowed(make(BF16, 2, 77, 91, 2, 1, 64, true), 30, 0),
                              Slopes::PerBatchHead),
                   Layout::Unaligned),
          tally);
  }

  TEST_CASE("shapes across tile boundaries: seqlens 1, 63, 65, 127, 129, 300, 1000") {
    // Each shape twice: a window with sinks (masks that end inside a tile, rows with no key
    // where Nq > Nk and causal), and softcap with ALiBi over every key; GQA throughout.
    Tally tally("tile boundaries");
    const int64_t shapes[][2] = {{1, 1},      {63, 63},    {65, 65},    {127, 129},
                                 {129, 127},  {300, 300},  {1, 1000},   {1000, 1},
                                 {300, 1000}, {1000, 300}, {1000, 1000}};
    int n = 0;
    for (const auto& s : shapes) {
      const flashattn_dtype_t dt = kDtypes[n % 2];
      const int64_t d = n % 3 == 2 ? 128 : 64;
      const bool causal = n % 2 == 1;
      ++n;
      check(with_sinks(windowed(make(dt, 1, s[0], s[1], 4, 2, d, causal), 40, 7)), tally);
      // Full attention at 1000 x 1000 costs the float64 reference most: one head pair there.
      const int64_t hq = s[0] * s[1] >= 1000000 ? 2 : 4;
      check(with_alibi(softcapped(make(dt, 1, s[0], s[1], hq, 2, d, !causal), 8.0f)), tally);
    }
  }
}

TEST_SUITE("gpu_variants_varlen") {
  TEST_CASE("variable-length batches: lengths 0 and 1, not tile multiples, Nq != Nk, GQA") {
    Tally tally("varlen");
    for (flashattn_dtype_t dt : kDtypes) {
      check(varlen(make(dt, 1, 1, 1, 4, 2, 64), {5, 0, 130, 1, 64}, {7, 3, 100, 0, 64}), tally);
      // max_seqlen above the longest sequence.
      check(varlen(make(dt, 1, 1, 1, 4, 2, 128, true), {70, 1, 0}, {33, 90, 0}, 1), tally);
    }
    // Sequences with keys and no query, and with queries and no key (they see nothing).
    check(varlen(make(F16, 1, 1, 1, 2, 1, 64), {0, 0, 3}, {5, 9, 0}), tally);
    check(varlen(make(BF16, 1, 1, 1, 2, 1, 64, true), {4, 6, 0}, {0, 0, 7}), tally);
    // Lengths on both sides of 64 and 128, each sequence with Nq != Nk both ways.
    check(varlen(make(BF16, 1, 1, 1, 4, 2, 128), {63, 129, 300, 1, 127}, {65, 127, 200, 64, 1000}),
          tally);
  }

  TEST_CASE("variable-length batches with causal and windows") {
    Tally tally("varlen with masks");
    for (flashattn_dtype_t dt : kDtypes) {
      check(windowed(varlen(make(dt, 1, 1, 1, 4, 2, 64, true), {63, 129, 300, 1, 127},
                            {65, 127, 200, 64, 1000}),
                     50, 10),
            tally);
      check(
          windowed(varlen(make(dt, 1, 1, 1, 4, 1, 128), {200, 65, 0, 17}, {70, 129, 5, 17}), 0, 30),
          tally);
    }
  }

  TEST_CASE("variable-length batches with each variant") {
    Tally tally("varlen with each variant");
    const std::vector<int64_t> lq = {90, 0, 129, 1, 64}, lk = {130, 7, 65, 300, 1};
    check(varlen(softcapped(make(F16, 1, 1, 1, 4, 2, 64, true), 4.0f), lq, lk), tally);
    check(varlen(with_alibi(make(BF16, 1, 1, 1, 4, 2, 64)), lq, lk), tally);
    check(varlen(with_alibi(make(F16, 1, 1, 1, 4, 2, 128, true), Slopes::PerBatchHead), lq, lk),
          tally);
    check(varlen(with_sinks(make(BF16, 1, 1, 1, 4, 2, 64, true)), lq, lk), tally);
    check(varlen(with_dv(make(F16, 1, 1, 1, 4, 2, 128), 64), lq, lk), tally);
    check(varlen(with_dv(make(BF16, 1, 1, 1, 2, 1, 192, true), 128), lq, lk), tally);
    check(laid_out(varlen(make(BF16, 1, 1, 1, 4, 2, 33, true), lq, lk), Layout::Aligned), tally);
  }
}

TEST_SUITE("gpu_variants_decode") {
  // Query tokens x heads of a KV group <= 16 with no key hidden below the end: the flash
  // forward's decode kernel (GQA-packed rows, keys split across CTAs and merged).
  TEST_CASE("decode: one token and a few, GQA groups 1 to 16, split keys, every head dim") {
    Tally tally("decode");
    check(make(BF16, 1, 1, 5000, 32, 8, 128, true), tally);   // 16 splits
    check(make(F16, 3, 1, 777, 8, 1, 64, true), tally);       // a group of 8, batch 3
    check(make(BF16, 2, 4, 300, 8, 2, 128), tally);           // 4 tokens x 4 heads: 16 rows
    check(make(F16, 1, 16, 1000, 2, 2, 64), tally);           // 16 tokens, no GQA
    check(make(F16, 4, 1, 64, 4, 4, 96, true), tally);        // one key block
    check(make(BF16, 1, 1, 1, 16, 1, 128, true), tally);      // one key
    check(make(BF16, 1, 1, 1500, 4, 1, 256, true), tally);
    check(make(F16, 1, 1, 2100, 6, 2, 192), tally);
    // Split with head dim 96: a row's 24 chunks leave 8 of the merge's threads on LSEs alone.
    check(make(BF16, 1, 1, 3000, 8, 2, 96, true), tally);
    check(laid_out(make(BF16, 2, 1, 1000, 4, 4, 100, true), Layout::Aligned), tally);
    check(make(BF16, 1, 1, 70000, 8, 2, 128, true), tally);   // 122 splits of 576 keys
  }

  TEST_CASE("decode with softcap, ALiBi, sinks, variable lengths") {
    Tally tally("decode variants");
    check(with_sinks(with_alibi(softcapped(make(F16, 1, 1, 2000, 16, 2, 128, true), 30.0f))),
          tally);
    check(with_sinks(make(BF16, 2, 2, 3000, 8, 2, 64)), tally);
    check(with_alibi(make(BF16, 2, 1, 900, 8, 1, 128, true), Slopes::PerBatchHead), tally);
    // Sequences of one token (or none) against 0, 1 and many keys.
    check(varlen(make(F16, 1, 1, 1, 8, 2, 64, true), {1, 1, 0, 1, 1}, {1, 4000, 5, 0, 130}),
          tally);
    check(varlen(with_sinks(softcapped(make(BF16, 1, 1, 1, 4, 1, 128), 10.0f)), {2, 3, 1},
                 {2000, 3, 64}, 1),
          tally);
  }

  TEST_CASE("decode with the number of splits forced: 1, 2, 7, 128 and past what the keys fill") {
    Tally tally("decode splits");
    for (int32_t n : {1, 2, 7, 128, 100000}) {
      Case c = with_sinks(make(n % 2 == 0 ? F16 : BF16, 2, 1, 3000, 8, 2, 128, true));
      c.num_splits = n;
      check(c, tally);
    }
    Case w = windowed(make(BF16, 1, 2, 900, 8, 1, 64), -1, 1);
    w.num_splits = 5;
    check(w, tally);
  }

  TEST_CASE("decode under sliding windows: one token, left bounds inside and past the keys") {
    Tally tally("decode windows");
    check(windowed(make(BF16, 1, 1, 5000, 32, 8, 128, true), 1000, 0), tally);
    check(windowed(make(F16, 2, 1, 3000, 8, 2, 64), 63, -1), tally);     // 64 keys, 2 blocks
    check(windowed(make(BF16, 3, 1, 700, 4, 1, 128), 0, 5), tally);      // the last key only
    check(windowed(make(F16, 1, 1, 100, 8, 1, 64, true), 5000, 0), tally);  // past the keys
    check(with_sinks(with_alibi(windowed(make(BF16, 1, 1, 9000, 16, 4, 128, true), 4095, 0))),
          tally);
    check(varlen(windowed(make(F16, 1, 1, 1, 8, 2, 64, true), 100, 0), {1, 1, 0, 1},
                 {1, 3000, 5, 70}),
          tally);
  }
}

TEST_SUITE("gpu_variants_combined") {
  TEST_CASE("combinations: window + softcap + ALiBi + sinks + GQA, with d_v and strided views") {
    Tally tally("combinations");
    for (flashattn_dtype_t dt : kDtypes) {
      const Case base = make(dt, 2, 150, 170, 6, 2, 64, true);
      check(with_sinks(with_alibi(softcapped(windowed(base, 40, 0), 8.0f))), tally);
      check(with_sinks(with_alibi(softcapped(windowed(base, 25, 25), 3.0f), Slopes::PerBatchHead)),
            tally);
      // Without a softcap: the Hopper backward runs its plain loop with ALiBi and dsinks (kBiased).
      check(with_sinks(with_alibi(windowed(base, 40, 0))), tally);
      check(with_sinks(with_alibi(windowed(make(dt, 1, 200, 333, 4, 2, 256), 70, 30),
                                  Slopes::PerBatchHead)),
            tally);
      Case wide = make(dt, 1, 300, 129, 4, 1, 128);
      check(with_dv(with_sinks(with_alibi(softcapped(windowed(wide, -1, 50), 20.0f))), 64), tally);
      check(laid_out(with_sinks(with_alibi(
                         softcapped(windowed(make(dt, 2, 65, 127, 4, 2, 100, true), 60, -1), 5.0f),
                         Slopes::PerBatchHead)),
                     Layout::Aligned),
            tally);
    }
  }

  TEST_CASE("combinations in variable-length batches") {
    Tally tally("varlen combinations");
    for (flashattn_dtype_t dt : kDtypes) {
      Case c = with_sinks(softcapped(windowed(make(dt, 1, 1, 1, 6, 2, 64, true), 40, 0), 8.0f));
      c = varlen(c, {100, 0, 37, 129, 1}, {80, 64, 37, 200, 65});
      check(with_alibi(c), tally);
      check(laid_out(with_dv(with_alibi(c, Slopes::PerBatchHead), 128), Layout::Aligned), tally);
    }
    Case odd = with_sinks(with_alibi(
        softcapped(windowed(make(BF16, 1, 1, 1, 4, 2, 100), 33, 33), 6.0f), Slopes::PerBatchHead));
    check(laid_out(varlen(odd, {63, 65, 0, 300}, {127, 1, 9, 129}, 2), Layout::Aligned), tally);
  }

  TEST_CASE("a variable-length batch equals its sequences run one by one (by the rule)") {
    Tally tally("varlen against one by one");
    const std::vector<int64_t> lq = {40, 0, 129, 3, 200}, lk = {70, 5, 100, 0, 333};
    Case c = with_sinks(
        with_alibi(softcapped(windowed(make(BF16, 1, 1, 1, 4, 2, 64, true), 64, -1), 6.0f),
                   Slopes::PerBatchHead));
    Case plain = make(F16, 1, 1, 1, 4, 2, 128);
    for (flashattn_algorithm_t alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
      check_against_singles(varlen(c, lq, lk), alg, tally);
      check_against_singles(varlen(plain, lq, lk), alg, tally);
    }
  }

  TEST_CASE("deterministic = 1: bit-identical dq, dk, dv, dsinks with variants on") {
    Tally tally("determinism");
    // More key blocks than one per query row and GQA 4:1, so that dq and dk/dv sum partial
    // results from several blocks and heads: the order is what determinism fixes.
    const Case fixed = with_sinks(
        with_alibi(softcapped(windowed(make(BF16, 2, 333, 517, 4, 1, 64, true), 300, -1), 10.0f)));
    const Case wide = with_dv(with_sinks(make(F16, 1, 257, 600, 4, 1, 128)), 64);
    const Case biased = with_sinks(with_alibi(make(BF16, 2, 333, 517, 4, 1, 128, true)));
    const Case packed =
        varlen(with_sinks(with_alibi(windowed(make(BF16, 1, 1, 1, 4, 1, 128), 200, 100),
                                     Slopes::PerBatchHead)),
               {333, 0, 129, 65}, {517, 9, 300, 1});
    check_deterministic(fixed, tally);
    check_deterministic(wide, tally);
    check_deterministic(biased, tally);
    check_deterministic(packed, tally);
  }
}
