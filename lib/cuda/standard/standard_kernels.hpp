// The standard algorithm's own kernels (everything that is not a GEMM). Plain launchers: they
// enqueue on `stream` and return the launch's cudaError_t; they know nothing of contexts or
// flashattn errors. 16-bit element types only (dtype F16 or BF16). Every pointer is device
// memory, the sequence offsets of a variable-length batch included: no launcher reads them on the
// host, so a launch needs no synchronization and may be captured in a CUDA graph.
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

// Where each batch entry's rows lie in a caller's tensor: data null for a fixed-length batch,
// else the B + 1 offsets of a variable-length one (cu_seqlens), entry b owning rows
// [data[b * stride], data[(b + 1) * stride]) of a tensor whose batch stride is 0.
using SeqOffsets = Vector<const int32_t>;

// Caller -> packed: dst[b, n, h, d] = src[b, begin_b + n, h, d] for the [batch, seqlen, heads,
// dim] box, where sequence b starts at begin_b (0 without offsets); a row n past the sequence's
// length is written as zeros (src not read), so the padded layout holds no stale values.
cudaError_t pack_rows(DType dtype, const void* src, Strides4 src_strides, SeqOffsets src_rows,
                      void* dst, Strides4 dst_strides, int64_t batch, int64_t seqlen,
                      int64_t heads, int64_t dim, cudaStream_t stream);

// Packed -> caller: the inverse; rows past a sequence's length are not written.
cudaError_t unpack_rows(DType dtype, const void* src, Strides4 src_strides, void* dst,
                        Strides4 dst_strides, SeqOffsets dst_rows, int64_t batch, int64_t seqlen,
                        int64_t heads, int64_t dim, cudaStream_t stream);

// The padded score layout: row r holds query i = r % seqlen_q of head h = (r / seqlen_q) %
// heads_q of batch entry b = r / (seqlen_q * heads_q), columns [0, seqlen_k) are its keys, rows
// `ld` elements apart. seqlen_q and seqlen_k are the longest sequence's (every one of a
// fixed-length batch); a shorter sequence's extra rows and columns are padding the mask hides.
struct ScoreRows {
  int64_t batch = 0;
  int64_t heads_q = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t ld = 0;
};

// The variants, as the row kernels apply them (row_policies.cuh). Pointers null: off.
struct RowVariants {
  int64_t window_left = -1;  // the mask, causal folded in (Problem's; -1: unbounded)
  int64_t window_right = -1;
  float softcap = 0.0f;  // 0: none
  AlibiView alibi;
  Vector<const float> sinks;
  SeqOffsets cu_seqlens_q;
  SeqOffsets cu_seqlens_k;
};

// What the row softmax writes besides P; each is optional (null data: not wanted).
struct SoftmaxExtras {
  LseView lse;  // the forward's LSE, at the caller's rows; padding rows write none
  // [rows x ld] (ScoreRows' indexing): the softcap's derivative 1 - tanh^2(s / c) at every key a
  // row sees, 0 elsewhere in [0, seqlen_k): the factor the backward's dS takes.
  float* softcap_grad = nullptr;
  // [rows]: the sink's probability e^{sink - lse} of every row, 0 for a row that sees no key and
  // for padding: what the sinks' gradient weighs each row's D with.
  float* sink_share = nullptr;
};

// Row-wise softmax of the logits (raw scores S, fp32, turned into logits by the softcap and
// ALiBi) over the keys each row sees, the sink in the denominator: writes P (dtype, ScoreRows'
// indexing) for columns < seqlen_k, 0 at every key the row does not see; a row that sees no key
// is all zeros, with LSE -inf. Keys a row does not see are not read, so a NaN or an infinity
// there stays out. LSE = log(sum of e^logit + e^sink), natural log.
cudaError_t softmax_rows(DType dtype, const float* s, void* p, const ScoreRows& shape,
                         const RowVariants& variants, const SoftmaxExtras& extras,
                         cudaStream_t stream);

// In place, the softmax gradient dS: p[r, j] = p[r, j] * (dp[r, j] - D[r]) * g[r, j] for
// j < cols, with D[r] = sum_j p[r, j] * dp[r, j] (P in dtype, dP fp32, both with leading
// dimension ld) and g the softcap's derivative (softcap_grad, same indexing; null: 1). Where
// p[r, j] is 0 the result is 0 and neither dp[r, j] nor g[r, j] is read: a NaN or infinity there
// (from a value the mask hides) stays out. With `delta` set, delta[r] = D[r].
cudaError_t softmax_grad(DType dtype, void* p, const float* dp, const float* softcap_grad,
                         int64_t ld, int64_t rows, int64_t cols, float* delta,
                         cudaStream_t stream);

// dsinks[h] = -sum over the rows of head h (every batch entry, ScoreRows' indexing) of
// sink_share * delta, overwritten. Each head's sum runs in double, in an order fixed by the
// shape alone: the same bits on every run.
cudaError_t sink_gradient(const float* sink_share, const float* delta, const ScoreRows& shape,
                          Vector<float> dsinks, cudaStream_t stream);

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
