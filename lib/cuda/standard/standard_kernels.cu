// Kernels of the standard (materialized) algorithm: layout copies, the masked row softmax, the
// softmax gradient, and the pass that keeps masked non-finite values out of the GEMMs' results.
// Simple, memory-bound, and exact in fp32 arithmetic:
// expf/logf (no fast-math), no atomics, so results are the same run after run.
#include "cuda/standard/standard_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

namespace flashattn {
namespace cuda {
namespace standard {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Enough blocks to fill any current GPU many times over; loops cover the rest.
constexpr int64_t kMaxBlocks = int64_t(1) << 20;

template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Block-wide reductions over kThreads threads; `scratch` holds kWarps floats. Every thread gets
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

__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = scratch[0];  // fixed order: the same sum on every run
  for (int w = 1; w < kWarps; ++w) r += scratch[w];
  return r;
}

__device__ __forceinline__ int64_t visible_keys(int64_t r, int64_t seqlen_q, int64_t seqlen_k,
                                                bool causal) {
  if (!causal) return seqlen_k;
  const int64_t i = r % seqlen_q;
  const int64_t last = i + seqlen_k - seqlen_q;  // bottom-right aligned diagonal
  return last < 0 ? 0 : (last + 1 < seqlen_k ? last + 1 : seqlen_k);
}

__device__ __forceinline__ void write_lse(const LseView& lse, int64_t r, int64_t seqlen_q,
                                          int64_t heads_q, float value) {
  const int64_t i = r % seqlen_q;
  const int64_t bh = r / seqlen_q;
  const int64_t h = bh % heads_q;
  const int64_t b = bh / heads_q;
  lse.data[b * lse.stride_batch + h * lse.stride_head + i * lse.stride_seq] = value;
}

// One block per row; each thread keeps kItems of the row's scores in registers, so S is read
// once. kItems * kThreads >= seqlen_k.
template <int kItems, class T>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_cached(const float* __restrict__ s, T* __restrict__ p, int64_t ld, int64_t rows,
                        int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, bool causal,
                        LseView lse) {
  __shared__ float scratch[kWarps];
  const float neg_inf = -INFINITY;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t valid = visible_keys(r, seqlen_q, seqlen_k, causal);
    const float* srow = s + r * ld;
    T* prow = p + r * ld;
    float v[kItems];
    float mx = neg_inf;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = threadIdx.x + int64_t(k) * kThreads;
      v[k] = j < valid ? srow[j] : neg_inf;
      mx = fmaxf(mx, v[k]);
    }
    mx = block_max(mx, scratch);
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = threadIdx.x + int64_t(k) * kThreads;
      v[k] = j < valid ? expf(v[k] - mx) : 0.0f;
      sum += v[k];
    }
    sum = block_sum(sum, scratch);
    const float inv = valid > 0 ? 1.0f / sum : 0.0f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = threadIdx.x + int64_t(k) * kThreads;
      if (j < seqlen_k) prow[j] = from_float<T>(v[k] * inv);
    }
    if (lse.data != nullptr && threadIdx.x == 0) {
      write_lse(lse, r, seqlen_q, heads_q, valid > 0 ? mx + logf(sum) : neg_inf);
    }
  }
}

// Rows too long for registers: three passes over S (max, sum, write).
template <class T>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_long(const float* __restrict__ s, T* __restrict__ p, int64_t ld, int64_t rows,
                      int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, bool causal,
                      LseView lse) {
  __shared__ float scratch[kWarps];
  const float neg_inf = -INFINITY;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t valid = visible_keys(r, seqlen_q, seqlen_k, causal);
    const float* srow = s + r * ld;
    T* prow = p + r * ld;
    float mx = neg_inf;
    for (int64_t j = threadIdx.x; j < valid; j += kThreads) mx = fmaxf(mx, srow[j]);
    mx = block_max(mx, scratch);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < valid; j += kThreads) sum += expf(srow[j] - mx);
    sum = block_sum(sum, scratch);
    const float inv = valid > 0 ? 1.0f / sum : 0.0f;
    for (int64_t j = threadIdx.x; j < seqlen_k; j += kThreads) {
      prow[j] = from_float<T>(j < valid ? expf(srow[j] - mx) * inv : 0.0f);
    }
    if (lse.data != nullptr && threadIdx.x == 0) {
      write_lse(lse, r, seqlen_q, heads_q, valid > 0 ? mx + logf(sum) : neg_inf);
    }
  }
}

// Vectors of kVec 16-bit elements along head_dim; index order (d, n, h, b) from fastest.
template <int kVec>
struct alignas(2 * kVec) Vec16 {
  uint16_t x[kVec];
};

template <int kVec>
__global__ void __launch_bounds__(kThreads)
    copy_4d_kernel(const uint16_t* __restrict__ src, Strides4 ss, uint16_t* __restrict__ dst,
                   Strides4 ds, int64_t batch, int64_t seqlen, int64_t heads, int64_t dim) {
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
    const auto* from =
        reinterpret_cast<const Vec16<kVec>*>(src + b * ss.batch + n * ss.seq + h * ss.head + d);
    auto* to = reinterpret_cast<Vec16<kVec>*>(dst + b * ds.batch + n * ds.seq + h * ds.head + d);
    *to = *from;
  }
}

