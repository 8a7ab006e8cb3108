// The attention variants on the CUDA backend: both algorithms (standard through cuBLAS, flash on
// the Hopper and the sm80 kernels), forward and backward (dq, dk, dv, dsinks), fp16 and bf16,
// against the float64 reference by the tolerance rule with the standard result as base (3x with
// a softcap: variant_harness.cpp says why). Each variant alone (windows, softcap, ALiBi per head
// and per (batch, head), sinks, d_v != d, head dims that are not multiples of 8, packed and
// unaligned views, variable-length batches) with GQA; shapes across tile boundaries.
//
// The variants reach the kernels one by one: the table below says which the suite expects of
// each algorithm, kernel family and pass. A pass the table expects that answers UNSUPPORTED
// fails; one it does not expect is reported skipped with the library's message (and one that
// runs anyway is checked all the same, with a note that the table can grow).
#include <cmath>
#include <cstring>

#include "variant_harness.hpp"

using namespace gpu_variants;

// ---- The expectation table ------------------------------------------------------------------
//
// One row per variant; a column per algorithm or kernel family and pass. Y: expected to be
// supported (UNSUPPORTED fails the case); N: not yet (UNSUPPORTED is reported as skipped).
// "flash sm90" are the Hopper kernels (on an H200 without FLASHATTN_TEST_FORCE_SM80; its backward
// at head dims 96 and 192 is the sm80 one), "flash sm80" the mma.sync kernels (every other
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
    // Views whose rows are not 16-byte aligned: the standard algorithm takes them; the flash
    // kernels may decline them with UNSUPPORTED (the README's rule) or take them, and are then
    // checked like any result.
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
