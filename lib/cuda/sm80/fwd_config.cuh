// Forward tile shapes per padded head dim: the one place they are chosen.
#pragma once

#include "cuda/sm80/tile.cuh"

namespace flashattn {
namespace sm80 {

template <int kHeadDim_>
struct FwdTraits;
template <> struct FwdTraits<64>  { static constexpr int kBlockM = 128, kBlockN = 64,  kNWarps = 4; };
template <> struct FwdTraits<96>  { static constexpr int kBlockM = 128, kBlockN = 64,  kNWarps = 4; };
template <> struct FwdTraits<128> { static constexpr int kBlockM = 128, kBlockN = 64,  kNWarps = 4; };
template <> struct FwdTraits<192> { static constexpr int kBlockM = 128, kBlockN = 64,  kNWarps = 8; };
template <> struct FwdTraits<256> { static constexpr int kBlockM = 128, kBlockN = 64,  kNWarps = 8; };

template <int kHeadDim_>
struct FwdConfig : FwdTraits<kHeadDim_> {
  using Base = FwdTraits<kHeadDim_>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = Base::kBlockM;
  static constexpr int kBlockN = Base::kBlockN;
  static constexpr int kNWarps = Base::kNWarps;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kRowsPerWarp = kBlockM / kNWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;  // m16 tiles per warp
  static constexpr int kNTiles = kBlockN / 8;        // n8 tiles of S
  static constexpr int kDTiles = kHeadDim / 8;       // n8 tiles of O
  static constexpr int kSmemQ = SwizzledTile<kBlockM, kHeadDim>::kElems;
  static constexpr int kSmemKV = SwizzledTile<kBlockN, kHeadDim>::kElems;
  static constexpr int kSmemBytes = (kSmemQ + 2 * kSmemKV) * 2;
  static_assert(kRowsPerWarp % 16 == 0, "each warp owns whole m16 tiles");
  static_assert(kNTiles % 2 == 0 && kDTiles % 2 == 0, "ldmatrix.x4 loads n16 at a time");
};

}  // namespace sm80
}  // namespace flashattn
