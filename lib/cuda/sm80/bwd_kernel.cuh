// The sm80 FlashAttention backward (FA2 organization), three launches:
//  1. preprocess: D = rowsum(dO * O), LSE * log2(e), zeroed dQ accumulator and semaphores;
//  2. main: one CTA per (key block, kv head, batch) holding K and V in shared memory and dK, dV
//     in registers, looping over the query heads of its group and their query blocks; each
//     step recomputes S and P = exp(scale*S - LSE) on chip, accumulates dV += P^T dO and
//     dK += dS^T Q, and adds dQ += dS K into an fp32 accumulator with atomics (in key-block
//     order, behind a semaphore, when deterministic);
//  3. postprocess: dQ = scale * accumulator, converted to the input dtype.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/flash/params.hpp"
#include "cuda/sm80/bwd_config.cuh"
#include "cuda/sm80/bwd_prepost.cuh"
#include "cuda/sm80/ptx.cuh"
#include "cuda/sm80/tile.cuh"

namespace flashattn {
namespace sm80 {

// ---- 2. main ---------------------------------------------------------------------------------

template <class T, int kHeadDim>
__global__ void __launch_bounds__(BwdConfig<kHeadDim>::kNThreads, 1)
    bwd_kernel(const cuda::BwdParams p) {
  using Cfg = BwdConfig<kHeadDim>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  using TileQ = SwizzledTile<kBlockM, kHeadDim>;   // Q and dO
  using TileKV = SwizzledTile<kBlockN, kHeadDim>;  // K and V (and dK, dV at the end)
  using TileP = SwizzledTile<kBlockM, kBlockN>;    // P and dS
  // S and dP: warps 4 (m) x 2 (n); dK and dV: kKvWarpsN (n) x kKvWarpsD (d); dQ: 4 (m) x 2 (d).
  constexpr int kSNTiles = kBlockN / 2 / 8;
  constexpr int kKvDTiles = kHeadDim / Cfg::kKvWarpsD / 8;
  constexpr int kQDTiles = kHeadDim / 2 / 8;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + TileKV::kElems;
  T* sQ = sV + TileKV::kElems;  // two stages
  T* sdO = sQ + 2 * TileQ::kElems;  // two stages
  T* sP = sdO + 2 * TileQ::kElems;
  T* sdS = sP + TileP::kElems;

  const int n_block = blockIdx.x;
  const int head_kv = blockIdx.y;
  const int batch = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int n0 = n_block * kBlockN;
  const int seqlen_q = p.seqlen_q;
  const int seqlen_k = p.seqlen_k;
  const int diag = seqlen_k - seqlen_q;
  const int rows_k = min(kBlockN, seqlen_k - n0);

  // Query blocks this key block meets: with causal masking, rows i >= n0 - diag.
  int m_begin = 0;
  if (p.causal) m_begin = max(0, n0 - diag) / kBlockM;
  const int m_end = (seqlen_q + kBlockM - 1) / kBlockM;

  const T* kg = static_cast<const T*>(p.k) + batch * p.k_batch_stride +
                head_kv * p.k_head_stride + int64_t(n0) * p.k_row_stride;
  const T* vg = static_cast<const T*>(p.v) + batch * p.v_batch_stride +
                head_kv * p.v_head_stride + int64_t(n0) * p.v_row_stride;
  // K and V join the first (Q, dO) pair in the first cp.async group.
  load_tile<TileKV, Cfg::kNThreads>(sK, kg, p.k_row_stride, rows_k, p.head_dim, tid);
  load_tile<TileKV, Cfg::kNThreads>(sV, vg, p.v_row_stride, rows_k, p.head_dim, tid);

  // Warp roles.
  const int s_wm = warp % 4, s_wn = warp / 4;
  const int kv_wn = warp % Cfg::kKvWarpsN, kv_wd = warp / Cfg::kKvWarpsN;
  const int q_wm = warp % 4, q_wd = warp / 4;

  float acc_dk[kKvDTiles][4];
  float acc_dv[kKvDTiles][4];
#pragma unroll
  for (int i = 0; i < kKvDTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[i][e] = acc_dv[i][e] = 0.0f;

  // ldmatrix addresses (see LdsmAddr): A operands non-transposed take rows (i % 2) * 8,
  // columns (i / 2) * 8 of matrix i = lane / 8; B operands non-transposed rows (i / 2) * 8,
  // columns (i % 2) * 8; transposed B like non-transposed A; transposed A like non-transposed B.
  const int a_row = (lane / 8 % 2) * 8 + lane % 8, a_half = lane / 16;
  const int b_row = (lane / 16) * 8 + lane % 8, b_half = lane / 8 % 2;

  const int n_q_blocks = m_end - m_begin;
  const int steps = n_q_blocks * p.group;
  if (steps > 0) {
    {
      const int head = head_kv * p.group;
      const int m0 = m_begin * kBlockM;
      const T* qg = static_cast<const T*>(p.q) + batch * p.q_batch_stride +
                    head * p.q_head_stride + int64_t(m0) * p.q_row_stride;
      const T* dog = static_cast<const T*>(p.dout) + batch * p.do_batch_stride +
                     head * p.do_head_stride + int64_t(m0) * p.do_row_stride;
      load_tile<TileQ, Cfg::kNThreads>(sQ, qg, p.q_row_stride, seqlen_q - m0, p.head_dim, tid);
      load_tile<TileQ, Cfg::kNThreads>(sdO, dog, p.do_row_stride, seqlen_q - m0, p.head_dim,
                                       tid);
    }
  }
  cp_async_commit();

  for (int step = 0; step < steps; ++step) {
    const int head = head_kv * p.group + step / n_q_blocks;
    const int m_block = m_begin + step % n_q_blocks;
    const int m0 = m_block * kBlockM;
    const int stage = step % 2;
    T* sQs = sQ + stage * TileQ::kElems;
    T* sdOs = sdO + stage * TileQ::kElems;

    cp_async_wait<0>();
    __syncthreads();  // this step's tiles landed; last step's readers are done
    if (step + 1 < steps) {
      const int nhead = head_kv * p.group + (step + 1) / n_q_blocks;
      const int nm0 = (m_begin + (step + 1) % n_q_blocks) * kBlockM;
      const T* qg = static_cast<const T*>(p.q) + batch * p.q_batch_stride +
                    nhead * p.q_head_stride + int64_t(nm0) * p.q_row_stride;
      const T* dog = static_cast<const T*>(p.dout) + batch * p.do_batch_stride +
                     nhead * p.do_head_stride + int64_t(nm0) * p.do_row_stride;
      load_tile<TileQ, Cfg::kNThreads>(sQ + (1 - stage) * TileQ::kElems, qg, p.q_row_stride,
                                       seqlen_q - nm0, p.head_dim, tid);
      load_tile<TileQ, Cfg::kNThreads>(sdO + (1 - stage) * TileQ::kElems, dog,
                                       p.do_row_stride, seqlen_q - nm0, p.head_dim, tid);
      cp_async_commit();
    }

    // Row statistics for this warp's S rows (g and g + 8 of its m16 tile).
    const int64_t stat_base = (int64_t(batch) * p.heads_q + head) * p.seqlen_q_rounded + m0;
    float lse2[2], dsum[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = s_wm * 16 + g + hh * 8;
      lse2[hh] = p.lse_log2[stat_base + r];
      dsum[hh] = p.dsum[stat_base + r];
    }

    // S = Q K^T and dP = dO V^T: this warp's 16 rows x kBlockN / 2 columns.
    float acc_s[kSNTiles][4];
    float acc_dp[kSNTiles][4];
#pragma unroll
    for (int i = 0; i < kSNTiles; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[i][e] = acc_dp[i][e] = 0.0f;
    {
      const LdsmAddr<TileQ> q_addr(sQs, s_wm * 16 + a_row, a_half);
      const LdsmAddr<TileQ> do_addr(sdOs, s_wm * 16 + a_row, a_half);
      const LdsmAddr<TileKV> k_addr(sK, s_wn * (kBlockN / 2) + b_row, b_half);
      const LdsmAddr<TileKV> v_addr(sV, s_wn * (kBlockN / 2) + b_row, b_half);
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t a[4], da[4];
        ldmatrix_x4(q_addr.at(0, kk), a[0], a[1], a[2], a[3]);
        ldmatrix_x4(do_addr.at(0, kk), da[0], da[1], da[2], da[3]);
#pragma unroll
        for (int np = 0; np < kSNTiles / 2; ++np) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(k_addr.at(np * 16, kk), b0, b1, b2, b3);
          mma_16816<T>(acc_s[2 * np], a, b0, b1);
          mma_16816<T>(acc_s[2 * np + 1], a, b2, b3);
          ldmatrix_x4(v_addr.at(np * 16, kk), b0, b1, b2, b3);
          mma_16816<T>(acc_dp[2 * np], da, b0, b1);
          mma_16816<T>(acc_dp[2 * np + 1], da, b2, b3);
        }
      }
    }

    // P = exp2(S * scale_log2 - LSE_log2) with the masks; dS = P * (dP - D). Both to smem.
    const bool need_mask = (n0 + kBlockN > seqlen_k) ||
                           (p.causal && n0 + kBlockN - 1 > m0 + diag);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = s_wm * 16 + g + hh * 8;
      const int row = m0 + r;
      const int limit = p.causal ? min(seqlen_k - 1, row + diag) : seqlen_k - 1;
#pragma unroll
      for (int nt = 0; nt < kSNTiles; ++nt) {
        float pv[2], ds[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = s_wn * (kBlockN / 2) + nt * 8 + 2 * t + e;
          float prob = exp2_approx(fmaf(acc_s[nt][hh * 2 + e], p.scale_log2, -lse2[hh]));
          if (need_mask && n0 + c > limit) prob = 0.0f;
          pv[e] = prob;
          ds[e] = prob * (acc_dp[nt][hh * 2 + e] - dsum[hh]);
        }
        const int c = s_wn * (kBlockN / 2) + nt * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(sP + TileP::offset(r, c)) = pack2<T>(pv[0], pv[1]);
        *reinterpret_cast<uint32_t*>(sdS + TileP::offset(r, c)) = pack2<T>(ds[0], ds[1]);
      }
    }
    __syncthreads();  // P and dS complete

    // dV += P^T dO and dK += dS^T Q: this warp's 16 key rows x its head-dim slice.
    {
      const LdsmAddr<TileP> pt_addr(sP, b_row, b_half, kv_wn);
      const LdsmAddr<TileP> dst_addr(sdS, b_row, b_half, kv_wn);
      const int d16 = kv_wd * (kHeadDim / Cfg::kKvWarpsD) / 16;
      const LdsmAddr<TileQ> do_addr(sdOs, a_row, a_half, d16);
      const LdsmAddr<TileQ> q_addr(sQs, a_row, a_half, d16);
#pragma unroll
      for (int km = 0; km < kBlockM / 16; ++km) {
        uint32_t a[4], da[4];
        ldmatrix_x4_trans(pt_addr.at(km * 16, 0), a[0], a[1], a[2], a[3]);
        ldmatrix_x4_trans(dst_addr.at(km * 16, 0), da[0], da[1], da[2], da[3]);
#pragma unroll
        for (int dp = 0; dp < kKvDTiles / 2; ++dp) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4_trans(do_addr.at(km * 16, dp), b0, b1, b2, b3);
          mma_16816<T>(acc_dv[2 * dp], a, b0, b1);
          mma_16816<T>(acc_dv[2 * dp + 1], a, b2, b3);
          ldmatrix_x4_trans(q_addr.at(km * 16, dp), b0, b1, b2, b3);
          mma_16816<T>(acc_dk[2 * dp], da, b0, b1);
          mma_16816<T>(acc_dk[2 * dp + 1], da, b2, b3);
        }
      }
    }

