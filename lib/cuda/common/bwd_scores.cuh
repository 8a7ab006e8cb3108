// The backward's scores on a transposed fragment, the Hopper kernels' S^T layout: element
// 4 j + e at key key0 + 8 (e / 2) and query q0 + 8 j + 2 t + e % 2 (WindowMask::apply_transposed's
// layout with one m-tile).
//
// The plain loop: P^T from S^T and the masks while the dP^T GEMM still runs
// (plain_scores_transposed, with ALiBi's bias when the head has one), then, once dP^T is
// complete, the sinks' share of their gradient (add_dsinks_transposed). Neither changes
// dS = P (dP - D), so both keep the loop's overlap.
//
// The general loop (a softcap, a huge scale or a packed batch; general_scores_transposed): the
// caller runs the mod's first step (ScoreMod::prepare: the softcap's tanh, one MUFU op a score)
// on S^T while the dP^T GEMM still runs; then in one pass, once dP^T is complete, the prepared
// S^T becomes P^T (the mod's logits, the masks), dP^T becomes (dP^T - D) times the softcap's
// factor, so that dS^T = P^T * dP^T, and the sinks' share of the gradient is added
// (common/dsink.cuh). A softcap alone has a pass of its own (kernel log run 115: +14-16 %).
#pragma once

#include "cuda/common/dsink.cuh"
#include "cuda/common/mask.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/score_mod.cuh"

namespace flashattn {
namespace common {

// ALiBi's distance (query + diag - key) of element 4 j + e of the fragment, less that of its
// element 0 (ScoreMod::distance of (q0 + 2 t, key0)): queries step by 8 j + e % 2, keys by
// 8 (e / 2).
__device__ __forceinline__ constexpr float transposed_distance_step(int j, int e) {
  return static_cast<float>(8 * j + e % 2 - 8 * (e / 2));
}

// The plain loop's P^T = exp2(S^T scale log2(e) - LSE log2(e)), less ALiBi's slope times the
// distance when kBias and the mod has one (one uniform branch; the scale stays folded into the
// FMA, as without), then the masks where some key of the block [n0, n0 + block_n) is hidden
// from some query of the step [m0, m0 + block_m) (asked after the exponentials, so that they
// issue first).
template <int kCols8, bool kBias>  // query columns / 8; ALiBi compiled in
__device__ __forceinline__ void plain_scores_transposed(float (&acc_s)[kCols8 * 4],
                                                        const float* lse2, float scale_log2,
                                                        const ScoreMod& mod,
                                                        const WindowMask& mask, int m0,
                                                        int block_m, int n0, int block_n,
                                                        int key0, int q0, int t) {
  if (kBias && mod.alibi) {
    const float base = mod.distance(q0 + 2 * t, key0);
#pragma unroll
    for (int j = 0; j < kCols8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * j + 2 * t + (e % 2);
        const float x = fmaf(acc_s[4 * j + e], scale_log2, -lse2[col]);
        acc_s[4 * j + e] = exp2_approx(mod.with_alibi(x, base + transposed_distance_step(j, e)));
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < kCols8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * j + 2 * t + (e % 2);
        acc_s[4 * j + e] = exp2_approx(fmaf(acc_s[4 * j + e], scale_log2, -lse2[col]));
      }
    }
  }
  if (mask.needs_mask(m0, block_m, n0, block_n)) {
    mask.apply_transposed<1, kCols8>(acc_s, key0, q0 + 2 * t, 0.0f);
  }
}

// The sinks' share of their gradient from the step's final (masked) P^T and dP^T; one P_sink
// per query column, from the head's logit in dsink (set_head). One pass before the loop that
// consumes P^T and dP^T (which holds them live anyway), so that the step takes one branch on
// the sinks, not one per column group.
template <int kCols8>
__device__ __forceinline__ void add_dsinks_transposed(const float (&acc_s)[kCols8 * 4],
                                                      const float (&acc_dp)[kCols8 * 4],
                                                      const float* lse2, int t,
                                                      DsinkAccumulator& dsink) {
#pragma unroll
  for (int j = 0; j < kCols8; ++j) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      dsink.add_pair(DsinkAccumulator::sink_share(dsink.sink2, lse2[8 * j + 2 * t + c]),
                     acc_s[4 * j + c], acc_dp[4 * j + c], acc_s[4 * j + 2 + c],
                     acc_dp[4 * j + 2 + c]);
    }
  }
}

// The general pass for one kind of mod. kSoftcapOnly (ScoreMod::softcap_only): the arithmetic
// of ScoreMod::prob_from_prepared<true>, written out here because the call form schedules this
// kernel differently (the same instructions) and ran the d64 softcap backward ~1 % slower
// (kernel log, run 119).
template <int kCols8, bool kSoftcapOnly>
__device__ __forceinline__ void general_scores_pass(
    float (&acc_s)[kCols8 * 4], float (&acc_dp)[kCols8 * 4], const float* lse2, const float* dsum,
    const ScoreMod& mod, const WindowMask& mask, bool masked, int key0, int q0, int t,
    float sink2, bool with_dsinks, DsinkAccumulator& dsink) {
  int q_lo[2], q_hi[2];  // the queries that see each of the thread's two keys
#pragma unroll
  for (int h = 0; h < 2; ++h) mask.queries_of(key0 + 8 * h, q_lo[h], q_hi[h]);
  const float base = mod.distance(q0 + 2 * t, key0);
#pragma unroll
  for (int j = 0; j < kCols8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * j + 2 * t + (e % 2);
      float dcap, prob;
      if constexpr (kSoftcapOnly) {
        const float y = acc_s[4 * j + e];  // tanh
        dcap = fmaf(-y, y, 1.0f);
        prob = exp2_approx(fmaf(mod.cap2, y, -lse2[col]));
      } else {
        const float x = mod.finish(acc_s[4 * j + e], base + transposed_distance_step(j, e), dcap);
        prob = exp2_from_lse(x, lse2[col]);
      }
      if (masked && WindowMask::outside(q0 + col, q_lo[e / 2], q_hi[e / 2])) prob = 0.0f;
      if (with_dsinks) {
        dsink.add(DsinkAccumulator::sink_share(sink2, lse2[col]), prob, acc_dp[4 * j + e]);
      }
      acc_s[4 * j + e] = prob;
      acc_dp[4 * j + e] = (acc_dp[4 * j + e] - dsum[col]) * dcap;
    }
  }
}

// acc_s holds S^T after ScoreMod::prepare.
template <int kCols8>  // query columns / 8
__device__ __forceinline__ void general_scores_transposed(
    float (&acc_s)[kCols8 * 4], float (&acc_dp)[kCols8 * 4], const float* lse2, const float* dsum,
    const ScoreMod& mod, const WindowMask& mask, bool masked, int key0, int q0, int t,
    float sink2, bool with_dsinks, DsinkAccumulator& dsink) {
  if (mod.softcap_only()) {
    general_scores_pass<kCols8, true>(acc_s, acc_dp, lse2, dsum, mod, mask, masked, key0, q0, t,
                                      sink2, with_dsinks, dsink);
  } else {
    general_scores_pass<kCols8, false>(acc_s, acc_dp, lse2, dsum, mod, mask, masked, key0, q0, t,
                                       sink2, with_dsinks, dsink);
  }
}

}  // namespace common
}  // namespace flashattn
