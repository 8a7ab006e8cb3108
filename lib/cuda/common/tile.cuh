// Shared-memory tiles of 16-bit elements with the 128-byte swizzle: the tile is stored as
// [ceil(cols / 64)][rows][64], and 16-byte chunk c of row r sits at chunk c ^ (r % 8). cp.async
// writes and ldmatrix reads of 8 consecutive rows then hit 8 different bank groups.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"

namespace flashattn {
namespace common {

template <int kRows_, int kCols_>
struct SwizzledTile {
  static constexpr int kRows = kRows_;
  static constexpr int kCols = kCols_;
  static constexpr int kColBlocks = (kCols + 63) / 64;
  static constexpr int kElems = kColBlocks * kRows * 64;
  // Element offset of (r, c).
  __device__ __forceinline__ static int offset(int r, int c) {
    return (c >> 6) * (kRows * 64) + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7);
  }
};

// The rows of a tile that one thread's copies in load_tile and load_tile_rows write: tid / 8 +
// i * kThreads / 8 for i < count (eight threads share a row, a 16-byte chunk each).
template <class Tile, int kThreads>
struct ThreadTileRows {
  static constexpr int kStep = kThreads / 8;
  static constexpr int kCount = Tile::kRows / kStep;
  __device__ __forceinline__ static int row(int tid, int i) { return tid / 8 + i * kStep; }
};

// Asynchronously copies rows [0, rows_valid) (kFromRow: [rows_begin, rows_valid)) x cols
// [0, cols_valid) of a row-major global tile (row stride in elements, 16-byte aligned rows) into
// the swizzled tile; everything else in the tile is zero-filled. Part of the caller's current cp.async group. Each thread owns one 16-byte
// chunk column and every (kThreads / 8)-th row, so its shared-memory offsets are compile-time
// constants plus one per-thread base, and its global pointer advances by one stride per step.
template <class Tile, int kThreads, bool kFromRow = false, class T>
__device__ __forceinline__ void load_tile(T* smem, const T* gmem, int64_t row_stride,
                                          int rows_valid, int cols_valid, int tid,
                                          int rows_begin = 0) {
  using Rows = ThreadTileRows<Tile, kThreads>;
  constexpr int kRowStep = Rows::kStep;
  static_assert(Tile::kRows % kRowStep == 0 && kRowStep % 8 == 0, "rows split evenly");
  const int row0 = Rows::row(tid, 0);
  const int chunk = tid % 8;
  const uint32_t s_base = smem_u32(smem) + (row0 * 64 + ((chunk ^ (row0 & 7)) << 3)) * 2;
  const T* g = gmem + int64_t(row0) * row_stride + chunk * 8;
  const int64_t g_step = int64_t(kRowStep) * row_stride;
#pragma unroll
  for (int i = 0; i < Rows::kCount; ++i) {
    const int row = row0 + i * kRowStep;
    // kFromRow: rows before rows_begin zero-filled too (a separate instance, so that the
    // kernels that start at row 0 keep their code).
    const bool row_ok = row < rows_valid && (!kFromRow || row >= rows_begin);
#pragma unroll
    for (int cb = 0; cb < Tile::kColBlocks; ++cb) {
      const int left = cols_valid - (cb * 64 + chunk * 8);
      const int bytes = !row_ok ? 0 : (left >= 8 ? 16 : (left > 0 ? left * 2 : 0));
      cp_async_16(s_base + (cb * Tile::kRows * 64 + i * kRowStep * 64) * 2,
                  bytes > 0 ? static_cast<const void*>(g + cb * 64) : gmem, bytes);
    }
    g += g_step;
  }
}

// load_tile for rows that do not lie one stride apart (a paged KV cache whose pages are shorter
// than the tile): row r of the tile from row_of(i, r), a callable giving its first element, i
// being r's place among this thread's rows (r = tid / 8 + i * kThreads / 8: see
// ThreadTileRows); rows [0, rows_valid) (kFromRow: [rows_begin, rows_valid)) are read, the
// rest zero-filled.
template <class Tile, int kThreads, bool kFromRow = false, class T, class RowOf>
__device__ __forceinline__ void load_tile_rows(T* smem, const RowOf& row_of, int rows_valid,
                                               int cols_valid, int tid, const T* any_valid,
                                               int rows_begin = 0) {
  using Rows = ThreadTileRows<Tile, kThreads>;
  constexpr int kRowStep = Rows::kStep;
  static_assert(Tile::kRows % kRowStep == 0 && kRowStep % 8 == 0, "rows split evenly");
  const int row0 = Rows::row(tid, 0);
  const int chunk = tid % 8;
  const uint32_t s_base = smem_u32(smem) + (row0 * 64 + ((chunk ^ (row0 & 7)) << 3)) * 2;
#pragma unroll
  for (int i = 0; i < Rows::kCount; ++i) {
    const int row = row0 + i * kRowStep;
    const bool row_ok = row < rows_valid && (!kFromRow || row >= rows_begin);
    const T* g = row_ok ? row_of(i, row) + chunk * 8 : any_valid;
#pragma unroll
    for (int cb = 0; cb < Tile::kColBlocks; ++cb) {
      const int left = cols_valid - (cb * 64 + chunk * 8);
      const int bytes = !row_ok ? 0 : (left >= 8 ? 16 : (left > 0 ? left * 2 : 0));
      cp_async_16(s_base + (cb * Tile::kRows * 64 + i * kRowStep * 64) * 2,
                  bytes > 0 ? static_cast<const void*>(g + cb * 64) : any_valid, bytes);
    }
  }
}

// Shared-memory byte addresses for ldmatrix on a swizzled tile. A lane's row r (r % 8 fixed),
// its 8-column half h and the first 16-column group col16_0 of the warp's slice are set once;
// the swizzled chunk then depends only on the group's parity mod 4, so four bases cover every
// k-step, and rows moved by multiples of 8 and groups moved by multiples of 4 are compile-time
// offsets.
template <class Tile>
struct LdsmAddr {
  uint32_t base[4];
  __device__ __forceinline__ LdsmAddr(const void* smem, int row, int half, int col16_0 = 0) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c16 = col16_0 + j;
      base[j] = smem_u32(smem) + ((c16 >> 2) * Tile::kRows * 64 + row * 64 +
                                  ((((2 * c16) & 7 | half) ^ (row & 7)) << 3)) * 2;
    }
  }
  // Rows + row_off (a multiple of 8), columns [16 * (col16_0 + dc16), ... + 16).
  __device__ __forceinline__ uint32_t at(int row_off, int dc16) const {
    return base[dc16 & 3] + ((dc16 >> 2) * Tile::kRows * 64 + row_off * 64) * 2;
  }
};

