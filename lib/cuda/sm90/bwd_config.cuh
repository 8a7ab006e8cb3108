// Hopper backward tile shapes per padded head dim: the one place they are chosen.
#pragma once

#include "cuda/common/dq_layout.cuh"
#include "cuda/common/tile.cuh"

namespace flashattn {
namespace sm90 {

// Two warpgroups: 128 keys per CTA, 64 per warpgroup, one CTA per SM. One warpgroup (64 keys,
// two CTAs per SM) measured slower on the H200 at head dim 128 (187 against 252 TFLOP/s at
// seqlen 4k, docs/perf/kernel-log.md): it doubles the dQ additions.
// Head dim 64 takes 128 queries per step so that a step carries as many FLOPs as a step of
// head dim 128 (the per-step softmax and synchronization are paid once per 10.5 MFLOP), and
// the warpgroups split dQ = dS K by query rows; at 96-128 they split it by head-dim columns,
// 64 each over the tiles' 128 (at 96 and 112 the columns past the head dim are the K tile's
// zero padding, so the second warpgroup's tile ends in zeros). Either way each warpgroup adds
// one 64 x 64 fp32 dQ tile per step. Head dims 96 and 112 save the GEMMs over the head dim
// (S^T, dP^T, dV, dK) the padding that running them on head dim 128 would compute.
template <int kHeadDim_>
struct BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpGroups = 2;
  static constexpr int kNThreads = 128 * kWarpGroups;
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;  // queries per step
  static constexpr int kBlockN = 64 * kWarpGroups;          // keys per CTA: 64 per warpgroup
  static constexpr bool kDqByRows = kBlockM == 128;          // how the warpgroups split dQ
  static constexpr int kDqCols = common::dq_tiled_cols(kHeadDim);  // the dQ tiles' columns
  // Deterministic mode: where a warp counts its last step's dQ add done (common::WarpDqTurn):
  // under the next step's dV wgmmas, mid-step, or at its top under S^T and dP^T. Mid-step gives
  // the add longer to complete, but a warp still waiting there holds the CTA barrier after it.
  // Measured (kernel log, run 110): mid-step d128 +2-5 %, d64 -2-4 %; why they differ is open.
  static constexpr bool kDqTurnPassMidStep = kHeadDim > 64;
  // Where a step's dK += dS^T Q is waited for: at the step's end, or at the next step's top
  // once S^T and dP^T are issued behind it, so that the tensor cores go from one to the other
  // without the loop's turn between them. The later wait keeps dS^T's 32 registers live across
  // the loop: d128 234 registers and 4 bytes of spills as before; d64 (128 queries a step)
  // spilled 376 bytes in its general loop, so it waits at the step's end. Measured at d128
  // (kernel log, run 124): causal +2.6-4.9 % at 1k-4k, not causal within noise.
  // Head dims 96 and 112 hold fewer dK and dV registers, and follow 128.
  static constexpr bool kDkUnderNextStep = kHeadDim > 64;
  using TileKV = common::SwizzledTile<kBlockN, kHeadDim>;
  using TileQ = common::SwizzledTile<kBlockM, kHeadDim>;
  using TileDS = common::SwizzledTile<kBlockN, kBlockM>;  // dS^T: [keys][queries]
  static constexpr int kKVBytes = TileKV::kElems * 2;
  static constexpr int kQBytes = TileQ::kElems * 2;
  static constexpr int kDSBytes = TileDS::kElems * 2;
  // Q, dO and their statistics are loaded kStepStages - 1 steps ahead: with one step ahead the
  // waits for the loads were 18 % of the stalls (ncu, d128 16k, kernel log run 91).
  static constexpr int kStepStages = 3;
  static constexpr int kStatsBytes = kStepStages * 2 * kBlockM * 4;  // LSE * log2(e) and D
  static constexpr int kDQBytes = 64 * 64 * 4;  // per warpgroup: the fp32 dQ tile it adds
  // [K][V][Q stages][dO stages][dS^T][dQ per warpgroup][statistics][barriers]
  static constexpr int kOffBarriers = 2 * kKVBytes + 2 * kStepStages * kQBytes + kDSBytes +
                                      kWarpGroups * kDQBytes + kStatsBytes;
  static constexpr int kBarrierBytes = 8 * (kStepStages + 2);  // stage full, K/V full, dS^T free
  static constexpr int kSmemBytes = kOffBarriers + kBarrierBytes + 1024;
  static_assert(kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 112 || kHeadDim == 128,
                "the Hopper backward's head dims");
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0 && kDSBytes % 1024 == 0,
                "1024-byte aligned tiles");
  static_assert((kDqByRows ? kBlockM : kDqCols) == 64 * kWarpGroups,
                "one 64 x 64 dQ tile per warpgroup");
  static_assert(kSmemBytes <= 227 * 1024, "fits the SM's shared memory");
};

