// Hopper backward tile shapes per padded head dim: the one place they are chosen.
#pragma once

#include "cuda/sm80/tile.cuh"

namespace flashattn {
namespace sm90 {

// Two warpgroups: 128 keys per CTA, 64 per warpgroup, one CTA per SM. One warpgroup (64 keys,
// two CTAs per SM) measured slower on the H200 at head dim 128 (187 against 252 TFLOP/s at
// seqlen 4k, docs/perf/kernel-log.md): it doubles the dQ additions.
// Head dim 64 takes 128 queries per step so that a step carries as many FLOPs as a step of
// head dim 128 (the per-step softmax and synchronization are paid once per 10.5 MFLOP), and
// the warpgroups split dQ = dS K by query rows; at 128 they split it by head-dim columns. Either
// way each warpgroup adds one 64 x 64 fp32 dQ tile per step.
template <int kHeadDim_>
struct BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpGroups = 2;
  static constexpr int kNThreads = 128 * kWarpGroups;
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;  // queries per step
  static constexpr int kBlockN = 64 * kWarpGroups;          // keys per CTA: 64 per warpgroup
  static constexpr bool kDqByRows = kBlockM == 128;          // how the warpgroups split dQ
  using TileKV = sm80::SwizzledTile<kBlockN, kHeadDim>;
  using TileQ = sm80::SwizzledTile<kBlockM, kHeadDim>;
  using TileDS = sm80::SwizzledTile<kBlockN, kBlockM>;  // dS^T: [keys][queries]
  static constexpr int kKVBytes = TileKV::kElems * 2;
  static constexpr int kQBytes = TileQ::kElems * 2;
  static constexpr int kDSBytes = TileDS::kElems * 2;
  static constexpr int kStatsBytes = 2 * 2 * kBlockM * 4;  // 2 stages of LSE * log2(e) and D
  static constexpr int kDQBytes = 64 * 64 * 4;  // per warpgroup: the fp32 dQ tile it adds
  static constexpr int kSmemBytes =
      2 * kKVBytes + 4 * kQBytes + kDSBytes + kWarpGroups * kDQBytes + kStatsBytes + 1024;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "the Hopper backward's head dims");
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0 && kDSBytes % 1024 == 0,
                "1024-byte aligned tiles");
  static_assert((kDqByRows ? kBlockM : kHeadDim) == 64 * kWarpGroups,
                "one 64 x 64 dQ tile per warpgroup");
};

}  // namespace sm90
}  // namespace flashattn
