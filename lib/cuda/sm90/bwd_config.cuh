// Hopper backward tile shapes per padded head dim: the one place they are chosen.
#pragma once

#include "cuda/sm80/tile.cuh"

namespace flashattn {
namespace sm90 {

// Two warpgroups: 128 keys per CTA, one CTA per SM. One warpgroup (64 keys, two CTAs per SM)
// measured slower on the H200 at head dim 128 (187 against 252 TFLOP/s at seqlen 4k,
// docs/perf/kernel-log.md): it doubles the dQ additions. Head dim 128 only.
template <int kHeadDim_, int kWarpGroups_>
struct BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpGroups = kWarpGroups_;
  static constexpr int kNThreads = 128 * kWarpGroups;
  static constexpr int kBlockM = 64;                 // queries per step
  static constexpr int kBlockN = 64 * kWarpGroups;  // keys per CTA: 64 per warpgroup
  using TileKV = sm80::SwizzledTile<kBlockN, kHeadDim>;
  using TileQ = sm80::SwizzledTile<kBlockM, kHeadDim>;
  using TileDS = sm80::SwizzledTile<kBlockN, kBlockM>;  // dS^T: [keys][queries]
  // dQ = dS K: the warpgroups split the head dim, one 64-column block each.
  static constexpr int kDqN = kHeadDim / 2;
  static constexpr int kKVBytes = TileKV::kElems * 2;
  static constexpr int kQBytes = TileQ::kElems * 2;
  static constexpr int kDSBytes = TileDS::kElems * 2;
  static constexpr int kStatsBytes = 2 * 128 * 4;
  static constexpr int kDQBytes = 64 * 64 * 4;  // per warpgroup: the fp32 dQ tile it adds
  static constexpr int kSmemBytes =
      2 * kKVBytes + 4 * kQBytes + kDSBytes + kWarpGroups * kDQBytes + kStatsBytes + 1024;
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0 && kDSBytes % 1024 == 0,
                "1024-byte aligned tiles");
  static_assert(kWarpGroups == 2 && kDqN == 64, "one 64 x 64 dQ tile per warpgroup");
};

}  // namespace sm90
}  // namespace flashattn
