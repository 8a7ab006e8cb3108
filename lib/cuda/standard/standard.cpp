#include "cuda/standard/standard.hpp"

#include <algorithm>
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
// Leading dimensions are multiples of 8 elements: 16-byte aligned rows for fp32 and 16-bit
// matrices alike (cuBLAS's fast paths, the copies' widest vectors).
constexpr int64_t kLdMultiple = 8;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Where each array lives in the workspace. Offsets are 256-byte aligned; an array the problem
// does not use takes no bytes (and its offset means nothing).
//
// Every packed array is padded to the longest sequence: [batch, heads, nq or nk, ld]. For a
// fixed-length batch that is exactly its shape; for a variable-length one, a shorter sequence's
// rows past its length are zeros, which the mask hides, so the GEMMs stay single strided-batched
// calls and no launch needs the offsets on the host.
struct Layout {
  int64_t nq = 0;    // query rows per (batch entry, head): max(seqlen_q, 1)
  int64_t nk = 0;    // key rows per (batch entry, kv head): max(seqlen_k, 1)
  int64_t ld_s = 0;  // leading dimension of S, P, dP, dS (and the softcap's derivative) rows
  int64_t ld_qk = 0;  // of packed q, k, dq, dk rows (head_dim rounded up)
  int64_t ld_v = 0;   // of packed v, out, dout, dv rows (head_dim_v rounded up)
  size_t s = 0, p = 0, q = 0, k = 0, v = 0, o = 0;  // forward (o: packed output)
  size_t dout = 0, dq = 0, dk = 0, dv = 0;          // backward
  size_t softcap_grad = 0;  // backward with a softcap: fp32, S's shape
  size_t sink_share = 0, delta = 0;  // backward with sinks: fp32, one per score row
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
  // A variable-length batch may promise 0 as its longest length; one padding row keeps every
  // GEMM non-empty (and all its sequences are then empty, so the row is masked throughout).
  l.nq = std::max<int64_t>(p.seqlen_q, 1);
  l.nk = std::max<int64_t>(p.seqlen_k, 1);
  l.ld_s = round_up(l.nk, kLdMultiple);
  l.ld_qk = round_up(p.head_dim, kLdMultiple);
  l.ld_v = round_up(p.head_dim_v, kLdMultiple);
  const size_t e = dtype_size(p.dtype);
  const int64_t rows = checked_mul(checked_mul(p.batch, p.heads_q), l.nq);
  const int64_t kv_rows = checked_mul(checked_mul(p.batch, p.heads_kv), l.nk);
  const int64_t score = checked_mul(rows, l.ld_s);
  Sizer z;
  l.s = z.take(score, sizeof(float));
  l.p = z.take(score, e);
  l.q = z.take(checked_mul(rows, l.ld_qk), e);
  l.k = z.take(checked_mul(kv_rows, l.ld_qk), e);
  l.v = z.take(checked_mul(kv_rows, l.ld_v), e);
  if (!backward) {
    l.o = z.take(checked_mul(rows, l.ld_v), e);
  } else {
    l.dout = z.take(checked_mul(rows, l.ld_v), e);
    l.dq = z.take(checked_mul(rows, l.ld_qk), e);
    l.dk = z.take(checked_mul(kv_rows, l.ld_qk), e);
    l.dv = z.take(checked_mul(kv_rows, l.ld_v), e);
    if (p.softcap > 0.0f) l.softcap_grad = z.take(score, sizeof(float));
    if (p.sinks) {
      l.sink_share = z.take(rows, sizeof(float));
      l.delta = z.take(rows, sizeof(float));
    }
  }
  l.total = z.total();
  return l;
}

cudaDataType cuda_type(DType t) { return t == DType::F16 ? CUDA_R_16F : CUDA_R_16BF; }

Strides4 strides_of(const Tensor4& t) {
  return Strides4{t.stride_batch, t.stride_seq, t.stride_head};
}

