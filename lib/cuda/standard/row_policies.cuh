// The variants as the standard kernels apply them, one small policy each: where a
// batch entry's rows lie (SeqSpan), which keys a query sees (KeyRange), what becomes of a raw
// score (Logits: softcap, then ALiBi) and the sink's share of a row's softmax (Sink). ScoreRow
// gathers them for one row of the padded score layout. Host and device functions alike, so that
// a host stand-in of the kernels (a test without a GPU) can apply the very same policies.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/standard/standard_kernels.hpp"

namespace flashattn {
namespace cuda {
namespace standard {

__host__ __device__ __forceinline__ int64_t clamp_to(int64_t x, int64_t n) {
  return x < 0 ? 0 : (x < n ? x : n);
}

// Rows [begin, begin + len) of batch entry b in a caller's tensor. A fixed-length batch (no
// offsets) has begin 0 (the batch stride does the rest) and len = max_len. len is clamped to
// [0, max_len]: offsets that break their promise cannot make a kernel address a row outside the
// padded layout it was given.
struct SeqSpan {
  int64_t begin;
  int64_t len;
};

__host__ __device__ __forceinline__ SeqSpan seq_span(const SeqOffsets& offsets, int64_t b,
                                                     int64_t max_len) {
  if (offsets.data == nullptr) return SeqSpan{0, max_len};
  const int64_t begin = offsets.data[b * offsets.stride];
  const int64_t end = offsets.data[(b + 1) * offsets.stride];
  return SeqSpan{begin, clamp_to(end - begin, max_len)};
}

// The keys [begin, end) query i of a sequence sees: i + diag - left <= j <= i + diag + right
// (-1: that side unbounded), diag = len_k - len_q, within [0, len_k). Never reversed.
struct KeyRange {
  int64_t begin;
  int64_t end;
  __host__ __device__ __forceinline__ bool contains(int64_t j) const {
    return j >= begin && j < end;
  }
  __host__ __device__ __forceinline__ bool empty() const { return end <= begin; }
};

__host__ __device__ __forceinline__ KeyRange visible_keys(int64_t i, int64_t len_q,
                                                          int64_t len_k, int64_t left,
                                                          int64_t right) {
  const int64_t diag = len_k - len_q;
  const int64_t begin = left < 0 ? 0 : clamp_to(i + diag - left, len_k);
  const int64_t end = right < 0 ? len_k : clamp_to(i + diag + right + 1, len_k);
  return KeyRange{begin, end > begin ? end : begin};
}

// One score's logit, and the softcap's derivative there.
struct Logit {
  float value;
  float softcap_grad;  // 1 - tanh^2(s / c), the factor the backward's dS takes; 1 without a cap
};

// What becomes of one row's raw scores s = scale * q.k, in the header's order: a softcap
// (x = c * tanh(s / c)), then ALiBi (x -= slope * |i + diag - j|).
struct Logits {
  bool softcap;
  float cap;
  bool alibi;
  float slope;
  int64_t diagonal;  // i + diag: the key at ALiBi distance 0

  // The logit of raw score s at key j, and the softcap's derivative there.
  __host__ __device__ __forceinline__ Logit at(float s, int64_t j) const {
    Logit l{s, 1.0f};
    if (softcap) {
      const float t = tanhf(s / cap);
      l.value = cap * t;
      l.softcap_grad = 1.0f - t * t;
    }
    if (alibi) l.value -= slope * fabsf(static_cast<float>(diagonal - j));
    return l;
  }
  __host__ __device__ __forceinline__ float operator()(float s, int64_t j) const {
    return at(s, j).value;
  }
};

// One head's attention sink: one more logit in the row's softmax, a key of value 0. A row whose
// visible logits peak at m shifts its exponentials by shift(m) and adds term(shift) to their sum.
// Without a sink, shift(m) = m and term = 0, so the softmax is the plain one bit for bit.
struct Sink {
  bool present;
  float logit;
  __host__ __device__ __forceinline__ float shift(float m) const {
    return present ? fmaxf(m, logit) : m;
  }
  __host__ __device__ __forceinline__ float term(float shift) const {
    return present ? expf(logit - shift) : 0.0f;
  }
};

// One row of the padded score layout (ScoreRows): query i of head h of batch entry b.
struct ScoreRow {
  int64_t b, h, i;
  bool real;           // i lies inside its sequence (else the row is padding: no LSE)
  int64_t caller_row;  // its row in the caller's q, out and lse (the sequence's offset + i)
  KeyRange keys;       // empty for padding and for a query the mask leaves no key
  Logits logits;
  Sink sink;
};

__host__ __device__ __forceinline__ ScoreRow score_row(int64_t r, const ScoreRows& shape,
                                                       const RowVariants& v) {
  ScoreRow row;
  row.i = r % shape.seqlen_q;
  const int64_t bh = r / shape.seqlen_q;
  row.h = bh % shape.heads_q;
  row.b = bh / shape.heads_q;
  const SeqSpan q = seq_span(v.cu_seqlens_q, row.b, shape.seqlen_q);
  const SeqSpan k = seq_span(v.cu_seqlens_k, row.b, shape.seqlen_k);
  row.real = row.i < q.len;
  row.caller_row = q.begin + row.i;
  row.keys = row.real ? visible_keys(row.i, q.len, k.len, v.window_left, v.window_right)
                      : KeyRange{0, 0};
  row.logits.softcap = v.softcap > 0.0f;
  row.logits.cap = v.softcap;
  row.logits.alibi = v.alibi.data != nullptr;
  row.logits.slope = row.logits.alibi
                         ? v.alibi.data[row.b * v.alibi.stride_batch + row.h * v.alibi.stride_head]
                         : 0.0f;
  row.logits.diagonal = row.i + (k.len - q.len);
  row.sink.present = v.sinks.data != nullptr;
  row.sink.logit = row.sink.present ? v.sinks.data[row.h * v.sinks.stride] : 0.0f;
  return row;
}

}  // namespace standard
}  // namespace cuda
}  // namespace flashattn
