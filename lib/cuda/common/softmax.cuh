// The online softmax every forward kernel runs, on score fragments of m16n8 tiles (element
// ((mt * kNTiles + nt) * 4 + 2 hh + e) belongs to the thread's row 2 mt + hh; the four lanes
// of a quad share a row). Scores arrive raw (q . k); the scale is folded into the exp2:
// P = exp2(s * scale_log2 - max), one FFMA and one MUFU.EX2 per element.
//
// Safe for any finite scale_log2 of either sign (a negative scale makes the smallest score the
// largest logit) and for rows that have seen no visible key yet (their maximum is -inf: they
// exponentiate against 0 and stay exactly 0).
#pragma once

#include <cmath>

#include "cuda/common/ptx.cuh"

namespace flashattn {
namespace common {

// The value hidden scores take so that they become P = 0 under either sign of the scale.
__device__ __forceinline__ float hidden_score(bool neg_scale) {
  return neg_scale ? INFINITY : -INFINITY;
}

template <int kMTiles>
struct OnlineSoftmax {
  static constexpr int kRows = 2 * kMTiles;
  float row_max[kRows];  // running maximum of scale_log2 * s; -inf: no visible key yet
  float row_sum[kRows];  // this thread's share of the running sum of P

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.0f;
    }
  }

  // Turns one key tile of scores into P in place and returns, per row, the factor by which
  // what was accumulated before must be scaled.
  template <int kNTiles>
  __device__ __forceinline__ void update(float (&s)[kMTiles * kNTiles * 4], float scale_log2,
                                         bool neg_scale, float (&corr)[kRows]) {
    // Each row's extremum of the raw scores: the maximum, or under a negative scale the minimum
    // (one uniform branch for all rows).
    float ext[kRows];
    if (neg_scale) {
      row_extremum<kNTiles>(s, ext, [](float a, float b) { return fminf(a, b); });
#pragma unroll
      for (int r = 0; r < kRows; ++r) ext[r] = quad_min(ext[r]);
    } else {
      row_extremum<kNTiles>(s, ext, [](float a, float b) { return fmaxf(a, b); });
#pragma unroll
      for (int r = 0; r < kRows; ++r) ext[r] = quad_max(ext[r]);
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = 2 * mt + hh;
        const float m_new = fmaxf(row_max[r], ext[r] * scale_log2);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        corr[r] = exp2_approx(row_max[r] - m_use);
        row_max[r] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[(mt * kNTiles + nt) * 4 + 2 * hh + e];
            x = exp2_approx(fmaf(x, scale_log2, -m_use));
            sum += x;
          }
        row_sum[r] = row_sum[r] * corr[r] + sum;
      }
    }
  }

  template <int kNTiles, class Op>
  __device__ __forceinline__ static void row_extremum(const float (&s)[kMTiles * kNTiles * 4],
                                                      float (&ext)[kRows], Op op) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float x = s[mt * kNTiles * 4 + 2 * hh];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) x = op(x, s[(mt * kNTiles + nt) * 4 + 2 * hh + e]);
        ext[2 * mt + hh] = x;
      }
  }

  // After the last key tile: per row the factor that normalizes the output (0 for a row that
  // saw no key) and the natural-log LSE (-inf for such a row). The sum is reduced over the quad.
  // sink2, an attention sink's logit in log2 units (-inf: none), joins each denominator as a
  // key of value 0: the row's maximum becomes max(row_max, sink2), so no term overflows. A row
  // that saw no key stays 0 / -inf whatever the sink.
  __device__ __forceinline__ void finalize(float (&inv)[kRows], float (&lse)[kRows],
                                           float sink2 = -INFINITY) const {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float l = quad_sum(row_sum[r]);
      const bool seen = l > 0.0f && row_max[r] != -INFINITY;
      float m = row_max[r], keys = 1.0f, total = l;
      if (sink2 != -INFINITY) {
        m = fmaxf(row_max[r], sink2);
        keys = exp2_approx(row_max[r] - m);  // what the keys' terms shrink by
        total = l * keys + exp2_approx(sink2 - m);
      }
      inv[r] = seen ? keys / total : 0.0f;
      lse[r] = seen ? m * kLn2 + logf(total) : -INFINITY;
    }
  }

  static constexpr float kLn2 = 0.69314718055994531f;
};

// Scales the rows of an accumulator fragment (kMTiles x kNTiles m16n8 tiles) by f[row].
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void scale_rows(float (&acc)[kMTiles * kNTiles * 4],
                                           const float (&f)[2 * kMTiles]) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[(mt * kNTiles + nt) * 4 + i] *= f[2 * mt + i / 2];
}

}  // namespace common
}  // namespace flashattn
