// The KV cache call on the CPU backend: a forward over a cache (contiguous or paged) is the
// variable-length forward over the same tokens, bit for bit, whatever the page size, the order
// of the block table or the pages sequences share for reading; rows appended are written into
// the cache, exactly, and attended; the rotary embedding against a float64 rotation; the host
// checks of lengths, tables and positions refuse bad values with the cache and outputs intact.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/harness.hpp"
#include "cpu/kv_cache_case.hpp"
#include "cpu/plan.hpp"

using namespace flashattn_test;
using namespace flashattn_test::kv_cache;

namespace {

// The cache call equals the variable-length forward over its tokens, and leaves the cache as
// k_after / v_after (the appended rows in place, nothing else touched).
void check_against_varlen(const Case& c, const CacheLayout& layout) {
  CpuContext ctx;
  Inputs in = make_inputs(c);
  if (layout.shared_pages > 0) share_prefix(c, in, layout.shared_pages * layout.page_size);
  for (flashattn_algorithm_t alg : {kFlash, kStandard}) {
    CacheCall call = build(c, in, layout);
    const CacheResult got = run_cache(ctx.get(), call, in, alg);
    const std::string what = c.name() + " n_new " + std::to_string(layout.n_new) + " page " +
                             std::to_string(layout.page_size) +
                             (alg == kFlash ? " flash" : " standard");
    REQUIRE_MESSAGE(got.status == FLASHATTN_SUCCESS, what, ": ", got.message);
    const ForwardResult want = run_forward(ctx.get(), c, in, alg);
    CHECK_MESSAGE(mismatches(c, got, want) == 0, what);
    CHECK_MESSAGE(call.k.snapshot() == call.k_after.snapshot(), what, ": k after the call");
    CHECK_MESSAGE(call.v.snapshot() == call.v_after.snapshot(), what, ": v after the call");
  }
}

}  // namespace

