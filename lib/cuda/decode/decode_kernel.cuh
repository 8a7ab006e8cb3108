// The decode forward: few query rows against many keys, the shape of one generation step. The
// query heads of one KV group, times the query tokens, share one tile of kRows packed rows (row
// r: token r / group, head head_kv * group + r % group), so K and V are read once per group; the
// keys of a sequence are split across CTAs when the grid would not fill the GPU (the plan in
// decode.hpp), each split writing an fp32 partial (O, LSE) that a second launch merges. Within a
// CTA each warp takes 16 keys of every 64-key block; K and V stream through a two-stage cp.async
// ring; the four warps' online-softmax states are merged through shared memory at the end.
//
// Taken only where every key is visible to every row or hidden from all of them (one query
// token with any window; more tokens with no key hidden below the end): the rows then share one
// range of visible keys, the key blocks outside it are never read, and the rows of V below it in
// the first block are zero-filled, so no value the mask hides meets a probability in an MMA
// (0 * inf). Softcap, ALiBi (a slope per packed row's head), sinks and packed variable-length
// batches are applied per row.
#pragma once

#include <cfloat>
#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/common/kv_rows.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/score_mod.cuh"
#include "cuda/common/seqlen.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/common/tile.cuh"
#include "cuda/decode/decode_shape.hpp"
#include "cuda/flash/params.hpp"
#include "cuda/sm80/mma.cuh"

