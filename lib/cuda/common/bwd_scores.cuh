// The backward's general loop (a softcap, ALiBi, a window's left bound or dsinks) on a
// transposed score fragment, the Hopper kernels' S^T layout: element 4 j + e at key
// key0 + 8 (e / 2) and query q0 + 8 j + 2 t + e % 2 (WindowMask::apply_transposed's layout with
// one m-tile). In one pass, once both S^T and dP^T are complete: S^T becomes P^T (the mod's
// logits, the masks), dP^T becomes (dP^T - D) times the softcap's factor, so that
// dS^T = P^T * dP^T, and the sinks' share of the gradient is added (common/dsink.cuh).
#pragma once

#include "cuda/common/dsink.cuh"
#include "cuda/common/mask.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/score_mod.cuh"

namespace flashattn {
namespace common {

template <int kCols8>  // query columns / 8
__device__ __forceinline__ void general_scores_transposed(
    float (&acc_s)[kCols8 * 4], float (&acc_dp)[kCols8 * 4], const float* lse2, const float* dsum,
    const ScoreMod& mod, const WindowMask& mask, bool masked, int key0, int q0, int t,
    float sink2, bool with_dsinks, DsinkAccumulator& dsink) {
  int q_lo[2], q_hi[2];  // the queries that see each of the thread's two keys
#pragma unroll
  for (int h = 0; h < 2; ++h) mask.queries_of(key0 + 8 * h, q_lo[h], q_hi[h]);
  mod.prepare<kCols8 * 4>(acc_s);
  const float base = mod.distance(q0 + 2 * t, key0);
#pragma unroll
  for (int j = 0; j < kCols8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * j + 2 * t + (e % 2);
      float dcap;
      const float x = mod.finish(acc_s[4 * j + e],
                                 base + static_cast<float>(8 * j + e % 2 - 8 * (e / 2)), dcap);
      float prob = exp2_from_lse(x, lse2[col]);
      if (masked && WindowMask::outside(q0 + col, q_lo[e / 2], q_hi[e / 2])) prob = 0.0f;
      if (with_dsinks) {
        dsink.add(DsinkAccumulator::sink_share(sink2, lse2[col]), prob, acc_dp[4 * j + e]);
      }
      acc_s[4 * j + e] = prob;
      acc_dp[4 * j + e] = (acc_dp[4 * j + e] - dsum[col]) * dcap;
    }
  }
}

}  // namespace common
}  // namespace flashattn
