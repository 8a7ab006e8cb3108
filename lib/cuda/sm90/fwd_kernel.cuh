// The Hopper (sm_90a) FlashAttention forward: one warpgroup per CTA owns 64 query rows and runs
// both GEMMs on wgmma: S = Q K^T with Q and K read from shared memory through descriptors, and
// O += P V with P straight from the S accumulators in registers (the accumulator layout is the
// register-A layout) and V read MN-major. Tiles arrive by cp.async into the same 128-byte
// swizzled layout the sm80 kernels use, which is wgmma's SWIZZLE_128B layout. Two CTAs share an
// SM, so one's softmax runs under the other's GEMMs.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/flash/params.hpp"
#include "cuda/sm80/fwd_kernel.cuh"  // write_empty_block
#include "cuda/sm80/ptx.cuh"
#include "cuda/sm80/tile.cuh"
#include "cuda/sm90/arch.cuh"
#include "cuda/sm90/common.cuh"
#include "cuda/sm90/fwd_config.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace flashattn {
namespace sm90 {

template <class T, int kHeadDim>
__global__ void __launch_bounds__(128, 2) fwd_kernel(const cuda::FwdParams p) {
#ifdef FLASHATTN_SM90A_DEVICE
  using Cfg = FwdConfig<kHeadDim>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kSAcc = kBlockN / 2;   // S accumulator registers per thread
  constexpr int kOAcc = kHeadDim / 2;  // O accumulator registers per thread
  using TileQ = typename Cfg::TileQ;
  using TileKV = typename Cfg::TileKV;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = smem_align1024(smem_raw);
  T* sQ = reinterpret_cast<T*>(base);
  T* sK = reinterpret_cast<T*>(base + Cfg::kQBytes);
  T* sV = reinterpret_cast<T*>(base + Cfg::kQBytes + Cfg::kKVBytes);

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heavy causal blocks first
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int head_kv = head / p.group;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const int seqlen_q = p.seqlen_q;
  const int seqlen_k = p.seqlen_k;
  const int m0 = m_block * kBlockM;
  const int rows = min(kBlockM, seqlen_q - m0);
  const int diag = seqlen_k - seqlen_q;

  const T* qg = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
                int64_t(m0) * p.q_row_stride;
  const T* kg = static_cast<const T*>(p.k) + batch * p.k_batch_stride + head_kv * p.k_head_stride;
  const T* vg = static_cast<const T*>(p.v) + batch * p.v_batch_stride + head_kv * p.v_head_stride;
  T* og = static_cast<T*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
          int64_t(m0) * p.o_row_stride;
  float* lse_g = p.lse == nullptr ? nullptr
                                  : p.lse + batch * p.lse_batch_stride + head * p.lse_head_stride +
                                        int64_t(m0) * p.lse_row_stride;

  int n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
  if (p.causal) {
    const int last_visible = m0 + kBlockM - 1 + diag;
    n_blocks = last_visible < 0 ? 0 : min(n_blocks, last_visible / kBlockN + 1);
  }
  if (n_blocks <= 0) {  // no key is visible to any row: output 0, LSE -inf
    sm80::write_empty_block<T, Cfg>(p, og, lse_g, rows);
    return;
  }

  sm80::load_tile<TileQ, Cfg::kNThreads>(sQ, qg, p.q_row_stride, rows, p.head_dim, tid);
  {
    const int n0 = (n_blocks - 1) * kBlockN;
    sm80::load_tile<TileKV, Cfg::kNThreads>(sK, kg + int64_t(n0) * p.k_row_stride,
                                            p.k_row_stride, seqlen_k - n0, p.head_dim, tid);
  }
  sm80::cp_async_commit();

  float acc_o[kOAcc];
#pragma unroll
  for (int i = 0; i < kOAcc; ++i) acc_o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};  // of scale * log2(e) * s
  float row_sum[2] = {0.0f, 0.0f};            // this thread's part
  const bool neg_scale = p.scale_log2 < 0.0f;
  const float masked = neg_scale ? INFINITY : -INFINITY;

  // Descriptors. Q and K are K-major (rows of head_dim): a k16 step moves 32 bytes inside a
  // 64-column block, and 4 steps move to the next block (rows * 128 bytes further). V is the
  // MN-major B of P V: a k16 step is 16 rows = two 1024-byte atoms; LBO jumps 64 columns.
  const uint32_t q_addr = sm80::smem_u32(sQ);
  const uint32_t k_addr = sm80::smem_u32(sK);
  const uint32_t v_addr = sm80::smem_u32(sV);

