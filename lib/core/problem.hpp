// What a backend is asked to compute, after the API layer has validated every view and option.
// Backends and kernels see only these plain structs: no handles, no error state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include <flashattn/flashattn.h>

namespace flashattn {

enum class DType : int { F32 = FLASHATTN_DTYPE_FLOAT32, F16 = FLASHATTN_DTYPE_FLOAT16, BF16 = FLASHATTN_DTYPE_BFLOAT16 };

inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
  }
  return "unknown";
}

enum class Algorithm : int { Flash = FLASHATTN_ALGORITHM_FLASH, Standard = FLASHATTN_ALGORITHM_STANDARD };

// Which ALiBi slopes a problem has: none, one per query head, or one per (batch entry, head).
enum class Alibi : int { None, PerHead, PerBatchHead };

// Where a forward's keys and values are: the k and v views as they are (a fixed-length or a
// variable-length batch), or a KV cache, contiguous per sequence or in pages.
enum class KvCache : int { None, Contiguous, Paged };

// The problem's sizes and options, identical for forward and backward. For a variable-length
// batch, batch counts the sequences and seqlen_q / seqlen_k are the largest lengths the caller
// promised (max_seqlen_q / max_seqlen_k); total_q / total_k are the rows of the packed tensors.
struct Problem {
  DType dtype = DType::F32;
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t head_dim = 0;    // of q and k
  int64_t head_dim_v = 0;  // of v, out, dout, dv
  float scale = 0.0f;  // resolved by the API layer: 1/sqrt(head_dim) when the caller gave 0
  bool causal = false;   // the right bound of the mask is the diagonal (window_right == 0)
  Algorithm algorithm = Algorithm::Flash;
  bool deterministic = false;

  // The mask, causal folded in: query i of a sequence sees key j when
  // i + diag - window_left <= j <= i + diag + window_right (diag = that sequence's key count
  // minus its query count); -1 leaves a side unbounded.
  int64_t window_left = -1;
  int64_t window_right = -1;
  float softcap = 0.0f;  // 0: none; else c, the score s becomes c * tanh(s / c)
  Alibi alibi = Alibi::None;
  bool sinks = false;
  bool varlen = false;
  int64_t num_splits = 0;  // 0: the backend chooses; else the parts of a split key range (decode)
  int64_t total_q = 0;  // B * seqlen_q for a fixed-length batch
  int64_t total_k = 0;  // B * seqlen_k for a fixed-length batch

  // A KV cache (forward only). seqlen_k is then its capacity, the most keys a sequence can have
  // (page_size * pages_per_seq when paged); each sequence's own count is on the device (CUDA)
  // or host (CPU): cache_seqlens[b] + seqlen_new.
  KvCache kv_cache = KvCache::None;
  int64_t page_size = 0;      // paged: token rows per page
  int64_t pages_per_seq = 0;  // paged: the block table's columns
  int64_t num_pages = 0;      // paged: k's and v's pages
  int64_t seqlen_new = 0;     // rows of k_new / v_new appended before attending; 0: none
  int64_t rotary_dim = 0;     // R, the features of q and k_new rotated; 0: no rotary embedding
  int64_t rotary_positions = 0;  // rows of the cos / sin tables
  DType rotary_dtype = DType::F32;
  bool rotary_interleaved = false;  // pairs (2r, 2r + 1); else (r, r + R / 2)

  // Which views' rows do not start on 16-byte boundaries (RowView bits): set from the views at
  // hand, so a query, which is shown q, k and v only (and maybe no data pointer), takes the
  // outputs and absent pointers as aligned. Backends that need aligned rows size what they
  // copy by it (the CUDA flash kernels).
  uint32_t unaligned_rows = 0;

  int64_t group_size() const { return heads_q / heads_kv; }
  // A window that no causal mask alone expresses (a left bound, or a right bound past 0).
  bool sliding_window() const { return window_left >= 0 || window_right > 0; }
};

// A [batch, seqlen, heads, head_dim] view: strides in elements, the head_dim stride is 1. The
// rows of a variable-length batch's packed [total_tokens, heads, head_dim] view are addressed as
// seqlen rows with stride_batch 0 (a sequence's first row is its offset).
struct Tensor4 {
  void* data = nullptr;
  int64_t stride_batch = 0;
  int64_t stride_seq = 0;
  int64_t stride_head = 0;
};

// The views of an attention call, one bit each in Problem::unaligned_rows.
enum RowView : uint32_t {
  kRowsQ = 1u << 0,
  kRowsK = 1u << 1,
  kRowsV = 1u << 2,
  kRowsOut = 1u << 3,
  kRowsDout = 1u << 4,
  kRowsDq = 1u << 5,
  kRowsDk = 1u << 6,
  kRowsDv = 1u << 7,
};

// Does every row of the view start on a 16-byte boundary (its data pointer, and its batch, row
// and head strides in bytes)? A null pointer (a query's) counts as aligned.
inline bool rows_aligned16(const Tensor4& t, DType dtype) {
  // In unsigned arithmetic, whose wrap-around keeps every residue mod 16 (strides may be huge).
  const uint64_t es = dtype_size(dtype);
  const uint64_t bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.data)) |
                        static_cast<uint64_t>(t.stride_batch) * es |
                        static_cast<uint64_t>(t.stride_seq) * es |
                        static_cast<uint64_t>(t.stride_head) * es;
  return bits % 16 == 0;
}