namespace flashattn {
namespace decode {

template <int kHeadDim_>
struct DecodeConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kDTiles = kHeadDim / 8;  // n8 tiles of O
  using TileQ = common::SwizzledTile<kRows, kHeadDim>;
  using TileKV = common::SwizzledTile<kBlockN, kHeadDim>;
  static constexpr int kStageElems = 2 * TileKV::kElems;  // K then V
  static constexpr int kSmemBytes = (TileQ::kElems + kStages * kStageElems) * 2;
  // After the key loop the ring holds each warp's state: O (fp32, kRows x head dim), then the
  // rows' maxima and sums.
  static constexpr int kWarpStateFloats = kRows * kHeadDim + 2 * kRows;
  static_assert(kWarps * kWarpStateFloats * 4 <= kStages * kStageElems * 2,
                "the warps' states fit in the K/V ring");
  static_assert(kDTiles % 2 == 0, "ldmatrix.x4 loads n16 at a time");
};

// Where a packed row's query token and head are.
struct PackedRow {
  int token, head;
  bool valid;
};
__device__ __forceinline__ PackedRow packed_row(const cuda::FwdParams& p, int r, int head_kv,
                                                int seqlen_q) {
  PackedRow pr;
  pr.token = r / p.group;
  pr.head = head_kv * p.group + r % p.group;
  pr.valid = pr.token < seqlen_q;
  return pr;
}

// One CTA per (split, head_kv, batch), blockIdx.x = (batch * heads_kv + head_kv) * splits + split.
template <class T, int kHeadDim>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(const __grid_constant__ cuda::FwdParams p, const DecodeSplit split,
                  float* partial_o, float* partial_lse) {
  using Cfg = DecodeConfig<kHeadDim>;
  using TileQ = typename Cfg::TileQ;
  using TileKV = typename Cfg::TileKV;
  constexpr int kDTiles = Cfg::kDTiles;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* ring = sQ + TileQ::kElems;

  const int s_idx = blockIdx.x % split.splits;
  const int bh = blockIdx.x / split.splits;
  const int head_kv = bh % p.heads_kv;
  const int batch = bh / p.heads_kv;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  // The merge of the splits (launched to overlap this grid where DecodeSplit::overlap_launch)
  // may start launching: it waits for this grid's end before it reads anything.
  common::launch_dependents();
  const common::SeqlenInfo seq(p, batch);
  const common::WindowMask mask = common::mask_of(p, seq);
  // The keys [key_lo, key_hi] every row sees (the first token's: the plan admits no other kind).
  int key_lo, key_hi;
  mask.keys_of(0, key_lo, key_hi);
  key_lo = max(key_lo, 0);
  key_hi = min(key_hi, seq.seqlen_k - 1);
  const int first_block = key_lo / kBlockN;
  const int n_blocks = key_hi < key_lo ? first_block : key_hi / kBlockN + 1;
  const int b_begin = min(first_block + s_idx * split.blocks_per_split, n_blocks);
  const int b_end = min(b_begin + split.blocks_per_split, n_blocks);

  // Q: packed row r from its token's row and its head (rows past the tokens zero-filled).
  {
    constexpr int kChunks = kHeadDim / 8;
    for (int idx = tid; idx < kRows * kChunks; idx += kThreads) {
      const int r = idx / kChunks, c = (idx % kChunks) * 8;
      const PackedRow pr = packed_row(p, r, head_kv, seq.seqlen_q);
      const int left = p.head_dim - c;
      const int bytes = !pr.valid ? 0 : (left >= 8 ? 16 : (left > 0 ? left * 2 : 0));
      const T* src = static_cast<const T*>(p.q) + batch * p.q_batch_stride +
                     pr.head * p.q_head_stride + int64_t(seq.offset_q + pr.token) * p.q_row_stride + c;
      common::cp_async_16(common::smem_u32(sQ + TileQ::offset(r, c)),
                          bytes > 0 ? static_cast<const void*>(src) : p.q, bytes);
    }
  }
  // K and V rows: one stride apart, or through a paged cache's block table.
  const common::KvRows<T> k_rows(p, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride,
                                 batch, head_kv, seq.offset_k);
  const common::KvRows<T> v_rows(p, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride,
                                 batch, head_kv, seq.offset_k);
  // A paged cache's pages of block b, as this thread's copies need them: where the pages hold
  // whole blocks, the page of the block's first row; else the page of each of the thread's
  // rows (ThreadTileRows). Looked up a block ahead of the block's copies, so that the block
  // table's read (a dependent load per block) is not waited for in front of them.
  using Rows = common::ThreadTileRows<TileKV, kThreads>;
  const bool whole_blocks = k_rows.holds_tiles(kBlockN);
  struct BlockPages {
    int page[Rows::kCount], in_page[Rows::kCount];
  };
  auto look_up_pages = [&](int b, BlockPages& pg) {
    if (!k_rows.paged()) return;
    const int n0 = b * kBlockN;
    if (whole_blocks) {
      k_rows.template pages_of_rows<1, 0>(n0, seq.seqlen_k, pg.page, pg.in_page);
    } else {
      k_rows.template pages_of_rows<Rows::kCount, Rows::kStep>(n0 + Rows::row(tid, 0),
                                                               seq.seqlen_k, pg.page, pg.in_page);
    }
  };
  auto load_block = [&](int b, int stage, const BlockPages& pg) {
    const int n0 = b * kBlockN;
    T* sK = ring + stage * Cfg::kStageElems;
    T* sV = sK + TileKV::kElems;
    const int k_valid = seq.seqlen_k - n0, v_valid = key_hi + 1 - n0, v_from = key_lo - n0;
    if (whole_blocks) {  // one strided tile
      const T* k0 = k_rows.paged() ? k_rows.row_at(pg.page[0], pg.in_page[0]) : k_rows.row(n0);
      const T* v0 = v_rows.paged() ? v_rows.row_at(pg.page[0], pg.in_page[0]) : v_rows.row(n0);
      common::load_tile<TileKV, kThreads>(sK, k0, p.k_row_stride, k_valid, p.head_dim, tid);
      common::load_tile<TileKV, kThreads, true>(sV, v0, p.v_row_stride, v_valid, p.head_dim_v,
                                                tid, v_from);
    } else {
      const T* any_k = static_cast<const T*>(p.k);
      const T* any_v = static_cast<const T*>(p.v);
      common::load_tile_rows<TileKV, kThreads>(
          sK, [&](int i, int) { return k_rows.row_at(pg.page[i], pg.in_page[i]); }, k_valid,
          p.head_dim, tid, any_k);
      common::load_tile_rows<TileKV, kThreads, true>(
          sV, [&](int i, int) { return v_rows.row_at(pg.page[i], pg.in_page[i]); }, v_valid,
          p.head_dim_v, tid, any_v, v_from);
    }
  };
  // The ring's first kStages - 1 blocks, a cp.async group each (Q in the first); the pages of
  // the loop's first block looked up behind them.
  BlockPages pages;
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (b_begin + i < b_end) {
      look_up_pages(b_begin + i, pages);
      load_block(b_begin + i, i, pages);
    }
    common::cp_async_commit();
  }
  if (b_begin + kStages - 1 < b_end) look_up_pages(b_begin + kStages - 1, pages);