  for (int n_block = n_blocks - 1; n_block >= 0; --n_block) {
    const int n0 = n_block * kBlockN;
    sm80::cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();  // K landed for every thread; the last P V is done with sV
    sm80::load_tile<TileKV, Cfg::kNThreads>(sV, vg + int64_t(n0) * p.v_row_stride,
                                            p.v_row_stride, seqlen_k - n0, p.head_dim, tid);
    sm80::cp_async_commit();

    float acc_s[kSAcc];
#pragma unroll
    for (int i = 0; i < kSAcc; ++i) acc_s[i] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t qa = q_addr + (kk % 4) * 32 + (kk / 4) * kBlockM * 128;
      const uint32_t ka = k_addr + (kk % 4) * 32 + (kk / 4) * kBlockN * 128;
      wgmma_ss<T, kBlockN>(acc_s, smem_desc(qa, 16, 1024), smem_desc(ka, 16, 1024), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();

    const bool need_mask =
        (n0 + kBlockN > seqlen_k) || (p.causal && n0 + kBlockN - 1 > m0 + diag);
    if (need_mask) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = m0 + warp * 16 + g + hh * 8;
        const int limit = p.causal ? min(seqlen_k - 1, row + diag) : seqlen_k - 1;
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (n0 + j * 8 + 2 * t + e > limit) acc_s[4 * j + 2 * hh + e] = masked;
          }
      }
    }

    // Online softmax on the accumulators; P packed to 16-bit pairs as the A operand of P V.
    uint32_t pa[kBlockN / 16][4];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float ext = acc_s[2 * hh];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float s = acc_s[4 * j + 2 * hh + e];
          ext = neg_scale ? fminf(ext, s) : fmaxf(ext, s);
        }
      ext = neg_scale ? sm80::quad_min(ext) : sm80::quad_max(ext);
      const float m_new = fmaxf(row_max[hh], ext * p.scale_log2);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float corr = sm80::exp2_approx(row_max[hh] - m_use);
      row_max[hh] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& s = acc_s[4 * j + 2 * hh + e];
          s = sm80::exp2_approx(fmaf(s, p.scale_log2, -m_use));
          sum += s;
        }
      row_sum[hh] = row_sum[hh] * corr + sum;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        acc_o[4 * j + 2 * hh] *= corr;
        acc_o[4 * j + 2 * hh + 1] *= corr;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        pa[kk][i] = sm80::pack2<T>(acc_s[8 * kk + 2 * i], acc_s[8 * kk + 2 * i + 1]);
      }
    }

    sm80::cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();  // V landed for every thread; every warp is done with sK
    if (n_block > 0) {
      const int nn = n0 - kBlockN;
      sm80::load_tile<TileKV, Cfg::kNThreads>(sK, kg + int64_t(nn) * p.k_row_stride,
                                              p.k_row_stride, seqlen_k - nn, p.head_dim, tid);
      sm80::cp_async_commit();
    }

    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      wgmma_rs<T, kHeadDim>(acc_o, pa[kk], smem_desc(v_addr + kk * 2048, kBlockN * 128, 1024),
                            1);
    }
    wgmma_commit();
    wgmma_wait<0>();
  }

  // Epilogue: one division per row; O through shared memory (the Q tile) for 16-byte stores.
  __syncthreads();  // every warp is done with sQ
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float l = sm80::quad_sum(row_sum[hh]);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int r = warp * 16 + g + hh * 8;
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const uint32_t v =
          sm80::pack2<T>(acc_o[4 * j + 2 * hh] * inv, acc_o[4 * j + 2 * hh + 1] * inv);
      *reinterpret_cast<uint32_t*>(sQ + TileQ::offset(r, j * 8 + 2 * t)) = v;
    }
    if (lse_g != nullptr && t == 0 && r < rows) {
      const float m = row_max[hh];
      lse_g[int64_t(r) * p.lse_row_stride] =
          (l > 0.0f && m != -INFINITY) ? m * 0.69314718055994531f + logf(l) : -INFINITY;
    }
  }
  __syncthreads();
  sm80::store_tile<TileQ, Cfg::kNThreads>(og, p.o_row_stride, sQ, rows, p.head_dim, tid);
#endif
}

template <class T, int kHeadDim>
cudaError_t launch_fwd(const cuda::FwdParams& p, cudaStream_t stream) {
  using Cfg = FwdConfig<kHeadDim>;
  auto kernel = fwd_kernel<T, kHeadDim>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM, p.heads_q, p.batch);
  kernel<<<grid, Cfg::kNThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace flashattn
