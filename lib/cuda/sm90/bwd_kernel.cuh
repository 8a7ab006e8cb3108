// The Hopper (sm_90a) FlashAttention backward main kernel; the preprocess and postprocess
// launches are the sm80 ones (same workspace). One CTA per (key block of 128, kv head, batch):
// two warpgroups, each owning 64 keys with their dK and dV in registers. Per step of 64 queries
// each warpgroup computes, on wgmma,
//   S^T = K Q^T and dP^T = V dO^T        (both operands from shared memory)
//   P^T = exp2(S^T scale log2e - LSE log2e), dS^T = P^T (dP^T - D)   (in registers)
//   dV += P^T dO and dK += dS^T Q        (A straight from the accumulators, B MN-major)
//   dQ (partial) = dS K                  (dS^T through shared memory, both operands MN-major)
// and adds its 64 x 64 fp32 dQ tile into the accumulator with one bulk reduce-add from shared
// memory (in key-block order when deterministic). The sm90 accumulator is stored in tiles (see
// dq_tile_offset), which its own postprocess reads.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/flash/params.hpp"
#include "cuda/sm80/bwd_prepost.cuh"
#include "cuda/sm80/ptx.cuh"
#include "cuda/sm80/tile.cuh"
#include "cuda/sm90/arch.cuh"
#include "cuda/sm90/bwd_config.cuh"
#include "cuda/sm90/common.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace flashattn {
namespace sm90 {

template <class T, int kHeadDim, int kWarpGroups>
__global__ void __launch_bounds__(128 * kWarpGroups, 3 - kWarpGroups)
    bwd_kernel(const cuda::BwdParams p) {
#ifdef FLASHATTN_SM90A_DEVICE
  using Cfg = BwdConfig<kHeadDim, kWarpGroups>;
  constexpr int kThreads = Cfg::kNThreads;
  constexpr int kBlockM = Cfg::kBlockM;  // 64 queries per step
  constexpr int kBlockN = Cfg::kBlockN;  // 128 keys per CTA, 64 per warpgroup
  constexpr int kDAcc = kHeadDim / 2;    // dK, dV accumulator registers (m64 x head_dim)
  constexpr int kQAcc = Cfg::kDqN / 2;   // dQ accumulator registers
  using TileKV = typename Cfg::TileKV;
  using TileQ = typename Cfg::TileQ;
  using TileDS = typename Cfg::TileDS;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  T* sK = reinterpret_cast<T*>(base);
  T* sV = reinterpret_cast<T*>(base + Cfg::kKVBytes);
  T* sQ = reinterpret_cast<T*>(base + 2 * Cfg::kKVBytes);                      // 2 stages
  T* sdO = reinterpret_cast<T*>(base + 2 * Cfg::kKVBytes + 2 * Cfg::kQBytes);  // 2 stages
  T* sdS = reinterpret_cast<T*>(base + 2 * Cfg::kKVBytes + 4 * Cfg::kQBytes);
  float* sDQ = reinterpret_cast<float*>(base + 2 * Cfg::kKVBytes + 4 * Cfg::kQBytes +
                                        Cfg::kDSBytes);  // [warpgroup][64 x 64], swizzled
  float* sStats = reinterpret_cast<float*>(base + 2 * Cfg::kKVBytes + 4 * Cfg::kQBytes +
                                           Cfg::kDSBytes + kWarpGroups * Cfg::kDQBytes);
  // [2 stages][lse2 64, dsum 64]

  const int n_block = blockIdx.x;
  const int head_kv = blockIdx.y;
  const int batch = blockIdx.z;
  const int tid = threadIdx.x;
  const int wg = tid / 128;          // warpgroup: keys [64 wg, 64 wg + 64) of the block
  const int warp = (tid % 128) / 32;  // warp within the warpgroup: accumulator rows 16 warp..
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int n0 = n_block * kBlockN;
  const int seqlen_q = p.seqlen_q;
  const int seqlen_k = p.seqlen_k;
  const int diag = seqlen_k - seqlen_q;
  const int rows_k = min(kBlockN, seqlen_k - n0);

  int m_begin = 0;
  if (p.causal) m_begin = max(0, n0 - diag) / kBlockM;
  const int m_end = (seqlen_q + kBlockM - 1) / kBlockM;
  const int n_q_blocks = m_end - m_begin;
  const int steps = max(0, n_q_blocks) * p.group;

  const T* kg = static_cast<const T*>(p.k) + batch * p.k_batch_stride +
                head_kv * p.k_head_stride + int64_t(n0) * p.k_row_stride;
  const T* vg = static_cast<const T*>(p.v) + batch * p.v_batch_stride +
                head_kv * p.v_head_stride + int64_t(n0) * p.v_row_stride;
  sm80::load_tile<TileKV, kThreads>(sK, kg, p.k_row_stride, rows_k, p.head_dim, tid);
  sm80::load_tile<TileKV, kThreads>(sV, vg, p.v_row_stride, rows_k, p.head_dim, tid);

  // One step's tiles: Q and dO rows, and the 64 LSE*log2(e) and D values (padded rows of the
  // workspace hold +inf and 0, so they need no predicate).
  auto load_step = [&](int step, int stage) {
    const int head = head_kv * p.group + step / n_q_blocks;
    const int m0 = (m_begin + step % n_q_blocks) * kBlockM;
    const T* qg = static_cast<const T*>(p.q) + batch * p.q_batch_stride +
                  head * p.q_head_stride + int64_t(m0) * p.q_row_stride;
    const T* dog = static_cast<const T*>(p.dout) + batch * p.do_batch_stride +
                   head * p.do_head_stride + int64_t(m0) * p.do_row_stride;
    sm80::load_tile<TileQ, kThreads>(sQ + stage * TileQ::kElems, qg, p.q_row_stride, seqlen_q - m0,
                                p.head_dim, tid);
    sm80::load_tile<TileQ, kThreads>(sdO + stage * TileQ::kElems, dog, p.do_row_stride,
                                seqlen_q - m0, p.head_dim, tid);
    if (tid < 32) {  // 2 x 64 floats: 32 chunks of 16 bytes
      const int64_t row = (int64_t(batch) * p.heads_q + head) * p.seqlen_q_rounded + m0;
      const float* src = (tid < 16 ? p.lse_log2 : p.dsum) + row + (tid % 16) * 4;
      sm80::cp_async_16(sm80::smem_u32(sStats + stage * 128 + tid * 4), src, 16);
    }
  };
  if (steps > 0) load_step(0, 0);
  sm80::cp_async_commit();

  float acc_dk[kDAcc];
  float acc_dv[kDAcc];
#pragma unroll
  for (int i = 0; i < kDAcc; ++i) acc_dk[i] = acc_dv[i] = 0.0f;

  const uint32_t k_addr = sm80::smem_u32(sK) + wg * 64 * 128;  // this warpgroup's 64 key rows
  const uint32_t v_addr = sm80::smem_u32(sV) + wg * 64 * 128;
  const uint32_t ds_addr = sm80::smem_u32(sdS);
  const uint32_t kfull_addr = sm80::smem_u32(sK);

  for (int step = 0; step < steps; ++step) {
    const int head = head_kv * p.group + step / n_q_blocks;
    const int m_block = m_begin + step % n_q_blocks;
    const int m0 = m_block * kBlockM;
    const int stage = step % 2;
    const uint32_t q_addr = sm80::smem_u32(sQ + stage * TileQ::kElems);
    const uint32_t do_addr = sm80::smem_u32(sdO + stage * TileQ::kElems);
    const float* lse2 = sStats + stage * 128;
    const float* dsum = lse2 + 64;

    sm80::cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();  // this step's tiles landed; the last step is done with sdS and buffers
    if (step + 1 < steps) load_step(step + 1, 1 - stage);
    sm80::cp_async_commit();

    // S^T and dP^T: m64 (this warpgroup's keys) x n64 (queries), k = head_dim.
    float acc_s[32];
    float acc_dp[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc_s[i] = acc_dp[i] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t off_a = (kk % 4) * 32 + (kk / 4) * kBlockN * 128;
      const uint32_t off_b = (kk % 4) * 32 + (kk / 4) * kBlockM * 128;
      wgmma_ss<T, 64>(acc_s, smem_desc(k_addr + off_a, 16, 1024),
                      smem_desc(q_addr + off_b, 16, 1024), kk > 0);
    }
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t off_a = (kk % 4) * 32 + (kk / 4) * kBlockN * 128;
      const uint32_t off_b = (kk % 4) * 32 + (kk / 4) * kBlockM * 128;
      wgmma_ss<T, 64>(acc_dp, smem_desc(v_addr + off_a, 16, 1024),
                      smem_desc(do_addr + off_b, 16, 1024), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();

    // P^T and dS^T. Accumulator element (row, col) = (key, query): rows 16 warp + g (+8),
    // columns 8 j + 2 t (+1).
    const bool need_mask = (n0 + kBlockN > seqlen_k) ||
                           (p.causal && n0 + kBlockN - 1 > m0 + diag);
    uint32_t pt[4][4];   // P^T as the A operand of dV += P^T dO: k16 steps over the queries
    uint32_t dst[4][4];  // dS^T likewise for dK += dS^T Q
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float pv[4], dv[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * j + 2 * t + (e % 2);
        const int key = n0 + wg * 64 + warp * 16 + g + (e / 2) * 8;
        float prob = sm80::exp2_approx(fmaf(acc_s[4 * j + e], p.scale_log2, -lse2[col]));
        if (need_mask && (key >= seqlen_k || (p.causal && key > m0 + col + diag))) prob = 0.0f;
        pv[e] = prob;
        dv[e] = prob * (acc_dp[4 * j + e] - dsum[col]);
      }
      // Columns 8j..8j+7 are half of k16 step j / 2: registers {0,1} of the step for even j,
      // {2,3} for odd j.
      pt[j / 2][(j % 2) * 2 + 0] = sm80::pack2<T>(pv[0], pv[1]);
      pt[j / 2][(j % 2) * 2 + 1] = sm80::pack2<T>(pv[2], pv[3]);
      dst[j / 2][(j % 2) * 2 + 0] = sm80::pack2<T>(dv[0], dv[1]);
      dst[j / 2][(j % 2) * 2 + 1] = sm80::pack2<T>(dv[2], dv[3]);
    }

    // dS^T to shared memory, [keys][queries], for dQ = dS K (before the wgmmas below take
    // these registers as operands: in-flight operand registers must not be touched).
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = wg * 64 + warp * 16 + g + hh * 8;
        *reinterpret_cast<uint32_t*>(sdS + TileDS::offset(r, 8 * j + 2 * t)) =
            dst[j / 2][(j % 2) * 2 + hh];
      }
    }
    fence_proxy_async();

