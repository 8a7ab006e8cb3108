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
#include "cuda/common/bwd_prepost.cuh"
#include "cuda/common/bwd_step.cuh"
#include "cuda/common/dsink.cuh"
#include "cuda/common/score_mod.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/tile.cuh"
#include "cuda/sm80/mma.cuh"

namespace flashattn {
namespace sm80 {

// ---- 2. main ---------------------------------------------------------------------------------

// kGeneral: the loop with a softcap, ALiBi, dsinks, a huge scale or a packed batch
// (common::needs_general); without, the plain loop, compiled apart so that it keeps its
// registers and its uniform address arithmetic.
template <class T, int kHeadDim, bool kGeneral>
__global__ void __launch_bounds__(BwdConfig<kHeadDim>::kNThreads, 1)
    bwd_kernel(const __grid_constant__ cuda::BwdParams p) {
  using Cfg = BwdConfig<kHeadDim>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  using TileQ = common::SwizzledTile<kBlockM, kHeadDim>;   // Q and dO
  using TileKV = common::SwizzledTile<kBlockN, kHeadDim>;  // K and V (and dK, dV at the end)
  using TileP = common::SwizzledTile<kBlockM, kBlockN>;    // P and dS
  // Warp tiles (see BwdConfig): m16 / n8 fragment counts per phase.
  constexpr int kSM = Cfg::kSdpRows / 16, kSN = Cfg::kSdpCols / 8;
  constexpr int kKvM = Cfg::kKvRows / 16, kKvD = Cfg::kKvCols / 8;
  constexpr int kQM = Cfg::kDqRows / 16, kQD = Cfg::kDqCols / 8;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  // [K][V][stage 0: Q, dO][stage 1: Q, dO][P][dS][statistics]. A stage's Q and dO together are
  // the size of the step's fp32 dQ tile, which is staged there for the bulk add (bulk_dq).
  constexpr bool kBulkDq = common::bulk_dq(kHeadDim);
  static_assert(!kBulkDq || (Cfg::kDqRows == 32 && Cfg::kDqCols % 32 == 0),
                "a warp's dQ tile is one contiguous range of the blocked layout");
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + TileKV::kElems;
  T* sQ = sV + TileKV::kElems;      // stage s at sQ + 2 s TileQ::kElems
  T* sdO = sQ + TileQ::kElems;      // stage s at sdO + 2 s TileQ::kElems
  T* sP = sQ + 4 * TileQ::kElems;
  T* sdS = sP + TileP::kElems;
  float* sStats = reinterpret_cast<float*>(sdS + TileP::kElems);  // [2 stages][LSE2, D][kBlockM]

  const common::BwdBlock<kBlockM, kBlockN, kGeneral> blk(p);
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int n0 = blk.n0;

  common::load_kv<TileKV, Cfg::kNThreads>(p, blk, sK, sV, tid);

  // Warp roles: row/column offsets of this warp's tile in each phase.
  const int s_r0 = (warp % Cfg::kSdpWarpsM) * Cfg::kSdpRows;
  const int s_c0 = (warp / Cfg::kSdpWarpsM) * Cfg::kSdpCols;
  const int kv_r0 = (warp % Cfg::kKvWarpsN) * Cfg::kKvRows;
  const int kv_c0 = (warp / Cfg::kKvWarpsN) * Cfg::kKvCols;
  const int q_r0 = (warp % Cfg::kDqWarpsM) * Cfg::kDqRows;
  const int q_c0 = (warp / Cfg::kDqWarpsM) * Cfg::kDqCols;

  float acc_dk[kKvM][kKvD][4];
  float acc_dv[kKvM][kKvD][4];
#pragma unroll
  for (int mi = 0; mi < kKvM; ++mi)
#pragma unroll
    for (int i = 0; i < kKvD; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[mi][i][e] = acc_dv[mi][i][e] = 0.0f;

  // ldmatrix addresses (see LdsmAddr): A operands non-transposed take rows (i % 2) * 8,
  // columns (i / 2) * 8 of matrix i = lane / 8; B operands non-transposed rows (i / 2) * 8,
  // columns (i % 2) * 8; transposed B like non-transposed A; transposed A like non-transposed B.
  const int a_row = (lane / 8 % 2) * 8 + lane % 8, a_half = lane / 16;
  const int b_row = (lane / 16) * 8 + lane % 8, b_half = lane / 8 % 2;

  const int steps = blk.steps;
  auto load_step = [&](int head, int m_block, int stage) {
    common::load_bwd_step<TileQ, Cfg::kNThreads>(p, blk.batch, blk.seq, head, m_block,
                                         sQ + 2 * stage * TileQ::kElems,
                                         sdO + 2 * stage * TileQ::kElems,
                                         sStats + stage * 2 * kBlockM, tid);
  };
  // K and V join the first step's tiles in the first cp.async group.
  // Steps run over the query blocks of each query head of the group in turn.
  int head = blk.first_head(p);
  int m_block = blk.m_begin;
  if (steps > 0) load_step(head, m_block, 0);
  common::cp_async_commit();

  // dQ of the last step, and (bulk path) where it goes: the bulk path stages a step's dQ tile in
  // that step's Q/dO stage at the top of the next step, after the barrier that ends every warp's
  // reads of it, so it needs no barrier of its own.
  float acc_dq[kQM][kQD][4];
  int64_t pending_dq = 0;  // float offset of the last step's query block in the accumulator
  int* pending_sem = nullptr;
  int pending_turn = 0;
  // Stages the last step's dQ tile (acc_dq) in `stage` and adds this warp's part of it with one
  // bulk operation (when deterministic: in key-block order, complete before the semaphore moves).
  auto flush_dq = [&](int stage) {
    if (p.deterministic) common::wait_dq_turn(pending_sem, pending_turn);
    float* s_dq = reinterpret_cast<float*>(sQ + 2 * stage * TileQ::kElems);
#pragma unroll
    for (int mi = 0; mi < kQM; ++mi)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int dt = 0; dt < kQD; ++dt) {
          const int r = q_r0 + mi * 16 + g + hh * 8;
          const int c = q_c0 + dt * 8 + 2 * t;
          *reinterpret_cast<float2*>(s_dq + common::dq_block_offset(r, c, kHeadDim)) =
              make_float2(acc_dq[mi][dt][hh * 2], acc_dq[mi][dt][hh * 2 + 1]);
        }
    common::fence_proxy_async();
    __syncwarp();
    if (lane == 0) {
      const int off = common::dq_block_offset(q_r0, q_c0, kHeadDim);
      common::bulk_reduce_add_f32(p.dq_accum + pending_dq + off, s_dq + off,
                                Cfg::kDqRows * Cfg::kDqCols * 4);
      if (p.deterministic) {
        common::bulk_wait_all();
        __threadfence();
      }
    }
    if (p.deterministic) common::pass_dq_turn(pending_sem, pending_turn);
  };

  common::DsinkAccumulator dsink;  // the general loop's share of the sinks' gradient
  const bool with_dsinks = p.dsinks != nullptr;
  for (int step = 0; step < steps; ++step) {
    const int m0 = m_block * kBlockM;
    int next_head = head;
    int next_m_block = m_block;
    blk.next(next_head, next_m_block);
    const int stage = step % 2;
    T* sQs = sQ + 2 * stage * TileQ::kElems;
    T* sdOs = sdO + 2 * stage * TileQ::kElems;

    common::cp_async_wait<0>();
    __syncthreads();  // this step's tiles landed; the last step's readers are done
    if constexpr (kBulkDq) {
      if (step > 0) flush_dq(1 - stage);
    } else if (step + 1 < steps) {
      load_step(next_head, next_m_block, 1 - stage);
      common::cp_async_commit();
    }

    const int64_t stat_base = (int64_t(blk.batch) * p.heads_q + head) * p.seqlen_q_rounded + m0;
    const float* s_lse2 = sStats + stage * 2 * kBlockM;  // this step's rows: LSE * log2(e)
    const float* s_dsum = s_lse2 + kBlockM;              // and D

    // S = Q K^T and dP = dO V^T: this warp's kSdpRows x kSdpCols tile of each.
    float acc_s[kSM][kSN][4];
    float acc_dp[kSM][kSN][4];
#pragma unroll
    for (int mi = 0; mi < kSM; ++mi)
#pragma unroll
      for (int i = 0; i < kSN; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[mi][i][e] = acc_dp[mi][i][e] = 0.0f;
    {
      const common::LdsmAddr<TileQ> q_addr(sQs, s_r0 + a_row, a_half);
      const common::LdsmAddr<TileQ> do_addr(sdOs, s_r0 + a_row, a_half);
      const common::LdsmAddr<TileKV> k_addr(sK, s_c0 + b_row, b_half);
      const common::LdsmAddr<TileKV> v_addr(sV, s_c0 + b_row, b_half);
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t bk[kSN / 2][4], bv[kSN / 2][4];
#pragma unroll
        for (int np = 0; np < kSN / 2; ++np) {
          common::ldmatrix_x4(k_addr.at(np * 16, kk), bk[np][0], bk[np][1], bk[np][2], bk[np][3]);
          common::ldmatrix_x4(v_addr.at(np * 16, kk), bv[np][0], bv[np][1], bv[np][2], bv[np][3]);
        }
#pragma unroll
        for (int mi = 0; mi < kSM; ++mi) {
          uint32_t a[4], da[4];
          common::ldmatrix_x4(q_addr.at(mi * 16, kk), a[0], a[1], a[2], a[3]);
          common::ldmatrix_x4(do_addr.at(mi * 16, kk), da[0], da[1], da[2], da[3]);
#pragma unroll
          for (int np = 0; np < kSN / 2; ++np) {
            mma_16816<T>(acc_s[mi][2 * np], a, bk[np][0], bk[np][1]);
            mma_16816<T>(acc_s[mi][2 * np + 1], a, bk[np][2], bk[np][3]);
            mma_16816<T>(acc_dp[mi][2 * np], da, bv[np][0], bv[np][1]);
            mma_16816<T>(acc_dp[mi][2 * np + 1], da, bv[np][2], bv[np][3]);
          }
        }
      }
    }

    // P = exp2(S * scale_log2 - LSE_log2) with the masks; dS = P * (dP - D). Both to smem.
    // With a softcap or ALiBi, P = exp2(logit2 - LSE_log2) and dS takes the softcap's factor.
    const bool need_mask = blk.mask(p).needs_mask(m0, kBlockM, n0, kBlockN);
    const common::ScoreMod mod = common::score_mod_of(p, blk.batch, head, blk.mask(p));
    const common::WindowMask mask = blk.mask(p);  // the whole window, a left bound too
    const float sink2 = common::sink_log2_of(p, head);
    const bool modded = kGeneral && mod.active();
    if (modded) mod.prepare<kSM * kSN * 4>(&acc_s[0][0][0]);
    // The ALiBi distance of element (mi, hh, nt, e) is this base plus constants.
    const float base = mod.distance(m0 + s_r0 + g, n0 + s_c0 + 2 * t);
    // kCapOnly: a softcap alone (ScoreMod::softcap_only), the general loop's own form.
    auto scores = [&](auto cap_only) {
      constexpr bool kCapOnly = decltype(cap_only)::value;
#pragma unroll
      for (int mi = 0; mi < kSM; ++mi) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = s_r0 + mi * 16 + g + hh * 8;
          const int row = m0 + r;
          int key_lo, key_hi;  // the keys this query sees
          mask.keys_of(row, key_lo, key_hi);
          const float lse2 = s_lse2[r], dsum = s_dsum[r];
          [[maybe_unused]] const float sink_share =
              kGeneral && with_dsinks ? dsink.sink_share(sink2, lse2) : 0.0f;
#pragma unroll
          for (int nt = 0; nt < kSN; ++nt) {
            float pv[2], ds[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int c = s_c0 + nt * 8 + 2 * t + e;
              const float s = acc_s[mi][nt][hh * 2 + e];
              float dcap = 1.0f;
              float prob;
              if (kCapOnly || modded) {
                const float distance = base + static_cast<float>(mi * 16 + hh * 8 - nt * 8 - e);
                prob = mod.prob_from_prepared<kCapOnly>(s, distance, lse2, dcap);
              } else {
                prob = common::exp2_approx(fmaf(s, p.scale_log2, -lse2));
              }
              if (need_mask && mask.outside_keys(n0 + c, key_lo, key_hi)) prob = 0.0f;
              pv[e] = prob;
              ds[e] = prob * (acc_dp[mi][nt][hh * 2 + e] - dsum);
              if constexpr (kGeneral) {
                ds[e] *= dcap;
                if (with_dsinks) dsink.add(sink_share, prob, acc_dp[mi][nt][hh * 2 + e]);
              }
            }
            const int c = s_c0 + nt * 8 + 2 * t;
            *reinterpret_cast<uint32_t*>(sP + TileP::offset(r, c)) =
                common::pack2<T>(pv[0], pv[1]);
            *reinterpret_cast<uint32_t*>(sdS + TileP::offset(r, c)) =
                common::pack2<T>(ds[0], ds[1]);
          }
        }
      }
    };
    if constexpr (kGeneral) {
      common::specialize(mod.softcap_only(), scores);
    } else {
      scores(std::false_type{});
    }
    // Bulk path: this warp's add has read the other stage before the barrier, so the prefetch
    // after it may refill that stage.
    if (kBulkDq && step > 0 && lane == 0) common::bulk_wait_read();
    __syncthreads();  // P and dS complete
    if (kBulkDq && step + 1 < steps) {
      load_step(next_head, next_m_block, 1 - stage);
      common::cp_async_commit();
    }

