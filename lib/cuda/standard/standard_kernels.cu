// Kernels of the standard (materialized) algorithm: layout copies (to and from the padded
// layout), the row softmax with the variants (row_policies.cuh), the softmax gradient, the sinks'
// gradient, and the pass that keeps masked non-finite values out of the GEMMs' results.
// Simple, memory-bound, and exact in fp32 arithmetic:
// expf/logf (no fast-math), no atomics, so results are the same run after run.
#include "cuda/standard/standard_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "cuda/common/convert.cuh"
#include "cuda/standard/row_policies.cuh"

namespace flashattn {
namespace cuda {
namespace standard {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Enough blocks to fill any current GPU many times over; loops cover the rest.
constexpr int64_t kMaxBlocks = int64_t(1) << 20;

// Block-wide reductions over kThreads threads; `scratch` holds kWarps values. Every thread gets
// the result. The leading barrier lets a loop reuse `scratch` safely.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kWarps; ++w) r = fmaxf(r, scratch[w]);
  return r;
}

template <class V>
__device__ __forceinline__ V block_sum(V v, V* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  V r = scratch[0];  // fixed order: the same sum on every run
  for (int w = 1; w < kWarps; ++w) r += scratch[w];
  return r;
}

// Thread 0 of a row's block writes what the extras ask for: its LSE (a row of the caller's
// only) and its sink's probability, from the shift and sum of its softmax (the sink's term
// included). A row that sees no key gets LSE -inf and share 0.
__device__ __forceinline__ void write_row_extras(const ScoreRow& row, int64_t r, float shift,
                                                 float sum, const SoftmaxExtras& extras) {
  if (threadIdx.x != 0) return;
  const bool sees_keys = !row.keys.empty();
  const LseView& lse = extras.lse;
  if (lse.data != nullptr && row.real) {
    lse.data[row.b * lse.stride_batch + row.h * lse.stride_head + row.caller_row * lse.stride_seq] =
        sees_keys ? shift + logf(sum) : -INFINITY;
  }
  if (extras.sink_share != nullptr) {
    extras.sink_share[r] = sees_keys ? row.sink.term(shift) / sum : 0.0f;
  }
}

// One block per row; each thread keeps kItems of the row's logits in registers, so S is read
// once. kItems * kThreads >= seqlen_k.
template <int kItems, class T>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_cached(const float* __restrict__ s, T* __restrict__ p, ScoreRows shape,
                        RowVariants variants, SoftmaxExtras extras, int64_t rows) {
  __shared__ float scratch[kWarps];
  const float neg_inf = -INFINITY;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const ScoreRow row = score_row(r, shape, variants);
    const float* srow = s + r * shape.ld;
    T* prow = p + r * shape.ld;
    float* grad_row = extras.softcap_grad != nullptr ? extras.softcap_grad + r * shape.ld : nullptr;
    float x[kItems];
    float mx = neg_inf;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = threadIdx.x + int64_t(k) * kThreads;
      const bool seen = row.keys.contains(j);
      const Logit l = seen ? row.logits.at(srow[j], j) : Logit{neg_inf, 0.0f};
      x[k] = l.value;
      if (grad_row != nullptr && j < shape.seqlen_k) grad_row[j] = l.softcap_grad;
      mx = fmaxf(mx, x[k]);
    }
    mx = block_max(mx, scratch);
    const float shift = row.sink.shift(mx);
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = threadIdx.x + int64_t(k) * kThreads;
      x[k] = row.keys.contains(j) ? expf(x[k] - shift) : 0.0f;
      sum += x[k];
    }
    sum = block_sum(sum, scratch) + row.sink.term(shift);
    const float inv = row.keys.empty() ? 0.0f : 1.0f / sum;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = threadIdx.x + int64_t(k) * kThreads;
      if (j < shape.seqlen_k) prow[j] = from_float<T>(x[k] * inv);
    }
    write_row_extras(row, r, shift, sum, extras);
  }
}