TEST_SUITE("cpu_kv_cache") {
  TEST_CASE("decode shapes: a key one head's query sees and the next query does not stays out") {
    // 3 queries x 4 heads in one packed tile, a window of 30 keys: query 0 sees keys 67..97,
    // queries 1 and 2 from 68 and 69. NaN and infinity in key 67 (and its value) reach query
    // 0's rows only: queries 1 and 2 of every head are bit for bit those of finite inputs.
    Case c = shaped_case(F32, 4, 3, 100, 8, 2, 40, true, 123);
    c.window = true;
    c.window_left = 30;
    c.window_right = 0;
    CHECK(flashattn::cpu::make_plan(
              [&] {
                flashattn::Problem p;
                p.batch = 4, p.seqlen_q = 3, p.seqlen_k = 100, p.heads_q = 8, p.heads_kv = 2;
                p.head_dim = p.head_dim_v = 40, p.total_q = 12, p.total_k = 400;
                return p;
              }(),
              false, 2)
              .pack_heads);
    CpuContext ctx;
    Inputs in = make_inputs(c);
    for (flashattn_algorithm_t alg : {kFlash, kStandard}) {
      const ForwardResult finite = run_forward(ctx.get(), c, in, alg);
      Inputs poisoned = make_inputs(c);
      poisoned.k.set_nonfinite_row(67);
      poisoned.v.set_nonfinite_row(67);
      const ForwardResult got = run_forward(ctx.get(), c, poisoned, alg);
      int differ = 0;
      for (int64_t i = 1; i < 3; ++i)
        for (int64_t h = 0; h < 8; ++h) {
          for (int64_t x = 0; x < 40; ++x) differ += !(got.out.get(0, i, h, x) == finite.out.get(0, i, h, x));
          differ += !(got.lse.get(0, h, i) == finite.lse.get(0, h, i));
        }
      CHECK_MESSAGE(differ == 0, (alg == kFlash ? "flash" : "standard"), ": ", differ,
                    " elements of queries 1 and 2 changed");
    }
  }

  TEST_CASE("decode shapes: a KV group's query heads share each K/V tile, against the reference") {
    // One token (and three) over 8 query heads in groups of 4: the plan puts a group's heads in
    // one work item at 2 threads, as the segments of one tile; every variant that differs per
    // head (ALiBi slopes, sinks) must follow its own head there, every mask its own query.
    flashattn::Problem p;
    p.batch = 4;
    p.seqlen_q = 1;
    p.seqlen_k = 100;
    p.heads_q = 8;
    p.heads_kv = 2;
    p.head_dim = p.head_dim_v = 40;
    p.total_q = 4;
    p.total_k = 400;
    CHECK(flashattn::cpu::make_plan(p, false, 2).head_group == 4);
    CHECK(flashattn::cpu::make_plan(p, false, 2).pack_heads);  // one tile of 4 heads x 1 row
    p.heads_kv = 8;  // no groups: nothing to share
    CHECK(flashattn::cpu::make_plan(p, false, 2).head_group == 1);
    for (flashattn_dtype_t dtype : {F32, BF16}) {
      for (int64_t nq : {1, 3}) {
        Case c = shaped_case(dtype, 4, nq, 100, 8, 2, 40, nq > 1, 77 + nq);
        c.alibi = Slopes::PerBatchHead;
        c.sinks = true;
        c.softcap = 4.0f;
        check_forward(c);
        Case windowed = shaped_case(dtype, 4, nq, 100, 8, 2, 40, true, 91 + nq);
        windowed.window = true;
        windowed.window_left = 30;
        windowed.window_right = 0;
        check_forward(windowed);
      }
    }
  }

  TEST_CASE("a cached forward is the variable-length forward over its tokens, bit for bit") {
    // Lengths of 0 and 1, past a tile, not multiples of any page; one token (decode) and three.
    for (flashattn_dtype_t dtype : {F32, F16, BF16}) {
      const Case decode = cache_case(dtype, 1, {0, 1, 70, 129, 5}, 4, 2, 40, false);
      const Case several = cache_case(dtype, 3, {3, 17, 200}, 4, 1, 32, true);
      for (const Case& c : {decode, several}) {
        check_against_varlen(c, contiguous(0, 260));
        for (int64_t page : {1, 7, 16, 64, 256}) check_against_varlen(c, paged(page));
      }
    }
  }

  TEST_CASE("rows appended are written into the cache and attended, contiguous and paged") {
    for (flashattn_dtype_t dtype : {F32, BF16}) {
      const Case decode = cache_case(dtype, 1, {1, 8, 70, 129}, 8, 2, 64, true);
      check_against_varlen(decode, contiguous(1, 130));
      for (int64_t page : {1, 7, 16, 64, 256}) check_against_varlen(decode, paged(page, 1));
      // Several new rows per sequence, more queries than new rows and fewer.
      for (int64_t nq : {2, 5}) {
        const Case c = cache_case(dtype, nq, {5, 9, 200}, 4, 2, 40, true);
        check_against_varlen(c, contiguous(3));
        check_against_varlen(c, paged(16, 3));
      }
      // A cache that the new rows fill to its last token.
      check_against_varlen(cache_case(dtype, 4, {64, 10}, 2, 2, 16, true), paged(16, 4));
    }
  }

  TEST_CASE("pages shared by sequences for reading") {
    const Case c = cache_case(F16, 2, {40, 50, 33}, 4, 2, 32, true);
    CacheLayout layout = paged(16, 1);
    layout.shared_pages = 2;  // 32 tokens, all held before the call by every sequence
    check_against_varlen(c, layout);
  }

  TEST_CASE("every variant through the cache: window, softcap, ALiBi, sinks, GQA, d_v") {
    Case c = cache_case(BF16, 3, {1, 60, 131, 7}, 8, 2, 48, true);
    c.window = true;
    c.window_left = 20;
    c.window_right = 0;
    c.softcap = 5.0f;
    c.alibi = Slopes::PerBatchHead;
    c.sinks = true;
    c.head_dim_v = 24;
    check_against_varlen(c, contiguous(1));
    check_against_varlen(c, paged(7, 1));
    Case wide = cache_case(F32, 2, {0, 90, 33}, 4, 4, 16, false);
    wide.window = true;
    wide.window_left = 9;
    wide.window_right = 4;
    wide.alibi = Slopes::PerHead;
    check_against_varlen(wide, paged(64));
  }
}