// One block per row: D = sum_j P_j dP_j, then dS_j = P_j (dP_j - D). A key with P_j = 0 (the
// mask's, or an exponential that underflowed) takes no part: a NaN or infinity in its dP (from
// a v the row does not see) must not reach the row as 0 * inf.
template <class T>
__global__ void __launch_bounds__(kThreads)
    softmax_grad_kernel(T* __restrict__ p, const float* __restrict__ dp, int64_t ld, int64_t rows,
                        int64_t cols) {
  __shared__ float scratch[kWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* prow = p + r * ld;
    const float* dprow = dp + r * ld;
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const float pj = to_float(prow[j]);
      if (pj != 0.0f) dot += pj * dprow[j];
    }
    dot = block_sum(dot, scratch);
    for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const float pj = to_float(prow[j]);
      prow[j] = from_float<T>(pj != 0.0f ? pj * (dprow[j] - dot) : 0.0f);
    }
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
cudaError_t softmax_rows_t(const float* s, void* p, int64_t ld, int64_t rows, int64_t seqlen_q,
                           int64_t seqlen_k, int64_t heads_q, bool causal, LseView lse,
                           cudaStream_t stream) {
  T* pt = static_cast<T*>(p);
  const unsigned grid = blocks_for(rows, 1);
  const int64_t per_thread = (seqlen_k + kThreads - 1) / kThreads;
#define FLASHATTN_SOFTMAX_CASE(N)                                                            \
  if (per_thread <= N) {                                                                     \
    softmax_rows_cached<N, T><<<grid, kThreads, 0, stream>>>(s, pt, ld, rows, seqlen_q,       \
                                                             seqlen_k, heads_q, causal, lse); \
    return cudaGetLastError();                                                               \
  }
  FLASHATTN_SOFTMAX_CASE(1)
  FLASHATTN_SOFTMAX_CASE(2)
  FLASHATTN_SOFTMAX_CASE(4)
  FLASHATTN_SOFTMAX_CASE(8)
  FLASHATTN_SOFTMAX_CASE(16)
  FLASHATTN_SOFTMAX_CASE(32)
  FLASHATTN_SOFTMAX_CASE(64)
#undef FLASHATTN_SOFTMAX_CASE
  softmax_rows_long<T><<<grid, kThreads, 0, stream>>>(s, pt, ld, rows, seqlen_q, seqlen_k,
                                                      heads_q, causal, lse);
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

template <int kVec>
cudaError_t launch_copy(const void* src, Strides4 ss, void* dst, Strides4 ds, int64_t batch,
                        int64_t seqlen, int64_t heads, int64_t dim, cudaStream_t stream) {
  const int64_t total = batch * seqlen * heads * (dim / kVec);
  copy_4d_kernel<kVec><<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
      static_cast<const uint16_t*>(src), ss, static_cast<uint16_t*>(dst), ds, batch, seqlen,
      heads, dim);
  return cudaGetLastError();
}

}  // namespace

cudaError_t copy_4d(DType dtype, const void* src, Strides4 ss, void* dst, Strides4 ds,
                    int64_t batch, int64_t seqlen, int64_t heads, int64_t dim,
                    cudaStream_t stream) {
  if (dtype_size(dtype) != 2) return cudaErrorInvalidValue;
  if (vec_ok<8>(src, ss, dst, ds, dim)) {
    return launch_copy<8>(src, ss, dst, ds, batch, seqlen, heads, dim, stream);
  }
  if (vec_ok<4>(src, ss, dst, ds, dim)) {
    return launch_copy<4>(src, ss, dst, ds, batch, seqlen, heads, dim, stream);
  }
  if (vec_ok<2>(src, ss, dst, ds, dim)) {
    return launch_copy<2>(src, ss, dst, ds, batch, seqlen, heads, dim, stream);
  }
  return launch_copy<1>(src, ss, dst, ds, batch, seqlen, heads, dim, stream);
}

cudaError_t softmax_rows(DType dtype, const float* s, void* p, int64_t ld, int64_t rows,
                         int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, bool causal,
                         LseView lse, cudaStream_t stream) {
  switch (dtype) {
    case DType::F16:
      return softmax_rows_t<__half>(s, p, ld, rows, seqlen_q, seqlen_k, heads_q, causal, lse,
                                    stream);
    case DType::BF16:
      return softmax_rows_t<__nv_bfloat16>(s, p, ld, rows, seqlen_q, seqlen_k, heads_q, causal,
                                           lse, stream);
    case DType::F32: break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t softmax_grad(DType dtype, void* p, const float* dp, int64_t ld, int64_t rows,
                         int64_t cols, cudaStream_t stream) {
  const unsigned grid = blocks_for(rows, 1);
  switch (dtype) {
    case DType::F16:
      softmax_grad_kernel<__half><<<grid, kThreads, 0, stream>>>(static_cast<__half*>(p), dp, ld,
                                                                 rows, cols);
      return cudaGetLastError();
    case DType::BF16:
      softmax_grad_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
          static_cast<__nv_bfloat16*>(p), dp, ld, rows, cols);
      return cudaGetLastError();
    case DType::F32: break;
  }
  return cudaErrorInvalidValue;
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
