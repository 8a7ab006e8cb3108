// The sinks' gradient, dsinks_h = -sum over the batch and rows of P_sink,i * D_i, with
// D_i = sum_j P_ij dP_ij taken where P and dP are fp32 (the main backward kernels), not from
// rowsum(dO * O): O is rounded to the input dtype, and the sum cancels, so that D would carry
// O's rounding into dsinks almost undamped.
//
// Each thread adds P_sink,i * P_ij * dP_ij over the scores it computes; when its CTA moves to
// the next query head (and at the end) each warp sums its lanes (shuffles, a fixed order) into
// its own slot, [batch, heads_q, key slot, kSlotsPerBlock] with key slot = first key / 64 (the
// slots no CTA owns stay as zeroed before the launch); the last launch sums a head's slots in a
// fixed order. So the result is deterministic whatever the mode.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"
#include "cuda/common/score_mod.cuh"
#include "cuda/flash/params.hpp"

namespace flashattn {
namespace common {

constexpr int kDsinkKeyRows = 64;      // the key rows one slot column covers
constexpr int kDsinkWarpSlots = 16;    // slots per key block: one per warp, 16 warps at most

__host__ __device__ inline int64_t dsink_key_slots(int seqlen_k) {
  return (seqlen_k + kDsinkKeyRows - 1) / kDsinkKeyRows;
}
// Floats of the partial sums.
__host__ __device__ inline int64_t dsink_partial_count(const cuda::BwdParams& p) {
  return int64_t(p.batch) * p.heads_q * dsink_key_slots(p.seqlen_k) * kDsinkWarpSlots;
}

struct DsinkAccumulator {
  float sum = 0.0f;
  // The sink's logit (log2 units) of the head a loop's steps are on, for loops that add by
  // steps (add_dsinks_transposed): held across steps and set again only where the head
  // changes, since a load at each step put a global load between the GEMMs and the scores.
  float sink2 = 0.0f;
  __device__ __forceinline__ void set_head(const cuda::BwdParams& p, int head) {
    sink2 = sink_log2_of(p, head);
  }

  // P_sink of a row from its LSE * log2(e) (+inf for rows past the end or without keys: 0).
  __device__ __forceinline__ static float sink_share(float sink2, float lse2) {
    return exp2_approx(sink2 - lse2);
  }
  // A hidden pair (P exactly 0) adds nothing, whatever dP holds (0 * inf would be NaN).
  __device__ __forceinline__ void add(float share, float prob, float dp) {
    if (prob != 0.0f) sum = fmaf(share * prob, dp, sum);
  }
  // One query's two scores in this thread (keys r and r + 8 of the transposed fragment): one
  // multiply and two FMAs for the pair, where add takes a test, a multiply and an FMA a score.
  // No guard for a hidden pair: its P is exactly 0 and its dP finite (the rows and keys past the
  // ends are loaded as zeros), as dS = P (dP - D), which takes no guard either, assumes.
  __device__ __forceinline__ void add_pair(float share, float p0, float dp0, float p1,
                                           float dp1) {
    sum = fmaf(share, fmaf(p1, dp1, p0 * dp0), sum);
  }
  // Warp-wide: this warp's sum for (batch, head) of the key block starting at n0.
  __device__ __forceinline__ void flush(const cuda::BwdParams& p, int batch, int head, int n0) {
    float s = sum;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0) {
      const int64_t slot = ((int64_t(batch) * p.heads_q + head) * dsink_key_slots(p.seqlen_k) +
                            n0 / kDsinkKeyRows) * kDsinkWarpSlots + threadIdx.x / 32;
      p.dsink_partial[slot] = s;
    }
    sum = 0.0f;
  }
};

}  // namespace common
}  // namespace flashattn
