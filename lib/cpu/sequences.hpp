// Where each batch entry's rows lie and which keys each of its queries sees: the sequence and
// mask policies of every CPU algorithm (flash and standard, forward and backward). A fixed-length
// batch and a variable-length one differ here only.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/problem.hpp"

namespace flashattn {
namespace cpu {

// Batch entry (sequence) b.
struct Seq {
  int64_t len_q = 0;    // its queries
  int64_t len_k = 0;    // its keys
  int64_t q_begin = 0;  // added to a query index to address the tensors: its offset in a packed
  int64_t k_begin = 0;  // batch, 0 in a fixed one (whose batch stride does it)
  int64_t rows = 0;     // its first query among all the batch's (the rows of the scratch)
};

inline Seq seq_of(const Problem& p, const VariantViews& v, int64_t b) {
  Seq s;
  if (p.kv_cache != KvCache::None) {  // the keys the cache held, and the rows appended to it
    s.len_q = p.seqlen_q;
    s.len_k = v.cache_seqlens.at(b) + p.seqlen_new;
    s.rows = b * p.seqlen_q;
    return s;
  }
  if (!p.varlen) {
    s.len_q = p.seqlen_q;
    s.len_k = p.seqlen_k;
    s.rows = b * p.seqlen_q;
    return s;
  }
  s.q_begin = v.cu_seqlens_q.at(b);
  s.k_begin = v.cu_seqlens_k.at(b);
  s.len_q = v.cu_seqlens_q.at(b + 1) - s.q_begin;
  s.len_k = v.cu_seqlens_k.at(b + 1) - s.k_begin;
  s.rows = s.q_begin;
  return s;
}

// The scratch row of query i of head h in sequence s: the rows of one head of one sequence are
// consecutive, heads_q * total_q rows in all (for a fixed batch: (b * heads_q + h) * Nq + i).
inline int64_t scratch_row(const Problem& p, const Seq& s, int64_t h, int64_t i) {
  return p.heads_q * s.rows + h * s.len_q + i;
}

// The window of one sequence: query i sees key j when
// i + diag - left <= j <= i + diag + right (-1: unbounded), diag = len_k - len_q.
// Every range below is [begin, end) and never reversed; each bound grows with its argument.
struct Mask {
  int64_t len_q = 0, len_k = 0, diag = 0, left = -1, right = -1;

  Mask(const Problem& p, const Seq& s)
      : len_q(s.len_q), len_k(s.len_k), diag(s.len_k - s.len_q), left(p.window_left),
        right(p.window_right) {}

  static int64_t clamp(int64_t x, int64_t n) { return std::min(n, std::max<int64_t>(0, x)); }

  // The keys query i sees.
  int64_t key_begin(int64_t i) const { return left < 0 ? 0 : clamp(i + diag - left, len_k); }
  int64_t key_end(int64_t i) const {
    return std::max(key_begin(i), right < 0 ? len_k : clamp(i + diag + right + 1, len_k));
  }
  // The queries that see key j.
  int64_t row_begin(int64_t j) const { return right < 0 ? 0 : clamp(j - diag - right, len_q); }
  int64_t row_end(int64_t j) const {
    return std::max(row_begin(j), left < 0 ? len_q : clamp(j - diag + left + 1, len_q));
  }
  // Whether every query in [i0, i1) sees every key in [j0, j1) (no element needs masking).
  bool covers(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    return key_begin(i1 - 1) <= j0 && key_end(i0) >= j1;
  }
};

}  // namespace cpu
}  // namespace flashattn