  // This thread's two rows (g and g + 8): their tokens, heads and score mods.
  PackedRow rows[2];
  common::ScoreMod mods[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    rows[hh] = packed_row(p, g + 8 * hh, head_kv, seq.seqlen_q);
    mods[hh] = common::score_mod_of(p, batch, rows[hh].valid ? rows[hh].head : 0, mask);
  }
  const bool modded = mods[0].active();
  const float softmax_scale = modded ? 1.0f : p.scale_log2;
  const bool neg_scale = softmax_scale < 0.0f;
  const float hidden = common::hidden_score(neg_scale);

  float acc_o[kDTiles * 4];
#pragma unroll
  for (int i = 0; i < kDTiles * 4; ++i) acc_o[i] = 0.0f;
  common::OnlineSoftmax<1> softmax;
  softmax.reset();
  const common::LdsmAddr<TileQ> q_addr(sQ, (lane / 8 % 2) * 8 + lane % 8, lane / 16);

  for (int b = b_begin; b < b_end; ++b) {
    const int stage = (b - b_begin) % kStages;
    // The block kStages - 1 ahead into the slot block b - 1 left (every warp is done with it).
    const int ahead = b + kStages - 1;
    if (ahead < b_end) load_block(ahead, (stage + kStages - 1) % kStages, pages);
    common::cp_async_commit();
    if (ahead + 1 < b_end) look_up_pages(ahead + 1, pages);
    common::cp_async_wait<kStages - 1>();
    __syncthreads();  // block b (and Q) landed for every thread's copies
    const T* sK = ring + stage * Cfg::kStageElems;
    const T* sV = sK + TileKV::kElems;
    const common::LdsmAddr<TileKV> k_addr(sK, (lane / 16) * 8 + lane % 8, lane / 8 % 2);
    const common::LdsmAddr<TileKV> v_addr(sV, (lane / 8 % 2) * 8 + lane % 8, lane / 16);
    const int key0 = b * kBlockN + warp * kWarpKeys;  // this warp's 16 keys

    // S = Q K^T over the warp's keys: two n8 tiles.
    float acc_s[2 * 4];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc_s[i] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[4], b0, b1, b2, b3;
      common::ldmatrix_x4(q_addr.at(0, kk), a[0], a[1], a[2], a[3]);
      common::ldmatrix_x4(k_addr.at(warp * kWarpKeys, kk), b0, b1, b2, b3);
      sm80::mma_16816<T>(acc_s, a, b0, b1);
      sm80::mma_16816<T>(acc_s + 4, a, b2, b3);
    }
    // Logits per row, and the keys outside the visible range hidden.
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + 8 * nt + 2 * t + e;
          float& x = acc_s[nt * 4 + 2 * hh + e];
          if (modded) x = mods[hh].logit2(x, rows[hh].token, key);
          if (key < key_lo || key > key_hi) x = hidden;
        }
    float corr[2];
    softmax.update<2>(acc_s, softmax_scale, neg_scale, corr);
    common::scale_rows<1, kDTiles>(acc_o, corr);
    // O += P V: the two n8 tiles of P are the A fragment of one k16 step.
    uint32_t a[4];
    a[0] = common::pack2<T>(acc_s[0], acc_s[1]);
    a[1] = common::pack2<T>(acc_s[2], acc_s[3]);
    a[2] = common::pack2<T>(acc_s[4], acc_s[5]);
    a[3] = common::pack2<T>(acc_s[6], acc_s[7]);
