// The sm80 FlashAttention forward kernel (mma.sync m16n8k16, ldmatrix, cp.async), the FA2
// organization: one CTA per (query block, head, batch); its warps split the query rows; K and V
// tiles stream through swizzled shared memory; S stays in registers and becomes the A operand
// of P·V; the division by the running sum happens once, at the end.
#pragma once

#include <cfloat>
#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/flash/params.hpp"
#include "cuda/sm80/fwd_config.cuh"
#include "cuda/sm80/ptx.cuh"
#include "cuda/sm80/tile.cuh"

namespace flashattn {
namespace sm80 {

// Writes output 0 and LSE -inf for the rows of a query block that no key may attend to.
template <class T, class Cfg>
__device__ void write_empty_block(const cuda::FwdParams& p, T* og, float* lse_g, int rows) {
  constexpr int kChunks = Cfg::kHeadDim / 8;
  for (int idx = threadIdx.x; idx < Cfg::kBlockM * kChunks; idx += Cfg::kNThreads) {
    const int r = idx / kChunks;
    const int c = (idx % kChunks) * 8;
    if (r < rows && c < p.head_dim) {
      T* dst = og + r * p.o_row_stride + c;
      if (c + 8 <= p.head_dim) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      } else {
        for (int e = 0; e < p.head_dim - c; ++e) dst[e] = T(0.0f);
      }
    }
  }
  if (lse_g != nullptr) {
    for (int r = threadIdx.x; r < rows; r += Cfg::kNThreads) lse_g[r * p.lse_row_stride] = -INFINITY;
  }
}

template <class T, int kHeadDim>
__global__ void __launch_bounds__(FwdConfig<kHeadDim>::kNThreads)
    fwd_kernel(const cuda::FwdParams p) {
  using Cfg = FwdConfig<kHeadDim>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kMTiles = Cfg::kMTiles;
  constexpr int kNTiles = Cfg::kNTiles;
  constexpr int kDTiles = Cfg::kDTiles;
  using TileQ = SwizzledTile<kBlockM, kHeadDim>;
  using TileKV = SwizzledTile<kBlockN, kHeadDim>;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + Cfg::kSmemQ;
  T* sV = sK + Cfg::kSmemKV;

  // Heavy (late) query blocks first: with causal masking they have the most key blocks.
  const int m_block = gridDim.x - 1 - blockIdx.x;
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
  const int diag = seqlen_k - seqlen_q;  // key j is visible to query i when j <= i + diag

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
    const int last_visible = m0 + kBlockM - 1 + diag;  // for the block's last row
    n_blocks = last_visible < 0 ? 0 : min(n_blocks, last_visible / kBlockN + 1);
  }
  if (n_blocks <= 0) {
    write_empty_block<T, Cfg>(p, og, lse_g, rows);
    return;
  }

  // Prologue: Q and the last K tile in one cp.async group.
  load_tile<TileQ, Cfg::kNThreads>(sQ, qg, p.q_row_stride, rows, p.head_dim, tid);
  {
    const int n0 = (n_blocks - 1) * kBlockN;
    load_tile<TileKV, Cfg::kNThreads>(sK, kg + int64_t(n0) * p.k_row_stride, p.k_row_stride,
                                      seqlen_k - n0, p.head_dim, tid);
  }
  cp_async_commit();

