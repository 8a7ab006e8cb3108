// The Hopper (sm_90a) FlashAttention backward main kernel for head dim 256 (see BwdSplitConfig):
// one CTA per (key block of 64, kv head, batch), two warpgroups sharing the 64 keys. Per step of
// 64 queries, warpgroup w computes, on wgmma,
//   S^T = K Q^T and dP^T = V dO^T for its 32 queries  (both from shared memory, two groups)
//   P^T = exp2(S^T scale log2e - LSE log2e), dS^T = P^T (dP^T - D), both to shared memory
//   dV += P^T dO and dK += dS^T Q for its 128 head-dim columns   (all 64 queries)
//   dQ (partial) = dS K for its 128 head-dim columns             (all 64 keys)
// dK and dV stay in registers; the step's dQ stays there until the top of the next step, where
// it is staged in the spent Q/dO stage (after the barrier that ends every read of it) and each
// warp adds its rows with bulk reduce-adds (in its turn when deterministic, common::WarpDqTurn;
// the count read at the end of the step before). The accumulator takes the 64 x 64 tiles of
// dq_tile_offset, which the postprocess reads.
// Loads as in bwd_kernel.cuh: by TMA from one thread where the maps serve (one step ahead; the
// warpgroups meet once a step, for P^T and dS^T, and each waits at a step's top for the other
// to finish the last one), else by every thread's cp.async with a CTA barrier at each top.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/flash/params.hpp"
#include "cuda/common/bwd_scores.cuh"
#include "cuda/common/bwd_step.cuh"
#include "cuda/common/dsink.cuh"
#include "cuda/common/score_mod.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/tile.cuh"
#include "cuda/common/arch.cuh"
#include "cuda/sm90/bwd_config.cuh"
#include "cuda/sm90/bwd_loads.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/wgmma_util.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace flashattn {
namespace sm90 {

// kLoop (common::BwdLoop, chosen at launch by common::bwd_loop_of): the plain loop, the plain
// loop with ALiBi's bias and the sinks' gradient, or the general one; each compiled apart, so
// that plain attention keeps its registers and its uniform address arithmetic.
template <class T, int kHeadDim, common::BwdLoop kLoop>
__global__ void __launch_bounds__(BwdSplitConfig<kHeadDim>::kNThreads, 1)
    bwd_split_kernel(const __grid_constant__ BwdTmaArgs args) {
#ifdef FLASHATTN_SM90A_DEVICE
  const cuda::BwdParams& p = args.p;
  constexpr bool kGeneral = kLoop == common::BwdLoop::kGeneral;
  constexpr bool kBiased = kLoop == common::BwdLoop::kBiased;
  using Cfg = BwdSplitConfig<kHeadDim>;
  constexpr int kThreads = Cfg::kNThreads;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kQSplit = Cfg::kQSplit;     // 32 queries of S^T, dP^T per warpgroup
  constexpr int kDSplit = Cfg::kDSplit;     // 128 head-dim columns of dK, dV, dQ per warpgroup
  constexpr int kSAcc = kQSplit / 2;        // S^T, dP^T accumulator registers (m64 x 32)
  constexpr int kDAcc = kDSplit / 2;        // dK, dV, dQ accumulator registers (m64 x 128)
  using TileKV = typename Cfg::TileKV;
  using TileQ = typename Cfg::TileQ;
  using TileP = typename Cfg::TileP;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = common::smem_align1024(smem_raw);
  T* sK = reinterpret_cast<T*>(base);
  T* sV = reinterpret_cast<T*>(base + Cfg::kKVBytes);
  T* sQ = reinterpret_cast<T*>(base + 2 * Cfg::kKVBytes);  // stage s at sQ + 2 s TileQ::kElems
  T* sdO = sQ + TileQ::kElems;                             // stage s at sdO + 2 s TileQ::kElems
  T* sP = reinterpret_cast<T*>(base + 2 * Cfg::kKVBytes + 4 * Cfg::kQBytes);
  T* sdS = sP + TileP::kElems;
  float* sStats = reinterpret_cast<float*>(base + 2 * Cfg::kKVBytes + 4 * Cfg::kQBytes +
                                           2 * Cfg::kPBytes);  // [2 stages][LSE2, D][64]
  uint64_t* full = reinterpret_cast<uint64_t*>(base + Cfg::kOffBarriers);  // [stage], TMA only
  uint64_t* kv_full = full + 2;                                             // TMA only
  uint64_t* step_done = kv_full + 1;  // every warp's wgmmas of the step are complete (TMA only)

  const common::BwdBlock<kBlockM, kBlockN, kGeneral> blk(p);
  const int tid = threadIdx.x;
  // Through a shuffle, so that the compiler knows it is uniform and keeps the wgmma descriptors
  // built from it in uniform registers (as the main kernel's).
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  const int warp = (tid % 128) / 32;  // accumulator rows 16 warp + g (+8): keys, or queries (dQ)
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int n0 = blk.n0;
  const int steps = blk.steps;

  const bool tma = bwd_uses_tma(args);
  if (tid == 0) {
    mbar_init(full, 1);
    mbar_init(full + 1, 1);
    mbar_init(kv_full, 1);
    mbar_init(step_done, kThreads / 32);
    mbar_fence_init();
  }
  __syncthreads();
  auto load_step = [&](int head, int m_block, int stage) {
    common::load_bwd_step<TileQ, kThreads>(p, blk.batch, blk.seq, head, m_block,
                                         sQ + 2 * stage * TileQ::kElems,
                                         sdO + 2 * stage * TileQ::kElems,
                                         sStats + stage * 2 * kBlockM, tid);
  };
  // Step `stage`'s loads: one thread's TMA, or every thread's cp.async group.
  auto issue_step = [&](int head, int m_block, int stage) {
    if (tma) {
      if (tid == 0) {
        tma_load_step<TileQ>(args, full + stage, sQ + 2 * stage * TileQ::kElems,
                             sdO + 2 * stage * TileQ::kElems, sStats + stage * 2 * kBlockM,
                             blk.batch, head, m_block);
      }
    } else {
      load_step(head, m_block, stage);
    }
  };
  int head = blk.first_head(p);
  int m_block = blk.m_begin;
  if (tma) {
    if (tid == 0) tma_load_kv<TileKV>(args, kv_full, sK, sV, n0, blk.head_kv, blk.batch);
  } else {
    common::load_kv<TileKV, kThreads>(p, blk, sK, sV, tid);
  }
  if (steps > 0) issue_step(head, m_block, 0);
  common::cp_async_commit();

  float acc_dk[kDAcc];
  float acc_dv[kDAcc];
  float acc_dq[kDAcc];
#pragma unroll
  for (int i = 0; i < kDAcc; ++i) acc_dk[i] = acc_dv[i] = acc_dq[i] = 0.0f;

  const uint32_t k_addr = common::smem_u32(sK);
  const uint32_t v_addr = common::smem_u32(sV);
  const uint32_t p_addr = common::smem_u32(sP);
  const uint32_t ds_addr = common::smem_u32(sdS);
  // This warpgroup's head-dim columns start at 64-column block 2 wg of K, Q and dO tiles.
  constexpr uint32_t kColBlockKV = kBlockN * 128;  // bytes of one 64-column block
  constexpr uint32_t kColBlockQ = kBlockM * 128;
  // The step's wgmma descriptors, built once and offset per k-step (smem_desc_plus): P^T and
  // dS^T K-major as the A of dV and dK, dS^T MN-major as the A of dQ, this warpgroup's columns
  // of K, and of Q and dO in stage 0.
  constexpr uint32_t kStageBytes = 2 * TileQ::kElems * sizeof(T);  // one of Q, dO per stage
  const uint64_t p_desc = smem_desc(p_addr, 16, 1024);
  const uint64_t ds_desc = smem_desc(ds_addr, 16, 1024);
  const uint64_t ds_mn_desc = smem_desc(ds_addr, kColBlockKV, 1024);
  const uint64_t k_mn_desc = smem_desc(k_addr + 2 * wg * kColBlockKV, kColBlockKV, 1024);
  const uint64_t q_mn_desc0 =
      smem_desc(common::smem_u32(sQ) + 2 * wg * kColBlockQ, kColBlockQ, 1024);
  const uint64_t do_mn_desc0 =
      smem_desc(common::smem_u32(sdO) + 2 * wg * kColBlockQ, kColBlockQ, 1024);

  // The last step's dQ (acc_dq), and where it goes: staged in that step's Q/dO stage at the
  // top of the next step; each warp adds its 16 rows of each of its two 64-column tiles.
  // Deterministic: each warp waits for its turn alone and counts itself done once its adds are
  // complete, later in the step, before the barrier (common::WarpDqTurn).
  int64_t pending_dq = 0;  // float offset of the last step's query block in the accumulator
  int pending_sem = -1;    // deterministic: the index of its semaphore, -1 for none
  int pending_turn = 0;    // and this CTA's turn there, in warps
  int pending_seen = 0;    // and the count there, read at the end of that step
  common::WarpDqTurn turns;
  auto flush_dq = [&](int stage) {
    if (pending_sem >= 0) {
      turns.wait(p.dq_semaphore + pending_sem, pending_turn, pending_seen);
    }
    float* s_dq = reinterpret_cast<float*>(sQ + 2 * stage * TileQ::kElems);  // [tile][64][64]
    stage_dq_rows<kDSplit>(s_dq + 2 * wg * 4096 + (warp * 16 + g) * 64, acc_dq, g, t);
    common::fence_proxy_async();
    __syncwarp();
    if (lane == 0) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int off = (2 * wg + c) * 4096 + warp * 16 * 64;
        common::bulk_reduce_add_f32(p.dq_accum + pending_dq + off, s_dq + off, 16 * 64 * 4);
      }
    }
    if (pending_sem >= 0) turns.issued(pending_sem);
  };

  common::DsinkAccumulator dsink;  // this thread's share of the sinks' gradient
  const bool with_dsinks = p.dsinks != nullptr;
  const bool biased_dsinks = kBiased && with_dsinks;  // the sinks' pass of the biased loop
  if (biased_dsinks) dsink.set_head(p, head);
  if (tma) mbar_wait(kv_full, 0);
  RingSlot<2> slot;  // this step's stage and the parity of its use
  for (int step = 0; step < steps; ++step, slot.advance()) {
    const int m0 = m_block * kBlockM;
    int next_head = head;
    int next_m_block = m_block;
    blk.next(next_head, next_m_block);
    const int stage = slot.index;
    const uint32_t q_addr = common::smem_u32(sQ + 2 * stage * TileQ::kElems);
    const uint32_t do_addr = common::smem_u32(sdO + 2 * stage * TileQ::kElems);
    const float* lse2 = sStats + stage * 2 * kBlockM + wg * kQSplit;  // this warpgroup's queries
    const float* dsum = lse2 + kBlockM;

    if (tma) {
      mbar_wait(full + stage, slot.phase);  // this step's tiles landed
      // The last step's readers are done (of sP, sdS, and of the stage its dQ is staged in).
      if (step > 0) mbar_wait(step_done, (step - 1) & 1);
    } else {
      common::cp_async_wait<0>();
      common::fence_proxy_async();
      __syncthreads();  // this step's tiles landed; the last step's readers are done
    }
    if (step > 0) flush_dq(1 - stage);

    // S^T and dP^T: m64 (keys) x n32 (this warpgroup's queries), k = 256; two wgmma groups, so
    // the exponentials below run while the dP^T group is still on the tensor cores.
    float acc_s[kSAcc];
    float acc_dp[kSAcc];
#pragma unroll
    for (int i = 0; i < kSAcc; ++i) acc_s[i] = acc_dp[i] = 0.0f;
    wgmma_fence();
    const uint32_t my_rows = wg * kQSplit * 128;  // this warpgroup's queries of Q and dO
    wgmma_ss_k<T, kQSplit, kHeadDim>(acc_s, k_addr, kColBlockKV, q_addr + my_rows, kColBlockQ);
    wgmma_commit();
    wgmma_ss_k<T, kQSplit, kHeadDim>(acc_dp, v_addr, kColBlockKV, do_addr + my_rows, kColBlockQ);
    wgmma_commit();
    wgmma_wait<1>();
    fence_registers(acc_s);

    // P^T in place of S^T. Element (row, col) = (key 16 warp + g (+8), query 8 j + 2 t (+1) of
    // this warpgroup's 32). In the general loop only the softcap's tanh runs under
    // dP^T and the exponentials wait for it, so that dP^T - D takes the softcap's factor in the
    // same pass (dS^T = P^T * that).
    const common::ScoreMod mod = common::score_mod_of(p, blk.batch, head, blk.mask(p));
    const common::WindowMask mask = blk.mask(p);  // the whole window, a left bound too
    if constexpr (kGeneral) {
      mod.prepare<kQSplit / 8 * 4>(acc_s);  // the softcap's tanh under the dP^T GEMM
      wgmma_wait<0>();
      fence_registers(acc_s);
      fence_registers(acc_dp);
      // The masks in the same pass, where P is final (dsinks must see the masked P).
      common::general_scores_transposed<kQSplit / 8>(
          acc_s, acc_dp, lse2, dsum, mod, mask, mask.needs_mask(m0, kBlockM, n0, kBlockN),
          n0 + warp * 16 + g, m0 + wg * kQSplit, t, common::sink_log2_of(p, head), with_dsinks,
          dsink);
    } else {
      const int key0 = n0 + warp * 16 + g;
      const int q0 = m0 + wg * kQSplit;
      common::plain_scores_transposed<kQSplit / 8, kBiased>(
          acc_s, lse2, p.scale_log2, mod, mask, m0, kBlockM, n0, kBlockN, key0, q0, t);
      wgmma_wait<0>();
      fence_registers(acc_dp);
    }
    if (biased_dsinks) {
      common::add_dsinks_transposed<kQSplit / 8>(acc_s, acc_dp, lse2, t, dsink);
    }

    // P^T and dS^T to shared memory, [keys][queries]: TileP::offset with this thread's rows
    // (r % 8 == g) and chunk 4 wg + j of the row written out.
    const int row_off = (warp * 16 + g) * 64 + 2 * t;
#pragma unroll
    for (int j = 0; j < kQSplit / 8; ++j) {
      const int off = row_off + (((wg * (kQSplit / 8) + j) ^ g) << 3);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float p0 = acc_s[4 * j + 2 * hh], p1 = acc_s[4 * j + 2 * hh + 1];
        const float d0 = acc_dp[4 * j + 2 * hh], d1 = acc_dp[4 * j + 2 * hh + 1];
        const float ds0 = kGeneral ? p0 * d0 : p0 * (d0 - dsum[8 * j + 2 * t]);
        const float ds1 = kGeneral ? p1 * d1 : p1 * (d1 - dsum[8 * j + 2 * t + 1]);
        *reinterpret_cast<uint32_t*>(sP + off + hh * 8 * 64) = common::pack2<T>(p0, p1);
        *reinterpret_cast<uint32_t*>(sdS + off + hh * 8 * 64) = common::pack2<T>(ds0, ds1);
      }
    }
    common::fence_proxy_async();
    // This warp's dQ add has read the other stage before the barrier, so the prefetch after it
    // may refill that stage.
    if (p.deterministic) turns.pass(p.dq_semaphore);  // waits for the add's completion
    if (step > 0 && lane == 0) common::bulk_wait_read();
    __syncthreads();  // P^T and dS^T complete
    if (step + 1 < steps) issue_step(next_head, next_m_block, 1 - stage);
    common::cp_async_commit();

    // dV += P^T dO and dK += dS^T Q: m64 (keys) x n128 (this warpgroup's columns), k = 64
    // queries; A K-major from [keys][queries], B MN-major.
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      wgmma_ss_tb<T, kDSplit>(acc_dv, smem_desc_plus(p_desc, kk * 32),
                              smem_desc_plus(do_mn_desc0, stage * kStageBytes + kk * 2048), 1);
    }
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      wgmma_ss_tb<T, kDSplit>(acc_dk, smem_desc_plus(ds_desc, kk * 32),
                              smem_desc_plus(q_mn_desc0, stage * kStageBytes + kk * 2048), 1);
    }
    // dQ = dS K: m64 (queries) x n128 (this warpgroup's columns), k = 64 keys; A = dS read
    // MN-major from dS^T, B = K MN-major.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      wgmma_ss_tt<T, kDSplit>(acc_dq, smem_desc_plus(ds_mn_desc, kk * 2048),
                              smem_desc_plus(k_mn_desc, kk * 2048), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(acc_dv);
    fence_registers(acc_dk);
    fence_registers(acc_dq);
    if (tma && lane == 0) mbar_arrive(step_done);  // waited for only by the TMA loop

    const int64_t head_rows = (int64_t(blk.batch) * p.heads_q + head) * p.seqlen_q_rounded;
    pending_dq = (head_rows + m0) * p.head_dim_padded;
    pending_sem = p.deterministic ? blk.dq_semaphore_index(p, head, m_block) : -1;
    if (pending_sem >= 0) {
      pending_turn = blk.dq_turn(p, m_block) * (kThreads / 32);
      pending_seen = common::WarpDqTurn::look(p.dq_semaphore + pending_sem);
    }
    if (kLoop != common::BwdLoop::kPlain && with_dsinks &&
        (next_head != head || step + 1 == steps)) {
      dsink.flush(p, blk.batch, head, n0);
    }
    if (biased_dsinks && next_head != head) dsink.set_head(p, next_head);
    head = next_head;
    m_block = next_m_block;
  }
  if (steps > 0) {
    __syncthreads();  // every warp is done reading the last stage
    flush_dq((steps - 1) % 2);
    if (p.deterministic) turns.pass(p.dq_semaphore);
    if (lane == 0) common::bulk_wait_all();  // shared memory must outlive the adds' reads
  }

  // Epilogue: dK (scaled) and dV through shared memory (the K and V tiles) to global memory.
  common::cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = warp * 16 + g + hh * 8;