// The [batch, heads_q, seqlen_q] fp32 log-sum-exp. data may be null in the forward (not wanted).
// The [heads_q, total_q] one of a variable-length batch has stride_batch 0, as Tensor4.
struct LseView {
  float* data = nullptr;
  int64_t stride_batch = 0;
  int64_t stride_head = 0;
  int64_t stride_seq = 0;
};

// A rank-1 view of fp32 (sinks and their gradient) or int32 (sequence offsets) elements; data
// null: absent.
template <class T>
struct Vector {
  T* data = nullptr;
  int64_t stride = 0;
  T at(int64_t i) const { return data[i * stride]; }
};

// fp32 ALiBi slopes: slope of (batch b, head h) at b * stride_batch + h * stride_head
// (stride_batch 0 for one slope per head); data null: no ALiBi.
struct AlibiView {
  const float* data = nullptr;
  int64_t stride_batch = 0;
  int64_t stride_head = 0;
  float at(int64_t b, int64_t h) const { return data[b * stride_batch + h * stride_head]; }
};

// A paged cache's block table: the page of sequence b's tokens [p * page_size, (p + 1) *
// page_size) at data[b * stride_batch + p * stride_page]; data null: not paged.
struct BlockTable {
  const int32_t* data = nullptr;
  int64_t stride_batch = 0;
  int64_t stride_page = 0;
  int64_t page_size = 0;
  int32_t at(int64_t b, int64_t p) const { return data[b * stride_batch + p * stride_page]; }
};

// A rotary table, cos or sin, [positions, rotary_dim / 2] in Problem::rotary_dtype.
struct RotaryTable {
  const void* data = nullptr;
  int64_t stride_pos = 0;
  int64_t stride_pair = 0;
};

// The tensors of the variants, forward and backward alike.
struct VariantViews {
  AlibiView alibi;
  Vector<const float> sinks;
  Vector<const int32_t> cu_seqlens_q;  // B + 1 offsets of a variable-length batch
  Vector<const int32_t> cu_seqlens_k;
  Vector<const int32_t> cache_seqlens;  // B lengths of a KV cache before the call
  BlockTable block_table;               // a paged KV cache
};

// What a KV cache call adds to a forward: the rows appended and the rotary tables (each data
// null when absent). The cache itself is the forward's k and v: for a paged cache, stride_batch
// steps from page to page and stride_seq from row to row of a page.
struct CacheUpdate {
  Tensor4 k_new, v_new;
  RotaryTable cos, sin;
};

struct ForwardArgs {
  Problem problem;
  Tensor4 q, k, v, out;
  LseView lse;
  VariantViews variants;
  CacheUpdate cache;
};

struct BackwardArgs {
  Problem problem;
  Tensor4 q, k, v, out, dout, dq, dk, dv;
  LseView lse;
  VariantViews variants;
  Vector<float> dsinks;  // data null: not wanted
};

// Problem::unaligned_rows of a call's views.
inline uint32_t unaligned_rows_of(DType dtype, std::initializer_list<std::pair<RowView, const Tensor4*>> views) {
  uint32_t bits = 0;
  for (const auto& v : views) {
    if (!rows_aligned16(*v.second, dtype)) bits |= v.first;
  }
  return bits;
}
inline uint32_t unaligned_rows_of(const ForwardArgs& a) {
  return unaligned_rows_of(a.problem.dtype,
                           {{kRowsQ, &a.q}, {kRowsK, &a.k}, {kRowsV, &a.v}, {kRowsOut, &a.out}});
}
inline uint32_t unaligned_rows_of(const BackwardArgs& a) {
  return unaligned_rows_of(a.problem.dtype, {{kRowsQ, &a.q},
                                             {kRowsK, &a.k},
                                             {kRowsV, &a.v},
                                             {kRowsOut, &a.out},
                                             {kRowsDout, &a.dout},
                                             {kRowsDq, &a.dq},
                                             {kRowsDk, &a.dk},
                                             {kRowsDv, &a.dv}});
}

// A merge of partial results (flashattn_merge): part p's output element (b, n, h, d) at
// parts_out + p * parts_out_stride, its LSE at parts_lse + p * parts_lse_stride, each addressed
// as the views say. A variable-length batch's packed rows are one batch entry of `seqlen` rows.
struct MergeArgs {
  DType dtype = DType::F32;
  int64_t parts = 0;
  int64_t batch = 0;
  int64_t seqlen = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  Tensor4 parts_out;
  int64_t parts_out_stride = 0;  // elements
  LseView parts_lse;
  int64_t parts_lse_stride = 0;  // elements
  Tensor4 out;
  LseView lse;  // data null: not wanted
};

// Scratch memory for one call, in the backend's memory (host for CPU, device for CUDA).
struct Workspace {
  void* data = nullptr;
  size_t size = 0;
};

}  // namespace flashattn
