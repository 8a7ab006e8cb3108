// The standard algorithm's own kernels (everything that is not a GEMM). Plain launchers: they
// enqueue on `stream` and return the launch's cudaError_t; they know nothing of contexts or
// flashattn errors. 16-bit element types only (dtype F16 or BF16).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "core/problem.hpp"

namespace flashattn {
namespace cuda {
namespace standard {

// Element strides of a [batch, seqlen, heads, head_dim] layout (head_dim stride 1).
struct Strides4 {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t head = 0;
};

// dst[b, n, h, d] = src[b, n, h, d] for a [batch, seqlen, heads, dim] box; both 16-bit dtype.
cudaError_t copy_4d(DType dtype, const void* src, Strides4 src_strides, void* dst,
                    Strides4 dst_strides, int64_t batch, int64_t seqlen, int64_t heads,
                    int64_t dim, cudaStream_t stream);

// Row-wise masked softmax. Row r of S (fp32, `rows` rows of `ld` elements) belongs to query
// i = r % seqlen_q of head h = (r / seqlen_q) % heads_q of batch b = r / (seqlen_q * heads_q).
// Writes P (dtype, same indexing) for columns < seqlen_k: the causal mask (bottom-right) zeroes
// key j > i + seqlen_k - seqlen_q; a row with no key left is all zeros. When lse.data is set,
// writes lse[b, h, i] = log(sum(exp(S))) (natural log, -inf for such a row).
cudaError_t softmax_rows(DType dtype, const float* s, void* p, int64_t ld, int64_t rows,
                         int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, bool causal,
                         LseView lse, cudaStream_t stream);

// dot[(b * heads + h) * seqlen + i] = sum_d x[b, i, h, d] * y[b, i, h, d] in fp32.
cudaError_t row_dot(DType dtype, const void* x, Strides4 xs, const void* y, Strides4 ys,
                    float* dot, int64_t batch, int64_t seqlen, int64_t heads, int64_t dim,
                    cudaStream_t stream);

// In place: p[r, j] = p[r, j] * (dp[r, j] - dot[r]) for j < cols (P in dtype, dP fp32, both
// with leading dimension ld): the softmax gradient dS.
cudaError_t softmax_grad(DType dtype, void* p, const float* dp, const float* dot, int64_t ld,
                         int64_t rows, int64_t cols, cudaStream_t stream);

// cudaSuccess when these kernels have an image (SASS or PTX) this device can run, else the
// error CUDA gives (cudaErrorNoKernelImageForDevice, ...). Call with the device current.
cudaError_t kernels_loadable();

}  // namespace standard
}  // namespace cuda
}  // namespace flashattn