// Rows too long for registers: three passes over S (max, sum, write), each forming the logits
// again from the raw scores.
template <class T>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_long(const float* __restrict__ s, T* __restrict__ p, ScoreRows shape,
                      RowVariants variants, SoftmaxExtras extras, int64_t rows) {
  __shared__ float scratch[kWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const ScoreRow row = score_row(r, shape, variants);
    const KeyRange keys = row.keys;
    const float* srow = s + r * shape.ld;
    T* prow = p + r * shape.ld;
    float* grad_row = extras.softcap_grad != nullptr ? extras.softcap_grad + r * shape.ld : nullptr;
    float mx = -INFINITY;
    for (int64_t j = keys.begin + threadIdx.x; j < keys.end; j += kThreads) {
      mx = fmaxf(mx, row.logits(srow[j], j));
    }
    mx = block_max(mx, scratch);
    const float shift = row.sink.shift(mx);
    float sum = 0.0f;
    for (int64_t j = keys.begin + threadIdx.x; j < keys.end; j += kThreads) {
      sum += expf(row.logits(srow[j], j) - shift);
    }
    sum = block_sum(sum, scratch) + row.sink.term(shift);
    const float inv = keys.empty() ? 0.0f : 1.0f / sum;
    for (int64_t j = threadIdx.x; j < shape.seqlen_k; j += kThreads) {
      const bool seen = keys.contains(j);
      const Logit l = seen ? row.logits.at(srow[j], j) : Logit{0.0f, 0.0f};
      prow[j] = from_float<T>(seen ? expf(l.value - shift) * inv : 0.0f);
      if (grad_row != nullptr) grad_row[j] = l.softcap_grad;
    }
    write_row_extras(row, r, shift, sum, extras);
  }
}

// Vectors of kVec 16-bit elements along head_dim; index order (d, n, h, b) from fastest.
template <int kVec>
struct alignas(2 * kVec) Vec16 {
  uint16_t x[kVec];
};

// Which side of a copy is the caller's tensor (addressed through its sequence offsets).
enum class CopyTo { Packed, Caller };

// One kVec vector per thread step. Rows n of batch entry b: in the packed layout row n, in the
// caller's row begin_b + n; rows past the sequence's length are zeros in the packed layout and
// untouched in the caller's.
template <int kVec, CopyTo kTo>
__global__ void __launch_bounds__(kThreads)
    copy_rows_kernel(const uint16_t* __restrict__ src, Strides4 ss, uint16_t* __restrict__ dst,
                     Strides4 ds, SeqOffsets caller_rows, int64_t batch, int64_t seqlen,
                     int64_t heads, int64_t dim) {
  const int64_t dvecs = dim / kVec;
  const int64_t total = batch * seqlen * heads * dvecs;
  for (int64_t t = blockIdx.x * int64_t(kThreads) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * kThreads) {
    int64_t rest = t;
    const int64_t dv = rest % dvecs;
    rest /= dvecs;
    const int64_t n = rest % seqlen;
    rest /= seqlen;
    const int64_t h = rest % heads;
    const int64_t b = rest / heads;
    const int64_t d = dv * kVec;
    const SeqSpan span = seq_span(caller_rows, b, seqlen);
    const bool inside = n < span.len;
    if (kTo == CopyTo::Caller && !inside) continue;
    const int64_t src_n = kTo == CopyTo::Packed ? span.begin + n : n;
    const int64_t dst_n = kTo == CopyTo::Packed ? n : span.begin + n;
    auto* to =
        reinterpret_cast<Vec16<kVec>*>(dst + b * ds.batch + dst_n * ds.seq + h * ds.head + d);
    if (!inside) {
      *to = Vec16<kVec>{};
      continue;
    }
    *to = *reinterpret_cast<const Vec16<kVec>*>(src + b * ss.batch + src_n * ss.seq +
                                               h * ss.head + d);
  }
}