namespace {

// |got - want| for a rotated value: one unit in the last place of the dtype at |want|, and
// fp32's rounding of x cos - y sin.
double rotary_tolerance(flashattn_dtype_t dtype, double want, double x, double y) {
  const double ulp = dtype == F32 ? 0x1p-23 : (dtype == F16 ? 0x1p-10 : 0x1p-7);
  return ulp * std::fabs(want) + 0x1p-22 * (std::fabs(x) + std::fabs(y));
}

// Pair (i0, i1) of feature r of a row with rotary_dim R.
std::pair<int64_t, int64_t> pair_of(const CacheLayout& l, int64_t r) {
  return l.interleaved ? std::make_pair(2 * r, 2 * r + 1)
                       : std::make_pair(r, r + l.rotary_dim / 2);
}

// Rotates the rows of `t` (double, [rows][heads][d] of one packed tensor) that `position`
// places (position(row) < 0: left alone), with the tables' values.
void rotate64(std::vector<double>& t, int64_t rows, int64_t heads, int64_t d,
              const CacheLayout& l, const std::vector<double>& cos, const std::vector<double>& sin,
              const std::function<int64_t(int64_t)>& position) {
  const int64_t half = l.rotary_dim / 2;
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t pos = position(row);
    if (pos < 0) continue;
    for (int64_t h = 0; h < heads; ++h) {
      double* e = &t[static_cast<size_t>((row * heads + h) * d)];
      for (int64_t r = 0; r < half; ++r) {
        const auto p = pair_of(l, r);
        const double x = e[p.first], y = e[p.second];
        const double cs = cos[pos * half + r], sn = sin[pos * half + r];
        e[p.first] = x * cs - y * sn;
        e[p.second] = x * sn + y * cs;
      }
    }
  }
}

