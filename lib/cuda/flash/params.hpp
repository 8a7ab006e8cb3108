// Plain parameter structs the flash kernels take (by value). Strides are in elements.
#pragma once

#include <cstdint>

namespace flashattn {
namespace cuda {

// What a launcher needs to know of the device beyond the problem.
struct LaunchInfo {
  int sm_count;
};

// The variants (KERNELS.md), which the forward and the backward read alike: the mask's bounds
// (causal folded in, -1: unbounded), the softcap (0: none), ALiBi slopes (null: none; slope of
// (b, h) at b * alibi_batch_stride + h * alibi_head_stride), attention sinks (null: none; sink
// of h at h * sinks_stride), and variable-length batches (null: fixed): B + 1 offsets of each
// sequence's first query and key row in the packed tensors (common::SeqlenInfo); seqlen_q and
// seqlen_k of the parameters are then the largest.
struct VariantParams {
  int window_left, window_right;
  float softcap;
  const float* alibi;
  int64_t alibi_batch_stride, alibi_head_stride;
  const float* sinks;
  int64_t sinks_stride;
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int64_t cu_seqlens_q_stride, cu_seqlens_k_stride;
  int64_t total_q, total_k;  // rows of the packed tensors (variable-length batches)
};

// A KV cache, which only the forward reads (cache_seqlens null: none): sequence b's keys are
// the first cache_seqlens[b] + seqlen_new rows of its cache (the rows appended by the call
// included); seqlen_k is then the capacity. Paged (block_table not null): row n of sequence b
// lies at row n % page_size of page block_table[b, n / page_size], and k's and v's batch
// strides step from page to page.
struct CacheParams {
  const int* cache_seqlens;
  int64_t cache_seqlens_stride;
  int seqlen_new;
  const int* block_table;
  int64_t block_table_batch_stride, block_table_page_stride;
  int page_size;
};

struct FwdParams : VariantParams, CacheParams {
  static constexpr bool kHasCache = true;
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // may be null
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride, lse_row_stride;
  // head_dim: of q and k; head_dim_v: of v and o. A kernel compiled for a head dim holds the
  // larger; the columns past each one's own are zero-filled on load and never stored.
  int batch, seqlen_q, seqlen_k, heads_q, heads_kv, group, head_dim, head_dim_v;
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)
  bool causal;       // the mask's right bound is the diagonal (the tile order's choice)
};

struct BwdParams : VariantParams {
  static constexpr bool kHasCache = false;  // the backward of a cache call is refused
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* dout;
  const float* lse;
  void* dq;
  void* dk;
  void* dv;
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
  int64_t lse_batch_stride, lse_head_stride, lse_row_stride;
  // Workspace: the fp32 dQ accumulator [batch, heads_q, seqlen_q_rounded, head_dim_padded];
  // D = rowsum(dO * O) and LSE * log2(e), [batch, heads_q, seqlen_q_rounded]; and the
  // deterministic mode's semaphores [batch, heads_q, seqlen_q_rounded / 64].
  float* dq_accum;
  float* dsum;
  float* lse_log2;
  int* dq_semaphore;
  int batch, seqlen_q, seqlen_k, heads_q, heads_kv, group, head_dim;
  int head_dim_v;  // of v, o, dout and dv (head_dim: of q, k, dq and dk)
  int seqlen_q_rounded, seqlen_k_rounded, head_dim_padded;
  float scale;
  float scale_log2;
  bool causal;
  // dsinks (null: not wanted): written by the last launch from per-block partial sums in the
  // workspace, [batch, heads_q, seqlen_q_rounded / 64], in a fixed order.
  float* dsinks;
  int64_t dsinks_stride;
  float* dsink_partial;
  // Bits of the gradients written non-finite, for the repair launch (common/bwd_repair.cuh):
  // [batch, heads_q, seqlen_q_rounded] query rows, then [batch, heads_kv, seqlen_k_rounded] keys.
  uint32_t* repair_flags;
  bool deterministic;
  bool dq_tiled;  // the dQ accumulator's layout: set by the sm90 kernel (64 x 64 tiles)
};

}  // namespace cuda
}  // namespace flashattn
