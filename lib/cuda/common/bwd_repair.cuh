// The backward's repair of gradients that a value the mask hides spoiled: the MMAs multiply
// hidden entries of P and dS (exactly 0) by whatever the mask hides (0 * inf is NaN), so an Inf
// or NaN in a row a key cannot see (its q or dout) or in a key a row cannot see (its k or v)
// would reach dk, dv or dq. The header promises it never does. Each kernel checks the gradients
// it writes (dK and dV staged in shared memory by the main kernels, dQ's accumulator in the
// postprocess) and computes a spoiled key's dk and dv, or a spoiled row's dq, again, exactly:
// fp32, P from the workspace's LSE, D from its rowsum, only the pairs the mask leaves visible.
// A gradient whose NaN or Inf comes from what it sees gets it again. The recomputations are out
// of line; they cost nothing while every gradient is finite.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/mask.cuh"
#include "cuda/common/score_mod.cuh"
#include "cuda/common/seqlen.cuh"
#include "cuda/flash/params.hpp"

namespace flashattn {
namespace common {

// Whether any of the eight 16-bit values in a 16-byte chunk is an infinity or a NaN (the
// exponent bits all set).
template <class T>
__device__ __forceinline__ bool chunk_nonfinite(uint4 v) {
  constexpr uint32_t kExp = std::is_same<T, __half>::value ? 0x7c00u : 0x7f80u;
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  bool bad = false;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    bad |= (w[i] & kExp) == kExp || ((w[i] >> 16) & kExp) == kExp;
  }
  return bad;
}

// The workspace's statistics of (batch, head): LSE * log2(e) and D per query row.
__device__ __forceinline__ int64_t stats_base(const cuda::BwdParams& p, int batch, int head) {
  return (int64_t(batch) * p.heads_q + head) * p.seqlen_q_rounded;
}

// Warp-wide: dk and dv of key `key` of (batch, head_kv), computed again over the visible
// queries of every head of the group, into row `stage_row` of the staged dK and dV tiles.
template <class T, class Tile, int kHeadDim>
__device__ __noinline__ void recompute_key(const cuda::BwdParams& p, int batch, int head_kv,
                                           int key, T* sdK, T* sdV, int stage_row) {
  constexpr int kPerLane = (kHeadDim + 31) / 32;
  const int lane = threadIdx.x % 32;
  const SeqlenInfo seq(p, batch);
  const WindowMask mask = mask_of(p, seq);
  const T* kj = static_cast<const T*>(p.k) + batch * p.k_batch_stride +
                head_kv * p.k_head_stride + int64_t(seq.offset_k + key) * p.k_row_stride;
  const T* vj = static_cast<const T*>(p.v) + batch * p.v_batch_stride +
                head_kv * p.v_head_stride + int64_t(seq.offset_k + key) * p.v_row_stride;
  float kv[kPerLane], vv[kPerLane], dk[kPerLane], dv[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    kv[i] = c < p.head_dim ? static_cast<float>(kj[c]) : 0.0f;
    vv[i] = c < p.head_dim ? static_cast<float>(vj[c]) : 0.0f;
    dk[i] = dv[i] = 0.0f;
  }
  int lo, hi;
  mask.queries_of(key, lo, hi);
  lo = max(lo, 0);
  hi = min(hi, seq.seqlen_q - 1);
  for (int h = 0; h < p.group; ++h) {
    const int head = head_kv * p.group + h;
    const ScoreMod mod = score_mod_of(p, batch, head, mask);
    const int64_t stats = stats_base(p, batch, head);
    for (int r = lo; r <= hi; ++r) {
      const int64_t row = seq.offset_q + r;
      const T* qi = static_cast<const T*>(p.q) + batch * p.q_batch_stride +
                    head * p.q_head_stride + row * p.q_row_stride;
      const T* doi = static_cast<const T*>(p.dout) + batch * p.do_batch_stride +
                     head * p.do_head_stride + row * p.do_row_stride;
      float qv[kPerLane], dov[kPerLane], s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int c = lane + 32 * i;
        qv[i] = c < p.head_dim ? static_cast<float>(qi[c]) : 0.0f;
        dov[i] = c < p.head_dim ? static_cast<float>(doi[c]) : 0.0f;
        s = fmaf(qv[i], kv[i], s);
        dp = fmaf(dov[i], vv[i], dp);
      }
#pragma unroll
      for (int w = 16; w > 0; w /= 2) {
        s += __shfl_xor_sync(0xffffffffu, s, w);
        dp += __shfl_xor_sync(0xffffffffu, dp, w);
      }
      float dcap = 1.0f;
      const float x = mod.active() ? mod.logit2(s, r, key, dcap) : s * p.scale_log2;
      const float prob = exp2f(x - p.lse_log2[stats + r]);
      const float ds = prob * (dp - p.dsum[stats + r]) * dcap;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        dv[i] = fmaf(prob, dov[i], dv[i]);
        dk[i] = fmaf(ds, qv[i], dk[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    if (c < Tile::kCols) {
      sdK[Tile::offset(stage_row, c)] = static_cast<T>(dk[i] * p.scale);
      sdV[Tile::offset(stage_row, c)] = static_cast<T>(dv[i]);
    }
  }
}

// CTA-wide, after the main kernel staged dK and dV (rows [0, rows_k) of `key0`'s block): every
// key whose staged dk or dv holds a non-finite value computed again in place. Ends with a
// barrier.
template <class T, class Tile, int kHeadDim, int kThreads>
__device__ __forceinline__ void repair_spoiled_keys(const cuda::BwdParams& p, int batch,
                                                    int head_kv, int key0, int rows_k, T* sdK,
                                                    T* sdV, int tid) {
  constexpr int kChunks = Tile::kCols / 8;
  constexpr int kWords = (Tile::kRows + 31) / 32;
  __shared__ uint32_t spoiled[kWords];
  if (tid < kWords) spoiled[tid] = 0;
  __syncthreads();
  for (int idx = tid; idx < rows_k * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    const uint4 a = *reinterpret_cast<const uint4*>(sdK + Tile::offset(r, c));
    const uint4 b = *reinterpret_cast<const uint4*>(sdV + Tile::offset(r, c));
    if (chunk_nonfinite<T>(a) || chunk_nonfinite<T>(b)) atomicOr(&spoiled[r / 32], 1u << (r % 32));
  }
  __syncthreads();
  const int warp = tid / 32;
  for (int r = warp; r < rows_k; r += kThreads / 32) {
    if (spoiled[r / 32] & (1u << (r % 32))) {
      recompute_key<T, Tile, kHeadDim>(p, batch, head_kv, key0 + r, sdK, sdV, r);
    }
  }
  __syncthreads();
}

// Warp-wide: dq of query `row` of (batch, head) computed again over its visible keys, into
// `dq_row` (the output, in the input dtype).
template <class T, int kMaxHeadDim>
__device__ __noinline__ void recompute_query(const cuda::BwdParams& p, int batch, int head,
                                             int row, T* dq_row) {
  constexpr int kPerLane = (kMaxHeadDim + 31) / 32;
  const int lane = threadIdx.x % 32;
  const SeqlenInfo seq(p, batch);
  const WindowMask mask = mask_of(p, seq);
  const ScoreMod mod = score_mod_of(p, batch, head, mask);
  const int head_kv = head / p.group;
  const int64_t packed = seq.offset_q + row;
  const T* qi = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
                packed * p.q_row_stride;
  const T* doi = static_cast<const T*>(p.dout) + batch * p.do_batch_stride +
                 head * p.do_head_stride + packed * p.do_row_stride;
  const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride +
               head_kv * p.k_head_stride + int64_t(seq.offset_k) * p.k_row_stride;
  const T* v = static_cast<const T*>(p.v) + batch * p.v_batch_stride +
               head_kv * p.v_head_stride + int64_t(seq.offset_k) * p.v_row_stride;
  const int64_t stats = stats_base(p, batch, head) + row;
  const float lse2 = p.lse_log2[stats], dsum = p.dsum[stats];
  float qv[kPerLane], dov[kPerLane], dq[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    qv[i] = c < p.head_dim ? static_cast<float>(qi[c]) : 0.0f;
    dov[i] = c < p.head_dim ? static_cast<float>(doi[c]) : 0.0f;
    dq[i] = 0.0f;
  }
  int lo, hi;
  mask.keys_of(row, lo, hi);
  lo = max(lo, 0);
  hi = min(hi, seq.seqlen_k - 1);
  for (int j = lo; j <= hi; ++j) {
    const T* kj = k + int64_t(j) * p.k_row_stride;
    const T* vj = v + int64_t(j) * p.v_row_stride;
    float kv[kPerLane], s = 0.0f, dp = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      kv[i] = c < p.head_dim ? static_cast<float>(kj[c]) : 0.0f;
      s = fmaf(qv[i], kv[i], s);
      dp = fmaf(dov[i], c < p.head_dim ? static_cast<float>(vj[c]) : 0.0f, dp);
    }
#pragma unroll
    for (int w = 16; w > 0; w /= 2) {
      s += __shfl_xor_sync(0xffffffffu, s, w);
      dp += __shfl_xor_sync(0xffffffffu, dp, w);
    }
    float dcap = 1.0f;
    const float x = mod.active() ? mod.logit2(s, row, j, dcap) : s * p.scale_log2;
    const float ds = exp2f(x - lse2) * (dp - dsum) * dcap;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) dq[i] = fmaf(ds, kv[i], dq[i]);
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    if (c < p.head_dim) dq_row[c] = static_cast<T>(dq[i] * p.scale);
  }
}

}  // namespace common
}  // namespace flashattn
