#include "cuda/standard/standard.hpp"

#include <climits>
#include <cstdint>

#include "core/error.hpp"
#include "cuda/bulk_store_mark.hpp"
#include "cuda/cuda_util.hpp"
#include "cuda/standard/standard_kernels.hpp"

namespace flashattn {
namespace cuda {
namespace standard {

namespace {

constexpr size_t kAlign = 256;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Where each array lives in the workspace. Offsets are 256-byte aligned.
struct Layout {
  int64_t ld_s = 0;  // leading dimension of S, P, dP, dS rows (seqlen_k rounded up to 8)
  int64_t ld_d = 0;  // leading dimension of packed rows (head_dim rounded up to 8)
  size_t s = 0, p = 0, q = 0, k = 0, v = 0, o = 0;  // forward (o: packed output)
  size_t dout = 0, dq = 0, dk = 0, dv = 0;  // backward
  size_t total = 0;
};

class Sizer {
 public:
  // Reserves count * elem bytes; returns the offset. Overflow throws UNSUPPORTED.
  size_t take(int64_t count, size_t elem) {
    size_t bytes;
    size_t aligned;
    if (__builtin_mul_overflow(static_cast<size_t>(count), elem, &bytes) ||
        __builtin_add_overflow(bytes, kAlign - 1, &aligned)) {
      overflow();
    }
    aligned -= aligned % kAlign;
    const size_t at = total_;
    if (__builtin_add_overflow(total_, aligned, &total_)) overflow();
    return at;
  }
  size_t total() const { return total_; }