void check_rotary(const Case& c, CacheLayout layout) {
  CpuContext ctx;
  const Inputs in = make_inputs(c);
  CacheCall flash_call = build(c, in, layout);
  CacheCall standard_call = build(c, in, layout);
  const std::string what = c.name() + " R " + std::to_string(layout.rotary_dim) +
                           (layout.interleaved ? " interleaved" : " half-split") + " tables " +
                           dtype_label(layout.rotary_dtype) + " n_new " +
                           std::to_string(layout.n_new);
  const CacheResult flash = run_cache(ctx.get(), flash_call, in, kFlash);
  REQUIRE_MESSAGE(flash.status == FLASHATTN_SUCCESS, what, ": ", flash.message);
  const CacheResult standard = run_cache(ctx.get(), standard_call, in, kStandard);
  REQUIRE_MESSAGE(standard.status == FLASHATTN_SUCCESS, what, ": ", standard.message);

  // The float64 rotation of the packed tokens: query i of b at len_k - Nq + i, new key t at t.
  const std::vector<double> cos = flash_call.cos.to_double(), sin = flash_call.sin.to_double();
  std::vector<int64_t> seq_of_k, first_k;
  int64_t k0 = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    first_k.push_back(k0);
    for (int64_t t = 0; t < c.seqlens_k[b]; ++t) seq_of_k.push_back(b);
    k0 += c.seqlens_k[b];
  }
  std::vector<double> q = in.q.to_double(), k = in.k.to_double();
  const std::vector<double> k_plain = k;
  rotate64(q, c.total_q(), c.heads_q, c.head_dim, layout, cos, sin, [&](int64_t row) {
    const int64_t b = row / c.seqlen_q, i = row % c.seqlen_q;
    return c.seqlens_k[b] - c.seqlen_q + i;
  });
  rotate64(k, c.total_k(), c.heads_kv, c.head_dim, layout, cos, sin, [&](int64_t row) {
    const int64_t b = seq_of_k[row], t = row - first_k[b];
    return t >= c.seqlens_k[b] - layout.n_new ? t : -1;  // cached tokens are left as they are
  });

  // The appended rows in the cache: the rotation, rounded once.
  int bad = 0;
  std::string first_bad;
  for (int64_t row = 0; row < c.total_k(); ++row) {
    const int64_t b = seq_of_k[row], t = row - first_k[b];
    if (t < c.seqlens_k[b] - layout.n_new) continue;
    const auto at = flash_call.slot(b, t);
    for (int64_t h = 0; h < c.heads_kv; ++h)
      for (int64_t x = 0; x < c.head_dim; ++x) {
        const size_t e = static_cast<size_t>((row * c.heads_kv + h) * c.head_dim + x);
        const double got = flash_call.k.get(at.first, at.second, h, x);
        // The pair's inputs bound fp32's error of the rotation.
        double px = k_plain[e], py = 0.0;
        if (x < layout.rotary_dim) {
          for (int64_t r = 0; r < layout.rotary_dim / 2; ++r) {
            const auto p = pair_of(layout, r);
            if (p.first == x || p.second == x) {
              const size_t base = e - static_cast<size_t>(x);
              px = k_plain[base + p.first];
              py = k_plain[base + p.second];
            }
          }
        }
        if (!(std::fabs(got - k[e]) <= rotary_tolerance(c.dtype, k[e], px, py))) {
          if (bad++ == 0) {
            first_bad = "sequence " + std::to_string(b) + " token " + std::to_string(t) +
                        " head " + std::to_string(h) + " feature " + std::to_string(x) +
                        ": got " + std::to_string(got) + ", float64 " + std::to_string(k[e]);
          }
        }
      }
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " rotated cache elements wrong, first ", first_bad);

  // Attention over the rotated tokens, against the float64 reference by the rule (the standard
  // algorithm's distance in the same dtype as the base).
  const RefProblem rp = in.ref(c);
  std::vector<double> ref_out, ref_lse;
  reference_forward(rp, q, k, in.v.to_double(), &ref_out, &ref_lse);
  // The reference's out is [total_q, Hq, dv] and its LSE [Hq, total_q]; the cache call's out
  // [B, Nq, Hq, dv] has the same order, its LSE [B, Hq, Nq] another.
  std::vector<double> lse_flash, lse_standard, lse_ref;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < c.seqlen_q; ++i) {
        lse_flash.push_back(flash.lse.get(b, h, i));
        lse_standard.push_back(standard.lse.get(b, h, i));
        lse_ref.push_back(ref_lse[static_cast<size_t>(h * c.total_q() + b * c.seqlen_q + i)]);
      }
  const double atol = dtype_atol(c.dtype);
  const Comparison out_cmp =
      check_rule(what + " out", flash.out.to_double(), standard.out.to_double(), ref_out, atol);
  CHECK_MESSAGE(out_cmp.ok, out_cmp.message);
  const Comparison lse_cmp = check_rule(what + " lse", lse_flash, lse_standard, lse_ref, atol);
  CHECK_MESSAGE(lse_cmp.ok, lse_cmp.message);
}

}  // namespace

namespace {
// One token of 8 heads over one KV group of 6000 keys with sinks: split automatically.
Case with_splits_case() {
  Case c = shaped_case(BF16, 1, 1, 6000, 8, 1, 64, true, 333);
  c.sinks = true;
  return c;
}
}  // namespace

