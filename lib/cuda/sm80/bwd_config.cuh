// Backward tile shapes and warp layouts per padded head dim: the one place they are chosen.
#pragma once

#include "cuda/common/tile.cuh"

namespace flashattn {
namespace sm80 {

// Eight warps. Each of the three GEMM phases of a step tiles its output with its own warp grid,
// chosen so that the warps' ldmatrix reads of their operands (shared memory is the limit of this
// kernel) are few: square-ish warp tiles of 32 x 32 or more rather than thin 16-row strips.
//   S, dP  (kBlockM x kBlockN):  kSdpWarpsM x (8 / kSdpWarpsM)
//   dK, dV (kBlockN x head dim): kKvWarpsN  x (8 / kKvWarpsN)
//   dQ     (kBlockM x head dim): kDqWarpsM  x (8 / kDqWarpsM)
template <int kHeadDim_>
struct BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kHeadDim <= 64 ? 128 : 64;   // query rows per step
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : 64;  // key rows per CTA
  static constexpr int kNWarps = 8;
  static constexpr int kNThreads = kNWarps * 32;

  static constexpr int kSdpWarpsM = kHeadDim <= 128 ? 2 : 4;
  static constexpr int kSdpWarpsN = kNWarps / kSdpWarpsM;
  static constexpr int kSdpRows = kBlockM / kSdpWarpsM;
  static constexpr int kSdpCols = kBlockN / kSdpWarpsN;

  static constexpr int kKvWarpsN = kHeadDim <= 128 ? 4 : 2;
  static constexpr int kKvWarpsD = kNWarps / kKvWarpsN;
  static constexpr int kKvRows = kBlockN / kKvWarpsN;
  static constexpr int kKvCols = kHeadDim / kKvWarpsD;

  static constexpr int kDqWarpsM = (kHeadDim == 64 || kHeadDim == 96) ? 4 : 2;
  static constexpr int kDqWarpsD = kNWarps / kDqWarpsM;
  static constexpr int kDqRows = kBlockM / kDqWarpsM;
  static constexpr int kDqCols = kHeadDim / kDqWarpsD;

  static constexpr int kSmemBytes =
      (2 * common::SwizzledTile<kBlockN, kHeadDim>::kElems + 4 * common::SwizzledTile<kBlockM, kHeadDim>::kElems +
       2 * common::SwizzledTile<kBlockM, kBlockN>::kElems) * 2 +
      2 * 2 * kBlockM * 4;  // two stages of the rows' LSE * log2(e) and D

  // ldmatrix.x4 reads 16 rows (A) or 16 columns (B) at a time.
  static_assert(kSdpRows % 16 == 0 && kSdpCols % 16 == 0, "S/dP warp tile of 16s");
  static_assert(kKvRows % 16 == 0 && kKvCols % 16 == 0, "dK/dV warp tile of 16s");
  static_assert(kDqRows % 16 == 0 && kDqCols % 16 == 0, "dQ warp tile of 16s");
  static_assert(kBlockM <= 128, "the workspace rounds query rows to 128");
};

}  // namespace sm80
}  // namespace flashattn
