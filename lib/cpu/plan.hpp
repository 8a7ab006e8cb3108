// Tile sizes and the workspace layout of the CPU algorithms. Every byte of scratch a call uses
// comes from the Workspace the API layer passes; this file says how big it is and where each
// piece lies. Sizes are computed in checked arithmetic: a size that size_t cannot hold throws.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/problem.hpp"

namespace flashattn {
namespace cpu {

constexpr int kBlockQ = 64;  // query rows per tile
constexpr int kBlockK = 64;  // keys per tile
constexpr int kPad = 16;     // head dims and materialized rows padded to 16 floats (64 bytes)
// Flash forward: keys per step. Each instruction set's kernels take as many per step as pay for
// their products' accumulators (kernels_impl.hpp: kForwardKeys, pairs_forward_keys), at most
// kNarrowForwardKeys; only bf16 above kWideStepAboveHeadDim may take kPairsForwardKeys (the
// AMX copy's P V on pairs). forward_step_keys says what the workspace's K, V and score tiles
// hold for a problem; the kernels check their steps against these constants.
constexpr int kNarrowForwardKeys = 2 * kBlockK;
constexpr int kPairsForwardKeys = 4 * kBlockK;
constexpr int kWideStepAboveHeadDim = 64;
inline int64_t forward_step_keys(const Problem& p) {
  return p.dtype == DType::BF16 && p.head_dim > kWideStepAboveHeadDim ? kPairsForwardKeys
                                                                       : kNarrowForwardKeys;
}
constexpr int kMinBackwardItems = 16;  // flash backward: split keys until this many work items
constexpr int kMaxKeyChunks = 16;
constexpr int kMaxHeadDim = 256;  // of q, k and of v: what the CPU backend supports
constexpr int kMaxHeadDimPadded = (kMaxHeadDim + kPad - 1) / kPad * kPad;
constexpr int kMaxQueryGroup = 8;  // flash forward: query tiles sharing each K/V tile load
// Flash forward, few query rows against many keys: the keys of each item split into parts
// whose partial results are merged by their LSE, so that a decode step of few KV groups has
// work for many threads. The split depends on shapes only (and options.num_splits), never on
// the thread count, so results do not either.
constexpr int64_t kSplitItemsTarget = 64;   // KV groups x parts the automatic split aims at
constexpr int64_t kMinSplitTiles = 16;      // key tiles of a part at least (1024 keys)
constexpr int64_t kMaxKeySplits = 64;       // parts at most
constexpr size_t kMaxSplitBytes = size_t(256) << 20;  // the partials' workspace at most

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Offsets (bytes from the workspace start) of the regions one algorithm uses. Shared regions
// come first; then `threads` per-thread areas of `thread_bytes` each, at `thread_base`. Regions
// a given algorithm does not use are left at 0 size.
struct Plan {
  int threads = 1;
  int64_t dp = 0;           // head_dim rounded up to kPad
  int64_t dvp = 0;          // head_dim_v rounded up to kPad
  int64_t nk_pad = 0;       // seqlen_k rounded up to kPad (rows of materialized S/P)
  int64_t tiles_q = 0;      // ceil(seqlen_q / kBlockQ)
  int64_t tiles_k = 0;      // ceil(seqlen_k / kBlockK)
  int64_t key_chunks = 1;   // flash backward: key tiles are split into this many chunks
  // Flash backward: the (batch, KV head) groups run in slices of slice_groups groups, each
  // slice's packed Q, scaled Q, dO and partial dQ in regions of slice_rows rows (a bound: the
  // groups' heads times the longest sequence), so that the workspace does not grow with
  // batch x heads.
  int64_t slice_groups = 1;
  int64_t slice_rows = 0;
  int64_t query_group = 1;  // flash forward: query tiles per work item and head
  int64_t head_group = 1;   // flash forward: query heads of one KV group per work item (it
                            // divides the group; head_group * query_group <= kMaxQueryGroup)
  bool pack_heads = false;  // flash forward: those heads' queries share one tile (they fit)
  int64_t key_splits = 1;   // flash forward: parts of every item's key range (1: no split)

  // Shared regions (fp32). "Rows" are the Hq * total_q query rows of the batch, in the order
  // of cpu/sequences.hpp's scratch_row ([B, Hq, Nq] for a fixed-length batch).
  size_t lse2 = 0;     // backward: [rows] LSE in log2 units, rounded to float
  size_t lse2_lo = 0;  // backward: [rows] what that rounding lost
  size_t delta = 0;    // backward: [rows] rowsum(dO * O)
  size_t dq_part = 0;  // flash backward: [chunks, slice_rows, dp] partial dQ of one slice
  size_t q_all = 0;    // backward: [rows, dp] (flash: [slice_rows, dp], one slice's; with bf16
                       // pairs, each query tile's pairs down its rows, in its first half)
  size_t qs_all = 0;   // flash backward: [slice_rows, qs_ld] Q in log2 units (times scale * log2(e));
                       // with bf16 pairs, Q's dp / 2 pairs then dO's dvp / 2 (unscaled)
  int64_t qs_ld = 0;   // floats per row of qs_all: max(dp, (dp + dvp) / 2)
  size_t do_all = 0;   // backward: [rows, dvp] (flash: [slice_rows, dvp]; with pairs, as q_all)
  size_t k_all = 0;    // standard backward: [B, Hkv, Nk, dp]
  size_t kt_all = 0;   // standard: [B, Hkv, d, nk_pad] (K transposed)
  size_t v_all = 0;    // standard forward: [B, Hkv, Nk, dvp]
  size_t vt_all = 0;   // standard backward: [B, Hkv, dv, nk_pad]
  size_t s_all = 0;    // standard: [rows, nk_pad] scores, then probabilities
  size_t ds_all = 0;   // standard backward: [rows, nk_pad] dP, then dS
  size_t split_o = 0;    // flash forward with key_splits > 1: [splits, rows, dvp] partial O
  size_t split_lse = 0;  // and [splits, rows] their LSEs in log2 units (-inf: no key)

  // Per-thread regions (fp32), offsets inside one thread's area.
  size_t t_q = 0, t_o = 0, t_s = 0, t_dp = 0;
  size_t t_kt = 0, t_k = 0, t_v = 0, t_vt = 0, t_dk = 0, t_dv = 0, t_m = 0, t_l = 0;
  size_t t_dcap = 0;  // backward with a softcap: its derivative, a P tile (flash) or row (standard)
  // flash backward in bf16: the bf16 pairs of K, P^T, dS^T and dS (kernels_impl.hpp,
  // "bf16 pairs"), taken whichever copy of the kernels runs, so the workspace is the same
  size_t t_pairs = 0;
  // flash forward in bf16: P's bf16 pairs, [kBlockQ][kPairsForwardKeys / 2] (the copies that
  // multiply P V on pairs use it, and step by kPairsForwardKeys keys; taken by every copy, as
  // t_pairs, and so are the larger K, V and S tiles)
  size_t t_p_pairs = 0;

  size_t thread_base = 0;
  size_t thread_bytes = 0;
  size_t total = 0;
};

// The layout for problem p (forward or backward) run on `threads` threads. Throws
// OUT_OF_MEMORY when the sizes cannot be represented.
Plan make_plan(const Problem& p, bool backward, int threads);

}  // namespace cpu
}  // namespace flashattn
