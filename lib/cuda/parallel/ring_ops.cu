// One thread block per (batch entry, row, head) in a grid-stride loop, its threads across the
// head dim: these steps move each element once, so the loads coalesce along the dim and nothing
// else matters much. The LSE of a row is read by every thread and written by thread 0 after the
// block has read it.
#include "cuda/parallel/ring_ops.hpp"

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include "cuda/common/convert.cuh"

namespace flashattn {
namespace cuda {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kMaxBlocks = 1 << 20;  // enough to fill any GPU; the loop does the rest
constexpr int kSinkThreads = 256;

__device__ inline int64_t at(const Tensor4& t, int64_t b, int64_t i, int64_t h) {
  return b * t.stride_batch + i * t.stride_seq + h * t.stride_head;
}
__device__ inline float* lse_at(const LseView& l, int64_t b, int64_t h, int64_t i) {
  return l.data + b * l.stride_batch + h * l.stride_head + i * l.stride_seq;
}

template <class T>
__global__ void ring_kernel(RingOp op) {
  const int64_t items = op.batch * op.rows * op.heads;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t h = item % op.heads;
    const int64_t i = (item / op.heads) % op.rows;
    const int64_t b = item / (op.heads * op.rows);
    const T* src_t = static_cast<const T*>(op.src.data);
    T* dst_t = static_cast<T*>(op.dst.data);
    const float* src_f = static_cast<const float*>(op.src.data);
    float* dst_f = static_cast<float*>(op.dst.data);
    switch (op.kind) {
      case RingOpKind::Copy:
        for (int64_t d = threadIdx.x; d < op.dim; d += blockDim.x) {
          dst_t[at(op.dst, b, i, h) + d] = src_t[at(op.src, b, i, h) + d];
        }
        break;
      case RingOpKind::Zero:
        for (int64_t d = threadIdx.x; d < op.dim; d += blockDim.x) dst_f[at(op.dst, b, i, h) + d] = 0.0f;
        break;
      case RingOpKind::Add:
        for (int64_t d = threadIdx.x; d < op.dim; d += blockDim.x) {
          dst_f[at(op.dst, b, i, h) + d] += to_float(src_t[at(op.src, b, i, h) + d]);
        }
        break;
      case RingOpKind::Store:
        for (int64_t d = threadIdx.x; d < op.dim; d += blockDim.x) {
          dst_t[at(op.dst, b, i, h) + d] = from_float<T>(src_f[at(op.src, b, i, h) + d]);
        }
        break;
      case RingOpKind::FoldInit:
        for (int64_t d = threadIdx.x; d < op.dim; d += blockDim.x) dst_f[at(op.dst, b, i, h) + d] = 0.0f;
        if (threadIdx.x == 0) *lse_at(op.dst_lse, b, h, i) = -CUDART_INF_F;
        break;
      case RingOpKind::Fold: {
        float* acc_lse = lse_at(op.dst_lse, b, h, i);
        const float a = *acc_lse;
        const float p = *lse_at(op.src_lse, b, h, i);
        __syncthreads();  // every thread has read the sum's LSE before thread 0 replaces it
        float* acc = dst_f + at(op.dst, b, i, h);
        const T* o = src_t + at(op.src, b, i, h);
        if (a != a || p != p) {
          for (int64_t d = threadIdx.x; d < op.dim; d += blockDim.x) acc[d] = CUDART_NAN_F;
          if (threadIdx.x == 0) *acc_lse = CUDART_NAN_F;
        } else if (p == -CUDART_INF_F) {
          // the part's keys are all hidden from the row: it adds nothing
        } else if (a == -CUDART_INF_F) {
          for (int64_t d = threadIdx.x; d < op.dim; d += blockDim.x) acc[d] = to_float(o[d]);
          if (threadIdx.x == 0) *acc_lse = p;
        } else {
          const float m = fmaxf(a, p);
          if (m == CUDART_INF_F) {
            for (int64_t d = threadIdx.x; d < op.dim; d += blockDim.x) acc[d] = CUDART_NAN_F;
            if (threadIdx.x == 0) *acc_lse = m;
          } else {
            const float wa = expf(a - m), wb = expf(p - m);
            const float sum = wa + wb;
            const float ca = wa / sum, cb = wb / sum;
            for (int64_t d = threadIdx.x; d < op.dim; d += blockDim.x) {
              acc[d] = ca * acc[d] + cb * to_float(o[d]);
            }
            if (threadIdx.x == 0) *acc_lse = m + logf(sum);
          }
        }
        __syncthreads();  // the next row's item may be this block's again: LSE written first
        break;
      }
      case RingOpKind::FoldFinish: {
        float lse = *lse_at(op.src_lse, b, h, i);
        float scale = 1.0f;
        if (op.sinks.data != nullptr && lse != -CUDART_INF_F && lse == lse) {
          const float sink = op.sinks.data[h * op.sinks.stride];
          const float m = fmaxf(lse, sink);
          if (m != CUDART_INF_F) {
            const float total = m + logf(expf(lse - m) + expf(sink - m));
            scale = expf(lse - total);
            lse = total;
          }
        }
        for (int64_t d = threadIdx.x; d < op.dim; d += blockDim.x) {
          dst_t[at(op.dst, b, i, h) + d] = from_float<T>(src_f[at(op.src, b, i, h) + d] * scale);
        }
        if (threadIdx.x == 0 && op.dst_lse.data != nullptr) *lse_at(op.dst_lse, b, h, i) = lse;
        break;
      }
      case RingOpKind::SinkGrad:
        break;  // its own kernel
    }
  }
}

// dsinks[h]: one block per head; each thread sums its rows in a fixed order, then a fixed
// tree: the result is the same run after run.
template <class T>
__global__ void sink_grad_kernel(RingOp op) {
  __shared__ double partial[kSinkThreads];
  const int64_t h = blockIdx.x;
  const double sink = op.sinks.data[h * op.sinks.stride];
  const T* out = static_cast<const T*>(op.src.data);
  const T* dout = static_cast<const T*>(op.dst.data);
  double sum = 0.0;
  for (int64_t r = threadIdx.x; r < op.batch * op.rows; r += blockDim.x) {
    const int64_t b = r / op.rows, i = r % op.rows;
    const float lse = *lse_at(op.src_lse, b, h, i);
    if (lse == -CUDART_INF_F) continue;
    const T* o = out + at(op.src, b, i, h);
    const T* g = dout + at(op.dst, b, i, h);
    float delta = 0.0f;
    for (int64_t d = 0; d < op.dim; ++d) delta += to_float(g[d]) * to_float(o[d]);
    sum += exp(sink - static_cast<double>(lse)) * static_cast<double>(delta);
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kSinkThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) op.dsinks.data[h * op.dsinks.stride] = static_cast<float>(-partial[0]);
}

template <class T>
cudaError_t launch(const RingOp& op, cudaStream_t stream) {
  if (op.kind == RingOpKind::SinkGrad) {
    if (op.heads == 0) return cudaSuccess;
    sink_grad_kernel<T><<<static_cast<unsigned>(op.heads), kSinkThreads, 0, stream>>>(op);
    return cudaGetLastError();
  }
  const int64_t items = op.batch * op.rows * op.heads;
  if (items == 0) return cudaSuccess;
  const int64_t blocks = items < kMaxBlocks ? items : kMaxBlocks;
  ring_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(op);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_ring_op(const RingOp& op, cudaStream_t stream) {
  switch (op.dtype) {
    case DType::F16: return launch<__half>(op, stream);
    case DType::BF16: return launch<__nv_bfloat16>(op, stream);
    case DType::F32: return launch<float>(op, stream);
  }
  return cudaErrorNotSupported;
}

}  // namespace cuda
}  // namespace flashattn
