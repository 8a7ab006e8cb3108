// The merge kernel: bandwidth-bound, one group of lanes of a warp per row (batch entry, query,
// head). The group's lanes first share the parts' LSEs (each lane takes every G-th part; the
// max and the sum of weights are reduced by shuffles), then each lane accumulates its slice of
// head_dim over the parts in fp32 and rounds once. Rows go to groups by a grid-stride loop.
#include "cuda/merge/merge.hpp"

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include "cuda/common/convert.cuh"

namespace flashattn {
namespace cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kThreadsPerBlock = 256;
constexpr int kVectorBytes = 16;      // one 16-byte load or store per lane and step
constexpr int64_t kMaxBlocks = 1 << 20;  // enough blocks to fill any GPU; the loop does the rest

// The merge's scalars in the kernel's terms (everything in elements).
struct MergeParams {
  const void* parts_out;
  int64_t out_part_stride, out_batch_stride, out_seq_stride, out_head_stride;  // of parts_out
  const float* parts_lse;
  int64_t lse_part_stride, lse_batch_stride, lse_head_stride, lse_seq_stride;  // of parts_lse
  void* out;
  int64_t dst_batch_stride, dst_seq_stride, dst_head_stride;
  float* lse;  // null: not wanted
  int64_t dst_lse_batch_stride, dst_lse_head_stride, dst_lse_seq_stride;
  int64_t parts, seqlen, heads, head_dim, rows;
  int group;  // lanes per row: a power of two dividing the warp
};

// max that keeps a NaN (fmaxf would drop it): a NaN LSE makes the row NaN.
__device__ inline float max_keep_nan(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}

// A vector of V elements loaded or stored in one access (V * sizeof(T) is 16 bytes or one
// element).
template <class T, int V>
struct alignas(V * sizeof(T)) Pack {
  T v[V];
};

template <class T, int V>
__global__ void __launch_bounds__(kThreadsPerBlock) merge_kernel(MergeParams p) {
  const int lane = threadIdx.x % kWarp;
  const int group_lane = lane % p.group;
  const int groups_per_block = kThreadsPerBlock / p.group;
  const int64_t group_in_block = threadIdx.x / p.group;
  const float kInf = CUDART_INF_F;
  const T* parts_out = static_cast<const T*>(p.parts_out);
  T* out = static_cast<T*>(p.out);
  // Block-uniform bounds, so every lane of a warp runs every iteration and reaches the shuffles
  // and the warp barrier; lanes past the last row only take part.
  for (int64_t base = int64_t(blockIdx.x) * groups_per_block; base < p.rows;
       base += int64_t(gridDim.x) * groups_per_block) {
    const int64_t row = base + group_in_block;
    const bool active = row < p.rows;
    const int64_t h = active ? row % p.heads : 0;
    const int64_t n = active ? (row / p.heads) % p.seqlen : 0;
    const int64_t b = active ? row / (p.heads * p.seqlen) : 0;
    const float* lse = p.parts_lse + b * p.lse_batch_stride + h * p.lse_head_stride +
                       n * p.lse_seq_stride;
    float m = -kInf;
    if (active) {
      for (int64_t q = group_lane; q < p.parts; q += p.group) {
        m = max_keep_nan(m, lse[q * p.lse_part_stride]);
      }
    }
    for (int offset = p.group / 2; offset > 0; offset /= 2) {
      m = max_keep_nan(m, __shfl_xor_sync(0xffffffffu, m, offset));
    }
    const bool finite = m > -kInf && m < kInf;  // false for NaN too
    float sum = 0.0f;
    if (active && finite) {
      for (int64_t q = group_lane; q < p.parts; q += p.group) {
        sum += expf(lse[q * p.lse_part_stride] - m);
      }
    }
    for (int offset = p.group / 2; offset > 0; offset /= 2) {
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    }
    if (active) {
      const T* src_row = parts_out + b * p.out_batch_stride + n * p.out_seq_stride +
                         h * p.out_head_stride;
      T* dst_row = out + b * p.dst_batch_stride + n * p.dst_seq_stride + h * p.dst_head_stride;
      const float inv_sum = finite ? 1.0f / sum : 0.0f;  // sum >= 1 when finite
      // No part sees a key: 0; a NaN or +inf LSE: NaN (see the header).
      const float fill = m == -kInf ? 0.0f : CUDART_NAN_F;
      for (int64_t d = int64_t(group_lane) * V; d < p.head_dim; d += int64_t(p.group) * V) {
        Pack<T, V> result;
        if (finite) {
          float acc[V];
#pragma unroll
          for (int i = 0; i < V; ++i) acc[i] = 0.0f;
          for (int64_t q = 0; q < p.parts; ++q) {
            const float w = expf(lse[q * p.lse_part_stride] - m);
            if (w == 0.0f) continue;  // -inf, or too far below the maximum: adds nothing
            const Pack<T, V> x =
                *reinterpret_cast<const Pack<T, V>*>(src_row + q * p.out_part_stride + d);
#pragma unroll
            for (int i = 0; i < V; ++i) acc[i] += w * to_float(x.v[i]);
          }
#pragma unroll
          for (int i = 0; i < V; ++i) result.v[i] = from_float<T>(acc[i] * inv_sum);
        } else {
#pragma unroll
          for (int i = 0; i < V; ++i) result.v[i] = from_float<T>(fill);
        }
        *reinterpret_cast<Pack<T, V>*>(dst_row + d) = result;
      }
    }
    // In place, the merged LSE may overwrite one the group's other lanes still read.
    __syncwarp();
    if (active && group_lane == 0 && p.lse != nullptr) {
      p.lse[b * p.dst_lse_batch_stride + h * p.dst_lse_head_stride + n * p.dst_lse_seq_stride] =
          finite ? m + logf(sum) : m;
    }
    __syncwarp();  // the next row's LSE reads come after this row's write
  }
}

bool aligned(const void* ptr, int bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0;
}

template <class T>
cudaError_t launch(const MergeArgs& a, cudaStream_t stream) {
  constexpr int kVector = kVectorBytes / sizeof(T);
  MergeParams p{};
  p.parts_out = a.parts_out.data;
  p.out_part_stride = a.parts_out_stride;
  p.out_batch_stride = a.parts_out.stride_batch;
  p.out_seq_stride = a.parts_out.stride_seq;
  p.out_head_stride = a.parts_out.stride_head;
  p.parts_lse = a.parts_lse.data;
  p.lse_part_stride = a.parts_lse_stride;
  p.lse_batch_stride = a.parts_lse.stride_batch;
  p.lse_head_stride = a.parts_lse.stride_head;
  p.lse_seq_stride = a.parts_lse.stride_seq;
  p.out = a.out.data;
  p.dst_batch_stride = a.out.stride_batch;
  p.dst_seq_stride = a.out.stride_seq;
  p.dst_head_stride = a.out.stride_head;
  p.lse = a.lse.data;
  p.dst_lse_batch_stride = a.lse.stride_batch;
  p.dst_lse_head_stride = a.lse.stride_head;
  p.dst_lse_seq_stride = a.lse.stride_seq;
  p.parts = a.parts;
  p.seqlen = a.seqlen;
  p.heads = a.heads;
  p.head_dim = a.head_dim;
  p.rows = a.batch * a.seqlen * a.heads;
  // 16-byte accesses when every row of every part and of out starts on 16 bytes and head_dim
  // fills whole vectors; element-wise otherwise.
  const int64_t strides[] = {p.out_part_stride, p.out_batch_stride, p.out_seq_stride,
                             p.out_head_stride, p.dst_batch_stride, p.dst_seq_stride,
                             p.dst_head_stride, p.head_dim};
  bool vectorized = aligned(p.parts_out, kVectorBytes) && aligned(p.out, kVectorBytes);
  for (int64_t s : strides) vectorized = vectorized && s % kVector == 0;
  const int64_t width = vectorized ? kVector : 1;
  const int64_t steps = (p.head_dim + width - 1) / width;
  p.group = 1;
  while (p.group < kWarp && p.group < steps) p.group *= 2;
  const int64_t groups_per_block = kThreadsPerBlock / p.group;
  int64_t blocks = (p.rows + groups_per_block - 1) / groups_per_block;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  const dim3 grid(static_cast<unsigned>(blocks));
  if (vectorized) {
    merge_kernel<T, kVector><<<grid, kThreadsPerBlock, 0, stream>>>(p);
  } else {
    merge_kernel<T, 1><<<grid, kThreadsPerBlock, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t merge_partials(const MergeArgs& args, cudaStream_t stream) {
  switch (args.dtype) {
    case DType::F16:
      return launch<__half>(args, stream);
    case DType::BF16:
      return launch<__nv_bfloat16>(args, stream);
    default:
      return cudaErrorNotSupported;
  }
}

}  // namespace cuda
}  // namespace flashattn
