// Host side of the Hopper kernels' tensor-map (TMA) copies: encodes the descriptor of a
// [batch, heads, rows, cols] tensor of 16-bit elements (strides in elements, cols contiguous),
// read and written in boxes of 64 columns by `box_rows` rows with the 128-byte swizzle, which
// lands a box as one [rows][64] slab of common::SwizzledTile. Out-of-bounds rows and columns read
// as zero and are not written, so tiles need no predicates.
#pragma once

#include <cstdint>

#include <cuda.h>

namespace flashattn {
namespace sm90 {

struct TensorMapView {
  const void* data;
  bool bf16;  // else fp16
  int64_t cols, rows, heads, batch;
  int64_t row_stride, head_stride, batch_stride;
};

// The columns of a box; its rows are the caller's.
constexpr int kTmaBoxCols = 64;
// Elements of one 16-byte granule, the unit in which TMA moves the ends of rows.
constexpr int kTmaGranuleElems = 8;

// False when the driver's encoder is unavailable or refuses the view (the caller then takes
// another kernel).
bool encode_tensor_map(CUtensorMap* map, const TensorMapView& view, int box_rows);

}  // namespace sm90
}  // namespace flashattn
