// Hopper forward tile shapes per padded head dim: the one place they are chosen.
#pragma once

#include "cuda/sm80/tile.cuh"

namespace flashattn {
namespace sm90 {

using sm80::SwizzledTile;

template <int kHeadDim_>
struct FwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 64;                          // one warpgroup, m64
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : 64;  // keys per tile
  static constexpr int kNThreads = 128;
  using TileQ = SwizzledTile<kBlockM, kHeadDim>;
  using TileKV = SwizzledTile<kBlockN, kHeadDim>;
  // Tiles start on 1024-byte boundaries (the swizzle atom): the descriptors' base offset is 0.
  static constexpr int kQBytes = TileQ::kElems * 2;
  static constexpr int kKVBytes = TileKV::kElems * 2;
  static constexpr int kSmemBytes = kQBytes + 2 * kKVBytes + 1024;  // + alignment slack
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "1024-byte aligned tiles");
};

}  // namespace sm90
}  // namespace flashattn
