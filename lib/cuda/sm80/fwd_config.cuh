// The sm80 forward CTA per padded head dim (tile shapes from the kernel table,
// lib/cuda/generate.py) and what they imply.
#pragma once

#include "cuda/common/tile.cuh"

namespace flashattn {
namespace sm80 {

#include "cuda/sm80/fwd_tiles.inc"

template <int kHeadDim_>
struct FwdConfig {
  using Base = FwdTiles<kHeadDim_>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = Base::kBlockM;
  static constexpr int kBlockN = Base::kBlockN;
  static constexpr int kNWarps = Base::kNWarps;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kRowsPerWarp = kBlockM / kNWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;  // m16 tiles per warp
  static constexpr int kNTiles = kBlockN / 8;        // n8 tiles of S
  static constexpr int kDTiles = kHeadDim / 8;       // n8 tiles of O
  static constexpr int kSmemQ = common::SwizzledTile<kBlockM, kHeadDim>::kElems;
  static constexpr int kSmemKV = common::SwizzledTile<kBlockN, kHeadDim>::kElems;
  static constexpr int kSmemBytes = (kSmemQ + 2 * kSmemKV) * 2;
  static_assert(kRowsPerWarp % 16 == 0, "each warp owns whole m16 tiles");
  static_assert(kNTiles % 2 == 0 && kDTiles % 2 == 0, "ldmatrix.x4 loads n16 at a time");
};

}  // namespace sm80
}  // namespace flashattn
