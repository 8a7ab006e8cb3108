#include "cpu/plan.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace flashattn {
namespace cpu {
namespace {

constexpr size_t kAlign = 256;  // every region starts on its own cache lines
// Flash backward: what a slice of (batch, KV head) groups may hold in packed rows and partial
// dQ (more than one group's worth only where it fits).
constexpr size_t kMaxSliceBytes = size_t(256) << 20;

[[noreturn]] void too_big(const Problem& p, const char* what) {
  fail(FLASHATTN_ERROR_OUT_OF_MEMORY,
       "the CPU %s algorithm's workspace for batch %lld, heads %lld, seqlen_q %lld, seqlen_k "
       "%lld, head_dim %lld cannot be represented (%s overflows size_t)",
       p.algorithm == Algorithm::Flash ? "flash" : "standard", static_cast<long long>(p.batch),
       static_cast<long long>(p.heads_q), static_cast<long long>(p.seqlen_q),
       static_cast<long long>(p.seqlen_k), static_cast<long long>(p.head_dim), what);
}

// Checked products and sums in size_t.
struct Sizer {
  const Problem& p;
  size_t mul(std::initializer_list<int64_t> factors, const char* what) const {
    size_t r = 1;
    for (int64_t f : factors) {
      if (f < 0 || __builtin_mul_overflow(r, static_cast<size_t>(f), &r)) too_big(p, what);
    }
    return r;
  }
  size_t add(size_t a, size_t b, const char* what) const {
    size_t r;
    if (__builtin_add_overflow(a, b, &r)) too_big(p, what);
    return r;
  }
  size_t align(size_t a, const char* what) const {
    return add(a, (kAlign - a % kAlign) % kAlign, what);
  }
};

// Appends regions to an area, each aligned, and returns their offsets.
struct Area {
  const Sizer& sz;
  size_t end = 0;
  size_t take(size_t bytes, const char* what) {
    const size_t offset = sz.align(end, what);
    end = sz.add(offset, bytes, what);
    return offset;
  }
};

// The parts of each flash forward item's keys: the caller's options.num_splits, or, where few
// query rows (every KV group's heads x its queries in one tile) meet many keys in few KV groups,
// enough for kSplitItemsTarget groups x parts; at most kMaxKeySplits, at least kMinSplitTiles
// key tiles a part (a forced count: at least one), the partials within kMaxSplitBytes.
int64_t key_splits(const Problem& p, const Plan& plan, size_t bytes_per_split) {
  int64_t splits = 1;
  if (p.num_splits > 0) {
    splits = std::min<int64_t>({p.num_splits, plan.tiles_k, kMaxKeySplits});
  } else if (p.seqlen_q * p.group_size() <= kBlockQ) {
    const int64_t groups = p.batch * p.heads_kv;
    splits = std::min<int64_t>({ceil_div(kSplitItemsTarget, groups), plan.tiles_k / kMinSplitTiles,
                                kMaxKeySplits});
  }
  const int64_t fit = static_cast<int64_t>(kMaxSplitBytes / std::max<size_t>(bytes_per_split, 1));
  return std::max<int64_t>(1, std::min(splits, fit));
}

}  // namespace

Plan make_plan(const Problem& p, bool backward, int threads) {
  Plan plan;
  Sizer sz{p};
  plan.threads = std::max(1, threads);
  plan.dp = round_up(p.head_dim, kPad);
  plan.dvp = round_up(p.head_dim_v, kPad);
  plan.nk_pad = round_up(p.seqlen_k, kPad);
  plan.tiles_q = ceil_div(p.seqlen_q, kBlockQ);
  plan.tiles_k = ceil_div(p.seqlen_k, kBlockK);
  const int64_t B = p.batch, Hq = p.heads_q, Hkv = p.heads_kv, Nk = p.seqlen_k;
  const int64_t d = p.head_dim, dv = p.head_dim_v, dp = plan.dp, dvp = plan.dvp;
  const int64_t nkp = plan.nk_pad;
  const int64_t f = sizeof(float);
  const bool flash = p.algorithm == Algorithm::Flash;
  const bool softcap = p.softcap > 0.0f;
  const size_t row_count = sz.mul({Hq, p.total_q}, "the query rows");
  const int64_t rows = static_cast<int64_t>(row_count);

  Area shared{sz};
  Area thread{sz};
  const size_t q_tile = sz.mul({kBlockQ, dp, f}, "a query tile");
  const size_t k_tile = sz.mul({kBlockK, dp, f}, "a key tile");
  const size_t v_tile = sz.mul({kBlockK, dvp, f}, "a value tile");
  const size_t do_tile = sz.mul({kBlockQ, dvp, f}, "an output tile");
  const size_t s_tile = sz.mul({kBlockQ, kBlockK, f}, "a score tile");

  if (!backward && flash) {
    // A work item takes several query tiles, so each K/V tile it loads serves more rows (rows
    // of one head lie far apart in memory, and fetching them again per tile costs), while
    // leaving at least four items per thread. Grouping changes no result: every query tile is
    // computed the same way whichever item it is in.
    const int64_t tiles = B * Hq * plan.tiles_q;
    const int64_t min_items = 4 * static_cast<int64_t>(plan.threads);
    plan.query_group = std::max<int64_t>(
        1, std::min<int64_t>({kMaxQueryGroup, plan.tiles_q, tiles / min_items}));
    // Where a head has fewer tiles than an item takes (few query rows: a decode step), the
    // query heads of one KV group fill the item instead, each K/V tile then serving them all:
    // the largest divisor of the group that the tile budget and the items per thread allow.
    const int64_t group_heads = p.group_size();
    for (int64_t hg = group_heads; hg > 1; --hg) {
      if (group_heads % hg == 0 && hg * plan.query_group <= kMaxQueryGroup &&
          tiles / (hg * plan.query_group) >= min_items) {
        plan.head_group = hg;
        break;
      }
    }
    // Few enough queries that the heads' rows fit one tile: one tile, each head a segment of
    // it, so that the columns of the score vectors hold queries rather than padding.
    plan.pack_heads = plan.head_group > 1 && p.seqlen_q * plan.head_group <= kBlockQ;
    plan.key_splits = key_splits(p, plan, sz.mul({rows, dvp + 1, f}, "a split's partials"));
    if (plan.key_splits > 1) {
      const int64_t parts = plan.key_splits;
      plan.split_o = shared.take(sz.mul({parts, rows, dvp, f}, "partial O"), "partial O");
      plan.split_lse = shared.take(sz.mul({parts, rows, f}, "partial LSE"), "partial LSE");
    }
    const int64_t g = plan.query_group * plan.head_group;
    const int64_t keys = forward_step_keys(p);  // whichever kernels run
    plan.t_q = thread.take(sz.mul({g, kBlockQ, dp, f}, "Q tiles"), "Q tiles");
    plan.t_kt = thread.take(sz.mul({keys, dp, f}, "a key tile"), "K tile");
    plan.t_v = thread.take(sz.mul({keys, dvp, f}, "a value tile"), "V tile");
    plan.t_s = thread.take(sz.mul({keys, kBlockQ, f}, "a score tile"), "S tile");
    plan.t_o = thread.take(sz.mul({g, kBlockQ, dvp, f}, "O tiles"), "O tiles");
    plan.t_m = thread.take(sz.mul({g, kBlockQ, f}, "row maxima"), "row maxima");
    plan.t_l = thread.take(sz.mul({g, kBlockQ, f}, "row sums"), "row sums");
    if (p.dtype == DType::BF16) {
      plan.t_p_pairs = thread.take(sz.mul({kBlockQ, kPairsForwardKeys / 2, 4}, "P's bf16 pairs"),
                                   "P's bf16 pairs");
    }
  } else if (!backward) {
    plan.kt_all = shared.take(sz.mul({B, Hkv, d, nkp, f}, "K^T"), "K^T");
    plan.v_all = shared.take(sz.mul({B, Hkv, Nk, dvp, f}, "V"), "V");
    plan.s_all = shared.take(sz.mul({rows, nkp, f}, "the score matrix"), "the score matrix");
    plan.t_q = thread.take(q_tile, "Q tile");
    plan.t_o = thread.take(do_tile, "O tile");
  } else if (flash) {
    const size_t stats = sz.mul({rows, f}, "row statistics");
    plan.lse2 = shared.take(stats, "LSE");
    plan.lse2_lo = shared.take(stats, "LSE");
    plan.delta = shared.take(stats, "delta");
    // Slices of groups: as many as kMaxSliceBytes holds at the most key chunks, at least one;
    // then the key chunks, enough for kMinBackwardItems items per slice.
    const int64_t groups = B * Hkv;
    const int64_t group_rows = sz.mul({p.group_size(), p.seqlen_q}, "a group's rows");
    plan.qs_ld = std::max<int64_t>(dp, (dp + dvp) / 2);
    const size_t group_bytes = sz.mul({group_rows, dp + plan.qs_ld + dvp + kMaxKeyChunks * dp, f},
                                      "a group's packed rows");
    plan.slice_groups = std::max<int64_t>(
        1, std::min<int64_t>(groups, static_cast<int64_t>(kMaxSliceBytes / std::max<size_t>(group_bytes, 1))));
    plan.slice_rows = static_cast<int64_t>(sz.mul({plan.slice_groups, group_rows}, "a slice's rows"));
    int64_t chunks = std::min<int64_t>(plan.tiles_k, kMaxKeyChunks);
    chunks = std::min<int64_t>(chunks, ceil_div(kMinBackwardItems, plan.slice_groups));
    plan.key_chunks = std::max<int64_t>(1, chunks);
    const int64_t srows = plan.slice_rows;
    plan.dq_part = shared.take(sz.mul({plan.key_chunks, srows, dp, f}, "partial dQ"), "dQ");
    // Q, scaled Q and dO packed once per slice: every key tile of an item reads each query tile
    // again, and reading the packed rows waits far less than converting strided input rows
    // each time.
    plan.q_all = shared.take(sz.mul({srows, dp, f}, "Q"), "Q");
    plan.qs_all = shared.take(sz.mul({srows, plan.qs_ld, f}, "scaled Q"), "scaled Q");
    plan.do_all = shared.take(sz.mul({srows, dvp, f}, "dO"), "dO");
    plan.t_kt = thread.take(k_tile, "K^T tile");
    plan.t_k = thread.take(k_tile, "K tile");
    plan.t_vt = thread.take(v_tile, "V^T tile");
    plan.t_dk = thread.take(k_tile, "dK tile");
    plan.t_dv = thread.take(v_tile, "dV tile");
    plan.t_s = thread.take(s_tile, "P tile");
    plan.t_dp = thread.take(s_tile, "dS tile");
    if (softcap) plan.t_dcap = thread.take(s_tile, "softcap derivative tile");
    if (p.dtype == DType::BF16) {  // pairs are half an fp32 tile: K, P^T, dS^T, dS
      const char* what = "bf16 pair tiles";
      const size_t tiles = sz.add(k_tile, sz.mul({3, kBlockQ, kBlockK, f}, what), what);
      plan.t_pairs = thread.take(tiles / 2, what);
    }
  } else {
    const size_t stats = sz.mul({rows, f}, "row statistics");
    plan.lse2 = shared.take(stats, "LSE");
    plan.lse2_lo = shared.take(stats, "LSE");
    plan.delta = shared.take(stats, "delta");
    plan.q_all = shared.take(sz.mul({rows, dp, f}, "Q"), "Q");
    plan.do_all = shared.take(sz.mul({rows, dvp, f}, "dO"), "dO");
    plan.k_all = shared.take(sz.mul({B, Hkv, Nk, dp, f}, "K"), "K");
    plan.kt_all = shared.take(sz.mul({B, Hkv, d, nkp, f}, "K^T"), "K^T");
    plan.vt_all = shared.take(sz.mul({B, Hkv, dv, nkp, f}, "V^T"), "V^T");
    const size_t s = sz.mul({rows, nkp, f}, "the probability matrix");
    plan.s_all = shared.take(s, "P");
    plan.ds_all = shared.take(s, "dS");
    plan.t_dk = thread.take(k_tile, "dK tile");
    plan.t_dv = thread.take(v_tile, "dV tile");
    plan.t_q = thread.take(q_tile, "scaled Q tile");
    plan.t_o = thread.take(q_tile, "dQ tile");
    if (softcap) plan.t_dcap = thread.take(sz.mul({nkp, f}, "softcap derivative row"), "dcap");
  }
  plan.thread_bytes = sz.align(thread.end, "a thread's scratch");
  plan.thread_base = sz.align(shared.end, "the shared scratch");
  plan.total = sz.add(
      plan.thread_base,
      sz.mul({plan.threads, static_cast<int64_t>(plan.thread_bytes)}, "the per-thread scratch"),
      "the workspace");
  return plan;
}

}  // namespace cpu
}  // namespace flashattn