TEST_SUITE("cpu_kv_cache_splits") {
  // Few query rows against many keys in few KV groups: the keys of each item in parts merged
  // by their LSE (plan.key_splits), chosen from shapes only, or forced by options.num_splits.
  flashattn::Problem decode_problem(int64_t batch, int64_t nq, int64_t nk, int64_t hq,
                                    int64_t hkv, int64_t num_splits = 0) {
    flashattn::Problem p;
    p.batch = batch;
    p.seqlen_q = nq;
    p.seqlen_k = nk;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.head_dim = p.head_dim_v = 64;
    p.total_q = batch * nq;
    p.total_k = batch * nk;
    p.num_splits = num_splits;
    return p;
  }

  TEST_CASE("the split: from the shapes, never the threads; forced; bounded") {
    using flashattn::cpu::make_plan;
    // One KV group, 8192 keys (128 tiles): 8 parts of 16 tiles, at any thread count.
    for (int threads : {1, 2, 64}) {
      CHECK(make_plan(decode_problem(1, 1, 8192, 8, 1), false, threads).key_splits == 8);
    }
    // 8 groups of 4 heads: 64 / 8 = 8 parts; 64 groups: none; few keys: none.
    CHECK(make_plan(decode_problem(1, 1, 8192, 32, 8), false, 2).key_splits == 8);
    CHECK(make_plan(decode_problem(64, 1, 8192, 32, 8), false, 2).key_splits == 1);
    CHECK(make_plan(decode_problem(1, 1, 1500, 8, 1), false, 2).key_splits == 1);
    // Many query rows: no automatic split; forced counts cut to the key tiles.
    CHECK(make_plan(decode_problem(1, 300, 8192, 8, 1), false, 2).key_splits == 1);
    CHECK(make_plan(decode_problem(1, 300, 8192, 8, 1, 5), false, 2).key_splits == 5);
    CHECK(make_plan(decode_problem(1, 1, 100, 8, 1, 50), false, 2).key_splits == 2);
  }

  TEST_CASE("split keys against the reference: decode, sinks, ALiBi, windows, lengths of 0") {
    for (flashattn_dtype_t dtype : {F32, BF16}) {
      // Automatic: one KV group of 4 heads, 3000 keys (47 tiles: 2 parts).
      Case c = shaped_case(dtype, 1, 1, 3000, 4, 1, 64, true, 301);
      c.sinks = true;
      c.alibi = Slopes::PerHead;
      check_forward(c);
      // Forced: 1, 2, 3, 7 and past the tiles, with a window and several query tokens.
      for (int64_t n : {1, 2, 3, 7, 100}) {
        Case f = shaped_case(dtype, 2, 3, 900, 4, 2, 40, true, 310 + n);
        f.num_splits = n;
        f.window = true;
        f.window_left = 300;
        f.window_right = 0;
        f.softcap = 10.0f;
        check_forward(f);
      }
      // Variable lengths (0 keys, fewer keys than a part) with forced parts.
      Case v = cache_case(dtype, 1, {0, 70, 2100, 5}, 8, 2, 64, true);
      v.num_splits = 4;
      v.sinks = true;
      check_forward(v);
    }
  }

  TEST_CASE("split keys: a NaN in a key the rows see spoils them as it does unsplit") {
    // Sequence 1's 100 keys lie in the first of 4 parts (the others see none of them: LSE
    // -inf); its key 50 holds NaN and infinities, so that part's LSE is NaN: the merge must
    // keep it, not take the -inf parts' maximum.
    Case c = cache_case(F32, 1, {3000, 100}, 4, 1, 64, true);
    c.num_splits = 4;
    Inputs in = make_inputs(c);
    in.k.set_nonfinite_row(3000 + 50);
    CpuContext ctx;
    const ForwardResult split = run_forward(ctx.get(), c, in, kFlash);
    c.num_splits = 1;
    const ForwardResult whole = run_forward(ctx.get(), c, in, kFlash);
    for (int64_t h = 0; h < c.heads_q; ++h) {
      CHECK(std::isnan(whole.lse.get(0, h, 1)));
      CHECK_MESSAGE(std::isnan(split.lse.get(0, h, 1)), "head ", h, ": ", split.lse.get(0, h, 1));
      CHECK_MESSAGE(std::isnan(split.out.get(0, 1, h, 0)), "head ", h);
      // Sequence 0 never sees the NaN: its rows equal within rounding.
      CHECK(std::fabs(split.out.get(0, 0, h, 0) - whole.out.get(0, 0, h, 0)) < 1e-5);
    }
  }

  TEST_CASE("split keys: the same results at 1 thread and at 3, bit for bit") {
    Case c = with_splits_case();
    const Inputs in = make_inputs(c);
    CpuContext one(1), three(3);
    const ForwardResult a = run_forward(one.get(), c, in, kFlash);
    const ForwardResult b = run_forward(three.get(), c, in, kFlash);
    CHECK(a.out.snapshot() == b.out.snapshot());
    CHECK(a.lse.snapshot() == b.lse.snapshot());
  }
}

