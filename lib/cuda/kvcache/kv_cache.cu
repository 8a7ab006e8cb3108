// The KV cache's appends and rotary embedding (kv_cache.hpp): one thread per element, in fp32,
// rounded once into the storage type. Rows of k_new land where KvRows says the cache keeps them.
#include "cuda/kvcache/kv_cache.hpp"

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/kv_rows.cuh"

namespace flashattn {
namespace cuda {
namespace {

constexpr int kThreads = 128;
constexpr size_t kWorkspaceAlign = 256;

// The rotary tables and the layout of a pair: (2r, 2r + 1) interleaved, else (r, r + R / 2).
struct Rotary {
  const void* cos;
  const void* sin;
  int64_t cos_pos_stride, cos_pair_stride, sin_pos_stride, sin_pair_stride;
  int dim;  // R; 0: none
  bool interleaved;
  bool tables_f32;  // the tables' dtype: float32, else the elements'
};

// Where one row goes and comes from: source row pointer, destination row pointer, position.
template <class T>
__device__ __forceinline__ float table_at(const Rotary& r, bool sine, int pos, int pair) {
  const int64_t at = sine ? pos * r.sin_pos_stride + pair * r.sin_pair_stride
                          : pos * r.cos_pos_stride + pair * r.cos_pair_stride;
  const void* t = sine ? r.sin : r.cos;
  return r.tables_f32 ? static_cast<const float*>(t)[at]
                      : static_cast<float>(static_cast<const T*>(t)[at]);
}

// Element e of a row rotated at `pos` (or copied, past R).
template <class T>
__device__ __forceinline__ T rotated(const T* src, int e, int pos, const Rotary& r) {
  if (e >= r.dim) return src[e];
  const int half = r.dim / 2;
  const int pair = r.interleaved ? e / 2 : e % half;
  const bool first = r.interleaved ? e % 2 == 0 : e < half;
  const int i0 = r.interleaved ? 2 * pair : pair;
  const int i1 = r.interleaved ? 2 * pair + 1 : pair + half;
  const float x = static_cast<float>(src[i0]), y = static_cast<float>(src[i1]);
  const float c = table_at<T>(r, false, pos, pair), s = table_at<T>(r, true, pos, pair);
  return static_cast<T>(first ? x * c - y * s : x * s + y * c);
}

struct RowsOf {
  const void* data;
  int64_t batch_stride, row_stride, head_stride;
};

// One block per (batch, new row, KV head): k_new's row (rotated) and v_new's into the cache.
template <class T>
__global__ void __launch_bounds__(kThreads)
    append_kernel(const __grid_constant__ FwdParams p, const RowsOf k_new, const RowsOf v_new,
                  const Rotary rot, int head_dim_v) {
  const int head = blockIdx.x % p.heads_kv;
  const int i = blockIdx.x / p.heads_kv % p.seqlen_new;
  const int batch = blockIdx.x / p.heads_kv / p.seqlen_new;
  const int pos = p.cache_seqlens[batch * p.cache_seqlens_stride] + i;
  const common::KvRows<T> k_rows(p, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride,
                                 batch, head, 0);
  const common::KvRows<T> v_rows(p, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride,
                                 batch, head, 0);
  T* k_dst = const_cast<T*>(k_rows.row(pos));
  T* v_dst = const_cast<T*>(v_rows.row(pos));
  const T* k_src = static_cast<const T*>(k_new.data) + batch * k_new.batch_stride +
                   i * k_new.row_stride + head * k_new.head_stride;
  const T* v_src = static_cast<const T*>(v_new.data) + batch * v_new.batch_stride +
                   i * v_new.row_stride + head * v_new.head_stride;
  // All reads of the row before any write: k_new and the cache never overlap (validated), but
  // the rotation reads each element's partner.
  for (int e = threadIdx.x; e < p.head_dim; e += kThreads) k_dst[e] = rotated(k_src, e, pos, rot);
  for (int e = threadIdx.x; e < head_dim_v; e += kThreads) v_dst[e] = v_src[e];
}

// One block per (batch, query row, query head): q's row rotated at its position into the
// contiguous copy.
template <class T>
__global__ void __launch_bounds__(kThreads)
    rotate_q_kernel(const __grid_constant__ FwdParams p, T* out, const Rotary rot) {
  const int head = blockIdx.x % p.heads_q;
  const int i = blockIdx.x / p.heads_q % p.seqlen_q;
  const int batch = blockIdx.x / p.heads_q / p.seqlen_q;
  const int len_k = p.cache_seqlens[batch * p.cache_seqlens_stride] + p.seqlen_new;
  const int pos = len_k - p.seqlen_q + i;  // the query's diagonal
  const T* src = static_cast<const T*>(p.q) + batch * p.q_batch_stride + i * p.q_row_stride +
                 head * p.q_head_stride;
  T* dst = out + ((int64_t(batch) * p.seqlen_q + i) * p.heads_q + head) * p.head_dim;
  for (int e = threadIdx.x; e < p.head_dim; e += kThreads) dst[e] = rotated(src, e, pos, rot);
}

template <class T>
cudaError_t launch_typed(const ForwardArgs& a, const FwdParams& p, void* q_rotated,
                         cudaStream_t stream) {
  const Problem& pr = a.problem;
  const CacheUpdate& c = a.cache;
  Rotary rot{};
  rot.dim = static_cast<int>(pr.rotary_dim);
  if (rot.dim > 0) {
    rot.cos = c.cos.data;
    rot.sin = c.sin.data;
    rot.cos_pos_stride = c.cos.stride_pos;
    rot.cos_pair_stride = c.cos.stride_pair;
    rot.sin_pos_stride = c.sin.stride_pos;
    rot.sin_pair_stride = c.sin.stride_pair;
    rot.interleaved = pr.rotary_interleaved;
    rot.tables_f32 = pr.rotary_dtype == DType::F32;
  }
  if (pr.seqlen_new > 0) {
    const RowsOf k_new{c.k_new.data, c.k_new.stride_batch, c.k_new.stride_seq,
                       c.k_new.stride_head};
    const RowsOf v_new{c.v_new.data, c.v_new.stride_batch, c.v_new.stride_seq,
                       c.v_new.stride_head};
    const int64_t blocks = pr.batch * pr.seqlen_new * pr.heads_kv;
    append_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        p, k_new, v_new, rot, static_cast<int>(pr.head_dim_v));
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (rot.dim > 0) {
    const int64_t blocks = pr.batch * pr.seqlen_q * pr.heads_q;
    rotate_q_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        p, static_cast<T*>(q_rotated), rot);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace

void fill_cache_params(CacheParams& p, const Problem& pr, const VariantViews& v) {
  if (pr.kv_cache == KvCache::None) return;
  p.cache_seqlens = v.cache_seqlens.data;
  p.cache_seqlens_stride = v.cache_seqlens.stride;
  p.seqlen_new = static_cast<int>(pr.seqlen_new);
  if (pr.kv_cache == KvCache::Paged) {
    p.block_table = v.block_table.data;
    p.block_table_batch_stride = v.block_table.stride_batch;
    p.block_table_page_stride = v.block_table.stride_page;
    p.page_size = static_cast<int>(pr.page_size);
  }
}

size_t rotated_q_bytes(const Problem& p) {
  if (p.kv_cache == KvCache::None || p.rotary_dim == 0) return 0;
  const size_t bytes = static_cast<size_t>(p.batch * p.seqlen_q * p.heads_q * p.head_dim) *
                       dtype_size(p.dtype);
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

cudaError_t launch_cache_update(const ForwardArgs& a, const FwdParams& p, void* q_rotated,
                                cudaStream_t stream) {
  switch (a.problem.dtype) {
    case DType::F16: return launch_typed<__half>(a, p, q_rotated, stream);
    case DType::BF16: return launch_typed<__nv_bfloat16>(a, p, q_rotated, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace cuda
}  // namespace flashattn
