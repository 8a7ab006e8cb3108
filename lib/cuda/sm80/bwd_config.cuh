// Backward tile shapes per padded head dim: the one place they are chosen.
#pragma once

#include "cuda/sm80/tile.cuh"

namespace flashattn {
namespace sm80 {

template <int kHeadDim_>
struct BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 64;                          // query rows per step
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : 64;  // key rows per CTA
  static constexpr int kNWarps = 8;
  static constexpr int kNThreads = kNWarps * 32;
  // dK/dV warps: kKvWarpsN along the key rows (16 each) x kKvWarpsD along the head dim.
  static constexpr int kKvWarpsN = kBlockN / 16;
  static constexpr int kKvWarpsD = kNWarps / kKvWarpsN;
  static constexpr int kSmemBytes =
      (2 * SwizzledTile<kBlockN, kHeadDim>::kElems + 4 * SwizzledTile<kBlockM, kHeadDim>::kElems +
       2 * SwizzledTile<kBlockM, kBlockN>::kElems) * 2;
  static_assert(kKvWarpsN * kKvWarpsD == kNWarps, "warps tile dK/dV exactly");
  static_assert((kHeadDim / kKvWarpsD / 8) % 2 == 0 && (kHeadDim / 2 / 8) % 2 == 0,
                "ldmatrix.x4 loads n16 at a time");
};

}  // namespace sm80
}  // namespace flashattn
