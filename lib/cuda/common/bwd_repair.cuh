// The backward's repair of gradients that a value the mask hides spoiled: the MMAs multiply
// hidden entries of P and dS (exactly 0) by whatever the mask hides (0 * inf is NaN), so an Inf
// or NaN in a row a key cannot see (its q or dout) or in a key a row cannot see (its k or v)
// would reach dk, dv or dq. The header promises it never does. The kernels that write the
// gradients flag what they write non-finite, one bit per key (the main kernels, as they store
// dK and dV) and per query row (the postprocess, as it converts dQ), in the workspace; a last
// launch computes each flagged gradient again, exactly: fp32, P from the workspace's LSE, D from
// its rowsum, only the pairs the mask leaves visible. A gradient whose NaN or Inf comes from
// what it sees gets it again. The recomputation has a kernel of its own, so the main kernels and
// the postprocess keep their registers; while every gradient is finite it costs a memset and a
// launch that reads the flags.
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
// queries of every head of the group, into its rows of dk and dv.
template <class T, int kMaxHeadDim>
__device__ void recompute_key(const cuda::BwdParams& p, int batch, int head_kv, int key) {
  constexpr int kPerLane = (kMaxHeadDim + 31) / 32;
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
    vv[i] = c < p.head_dim_v ? static_cast<float>(vj[c]) : 0.0f;
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
        dov[i] = c < p.head_dim_v ? static_cast<float>(doi[c]) : 0.0f;
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
      const float prob = exp2_from_lse(x, p.lse_log2[stats + r]);
      const float ds = prob * (dp - p.dsum[stats + r]) * dcap;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        dv[i] = fmaf(prob, dov[i], dv[i]);
        dk[i] = fmaf(ds, qv[i], dk[i]);
      }
    }
  }
  const int64_t row = seq.offset_k + key;
  T* dk_row = static_cast<T*>(p.dk) + batch * p.dk_batch_stride + head_kv * p.dk_head_stride +
              row * p.dk_row_stride;
  T* dv_row = static_cast<T*>(p.dv) + batch * p.dv_batch_stride + head_kv * p.dv_head_stride +
              row * p.dv_row_stride;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    if (c < p.head_dim) dk_row[c] = static_cast<T>(dk[i] * p.scale);
    if (c < p.head_dim_v) dv_row[c] = static_cast<T>(dv[i]);
  }
}



// Warp-wide: dq of query `row` of (batch, head) computed again over its visible keys, into its
// row of dq.
template <class T, int kMaxHeadDim>
__device__ void recompute_query(const cuda::BwdParams& p, int batch, int head, int row) {
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
    dov[i] = c < p.head_dim_v ? static_cast<float>(doi[c]) : 0.0f;
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
      dp = fmaf(dov[i], c < p.head_dim_v ? static_cast<float>(vj[c]) : 0.0f, dp);
    }
#pragma unroll
    for (int w = 16; w > 0; w /= 2) {
      s += __shfl_xor_sync(0xffffffffu, s, w);
      dp += __shfl_xor_sync(0xffffffffu, dp, w);
    }
    float dcap = 1.0f;
    const float x = mod.active() ? mod.logit2(s, row, j, dcap) : s * p.scale_log2;
    const float ds = exp2_from_lse(x, lse2) * (dp - dsum) * dcap;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) dq[i] = fmaf(ds, kv[i], dq[i]);
  }
  T* dq_row = static_cast<T*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride +
              packed * p.dq_row_stride;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    if (c < p.head_dim) dq_row[c] = static_cast<T>(dq[i] * p.scale);
  }
}

// ---- the flags ----

constexpr int kFlagBits = 32;
// Words of flags: one bit per query row of each (batch, head), then one per key of each
// (batch, head_kv); rows and keys rounded as the workspace rounds them (multiples of 32).
__host__ __device__ inline int64_t repair_row_words(const cuda::BwdParams& p) {
  return int64_t(p.batch) * p.heads_q * (p.seqlen_q_rounded / kFlagBits);
}
__host__ __device__ inline int64_t repair_key_words(const cuda::BwdParams& p) {
  return int64_t(p.batch) * p.heads_kv * (p.seqlen_k_rounded / kFlagBits);
}

// Flags query row `row` of (batch, head), or key `key` of (batch, head_kv): rare, only for a
// gradient that is not finite.
__device__ __forceinline__ void flag_spoiled_row(const cuda::BwdParams& p, int batch, int head,
                                                 int row) {
  const int64_t bit = (int64_t(batch) * p.heads_q + head) * p.seqlen_q_rounded + row;
  atomicOr(p.repair_flags + bit / kFlagBits, 1u << (bit % kFlagBits));
}
__device__ __forceinline__ void flag_spoiled_key(const cuda::BwdParams& p, int batch,
                                                 int head_kv, int key) {
  const int64_t bit = (int64_t(batch) * p.heads_kv + head_kv) * p.seqlen_k_rounded + key;
  atomicOr(p.repair_flags + repair_row_words(p) + bit / kFlagBits, 1u << (bit % kFlagBits));
}

// ---- the repair launch ----

constexpr int kRepairThreads = 256;
__host__ __device__ inline int64_t repair_blocks(const cuda::BwdParams& p) {
  return (repair_row_words(p) + repair_key_words(p) + kRepairThreads - 1) / kRepairThreads;
}

// One thread a word of flags; each warp then computes the gradients its lanes' words flag, one
// at a time, all 32 lanes together.
template <class T>
__global__ void __launch_bounds__(kRepairThreads)
    bwd_repair_kernel(const __grid_constant__ cuda::BwdParams p) {
  constexpr int kMaxHeadDim = 256;  // the header's bound on head_dim
  const int64_t row_words = repair_row_words(p);
  const int64_t words = row_words + repair_key_words(p);
  const int64_t w = int64_t(blockIdx.x) * kRepairThreads + threadIdx.x;
  const uint32_t mine = w < words ? p.repair_flags[w] : 0u;
  const int lane = threadIdx.x % 32;
  for (uint32_t lanes = __ballot_sync(0xffffffffu, mine != 0); lanes != 0; lanes &= lanes - 1) {
    const int src = __ffs(lanes) - 1;
    const int64_t word = w - lane + src;
    for (uint32_t bits = __shfl_sync(0xffffffffu, mine, src); bits != 0; bits &= bits - 1) {
      const int64_t bit = word * kFlagBits + (__ffs(bits) - 1);
      if (word < row_words) {
        const int64_t bh = bit / p.seqlen_q_rounded;
        recompute_query<T, kMaxHeadDim>(p, static_cast<int>(bh / p.heads_q),
                                        static_cast<int>(bh % p.heads_q),
                                        static_cast<int>(bit % p.seqlen_q_rounded));
      } else {
        const int64_t kbit = bit - row_words * kFlagBits;
        const int64_t bh = kbit / p.seqlen_k_rounded;
        recompute_key<T, kMaxHeadDim>(p, static_cast<int>(bh / p.heads_kv),
                                      static_cast<int>(bh % p.heads_kv),
                                      static_cast<int>(kbit % p.seqlen_k_rounded));
      }
    }
  }
}

}  // namespace common
}  // namespace flashattn
