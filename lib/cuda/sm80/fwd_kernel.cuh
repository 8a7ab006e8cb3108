// The sm80 FlashAttention forward kernel (mma.sync m16n8k16, ldmatrix, cp.async), the FA2
// organization: one CTA per tile (query block, head, batch); its warps split the query rows; K
// and V tiles stream through swizzled shared memory; S stays in registers and becomes the A
// operand of P·V. Mask, online softmax, epilogue and tile order are the common/ parts.
#pragma once

#include <cfloat>
#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/common/epilogue.cuh"
#include "cuda/common/mask.cuh"
#include "cuda/common/repair.cuh"
#include "cuda/common/scheduler.cuh"
#include "cuda/common/score_mod.cuh"
#include "cuda/common/seqlen.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/flash/params.hpp"
#include "cuda/sm80/fwd_config.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/tile.cuh"
#include "cuda/sm80/mma.cuh"

namespace flashattn {
namespace sm80 {

// One CTA per tile, last query block of a head first (with a causal mask the heaviest).
template <class Cfg>
__host__ __device__ inline common::TileScheduler tiles_of(const cuda::FwdParams& p) {
  return common::TileScheduler{(p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM, p.heads_q,
                               p.batch, common::TileOrder::kHeadMajorReversed};
}

template <class T, int kHeadDim>
__global__ void __launch_bounds__(FwdConfig<kHeadDim>::kNThreads)
    fwd_kernel(const __grid_constant__ cuda::FwdParams p) {
  using Cfg = FwdConfig<kHeadDim>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kMTiles = Cfg::kMTiles;
  constexpr int kNTiles = Cfg::kNTiles;
  constexpr int kDTiles = Cfg::kDTiles;
  using TileQ = common::SwizzledTile<kBlockM, kHeadDim>;
  using TileKV = common::SwizzledTile<kBlockN, kHeadDim>;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + Cfg::kSmemQ;
  T* sV = sK + Cfg::kSmemKV;

  const common::TileCoord tile = tiles_of<Cfg>(p).at(blockIdx.x);
  const int m_block = tile.m_block;
  const int head = tile.head;
  const int batch = tile.batch;
  const int head_kv = head / p.group;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const common::SeqlenInfo seq(p, batch);
  const common::WindowMask mask = common::mask_of(p, seq);
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.seqlen_q) return;  // a query block past this sequence's end (varlen)
  const int rows = min(kBlockM, seq.seqlen_q - m0);

  const T* qg = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
                int64_t(seq.offset_q + m0) * p.q_row_stride;
  const T* kg = static_cast<const T*>(p.k) + batch * p.k_batch_stride +
                head_kv * p.k_head_stride + int64_t(seq.offset_k) * p.k_row_stride;
  const T* vg = static_cast<const T*>(p.v) + batch * p.v_batch_stride +
                head_kv * p.v_head_stride + int64_t(seq.offset_k) * p.v_row_stride;

  // The output rows, from the tile's coordinates (computed where they are needed: held across
  // the main loop they would cost registers the loop needs).
  auto out_rows = [&p, m0](const common::TileCoord& c, const common::SeqlenInfo& s) {
    return static_cast<T*>(p.o) + c.batch * p.o_batch_stride + c.head * p.o_head_stride +
           int64_t(s.offset_q + m0) * p.o_row_stride;
  };
  auto lse_rows = [&p, m0](const common::TileCoord& c, const common::SeqlenInfo& s) {
    return p.lse == nullptr ? nullptr
                            : p.lse + c.batch * p.lse_batch_stride + c.head * p.lse_head_stride +
                                  int64_t(s.offset_q + m0) * p.lse_row_stride;
  };

  int n_begin, n_end;
  mask.n_block_range(m0, kBlockM, kBlockN, n_begin, n_end);
  if (n_end <= n_begin) {
    T* og = out_rows(tile, seq);
    float* lse_g = lse_rows(tile, seq);
    common::write_empty_block<T, kBlockM, kHeadDim, Cfg::kNThreads>(
        og, p.o_row_stride, lse_g, p.lse_row_stride, rows, p.head_dim_v, tid);
    return;
  }

  // Prologue: Q and the last K tile in one cp.async group.
  common::load_tile<TileQ, Cfg::kNThreads>(sQ, qg, p.q_row_stride, rows, p.head_dim, tid);
  {
    const int n0 = (n_end - 1) * kBlockN;
    common::load_tile<TileKV, Cfg::kNThreads>(sK, kg + int64_t(n0) * p.k_row_stride,
                                              p.k_row_stride, seq.seqlen_k - n0, p.head_dim, tid);
  }
  common::cp_async_commit();

  float acc_o[kMTiles * kDTiles * 4];
#pragma unroll
  for (int i = 0; i < kMTiles * kDTiles * 4; ++i) acc_o[i] = 0.0f;
  common::OnlineSoftmax<kMTiles> softmax;
  softmax.reset();
  const int warp_row0 = warp * Cfg::kRowsPerWarp;
  // ldmatrix lane roles: Q (A operand) and V (B, transposed) take matrix i = lane / 8 at rows
  // (i % 2) * 8, columns (i / 2) * 8; K (B operand) at rows (i / 2) * 8, columns (i % 2) * 8.
  const common::LdsmAddr<TileQ> q_addr(sQ, warp_row0 + (lane / 8 % 2) * 8 + lane % 8, lane / 16);
  const common::LdsmAddr<TileKV> k_addr(sK, (lane / 16) * 8 + lane % 8, lane / 8 % 2);
  const common::LdsmAddr<TileKV> v_addr(sV, (lane / 8 % 2) * 8 + lane % 8, lane / 16);

  // With a softcap or ALiBi the scores become log2 logits before the softmax (scale 1). The
  // main loop is compiled twice (common::specialize), so that plain attention holds no
  // register for them or for a window's left bound.
  const common::ScoreMod mod = common::score_mod_of(p, batch, head, mask);
  common::specialize(common::needs_general(mod, mask), [&](auto general) {
    constexpr bool kGeneral = decltype(general)::value;
    const common::WindowMask m = kGeneral ? mask : mask.without_left();
    const bool modded = kGeneral && mod.active();
    const float softmax_scale = modded ? 1.0f : p.scale_log2;
    const bool neg_scale = softmax_scale < 0.0f;
    const float hidden = common::hidden_score(neg_scale);
    for (int n_block = n_end - 1; n_block >= n_begin; --n_block) {
      const int n0 = n_block * kBlockN;
      common::cp_async_wait<0>();
      __syncthreads();  // K tile landed; every warp is done with the previous V tile
      common::load_tile<TileKV, Cfg::kNThreads>(sV, vg + int64_t(n0) * p.v_row_stride,
                                                p.v_row_stride, seq.seqlen_k - n0, p.head_dim_v, tid);
      common::cp_async_commit();

      // S = Q K^T for this warp's rows.
      float acc_s[kMTiles * kNTiles * 4];
#pragma unroll
      for (int i = 0; i < kMTiles * kNTiles * 4; ++i) acc_s[i] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t a[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          common::ldmatrix_x4(q_addr.at(mt * 16, kk), a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
        }
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
          uint32_t b0, b1, b2, b3;
          common::ldmatrix_x4(k_addr.at(np * 16, kk), b0, b1, b2, b3);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_16816<T>(acc_s + 4 * (mt * kNTiles + 2 * np), a[mt], b0, b1);
            mma_16816<T>(acc_s + 4 * (mt * kNTiles + 2 * np + 1), a[mt], b2, b3);
          }
        }
      }

      if (modded) mod.apply<kMTiles, kNTiles>(acc_s, m0 + warp_row0 + g, n0 + 2 * t);
      if (m.needs_mask(m0, kBlockM, n0, kBlockN)) {
        m.apply<kMTiles, kNTiles>(acc_s, m0 + warp_row0 + g, n0 + 2 * t, hidden);
      }

      common::cp_async_wait<0>();
      __syncthreads();  // V tile landed; every warp is done reading this K tile
      if (n_block > n_begin) {
        const int nn = n0 - kBlockN;
        common::load_tile<TileKV, Cfg::kNThreads>(sK, kg + int64_t(nn) * p.k_row_stride,
                                                  p.k_row_stride, seq.seqlen_k - nn, p.head_dim,
                                                  tid);
        common::cp_async_commit();
      }

      float corr[2 * kMTiles];
      softmax.update<kNTiles>(acc_s, softmax_scale, neg_scale, corr);
      common::scale_rows<kMTiles, kDTiles>(acc_o, corr);

      // O += P V: two adjacent n8 tiles of S are the A fragment of one k16 step.
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        uint32_t a[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          const float* s0 = acc_s + (mt * kNTiles + 2 * ks) * 4;
          a[mt][0] = common::pack2<T>(s0[0], s0[1]);
          a[mt][1] = common::pack2<T>(s0[2], s0[3]);
          a[mt][2] = common::pack2<T>(s0[4], s0[5]);
          a[mt][3] = common::pack2<T>(s0[6], s0[7]);
        }
#pragma unroll
        for (int dp = 0; dp < kDTiles / 2; ++dp) {
          uint32_t b0, b1, b2, b3;
          common::ldmatrix_x4_trans(v_addr.at(ks * 16, dp), b0, b1, b2, b3);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_16816<T>(acc_o + 4 * (mt * kDTiles + 2 * dp), a[mt], b0, b1);
            mma_16816<T>(acc_o + 4 * (mt * kDTiles + 2 * dp + 1), a[mt], b2, b3);
          }
        }
      }
    }
  });

  // Epilogue: one division per row, O through shared memory (the Q tile) for 16-byte stores.
  const common::TileCoord here = tiles_of<Cfg>(p).at(blockIdx.x);
  const common::SeqlenInfo here_seq(p, here.batch);
  T* og = out_rows(here, here_seq);
  float* lse_g = lse_rows(here, here_seq);
  const int rows_out = min(kBlockM, here_seq.seqlen_q - m0);
  float inv[2 * kMTiles], lse[2 * kMTiles];
  softmax.finalize(inv, lse, common::sink_log2_of(p, here.head));
  __syncthreads();  // every warp is done reading sQ
  common::write_o_fragment<T, TileQ, kMTiles, kDTiles>(sQ, acc_o, inv, warp_row0 + g, t);
  common::repair_spoiled_rows<T, TileQ, kHeadDim, kMTiles, kDTiles>(
      p, here.batch, here.head, m0, warp_row0 + g, acc_o, inv, lse, sQ);
  common::write_lse<kMTiles>(lse_g, p.lse_row_stride, lse, warp_row0 + g, rows_out, t);
  __syncthreads();
  common::store_tile<TileQ, Cfg::kNThreads>(og, p.o_row_stride, sQ, rows_out, p.head_dim_v, tid);
}

// Launches the kernel for one (dtype, padded head dim). Returns the launch's error.
template <class T, int kHeadDim>
cudaError_t launch_fwd(const cuda::FwdParams& p, const cuda::LaunchInfo&,
                       cudaStream_t stream) {
  using Cfg = FwdConfig<kHeadDim>;
  auto kernel = fwd_kernel<T, kHeadDim>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int64_t tiles = tiles_of<Cfg>(p).num_tiles();
  if (tiles > INT32_MAX) return cudaErrorNotSupported;
  if (tiles == 0) return cudaSuccess;
  kernel<<<static_cast<unsigned>(tiles), Cfg::kNThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sm80
}  // namespace flashattn
