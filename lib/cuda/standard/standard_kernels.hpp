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

// In place, the softmax gradient dS: p[r, j] = p[r, j] * (dp[r, j] - D[r]) for j < cols, with
// D[r] = sum_j p[r, j] * dp[r, j] (P in dtype, dP fp32, both with leading dimension ld). Where
// p[r, j] is 0 the result is 0 and dp[r, j] is not read into D: a NaN or infinity there (from
// a value the mask hides) stays out.
cudaError_t softmax_grad(DType dtype, void* p, const float* dp, int64_t ld, int64_t rows,
                         int64_t cols, cudaStream_t stream);

// A row-major matrix in memory: element (i, j) at i * row + j * col, each batch `batch` on.
struct MatrixView {
  int64_t row = 0;
  int64_t col = 1;
  int64_t batch = 0;
};

// After a GEMM C = alpha * A B (batched, all three in dtype; B and C with col = 1): every
// element of C that is NaN or infinite is recomputed from the terms whose A factor is nonzero,
// so that a non-finite B where A is 0 (a masked probability) does not reach C as 0 * inf.
// Finite elements are not written.
cudaError_t redo_nonfinite(DType dtype, const void* a, MatrixView av, const void* b,
                           MatrixView bv, void* c, MatrixView cv, int64_t m, int64_t n, int64_t k,
                           int64_t batch, float alpha, cudaStream_t stream);

// cudaSuccess when these kernels have an image (SASS or PTX) this device can run, else the
// error CUDA gives (cudaErrorNoKernelImageForDevice, ...). Call with the device current.
cudaError_t kernels_loadable();

}  // namespace standard
}  // namespace cuda
}  // namespace flashattn