// The packed [batch, heads, rows, ld] layout.
Strides4 packed(int64_t heads, int64_t rows, int64_t ld) {
  return Strides4{heads * rows * ld, ld, rows * ld};
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
float* floats_at(void* base, size_t offset) { return reinterpret_cast<float*>(at(base, offset)); }

// The GEMMs' batching: one batch per (batch entry, kv head), the g query heads of a GQA group
// stacked as g * nq rows of its Q, S, P, O.
struct Shapes {
  int64_t groups;      // batch * heads_kv: the GEMMs' batch
  int64_t group_rows;  // (heads_q / heads_kv) * nq: rows of one group's Q, S, P, O
};

Shapes shapes_of(const Problem& p, const Layout& l) {
  return Shapes{p.batch * p.heads_kv, p.group_size() * l.nq};
}

ScoreRows score_rows(const Problem& p, const Layout& l) {
  ScoreRows r;
  r.batch = p.batch;
  r.heads_q = p.heads_q;
  r.seqlen_q = l.nq;
  r.seqlen_k = l.nk;
  r.ld = l.ld_s;
  return r;
}

RowVariants row_variants(const Problem& p, const VariantViews& v) {
  RowVariants r;
  r.window_left = p.window_left;
  // causal is the right bound 0 (the API folds it into window_right; a Problem that says only
  // causal means the same).
  r.window_right = p.causal ? 0 : p.window_right;
  r.softcap = p.softcap;
  if (p.alibi != Alibi::None) r.alibi = v.alibi;
  if (p.sinks) r.sinks = v.sinks;
  if (p.varlen) {
    r.cu_seqlens_q = v.cu_seqlens_q;
    r.cu_seqlens_k = v.cu_seqlens_k;
  }
  return r;
}

// One caller tensor into its padded packed layout, and back.
void pack(const Problem& p, const Tensor4& from, SeqOffsets rows_of, void* to, int64_t heads,
          int64_t rows, int64_t dim, int64_t ld, const char* what, const Context& c) {
  check_launch(pack_rows(p.dtype, from.data, strides_of(from), rows_of, to,
                         packed(heads, rows, ld), p.batch, rows, heads, dim, c.stream),
               what);
}

void unpack(const Problem& p, const void* from, const Tensor4& to, SeqOffsets rows_of,
            int64_t heads, int64_t rows, int64_t dim, int64_t ld, const char* what,
            const Context& c) {
  check_launch(unpack_rows(p.dtype, from, packed(heads, rows, ld), to.data, strides_of(to),
                           rows_of, p.batch, rows, heads, dim, c.stream),
               what);
}

// Shared by forward and backward: packs q, k, v, then S = scale * Q K^T and P = softmax of the
// logits, with what `extras` asks for.
void scores_and_probabilities(const Problem& p, const Layout& l, void* ws, const Tensor4& q,
                              const Tensor4& k, const Tensor4& v, const RowVariants& variants,
                              const SoftmaxExtras& extras, const Context& c) {
  const Shapes sh = shapes_of(p, l);
  pack(p, q, variants.cu_seqlens_q, at(ws, l.q), p.heads_q, l.nq, p.head_dim, l.ld_qk,
       "packing q", c);
  pack(p, k, variants.cu_seqlens_k, at(ws, l.k), p.heads_kv, l.nk, p.head_dim, l.ld_qk, "packing k",
       c);
  pack(p, v, variants.cu_seqlens_k, at(ws, l.v), p.heads_kv, l.nk, p.head_dim_v, l.ld_v,
       "packing v", c);
  const cudaDataType t = cuda_type(p.dtype);
  // Row-major S_g [group_rows x nk] = Q_g K^T is column-major S_g^T = K Q_g^T.
  Gemm{c}("S = scale * Q K^T", CUBLAS_OP_T, CUBLAS_OP_N, l.nk, sh.group_rows, p.head_dim,
          p.scale, at(ws, l.k), t, l.ld_qk, l.nk * l.ld_qk, at(ws, l.q), t, l.ld_qk,
          sh.group_rows * l.ld_qk, at(ws, l.s), CUDA_R_32F, l.ld_s, sh.group_rows * l.ld_s,
          sh.groups);
  check_launch(softmax_rows(p.dtype, floats_at(ws, l.s), at(ws, l.p), score_rows(p, l), variants,
                            extras, c.stream),
               "the standard softmax kernel");
}

// A GEMM multiplies every term: where A is a masked P or dS (0) and B holds a NaN or an
// infinity the mask hides, C gets 0 * inf. Those elements of C are recomputed without the
// zero terms (redo_nonfinite); finite ones stay as they are. C is m x n, the depth k.
void keep_mask_zeros(const Problem& p, const char* what, const void* a, MatrixView av,
                     const void* b, MatrixView bv, void* c, MatrixView cv, int64_t m, int64_t n,
                     int64_t k, int64_t groups, float alpha, const Context& ctx) {
  check_launch(redo_nonfinite(p.dtype, a, av, b, bv, c, cv, m, n, k, groups, alpha, ctx.stream),
               what);
}

}  // namespace