 private:
  [[noreturn]] static void overflow() {
    fail(FLASHATTN_ERROR_UNSUPPORTED,
         "the standard algorithm's materialized S and P would need more than 2^64 bytes");
  }
  size_t total_ = 0;
};

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) {
    fail(FLASHATTN_ERROR_UNSUPPORTED,
         "the standard algorithm's materialized S and P would need more than 2^63 elements");
  }
  return r;
}

Layout plan(const Problem& p, bool backward) {
  Layout l;
  l.ld_s = round_up(p.seqlen_k, 8);  // 16-byte aligned rows for fp32 S and 16-bit P alike
  l.ld_d = round_up(p.head_dim, 8);
  const size_t e = dtype_size(p.dtype);
  const int64_t rows = checked_mul(checked_mul(p.batch, p.heads_q), p.seqlen_q);
  const int64_t score = checked_mul(rows, l.ld_s);
  const int64_t q_elems = checked_mul(rows, l.ld_d);
  const int64_t kv_elems = checked_mul(checked_mul(checked_mul(p.batch, p.heads_kv), p.seqlen_k),
                                       l.ld_d);
  Sizer z;
  l.s = z.take(score, 4);
  l.p = z.take(score, e);
  l.q = z.take(q_elems, e);
  l.k = z.take(kv_elems, e);
  l.v = z.take(kv_elems, e);
  if (!backward) {
    l.o = z.take(q_elems, e);
  } else {
    l.dout = z.take(q_elems, e);
    l.dq = z.take(q_elems, e);
    l.dk = z.take(kv_elems, e);
    l.dv = z.take(kv_elems, e);
  }
  l.total = z.total();
  return l;
}

cudaDataType cuda_type(DType t) { return t == DType::F16 ? CUDA_R_16F : CUDA_R_16BF; }

Strides4 strides_of(const Tensor4& t) { return Strides4{t.stride_batch, t.stride_seq, t.stride_head}; }

// The packed [batch, heads, seqlen, ld_d] layout.
Strides4 packed(int64_t heads, int64_t seqlen, int64_t ld_d) {
  return Strides4{heads * seqlen * ld_d, ld_d, seqlen * ld_d};
}

void check_launch(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_cuda(e, what);
}

size_t size_of(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

// One strided-batched GEMM in cuBLAS's column-major terms, fp32 accumulation.
struct Gemm {
  const Context& c;
  void operator()(const char* what, cublasOperation_t ta, cublasOperation_t tb, int64_t m,
                  int64_t n, int64_t k, float alpha, const void* A, cudaDataType at, int64_t lda,
                  int64_t stride_a, const void* B, cudaDataType bt, int64_t ldb, int64_t stride_b,
                  void* C, cudaDataType ct, int64_t ldc, int64_t stride_c, int64_t batch) const {
    const float beta = 0.0f;
    cublasStatus_t s = c.api->gemm_strided_batched(
        c.handle, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha,
        A, at, static_cast<int>(lda), stride_a, B, bt, static_cast<int>(ldb), stride_b, &beta, C,
        ct, static_cast<int>(ldc), stride_c, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
      (void)cudaGetLastError();
      fail(FLASHATTN_ERROR_DEVICE,
           "cuBLAS GEMM for %s (m=%lld n=%lld k=%lld, batch %lld) failed: %s", what,
           static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
           static_cast<long long>(batch), cublas_status_text(s));
    }
    // C's extent: columns of m elements, ldc apart, batches stride_c apart (the ldc - m pad
    // elements of each column, fewer than 8, are inside it).
    mark_written(C, static_cast<size_t>((batch - 1) * stride_c + (n - 1) * ldc + m) * size_of(ct),
                 c.stream);
  }
};

char* at(void* base, size_t offset) { return static_cast<char*>(base) + offset; }

// Shared by forward and backward: packs q, k, v, then S = scale * Q K^T and P = softmax(S).
struct Shapes {
  int64_t groups;     // batch * heads_kv: the GEMMs' batch
  int64_t group_rows;  // (heads_q / heads_kv) * seqlen_q: rows of one group's Q, S, P, O
};

Shapes shapes_of(const Problem& p) {
  return Shapes{p.batch * p.heads_kv, p.group_size() * p.seqlen_q};
}

void scores_and_probabilities(const Problem& p, const Layout& l, void* ws, const Tensor4& q,
                              const Tensor4& k, const Tensor4& v, LseView lse, const Context& c) {
  const Shapes sh = shapes_of(p);
  const Strides4 pq = packed(p.heads_q, p.seqlen_q, l.ld_d);
  const Strides4 pkv = packed(p.heads_kv, p.seqlen_k, l.ld_d);
  check_launch(copy_4d(p.dtype, q.data, strides_of(q), at(ws, l.q), pq, p.batch, p.seqlen_q,
                       p.heads_q, p.head_dim, c.stream),
               "packing q");
  check_launch(copy_4d(p.dtype, k.data, strides_of(k), at(ws, l.k), pkv, p.batch, p.seqlen_k,
                       p.heads_kv, p.head_dim, c.stream),
               "packing k");
  check_launch(copy_4d(p.dtype, v.data, strides_of(v), at(ws, l.v), pkv, p.batch, p.seqlen_k,
                       p.heads_kv, p.head_dim, c.stream),
               "packing v");
  const cudaDataType t = cuda_type(p.dtype);
  // Row-major S_g [group_rows x Nk] = Q_g K^T is column-major S_g^T = K Q_g^T.
  Gemm{c}("S = scale * Q K^T", CUBLAS_OP_T, CUBLAS_OP_N, p.seqlen_k, sh.group_rows, p.head_dim,
          p.scale, at(ws, l.k), t, l.ld_d, p.seqlen_k * l.ld_d, at(ws, l.q), t, l.ld_d,
          sh.group_rows * l.ld_d, at(ws, l.s), CUDA_R_32F, l.ld_s, sh.group_rows * l.ld_s,
          sh.groups);
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  check_launch(softmax_rows(p.dtype, reinterpret_cast<const float*>(at(ws, l.s)), at(ws, l.p),
                            l.ld_s, rows, p.seqlen_q, p.seqlen_k, p.heads_q, p.causal, lse,
                            c.stream),
               "the standard softmax kernel");
}

// A GEMM multiplies every term: where A is a masked P or dS (0) and B holds a NaN or an
// infinity the mask hides, C gets 0 * inf. Those elements of C are recomputed without the
// zero terms (redo_nonfinite); finite ones stay as they are.
void keep_mask_zeros(const Problem& p, const char* what, const void* a, MatrixView av,
                     const void* b, MatrixView bv, void* c, MatrixView cv, int64_t m, int64_t k,
                     int64_t groups, float alpha, const Context& ctx) {
  check_launch(redo_nonfinite(p.dtype, a, av, b, bv, c, cv, m, p.head_dim, k, groups, alpha,
                              ctx.stream),
               what);
}

void unpack(const Problem& p, const void* from, const Tensor4& to, int64_t heads, int64_t seqlen,
            int64_t ld_d, const char* what, const Context& c) {
  check_launch(copy_4d(p.dtype, from, packed(heads, seqlen, ld_d), to.data, strides_of(to),
                       p.batch, seqlen, heads, p.head_dim, c.stream),
               what);
}

}  // namespace

const char* unsupported_reason(const Problem& p) {
  if (p.dtype != DType::F16 && p.dtype != DType::BF16) {
    return "the CUDA backend computes in float16 and bfloat16; float32 runs on the CPU backend";
  }
  // Variants not built here yet (a window of (-1, 0) is the causal mask, which is).
  if (p.sliding_window()) return "a sliding window (options.window) is not implemented yet";
  if (p.softcap > 0.0f) return "a softcap (options.softcap) is not implemented yet";
  if (p.alibi != Alibi::None) return "ALiBi slopes are not implemented yet";
  if (p.sinks) return "attention sinks are not implemented yet";
  if (p.head_dim_v != p.head_dim) {
    return "a head_dim of v that differs from q's is not implemented yet";
  }
  if (p.varlen) {
    return "variable-length batches (cu_seqlens_q, cu_seqlens_k) are not implemented yet";
  }
  // cuBLAS takes int sizes, leading dimensions and batch counts.
  const int64_t max_int = INT_MAX;
  if (p.group_size() * p.seqlen_q > max_int || round_up(p.seqlen_k, 8) > max_int ||
      p.batch * p.heads_kv > max_int) {
    return "the standard algorithm's GEMMs need heads_q / heads_kv * seqlen_q, seqlen_k and "
           "batch * heads_kv below 2^31";
  }
  return nullptr;
}

size_t workspace_size(const Problem& p, bool backward) { return plan(p, backward).total; }

void forward(const ForwardArgs& a, void* ws, size_t ws_size, const Context& c) {
  const Problem& p = a.problem;
  const Layout l = plan(p, false);
  if (ws_size < l.total) {
    fail(FLASHATTN_ERROR_INTERNAL, "standard forward: workspace of %zu bytes, needs %zu", ws_size,
         l.total);
  }
  const Shapes sh = shapes_of(p);
  const cudaDataType t = cuda_type(p.dtype);
  scores_and_probabilities(p, l, ws, a.q, a.k, a.v, a.lse, c);
  // Row-major O_g [group_rows x D] = P_g V is column-major O_g^T = V^T P_g^T.
  Gemm{c}("O = P V", CUBLAS_OP_N, CUBLAS_OP_N, p.head_dim, sh.group_rows, p.seqlen_k, 1.0f,
          at(ws, l.v), t, l.ld_d, p.seqlen_k * l.ld_d, at(ws, l.p), t, l.ld_s,
          sh.group_rows * l.ld_s, at(ws, l.o), t, l.ld_d, sh.group_rows * l.ld_d, sh.groups);
  keep_mask_zeros(p, "O = P V without masked terms", at(ws, l.p),
                  MatrixView{l.ld_s, 1, sh.group_rows * l.ld_s}, at(ws, l.v),
                  MatrixView{l.ld_d, 1, p.seqlen_k * l.ld_d}, at(ws, l.o),
                  MatrixView{l.ld_d, 1, sh.group_rows * l.ld_d}, sh.group_rows, p.seqlen_k,
                  sh.groups, 1.0f, c);
  unpack(p, at(ws, l.o), a.out, p.heads_q, p.seqlen_q, l.ld_d, "writing out", c);
}

void backward(const BackwardArgs& a, void* ws, size_t ws_size, const Context& c) {
  const Problem& p = a.problem;
  const Layout l = plan(p, true);
  if (ws_size < l.total) {
    fail(FLASHATTN_ERROR_INTERNAL, "standard backward: workspace of %zu bytes, needs %zu",
         ws_size, l.total);
  }
  const Shapes sh = shapes_of(p);
  const cudaDataType t = cuda_type(p.dtype);
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  const Strides4 pq = packed(p.heads_q, p.seqlen_q, l.ld_d);

  check_launch(copy_4d(p.dtype, a.dout.data, strides_of(a.dout), at(ws, l.dout), pq, p.batch,
                       p.seqlen_q, p.heads_q, p.head_dim, c.stream),
               "packing dout");
  scores_and_probabilities(p, l, ws, a.q, a.k, a.v, LseView{}, c);
  // P and dS rows of a group, and the same seen from the keys' side (transposed).
  const MatrixView by_rows{l.ld_s, 1, sh.group_rows * l.ld_s};
  const MatrixView by_keys{1, l.ld_s, sh.group_rows * l.ld_s};
  const MatrixView q_rows{l.ld_d, 1, sh.group_rows * l.ld_d};
  const MatrixView kv_rows{l.ld_d, 1, p.seqlen_k * l.ld_d};

  // dV = P_g^T dO_g (the GQA group's sum is the GEMM's k-loop): column-major dV^T = dO_g^T P_g.
  Gemm{c}("dV = P^T dO", CUBLAS_OP_N, CUBLAS_OP_T, p.head_dim, p.seqlen_k, sh.group_rows, 1.0f,
          at(ws, l.dout), t, l.ld_d, sh.group_rows * l.ld_d, at(ws, l.p), t, l.ld_s,
          sh.group_rows * l.ld_s, at(ws, l.dv), t, l.ld_d, p.seqlen_k * l.ld_d, sh.groups);
  keep_mask_zeros(p, "dV = P^T dO without masked terms", at(ws, l.p), by_keys, at(ws, l.dout),
                  q_rows, at(ws, l.dv), kv_rows, p.seqlen_k, sh.group_rows, sh.groups, 1.0f, c);
  // dP = dO_g V^T into S's memory (S is spent): column-major dP^T = V dO_g^T.
  Gemm{c}("dP = dO V^T", CUBLAS_OP_T, CUBLAS_OP_N, p.seqlen_k, sh.group_rows, p.head_dim, 1.0f,
          at(ws, l.v), t, l.ld_d, p.seqlen_k * l.ld_d, at(ws, l.dout), t, l.ld_d,
          sh.group_rows * l.ld_d, at(ws, l.s), CUDA_R_32F, l.ld_s, sh.group_rows * l.ld_s,
          sh.groups);
  // dS = P * (dP - D), D = rowsum(P * dP), in place over P (dV has read P already: same
  // stream).
  check_launch(softmax_grad(p.dtype, at(ws, l.p), reinterpret_cast<const float*>(at(ws, l.s)),
                            l.ld_s, rows, p.seqlen_k, c.stream),
               "dS = P * (dP - D)");
  // dQ_g = scale * dS_g K: column-major dQ_g^T = K^T dS_g^T.
  Gemm{c}("dQ = scale * dS K", CUBLAS_OP_N, CUBLAS_OP_N, p.head_dim, sh.group_rows, p.seqlen_k,
          p.scale, at(ws, l.k), t, l.ld_d, p.seqlen_k * l.ld_d, at(ws, l.p), t, l.ld_s,
          sh.group_rows * l.ld_s, at(ws, l.dq), t, l.ld_d, sh.group_rows * l.ld_d, sh.groups);
  keep_mask_zeros(p, "dQ = scale * dS K without masked terms", at(ws, l.p), by_rows, at(ws, l.k),
                  kv_rows, at(ws, l.dq), q_rows, sh.group_rows, p.seqlen_k, sh.groups, p.scale, c);
  // dK = scale * dS_g^T Q_g: column-major dK^T = Q_g^T dS_g.
  Gemm{c}("dK = scale * dS^T Q", CUBLAS_OP_N, CUBLAS_OP_T, p.head_dim, p.seqlen_k,
          sh.group_rows, p.scale, at(ws, l.q), t, l.ld_d, sh.group_rows * l.ld_d, at(ws, l.p), t,
          l.ld_s, sh.group_rows * l.ld_s, at(ws, l.dk), t, l.ld_d, p.seqlen_k * l.ld_d,
          sh.groups);
  keep_mask_zeros(p, "dK = scale * dS^T Q without masked terms", at(ws, l.p), by_keys,
                  at(ws, l.q), q_rows, at(ws, l.dk), kv_rows, p.seqlen_k, sh.group_rows, sh.groups,
                  p.scale, c);

  unpack(p, at(ws, l.dq), a.dq, p.heads_q, p.seqlen_q, l.ld_d, "writing dq", c);
  unpack(p, at(ws, l.dk), a.dk, p.heads_kv, p.seqlen_k, l.ld_d, "writing dk", c);
  unpack(p, at(ws, l.dv), a.dv, p.heads_kv, p.seqlen_k, l.ld_d, "writing dv", c);
}

}  // namespace standard
}  // namespace cuda
}  // namespace flashattn