// One block per row: D = sum_j P_j dP_j, then dS_j = P_j (dP_j - D), times the softcap's
// derivative where there is one. A key with P_j = 0 (the mask's, or an exponential that
// underflowed) takes no part: a NaN or infinity in its dP (from a v the row does not see) must
// not reach the row as 0 * inf.
template <class T>
__global__ void __launch_bounds__(kThreads)
    softmax_grad_kernel(T* __restrict__ p, const float* __restrict__ dp,
                        const float* __restrict__ softcap_grad, int64_t ld, int64_t rows,
                        int64_t cols, float* __restrict__ delta) {
  __shared__ float scratch[kWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* prow = p + r * ld;
    const float* dprow = dp + r * ld;
    const float* grad_row = softcap_grad != nullptr ? softcap_grad + r * ld : nullptr;
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const float pj = to_float(prow[j]);
      if (pj != 0.0f) dot += pj * dprow[j];
    }
    dot = block_sum(dot, scratch);
    for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const float pj = to_float(prow[j]);
      float ds = 0.0f;
      if (pj != 0.0f) {
        ds = pj * (dprow[j] - dot);
        if (grad_row != nullptr) ds *= grad_row[j];
      }
      prow[j] = from_float<T>(ds);
    }
    if (delta != nullptr && threadIdx.x == 0) delta[r] = dot;
  }
}

// One block per head: the head's rows in (batch entry, query) order, thread t taking every
// kThreads-th, then the fixed-order block sum. Rows that see no key have share 0 and D 0.
__global__ void __launch_bounds__(kThreads)
    sink_gradient_kernel(const float* __restrict__ sink_share, const float* __restrict__ delta,
                         ScoreRows shape, Vector<float> dsinks) {
  __shared__ double scratch[kWarps];
  const int64_t per_head = shape.batch * shape.seqlen_q;
  for (int64_t h = blockIdx.x; h < shape.heads_q; h += gridDim.x) {
    double acc = 0.0;
    for (int64_t t = threadIdx.x; t < per_head; t += kThreads) {
      const int64_t b = t / shape.seqlen_q;
      const int64_t i = t % shape.seqlen_q;
      const int64_t r = (b * shape.heads_q + h) * shape.seqlen_q + i;
      acc += static_cast<double>(sink_share[r]) * static_cast<double>(delta[r]);
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) dsinks.data[h * dsinks.stride] = static_cast<float>(-acc);
  }
}

// C = alpha * A B recomputed, element by element, wherever C holds a NaN or an infinity, from the
// terms whose A factor is nonzero only. A GEMM multiplies every term, so a non-finite B at a
// term the mask zeroed in A (a key a row does not see, a row that sees no key) spoils C as
// 0 * inf. Finite elements are left as the GEMM wrote them: the pass costs one read of C.
// Row-major views: A(m, k) = A[m * a_row + k * a_col], B(k, n) = B[k * ldb + n],
// C(m, n) = C[m * ldc + n], each batch its stride further on.
template <class T>
__global__ void __launch_bounds__(kThreads)
    redo_nonfinite_kernel(const T* __restrict__ a, MatrixView av, const T* __restrict__ b,
                          MatrixView bv, T* __restrict__ c, MatrixView cv, int64_t m, int64_t n,
                          int64_t k, int64_t batch, float alpha) {
  const int64_t total = batch * m * n;
  for (int64_t t = blockIdx.x * int64_t(kThreads) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * kThreads) {
    const int64_t col = t % n;
    const int64_t row = (t / n) % m;
    const int64_t g = t / (m * n);
    T* out = c + g * cv.batch + row * cv.row + col;
    if (isfinite(to_float(*out))) continue;
    const T* arow = a + g * av.batch + row * av.row;
    const T* bcol = b + g * bv.batch + col;
    float acc = 0.0f;
    for (int64_t x = 0; x < k; ++x) {
      const float ax = to_float(arow[x * av.col]);
      if (ax != 0.0f) acc += ax * to_float(bcol[x * bv.row]);
    }
    *out = from_float<T>(alpha * acc);
  }
}