    // dV += P^T dO and dK += dS^T Q: this warp's kKvRows keys x kKvCols of the head dim. P^T and
    // dS^T are read transposed from P and dS ([queries][keys]).
    {
      const common::LdsmAddr<TileP> pt_addr(sP, b_row, b_half, kv_r0 / 16);
      const common::LdsmAddr<TileP> dst_addr(sdS, b_row, b_half, kv_r0 / 16);
      const common::LdsmAddr<TileQ> do_addr(sdOs, a_row, a_half, kv_c0 / 16);
      const common::LdsmAddr<TileQ> q_addr(sQs, a_row, a_half, kv_c0 / 16);
#pragma unroll
      for (int km = 0; km < kBlockM / 16; ++km) {
        uint32_t a[kKvM][4], da[kKvM][4];
#pragma unroll
        for (int mi = 0; mi < kKvM; ++mi) {
          common::ldmatrix_x4_trans(pt_addr.at(km * 16, mi), a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
          common::ldmatrix_x4_trans(dst_addr.at(km * 16, mi), da[mi][0], da[mi][1], da[mi][2],
                            da[mi][3]);
        }
#pragma unroll
        for (int dp = 0; dp < kKvD / 2; ++dp) {
          uint32_t b0, b1, b2, b3;
          common::ldmatrix_x4_trans(do_addr.at(km * 16, dp), b0, b1, b2, b3);
#pragma unroll
          for (int mi = 0; mi < kKvM; ++mi) {
            mma_16816<T>(acc_dv[mi][2 * dp], a[mi], b0, b1);
            mma_16816<T>(acc_dv[mi][2 * dp + 1], a[mi], b2, b3);
          }
          common::ldmatrix_x4_trans(q_addr.at(km * 16, dp), b0, b1, b2, b3);
#pragma unroll
          for (int mi = 0; mi < kKvM; ++mi) {
            mma_16816<T>(acc_dk[mi][2 * dp], da[mi], b0, b1);
            mma_16816<T>(acc_dk[mi][2 * dp + 1], da[mi], b2, b3);
          }
        }
      }
    }

    // dQ (partial) = dS K: this warp's kDqRows queries x kDqCols of the head dim, added into the
    // fp32 accumulator (bulk path: at the next step's top, or after the loop).
    {
#pragma unroll
      for (int mi = 0; mi < kQM; ++mi)
#pragma unroll
        for (int i = 0; i < kQD; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_dq[mi][i][e] = 0.0f;
      const common::LdsmAddr<TileP> ds_addr(sdS, q_r0 + a_row, a_half);
      const common::LdsmAddr<TileKV> k_addr(sK, a_row, a_half, q_c0 / 16);
#pragma unroll
      for (int kn = 0; kn < kBlockN / 16; ++kn) {
        uint32_t a[kQM][4];
#pragma unroll
        for (int mi = 0; mi < kQM; ++mi)
          common::ldmatrix_x4(ds_addr.at(mi * 16, kn), a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
#pragma unroll
        for (int dp = 0; dp < kQD / 2; ++dp) {
          uint32_t b0, b1, b2, b3;
          common::ldmatrix_x4_trans(k_addr.at(kn * 16, dp), b0, b1, b2, b3);
#pragma unroll
          for (int mi = 0; mi < kQM; ++mi) {
            mma_16816<T>(acc_dq[mi][2 * dp], a[mi], b0, b1);
            mma_16816<T>(acc_dq[mi][2 * dp + 1], a[mi], b2, b3);
          }
        }
      }
      // Deterministic: add in this key block's turn (BwdBlock::dq_turn). Both paths branch on
      // the flag itself, not on a pointer left null without it: with the null test the d192
      // general kernel polled address 0 in non-deterministic runs (memcheck, kernel log run
      // 115), its compare seemingly reading the register before the zero that CS2R wrote.
      const bool in_turns = p.deterministic;
      int* sem = in_turns ? p.dq_semaphore + blk.dq_semaphore_index(p, head, m_block) : nullptr;
      if constexpr (kBulkDq) {
        pending_dq = stat_base * p.head_dim_padded;
        pending_sem = sem;
        if (in_turns) pending_turn = blk.dq_turn(p, m_block);
      } else {
        const int turn = in_turns ? blk.dq_turn(p, m_block) : 0;
        if (in_turns) common::wait_dq_turn(sem, turn);
        float* dq = p.dq_accum + (stat_base + q_r0) * p.head_dim_padded + q_c0;
#pragma unroll
        for (int mi = 0; mi < kQM; ++mi) {
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int r = mi * 16 + g + hh * 8;
            if (m0 + q_r0 + r < blk.seq.seqlen_q) {
#pragma unroll
              for (int dt = 0; dt < kQD; ++dt) {
                float* dst = dq + r * p.head_dim_padded + dt * 8 + 2 * t;
#if __CUDA_ARCH__ >= 900
                atomicAdd(reinterpret_cast<float2*>(dst),
                          make_float2(acc_dq[mi][dt][hh * 2], acc_dq[mi][dt][hh * 2 + 1]));
#else
                atomicAdd(dst, acc_dq[mi][dt][hh * 2]);
                atomicAdd(dst + 1, acc_dq[mi][dt][hh * 2 + 1]);
#endif
              }
            }
          }
        }
        if (in_turns) {
          __threadfence();
          common::pass_dq_turn(sem, turn);
        }
      }
    }
    if (kGeneral && with_dsinks && (next_head != head || step + 1 == steps)) {
      dsink.flush(p, blk.batch, head, blk.n0);
    }
    head = next_head;
    m_block = next_m_block;
  }
  if constexpr (kBulkDq) {
    if (steps > 0) {
      __syncthreads();  // every warp is done reading the last stage
      flush_dq((steps - 1) % 2);
      if (lane == 0) common::bulk_wait_all();  // shared memory must outlive the adds' reads
    }
  }

  // Epilogue: dK (scaled) and dV through shared memory (the K and V tiles) to global memory.
  common::cp_async_wait<0>();  // with no query block at all, K and V may still be in flight
  __syncthreads();
#pragma unroll
  for (int mi = 0; mi < kKvM; ++mi) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = kv_r0 + mi * 16 + g + hh * 8;
#pragma unroll
      for (int dt = 0; dt < kKvD; ++dt) {
        const int c = kv_c0 + dt * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(sK + TileKV::offset(r, c)) = common::pack2<T>(
            acc_dk[mi][dt][hh * 2] * p.scale, acc_dk[mi][dt][hh * 2 + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(sV + TileKV::offset(r, c)) =
            common::pack2<T>(acc_dv[mi][dt][hh * 2], acc_dv[mi][dt][hh * 2 + 1]);
      }
    }
  }
  __syncthreads();
  common::store_dkdv<TileKV, Cfg::kNThreads>(p, blk, sK, sV, tid);
}

template <class T, int kHeadDim>
cudaError_t launch_bwd(const cuda::BwdParams& p, const cuda::LaunchInfo&,
                       cudaStream_t stream) {
  using Cfg = BwdConfig<kHeadDim>;
  const auto kernel = common::needs_general(p) ? bwd_kernel<T, kHeadDim, true>
                                                : bwd_kernel<T, kHeadDim, false>;
  return common::launch_bwd_with<T>(p, stream, [stream, kernel](const cuda::BwdParams& q) {
    return common::launch_key_blocks(kernel, q, Cfg::kBlockN, Cfg::kNThreads, Cfg::kSmemBytes,
                                     stream);
  });
}

}  // namespace sm80
}  // namespace flashattn