  float acc_o[kMTiles][kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.0f;
  // Running maximum of scale*log2(e)*s (-inf: nothing seen yet) and the thread's part of the
  // running sum, for rows g and g + 8 of each m16 tile.
  float row_max[kMTiles][2];
  float row_sum[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }
  // A negative scale turns the largest score into the smallest: track the extremum that
  // scaling makes the maximum, and mask with the value that scaling makes -inf.
  const bool neg_scale = p.scale_log2 < 0.0f;
  const float masked = neg_scale ? INFINITY : -INFINITY;
  const int warp_row0 = warp * Cfg::kRowsPerWarp;
  // ldmatrix lane roles: Q (A operand) and V (B, transposed) take matrix i = lane / 8 at rows
  // (i % 2) * 8, columns (i / 2) * 8; K (B operand) at rows (i / 2) * 8, columns (i % 2) * 8.
  const LdsmAddr<TileQ> q_addr(sQ, warp_row0 + (lane / 8 % 2) * 8 + lane % 8, lane / 16);
  const LdsmAddr<TileKV> k_addr(sK, (lane / 16) * 8 + lane % 8, lane / 8 % 2);
  const LdsmAddr<TileKV> v_addr(sV, (lane / 8 % 2) * 8 + lane % 8, lane / 16);

  for (int n_block = n_blocks - 1; n_block >= 0; --n_block) {
    const int n0 = n_block * kBlockN;
    cp_async_wait<0>();
    __syncthreads();  // K tile landed; every warp is done with the previous V tile
    load_tile<TileKV, Cfg::kNThreads>(sV, vg + int64_t(n0) * p.v_row_stride, p.v_row_stride,
                                      seqlen_k - n0, p.head_dim, tid);
    cp_async_commit();

    // S = Q K^T for this warp's rows.
    float acc_s[kMTiles][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ldmatrix_x4(q_addr.at(mt * 16, kk), a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
      }
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(k_addr.at(np * 16, kk), b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<T>(acc_s[mt][2 * np], a[mt], b0, b1);
          mma_16816<T>(acc_s[mt][2 * np + 1], a[mt], b2, b3);
        }
      }
    }

    // Masks, only on the tiles that need them: past the end of the keys, or across the diagonal.
    const bool need_mask =
        (n0 + kBlockN > seqlen_k) || (p.causal && n0 + kBlockN - 1 > m0 + diag);
    if (need_mask) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int row = m0 + warp_row0 + mt * 16 + g + hh * 8;
          const int limit = p.causal ? min(seqlen_k - 1, row + diag) : seqlen_k - 1;
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int col = n0 + nt * 8 + 2 * t + e;
              if (col > limit) acc_s[mt][nt][hh * 2 + e] = masked;
            }
        }
    }

    cp_async_wait<0>();
    __syncthreads();  // V tile landed; every warp is done reading this K tile
    if (n_block > 0) {
      const int nn = n0 - kBlockN;
      load_tile<TileKV, Cfg::kNThreads>(sK, kg + int64_t(nn) * p.k_row_stride, p.k_row_stride,
                                        seqlen_k - nn, p.head_dim, tid);
      cp_async_commit();
    }

    // Online softmax: new maximum, rescale what came before, P = exp2(s*scale_log2 - max).
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float ext = acc_s[mt][0][hh * 2];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float s = acc_s[mt][nt][hh * 2 + e];
            ext = neg_scale ? fminf(ext, s) : fmaxf(ext, s);
          }
        ext = neg_scale ? quad_min(ext) : quad_max(ext);
        const float m_new = fmaxf(row_max[mt][hh], ext * p.scale_log2);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const float corr = exp2_approx(row_max[mt][hh] - m_use);
        row_max[mt][hh] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pv = exp2_approx(fmaf(acc_s[mt][nt][hh * 2 + e], p.scale_log2, -m_use));
            acc_s[mt][nt][hh * 2 + e] = pv;
            sum += pv;
          }
        row_sum[mt][hh] = row_sum[mt][hh] * corr + sum;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          acc_o[mt][dt][hh * 2] *= corr;
          acc_o[mt][dt][hh * 2 + 1] *= corr;
        }
      }

    // O += P V: two adjacent n8 tiles of S are the A fragment of one k16 step.
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        a[mt][0] = pack2<T>(acc_s[mt][2 * ks][0], acc_s[mt][2 * ks][1]);
        a[mt][1] = pack2<T>(acc_s[mt][2 * ks][2], acc_s[mt][2 * ks][3]);
        a[mt][2] = pack2<T>(acc_s[mt][2 * ks + 1][0], acc_s[mt][2 * ks + 1][1]);
        a[mt][3] = pack2<T>(acc_s[mt][2 * ks + 1][2], acc_s[mt][2 * ks + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(v_addr.at(ks * 16, dp), b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<T>(acc_o[mt][2 * dp], a[mt], b0, b1);
          mma_16816<T>(acc_o[mt][2 * dp + 1], a[mt], b2, b3);
        }
      }
    }
  }

  // Epilogue: one division per row, O through shared memory (the Q tile) for 16-byte stores.
  __syncthreads();  // every warp is done reading sQ
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float l = quad_sum(row_sum[mt][hh]);
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int r = warp_row0 + mt * 16 + g + hh * 8;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const uint32_t v = pack2<T>(acc_o[mt][dt][hh * 2] * inv, acc_o[mt][dt][hh * 2 + 1] * inv);
        *reinterpret_cast<uint32_t*>(sQ + TileQ::offset(r, dt * 8 + 2 * t)) = v;
      }
      if (lse_g != nullptr && t == 0 && r < rows) {
        const float m = row_max[mt][hh];
        lse_g[int64_t(r) * p.lse_row_stride] =
            (l > 0.0f && m != -INFINITY) ? m * 0.69314718055994531f + logf(l) : -INFINITY;
      }
    }
  __syncthreads();
  store_tile<TileQ, Cfg::kNThreads>(og, p.o_row_stride, sQ, rows, p.head_dim, tid);
}

// Launches the kernel for one (dtype, padded head dim). Returns the launch's error.
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

}  // namespace sm80
}  // namespace flashattn