#pragma unroll
    for (int j = 0; j < kDSplit / 8; ++j) {
      const int c = wg * kDSplit + 8 * j + 2 * t;
      *reinterpret_cast<uint32_t*>(sK + TileKV::offset(r, c)) = common::pack2<T>(
          acc_dk[4 * j + 2 * hh] * p.scale, acc_dk[4 * j + 2 * hh + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(sV + TileKV::offset(r, c)) =
          common::pack2<T>(acc_dv[4 * j + 2 * hh], acc_dv[4 * j + 2 * hh + 1]);
    }
  }
  __syncthreads();
  common::store_dkdv<TileKV, kThreads>(p, blk, sK, sV, tid);
#endif
}

template <class T, int kHeadDim>
cudaError_t launch_bwd_split_main(const cuda::BwdParams& p, cudaStream_t stream) {
  const auto kernel = common::kernel_for_loop(
      p, [](auto loop) { return bwd_split_kernel<T, kHeadDim, decltype(loop)::value>; });
  using Cfg = BwdSplitConfig<kHeadDim>;
  BwdTmaArgs args{};
  args.p = p;
  args.tma = encode_bwd_maps<T>(args, Cfg::kBlockM, Cfg::kBlockN);
  return common::launch_key_blocks(kernel, p, args, Cfg::kBlockN, Cfg::kNThreads,
                                   Cfg::kSmemBytes, stream);
}

}  // namespace sm90
}  // namespace flashattn