#pragma unroll
    for (int dp = 0; dp < kDTiles / 2; ++dp) {
      uint32_t b0, b1, b2, b3;
      common::ldmatrix_x4_trans(v_addr.at(warp * kWarpKeys, dp), b0, b1, b2, b3);
      sm80::mma_16816<T>(acc_o + 4 * (2 * dp), a, b0, b1);
      sm80::mma_16816<T>(acc_o + 4 * (2 * dp + 1), a, b2, b3);
    }
    __syncthreads();  // every warp is done with this stage before it is loaded again
  }
  common::cp_async_wait<0>();

  // The warps' states into the ring: O, then per row the maximum (log2 units) and the sum.
  float* state = reinterpret_cast<float*>(ring);
  {
    float* mine = state + warp * Cfg::kWarpStateFloats;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = g + 8 * hh;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const int c = dt * 8 + 2 * t;
        *reinterpret_cast<float2*>(mine + r * kHeadDim + c) =
            make_float2(acc_o[dt * 4 + 2 * hh], acc_o[dt * 4 + 2 * hh + 1]);
      }
      const float sum = common::quad_sum(softmax.row_sum[hh]);
      if (t == 0) {
        mine[kRows * kHeadDim + r] = softmax.row_max[hh];
        mine[kRows * kHeadDim + kRows + r] = sum;
      }
    }
  }
  __syncthreads();

  // Merged over the warps, a row per thread first: m = max of the maxima, l and each warp's O
  // rescaled to it; what multiplies each warp's O (the final 1 / l, with the sink's share where
  // the split is the whole) goes to coef. A row no key reached (l = 0) writes O = 0 and
  // LSE = -inf.
  __shared__ float coef[kRows][kWarps];
  const bool whole = split.splits == 1;
  if (tid < kRows) {
    const int r = tid;
    const PackedRow pr = packed_row(p, r, head_kv, seq.seqlen_q);
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, state[w * Cfg::kWarpStateFloats + kRows * kHeadDim + r]);
    const float m_use = m == -INFINITY ? 0.0f : m;
    float f[kWarps], l = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float* ws = state + w * Cfg::kWarpStateFloats;
      f[w] = common::exp2_approx(ws[kRows * kHeadDim + r] - m_use);
      l = fmaf(ws[kRows * kHeadDim + kRows + r], f[w], l);
    }
    const bool seen = l > 0.0f && m != -INFINITY;
    float inv, lse;
    if (whole) {
      // The attention sink joins the denominator as a key of value 0 (OnlineSoftmax::finalize).
      const float sink2 = common::sink_log2_of(p, pr.valid ? pr.head : 0);
      float mm = m, keys = 1.0f, total = l;
      if (sink2 != -INFINITY) {
        mm = fmaxf(m, sink2);
        keys = common::exp2_approx(m - mm);
        total = l * keys + common::exp2_approx(sink2 - mm);
      }
      inv = seen ? keys / total : 0.0f;
      lse = seen ? mm * common::OnlineSoftmax<1>::kLn2 + logf(total) : -INFINITY;
      if (pr.valid && p.lse != nullptr) {
        p.lse[batch * p.lse_batch_stride + pr.head * p.lse_head_stride +
              int64_t(seq.offset_q + pr.token) * p.lse_row_stride] = lse;
      }
    } else {
      inv = seen ? 1.0f / l : 0.0f;
      lse = seen ? m * common::OnlineSoftmax<1>::kLn2 + logf(l) : -INFINITY;
      if (pr.valid) partial_lse[partial_row(p, split, s_idx, batch, pr.head, pr.token)] = lse;
    }
#pragma unroll
    for (int w = 0; w < kWarps; ++w) coef[r][w] = f[w] * inv;
  }
  __syncthreads();

  // Then O, four columns a thread: the warps' O weighted by coef.
  constexpr int kQuads = kHeadDim / 4;
  for (int idx = tid; idx < kRows * kQuads; idx += kThreads) {
    const int r = idx / kQuads, c = (idx % kQuads) * 4;
    const PackedRow pr = packed_row(p, r, head_kv, seq.seqlen_q);
    if (!pr.valid || c >= p.head_dim_v) continue;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(state + w * Cfg::kWarpStateFloats +
                                                        r * kHeadDim + c);
      const float k = coef[r][w];
      o.x = fmaf(x.x, k, o.x);
      o.y = fmaf(x.y, k, o.y);
      o.z = fmaf(x.z, k, o.z);
      o.w = fmaf(x.w, k, o.w);
    }
    if (whole) {
      T* out = static_cast<T*>(p.o) + batch * p.o_batch_stride + pr.head * p.o_head_stride +
               int64_t(seq.offset_q + pr.token) * p.o_row_stride;
      const float vals[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (c + e < p.head_dim_v) out[c + e] = static_cast<T>(vals[e]);
      }
    } else {
      const int64_t row = partial_row(p, split, s_idx, batch, pr.head, pr.token);
      *reinterpret_cast<float4*>(partial_o + row * kHeadDim + c) = o;
    }
  }
}