unsigned blocks_for(int64_t work_items, int64_t per_block) {
  const int64_t b = (work_items + per_block - 1) / per_block;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(b, kMaxBlocks)));
}

template <class T>
cudaError_t softmax_rows_t(const float* s, void* p, const ScoreRows& shape,
                           const RowVariants& variants, const SoftmaxExtras& extras,
                           cudaStream_t stream) {
  T* pt = static_cast<T*>(p);
  const int64_t rows = shape.batch * shape.heads_q * shape.seqlen_q;
  const unsigned grid = blocks_for(rows, 1);
  const int64_t per_thread = (shape.seqlen_k + kThreads - 1) / kThreads;
#define FLASHATTN_SOFTMAX_CASE(N)                                                             \
  if (per_thread <= N) {                                                                      \
    softmax_rows_cached<N, T><<<grid, kThreads, 0, stream>>>(s, pt, shape, variants, extras, \
                                                             rows);                           \
    return cudaGetLastError();                                                                \
  }
  FLASHATTN_SOFTMAX_CASE(1)
  FLASHATTN_SOFTMAX_CASE(2)
  FLASHATTN_SOFTMAX_CASE(4)
  FLASHATTN_SOFTMAX_CASE(8)
  FLASHATTN_SOFTMAX_CASE(16)
  FLASHATTN_SOFTMAX_CASE(32)
  FLASHATTN_SOFTMAX_CASE(64)
#undef FLASHATTN_SOFTMAX_CASE
  softmax_rows_long<T><<<grid, kThreads, 0, stream>>>(s, pt, shape, variants, extras, rows);
  return cudaGetLastError();
}

template <int kVec>
bool vec_ok(const void* src, Strides4 ss, const void* dst, Strides4 ds, int64_t dim) {
  const auto aligned = [](const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % (2 * kVec) == 0;
  };
  return dim % kVec == 0 && aligned(src) && aligned(dst) && ss.batch % kVec == 0 &&
         ss.seq % kVec == 0 && ss.head % kVec == 0 && ds.batch % kVec == 0 &&
         ds.seq % kVec == 0 && ds.head % kVec == 0;
}

template <int kVec, CopyTo kTo>
cudaError_t launch_copy(const void* src, Strides4 ss, void* dst, Strides4 ds,
                        SeqOffsets caller_rows, int64_t batch, int64_t seqlen, int64_t heads,
                        int64_t dim, cudaStream_t stream) {
  const int64_t total = batch * seqlen * heads * (dim / kVec);
  copy_rows_kernel<kVec, kTo><<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
      static_cast<const uint16_t*>(src), ss, static_cast<uint16_t*>(dst), ds, caller_rows, batch,
      seqlen, heads, dim);
  return cudaGetLastError();
}

// The widest vector both layouts' alignment allows (an offset moves a row by whole rows, so the
// row stride's alignment covers it).
template <CopyTo kTo>
cudaError_t copy_rows(DType dtype, const void* src, Strides4 ss, void* dst, Strides4 ds,
                      SeqOffsets caller_rows, int64_t batch, int64_t seqlen, int64_t heads,
                      int64_t dim, cudaStream_t stream) {
  if (dtype_size(dtype) != 2) return cudaErrorInvalidValue;
  if (vec_ok<8>(src, ss, dst, ds, dim)) {
    return launch_copy<8, kTo>(src, ss, dst, ds, caller_rows, batch, seqlen, heads, dim, stream);
  }
  if (vec_ok<4>(src, ss, dst, ds, dim)) {
    return launch_copy<4, kTo>(src, ss, dst, ds, caller_rows, batch, seqlen, heads, dim, stream);
  }
  if (vec_ok<2>(src, ss, dst, ds, dim)) {
    return launch_copy<2, kTo>(src, ss, dst, ds, caller_rows, batch, seqlen, heads, dim, stream);
  }
  return launch_copy<1, kTo>(src, ss, dst, ds, caller_rows, batch, seqlen, heads, dim, stream);
}

}  // namespace