// Copies rows [0, rows_valid) x cols [0, cols_valid) of a swizzled tile to global memory with
// 16-byte stores (partial chunks element by element).
template <class Tile, int kThreads, class T>
__device__ __forceinline__ void store_tile(T* gmem, int64_t row_stride, const T* smem,
                                           int rows_valid, int cols_valid, int tid) {
  constexpr int kChunksPerRow = Tile::kCols / 8;
  constexpr int kTotal = Tile::kRows * kChunksPerRow;
#pragma unroll
  for (int i = 0; i < (kTotal + kThreads - 1) / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    if (kTotal % kThreads == 0 || idx < kTotal) {
      const int r = idx / kChunksPerRow;
      const int c = (idx % kChunksPerRow) * 8;
      if (r < rows_valid && c < cols_valid) {
        const T* src = smem + Tile::offset(r, c);
        T* dst = gmem + int64_t(r) * row_stride + c;
        if (c + 8 <= cols_valid) {
          *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        } else {  // a partial chunk, element by element
          for (int j = 0; j < cols_valid - c; ++j) dst[j] = src[j];
        }
      }
    }
  }
}

// Rows [row0, row0 + rows_valid) and columns [0, cols_valid) of a swizzled tile to global
// memory, 16 bytes a thread, kThreads threads: cols_valid is a multiple of 8 (whole granules).
template <class Tile, int kThreads, class T>
__device__ __forceinline__ void store_rows(T* gmem, int64_t row_stride, const T* smem, int row0,
                                           int rows_valid, int cols_valid, int tid) {
  constexpr int kChunksPerRow = Tile::kCols / 8;
  for (int idx = tid; idx < rows_valid * kChunksPerRow; idx += kThreads) {
    const int r = idx / kChunksPerRow;
    const int c = (idx % kChunksPerRow) * 8;
    if (c < cols_valid) {
      *reinterpret_cast<uint4*>(gmem + int64_t(r) * row_stride + c) =
          *reinterpret_cast<const uint4*>(smem + Tile::offset(row0 + r, c));
    }
  }
}

// The dynamic shared memory rounded up to 1024 bytes (128B-swizzled operands need that
// alignment), as an offset from the __shared__ array itself: a pointer rebuilt from an integer
// loses its address space, and every access through it becomes a generic 64-bit one.
__device__ __forceinline__ unsigned char* smem_align1024(unsigned char* smem) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return smem + ((1024u - (addr & 1023u)) & 1023u);
}

}  // namespace common
}  // namespace flashattn