const char* unsupported_reason(const Problem& p) {
  if (p.dtype != DType::F16 && p.dtype != DType::BF16) {
    return "the CUDA backend computes in float16 and bfloat16; float32 runs on the CPU backend";
  }
  // cuBLAS takes int sizes, leading dimensions and batch counts.
  const int64_t max_int = INT_MAX;
  if (p.group_size() * p.seqlen_q > max_int || round_up(p.seqlen_k, kLdMultiple) > max_int ||
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
  const Shapes sh = shapes_of(p, l);
  const cudaDataType t = cuda_type(p.dtype);
  const RowVariants variants = row_variants(p, a.variants);
  SoftmaxExtras extras;
  extras.lse = a.lse;
  scores_and_probabilities(p, l, ws, a.q, a.k, a.v, variants, extras, c);
  // Row-major O_g [group_rows x Dv] = P_g V is column-major O_g^T = V^T P_g^T.
  Gemm{c}("O = P V", CUBLAS_OP_N, CUBLAS_OP_N, p.head_dim_v, sh.group_rows, l.nk, 1.0f,
          at(ws, l.v), t, l.ld_v, l.nk * l.ld_v, at(ws, l.p), t, l.ld_s, sh.group_rows * l.ld_s,
          at(ws, l.o), t, l.ld_v, sh.group_rows * l.ld_v, sh.groups);
  keep_mask_zeros(p, "O = P V without masked terms", at(ws, l.p),
                  MatrixView{l.ld_s, 1, sh.group_rows * l.ld_s}, at(ws, l.v),
                  MatrixView{l.ld_v, 1, l.nk * l.ld_v}, at(ws, l.o),
                  MatrixView{l.ld_v, 1, sh.group_rows * l.ld_v}, sh.group_rows, p.head_dim_v,
                  l.nk, sh.groups, 1.0f, c);
  unpack(p, at(ws, l.o), a.out, variants.cu_seqlens_q, p.heads_q, l.nq, p.head_dim_v, l.ld_v,
         "writing out", c);
}

void backward(const BackwardArgs& a, void* ws, size_t ws_size, const Context& c) {
  const Problem& p = a.problem;
  const Layout l = plan(p, true);
  if (ws_size < l.total) {
    fail(FLASHATTN_ERROR_INTERNAL, "standard backward: workspace of %zu bytes, needs %zu",
         ws_size, l.total);
  }
  const Shapes sh = shapes_of(p, l);
  const cudaDataType t = cuda_type(p.dtype);
  const int64_t rows = p.batch * p.heads_q * l.nq;
  const RowVariants variants = row_variants(p, a.variants);
  const bool sinks_grad = p.sinks && a.dsinks.data != nullptr;
  float* softcap_grad = p.softcap > 0.0f ? floats_at(ws, l.softcap_grad) : nullptr;
  float* sink_share = sinks_grad ? floats_at(ws, l.sink_share) : nullptr;
  float* delta = sinks_grad ? floats_at(ws, l.delta) : nullptr;

  pack(p, a.dout, variants.cu_seqlens_q, at(ws, l.dout), p.heads_q, l.nq, p.head_dim_v, l.ld_v,
       "packing dout", c);
  SoftmaxExtras extras;
  extras.softcap_grad = softcap_grad;
  extras.sink_share = sink_share;
  scores_and_probabilities(p, l, ws, a.q, a.k, a.v, variants, extras, c);
  // P and dS rows of a group, and the same seen from the keys' side (transposed).
  const MatrixView by_rows{l.ld_s, 1, sh.group_rows * l.ld_s};
  const MatrixView by_keys{1, l.ld_s, sh.group_rows * l.ld_s};
  const MatrixView q_rows{l.ld_qk, 1, sh.group_rows * l.ld_qk};
  const MatrixView k_rows{l.ld_qk, 1, l.nk * l.ld_qk};
  const MatrixView dout_rows{l.ld_v, 1, sh.group_rows * l.ld_v};
  const MatrixView v_rows{l.ld_v, 1, l.nk * l.ld_v};

  // dV = P_g^T dO_g (the GQA group's sum is the GEMM's k-loop): column-major dV^T = dO_g^T P_g.
  Gemm{c}("dV = P^T dO", CUBLAS_OP_N, CUBLAS_OP_T, p.head_dim_v, l.nk, sh.group_rows, 1.0f,
          at(ws, l.dout), t, l.ld_v, sh.group_rows * l.ld_v, at(ws, l.p), t, l.ld_s,
          sh.group_rows * l.ld_s, at(ws, l.dv), t, l.ld_v, l.nk * l.ld_v, sh.groups);
  keep_mask_zeros(p, "dV = P^T dO without masked terms", at(ws, l.p), by_keys, at(ws, l.dout),
                  dout_rows, at(ws, l.dv), v_rows, l.nk, p.head_dim_v, sh.group_rows, sh.groups,
                  1.0f, c);
  // dP = dO_g V^T into S's memory (S is spent): column-major dP^T = V dO_g^T.
  Gemm{c}("dP = dO V^T", CUBLAS_OP_T, CUBLAS_OP_N, l.nk, sh.group_rows, p.head_dim_v, 1.0f,
          at(ws, l.v), t, l.ld_v, l.nk * l.ld_v, at(ws, l.dout), t, l.ld_v,
          sh.group_rows * l.ld_v, at(ws, l.s), CUDA_R_32F, l.ld_s, sh.group_rows * l.ld_s,
          sh.groups);
  // dS = P * (dP - D) (* the softcap's derivative), D = rowsum(P * dP), in place over P (dV has
  // read P already: same stream). D = rowsum(dO * O) as the header has it: the sink's value is 0.
  check_launch(softmax_grad(p.dtype, at(ws, l.p), floats_at(ws, l.s), softcap_grad, l.ld_s, rows,
                            l.nk, delta, c.stream),
               "dS = P * (dP - D)");
  if (sinks_grad) {
    check_launch(sink_gradient(sink_share, delta, score_rows(p, l), a.dsinks, c.stream),
                 "dsinks = -sum of P_sink * D");
  }
  // dQ_g = scale * dS_g K: column-major dQ_g^T = K^T dS_g^T.
  Gemm{c}("dQ = scale * dS K", CUBLAS_OP_N, CUBLAS_OP_N, p.head_dim, sh.group_rows, l.nk,
          p.scale, at(ws, l.k), t, l.ld_qk, l.nk * l.ld_qk, at(ws, l.p), t, l.ld_s,
          sh.group_rows * l.ld_s, at(ws, l.dq), t, l.ld_qk, sh.group_rows * l.ld_qk, sh.groups);
  keep_mask_zeros(p, "dQ = scale * dS K without masked terms", at(ws, l.p), by_rows, at(ws, l.k),
                  k_rows, at(ws, l.dq), q_rows, sh.group_rows, p.head_dim, l.nk, sh.groups,
                  p.scale, c);
  // dK = scale * dS_g^T Q_g: column-major dK^T = Q_g^T dS_g.
  Gemm{c}("dK = scale * dS^T Q", CUBLAS_OP_N, CUBLAS_OP_T, p.head_dim, l.nk, sh.group_rows,
          p.scale, at(ws, l.q), t, l.ld_qk, sh.group_rows * l.ld_qk, at(ws, l.p), t, l.ld_s,
          sh.group_rows * l.ld_s, at(ws, l.dk), t, l.ld_qk, l.nk * l.ld_qk, sh.groups);
  keep_mask_zeros(p, "dK = scale * dS^T Q without masked terms", at(ws, l.p), by_keys,
                  at(ws, l.q), q_rows, at(ws, l.dk), k_rows, l.nk, p.head_dim, sh.group_rows,
                  sh.groups, p.scale, c);

  unpack(p, at(ws, l.dq), a.dq, variants.cu_seqlens_q, p.heads_q, l.nq, p.head_dim, l.ld_qk,
         "writing dq", c);
  unpack(p, at(ws, l.dk), a.dk, variants.cu_seqlens_k, p.heads_kv, l.nk, p.head_dim, l.ld_qk,
         "writing dk", c);
  unpack(p, at(ws, l.dv), a.dv, variants.cu_seqlens_k, p.heads_kv, l.nk, p.head_dim_v, l.ld_v,
         "writing dv", c);
}

}  // namespace standard
}  // namespace cuda
}  // namespace flashattn