// Head dim 256 (bwd_split_kernel.cuh): dK and dV of 64 keys x 256 do not fit one warpgroup's
// registers, so the two warpgroups share 64 keys and split the head dim (128 columns of dK, dV
// and dQ each) and the step's 64 queries for S^T and dP^T (32 each). P^T and dS^T go through
// shared memory. A step's fp32 dQ tile (64 x 256) is staged in the spent Q/dO stage, which is
// exactly its size, as in the sm80 kernel.
template <int kHeadDim_>
struct BwdSplitConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpGroups = 2;
  static constexpr int kNThreads = 128 * kWarpGroups;
  static constexpr int kBlockM = 64;  // queries per step
  static constexpr int kBlockN = 64;  // keys per CTA
  static constexpr int kDSplit = kHeadDim / kWarpGroups;  // dK, dV, dQ columns per warpgroup
  static constexpr int kQSplit = kBlockM / kWarpGroups;   // S^T, dP^T queries per warpgroup
  using TileKV = common::SwizzledTile<kBlockN, kHeadDim>;
  using TileQ = common::SwizzledTile<kBlockM, kHeadDim>;
  using TileP = common::SwizzledTile<kBlockN, kBlockM>;  // P^T and dS^T: [keys][queries]
  static constexpr int kKVBytes = TileKV::kElems * 2;
  static constexpr int kQBytes = TileQ::kElems * 2;
  static constexpr int kPBytes = TileP::kElems * 2;
  static constexpr int kStatsBytes = 2 * 2 * kBlockM * 4;  // 2 stages of LSE * log2(e) and D
  // [K][V][stage 0: Q, dO][stage 1: Q, dO][P^T][dS^T][statistics][barriers]
  static constexpr int kOffBarriers = 2 * kKVBytes + 4 * kQBytes + 2 * kPBytes + kStatsBytes;
  static constexpr int kBarrierBytes = 8 * 4;  // 2 stages full, K/V full, step done
  static constexpr int kSmemBytes = kOffBarriers + kBarrierBytes + 1024;
  static_assert(kHeadDim == 256 && kDSplit == 128 && kQSplit == 32, "head dim 256");
  static_assert(2 * kQBytes == kBlockM * kHeadDim * 4, "a Q/dO stage holds the fp32 dQ tile");
  static_assert(kSmemBytes <= 227 * 1024, "fits the SM's shared memory");
};

// The shared memory of the Hopper backward's kernel for a head dim of the kernel table's row
// (lib/cuda/generate.py: 64-128 in bwd_kernel.cuh, 256 in bwd_split_kernel.cuh).
template <int kHeadDim>
constexpr int bwd_smem_bytes() {
  if constexpr (kHeadDim == 256) {
    return BwdSplitConfig<256>::kSmemBytes;
  } else {
    return BwdConfig<kHeadDim>::kSmemBytes;
  }
}

}  // namespace sm90
}  // namespace flashattn
