// The Hopper (sm_90a) FlashAttention backward main kernel; the preprocess and postprocess
// launches are the sm80 ones (same workspace). One CTA per (key block of 128, kv head, batch):
// two warpgroups, each owning 64 keys with their dK and dV in registers. Per step of kBlockM
// queries each warpgroup computes, on wgmma,
//   S^T = K Q^T and dP^T = V dO^T        (both operands from shared memory, two wgmma groups)
//   P^T = exp2(S^T scale log2e - LSE log2e)   (while the dP^T group still runs)
//   dS^T = P^T (dP^T - D)                (in registers)
//   dV += P^T dO and dK += dS^T Q        (A straight from the registers, B MN-major)
//   dQ (partial) = dS K                  (dS^T through shared memory, both operands MN-major)
// and adds its 64 x 64 fp32 dQ tile into the accumulator: each warp its own 16 rows, with one
// bulk reduce-add from shared memory, so no barrier of the warpgroup is needed. Deterministic:
// each warp waits for its turn alone (descending key blocks; the count read early in the step)
// and counts itself done once its add is complete, in the next step under its first wgmmas or
// its dV wgmmas (BwdConfig::kDqTurnPassMidStep), so that no step waits for its own add
// (common::WarpDqTurn). The sm90 accumulator is stored in tiles (see dq_tile_offset), which its
// own postprocess reads.
// Loads: K and V once; Q, dO, LSE*log2(e) and D of each step two steps ahead, in a ring of
// kStepStages. Where the tensor maps describe the inputs, one thread issues them all by TMA
// and bulk copy, completing on the stage's mbarrier, and the warpgroups meet once a step (dS^T
// in place for dQ); otherwise (a packed batch, or strides TMA cannot take) every thread loads
// its share by cp.async and the CTA also meets at each step's top.
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
__global__ void __launch_bounds__(BwdConfig<kHeadDim>::kNThreads, 1)
    bwd_kernel(const __grid_constant__ BwdTmaArgs args) {
#ifdef FLASHATTN_SM90A_DEVICE
  const cuda::BwdParams& p = args.p;
  constexpr bool kGeneral = kLoop == common::BwdLoop::kGeneral;
  constexpr bool kBiased = kLoop == common::BwdLoop::kBiased;
  using Cfg = BwdConfig<kHeadDim>;
  constexpr int kThreads = Cfg::kNThreads;
  constexpr int kBlockM = Cfg::kBlockM;  // queries per step
  constexpr int kBlockN = Cfg::kBlockN;  // 128 keys per CTA, 64 per warpgroup
  constexpr int kDAcc = kHeadDim / 2;    // dK, dV accumulator registers (m64 x head_dim)
  constexpr int kSAcc = kBlockM / 2;     // S^T, dP^T accumulator registers (m64 x kBlockM)
  constexpr int kQSteps = kBlockM / 16;  // k16 steps over the queries
  using TileKV = typename Cfg::TileKV;
  using TileQ = typename Cfg::TileQ;
  using TileDS = typename Cfg::TileDS;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = common::smem_align1024(smem_raw);
  T* sK = reinterpret_cast<T*>(base);
  T* sV = reinterpret_cast<T*>(base + Cfg::kKVBytes);
  constexpr int kStages = Cfg::kStepStages;
  constexpr int kStepBytes = kStages * Cfg::kQBytes;  // one of Q, dO over all stages
  T* sQ = reinterpret_cast<T*>(base + 2 * Cfg::kKVBytes);
  T* sdO = reinterpret_cast<T*>(base + 2 * Cfg::kKVBytes + kStepBytes);
  T* sdS = reinterpret_cast<T*>(base + 2 * Cfg::kKVBytes + 2 * kStepBytes);
  float* sDQ = reinterpret_cast<float*>(base + 2 * Cfg::kKVBytes + 2 * kStepBytes +
                                        Cfg::kDSBytes);  // [warpgroup][64 x 64], swizzled
  float* sStats = reinterpret_cast<float*>(base + 2 * Cfg::kKVBytes + 2 * kStepBytes +
                                           Cfg::kDSBytes + Cfg::kWarpGroups * Cfg::kDQBytes);
  // [stage][LSE * log2(e), D][kBlockM]
  uint64_t* full = reinterpret_cast<uint64_t*>(base + Cfg::kOffBarriers);  // [stage], TMA only
  uint64_t* kv_full = full + kStages;                                       // TMA only
  uint64_t* ds_free = kv_full + 1;  // every warp's dQ = dS K of the step has read sdS

  const common::BwdBlock<kBlockM, kBlockN, kGeneral> blk(p);
  const int tid = threadIdx.x;
  // Warpgroup: keys [64 wg, 64 wg + 64) of the block. Read through a shuffle, so that the
  // compiler knows it is uniform and builds the wgmma descriptors in uniform registers (from
  // tid / 128 it built the K and V ones in ordinary registers and moved them over, ~6
  // instructions a wgmma).
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  const int warp = (tid % 128) / 32;  // warp within the warpgroup: accumulator rows 16 warp..
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int n0 = blk.n0;
  const int steps = blk.steps;

  const bool tma = bwd_uses_tma(args);
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) mbar_init(full + s, 1);
    mbar_init(kv_full, 1);
    mbar_init(ds_free, kThreads / 32);
    mbar_fence_init();
  }
  __syncthreads();

  auto tma_step = [&](int head, int m_block, int stage) {
    tma_load_step<TileQ>(args, full + stage, sQ + stage * TileQ::kElems,
                         sdO + stage * TileQ::kElems, sStats + stage * 2 * kBlockM, blk.batch,
                         head, m_block);
  };
  auto load_step = [&](int head, int m_block, int stage) {
    common::load_bwd_step<TileQ, kThreads>(p, blk.batch, blk.seq, head, m_block,
                                           sQ + stage * TileQ::kElems,
                                           sdO + stage * TileQ::kElems,
                                           sStats + stage * 2 * kBlockM, tid);
  };
  int head = blk.first_head(p);
  int m_block = blk.m_begin;
  int ahead_head = head, ahead_m_block = m_block;  // the next step to load
  if (tma) {
    if (tid == 0) tma_load_kv<TileKV>(args, kv_full, sK, sV, n0, blk.head_kv, blk.batch);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < steps) {
        if (tid == 0) tma_step(ahead_head, ahead_m_block, s);
        blk.next(ahead_head, ahead_m_block);
      }
    }
  } else {
    common::load_kv<TileKV, kThreads>(p, blk, sK, sV, tid);
    // The first kStages - 1 steps' loads, one cp.async group each (empty past the last step),
    // so that the group of step s is always the (kStages - 1)-th newest at its top.
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < steps) {
        load_step(ahead_head, ahead_m_block, s);
        blk.next(ahead_head, ahead_m_block);
      }
      common::cp_async_commit();
    }
  }

  float acc_dk[kDAcc];
  float acc_dv[kDAcc];