    // dV += P^T dO, dK += dS^T Q: B = dO, Q MN-major (rows = queries = k, head_dim = n).
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      wgmma_rs<T, kHeadDim>(acc_dv, pt[kk],
                            smem_desc(do_addr + kk * 2048, kBlockM * 128, 1024), 1);
    }
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      wgmma_rs<T, kHeadDim>(acc_dk, dst[kk],
                            smem_desc(q_addr + kk * 2048, kBlockM * 128, 1024), 1);
    }
    wgmma_commit();
    __syncthreads();  // both warpgroups' dS^T rows are in place

    // dQ = dS K: A = dS (queries x keys) read MN-major from dS^T, B = K MN-major.
    float acc_dq[kQAcc];
#pragma unroll
    for (int i = 0; i < kQAcc; ++i) acc_dq[i] = 0.0f;
    wgmma_fence();
    // Each warpgroup: all 128 keys, its half of the head dim (a 64-column block of sK).
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      wgmma_ss_tt<T, Cfg::kDqN>(
          acc_dq, smem_desc(ds_addr + kk * 2048, kBlockN * 128, 1024),
          smem_desc(kfull_addr + wg * kBlockN * 128 + kk * 2048, kBlockN * 128, 1024), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();

    // dQ tile to shared memory (the layout of the accumulator's tiles), then one bulk add.
    float* my_dq = sDQ + wg * 64 * 64;
    const bool leader = (tid % 128) == 0;
    if (leader) bulk_wait_read();  // the last step's bulk add has finished reading my_dq
    named_barrier_sync(1 + wg, 128);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = warp * 16 + g + hh * 8;
#pragma unroll
      for (int j = 0; j < Cfg::kDqN / 8; ++j) {
        *reinterpret_cast<float2*>(my_dq + dq_tile_offset(r, 8 * j + 2 * t)) =
            make_float2(acc_dq[4 * j + 2 * hh], acc_dq[4 * j + 2 * hh + 1]);
      }
    }
    fence_proxy_async();
    int* sem = nullptr;
    if (p.deterministic) {
      sem = p.dq_semaphore +
            (int64_t(batch) * p.heads_q + head) * (p.seqlen_q_rounded / kBlockM) + m_block;
      if (tid == 0) {
        while (atomicAdd(sem, 0) != n_block) {
        }
        __threadfence();
      }
      __syncthreads();  // also: every warpgroup's tile is written
    } else {
      named_barrier_sync(1 + wg, 128);
    }
    {
      const int64_t head_rows = (int64_t(batch) * p.heads_q + head) * p.seqlen_q_rounded;
      float* dst = p.dq_accum + head_rows * p.head_dim_padded + int64_t(m0) * p.head_dim_padded +
                   wg * 64 * 64;  // the warpgroup's 64-column tile
      if (leader) {
        bulk_reduce_add_f32(dst, my_dq, 64 * 64 * 4);
        if (p.deterministic) {
          bulk_wait_all();
          __threadfence();
        }
      }
    }
    if (p.deterministic) {
      __syncthreads();
      if (tid == 0) {
        __threadfence();
        atomicExch(sem, n_block + 1);
      }
    }
  }
  if ((tid % 128) == 0) bulk_wait_all();  // shared memory stays until the adds have read it

  // Epilogue: dK (scaled) and dV through shared memory (the K and V tiles).
  sm80::cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = wg * 64 + warp * 16 + g + hh * 8;
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const int c = 8 * j + 2 * t;
      *reinterpret_cast<uint32_t*>(sK + TileKV::offset(r, c)) = sm80::pack2<T>(
          acc_dk[4 * j + 2 * hh] * p.scale, acc_dk[4 * j + 2 * hh + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(sV + TileKV::offset(r, c)) =
          sm80::pack2<T>(acc_dv[4 * j + 2 * hh], acc_dv[4 * j + 2 * hh + 1]);
    }
  }
  __syncthreads();
  T* dkg = static_cast<T*>(p.dk) + batch * p.dk_batch_stride + head_kv * p.dk_head_stride +
           int64_t(n0) * p.dk_row_stride;
  T* dvg = static_cast<T*>(p.dv) + batch * p.dv_batch_stride + head_kv * p.dv_head_stride +
           int64_t(n0) * p.dv_row_stride;
  sm80::store_tile<TileKV, kThreads>(dkg, p.dk_row_stride, sK, rows_k, p.head_dim, tid);
  sm80::store_tile<TileKV, kThreads>(dvg, p.dv_row_stride, sV, rows_k, p.head_dim, tid);
#endif
}

template <class T, int kHeadDim, int kWarpGroups>
cudaError_t launch_bwd_main(const cuda::BwdParams& p, cudaStream_t stream) {
  using Cfg = BwdConfig<kHeadDim, kWarpGroups>;
  auto kernel = bwd_kernel<T, kHeadDim, kWarpGroups>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid((p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN, p.heads_kv, p.batch);
  kernel<<<grid, Cfg::kNThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <class T, int kHeadDim>
cudaError_t launch_bwd(const cuda::BwdParams& params, cudaStream_t stream) {
  cuda::BwdParams p = params;
  p.dq_tiled = true;
  const dim3 rows_grid(p.seqlen_q_rounded / 64, p.heads_q, p.batch);
  sm80::bwd_preprocess_kernel<T><<<rows_grid, 256, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = launch_bwd_main<T, kHeadDim, 2>(p, stream);
  if (err != cudaSuccess) return err;
  const dim3 post_grid((p.seqlen_q + 63) / 64, p.heads_q, p.batch);
  sm80::bwd_postprocess_kernel<T><<<post_grid, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace flashattn
