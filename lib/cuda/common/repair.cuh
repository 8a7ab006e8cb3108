// The forward's repair of rows that a value the mask hides spoiled. The MMAs multiply a hidden
// key's V by P = 0, and 0 * inf is NaN, so an Inf or NaN in V where a row cannot see it would
// reach that row (the header promises it never does). Every forward kernel checks its output
// rows in the epilogue (a few comparisons per element); a row holding a non-finite value is
// computed again, exactly, by the warp that owns it: the visible keys in order, fp32, the row's
// own LSE for P, the hidden keys never read. A row whose NaN or Inf comes from what it sees
// gets it again. The recomputation is out of line, so the kernels' main loops keep their
// registers; it costs nothing while every output is finite.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/mask.cuh"
#include "cuda/common/score_mod.cuh"
#include "cuda/common/seqlen.cuh"
#include "cuda/flash/params.hpp"

namespace flashattn {
namespace common {

// Bit 2 mt + hh of the result: whether the thread's row (mt, hh) of an accumulator fragment
// (kMTiles x kDTiles m16n8 tiles, the layout of write_o_fragment) holds a non-finite value in
// any lane of its quad. Rows with factor 0 (no key seen) are written as 0 and never spoiled.
template <int kMTiles, int kDTiles>
__device__ __forceinline__ uint32_t spoiled_rows(const float (&acc)[kMTiles * kDTiles * 4],
                                                 const float (&inv)[2 * kMTiles]) {
  uint32_t rows = 0;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      bool bad = false;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const int i = (mt * kDTiles + dt) * 4 + 2 * hh;
        bad |= !isfinite(acc[i]) || !isfinite(acc[i + 1]);
      }
      if (bad && inv[2 * mt + hh] != 0.0f) rows |= 1u << (2 * mt + hh);
    }
  rows |= __shfl_xor_sync(0xffffffffu, rows, 1);
  return rows | __shfl_xor_sync(0xffffffffu, rows, 2);
}

// Warp-wide: query `row` of (batch, head) computed again into row `stage_row` of the swizzled
// staging tile (columns [0, head_dim_v)), with lse2 = the row's LSE * log2(e).
template <class T, class Tile, int kHeadDim>
__device__ __noinline__ void recompute_row(const cuda::FwdParams& p, int batch, int head, int row,
                                           float lse2, T* stage, int stage_row) {
  constexpr int kPerLane = (kHeadDim + 31) / 32;
  const int lane = threadIdx.x % 32;
  const SeqlenInfo seq(p, batch);
  const WindowMask mask = mask_of(p, seq);
  const ScoreMod mod = score_mod_of(p, batch, head, mask);
  const int head_kv = head / p.group;
  const T* q = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
               int64_t(seq.offset_q + row) * p.q_row_stride;
  const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride +
               head_kv * p.k_head_stride + int64_t(seq.offset_k) * p.k_row_stride;
  const T* v = static_cast<const T*>(p.v) + batch * p.v_batch_stride +
               head_kv * p.v_head_stride + int64_t(seq.offset_k) * p.v_row_stride;
  float qv[kPerLane], o[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    qv[i] = c < p.head_dim ? static_cast<float>(q[c]) : 0.0f;
    o[i] = 0.0f;
  }
  int lo, hi;
  mask.keys_of(row, lo, hi);
  lo = max(lo, 0);
  hi = min(hi, seq.seqlen_k - 1);
  for (int j = lo; j <= hi; ++j) {
    const T* kj = k + int64_t(j) * p.k_row_stride;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c < p.head_dim) s = fmaf(qv[i], static_cast<float>(kj[c]), s);
    }
#pragma unroll
    for (int w = 16; w > 0; w /= 2) s += __shfl_xor_sync(0xffffffffu, s, w);
    const float x = mod.active() ? mod.logit2(s, row, j) : s * p.scale_log2;
    const float pj = exp2_from_lse(x, lse2);
    const T* vj = v + int64_t(j) * p.v_row_stride;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c < p.head_dim_v) o[i] = fmaf(pj, static_cast<float>(vj[c]), o[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    if (c < p.head_dim_v) stage[Tile::offset(stage_row, c)] = static_cast<T>(o[i]);
  }
}

// Warp-wide, after write_o_fragment: every spoiled row of the warp's fragment (rows row0 +
// 16 mt + 8 hh of the tile, row0 = the lane's first row; query rows m0 + those) recomputed into
// the staging tile. lse: the natural-log LSE of the lane's rows (OnlineSoftmax::finalize).
template <class T, class Tile, int kHeadDim, int kMTiles, int kDTiles>
__device__ __forceinline__ void repair_spoiled_rows(const cuda::FwdParams& p, int batch, int head,
                                                    int m0, int row0,
                                                    const float (&acc)[kMTiles * kDTiles * 4],
                                                    const float (&inv)[2 * kMTiles],
                                                    const float (&lse)[2 * kMTiles], T* stage) {
  const uint32_t mine = spoiled_rows<kMTiles, kDTiles>(acc, inv);
  // Rows past the sequence's queries are never stored; with a KV cache the keys past its
  // length (still inside the cache) may have spoiled them too: they are left alone (their q
  // row does not exist).
  const SeqlenInfo seq(p, batch);
  uint32_t lanes = __ballot_sync(0xffffffffu, mine != 0) & 0x11111111u;  // one lane a quad
  // A recomputed row is written by other lanes than the fragment's: its writes ordered after
  // write_o_fragment's (a shuffle orders no memory).
  if (lanes != 0) __syncwarp();
  while (lanes != 0) {
    const int src = __ffs(lanes) - 1;
    lanes &= lanes - 1;
    const uint32_t rows = __shfl_sync(0xffffffffu, mine, src);
    const int src_row0 = __shfl_sync(0xffffffffu, row0, src);
#pragma unroll
    for (int r = 0; r < 2 * kMTiles; ++r) {
      const float l = __shfl_sync(0xffffffffu, lse[r], src);
      const int tile_row = src_row0 + 16 * (r / 2) + 8 * (r % 2);
      if ((rows & (1u << r)) && m0 + tile_row < seq.seqlen_q) {
        recompute_row<T, Tile, kHeadDim>(p, batch, head, m0 + tile_row,
                                         l * 1.4426950408889634f, stage, tile_row);
      }
    }
  }
}

}  // namespace common
}  // namespace flashattn
