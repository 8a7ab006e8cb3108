// What turns a raw score s = q . k into the logit the softmax takes, for every kernel (the
// semantics in the header and KERNELS.md):
//   x = scale * s  ->  c * tanh(x / c) with a softcap c  ->  x - slope * |i + diag - j| with ALiBi.
// Without a softcap or ALiBi the kernels fold the scale into the exponential (one FFMA per
// score) and never call this; with one, the scores become logits in log2 units in place, and
// the softmax runs with scale 1. The softcap's derivative 1 - tanh^2 is the backward's factor
// on dS (d x / d (scale s)).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/mask.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/flash/params.hpp"

namespace flashattn {
namespace common {

constexpr float kLog2e = 1.4426950408889634f;

// tanh as one MUFU op (sm_75 and later): a relative error of at most 2^-11, so a capped logit
// c tanh(x / c) carries about |logit| 2^-11 -- the bf16 inputs' own rounding of a score is
// 2^-8 of it. Exactly +-1 in the limits, NaN for NaN. (Before it, tanh was 1 - 2 / (e^{2y} + 1)
// from an exp2 and a reciprocal: two MUFU ops a score beside the softmax's one, and the MUFU
// pipe then bounded the Hopper forward's softcap at 0.48-0.68x of plain attention.)
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Past this |softmax_scale| the kernels form every logit as a rounded product first (the mod is
// then active with pre = scale * log2(e)): a row's maximum then equals its winner's logit
// exactly, so the softmax's exp2(x - max) is 1 there, not exp2 of the fma's rounding residual
// (at scale 1e26 a residual of ~1e19: 0 or inf). The plain loops' fused form is exact enough
// below it for any input whose logits fp32 holds to a unit.
constexpr float kRoundedLogitScale = 16.0f;

// exp2(logit - LSE) in log2 units, for the backward and the recomputations from the LSE: at
// most 1, and 1 where the logit is within the fp32 LSE's rounding of it (the LSE of a one-hot
// row at a huge scale is its winner's logit, rounded by ~|LSE| 2^-24).
constexpr float kLseResolution = 1.0f / (1 << 22);
__device__ __forceinline__ float exp2_from_lse(float logit2, float lse2) {
  float x = fminf(logit2 - lse2, 0.0f);
  if (x > -fabsf(lse2) * kLseResolution) x = 0.0f;
  return exp2_approx(x);
}

struct ScoreMod {
  // s times this: with a softcap scale / c (tanh's argument), else scale * log2(e). (One field
  // for both: the sm80 forward at head dim 256 spilled 260 bytes with a second.)
  float pre = 0.0f;
  float cap2 = 0.0f;    // c * log2(e) (softcap only)
  float slope2 = 0.0f;  // slope * log2(e) (ALiBi only)
  int diag = 0;         // the mask's diagonal: query i sits at key i + diag
  bool softcap = false;
  // No visible key lies right of the diagonal (causal, or a window's right bound 0): the ALiBi
  // distance of every visible score is >= 0, its bias linear in the key.
  bool left_only = false;
  bool alibi = false;
  bool rounded = false;  // |scale| > kRoundedLogitScale: logits as rounded products

  __device__ __forceinline__ bool active() const { return softcap || alibi || rounded; }

  // A mod in two steps, so that a fragment's tanh ops run interleaved: with the softcap's branch
  // per element ptxas emitted one basic block per score and ran them one after another (the Hopper
  // forward's softcap at 0.36x of plain). prepare() takes kN raw scores under one uniform branch:
  // tanh(scale s / c) with a softcap, else pre * s. finish() turns one prepared value into the log2
  // logit, given the ALiBi distance query + diag - key as a float (a fragment forms it by adding
  // constants to one converted base, exact below 2^24: no int-to-float conversion per score), and
  // dcap = 1 - tanh^2.
  template <int kN>
  __device__ __forceinline__ void prepare(float* x) const {
    if (softcap) {
#pragma unroll
      for (int i = 0; i < kN; ++i) x[i] = tanh_approx(x[i] * pre);
    } else {
#pragma unroll
      for (int i = 0; i < kN; ++i) x[i] *= pre;
    }
  }
  __device__ __forceinline__ float finish(float y, float distance, float& dcap) const {
    float x = y;
    dcap = 1.0f;
    if (softcap) {
      x = cap2 * y;
      dcap = fmaf(-y, y, 1.0f);
    }
    if (alibi) x = with_alibi(x, distance);
    return x;
  }
  // A softcap without ALiBi or rounded logits (the models' case), for which the backward has a
  // form of its own (prob_from_prepared<true>).
  __device__ __forceinline__ bool softcap_only() const { return softcap && !alibi && !rounded; }
  // The backward's P = exp2(logit - LSE) of a prepared score y and the softcap's factor dcap.
  // kSoftcapOnly (softcap_only()): fewer instructions a score, the logit's scale and the LSE in
  // one FMA and exp2 of it as the plain loops take it (exp2_from_lse's snap is for rounded
  // logits only), no select for the mod's other parts (kernel log runs 115 and 119: +14-16 % on
  // Hopper, +14-23 % on the sm80 kernels). The Hopper pass (common/bwd_scores.cuh) writes the
  // same arithmetic out.
  template <bool kSoftcapOnly>
  __device__ __forceinline__ float prob_from_prepared(float y, float distance, float lse2,
                                                      float& dcap) const {
    if constexpr (kSoftcapOnly) {
      dcap = fmaf(-y, y, 1.0f);
      return exp2_approx(fmaf(cap2, y, -lse2));
    } else {
      return exp2_from_lse(finish(y, distance, dcap), lse2);
    }
  }
  // ALiBi's bias on a log2 logit at the distance query + diag - key.
  __device__ __forceinline__ float with_alibi(float x, float distance) const {
    return fmaf(-slope2, fabsf(distance), x);
  }
  // The ALiBi distance base of a fragment: query + diag - key as a float.
  __device__ __forceinline__ float distance(int query, int key) const {
    return static_cast<float>(query + diag - key);
  }

  // The log2 logit of raw score s for (query, key); dcap = 1 - tanh^2 (1 without a softcap).
  __device__ __forceinline__ float logit2(float s, int query, int key, float& dcap) const {
    prepare<1>(&s);
    return finish(s, distance(query, key), dcap);
  }
  __device__ __forceinline__ float logit2(float s, int query, int key) const {
    float dcap;
    return logit2(s, query, key, dcap);
  }

  // A score fragment (rows = queries, the layout WindowMask::apply takes) into log2 logits:
  // the forward's form, which needs no dcap.
  // kFusedAlibi: causal ALiBi without a softcap in fewer operations a score (below), for a
  // kernel with the registers for its branch (the Hopper forward; the sm80 forward's spills grew
  // by up to 110 bytes with it).
  template <int kMTiles, int kNTiles, bool kFusedAlibi = false>
  __device__ __forceinline__ void apply(float (&acc)[kMTiles * kNTiles * 4], int row0,
                                        int col0) const {
    constexpr int kN = kMTiles * kNTiles * 4;
    const float base = distance(row0, col0);
    // The distance of element (mt, hh, nt, e), less base.
    auto step = [](int mt, int hh, int nt, int e) {
      return static_cast<float>(16 * mt + 8 * hh - 8 * nt - e);
    };
    if (kFusedAlibi && alibi && left_only && !softcap && !rounded) {
      // ALiBi alone where no visible key lies right of the diagonal: the bias needs no |.|, so
      // -slope (base + step) is one FMA from the row's -slope base, and the scale joins it in a
      // second (2 ops a score, not 3). A hidden score's bias is then wrong, and masked after.
      const float row_bias = -slope2 * base;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& x = acc[(mt * kNTiles + nt) * 4 + 2 * hh + e];
              x = fmaf(x, pre, fmaf(-slope2, step(mt, hh, nt, e), row_bias));
            }
      return;
    }
    if (softcap) {
#pragma unroll
      for (int i = 0; i < kN; ++i) acc[i] = cap2 * tanh_approx(acc[i] * pre);
    } else {
#pragma unroll
      for (int i = 0; i < kN; ++i) acc[i] *= pre;
    }
    if (!alibi) return;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = acc[(mt * kNTiles + nt) * 4 + 2 * hh + e];
            x = with_alibi(x, base + step(mt, hh, nt, e));
          }
  }
};

// The mod of (batch, head): the one place the parameters' softcap and ALiBi fields are read.
template <class Params>
__device__ __forceinline__ ScoreMod score_mod_of(const Params& p, int batch, int head,
                                                 const WindowMask& mask) {
  ScoreMod m;
  m.diag = mask.diag;
  m.softcap = p.softcap > 0.0f;
  m.alibi = p.alibi != nullptr;
  m.left_only = mask.right == 0;
  m.rounded = fabsf(p.scale) > kRoundedLogitScale;
  m.pre = m.softcap ? p.scale / p.softcap : p.scale_log2;
  m.cap2 = p.softcap * kLog2e;
  if (m.alibi) {
    m.slope2 = p.alibi[batch * p.alibi_batch_stride + head * p.alibi_head_stride] * kLog2e;
  }
  return m;
}

// The attention sink of a head in log2 units (-inf: none), the term every row's denominator
// gains.
template <class Params>
__device__ __forceinline__ float sink_log2_of(const Params& p, int head) {
  return p.sinks == nullptr ? -INFINITY : p.sinks[head * p.sinks_stride] * kLog2e;
}

// Whether a tile needs the general loop: a softcap, ALiBi, a huge scale or a window's left
// bound. Without them (plain attention, causal) the kernels run a loop specialized for that, with
// the mod off and WindowMask::without_left, which holds no register for them.
__device__ __forceinline__ bool needs_general(const ScoreMod& m, const WindowMask& mask) {
  return m.active() || mask.left >= 0;
}

// The sinks' gradient of the backward's parameters (the forward's have none).
template <class Params>
__host__ __device__ inline const float* dsinks_of(const Params&) { return nullptr; }
__host__ __device__ inline const float* dsinks_of(const cuda::BwdParams& p) { return p.dsinks; }

// The backward kernels' loops, each compiled apart and chosen at launch from the parameters:
// plain attention (a window too: only the blocks at its edges need a mask, and the general
// loop's single pass after dP cost the window 0.58x of causal); the plain loop with ALiBi's
// bias and the sinks' gradient, which leave dS = P (dP - D) alone and so keep its overlap (in
// the general loop they ran at 0.79x and 0.70x of causal; inside the plain kernel their
// registers spilled and cost plain attention 7%, kernel-log run 77); and the general loop (a
// softcap's factor on dS, a huge scale, a packed batch; it also sums the sinks' gradient,
// common/dsink.cuh). The Hopper kernels have all three; the sm80 one plain and general only.
enum class BwdLoop { kPlain, kBiased, kGeneral };
template <class Params>
__host__ __device__ inline BwdLoop bwd_loop_of(const Params& p) {
  if (p.softcap > 0.0f || p.cu_seqlens_q != nullptr || p.scale > kRoundedLogitScale ||
      p.scale < -kRoundedLogitScale) {
    return BwdLoop::kGeneral;
  }
  return p.alibi != nullptr || dsinks_of(p) != nullptr ? BwdLoop::kBiased : BwdLoop::kPlain;
}
// For a kernel without the biased loop (sm80): whether the parameters need its general one.
template <class Params>
__host__ __device__ inline bool needs_general(const Params& p) {
  return bwd_loop_of(p) != BwdLoop::kPlain;
}

// kernel_of(std::integral_constant<BwdLoop, L>{}) for the loop the parameters need: a
// launcher names its kernel once and gets the instance of each loop.
template <class Params, class KernelOf>
inline auto kernel_for_loop(const Params& p, KernelOf&& kernel_of) {
  switch (bwd_loop_of(p)) {
    case BwdLoop::kGeneral: return kernel_of(std::integral_constant<BwdLoop, BwdLoop::kGeneral>{});
    case BwdLoop::kBiased: return kernel_of(std::integral_constant<BwdLoop, BwdLoop::kBiased>{});
    default: return kernel_of(std::integral_constant<BwdLoop, BwdLoop::kPlain>{});
  }
}

// Calls f(std::true_type{}) when `general`, else f(std::false_type{}): a kernel writes its loop
// once and gets both specializations behind one uniform branch.
template <class F>
__device__ __forceinline__ void specialize(bool general, F&& f) {
  if (general) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

}  // namespace common
}  // namespace flashattn