// The splits' partials of one output row merged, a CTA per row: LSE = log(sum_s e^LSE_s, plus
// the sink's e^sink), O = sum_s e^(LSE_s - LSE) O_s. A row no split saw stays 0 / -inf. A
// thread holds one split's LSE (kMaxSplits <= kThreads) and one 16-byte chunk of O of every
// kSplitLanes-th split; its first kCombineUnroll chunks are loaded before the LSEs are reduced,
// so the row costs about one round trip to memory, then the threads of a chunk sum through
// shared memory.
constexpr int kCombineUnroll = 8;
static_assert(kMaxSplits <= kThreads, "a thread per split's LSE");
template <class T, int kHeadDim>
__global__ void __launch_bounds__(kThreads)
    decode_combine_kernel(const __grid_constant__ cuda::FwdParams p, const DecodeSplit split,
                          const float* partial_o, const float* partial_lse) {
  constexpr int kChunks = kHeadDim / 4;  // 16-byte chunks of a partial row
  // Threads on one chunk, each its own splits; the kThreads % kChunks threads left over (head
  // dims 96 and 192) take part in the LSEs only.
  constexpr int kSplitLanes = kThreads / kChunks;
  __shared__ float weights[kMaxSplits];
  __shared__ float warp_part[kWarps];
  __shared__ float4 sums[kSplitLanes][kChunks];
  common::wait_for_prior_grid();  // the partials are written (where its launch overlapped)
  const int tid = threadIdx.x;
  const int lane = tid % 32, warp = tid / 32;
  const int64_t row_id = blockIdx.x;
  const int token = static_cast<int>(row_id % p.seqlen_q);
  const int head = static_cast<int>(row_id / p.seqlen_q % p.heads_q);
  const int batch = static_cast<int>(row_id / p.seqlen_q / p.heads_q);
  const common::SeqlenInfo seq(p, batch);
  if (token >= seq.seqlen_q) return;  // the whole CTA
  const int64_t row0 = partial_row(p, split, 0, batch, head, token);
  const int64_t split_stride = partial_row(p, split, 1, batch, head, token) - row0;
  const int chunk = tid % kChunks;
  // Past the last split for the threads left over, so that they load and add nothing.
  const int first_split = tid < kSplitLanes * kChunks ? tid / kChunks : kMaxSplits;
  const float4* src = reinterpret_cast<const float4*>(partial_o + row0 * kHeadDim) + chunk;
  const int64_t step = split_stride * kChunks;  // float4s from one split's row to the next's
  constexpr int kStride = kSplitLanes;          // a thread's splits, kStride apart
  float4 v[kCombineUnroll];
#pragma unroll
  for (int u = 0; u < kCombineUnroll; ++u) {
    const int s = first_split + u * kStride;
    v[u] = s < split.splits ? src[s * step] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const float my_lse = tid < split.splits ? partial_lse[row0 + tid * split_stride] : -INFINITY;

  // A CTA-wide reduction through warp_part (op: max or sum).
  auto reduce = [&](float x, bool take_max) {
#pragma unroll
    for (int w = 16; w > 0; w /= 2) {
      const float y = __shfl_xor_sync(0xffffffffu, x, w);
      x = take_max ? fmaxf(x, y) : x + y;
    }
    if (lane == 0) warp_part[warp] = x;
    __syncthreads();
    x = warp_part[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) x = take_max ? fmaxf(x, warp_part[w]) : x + warp_part[w];
    __syncthreads();  // warp_part is free for the next reduction
    return x;
  };
  const float m = reduce(my_lse, true);
  T* out = static_cast<T*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
           int64_t(seq.offset_q + token) * p.o_row_stride;
  float* lse_out = p.lse == nullptr ? nullptr
                                    : p.lse + batch * p.lse_batch_stride +
                                          head * p.lse_head_stride +
                                          int64_t(seq.offset_q + token) * p.lse_row_stride;
  if (m == -INFINITY) {
    for (int c = tid; c < p.head_dim_v; c += kThreads) out[c] = static_cast<T>(0.0f);
    if (tid == 0 && lse_out != nullptr) *lse_out = -INFINITY;
    return;
  }
  const float sink = p.sinks == nullptr ? -INFINITY : p.sinks[head * p.sinks_stride];
  const float mm = fmaxf(m, sink);
  float total = reduce(tid < split.splits ? expf(my_lse - mm) : 0.0f, false);
  if (sink != -INFINITY) total += expf(sink - mm);
  const float lse = mm + logf(total);
  if (tid < split.splits) weights[tid] = my_lse == -INFINITY ? 0.0f : expf(my_lse - lse);
  __syncthreads();

  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  auto add = [&](const float4& x, float w) {
    o.x = fmaf(w, x.x, o.x);
    o.y = fmaf(w, x.y, o.y);
    o.z = fmaf(w, x.z, o.z);
    o.w = fmaf(w, x.w, o.w);
  };
#pragma unroll
  for (int u = 0; u < kCombineUnroll; ++u) {
    const int s = first_split + u * kStride;
    if (s < split.splits) add(v[u], weights[s]);
  }
  for (int s0 = first_split + kCombineUnroll * kStride; s0 < split.splits;
       s0 += kCombineUnroll * kStride) {
#pragma unroll
    for (int u = 0; u < kCombineUnroll; ++u) {
      const int s = s0 + u * kStride;
      v[u] = s < split.splits ? src[s * step] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kCombineUnroll; ++u) {
      const int s = s0 + u * kStride;
      if (s < split.splits) add(v[u], weights[s]);
    }
  }
  if (first_split < kSplitLanes) sums[first_split][chunk] = o;
  __syncthreads();
  if (first_split == 0) {
#pragma unroll
    for (int i = 1; i < kSplitLanes; ++i) {
      const float4 x = sums[i][chunk];
      o.x += x.x;
      o.y += x.y;
      o.z += x.z;
      o.w += x.w;
    }
    const float vals[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = chunk * 4 + e;
      if (c < p.head_dim_v) out[c] = static_cast<T>(vals[e]);
    }
  }
  if (tid == 0 && lse_out != nullptr) *lse_out = lse;
}

template <class T, int kHeadDim>
cudaError_t launch_decode(const cuda::FwdParams& p, const DecodeSplit& split, void* workspace,
                          cudaStream_t stream) {
  using Cfg = DecodeConfig<kHeadDim>;
  auto kernel = decode_kernel<T, kHeadDim>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int64_t ctas = int64_t(p.batch) * p.heads_kv * split.splits;
  if (ctas > INT32_MAX) return cudaErrorNotSupported;
  if (ctas == 0) return cudaSuccess;
  float* partial_o = static_cast<float*>(workspace);
  float* partial_lse = partial_o + partial_rows(p, split) * kHeadDim;
  kernel<<<static_cast<unsigned>(ctas), kThreads, Cfg::kSmemBytes, stream>>>(p, split, partial_o,
                                                                             partial_lse);
  err = cudaGetLastError();
  if (err != cudaSuccess || split.splits == 1) return err;
  const int64_t blocks = int64_t(p.batch) * p.heads_q * p.seqlen_q;  // a CTA per output row
  if (blocks > INT32_MAX) return cudaErrorNotSupported;
  // The merge launched behind the decode grid without the launch gap between them where the
  // device has programmatic dependent launch (sm_90 on): one-token decode grids run for tens of
  // microseconds, of which a launch gap is several.
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute overlap[1];
  overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap[0].val.programmaticStreamSerializationAllowed = 1;
  if (split.overlap_launch) {
    config.attrs = overlap;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, decode_combine_kernel<T, kHeadDim>, p, split,
                            static_cast<const float*>(partial_o),
                            static_cast<const float*>(partial_lse));
}

}  // namespace decode
}  // namespace flashattn
