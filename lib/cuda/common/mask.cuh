// Which keys each query sees, for every kernel: one window
//   key j is visible to query i  iff  i + diag - left <= j <= i + diag + right,
// diag = seqlen_k - seqlen_q (the bottom-right alignment of FlashAttention-2 and cuDNN), a
// negative bound meaning unbounded on that side. Causal is right = 0, left unbounded. Keys at
// or past seqlen_k are never visible. The kernels ask it for their loop bounds, whether a key
// block needs masking at all, and to mask a score fragment (rows = queries) or a transposed
// one (rows = keys).
#pragma once

#include <climits>
#include <cstdint>

#include "cuda/common/seqlen.cuh"

namespace flashattn {
namespace common {

struct WindowMask {
  int seqlen_q = 0, seqlen_k = 0;
  int diag = 0;
  int left = -1, right = -1;  // < 0: unbounded

  __host__ __device__ WindowMask(int seqlen_q_, int seqlen_k_, int left_, int right_)
      : seqlen_q(seqlen_q_),
        seqlen_k(seqlen_k_),
        diag(seqlen_k_ - seqlen_q_),
        left(left_),
        right(right_) {}
  // No mask but the end of the keys (left = right = -1), or causal (right = 0).
  __host__ __device__ static WindowMask causal_or_full(int seqlen_q, int seqlen_k, bool causal) {
    return WindowMask(seqlen_q, seqlen_k, -1, causal ? 0 : -1);
  }

  // The same mask known to have no left bound (a compile-time -1: the plain loops' copy).
  __host__ __device__ WindowMask without_left() const {
    WindowMask m = *this;
    m.left = -1;
    return m;
  }

  // The key blocks [begin, end) holding a key visible to some query of rows [m0, m0 + rows);
  // begin == end when there is none.
  __host__ __device__ __forceinline__ void n_block_range(int m0, int rows, int block_n,
                                                         int& begin, int& end) const {
    int hi = seqlen_k;  // one past the last visible key
    if (right >= 0) hi = min(hi, m0 + rows - 1 + diag + right + 1);
    const int lo = left >= 0 ? max(0, m0 + diag - left) : 0;
    begin = lo / block_n;
    end = hi <= lo ? begin : (hi + block_n - 1) / block_n;
  }

  // About how many keys a query row sees, averaged over the rows (a launcher's choice of tile
  // by it; host only): kMeanSamples rows spread evenly, exact for each.
  static constexpr int kMeanSamples = 256;
  __host__ int64_t mean_visible_keys() const {
    if (seqlen_q <= 0) return 0;
    const int samples = seqlen_q < kMeanSamples ? seqlen_q : kMeanSamples;
    int64_t keys = 0;
    for (int i = 0; i < samples; ++i) {
      const int row = static_cast<int>(int64_t(i) * seqlen_q / samples);
      int lo, hi;
      n_block_range(row, 1, 1, lo, hi);  // blocks of one key: [lo, hi) is the row's keys
      keys += hi - lo;
    }
    return keys / samples;
  }

  // The query blocks [begin, end) holding a query that sees some key of [n0, n0 + rows) (the
  // backward's loop over queries for one key block).
  __device__ __forceinline__ void m_block_range(int n0, int rows, int block_m, int& begin,
                                                int& end) const {
    const int lo = right >= 0 ? max(0, n0 - diag - right) : 0;
    int hi = seqlen_q;  // one past the last query that sees a key of the block
    if (left >= 0) hi = min(hi, n0 + rows - 1 - diag + left + 1);
    begin = lo / block_m;
    end = hi <= lo ? begin : (hi + block_m - 1) / block_m;
  }

  // The key blocks [begin, end) whose keys every query of [m0, m0 + rows) sees: the forward's
  // loop masks only outside them (two loop-invariant comparisons per block).
  __device__ __forceinline__ void unmasked_blocks(int m0, int rows, int block_n, int& begin,
                                                  int& end) const {
    int hi = seqlen_k;  // one past the last key every query sees
    if (right >= 0) hi = min(hi, m0 + diag + right + 1);
    end = max(hi, 0) / block_n;
    const int lo = left >= 0 ? m0 + rows - 1 + diag - left : 0;  // the first such key
    begin = lo <= 0 ? 0 : (lo + block_n - 1) / block_n;
  }