TEST_SUITE("cpu_kv_cache_rotary") {
  TEST_CASE("rotary embedding of q and the appended rows against a float64 rotation") {
    for (flashattn_dtype_t dtype : {F32, F16, BF16}) {
      for (bool interleaved : {false, true}) {
        for (flashattn_dtype_t tables : {F32, dtype}) {
          CacheLayout l = paged(16, 2);
          l.rotary_dim = 32;
          l.interleaved = interleaved;
          l.rotary_dtype = tables;
          check_rotary(cache_case(dtype, 2, {2, 19, 100}, 4, 2, 32, true), l);
          // A part of head_dim rotated; contiguous; no rows appended (q alone is rotated).
          CacheLayout part = contiguous(0, 150);
          part.rotary_dim = 16;
          part.interleaved = interleaved;
          part.rotary_dtype = tables;
          check_rotary(cache_case(dtype, 3, {3, 40, 129}, 2, 1, 40, false), part);
        }
      }
    }
  }
}

namespace {

// A call that the host checks refuse: its status and message, and the cache and the outputs
// as they were.
void expect_refused(CacheCall& call, const Inputs& in, const std::string& fragment) {
  CpuContext ctx;
  const auto k_before = call.k.snapshot(), v_before = call.v.snapshot();
  const CacheResult r = run_cache(ctx.get(), call, in, kFlash);
  CHECK_MESSAGE(r.status == FLASHATTN_ERROR_INVALID_SHAPE, fragment, " -> ", r.message);
  CHECK_MESSAGE(r.message.find(fragment) != std::string::npos, r.message);
  CHECK_MESSAGE(call.k.snapshot() == k_before, fragment, ": the cache's k changed");
  CHECK_MESSAGE(call.v.snapshot() == v_before, fragment, ": the cache's v changed");
  const std::vector<double> out = r.out.to_double();
  CHECK_MESSAGE(std::all_of(out.begin(), out.end(), [](double x) { return std::isnan(x); }),
                fragment, ": out was written");
}

}  // namespace

TEST_SUITE("cpu_kv_cache_checks") {
  const Case c = cache_case(F32, 1, {5, 20, 9}, 2, 1, 16, true);

  TEST_CASE("lengths: negative, and past the cache with the rows appended") {
    const Inputs in = make_inputs(c);
    CacheCall negative = build(c, in, contiguous(1, 24));
    negative.seqlens[1] = -3;
    expect_refused(negative, in, "cache_seqlens[1] is -3, must be >= 0");
    CacheCall past = build(c, in, paged(8, 1));
    past.seqlens[2] = 24;  // 24 + 1 > 3 pages of 8
    expect_refused(past, in, "sequence 2: cache_seqlens[2] = 24 and 1 new rows make 25 tokens, "
                             "past the cache's 24");
  }

  TEST_CASE("block table entries a sequence uses: outside the pages; unused ones are not read") {
    const Inputs in = make_inputs(c);
    CacheCall low = build(c, in, paged(8, 1));
    low.table[1 * low.pages_per_seq + 2] = -1;  // sequence 1 uses 3 pages of 8 for 20 tokens
    expect_refused(low, in, "block_table[1, 2] is -1, outside k's 11 pages (sequence 1 uses its "
                            "first 3 entries)");
    CacheCall high = build(c, in, paged(8, 1));
    high.table[0] = static_cast<int32_t>(high.num_pages);
    expect_refused(high, in, "block_table[0, 0] is 11, outside k's 11 pages");
    // Entries past those used hold -1 already (build): the call succeeds.
    CpuContext ctx;
    CacheCall fine = build(c, in, paged(8, 1));
    fine.table[0 * fine.pages_per_seq + 2] = 1 << 30;  // sequence 0 uses 1 page
    CHECK(run_cache(ctx.get(), fine, in, kFlash).status == FLASHATTN_SUCCESS);
  }

  TEST_CASE("two sequences appending into one page row, and one appending twice") {
    const Inputs in = make_inputs(c);
    CacheCall two = build(c, in, paged(8, 1));
    // Sequence 2 (9 tokens: rows 0-7 of its page 0, row 0 of page 1) appends token 8 into row 0
    // of its page 1; make sequence 1's page 0 that page, and sequence 1 append into row 0 too.
    two.seqlens[1] = 0;
    two.c.seqlens_k[1] = 1;
    two.table[1 * two.pages_per_seq] = two.table[2 * two.pages_per_seq + 1];
    expect_refused(two, in, "sequences 1 and 2 both append into row 0 of page");
    const Case twice_case = cache_case(F32, 1, {20}, 2, 1, 16, true);
    const Inputs twice_in = make_inputs(twice_case);
    CacheCall twice = build(twice_case, twice_in, paged(4, 8));  // appends tokens 12-19
    twice.table[4] = twice.table[3];                             // pages 3 and 4 the same
    expect_refused(twice, twice_in, "sequence 0 appends into row 0 of page");
  }

  TEST_CASE("rotary positions: past the tables, and queries without one") {
    const Inputs in = make_inputs(c);
    CacheLayout l = contiguous(1, 24);
    l.rotary_dim = 8;
    CacheCall past = build(c, in, l);
    past.cos = rotary_table(15, 8, F32, false);  // sequence 1 reaches position 19
    past.sin = rotary_table(15, 8, F32, true);
    expect_refused(past, in, "sequence 1: position 19 is past rotary_cos's 15 rows");
    const Case few = cache_case(F32, 4, {2, 6}, 2, 1, 16, false);
    const Inputs few_in = make_inputs(few);
    CacheLayout none = contiguous(0, 8);
    none.rotary_dim = 8;
    CacheCall short_seq = build(few, few_in, none);
    expect_refused(short_seq, few_in, "sequence 0: 2 keys for 4 queries; with a rotary "
                                      "embedding each query needs a position");
  }
}