#pragma unroll
  for (int i = 0; i < kDAcc; ++i) acc_dk[i] = acc_dv[i] = 0.0f;

  const uint32_t k_addr = common::smem_u32(sK) + wg * 64 * 128;  // this warpgroup's 64 key rows
  const uint32_t v_addr = common::smem_u32(sV) + wg * 64 * 128;
  // dQ = dS K operands of this warpgroup: its 64 queries (a 64-column block of dS^T) and all
  // of K, or all queries and its 64-column block of K.
  const uint32_t dq_a_addr = common::smem_u32(sdS) + (Cfg::kDqByRows ? wg * kBlockN * 128 : 0);
  const uint32_t dq_b_addr = common::smem_u32(sK) + (Cfg::kDqByRows ? 0 : wg * kBlockN * 128);
  const uint64_t dq_a_desc = smem_desc(dq_a_addr, kBlockN * 128, 1024);
  const uint64_t dq_b_desc = smem_desc(dq_b_addr, kBlockN * 128, 1024);
  float* warp_dq = sDQ + wg * 64 * 64 + warp * 16 * 64;  // this warp's 16 rows of the tile

  common::WarpDqTurn turns;  // deterministic: this warp's turns at the query blocks' semaphores
  common::DsinkAccumulator dsink;  // this thread's share of the sinks' gradient
  const bool with_dsinks = p.dsinks != nullptr;
  const bool biased_dsinks = kBiased && with_dsinks;  // the sinks' pass of the biased loop
  if (biased_dsinks) dsink.set_head(p, head);
  if (tma) mbar_wait(kv_full, 0);
  RingSlot<kStages> slot;  // this step's stage and the parity of its use
  for (int step = 0; step < steps; ++step, slot.advance()) {
    const int m0 = m_block * kBlockM;
    int next_head = head;
    int next_m_block = m_block;
    blk.next(next_head, next_m_block);
    const int stage = slot.index;
    const uint32_t q_addr = common::smem_u32(sQ + stage * TileQ::kElems);
    const uint32_t do_addr = common::smem_u32(sdO + stage * TileQ::kElems);
    // As MN-major B operands of dV += P^T dO and dK += dS^T Q.
    const uint64_t q_desc = smem_desc(q_addr, kBlockM * 128, 1024);
    const uint64_t do_desc = smem_desc(do_addr, kBlockM * 128, 1024);
    const float* lse2 = sStats + stage * 2 * kBlockM;
    const float* dsum = lse2 + kBlockM;

    if (tma) {
      mbar_wait(full + stage, slot.phase);
    } else {
      common::cp_async_wait<kStages - 2>();
      common::fence_proxy_async();
      // This step's tiles landed; the last step is done with the stage loaded next.
      __syncthreads();
      if (step + kStages - 1 < steps) {
        load_step(ahead_head, ahead_m_block, (stage + kStages - 1) % kStages);
        blk.next(ahead_head, ahead_m_block);
      }
      common::cp_async_commit();
    }

    // S^T and dP^T: m64 (this warpgroup's keys) x kBlockM (queries), k = head_dim, as two
    // wgmma groups: the exponentials below run while the dP^T group is still on the tensor cores.
    float acc_s[kSAcc];
    float acc_dp[kSAcc];
    // The first k16 step of each GEMM overwrites them; where the last step's dK still runs,
    // plain code writing them would serialize every wgmma (C7515). (Zeroed elsewhere: d64's
    // general loop spills 412 bytes without it.)
    if constexpr (!Cfg::kDkUnderNextStep) {
#pragma unroll
      for (int i = 0; i < kSAcc; ++i) acc_s[i] = acc_dp[i] = 0.0f;
    }
    wgmma_fence();
    wgmma_ss_k<T, kBlockM, kHeadDim>(acc_s, k_addr, kBlockN * 128, q_addr, kBlockM * 128);
    wgmma_commit();
    wgmma_ss_k<T, kBlockM, kHeadDim>(acc_dp, v_addr, kBlockN * 128, do_addr, kBlockM * 128);
    wgmma_commit();
    if constexpr (Cfg::kDkUnderNextStep) {
      // The last step's dK += dS^T Q, issued under its dQ add, ran on until here: its operand
      // registers (dst) are rewritten below.
      wgmma_wait<2>();
      fence_registers(acc_dk);
    }
    if (!Cfg::kDqTurnPassMidStep && p.deterministic) turns.pass(p.dq_semaphore);  // under S^T's
    // Deterministic: the count of this step's semaphore, read while the step computes.
    const int seen =
        p.deterministic ? turns.look(p.dq_semaphore + blk.dq_semaphore_index(p, head, m_block))
                        : 0;
    wgmma_wait<1>();
    fence_registers(acc_s);

    // P^T in place of S^T (fp32). Accumulator element (row, col) = (key, query): rows
    // 16 warp + g (+8), columns 8 j + 2 t (+1). In the plain loop the exponentials run while
    // the dP^T group is still on the tensor cores; in the general one only the softcap's tanh
    // does, the exponentials after it, so that dP^T - D takes the softcap's factor in the same
    // pass (dS^T = P^T * that).
    uint32_t pt[kQSteps][4];   // P^T as the A operand of dV += P^T dO: k16 steps over queries
    uint32_t dst[kQSteps][4];  // dS^T likewise for dK += dS^T Q
    const common::ScoreMod mod = common::score_mod_of(p, blk.batch, head, blk.mask(p));
    const common::WindowMask mask = blk.mask(p);  // the whole window, a left bound too
    if constexpr (kGeneral) {
      mod.prepare<kBlockM / 8 * 4>(acc_s);  // the softcap's tanh under the dP^T GEMM
      wgmma_wait<0>();
      fence_registers(acc_s);
      fence_registers(acc_dp);
      // The masks in the same pass, where P is final (dsinks must see the masked P).
      common::general_scores_transposed<kBlockM / 8>(
          acc_s, acc_dp, lse2, dsum, mod, mask, mask.needs_mask(m0, kBlockM, n0, kBlockN),
          n0 + wg * 64 + warp * 16 + g, m0, t, common::sink_log2_of(p, head), with_dsinks, dsink);
    } else {
      const int key0 = n0 + wg * 64 + warp * 16 + g;
      common::plain_scores_transposed<kBlockM / 8, kBiased>(
          acc_s, lse2, p.scale_log2, mod, mask, m0, kBlockM, n0, kBlockN, key0, m0, t);
      wgmma_wait<0>();
      fence_registers(acc_dp);
    }
    if (biased_dsinks) {
      common::add_dsinks_transposed<kBlockM / 8>(acc_s, acc_dp, lse2, t, dsink);
    }

#pragma unroll
    for (int j = 0; j < kBlockM / 8; ++j) {
      float dv[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * j + 2 * t + (e % 2);
        dv[e] = kGeneral ? acc_s[4 * j + e] * acc_dp[4 * j + e]
                     : acc_s[4 * j + e] * (acc_dp[4 * j + e] - dsum[col]);
      }
      // Columns 8j..8j+7 are half of k16 step j / 2: registers {0,1} of the step for even j,
      // {2,3} for odd j.
      pt[j / 2][(j % 2) * 2 + 0] = common::pack2<T>(acc_s[4 * j + 0], acc_s[4 * j + 1]);
      pt[j / 2][(j % 2) * 2 + 1] = common::pack2<T>(acc_s[4 * j + 2], acc_s[4 * j + 3]);
      dst[j / 2][(j % 2) * 2 + 0] = common::pack2<T>(dv[0], dv[1]);
      dst[j / 2][(j % 2) * 2 + 1] = common::pack2<T>(dv[2], dv[3]);
    }

    // dS^T to shared memory, [keys][queries], for dQ = dS K (before the wgmmas below take
    // these registers as operands: in-flight operand registers must not be touched). The
    // swizzle of TileDS::offset written out: this thread's rows all have r % 8 == g, so the
    // 16-byte chunk j of a 64-column block lands at chunk j ^ g, one XOR per j; the rest of the
    // offset is the row base and immediates. Both warpgroups' dQ of the last step must have
    // read sdS first.
    if (step > 0) mbar_wait(ds_free, (step - 1) & 1);
    {
      T* ds_row = sdS + (wg * 64 + warp * 16 + g) * 64 + 2 * t;
#pragma unroll
      for (int jl = 0; jl < 8; ++jl) {
        const int chunk = ((jl ^ g) << 3);
#pragma unroll
        for (int jh = 0; jh < kBlockM / 64; ++jh) {
          const int j = jh * 8 + jl;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            *reinterpret_cast<uint32_t*>(ds_row + jh * kBlockN * 64 + hh * 8 * 64 + chunk) =
                dst[j / 2][(j % 2) * 2 + hh];
          }
        }
      }
    }
    common::fence_proxy_async();

    // dV += P^T dO: B = dO MN-major (rows = queries = k, head_dim = n).
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk) {
      wgmma_rs<T, kHeadDim>(acc_dv, pt[kk], smem_desc_plus(do_desc, kk * 2048), 1);
    }
    wgmma_commit();
    if (Cfg::kDqTurnPassMidStep && p.deterministic) turns.pass(p.dq_semaphore);  // under dV's
    // Both warpgroups' dS^T rows are in place; both are done with the last step, so its stage
    // takes the loads of the step kStages - 1 ahead.
    __syncthreads();
    if (tma && step + kStages - 1 < steps) {
      if (tid == 0) tma_step(ahead_head, ahead_m_block, (stage + kStages - 1) % kStages);
      blk.next(ahead_head, ahead_m_block);
    }

    // dQ = dS K over all 128 keys: A = dS (queries x keys) read MN-major from dS^T, B = K
    // MN-major; this warpgroup's 64 x 64 part (see dq_a_addr, dq_b_addr).
    float acc_dq[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc_dq[i] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      wgmma_ss_tt<T, 64>(acc_dq, smem_desc_plus(dq_a_desc, kk * 2048),
                         smem_desc_plus(dq_b_desc, kk * 2048), kk > 0);
    }
    wgmma_commit();
    // dK += dS^T Q (B = Q MN-major) after dQ, so that it runs while dQ goes out below.
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk) {
      wgmma_rs<T, kHeadDim>(acc_dk, dst[kk],
                            smem_desc_plus(q_desc, kk * 2048), 1);
    }
    wgmma_commit();
    wgmma_wait<1>();  // dV and dQ are complete
    fence_registers(acc_dq);
    if (lane == 0) mbar_arrive(ds_free);

    // The warp's 16 rows of the dQ tile to shared memory (the layout of the accumulator's
    // tiles), then one bulk add of them. Deterministic: in this warp's turn.
    if (p.deterministic) {
      const int sem = blk.dq_semaphore_index(p, head, m_block);
      turns.wait(p.dq_semaphore + sem, blk.dq_turn(p, m_block) * (kThreads / 32), seen);
      turns.issued(sem);
    }
    if (lane == 0) common::bulk_wait_read();  // the last step's add has finished reading warp_dq
    __syncwarp();
    stage_dq_rows<64>(warp_dq + g * 64, acc_dq, g, t);
    common::fence_proxy_async();
    __syncwarp();
    if (lane == 0) {
      // The warpgroup's tile: queries m0 + 64 wg (split by rows) or its 64-column block (split
      // by columns); either way 64 * 64 floats past the step's first row.
      const int64_t head_rows = (int64_t(blk.batch) * p.heads_q + head) * p.seqlen_q_rounded;
      float* dst_tile = p.dq_accum + (head_rows + m0) * p.head_dim_padded + wg * 64 * 64;
      common::bulk_reduce_add_f32(dst_tile + warp * 16 * 64, warp_dq, 16 * 64 * 4);
    }
    if (kLoop != common::BwdLoop::kPlain && with_dsinks &&
        (next_head != head || step + 1 == steps)) {
      dsink.flush(p, blk.batch, head, n0);
    }
    if (biased_dsinks && next_head != head) dsink.set_head(p, next_head);
    head = next_head;
    m_block = next_m_block;
    if constexpr (!Cfg::kDkUnderNextStep) {
      wgmma_wait<0>();  // dK, before the next step's dS^T takes its operand registers
      fence_registers(acc_dk);
    }
  }
  if constexpr (Cfg::kDkUnderNextStep) {
    wgmma_wait<0>();  // the last step's dK
    fence_registers(acc_dk);
  }
  if (p.deterministic) turns.pass(p.dq_semaphore);  // the last step's add
  if (lane == 0) common::bulk_wait_all();  // shared memory stays until the adds have read it

  // Epilogue: dK (scaled) and dV through shared memory (the K and V tiles).
  common::cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = wg * 64 + warp * 16 + g + hh * 8;
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const int c = 8 * j + 2 * t;
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
cudaError_t launch_bwd_main(const cuda::BwdParams& p, cudaStream_t stream) {
  const auto kernel = common::kernel_for_loop(
      p, [](auto loop) { return bwd_kernel<T, kHeadDim, decltype(loop)::value>; });
  using Cfg = BwdConfig<kHeadDim>;
  BwdTmaArgs args{};
  args.p = p;
  args.tma = encode_bwd_maps<T>(args, Cfg::kBlockM, Cfg::kBlockN);
  return common::launch_key_blocks(kernel, p, args, Cfg::kBlockN, Cfg::kNThreads,
                                   Cfg::kSmemBytes, stream);
}

}  // namespace sm90
}  // namespace flashattn