cudaError_t pack_rows(DType dtype, const void* src, Strides4 src_strides, SeqOffsets src_rows,
                      void* dst, Strides4 dst_strides, int64_t batch, int64_t seqlen,
                      int64_t heads, int64_t dim, cudaStream_t stream) {
  return copy_rows<CopyTo::Packed>(dtype, src, src_strides, dst, dst_strides, src_rows, batch,
                                   seqlen, heads, dim, stream);
}

cudaError_t unpack_rows(DType dtype, const void* src, Strides4 src_strides, void* dst,
                        Strides4 dst_strides, SeqOffsets dst_rows, int64_t batch, int64_t seqlen,
                        int64_t heads, int64_t dim, cudaStream_t stream) {
  return copy_rows<CopyTo::Caller>(dtype, src, src_strides, dst, dst_strides, dst_rows, batch,
                                   seqlen, heads, dim, stream);
}

cudaError_t softmax_rows(DType dtype, const float* s, void* p, const ScoreRows& shape,
                         const RowVariants& variants, const SoftmaxExtras& extras,
                         cudaStream_t stream) {
  switch (dtype) {
    case DType::F16:
      return softmax_rows_t<__half>(s, p, shape, variants, extras, stream);
    case DType::BF16:
      return softmax_rows_t<__nv_bfloat16>(s, p, shape, variants, extras, stream);
    case DType::F32: break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t softmax_grad(DType dtype, void* p, const float* dp, const float* softcap_grad,
                         int64_t ld, int64_t rows, int64_t cols, float* delta,
                         cudaStream_t stream) {
  const unsigned grid = blocks_for(rows, 1);
  switch (dtype) {
    case DType::F16:
      softmax_grad_kernel<__half><<<grid, kThreads, 0, stream>>>(
          static_cast<__half*>(p), dp, softcap_grad, ld, rows, cols, delta);
      return cudaGetLastError();
    case DType::BF16:
      softmax_grad_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
          static_cast<__nv_bfloat16*>(p), dp, softcap_grad, ld, rows, cols, delta);
      return cudaGetLastError();
    case DType::F32: break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t sink_gradient(const float* sink_share, const float* delta, const ScoreRows& shape,
                          Vector<float> dsinks, cudaStream_t stream) {
  sink_gradient_kernel<<<blocks_for(shape.heads_q, 1), kThreads, 0, stream>>>(sink_share, delta,
                                                                             shape, dsinks);
  return cudaGetLastError();
}

cudaError_t redo_nonfinite(DType dtype, const void* a, MatrixView av, const void* b,
                           MatrixView bv, void* c, MatrixView cv, int64_t m, int64_t n, int64_t k,
                           int64_t batch, float alpha, cudaStream_t stream) {
  const unsigned grid = blocks_for(batch * m * n, kThreads);
  switch (dtype) {
    case DType::F16:
      redo_nonfinite_kernel<__half><<<grid, kThreads, 0, stream>>>(
          static_cast<const __half*>(a), av, static_cast<const __half*>(b), bv,
          static_cast<__half*>(c), cv, m, n, k, batch, alpha);
      return cudaGetLastError();
    case DType::BF16:
      redo_nonfinite_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(a), av, static_cast<const __nv_bfloat16*>(b), bv,
          static_cast<__nv_bfloat16*>(c), cv, m, n, k, batch, alpha);
      return cudaGetLastError();
    case DType::F32: break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t kernels_loadable() {
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, softmax_rows_cached<1, __half>);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

}  // namespace standard
}  // namespace cuda
}  // namespace flashattn