TEST_SUITE("cpu_kv_cache_queries") {
  TEST_CASE("workspace: the rotated q's room, and a workspace too small is refused") {
    const Case c = cache_case(BF16, 2, {4, 30}, 4, 2, 32, true);
    const Inputs in = make_inputs(c);
    CpuContext ctx;
    CacheLayout l = paged(16, 1);
    CacheCall plain = build(c, in, l);
    l.rotary_dim = 32;
    CacheCall rotary = build(c, in, l);
    flashattn_options_t options = options_for(c, kFlash);
    const auto size_of = [&](CacheCall& call) {
      flashattn_args_t args;
      flashattn_args_init(&args);
      args.options = &options;
      flashattn_tensor_t q = call.q.view(), k = call.k.view(), v = call.v.view();
      flashattn_tensor_t lens = int_view(call.seqlens, c.batch, 0);
      flashattn_tensor_t table = int_view(call.table, c.batch, call.pages_per_seq);
      flashattn_tensor_t kn = call.k_new.view(), vn = call.v_new.view();
      flashattn_tensor_t cos, sin;
      args.q = &q;
      args.k = &k;
      args.v = &v;
      args.cache_seqlens = &lens;
      args.block_table = &table;
      args.k_new = &kn;
      args.v_new = &vn;
      if (call.layout.rotary_dim > 0) {
        cos = table_view(call.cos);
        sin = table_view(call.sin);
        args.rotary_cos = &cos;
        args.rotary_sin = &sin;
      }
      CHECK(flashattn_supported_ex(ctx.get(), &args, 0) == FLASHATTN_SUCCESS);
      size_t bytes = 0;
      REQUIRE(flashattn_workspace_size_ex(&bytes, ctx.get(), &args, 0) == FLASHATTN_SUCCESS);
      CHECK(flashattn_supported_ex(ctx.get(), &args, 1) == FLASHATTN_ERROR_UNSUPPORTED);
      return bytes;
    };
    const size_t plain_bytes = size_of(plain), rotary_bytes = size_of(rotary);
    // The rotated copy of q: 2 x 2 x 4 x 32 bf16 elements, 1024 bytes.
    CHECK(rotary_bytes == plain_bytes + 1024);
    const CacheResult ok =
        run_cache(ctx.get(), rotary, in, kFlash, static_cast<int64_t>(rotary_bytes));
    CHECK_MESSAGE(ok.status == FLASHATTN_SUCCESS, ok.message);
    CacheCall again = build(c, in, l);
    const CacheResult small =
        run_cache(ctx.get(), again, in, kFlash, static_cast<int64_t>(rotary_bytes - 256));
    CHECK(small.status == FLASHATTN_ERROR_WORKSPACE_TOO_SMALL);
  }
}