    // dQ (partial) = dS K: this warp's 16 query rows x half the head dim, added into the
    // fp32 accumulator.
    {
      float acc_dq[kQDTiles][4];
#pragma unroll
      for (int i = 0; i < kQDTiles; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dq[i][e] = 0.0f;
      const LdsmAddr<TileP> ds_addr(sdS, q_wm * 16 + a_row, a_half);
      const LdsmAddr<TileKV> k_addr(sK, a_row, a_half, q_wd * (kHeadDim / 2) / 16);
#pragma unroll
      for (int kn = 0; kn < kBlockN / 16; ++kn) {
        uint32_t a[4];
        ldmatrix_x4(ds_addr.at(0, kn), a[0], a[1], a[2], a[3]);
#pragma unroll
        for (int dp = 0; dp < kQDTiles / 2; ++dp) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4_trans(k_addr.at(kn * 16, dp), b0, b1, b2, b3);
          mma_16816<T>(acc_dq[2 * dp], a, b0, b1);
          mma_16816<T>(acc_dq[2 * dp + 1], a, b2, b3);
        }
      }
      int* sem = nullptr;
      if (p.deterministic) {
        // Add in key-block order: wait until every lower key block of this query block is in.
        sem = p.dq_semaphore + (int64_t(batch) * p.heads_q + head) * (p.seqlen_q_rounded / kBlockM) +
              m_block;
        if (tid == 0) {
          while (atomicAdd(sem, 0) != n_block) {
          }
          __threadfence();
        }
        __syncthreads();
      }
      float* dq = p.dq_accum + (stat_base + q_wm * 16) * p.head_dim_padded +
                  q_wd * (kHeadDim / 2);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = g + hh * 8;
        if (m0 + q_wm * 16 + r < seqlen_q) {
#pragma unroll
          for (int dt = 0; dt < kQDTiles; ++dt) {
            float* dst = dq + r * p.head_dim_padded + dt * 8 + 2 * t;
#if __CUDA_ARCH__ >= 900
            atomicAdd(reinterpret_cast<float2*>(dst),
                      make_float2(acc_dq[dt][hh * 2], acc_dq[dt][hh * 2 + 1]));
#else
            atomicAdd(dst, acc_dq[dt][hh * 2]);
            atomicAdd(dst + 1, acc_dq[dt][hh * 2 + 1]);
#endif
          }
        }
      }
      if (p.deterministic) {
        __threadfence();
        __syncthreads();
        if (tid == 0) atomicExch(sem, n_block + 1);
      }
    }
  }

  // Epilogue: dK (scaled) and dV through shared memory (the K and V tiles) to global memory.
  cp_async_wait<0>();  // with no query block at all, K and V may still be in flight
  __syncthreads();
  {
    const int r0 = kv_wn * 16;
    const int c0 = kv_wd * (kHeadDim / Cfg::kKvWarpsD);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = r0 + g + hh * 8;
#pragma unroll
      for (int dt = 0; dt < kKvDTiles; ++dt) {
        const int c = c0 + dt * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(sK + TileKV::offset(r, c)) =
            pack2<T>(acc_dk[dt][hh * 2] * p.scale, acc_dk[dt][hh * 2 + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(sV + TileKV::offset(r, c)) =
            pack2<T>(acc_dv[dt][hh * 2], acc_dv[dt][hh * 2 + 1]);
      }
    }
  }
  __syncthreads();
  T* dkg = static_cast<T*>(p.dk) + batch * p.dk_batch_stride + head_kv * p.dk_head_stride +
           int64_t(n0) * p.dk_row_stride;
  T* dvg = static_cast<T*>(p.dv) + batch * p.dv_batch_stride + head_kv * p.dv_head_stride +
           int64_t(n0) * p.dv_row_stride;
  store_tile<TileKV, Cfg::kNThreads>(dkg, p.dk_row_stride, sK, rows_k, p.head_dim, tid);
  store_tile<TileKV, Cfg::kNThreads>(dvg, p.dv_row_stride, sV, rows_k, p.head_dim, tid);
}

template <class T, int kHeadDim>
cudaError_t launch_bwd(const cuda::BwdParams& p, cudaStream_t stream) {
  using Cfg = BwdConfig<kHeadDim>;
  const dim3 rows_grid(p.seqlen_q_rounded / 64, p.heads_q, p.batch);
  bwd_preprocess_kernel<T><<<rows_grid, 256, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  auto kernel = bwd_kernel<T, kHeadDim>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid((p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN, p.heads_kv, p.batch);
  kernel<<<grid, Cfg::kNThreads, Cfg::kSmemBytes, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const dim3 post_grid((p.seqlen_q + 63) / 64, p.heads_q, p.batch);
  bwd_postprocess_kernel<T><<<post_grid, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sm80
}  // namespace flashattn
