// The layouts of the backward's fp32 dQ accumulator in the workspace: row-major, the sm80
// kernel's 32 x 32 blocks (where it adds by bulk reduce), and the sm90 kernels' 64 x 64 tiles.
// The main kernels write them and the postprocess reads them, so they live here once.
#pragma once

#include "cuda/common/arch.cuh"

namespace flashattn {
namespace common {

// Where a device pass of the sm80 main kernel can use the Hopper bulk reduce-add (sm_90a), it
// adds each warp's dQ tile with one bulk operation instead of per-element atomics, and then keeps
// the accumulator in 32 x 32 blocks (dq_block_offset): head dims 64, 128 and 256, whose dQ warp
// tiles are 32 rows by a multiple of 32 columns. The postprocess, compiled in the same device
// pass, reads the layout the same way.
__host__ __device__ constexpr bool bulk_dq(int head_dim_padded) {
#ifdef FLASHATTN_SM90A_DEVICE
  return head_dim_padded == 64 || head_dim_padded == 128 || head_dim_padded == 256;
#else
  (void)head_dim_padded;
  return false;
#endif
}

// Float offset of (r, c), c even, from the start of a 32-aligned block of query rows in the
// blocked accumulator: [32-row block][32-column block][32 x 32], each row's float2 pairs
// swizzled by the row so that a warp's float2 stores of an accumulator fragment are
// bank-conflict free. A warp's 32 x 32k dQ tile is then one contiguous range.
__host__ __device__ __forceinline__ int dq_block_offset(int r, int c, int head_dim_padded) {
  return ((r >> 5) * (head_dim_padded >> 5) + (c >> 5)) * 1024 + (r & 31) * 32 +
         2 * (((c & 31) >> 1) ^ ((r & 3) << 2)) + (c & 1);
}

// The columns of a Hopper kernel's dQ tile: its accumulator rows are its head dim rounded up to
// whole tiles (head dims 96 and 112 add into 128).
constexpr int kDqTileCols = 64;
__host__ __device__ constexpr int dq_tiled_cols(int head_dim) {
  return (head_dim + kDqTileCols - 1) / kDqTileCols * kDqTileCols;
}

// The sm90 dQ accumulator is stored in 64 x 64 fp32 tiles ([query block][64-column block]),
// each row's float2 pairs swizzled by the row so that a warp's float2 stores of an accumulator
// fragment hit every bank: the float offset of (r, c) inside a tile, c even.
__host__ __device__ __forceinline__ int dq_tile_offset(int r, int c) {
  return r * 64 + 2 * ((c >> 1) ^ ((r & 7) << 2)) + (c & 1);
}

}  // namespace common
}  // namespace flashattn