  // Whether some key of [n0, n0 + block_n) is hidden from some query of [m0, m0 + rows).
  __device__ __forceinline__ bool needs_mask(int m0, int rows, int n0, int block_n) const {
    return n0 + block_n > seqlen_k || (right >= 0 && n0 + block_n - 1 > m0 + diag + right) ||
           (left >= 0 && n0 < m0 + rows - 1 + diag - left);
  }

  // The keys [lo, hi] query `row` sees (empty when hi < lo).
  __device__ __forceinline__ void keys_of(int row, int& lo, int& hi) const {
    hi = seqlen_k - 1;
    if (right >= 0) hi = min(hi, row + diag + right);
    lo = left >= 0 ? row + diag - left : INT_MIN / 2;
  }
  // The queries [lo, hi] that see `key` (empty when hi < lo).
  __device__ __forceinline__ void queries_of(int key, int& lo, int& hi) const {
    lo = right >= 0 ? key - diag - right : INT_MIN / 2;
    hi = left >= 0 ? key - diag + left : INT_MAX / 2;
    if (key >= seqlen_k) lo = INT_MAX / 2;  // no query sees it
  }
  // Whether key c lies outside the bounds [lo, hi] keys_of gave, the lower bound tested only
  // where there is one (a mask without a left bound then costs one comparison).
  __device__ __forceinline__ bool outside_keys(int c, int lo, int hi) const {
    return c > hi || (left >= 0 && c < lo);
  }
  // Whether c lies outside bounds [lo, hi] from keys_of or queries_of (an unbounded side is a
  // far sentinel, so one comparison each side serves every mask).
  __device__ __forceinline__ static bool outside(int c, int lo, int hi) {
    return c > hi || c < lo;
  }

  // Sets the hidden entries of a score fragment to `hidden`: kMTiles x kNTiles m16n8 tiles
  // (element ((mt * kNTiles + nt) * 4 + 2 hh + e) at query row0 + 16 mt + 8 hh, key
  // col0 + 8 nt + e). Each row costs one pair of thresholds; the columns are compile-time.
  template <int kMTiles, int kNTiles>
  __device__ __forceinline__ void apply(float (&acc)[kMTiles * kNTiles * 4], int row0, int col0,
                                        float hidden) const {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        int lo, hi;
        keys_of(row0 + 16 * mt + 8 * hh, lo, hi);
        lo -= col0;
        hi -= col0;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = 8 * nt + e;
            if (outside(c, lo, hi)) acc[(mt * kNTiles + nt) * 4 + 2 * hh + e] = hidden;
          }
        }
      }
    }
  }

  // The same for a transposed fragment: rows are keys (key0 + 16 mt + 8 hh), columns queries
  // (q0 + 8 nt + e). Query i sees key j iff j - diag - right <= i <= j - diag + left.
  template <int kMTiles, int kNTiles>
  __device__ __forceinline__ void apply_transposed(float (&acc)[kMTiles * kNTiles * 4], int key0,
                                                   int q0, float hidden) const {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        int lo, hi;
        queries_of(key0 + 16 * mt + 8 * hh, lo, hi);
        lo -= q0;
        hi -= q0;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = 8 * nt + e;
            if (outside(c, lo, hi)) acc[(mt * kNTiles + nt) * 4 + 2 * hh + e] = hidden;
          }
        }
      }
    }
  }
};

// The mask of a problem's batch entry: the one place the parameters' mask fields are read.
template <class Params>
__device__ __forceinline__ WindowMask mask_of(const Params& p, const SeqlenInfo& seq) {
  return WindowMask(seq.seqlen_q, seq.seqlen_k, p.window_left, p.window_right);
}

}  // namespace common
}  // namespace flashattn
