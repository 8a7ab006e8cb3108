// The forward's last step, shared by every kernel: the normalized output of an accumulator
// fragment into a swizzled shared tile (from which it is stored with 16-byte or bulk copies),
// the LSE of the thread's rows, and the output of a query block no key is visible to.
// A row that saw no key writes exactly 0 whatever its accumulator holds (0 * inf would be NaN).
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"

namespace flashattn {
namespace common {

// acc: kMTiles x kDTiles m16n8 tiles (rows row0 + 16 mt + 8 hh, columns 8 dt + 2 t (+1)); inv:
// the per-row factor from OnlineSoftmax::finalize.
template <class T, class Tile, int kMTiles, int kDTiles>
__device__ __forceinline__ void write_o_fragment(T* smem, const float (&acc)[kMTiles * kDTiles * 4],
                                                 const float (&inv)[2 * kMTiles], int row0,
                                                 int t) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float f = inv[2 * mt + hh];
      const int r = row0 + 16 * mt + 8 * hh;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const int i = (mt * kDTiles + dt) * 4 + 2 * hh;
        const float lo = f == 0.0f ? 0.0f : acc[i] * f;
        const float hi = f == 0.0f ? 0.0f : acc[i + 1] * f;
        *reinterpret_cast<uint32_t*>(smem + Tile::offset(r, dt * 8 + 2 * t)) = pack2<T>(lo, hi);
      }
    }
}

// The LSE of the thread's rows (row0 + 16 mt + 8 hh, relative to lse_rows) by one lane of each
// quad; rows at or past `rows` are padding.
template <int kMTiles>
__device__ __forceinline__ void write_lse(float* lse_rows, int64_t row_stride,
                                          const float (&lse)[2 * kMTiles], int row0, int rows,
                                          int t) {
  if (lse_rows == nullptr || t != 0) return;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = row0 + 16 * mt + 8 * hh;
      if (r < rows) lse_rows[int64_t(r) * row_stride] = lse[2 * mt + hh];
    }
}

// Output 0 and LSE -inf for the rows of a query block that no key is visible to.
template <class T, int kBlockM, int kHeadDim, int kThreads>
__device__ void write_empty_block(T* og, int64_t o_row_stride, float* lse_rows,
                                  int64_t lse_row_stride, int rows, int head_dim, int tid) {
  constexpr int kChunks = kHeadDim / 8;
  for (int idx = tid; idx < kBlockM * kChunks; idx += kThreads) {
    const int r = idx / kChunks;
    const int c = (idx % kChunks) * 8;
    if (r < rows && c < head_dim) {
      T* dst = og + r * o_row_stride + c;
      if (c + 8 <= head_dim) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      } else {
        for (int e = 0; e < head_dim - c; ++e) dst[e] = T(0.0f);
      }
    }
  }
  if (lse_rows != nullptr) {
    for (int r = tid; r < rows; r += kThreads) lse_rows[r * lse_row_stride] = -INFINITY;
  }
}

}  // namespace common
}  // namespace flashattn
