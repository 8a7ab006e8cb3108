// The CPU attention algorithms, flash and standard, forward and backward. This file is compiled
// once per instruction set: a kernels_<isa>.cpp defines the macros below and includes
// kernels_copy.inc, which includes kernels_prelude.hpp, turns the instruction set on and
// includes this file (which includes nothing itself but its part merge_impl.hpp, and keeps
// all it defines in an anonymous namespace).
//
//   FA_BF16_PAIRS  1 when bf16 operands are multiplied as pairs (vdpbf16ps; see "bf16 pairs")
//   FA_AMX         1 when those pairs are multiplied on AMX tiles (with FA_BF16_PAIRS; the
//                  forward's P V then runs on pairs too)
//   FA_ISA_NS   namespace of this copy          FA_W      floats per vector register
//   FA_ISA_NAME name reported for this copy     FA_RMAX   rows of the GEMM register block
//   FA_FMA      1 when the ISA has a fused      FA_NVMAX  vectors of columns of that block
//               multiply-add (the GEMM uses it)   FA_VFMA   with FA_FMA: a * b + c of vectors,
//                                                           fused (an intrinsic)
//                                                 FA_VMAX   optional: a > b ? a : b of vectors
//                                                           in one instruction (vmaxps, whose
//                                                           NaN rule is that select's)
//
// Every fused multiply-add is written out (madd, vfma): the CPU sources compile with
// -ffp-contract=off, because a contraction the compiler chooses can differ between two copies
// of one expression (AddressSanitizer's instrumentation was seen to change them in the GEMM),
// and the backward must recompute the scores its forward saw bit for bit.
//
// Layouts: every tile is fp32, row-major, rows padded to a multiple of 16 floats (zeros in the
// padding). The flash paths keep per-thread tiles only; the standard paths materialize S and P.
// Scores are computed in log2 units: Q is multiplied by scale * log2(e), so that softmax needs
// exp2 only; the LSE is converted back to natural log on output. Every algorithm forms a score
// with the same operations (Q scaled, K as it is, one fused multiply-add per element in head_dim
// order, then the logits policy), so the backward recomputes bit for bit the scores its forward
// saw. The one exception, in the copy with bf16 pairs (FA_BF16_PAIRS): the flash algorithm's
// bf16 scores come from pairs of the unscaled q and k, scaled after ("bf16 pairs"), in its
// forward and its backward alike; the standard algorithm keeps the form above.
//
// The variants are policies every algorithm calls, written once: where a sequence's rows lie
// and which keys each query sees (Seq and Mask, cpu/sequences.hpp), what becomes of a raw score
// (Logits: softcap, then ALiBi) and the sink's share of a row's softmax (Sink).

// GCC 12 takes the undefined source operand inside some AVX-512 intrinsics (roundscale,
// shuffles) for a use of an uninitialized value.
#if FA_W == 16 && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace flashattn {
namespace cpu {
namespace FA_ISA_NS {
namespace {

constexpr int W = FA_W;
constexpr int RMAX = FA_RMAX;
constexpr int NVMAX = FA_NVMAX;
constexpr int KC = 256;  // GEMM depth per pass, so the B panel stays in L2
// Flash forward in fp32 GEMMs: keys per step, the depth of P V (whose accumulators, O's rows,
// are loaded and stored once per step) and the rows of S^T = K Q^T.
#ifdef FA_FORWARD_KEYS
constexpr int kForwardKeys = FA_FORWARD_KEYS;
#else
constexpr int kForwardKeys = kBlockK;
#endif
constexpr float kLog2e = 1.44269504088896340736f;
constexpr double kLn2d = 0.69314718055994530942;
constexpr double kLog2ed = 1.44269504088896340736;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

static_assert(kBlockK % W == 0 && kPad % W == 0, "tiles must hold whole vectors");

typedef float vf __attribute__((vector_size(W * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(W * sizeof(int32_t))));

inline vf vload(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void vstore(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
inline vf splat(float s) { return s - vf{}; }  // x - 0 == x for every x, so this folds
inline vf select(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }
// a > b ? a : b per lane: b where either is NaN.
inline vf vmax(vf a, vf b) {
#ifdef FA_VMAX
  return FA_VMAX(a, b);
#else
  return select(a > b, a, b);
#endif
}

typedef uint32_t vu __attribute__((vector_size(W * sizeof(uint32_t))));

// a * b + c, one rounding where the instruction set has a fused multiply-add.
inline vf vfma(vf a, vf b, vf c) {
#if FA_FMA
  return FA_VFMA(a, b, c);
#else
  return a * b + c;
#endif
}

// c[0] + f (c[1] + f (c[2] + ...)) by Horner's rule, one fused multiply-add a term.
template <int N>
inline vf horner(vf f, const float (&c)[N]) {
  vf p = splat(c[N - 1]);
  for (int k = N - 2; k >= 0; --k) p = vfma(p, f, splat(c[k]));
  return p;
}

// 2^f for f in [-0.5, 0.5]: the degree-7 Taylor polynomial, ln(2)^k / k!.
inline vf exp2_poly(vf f) {
  constexpr float kTaylor[] = {1.0f,
                               6.9314718055994531e-1f,
                               2.4022650695910071e-1f,
                               5.5504108664821580e-2f,
                               9.6181291076284772e-3f,
                               1.3333558146428443e-3f,
                               1.5403530393381608e-4f,
                               1.5252733804059841e-5f};
  return horner(f, kTaylor);
}
// 2^x to about 1 ulp: 2^round(x) from the exponent bits times exp2_poly of the rest in
// [-0.5, 0.5]. Inputs below -125 (-inf included) give exactly 0, so no denormal is ever
// produced; NaN stays NaN.
#if FA_W == 16
// AVX-512: the same values in fewer instructions (a rounding instruction for 2^round(x), a
// scaling one for the product, a mask for the zeros), bit for bit.
inline vf exp2v(vf v) {
  const __m512 x = _mm512_min_ps(_mm512_set1_ps(127.0f), (__m512)v);  // NaN stays (2nd operand)
  const __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const vf f = (vf)_mm512_sub_ps(x, n);
  const vf p = exp2_poly(f);
  return (vf)_mm512_maskz_scalef_ps(kept, (__m512)p, n);
}
#else
inline vf exp2v(vf x) {
  x = select(x < splat(-125.0f), splat(-127.0f), x);  // 2^-127 is encoded as 0.0 below
  x = select(x > splat(127.0f), splat(127.0f), x);
  const vf shifter = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const vf r = x + shifter;
  const vf f = x - (r - shifter);
  const vf p = exp2_poly(f);
  // The integer round(x) sits in the low mantissa bits of r; n = -127 gives the bits of 0.0.
  const vf scale = (vf)(((vu)r - (vu)shifter + 127u) << 23);
  return p * scale;
}
#endif

inline vf vabs(vf x) { return (vf)((vu)x & 0x7fffffffu); }

// 2^x for x <= 0, the softmax's exponent (a score less its row's maximum or LSE): most of the
// forward's time outside the GEMMs (without it, the AVX2 d64 forward took 14 % less time).
// Fewer multiply-pipe instructions than exp2v: a degree-5 polynomial, minimax in relative error
// under the constraint p(0) = 1 exactly (1.6e-7 relative at most in float arithmetic, exp2v
// 9e-8), so that a one-hot softmax's one term is exactly 1; no upper clamp, the zeros by a
// mask. exp2v's conventions: below -125 (-inf included) exactly 0, never a denormal, NaN stays
// NaN; positive x is outside its range.
inline vf exp2_poly5(vf f) {  // 2^f on [-0.5, 0.5]
  constexpr float kMinimax[] = {1.0f,           6.93147004e-1f, 2.40222424e-1f,
                                5.55073358e-2f, 9.67151299e-3f, 1.32647285e-3f};
  return horner(f, kMinimax);
}
#if FA_W == 16
// AVX-512: exp2v's rounding and scaling instructions around the shorter polynomial.
inline vf exp2v_nonpositive(vf v) {
  const __m512 x = (__m512)v;
  const __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const vf p = exp2_poly5((vf)_mm512_sub_ps(x, n));
  return (vf)_mm512_maskz_scalef_ps(kept, (__m512)p, n);
}
#else
inline vf exp2v_nonpositive(vf x) {
  const vi below = x < splat(-125.0f);     // false for NaN
  x = vmax(splat(-127.0f), x);            // NaN stays
  const vf shifter = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const vf r = x + shifter;
  const vf f = x - (r - shifter);
  const vf p = exp2_poly5(f);
  const vf scale = (vf)(((vu)r - (vu)shifter + 127u) << 23);
  return (vf)((vi)(p * scale) & ~below);
}
#endif

// tanh to a few ulp. Below |y| = 1/2 the odd Taylor polynomial through y^17 (the first term
// left out is under 2^-30 relative there); above, 1 - 2 / (e^{2|y|} + 1), whose cancellation
// costs at most a bit there. The sign is y's; NaN stays NaN; |y| past 44 gives exactly 1.
inline vf tanhv(vf y) {
  constexpr float kTaylor[] = {-1.0f / 3, 2.0f / 15, -17.0f / 315, 62.0f / 2835,
                               -1382.0f / 155925, 21844.0f / 6081075, -929569.0f / 638512875,
                               6404582.0f / 10854718875.0f};
  constexpr float kTaylorBelow = 0.5f;
  const vu sign = (vu)y & 0x80000000u;
  const vf a = vabs(y);
  const vf z = a * a;
  const vf poly = horner(z, kTaylor);
  const vf small = vfma(a, z * poly, a);
  const vf e = exp2v(a * splat(2.0f * 1.44269504088896340736f));
  const vf large = splat(1.0f) - splat(2.0f) / (e + splat(1.0f));
  const vf r = select(a < splat(kTaylorBelow), small, large);
  return (vf)((vu)r | sign);
}

// c + a * b rounded as the GEMM rounds each step of its dot products, so that a dot product
// written as a loop agrees with the same one computed by gemm() bit for bit.
inline float madd(float a, float b, float c) {
#if FA_FMA
  return std::fma(a, b, c);
#else
  return c + a * b;
#endif
}

inline float hmax(vf v) {
  float r = v[0];
  for (int i = 1; i < W; ++i) r = std::max(r, v[i]);
  return r;
}
inline float hsum(vf v) {
  float r = v[0];
  for (int i = 1; i < W; ++i) r += v[i];
  return r;
}

// ---- GEMM: C[M x N] (+)= A[M x K] * B[K x N] -------------------------------------------------
// A(m, k) = A[m * sam + k * sak] (so a transposed A is sam = 1); B and C row-major with leading
// dimensions ldb, ldc; N is a multiple of W. A register block of R rows x NV vectors of C stays
// in registers over the whole depth.

using MicroFn = void (*)(int, const float*, int64_t, int64_t, const float*, int64_t, float*,
                         int64_t, bool);

// The accumulate flag is a template parameter and the loops are unrolled by pragma, so that GCC
// keeps c in registers from C's load to its store: as one function with a runtime flag (GCC 12)
// it went through the stack on both sides, 48 more memory operations a call, which a call of
// depth 64 (the backward's dV, dK and dQ) pays over 768 FMAs. AVX2 on an EPYC Zen 1: forward and
// forward+backward 2-4.5 % faster (docs/perf/cpu-2026-12-07-zen1.md).
template <int R, int NV, bool kAccumulate>
void micro_body(int K, const float* A, int64_t sam, int64_t sak, const float* B, int64_t ldb,
                float* C, int64_t ldc) {
  // gemm() calls with a depth of 0 only to zero C; a path around the loop with C's values kept
  // would cost the accumulators their registers again.
  if (kAccumulate && K < 1) __builtin_unreachable();
  vf c[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) c[r][v] = kAccumulate ? vload(C + r * ldc + v * W) : vf{};
  for (int k = 0; k < K; ++k) {
    vf b[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) b[v] = vload(B + k * ldb + v * W);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const vf a = splat(A[r * sam + k * sak]);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) c[r][v] = vfma(a, b[v], c[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) vstore(C + r * ldc + v * W, c[r][v]);
}

template <int R, int NV>
void micro(int K, const float* A, int64_t sam, int64_t sak, const float* B, int64_t ldb, float* C,
           int64_t ldc, bool accumulate) {
  if (accumulate) {
    micro_body<R, NV, true>(K, A, sam, sak, B, ldb, C, ldc);
  } else {
    micro_body<R, NV, false>(K, A, sam, sak, B, ldb, C, ldc);
  }
}

template <int R, size_t... V>
constexpr std::array<MicroFn, NVMAX> micro_row(std::index_sequence<V...>) {
  return {{&micro<R, static_cast<int>(V) + 1>...}};
}
template <size_t... R>
constexpr std::array<std::array<MicroFn, NVMAX>, RMAX> micro_table(std::index_sequence<R...>) {
  return {{micro_row<static_cast<int>(R) + 1>(std::make_index_sequence<NVMAX>())...}};
}
constexpr std::array<std::array<MicroFn, NVMAX>, RMAX> kMicro =
    micro_table(std::make_index_sequence<RMAX>());

void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t sam, int64_t sak, const float* B,
          int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  const int64_t nvec = N / W;
  for (int64_t k0 = 0; k0 < K || (k0 == 0 && !accumulate); k0 += KC) {
    const int kc = static_cast<int>(std::min<int64_t>(KC, K - k0));
    const bool acc = accumulate || k0 > 0;
    for (int64_t v0 = 0; v0 < nvec; v0 += NVMAX) {
      const int nv = static_cast<int>(std::min<int64_t>(NVMAX, nvec - v0));
      for (int64_t m0 = 0; m0 < M; m0 += RMAX) {
        const int r = static_cast<int>(std::min<int64_t>(RMAX, M - m0));
        kMicro[r - 1][nv - 1](kc, A + m0 * sam + k0 * sak, sam, sak, B + k0 * ldb + v0 * W, ldb,
                              C + m0 * ldc + v0 * W, ldc, acc);
      }
    }
    if (K == 0) break;
  }
}

// Per-row depth ranges [lo, hi) of gemm_ranges: a tile has at most kBlockQ query rows and
// kBlockK keys.
struct Ranges {
  static constexpr int kRows = kBlockQ > kBlockK ? kBlockQ : kBlockK;
  int64_t lo[kRows] = {};
  int64_t hi[kRows] = {};
};

// C[M x N] (+)= A B as gemm(), but row m of C takes only the terms k in [lo[m], hi[m]) of its
// dot products: the terms a causal mask hides are never multiplied, so a NaN or infinity there
// (in A or B) cannot reach C as 0 * inf. Each row still sums its terms in ascending k, one fused
// multiply-add each, so on finite values the result is gemm()'s over the whole depth (which adds
// only zeros past a row's range). The depth all rows share runs as one gemm; the rest per row.
void gemm_ranges(int64_t M, int64_t N, const Ranges& ranges, const float* A, int64_t sam,
                 int64_t sak, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  const int64_t* lo = ranges.lo;
  const int64_t* hi = ranges.hi;
  int64_t shared_lo = lo[0], shared_hi = hi[0];
  for (int64_t m = 1; m < M; ++m) {
    shared_lo = std::max(shared_lo, lo[m]);
    shared_hi = std::min(shared_hi, hi[m]);
  }
  if (!accumulate) {
    for (int64_t m = 0; m < M; ++m) std::fill(C + m * ldc, C + m * ldc + N, 0.0f);
  }
  const auto row_part = [&](int64_t m, int64_t k0, int64_t k1) {
    if (k1 <= k0) return;
    gemm(1, N, k1 - k0, A + m * sam + k0 * sak, sam, sak, B + k0 * ldb, ldb, C + m * ldc, ldc,
         true);
  };
  if (shared_lo >= shared_hi) {
    for (int64_t m = 0; m < M; ++m) row_part(m, lo[m], hi[m]);
    return;
  }
  for (int64_t m = 0; m < M; ++m) row_part(m, lo[m], shared_lo);
  gemm(M, N, shared_hi - shared_lo, A + shared_lo * sak, sam, sak, B + shared_lo * ldb, ldb, C, ldc,
       true);
  for (int64_t m = 0; m < M; ++m) row_part(m, shared_hi, hi[m]);
}

// ---- bf16 pairs: C = mul * (A B) with bf16 operands, on vdpbf16ps ----------------------------
// Where the CPU multiplies bf16 pairs at the rate of its fp32 fused multiply-add (FA_BF16_PAIRS:
// AMD Zen 4 and 5), the flash algorithm's bf16 GEMMs run on pairs: twice the multiply-adds per
// instruction, fp32 sums. S = Q K^T and dP = dO V^T take the caller's bf16 values as they are,
// the scale applied to the result (mul), not to a rounded Q; forward and backward form S the
// same way, so the backward recomputes bit for bit the scores its forward saw. dV = P^T dO,
// dK = dS^T Q and dQ = dS K take P and dS rounded to bf16 (as the GPU kernels do), each row over
// its own range of the depth (gemm_pairs_ranges), so that masked values stay out as in fp32.
// A(m, p): the pair of depths 2p, 2p + 1 of row m, 32 bits at A + m * sam + p (uint32 units);
// B(p, n) likewise at B + p * ldb + n; C row-major, N a multiple of W. A depth padded to an even
// count holds a zero in its last pair's upper half.
#if FA_BF16_PAIRS
constexpr bool kBf16Pairs = true;

#if FA_AMX
// ---- AMX tiles ------------------------------------------------------------------------------
// The amx copy multiplies the pairs on tiles (amx_tiles.hpp): C in blocks of 32 x 32, tiles 0
// and 1 its first 16 rows, 2 and 3 the next; A's rows in tiles 4 and 5 (16 rows x 16 pairs
// each), B's columns in 6 and 7 (16 pairs x 16 columns). A block short of rows (M) or of depth
// (KP) loads its operands from zero-padded copies and stores C through one, so that a tile
// never reads past an operand or writes past C's rows, and the padding multiplies zeros only.
// tdpbf16ps sums an element's products in k order whichever operand is A (its definition), so
// S = Q K^T and S^T = K Q^T agree bit for bit, as the forward and the backward need.
using amx::kTileCols;
using amx::kTileRows;
static_assert(W == kTileCols, "a tile row is one vector");

struct alignas(64) TilePad {
  uint32_t v[kTileRows * kTileCols];
};

// rows x cols 32-bit elements of src (leading dimension ld) at the top left of pad, zeros
// elsewhere.
inline const uint32_t* padded(TilePad& pad, const uint32_t* src, int64_t ld, int rows, int cols) {
  std::memset(pad.v, 0, sizeof pad.v);
  for (int r = 0; r < rows; ++r) std::memcpy(pad.v + r * kTileCols, src + r * ld, cols * 4u);
  return pad.v;
}

// The whole depth in one pass per block of C. C = mul * A B, or with accumulate C += A B.
void gemm_pairs(int64_t M, int64_t N, int64_t KP, const uint32_t* A, int64_t sam,
                const uint32_t* B, int64_t ldb, float* C, int64_t ldc, float mul,
                bool accumulate = false) {
  amx::ready();
  TilePad pad_a0, pad_a1, pad_b0, pad_b1;
  alignas(64) float pad_c[kTileRows * kTileCols];
  const long stride_a = static_cast<long>(sam * 4), stride_b = static_cast<long>(ldb * 4);
  const long stride_c = static_cast<long>(ldc * 4), stride_pad = amx::kTileRowBytes;
  const bool scaled = !accumulate && mul != 1.0f;
  const vf m = splat(mul);
  for (int64_t n0 = 0; n0 < N; n0 += 2 * kTileCols) {
    const bool two_n = N - n0 > kTileCols;
    for (int64_t m0 = 0; m0 < M; m0 += 2 * kTileRows) {
      const int rows0 = static_cast<int>(std::min<int64_t>(kTileRows, M - m0));
      const int rows1 = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(kTileRows, M - m0 - kTileRows)));
      const bool two_m = rows1 > 0;
      float* c0 = C + m0 * ldc + n0;
      float* c1 = c0 + kTileRows * ldc;
      // C's tile at c with `rows` rows: loaded (accumulate), else zeroed.
#define FA_C_IN(t, c, rows)                                                                \
  do {                                                                                     \
    if (!accumulate) {                                                                     \
      FA_TILE_ZERO(t);                                                                     \
    } else if ((rows) == kTileRows) {                                                      \
      FA_TILE_LOAD(t, c, stride_c);                                                        \
    } else {                                                                               \
      FA_TILE_LOAD(t, padded(pad_a0, reinterpret_cast<const uint32_t*>(c), ldc, rows,      \
                             kTileCols), stride_pad);                                      \
    }                                                                                      \
  } while (0)
      // OP(tile, its top left in C, its rows) for each of the block's C tiles.
#define FA_EACH_C_TILE(OP)                   \
  do {                                       \
    OP(0, c0, rows0);                        \
    if (two_n) OP(1, c0 + kTileCols, rows0); \
    if (two_m) {                             \
      OP(2, c1, rows1);                      \
      if (two_n) OP(3, c1 + kTileCols, rows1); \
    }                                        \
  } while (0)
      FA_EACH_C_TILE(FA_C_IN);
#undef FA_C_IN
      for (int64_t k0 = 0; k0 < KP; k0 += kTileCols) {
        const int kp = static_cast<int>(std::min<int64_t>(kTileCols, KP - k0));
        const uint32_t* a0 = A + m0 * sam + k0;
        const uint32_t* a1 = a0 + kTileRows * sam;
        const uint32_t* b0 = B + k0 * ldb + n0;
        const uint32_t* b1 = b0 + kTileCols;
        if (rows0 == kTileRows && kp == kTileCols) {
          FA_TILE_LOAD(4, a0, stride_a);
        } else {
          FA_TILE_LOAD(4, padded(pad_a0, a0, sam, rows0, kp), stride_pad);
        }
        if (two_m) {
          if (rows1 == kTileRows && kp == kTileCols) {
            FA_TILE_LOAD(5, a1, stride_a);
          } else {
            FA_TILE_LOAD(5, padded(pad_a1, a1, sam, rows1, kp), stride_pad);
          }
        }
        if (kp == kTileCols) {
          FA_TILE_LOAD(6, b0, stride_b);
          if (two_n) FA_TILE_LOAD(7, b1, stride_b);
        } else {
          FA_TILE_LOAD(6, padded(pad_b0, b0, ldb, kp, kTileCols), stride_pad);
          if (two_n) FA_TILE_LOAD(7, padded(pad_b1, b1, ldb, kp, kTileCols), stride_pad);
        }
        FA_TILE_DPBF16PS(0, 4, 6);
        if (two_n) FA_TILE_DPBF16PS(1, 4, 7);
        if (two_m) {
          FA_TILE_DPBF16PS(2, 5, 6);
          if (two_n) FA_TILE_DPBF16PS(3, 5, 7);
        }
      }
      // C's tile to c: straight where it is whole (scaled below), else its first `rows` rows
      // through pad_c, times mul where scaled.
#define FA_C_OUT(t, c, rows)                                                               \
  do {                                                                                     \
    if ((rows) == kTileRows) {                                                             \
      FA_TILE_STORE(t, c, stride_c);                                                       \
    } else {                                                                               \
      FA_TILE_STORE(t, pad_c, stride_pad);                                                 \
      for (int r = 0; r < (rows); ++r) {                                                   \
        const vf x = vload(pad_c + r * kTileCols);                                         \
        vstore((c) + r * ldc, scaled ? x * m : x);                                         \
      }                                                                                    \
    }                                                                                      \
  } while (0)
      FA_EACH_C_TILE(FA_C_OUT);
#undef FA_C_OUT
#undef FA_EACH_C_TILE
    }
  }
  // The whole tiles' rows times mul, once every tile is stored: a vector load right behind a
  // tile's store would wait for it.
  if (scaled) {
    for (int64_t r = 0; r < M / kTileRows * kTileRows; ++r)
      for (int64_t n = 0; n < N; n += W) vstore(C + r * ldc + n, vload(C + r * ldc + n) * m);
  }
}
#else
using PairFn = void (*)(int, const uint32_t*, int64_t, const uint32_t*, int64_t, float*, int64_t,
                        float, bool);

// C = mul * A B, or with accumulate C += A B (mul unused).
template <int R, int NV>
void micro_pairs(int KP, const uint32_t* A, int64_t sam, const uint32_t* B, int64_t ldb, float* C,
                 int64_t ldc, float mul, bool accumulate) {
  __m512 c[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      c[r][v] = accumulate ? _mm512_loadu_ps(C + r * ldc + v * W) : _mm512_setzero_ps();
    }
  for (int k = 0; k < KP; ++k) {
    __m512bh b[NV];
    for (int v = 0; v < NV; ++v) b[v] = (__m512bh)_mm512_loadu_si512(B + k * ldb + v * W);
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(A[r * sam + k]));
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, b[v]);
    }
  }
  const __m512 m = _mm512_set1_ps(accumulate ? 1.0f : mul);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      _mm512_storeu_ps(C + r * ldc + v * W, accumulate ? c[r][v] : _mm512_mul_ps(c[r][v], m));
    }
}

template <int R, size_t... V>
constexpr std::array<PairFn, NVMAX> micro_pairs_row(std::index_sequence<V...>) {
  return {{&micro_pairs<R, static_cast<int>(V) + 1>...}};
}
template <size_t... R>
constexpr std::array<std::array<PairFn, NVMAX>, RMAX> micro_pairs_table(std::index_sequence<R...>) {
  return {{micro_pairs_row<static_cast<int>(R) + 1>(std::make_index_sequence<NVMAX>())...}};
}
constexpr std::array<std::array<PairFn, NVMAX>, RMAX> kMicroPairs =
    micro_pairs_table(std::make_index_sequence<RMAX>());

// The whole depth (KP pairs: a head dim's, or a tile's keys or queries) stays in the
// accumulators: one pass. C = mul * A B, or with accumulate C += A B.
void gemm_pairs(int64_t M, int64_t N, int64_t KP, const uint32_t* A, int64_t sam,
                const uint32_t* B, int64_t ldb, float* C, int64_t ldc, float mul,
                bool accumulate = false) {
  const int64_t nvec = N / W;
  for (int64_t v0 = 0; v0 < nvec; v0 += NVMAX) {
    const int nv = static_cast<int>(std::min<int64_t>(NVMAX, nvec - v0));
    for (int64_t m0 = 0; m0 < M; m0 += RMAX) {
      const int r = static_cast<int>(std::min<int64_t>(RMAX, M - m0));
      kMicroPairs[r - 1][nv - 1](static_cast<int>(KP), A + m0 * sam, sam, B + v0 * W, ldb,
                                 C + m0 * ldc + v0 * W, ldc, mul, accumulate);
    }
  }
}

#endif  // FA_AMX

// One row of C += A B over pairs [p0, p1), the depth elements outside [lo, hi) masked out of
// both operands (their halves of a pair zeroed), so that a masked value, NaN or infinite,
// never meets a product, and a masked 0 adds exactly what the unranged sum adds for it.
void row_pairs_masked(int64_t N, int64_t p0, int64_t p1, int64_t lo, int64_t hi, const uint32_t* A,
                      const uint32_t* B, int64_t ldb, float* C) {
  for (int64_t v = 0; v < N; v += W) {
    __m512 c = _mm512_loadu_ps(C + v);
    for (int64_t k = p0; k < p1; ++k) {
      const uint32_t keep = (2 * k >= lo ? 0x0000ffffu : 0u) | (2 * k + 1 < hi ? 0xffff0000u : 0u);
      const __m512i mask = _mm512_set1_epi32(static_cast<int>(keep));
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(A[k] & keep));
      const __m512bh b = (__m512bh)_mm512_and_si512(_mm512_loadu_si512(B + k * ldb + v), mask);
      c = _mm512_dpbf16_ps(c, a, b);
    }
    _mm512_storeu_ps(C + v, c);
  }
}

#if FA_AMX
// Depth pairs a ranged product spans at most: a tile's queries, or a forward step's keys.
constexpr int kMaxRangePairs = std::max(Ranges::kRows, kPairsForwardKeys) / 2;

// Whether a pair's lower or upper half is an infinity or a NaN (all its exponent bits set).
constexpr uint32_t kLowExponent = 0x00007f80u, kHighExponent = 0x7f800000u;
inline bool low_nonfinite(uint32_t x) { return (x & kLowExponent) == kLowExponent; }
inline bool high_nonfinite(uint32_t x) { return (x & kHighExponent) == kHighExponent; }

// C += A B with row m over the depth elements [lo[m], hi[m]) only, on tiles: every row runs
// over the pairs all rows together span, its own range's complement zeroed in a copy of A (by
// halves), so a masked value of A never reaches C, and a masked one of B meets only zeros,
// which adds exactly 0 where it is finite. Where B holds an infinity or NaN in that span (a
// poisoned input), it is zeroed in a copy of B too, and each row whose range holds one is
// computed again alone, from the original operands (its sum is not finite either way): no
// row's result depends on a value it does not see, bit for bit.
void gemm_pairs_ranges(int64_t M, int64_t N, const Ranges& ranges, const uint32_t* A, int64_t sam,
                       const uint32_t* B, int64_t ldb, float* C, int64_t ldc) {
  const int64_t* lo = ranges.lo;
  const int64_t* hi = ranges.hi;
  int64_t d_lo = std::numeric_limits<int64_t>::max(), d_hi = 0;
  for (int64_t m = 0; m < M; ++m) {
    if (lo[m] < hi[m]) {
      d_lo = std::min(d_lo, lo[m]);
      d_hi = std::max(d_hi, hi[m]);
    }
  }
  if (d_lo >= d_hi) return;
  const int64_t p_lo = d_lo / 2, p_hi = (d_hi + 1) / 2, kp = p_hi - p_lo;
  const uint32_t* b = B + p_lo * ldb;
  bool whole = d_lo % 2 == 0 && d_hi % 2 == 0;
  for (int64_t m = 0; m < M && whole; ++m) whole = lo[m] == d_lo && hi[m] == d_hi;
  if (whole) {  // every row sees the same pairs: nothing to mask
    gemm_pairs(M, N, kp, A + p_lo, sam, b, ldb, C, ldc, 1.0f, true);
    return;
  }
  // A row's range [lo, hi) is contiguous: zeros, its whole pairs copied, and at most one half
  // pair at each end (an odd lo keeps the upper half of its pair, an odd hi the lower half).
  alignas(64) uint32_t a_seen[Ranges::kRows * kMaxRangePairs];
  for (int64_t m = 0; m < M; ++m) {
    const uint32_t* a = A + m * sam + p_lo;
    uint32_t* dst = a_seen + m * kp;
    std::memset(dst, 0, static_cast<size_t>(kp) * sizeof(uint32_t));
    if (lo[m] >= hi[m]) continue;
    const int64_t whole_begin = (lo[m] + 1) / 2 - p_lo, whole_end = hi[m] / 2 - p_lo;
    if (whole_end > whole_begin) {
      std::memcpy(dst + whole_begin, a + whole_begin,
                  static_cast<size_t>(whole_end - whole_begin) * sizeof(uint32_t));
    }
    if (lo[m] % 2 != 0) dst[lo[m] / 2 - p_lo] = a[lo[m] / 2 - p_lo] & 0xffff0000u;
    if (hi[m] % 2 != 0) dst[hi[m] / 2 - p_lo] |= a[hi[m] / 2 - p_lo] & 0x0000ffffu;
  }
  // Whether B's span holds an infinity or a NaN: each row of pairs at once (no early exit
  // inside a row, so that the loop runs on vectors).
  bool finite = true;
  for (int64_t p = 0; p < kp && finite; ++p) {
    uint32_t nonfinite = 0;
    for (int64_t n = 0; n < N; ++n) {
      nonfinite |= low_nonfinite(b[p * ldb + n]) | high_nonfinite(b[p * ldb + n]);
    }
    finite = nonfinite == 0;
  }
  if (finite) {
    gemm_pairs(M, N, kp, a_seen, kp, b, ldb, C, ldc, 1.0f, true);
    return;
  }
  // A poisoned B: its non-finite halves zeroed, and the rows that see one done again alone.
  std::vector<uint32_t> b_clean(static_cast<size_t>(kp * N));
  bool poisoned_depth[2 * kMaxRangePairs] = {};
  for (int64_t p = 0; p < kp; ++p)
    for (int64_t n = 0; n < N; ++n) {
      uint32_t x = b[p * ldb + n];
      if (low_nonfinite(x)) {
        x &= 0xffff0000u;
        poisoned_depth[2 * p] = true;
      }
      if (high_nonfinite(x)) {
        x &= 0x0000ffffu;
        poisoned_depth[2 * p + 1] = true;
      }
      b_clean[p * N + n] = x;
    }
  std::vector<char> redo(static_cast<size_t>(M), 0);
  std::vector<float> saved;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = std::max(lo[m], 2 * p_lo); k < hi[m] && !redo[m]; ++k) {
      redo[m] = poisoned_depth[k - 2 * p_lo];
    }
    if (redo[m]) saved.insert(saved.end(), C + m * ldc, C + m * ldc + N);
  }
  gemm_pairs(M, N, kp, a_seen, kp, b_clean.data(), N, C, ldc, 1.0f, true);
  const float* row = saved.data();
  for (int64_t m = 0; m < M; ++m) {
    if (!redo[m]) continue;
    std::copy(row, row + N, C + m * ldc);
    row += N;
    row_pairs_masked(N, lo[m] / 2, (hi[m] + 1) / 2, lo[m], hi[m], A + m * sam, B, ldb, C + m * ldc);
  }
}
#else
// C += A B as gemm_ranges does it in fp32, on pairs: row m takes only the depth elements
// [lo[m], hi[m]). The pairs every row takes whole run as one gemm_pairs; each row's pairs
// before and after them (a half of a boundary pair masked) run alone, in ascending order, so a
// row's sum is the one the whole depth would give where the masked values are finite zeros.
void gemm_pairs_ranges(int64_t M, int64_t N, const Ranges& ranges, const uint32_t* A, int64_t sam,
                       const uint32_t* B, int64_t ldb, float* C, int64_t ldc) {
  const int64_t* lo = ranges.lo;
  const int64_t* hi = ranges.hi;
  int64_t shared_lo = 0, shared_hi = std::numeric_limits<int64_t>::max();
  for (int64_t m = 0; m < M; ++m) {
    shared_lo = std::max(shared_lo, (lo[m] + 1) / 2);  // the first pair whole in every row
    shared_hi = std::min(shared_hi, hi[m] / 2);        // past the last
  }
  const auto row_part = [&](int64_t m, int64_t p0, int64_t p1) {
    if (p1 > p0) row_pairs_masked(N, p0, p1, lo[m], hi[m], A + m * sam, B, ldb, C + m * ldc);
  };
  if (shared_lo >= shared_hi) {
    for (int64_t m = 0; m < M; ++m) row_part(m, lo[m] / 2, (hi[m] + 1) / 2);
    return;
  }
  for (int64_t m = 0; m < M; ++m) row_part(m, lo[m] / 2, shared_lo);
  gemm_pairs(M, N, shared_hi - shared_lo, A + shared_lo, sam, B + shared_lo * ldb, ldb, C, ldc, 1.0f,
             true);
  for (int64_t m = 0; m < M; ++m) row_part(m, shared_hi, (hi[m] + 1) / 2);
}
#endif  // FA_AMX
#else
constexpr bool kBf16Pairs = false;
void gemm_pairs_ranges(int64_t, int64_t, const Ranges&, const uint32_t*, int64_t, const uint32_t*,
                       int64_t, float*, int64_t) {}
void gemm_pairs(int64_t, int64_t, int64_t, const uint32_t*, int64_t, const uint32_t*, int64_t,
                float*, int64_t, float, bool = false) {}
#endif

// ---- Rows -----------------------------------------------------------------------------------

inline float row_max(const float* s, int64_t n) {
  vf m = vload(s);
  for (int64_t j = W; j < n; j += W) m = vmax(m, vload(s + j));
  return hmax(m);
}

// A row's shift in log2 units as an unevaluated sum hi + lo of two floats, so that s - shift
// keeps the precision of a double (the backward's LSE, converted from natural log, needs more
// bits than one float has), and how finely the shift is known: the saved LSE is rounded to
// fp32, so a difference within `resolution` of 0 cannot be told from 0.
struct Shift {
  float hi = 0.0f;
  float lo = 0.0f;
  float resolution = 0.0f;
};

// The shift for P = exp2(S - LSE) from the LSE in log2 units (hi + lo, -inf for a row that sees
// no key). The fp32 LSE carries up to half an ulp of rounding, under |LSE| * 2^-24.
inline Shift lse_shift(float hi, float lo) {
  return Shift{hi, lo, std::isfinite(hi) ? std::fabs(hi) * 0x1p-24f : 0.0f};
}

// s = exp2(s - shift) in place; returns the sum. The shift is the row's maximum or its LSE, so
// s - shift <= 0 and each term <= 1. A difference above -resolution is taken as 0: rounding may
// put it a hair above 0 at ordinary logits, and at huge ones (a huge softmax scale, where the
// LSE keeps fewer bits than the scores) anywhere in +-|LSE| 2^-24, which would turn the
// one-hot softmax such a row has into zeros or overflows. So no probability exceeds 1, and the
// row's largest one is 1 when the LSE cannot resolve it from 1.
inline float exp_row(float* s, int64_t n, Shift shift) {
  vf sum{};
  const vf hi = splat(shift.hi), lo = splat(shift.lo), floor = splat(-shift.resolution);
  for (int64_t j = 0; j < n; j += W) {
    vf x = (vload(s + j) - hi) - lo;
    x = select(x > floor, vf{}, x);
    const vf e = exp2v_nonpositive(x);
    vstore(s + j, e);
    sum += e;
  }
  return hsum(sum);
}

inline void scale_row(float* s, int64_t n, float f) {
  const vf fv = splat(f);
  for (int64_t j = 0; j < n; j += W) vstore(s + j, vload(s + j) * fv);
}

inline void fill_row(float* s, int64_t begin, int64_t end, float value) {
  for (int64_t j = begin; j < end; ++j) s[j] = value;
}

// The natural-log LSE of a row from its log2-unit maximum m2 and sum l, rounded once.
inline float natural_lse(float m2, float l) {
  return static_cast<float>((static_cast<double>(m2) + std::log2(static_cast<double>(l))) * kLn2d);
}

// dS = P * (dP - delta), in place over dP.
inline void ds_row(const float* p, float* dp, int64_t n, float delta) {
  const vf dv = splat(delta);
  for (int64_t j = 0; j < n; j += W) vstore(dp + j, vload(p + j) * (vload(dp + j) - dv));
}

// ---- Storage types --------------------------------------------------------------------------

using F32 = Fp32Storage;  // cpu/storage.hpp
using F16 = Fp16Storage;
using BF16 = Bf16Storage;

template <class E>
inline const typename E::T* in_row(const Tensor4& t, int64_t b, int64_t n, int64_t h) {
  return static_cast<const typename E::T*>(t.data) + b * t.stride_batch + n * t.stride_seq +
         h * t.stride_head;
}
template <class E>
inline typename E::T* out_row(const Tensor4& t, int64_t b, int64_t n, int64_t h) {
  return static_cast<typename E::T*>(t.data) + b * t.stride_batch + n * t.stride_seq +
         h * t.stride_head;
}
// Calls row(j, pointer) for rows [n0, n0 + count) of (b, h) of a key or value view, j from 0:
// in a paged cache the page is looked up once per run of rows inside it, not once per row.
template <class E, class Row>
inline void for_kv_rows(const Tensor4& t, const BlockTable& pages, int64_t b, int64_t n0,
                        int64_t count, int64_t h, Row&& row) {
  if (pages.data == nullptr) {
    const typename E::T* first = in_row<E>(t, b, n0, h);
    for (int64_t j = 0; j < count; ++j) row(j, first + j * t.stride_seq);
    return;
  }
  for (int64_t j = 0; j < count;) {
    const int64_t n = n0 + j, in_page = n % pages.page_size;
    const int64_t run = std::min(count - j, pages.page_size - in_page);
    const typename E::T* first = in_row<E>(t, pages.at(b, n / pages.page_size), in_page, h);
    for (int64_t i = 0; i < run; ++i) row(j + i, first + i * t.stride_seq);
    j += run;
  }
}
inline float* lse_at(const LseView& l, int64_t b, int64_t h, int64_t i) {
  return l.data + b * l.stride_batch + h * l.stride_head + i * l.stride_seq;
}

// dst[0, d) = mul * src, dst[d, dp) = 0.
template <class E>
inline void pack_row(float* dst, const typename E::T* src, int d, int dp, float mul) {
  for (int k = 0; k < d; ++k) dst[k] = E::load(src[k]) * mul;
  for (int k = d; k < dp; ++k) dst[k] = 0.0f;
}

// Rows [n0, n0 + count) of (b, h) transposed into dst[k * ld + j] = mul * x[n0 + j][k] for
// k < d; columns [count, count_pad) are zeroed. Rows of a paged cache through its pages.
template <class E>
void pack_transposed(float* dst, int64_t ld, const Tensor4& t, int64_t b, int64_t n0, int count,
                     int count_pad, int64_t h, int d, float mul,
                     const BlockTable& pages = BlockTable{}) {
  for_kv_rows<E>(t, pages, b, n0, count, h, [&](int64_t j, const typename E::T* src) {
    for (int k = 0; k < d; ++k) dst[k * ld + j] = E::load(src[k]) * mul;
  });
  for (int k = 0; k < d; ++k)
    for (int j = count; j < count_pad; ++j) dst[k * ld + j] = 0.0f;
}

// Whether element type E takes the bf16 pair GEMMs in this copy of the kernels.
template <class E>
constexpr bool uses_pairs() {
  return kBf16Pairs && std::is_same<E, BF16>::value;
}

// A row as dp / 2 pairs (dp even, at least d): dst[p] = (x[2p], x[2p + 1]), zeros past d. The
// pairs of a row, in its order, are its 16-bit elements as they lie in memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "a pair's first element is its low half");
inline void pack_row_pairs(uint32_t* dst, const uint16_t* src, int d, int dp) {
  std::memcpy(dst, src, static_cast<size_t>(d) * sizeof(uint16_t));
  std::memset(reinterpret_cast<char*>(dst) + d * sizeof(uint16_t), 0,
              static_cast<size_t>(dp - d) * sizeof(uint16_t));
}

#if FA_BF16_PAIRS
// The packs of fp32 tiles into bf16 pairs, 16 pairs a vector: vcvtne2ps2bf16 rounds 32 floats
// to nearest even, a permutation of words interleaves two rows' halves.
// 32 rounded bf16 in the order of lo's 16 floats, then hi's.
inline __m512i round_halves(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }
// The pairs (lo[c], hi[c]), c < 16.
inline __m512i round_pairs(__m512 lo, __m512 hi) {
  alignas(64) static const uint16_t kInterleave[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5,
                                                        21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26,
                                                        11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), round_halves(lo, hi));
}

// 16 x 16 32-bit elements transposed in registers: r[i] becomes column i of what r held.
inline void transpose16(__m512i r[16]) {
  __m512 a[16], t[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_castsi512_ps(r[i]);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(a[i], a[i + 1]);  // per 128-bit lane: x0 y0 x1 y1
    t[i + 1] = _mm512_unpackhi_ps(a[i], a[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // per lane L of a[i + j]: rows i..i+3 of column 4L + j
    a[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    a[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
    a[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    a[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int j = 0; j < 4; ++j) {  // lanes 0, 2 and 1, 3 of the row quads (0, 4) and (8, 12)
    t[j] = _mm512_shuffle_f32x4(a[j], a[j + 4], 0x88);
    t[j + 4] = _mm512_shuffle_f32x4(a[j], a[j + 4], 0xdd);
    t[j + 8] = _mm512_shuffle_f32x4(a[j + 8], a[j + 12], 0x88);
    t[j + 12] = _mm512_shuffle_f32x4(a[j + 8], a[j + 12], 0xdd);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm512_castps_si512(_mm512_shuffle_f32x4(t[j], t[j + 8], 0x88));
    r[j + 8] = _mm512_castps_si512(_mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd));
    r[j + 4] = _mm512_castps_si512(_mm512_shuffle_f32x4(t[j + 4], t[j + 12], 0x88));
    r[j + 12] = _mm512_castps_si512(_mm512_shuffle_f32x4(t[j + 4], t[j + 12], 0xdd));
  }
}

// Transposed, down the rows: dst[c * ld_dst + r / 2] = (src[r][c], src[r + 1][c]) for r < rows
// (r even; an odd count's last upper half 0) and c < cols, a multiple of 16. Whole blocks of 16
// pairs are written, zeros past (rows + 1) / 2: ld_dst holds a multiple of 16.
inline void pack_pairs_transposed(uint32_t* dst, int64_t ld_dst, const float* src, int64_t ld,
                                  int rows, int cols) {
  const int pairs = (rows + 1) / 2;
  for (int p0 = 0; p0 < pairs; p0 += 16) {
    for (int c0 = 0; c0 < cols; c0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const int p = p0 + i;
        if (p >= pairs) {
          r[i] = _mm512_setzero_si512();
          continue;
        }
        const __m512 lo = _mm512_loadu_ps(src + 2 * p * ld + c0);
        const __m512 hi =
            2 * p + 1 < rows ? _mm512_loadu_ps(src + (2 * p + 1) * ld + c0) : _mm512_setzero_ps();
        r[i] = round_pairs(lo, hi);
      }
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + (c0 + i) * ld_dst + p0, r[i]);
    }
  }
}

// Rows [n0, n0 + count) of (b, h) as the pairs of a transposed tile: dst[p * ld + j] = the pair
// (x[n0 + j][2p], x[n0 + j][2p + 1]) for 2p < d, columns [count, count_pad) zeroed; nothing
// else of dst is written (count <= Ranges::kRows).
inline void pack_transposed_pairs(uint32_t* dst, int64_t ld, const Tensor4& t, int64_t b,
                                  int64_t n0, int count, int count_pad, int64_t h, int d,
                                  const BlockTable& pages = BlockTable{}) {
  const uint16_t* rows[Ranges::kRows];
  for_kv_rows<BF16>(t, pages, b, n0, count, h, [&](int64_t j, const uint16_t* src) { rows[j] = src; });
  const int pairs = (d + 1) / 2;
  for (int j0 = 0; j0 < count_pad; j0 += 16) {
    const int columns = std::min(16, count_pad - j0);
    const __mmask16 store = static_cast<__mmask16>((1u << columns) - 1);
    for (int p0 = 0; p0 < pairs; p0 += 16) {
      const int left = d - 2 * p0;  // elements of a row from pair p0 on
      const __mmask32 load = left >= 32 ? ~0u : (1u << left) - 1;
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = j0 + i < count ? _mm512_maskz_loadu_epi16(load, rows[j0 + i] + 2 * p0)
                              : _mm512_setzero_si512();
      }
      transpose16(r);
      for (int p = 0; p < std::min(16, pairs - p0); ++p) {
        _mm512_mask_storeu_epi32(dst + (p0 + p) * ld + j0, store, r[p]);
      }
    }
  }
}
// count bf16 rows of d elements as the pairs down them: dst[(j / 2) * ldd + x] = (rows[j][x],
// rows[j + 1][x]) for x < d, zero for x in [d, ldd) (ldd a multiple of 16) and in an odd
// count's last upper half.
inline void pack_rows_pairs_down(uint32_t* dst, int64_t ldd, const uint16_t* const* rows, int count,
                                 int d) {
  for (int j = 0; j < count; j += 2) {
    const uint16_t* lo = rows[j];
    const uint16_t* hi = j + 1 < count ? rows[j + 1] : nullptr;
    for (int x = 0; x < ldd; x += 16) {
      const __mmask16 live =
          x >= d ? 0 : d - x >= 16 ? 0xffff : static_cast<__mmask16>((1u << (d - x)) - 1);
      const __m512i l = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, lo + x));
      const __m512i u = hi != nullptr
                            ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, hi + x))
                            : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + (j / 2) * ldd + x, _mm512_or_si512(l, _mm512_slli_epi32(u, 16)));
    }
  }
}
// Down the rows: dst[(r / 2) * ld_dst + c] = (src[r][c], src[r + 1][c]), r even; cols a
// multiple of 16.
inline void pack_pairs_down(uint32_t* dst, int64_t ld_dst, const float* src, int64_t ld, int rows,
                            int cols) {
  for (int r = 0; r < rows; r += 2) {
    const float* a = src + r * ld;
    const float* b = r + 1 < rows ? src + (r + 1) * ld : nullptr;
    for (int c = 0; c < cols; c += 16) {
      const __m512 hi = b != nullptr ? _mm512_loadu_ps(b + c) : _mm512_setzero_ps();
      _mm512_storeu_si512(dst + (r / 2) * ld_dst + c, round_pairs(_mm512_loadu_ps(a + c), hi));
    }
  }
}
// Along the rows: dst[r * ld_dst + c / 2] = (src[r][c], src[r][c + 1]), c even, cols a multiple
// of 16. Whole blocks of 16 pairs are written, zeros past cols / 2: ld_dst holds a multiple
// of 16.
inline void pack_pairs_along(uint32_t* dst, int64_t ld_dst, const float* src, int64_t ld, int rows,
                             int cols) {
  for (int r = 0; r < rows; ++r) {
    const float* a = src + r * ld;
    for (int c = 0; c < cols; c += 32) {
      const __m512 hi = c + 16 < cols ? _mm512_loadu_ps(a + c + 16) : _mm512_setzero_ps();
      _mm512_storeu_si512(dst + r * ld_dst + c / 2, round_halves(_mm512_loadu_ps(a + c), hi));
    }
  }
}

// The forward's O += P V on pairs as well: P rounded to bf16, as the backward's products and
// the GPU kernels round it.
constexpr bool kPairsTimesV = true;

// The softmax's exponentials of one vector of 16 queries over a step's ncols keys (scores at
// col + key * kBlockQ, read through score), written straight as P's transposed pairs, the A
// operand of P V: dst[query * ld + p] = (P[query][2p], P[query][2p + 1]), whole blocks of 16
// pairs (zeros past the keys). The values and their rounding are pack_pairs_transposed's of
// the exponentials stored as floats; this skips the store and the reload. Returns the keys'
// sum, added in key order.
template <class Score>
inline vf exp_to_pairs_transposed(uint32_t* dst, int64_t ld, const Score& score, const float* col,
                                  int ncols, vf shift) {
  vf sum{};
  const int pairs = (ncols + 1) / 2;
  for (int p0 = 0; p0 < pairs; p0 += 16) {
    __m512i r[16];
    for (int i = 0; i < 16; ++i) {
      const int key = 2 * (p0 + i);
      if (key >= ncols) {
        r[i] = _mm512_setzero_si512();
        continue;
      }
      const vf lo = exp2v_nonpositive(score(col + key * kBlockQ) - shift);
      sum += lo;
      vf hi{};
      if (key + 1 < ncols) {
        hi = exp2v_nonpositive(score(col + (key + 1) * kBlockQ) - shift);
        sum += hi;
      }
      r[i] = round_pairs(lo, hi);
    }
    transpose16(r);
    for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + i * ld + p0, r[i]);
  }
  return sum;
}

// Rows [n0, n0 + count) of (b, h) of a bf16 value view as the pairs down its rows, as
// pack_rows_pairs_down.
inline void pack_value_pairs(uint32_t* dst, int64_t ldd, const Tensor4& t, int64_t b, int64_t n0,
                             int count, int64_t h, int d, const BlockTable& pages) {
  const uint16_t* rows[kPairsForwardKeys];
  for_kv_rows<BF16>(t, pages, b, n0, count, h, [&](int64_t j, const uint16_t* src) { rows[j] = src; });
  pack_rows_pairs_down(dst, ldd, rows, count, d);
}
#else
// The copies without pairs never pack them (every call is under uses_pairs).
constexpr bool kPairsTimesV = false;
template <class Score>
inline vf exp_to_pairs_transposed(uint32_t*, int64_t, const Score&, const float*, int, vf) {
  return vf{};
}
inline void pack_value_pairs(uint32_t*, int64_t, const Tensor4&, int64_t, int64_t, int, int64_t,
                             int, const BlockTable&) {}
inline void pack_transposed_pairs(uint32_t*, int64_t, const Tensor4&, int64_t, int64_t, int, int,
                                  int64_t, int, const BlockTable& = BlockTable{}) {}
inline void pack_rows_pairs_down(uint32_t*, int64_t, const uint16_t* const*, int, int) {}
inline void pack_pairs_down(uint32_t*, int64_t, const float*, int64_t, int, int) {}
inline void pack_pairs_transposed(uint32_t*, int64_t, const float*, int64_t, int, int) {}
inline void pack_pairs_along(uint32_t*, int64_t, const float*, int64_t, int, int) {}
#endif  // FA_BF16_PAIRS

// Asks for rows [n0, n0 + count) of (b, h) to be brought into L2 while the current tile is
// computed: rows of one head are far apart in [B, N, H, D], which defeats the hardware
// prefetchers.
template <class E>
void prefetch_rows(const Tensor4& t, int64_t b, int64_t n0, int64_t count, int64_t h, int d,
                   const BlockTable& pages) {
  const int64_t bytes = static_cast<int64_t>(d) * static_cast<int64_t>(sizeof(typename E::T));
  for_kv_rows<E>(t, pages, b, n0, count, h, [&](int64_t, const typename E::T* src) {
    const char* row = reinterpret_cast<const char*>(src);
    for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(row + at, 0, 2);
    __builtin_prefetch(row + bytes - 1, 0, 2);
  });
}

template <class E>
inline void store_row(typename E::T* dst, const float* src, int d, float mul) {
  for (int k = 0; k < d; ++k) dst[k] = E::store(src[k] * mul);
}


inline int vec_round(int n) { return (n + W - 1) / W * W; }

// ---- Variants: the mask's ranges, the logits, the sinks --------------------------------------

// The depth ranges of gemm_ranges for query rows [i0, i0 + rows) against keys [j0, j0 + ncols)
// of one sequence, tile-relative. Per query row (rows <= kBlockQ): the keys it sees.
inline Ranges keys_seen(const Mask& m, int64_t i0, int rows, int64_t j0, int64_t ncols) {
  Ranges r;
  for (int i = 0; i < rows; ++i) {
    r.lo[i] = Mask::clamp(m.key_begin(i0 + i) - j0, ncols);
    r.hi[i] = Mask::clamp(m.key_end(i0 + i) - j0, ncols);
  }
  return r;
}
// Per key (ncols <= kBlockK): the query rows that see it.
inline Ranges rows_seeing(const Mask& m, int64_t i0, int64_t rows, int64_t j0, int ncols) {
  Ranges r;
  for (int j = 0; j < ncols; ++j) {
    r.lo[j] = Mask::clamp(m.row_begin(j0 + j) - i0, rows);
    r.hi[j] = Mask::clamp(m.row_end(j0 + j) - i0, rows);
  }
  return r;
}

// What becomes of one (sequence, head)'s raw scores, in log2 units, in the header's order:
// x = cap * tanh(x / cap) with a softcap, then x - slope * |i + diag - j| with ALiBi slopes.
struct Logits {
  bool softcap = false;
  float cap = 0.0f;      // c * log2(e)
  float inv_cap = 0.0f;  // 1 / cap
  bool alibi = false;
  float slope = 0.0f;  // the slope * log2(e)
  int64_t diag = 0;    // the sequence's len_k - len_q

  bool active() const { return softcap || alibi; }
};

inline Logits logits_of(const Problem& p, const VariantViews& v, const Seq& s, int64_t b,
                        int64_t h) {
  Logits lg;
  lg.diag = s.len_k - s.len_q;
  if (p.softcap > 0.0f) {
    lg.softcap = true;
    lg.cap = p.softcap * kLog2e;
    lg.inv_cap = 1.0f / lg.cap;
  }
  if (p.alibi != Alibi::None) {
    lg.alibi = true;
    lg.slope = v.alibi.at(b, h) * kLog2e;
  }
  return lg;
}

// s[t], t in [0, n) (n a multiple of W): the raw score of the query i and key j for which
// i + diag - j = x0 + t * dx (a row of S: dx = -1; a row of S^T: dx = +1), turned into its
// logit. With dcap, the softcap's derivative 1 - tanh^2 goes there (the backward's factor).
inline void logits_row(float* s, int64_t n, const Logits& lg, int64_t x0, int64_t dx,
                       float* dcap) {
  vf steps;
  for (int w = 0; w < W; ++w) steps[w] = static_cast<float>(w * dx);
  for (int64_t t = 0; t < n; t += W) {
    vf x = vload(s + t);
    if (lg.softcap) {
      const vf th = tanhv(x * splat(lg.inv_cap));
      x = splat(lg.cap) * th;
      if (dcap != nullptr) vstore(dcap + t, splat(1.0f) - th * th);
    }
    if (lg.alibi) {
      const vf distance = splat(static_cast<float>(x0 + t * dx)) + steps;
      x = x - splat(lg.slope) * vabs(distance);
    }
    vstore(s + t, x);
  }
}

// The logits of one column of S^T (key `key`, the tile's query columns): as logits_row, with
// each column's own ALiBi slope and position (i + diag of its query), so that the columns may
// belong to different heads. The same operations as logits_row's, so the same values.
inline void logits_cols(float* s, int64_t n, const Logits& lg, const float* slope,
                        const float* position, int64_t key) {
  const vf k = splat(static_cast<float>(key));
  for (int64_t t = 0; t < n; t += W) {
    vf x = vload(s + t);
    if (lg.softcap) {
      const vf th = tanhv(x * splat(lg.inv_cap));
      x = splat(lg.cap) * th;
    }
    if (lg.alibi) {
      const vf distance = vload(position + t) - k;
      x = x - vload(slope + t) * vabs(distance);
    }
    vstore(s + t, x);
  }
}

// One head's attention sink, in log2 units: a key of value 0 in every row's softmax. A row
// whose keys have the maximum m shifts its exponentials by shift(m) and adds term(shift) to its
// sum. Without a sink, shift(m) = m and term = 0.
struct Sink {
  bool present = false;
  float logit = 0.0f;  // the sink * log2(e)
  float shift(float m) const { return present ? std::max(m, logit) : m; }
  float term(float shift) const { return present ? std::exp2(logit - shift) : 0.0f; }
};

inline Sink sink_of(const VariantViews& v, int64_t h) {
  Sink k;
  if (v.sinks.data != nullptr) {
    k.present = true;
    k.logit = v.sinks.at(h) * kLog2e;
  }
  return k;
}

// ---- Work items -----------------------------------------------------------------------------

struct Thread {
  char* base;
  float* at(size_t offset) const { return reinterpret_cast<float*>(base + offset); }
};
inline Thread thread_area(const Plan& pl, char* ws, int worker) {
  return Thread{ws + pl.thread_base + static_cast<size_t>(worker) * pl.thread_bytes};
}
inline float* shared_at(char* ws, size_t offset) { return reinterpret_cast<float*>(ws + offset); }

// Query tiles are handed out last tile first: under the causal mask they carry the most work.
// A tile past its sequence's queries (a variable-length batch) has no rows.
struct QTileItem {
  int64_t b, h, qt;
  Seq seq;
  int64_t i0;  // first row, in the sequence
  int rows;    // 0: nothing to do
};
inline QTileItem q_tile_item(const Problem& p, const VariantViews& v, const Plan& pl,
                             int64_t item) {
  const int64_t per_head = pl.tiles_q;
  const int64_t bh = item / per_head;
  QTileItem it{bh / p.heads_q, bh % p.heads_q, per_head - 1 - item % per_head, Seq{}, 0, 0};
  it.seq = seq_of(p, v, it.b);
  it.i0 = it.qt * kBlockQ;
  it.rows = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(kBlockQ, it.seq.len_q - it.i0)));
  return it;
}

// ---- Flash forward --------------------------------------------------------------------------
// One item: query_group tiles of query rows of one (batch, head). K/V tiles stream through;
// each query keeps a running maximum m and sum l (log2 units), its output accumulator is
// rescaled by exp2(m_old - m_new) when the maximum grows, and divided by l once at the end.
// Scores are computed transposed, S^T = K Q^T ([keys, queries]), so that the statistics of W
// queries at a time live in one vector and K needs no transpose. Only the keys some row of a
// tile sees are visited.

struct QueryTile {
  // Its columns: `segments` query heads (h, h + 1, ...) of one KV group, each seg_rows columns
  // of the same queries i0 .. i0 + seg_rows - 1 (one segment but in a decode step).
  int64_t h;
  int segments;
  int seg_rows;
  Logits lg;                   // the heads' logits (the ALiBi slope per column, below)
  Sink sink[kMaxQueryGroup];   // per segment
  float slope[kBlockQ];        // ALiBi: each column's slope, and its query's i + diag
  float position[kBlockQ];
  int64_t i0;         // first row (in the sequence)
  int rows;           // rows in the tile
  int rows_p;         // rows rounded up to whole vectors (extra columns are zero queries)
  int64_t key_begin;  // keys [key_begin, key_end) are visible to some row of the tile
  int64_t key_end;
  float* Qt;          // [d][kBlockQ], scaled to log2 units
  float* O;           // [kBlockQ][dvp]
  float* m;           // [kBlockQ]
  float* l;           // [kBlockQ]
};

// One K/V tile (K packed as [ncols][dp], V as [ncols][dvp]) into one query tile's running state.
// The keys each column (row of the output) of a tile sees, tile-relative: as keys_seen, per
// segment.
inline Ranges keys_seen(const Mask& m, const QueryTile& q, int64_t j0, int64_t ncols) {
  Ranges r = keys_seen(m, q.i0, q.seg_rows, j0, ncols);
  for (int c = q.seg_rows; c < q.rows; ++c) {
    r.lo[c] = r.lo[c % q.seg_rows];
    r.hi[c] = r.hi[c % q.seg_rows];
  }
  return r;
}

// With pairs (uses_pairs), K holds [ncols][dp / 2] pairs and q.Qt [d / 2][kBlockQ] pairs of the
// unscaled q; qmul scales the product. With pairs and kPairsTimesV, V holds [ncols / 2][dvp]
// pairs down its rows, and P's pairs go through p_pairs ([kBlockQ][p_ld]).
void flash_forward_tile(const Mask& mask, QueryTile& q, const float* K, const float* V,
                        int64_t j0, int ncols, int d, int dp, int dvp, float* St, bool pairs,
                        float qmul, uint32_t* p_pairs, int p_ld) {
  // With pairs and no logits policy, the scale multiplies each score where the softmax reads it
  // (its maximum and its exponential) instead of in a pass of its own over the tile: the same
  // product, so the same values as the backward's recomputation. A positive scale only, so
  // that the masks' -inf stays -inf.
  const bool scale_on_read = pairs && !q.lg.active() && qmul > 0.0f;
  if (pairs) {
    gemm_pairs(ncols, q.rows_p, (d + 1) / 2, reinterpret_cast<const uint32_t*>(K), dp / 2,
               reinterpret_cast<const uint32_t*>(q.Qt), kBlockQ, St, kBlockQ,
               scale_on_read ? 1.0f : qmul);
  } else {
    gemm(ncols, q.rows_p, d, K, dp, 1, q.Qt, kBlockQ, St, kBlockQ, false);
  }
  if (q.lg.active()) {
    for (int j = 0; j < ncols; ++j) {
      logits_cols(St + j * kBlockQ, q.rows_p, q.lg, q.slope, q.position, j0 + j);
    }
  }
  if (!mask.covers(q.i0, q.i0 + q.seg_rows, j0, j0 + ncols)) {
    for (int j = 0; j < ncols; ++j) {
      float* col = St + j * kBlockQ;
      const int64_t seen_from = Mask::clamp(mask.row_begin(j0 + j) - q.i0, q.seg_rows);
      const int64_t seen_to = mask.row_end(j0 + j) - q.i0;
      // The padding columns past the tile's rows are zero queries of no row: left as they are.
      for (int sg = 0; sg < q.segments; ++sg) {
        const int64_t c0 = sg * q.seg_rows;
        fill_row(col, c0, c0 + seen_from, kNegInf);
        if (seen_to < q.seg_rows) {
          fill_row(col, c0 + std::max(seen_from, seen_to), c0 + q.seg_rows, kNegInf);
        }
      }
    }
  }
  float alpha[kBlockQ];
  // With P V on pairs the exponentials go straight to P's pairs (St keeps the scores).
  const bool pack_p = pairs && kPairsTimesV;
  auto softmax_step = [&](auto scaled_on_read) {
    constexpr bool kScale = decltype(scaled_on_read)::value;
    const vf qs = splat(qmul);
    auto score = [&](const float* at) { return kScale ? vload(at) * qs : vload(at); };
    for (int v = 0; v < q.rows_p / W; ++v) {
      float* col = St + v * W;
      // The maximum in four independent chains (a chain of vmax waits a latency per key).
      vf mx0 = score(col), mx1 = mx0, mx2 = mx0, mx3 = mx0;
      int key = 1;
      for (; key + 4 <= ncols; key += 4) {
        mx0 = vmax(mx0, score(col + key * kBlockQ));
        mx1 = vmax(mx1, score(col + (key + 1) * kBlockQ));
        mx2 = vmax(mx2, score(col + (key + 2) * kBlockQ));
        mx3 = vmax(mx3, score(col + (key + 3) * kBlockQ));
      }
      for (; key < ncols; ++key) mx0 = vmax(mx0, score(col + key * kBlockQ));
      const vf mx = vmax(vmax(mx0, mx1), vmax(mx2, mx3));
      const vf m_old = vload(q.m + v * W);
      const vf m_new = vmax(m_old, mx);
      // A query that sees no key yet keeps m = -inf; shifting by 0 keeps its terms at 0.
      const vf shift = select(m_new == splat(kNegInf), vf{}, m_new);
      vf sum{};
      if (pack_p) {
        sum = exp_to_pairs_transposed(p_pairs + v * W * p_ld, p_ld, score, col, ncols, shift);
      } else {
        for (int j = 0; j < ncols; ++j) {
          const vf e = exp2v_nonpositive(score(col + j * kBlockQ) - shift);
          vstore(col + j * kBlockQ, e);
          sum += e;
        }
      }
      const vf al = exp2v_nonpositive(m_old - shift);
      vstore(alpha + v * W, al);
      vstore(q.l + v * W, vload(q.l + v * W) * al + sum);
      vstore(q.m + v * W, m_new);
    }
  };
  if (scale_on_read) {
    softmax_step(std::true_type{});
  } else {
    softmax_step(std::false_type{});
  }
  for (int r = 0; r < q.rows; ++r) {
    if (alpha[r] != 1.0f) scale_row(q.O + r * dvp, dvp, alpha[r]);
  }
  if (pack_p) {
    gemm_pairs_ranges(q.rows, dvp, keys_seen(mask, q, j0, ncols), p_pairs, p_ld,
                      reinterpret_cast<const uint32_t*>(V), dvp, q.O, dvp);
    return;
  }
  gemm_ranges(q.rows, dvp, keys_seen(mask, q, j0, ncols), St, 1, kBlockQ, V, dvp, q.O, dvp, true);
}

// Keys per forward step with P V on pairs: four key tiles on AMX above head dim 64 (d128 at 4k
// +2.5-7.8 % against two on an AMX Xeon, docs/perf/cpu-2026-12-07-xeon-amx-dev.md); two at d64,
// where four were no faster, and on the avx512bf16 copy, where four were not measured.
inline int pairs_forward_keys(int head_dim) {
#if FA_AMX
  if (head_dim > kWideStepAboveHeadDim) return kPairsForwardKeys;
#endif
  (void)head_dim;
  return kNarrowForwardKeys;
}

// One work item: `head_group` query heads of one KV group times `query_group` query tiles of
// each, sharing every K/V tile load (packed once for all of them: for a decode step, one row
// per head, that is the whole cost). With pack_heads the heads are the segments of one tile
// (few queries each: their columns then fill the vectors the scores are computed in).
template <class E>
void flash_forward_item(const ForwardArgs& a, const Plan& pl, char* ws, int64_t split_item,
                        int worker) {
  const Problem& p = a.problem;
  // Part `split` of the item's keys (key_splits > 1): tiles [split * per, (split + 1) * per).
  const int64_t split = split_item % pl.key_splits, item = split_item / pl.key_splits;
  const int64_t split_tiles = ceil_div(pl.tiles_k, pl.key_splits);
  const int64_t split_lo = split * split_tiles * kBlockK;
  const int64_t split_hi = split_lo + split_tiles * kBlockK;
  const int64_t group = pl.query_group;
  const int64_t heads = pl.head_group;
  const int64_t blocks = ceil_div(pl.tiles_q, group);
  const int64_t head_blocks = p.heads_q / heads;
  const int64_t bh = item / blocks;
  const int64_t b = bh / head_blocks, h0 = (bh % head_blocks) * heads, hk = h0 / p.group_size();
  const Seq seq = seq_of(p, a.variants, b);
  const int64_t first_tile = (blocks - 1 - item % blocks) * group;  // heavy (late) rows first
  const int64_t seq_tiles = ceil_div(seq.len_q, kBlockQ);
  if (first_tile >= seq_tiles) return;  // a shorter sequence of a variable-length batch
  const int head_tiles = static_cast<int>(std::min<int64_t>(group, seq_tiles - first_tile));
  const int segments = pl.pack_heads ? static_cast<int>(heads) : 1;
  const int ntiles = static_cast<int>(heads) * head_tiles / segments;
  const Mask mask(p, seq);
  const int d = static_cast<int>(p.head_dim), dp = static_cast<int>(pl.dp);
  const int dv = static_cast<int>(p.head_dim_v), dvp = static_cast<int>(pl.dvp);
  const Thread t = thread_area(pl, ws, worker);
  // Keys per step: with P V on pairs, pairs_forward_keys; else the copy's own count.
  // The workspace's tiles hold forward_step_keys: kPairsForwardKeys only where
  // pairs_forward_keys may take it (bf16 above kWideStepAboveHeadDim), kNarrowForwardKeys else.
  static_assert(kForwardKeys <= kNarrowForwardKeys, "the workspace's tiles hold a step");
  const int keys = uses_pairs<E>() && kPairsTimesV ? pairs_forward_keys(d) : kForwardKeys;
  float* K = t.at(pl.t_kt);  // [keys][dp]
  float* V = t.at(pl.t_v);   // [keys][dvp]
  float* St = t.at(pl.t_s);  // [keys][kBlockQ]
  uint32_t* p_pairs = reinterpret_cast<uint32_t*>(t.at(pl.t_p_pairs));  // with kPairsTimesV
  const BlockTable& pages = a.variants.block_table;

  QueryTile tiles[kMaxQueryGroup];
  int64_t key_begin = seq.len_k, key_end = 0;
  for (int s = 0; s < ntiles; ++s) {
    QueryTile& q = tiles[s];
    q.segments = segments;
    q.h = h0 + (s / head_tiles) * segments;
    q.i0 = (first_tile + s % head_tiles) * kBlockQ;
    q.seg_rows = static_cast<int>(std::min<int64_t>(kBlockQ, seq.len_q - q.i0));
    q.rows = q.seg_rows * segments;
    q.rows_p = vec_round(q.rows);
    q.lg = logits_of(p, a.variants, seq, b, q.h);
    for (int c = 0; q.lg.alibi && c < q.rows_p; ++c) {  // read by logits_cols with ALiBi only
      const int sg = std::min(c / q.seg_rows, segments - 1);  // padding: the last segment's
      q.slope[c] = a.variants.alibi.at(b, q.h + sg) * kLog2e;
      q.position[c] = static_cast<float>(q.i0 + c % q.seg_rows + q.lg.diag);
    }
    for (int sg = 0; sg < segments; ++sg) {
      q.sink[sg] = sink_of(a.variants, q.h + sg);
      // The last segment's packing zeroes the padding columns.
      const int c0 = sg * q.seg_rows;
      const int pad = sg + 1 == segments ? q.rows_p - c0 : q.seg_rows;
      if constexpr (uses_pairs<E>()) {
        pack_transposed_pairs(reinterpret_cast<uint32_t*>(t.at(pl.t_q) + s * kBlockQ * dp) + c0,
                              kBlockQ, a.q, b, seq.q_begin + q.i0, q.seg_rows, pad, q.h + sg, d);
      } else {
        pack_transposed<E>(t.at(pl.t_q) + s * kBlockQ * dp + c0, kBlockQ, a.q, b,
                           seq.q_begin + q.i0, q.seg_rows, pad, q.h + sg, d, p.scale * kLog2e);
      }
    }
    q.key_begin = mask.key_begin(q.i0);
    q.key_end = mask.key_end(q.i0 + q.seg_rows - 1);
    q.Qt = t.at(pl.t_q) + s * kBlockQ * dp;
    q.O = t.at(pl.t_o) + s * kBlockQ * dvp;
    q.m = t.at(pl.t_m) + s * kBlockQ;
    q.l = t.at(pl.t_l) + s * kBlockQ;
    std::fill(q.O, q.O + static_cast<size_t>(q.rows) * dvp, 0.0f);
    std::fill(q.m, q.m + q.rows_p, kNegInf);
    std::fill(q.l, q.l + q.rows_p, 0.0f);
    if (q.key_begin < q.key_end) {
      key_begin = std::min(key_begin, q.key_begin);
      key_end = std::max(key_end, q.key_end);
    }
  }

  if (pl.key_splits > 1) {
    key_begin = std::max(key_begin, split_lo);
    key_end = std::min(key_end, split_hi);
  }
  for (int64_t j0 = key_begin; j0 < key_end; j0 += keys) {
    const int ncols = static_cast<int>(std::min<int64_t>(keys, key_end - j0));
    using Elem = typename E::T;
    for_kv_rows<E>(a.k, pages, b, seq.k_begin + j0, ncols, hk, [&](int64_t j, const Elem* row) {
      if constexpr (uses_pairs<E>()) {
        pack_row_pairs(reinterpret_cast<uint32_t*>(K) + j * (dp / 2), row, d, dp);
      } else {
        pack_row<E>(K + j * dp, row, d, dp, 1.0f);
      }
    });
    if constexpr (uses_pairs<E>() && kPairsTimesV) {
      pack_value_pairs(reinterpret_cast<uint32_t*>(V), dvp, a.v, b, seq.k_begin + j0, ncols, hk,
                       dv, pages);
    } else {
      for_kv_rows<E>(a.v, pages, b, seq.k_begin + j0, ncols, hk, [&](int64_t j, const Elem* row) {
        pack_row<E>(V + j * dvp, row, dv, dvp, 1.0f);
      });
    }
    if (j0 + keys < key_end) {
      const int64_t next = std::min<int64_t>(keys, key_end - j0 - keys);
      prefetch_rows<E>(a.k, b, seq.k_begin + j0 + keys, next, hk, d, pages);
      prefetch_rows<E>(a.v, b, seq.k_begin + j0 + keys, next, hk, dv, pages);
    }
    for (int s = 0; s < ntiles; ++s) {
      QueryTile& q = tiles[s];
      if (j0 >= q.key_end || j0 + ncols <= q.key_begin) continue;  // no row of it sees these
      const int n = static_cast<int>(std::min<int64_t>(ncols, q.key_end - j0));
      flash_forward_tile(mask, q, K, V, j0, n, d, dp, dvp, St, uses_pairs<E>(), p.scale * kLog2e,
                         p_pairs, keys / 2);
    }
  }

  for (int s = 0; s < ntiles; ++s) {
    const QueryTile& q = tiles[s];
    for (int r = 0; r < q.rows; ++r) {
      const int sg = r / q.seg_rows;
      const int64_t h = q.h + sg;
      const Sink& sink = q.sink[sg];
      const int64_t i = seq.q_begin + q.i0 + r % q.seg_rows;
      if (pl.key_splits > 1) {  // this part's O (normalized by its own sum) and LSE, no sink
        const int64_t row = scratch_row(p, seq, h, q.i0 + r % q.seg_rows);
        const int64_t rows = p.heads_q * p.total_q;
        float* o = shared_at(ws, pl.split_o) + (split * rows + row) * dvp;
        float* lse2 = shared_at(ws, pl.split_lse) + split * rows + row;
        const float inv = q.l[r] == 0.0f ? 0.0f : 1.0f / q.l[r];
        for (int x = 0; x < dv; ++x) o[x] = q.O[r * dvp + x] * inv;
        *lse2 = q.l[r] == 0.0f ? kNegInf : q.m[r] + std::log2(q.l[r]);
        continue;
      }
      // l is 0 only for a row that sees no key: output 0, LSE -inf (a sink notwithstanding).
      if (q.l[r] == 0.0f) {
        std::fill(q.O + r * dvp, q.O + r * dvp + dv, 0.0f);
        store_row<E>(out_row<E>(a.out, b, i, h), q.O + r * dvp, dv, 0.0f);
        if (a.lse.data != nullptr) *lse_at(a.lse, b, h, i) = kNegInf;
        continue;
      }
      const float shift = sink.shift(q.m[r]);
      const float key_scale = sink.present ? std::exp2(q.m[r] - shift) : 1.0f;
      const float total = q.l[r] * key_scale + sink.term(shift);
      store_row<E>(out_row<E>(a.out, b, i, h), q.O + r * dvp, dv, key_scale / total);
      if (a.lse.data != nullptr) *lse_at(a.lse, b, h, i) = natural_lse(shift, total);
    }
  }
}

// ---- Standard forward -----------------------------------------------------------------------
// S = scale * Q K^T for all of [B, Hq, Nq, Nk] in the workspace, then P = softmax(S) in place
// (logits, mask, row maximum, exponentials, sum, normalization), then O = P V.

template <class E>
void pack_kv_item(const Problem& p, const VariantViews& var, const Plan& pl, const Tensor4& src,
                  int d, int dp, float* kt_all, float* rows_all, int64_t item) {
  // item: (b, kv head, key tile). kt_all: [B, Hkv, d, nk_pad]; rows_all: [B, Hkv, Nk, dp].
  // Columns and rows past the sequence's keys are zero.
  const int64_t kt = item % pl.tiles_k, bh = item / pl.tiles_k;
  const int64_t b = bh / p.heads_kv, hk = bh % p.heads_kv;
  const Seq seq = seq_of(p, var, b);
  const int64_t j0 = kt * kBlockK;
  const int ncols = static_cast<int>(Mask::clamp(seq.len_k - j0, kBlockK));
  if (kt_all != nullptr) {
    const int pad = static_cast<int>(std::min<int64_t>(kBlockK, pl.nk_pad - j0));
    if (pad > 0) {
      pack_transposed<E>(kt_all + bh * d * pl.nk_pad + j0, pl.nk_pad, src, b, seq.k_begin + j0,
                         ncols, pad, hk, d, 1.0f, var.block_table);
    }
  }
  if (rows_all != nullptr) {
    for_kv_rows<E>(src, var.block_table, b, seq.k_begin + j0, ncols, hk,
                   [&](int64_t j, const typename E::T* row) {
                     pack_row<E>(rows_all + (bh * p.seqlen_k + j0 + j) * dp, row, d, dp, 1.0f);
                   });
  }
}

template <class E>
void standard_forward_item(const ForwardArgs& a, const Plan& pl, char* ws, int64_t item,
                           int worker) {
  const Problem& p = a.problem;
  const QTileItem it = q_tile_item(p, a.variants, pl, item);
  if (it.rows == 0) return;
  const int64_t b = it.b, h = it.h, bhk = b * p.heads_kv + h / p.group_size();
  const Seq& seq = it.seq;
  const Mask mask(p, seq);
  const Logits lg = logits_of(p, a.variants, seq, b, h);
  const Sink sink = sink_of(a.variants, h);
  const int d = static_cast<int>(p.head_dim), dp = static_cast<int>(pl.dp);
  const int dv = static_cast<int>(p.head_dim_v), dvp = static_cast<int>(pl.dvp);
  const int64_t nkp = pl.nk_pad;
  const int64_t i0 = it.i0;
  const int rows = it.rows;
  const Thread t = thread_area(pl, ws, worker);
  float* Q = t.at(pl.t_q);
  float* O = t.at(pl.t_o);
  const float* Kt = shared_at(ws, pl.kt_all) + bhk * d * nkp;
  const float* V = shared_at(ws, pl.v_all) + bhk * p.seqlen_k * dvp;
  float* S = shared_at(ws, pl.s_all) + scratch_row(p, seq, h, i0) * nkp;

  const float qmul = p.scale * kLog2e;
  for (int r = 0; r < rows; ++r) {
    pack_row<E>(Q + r * dp, in_row<E>(a.q, b, seq.q_begin + i0 + r, h), d, dp, qmul);
  }
  gemm(rows, nkp, d, Q, dp, 1, Kt, nkp, S, nkp, false);
  const Ranges keys = keys_seen(mask, i0, rows, 0, seq.len_k);
  for (int r = 0; r < rows; ++r) {
    float* s = S + r * nkp;
    if (lg.active()) logits_row(s, nkp, lg, i0 + r + lg.diag, -1, nullptr);
    fill_row(s, 0, keys.lo[r], kNegInf);
    fill_row(s, keys.hi[r], nkp, kNegInf);
    const float mx = row_max(s, nkp);
    float lse = kNegInf;
    if (mx == kNegInf) {  // a row that sees no key
      fill_row(s, 0, nkp, 0.0f);
    } else {
      const float shift = sink.shift(mx);
      const float sum = exp_row(s, nkp, Shift{shift, 0.0f, 0.0f}) + sink.term(shift);
      scale_row(s, nkp, 1.0f / sum);
      lse = natural_lse(shift, sum);
    }
    if (a.lse.data != nullptr) *lse_at(a.lse, b, h, seq.q_begin + i0 + r) = lse;
  }
  gemm_ranges(rows, dvp, keys, S, nkp, 1, V, dvp, O, dvp, false);
  for (int r = 0; r < rows; ++r) {
    store_row<E>(out_row<E>(a.out, b, seq.q_begin + i0 + r, h), O + r * dvp, dv, 1.0f);
  }
}

// The largest LSE of a row of parts (the split forward's, flashattn_merge's), NaN when any is NaN (a plain max would skip it).
inline float merge_row_max(const float* lse, int64_t parts, int64_t stride) {
  float m = kNegInf;
  for (int64_t p = 0; p < parts; ++p) {
    const float l = lse[p * stride];
    if (l != l) return l;
    m = l > m ? l : m;
  }
  return m;
}

// The parts of one (sequence, head)'s rows merged: LSE = log2(sum_s 2^LSE_s, plus the sink's
// 2^sink), O = sum_s 2^(LSE_s - LSE) O_s; as the unsplit forward's end, with the part sums
// 2^LSE_s in place of its l * 2^m. A row no part saw (every LSE -inf): 0 / -inf.
template <class E>
void merge_splits_item(const ForwardArgs& a, const Plan& pl, char* ws, int64_t bh) {
  const Problem& p = a.problem;
  const int64_t b = bh / p.heads_q, h = bh % p.heads_q;
  const Seq seq = seq_of(p, a.variants, b);
  const Sink sink = sink_of(a.variants, h);
  const int dv = static_cast<int>(p.head_dim_v), dvp = static_cast<int>(pl.dvp);
  const int64_t rows = p.heads_q * p.total_q;
  const float* parts_o = shared_at(ws, pl.split_o);
  const float* parts_lse = shared_at(ws, pl.split_lse);
  float merged[kMaxHeadDimPadded];
  for (int64_t i = 0; i < seq.len_q; ++i) {
    const int64_t row = scratch_row(p, seq, h, i);
    const int64_t at = seq.q_begin + i;
    // NaN-propagating (merge_impl.hpp): a part spoiled by a NaN spoils the row, as unsplit.
    const float m = merge_row_max(parts_lse + row, pl.key_splits, rows);
    if (m == kNegInf) {
      std::fill(merged, merged + dv, 0.0f);
      store_row<E>(out_row<E>(a.out, b, at, h), merged, dv, 0.0f);
      if (a.lse.data != nullptr) *lse_at(a.lse, b, h, at) = kNegInf;
      continue;
    }
    const float shift = sink.shift(m);
    float total = sink.term(shift);
    std::fill(merged, merged + dv, 0.0f);
    for (int64_t s = 0; s < pl.key_splits; ++s) {
      const float lse_s = parts_lse[s * rows + row];
      if (lse_s == kNegInf) continue;  // a part with no key adds nothing
      const float w = std::exp2(lse_s - shift);
      total += w;
      const float* o = parts_o + (s * rows + row) * dvp;
      for (int x = 0; x < dv; ++x) merged[x] += w * o[x];
    }
    store_row<E>(out_row<E>(a.out, b, at, h), merged, dv, 1.0f / total);
    if (a.lse.data != nullptr) *lse_at(a.lse, b, h, at) = natural_lse(shift, total);
  }
}

template <class E>
void forward_typed(const ForwardArgs& a, const Plan& pl, char* ws, ThreadPool& pool) {
  const Problem& p = a.problem;
  const int64_t q_items = p.batch * p.heads_q * pl.tiles_q;
  if (p.algorithm == Algorithm::Flash) {
    const int64_t items = p.batch * (p.heads_q / pl.head_group) *
                          ceil_div(pl.tiles_q, pl.query_group) * pl.key_splits;
    pool.parallel_for(
        items, [&](int64_t item, int worker) { flash_forward_item<E>(a, pl, ws, item, worker); });
    if (pl.key_splits > 1) {
      pool.parallel_for(p.batch * p.heads_q,
                        [&](int64_t bh, int) { merge_splits_item<E>(a, pl, ws, bh); });
    }
    return;
  }
  float* kt_all = shared_at(ws, pl.kt_all);
  float* v_all = shared_at(ws, pl.v_all);
  const int d = static_cast<int>(p.head_dim), dv = static_cast<int>(p.head_dim_v);
  const int dp = static_cast<int>(pl.dp), dvp = static_cast<int>(pl.dvp);
  pool.parallel_for(p.batch * p.heads_kv * pl.tiles_k, [&](int64_t item, int) {
    pack_kv_item<E>(p, a.variants, pl, a.k, d, dp, kt_all, nullptr, item);
    pack_kv_item<E>(p, a.variants, pl, a.v, dv, dvp, nullptr, v_all, item);
  });
  pool.parallel_for(q_items, [&](int64_t item, int worker) {
    standard_forward_item<E>(a, pl, ws, item, worker);
  });
}

// ---- Backward, shared pieces ----------------------------------------------------------------
// Per row: LSE in log2 units (as hi + lo), and delta = rowsum(dO * O).

template <class E>
void row_stats_item(const BackwardArgs& a, const Plan& pl, char* ws, int64_t item) {
  const Problem& p = a.problem;
  const QTileItem it = q_tile_item(p, a.variants, pl, item);
  const int64_t row0 = scratch_row(p, it.seq, it.h, it.i0);
  float* lse2 = shared_at(ws, pl.lse2) + row0;
  float* lse2_lo = shared_at(ws, pl.lse2_lo) + row0;
  float* delta = shared_at(ws, pl.delta) + row0;
  for (int r = 0; r < it.rows; ++r) {
    const int64_t i = it.seq.q_begin + it.i0 + r;
    const double l2 = static_cast<double>(*lse_at(a.lse, it.b, it.h, i)) * kLog2ed;
    lse2[r] = static_cast<float>(l2);
    lse2_lo[r] = std::isfinite(l2) ? static_cast<float>(l2 - lse2[r]) : 0.0f;
    const typename E::T* o = in_row<E>(a.out, it.b, i, it.h);
    const typename E::T* g = in_row<E>(a.dout, it.b, i, it.h);
    // As the GEMM forms dP = dO V^T: where P is one-hot, dP - delta is then exactly 0.
    float acc = 0.0f;
    for (int k = 0; k < p.head_dim_v; ++k) acc = madd(E::load(g[k]), E::load(o[k]), acc);
    delta[r] = acc;
  }
}

// dsinks[h] = -sum over the batch's rows of e^{sink - LSE} * delta, in double and in row order
// (one pass, after the row statistics: the result depends on nothing but the problem). A row
// that sees no key (LSE -inf) adds nothing.
void sink_gradients(const BackwardArgs& a, const Plan& pl, char* ws) {
  const Problem& p = a.problem;
  const float* lse2 = shared_at(ws, pl.lse2);
  const float* lse2_lo = shared_at(ws, pl.lse2_lo);
  const float* delta = shared_at(ws, pl.delta);
  for (int64_t h = 0; h < p.heads_q; ++h) {
    const double sink2 = static_cast<double>(a.variants.sinks.at(h)) * kLog2ed;
    double sum = 0.0;
    for (int64_t b = 0; b < p.batch; ++b) {
      const Seq seq = seq_of(p, a.variants, b);
      const int64_t row0 = scratch_row(p, seq, h, 0);
      for (int64_t i = 0; i < seq.len_q; ++i) {
        if (lse2[row0 + i] == kNegInf) continue;
        const double l2 = static_cast<double>(lse2[row0 + i]) + lse2_lo[row0 + i];
        sum += std::exp2(sink2 - l2) * static_cast<double>(delta[row0 + i]);
      }
    }
    a.dsinks.data[h * a.dsinks.stride] = static_cast<float>(-sum);
  }
}

// P = exp2(S - lse2) over the visible columns [lo, hi), 0 elsewhere in [0, n).
inline void probs_row(float* s, int64_t lo, int64_t hi, int64_t n, Shift lse2) {
  if (lse2.hi == kNegInf) hi = lo;  // a row that sees no key
  if (hi > lo) {
    const int64_t from = lo / W * W;
    exp_row(s + from, (hi + W - 1) / W * W - from, lse2);  // n is a multiple of W, so <= n
  }
  fill_row(s, 0, lo, 0.0f);
  fill_row(s, hi, n, 0.0f);
}

// dS = P * (dP - delta), in place over dP; times the softcap's derivative where there is one.
inline void ds_row(const float* p, float* dp, const float* dcap, int64_t n, float delta) {
  const vf dv = splat(delta);
  if (dcap == nullptr) {
    for (int64_t j = 0; j < n; j += W) vstore(dp + j, vload(p + j) * (vload(dp + j) - dv));
    return;
  }
  for (int64_t j = 0; j < n; j += W) {
    vstore(dp + j, vload(p + j) * (vload(dp + j) - dv) * vload(dcap + j));
  }
}

// ---- Flash backward -------------------------------------------------------------------------
// One item: (batch, kv head, chunk of key tiles). For each key tile, score tiles are
// recomputed from Q, K and the saved LSE (P = exp2(S - L)), and dK and dV accumulate in
// per-thread tiles over every query tile and every query head of the group (GQA sums there).
// dQ contributions go to this chunk's own partial buffer; a last pass sums the chunks'
// partials in chunk order. Chunks depend on the problem only, so no result depends on the
// thread count or on which thread ran what. (Recomputing dQ in a second pass over query tiles
// would need no partial buffers but two more GEMMs per tile pair: 40% more work.) Only the query
// tiles that see a key tile are visited. Q, Q in log2 units and dO come packed from a first pass
// (flash_pack_q_item): each item reads every query tile once per key tile. The groups run in
// slices (Plan::slice_groups); the packed rows and partial dQ are those of the current slice,
// whose first row is slice_row0.

template <class E>
void flash_backward_item(const BackwardArgs& a, const Plan& pl, char* ws, int64_t item,
                         int worker, int64_t slice_row0) {
  const Problem& p = a.problem;
  const int64_t chunks = pl.key_chunks;
  const int64_t chunk = item % chunks, bhk = item / chunks;
  const int64_t b = bhk / p.heads_kv, hk = bhk % p.heads_kv;
  const int64_t G = p.group_size();
  const Seq seq = seq_of(p, a.variants, b);
  const Mask mask(p, seq);
  const int d = static_cast<int>(p.head_dim), dp = static_cast<int>(pl.dp);
  const int dv = static_cast<int>(p.head_dim_v), dvp = static_cast<int>(pl.dvp);
  const int64_t Nq = seq.len_q;
  const Thread t = thread_area(pl, ws, worker);
  float* Kt = t.at(pl.t_kt);
  float* K = t.at(pl.t_k);
  float* Vt = t.at(pl.t_vt);
  float* dK = t.at(pl.t_dk);
  float* dV = t.at(pl.t_dv);
  const float* q_all = shared_at(ws, pl.q_all);
  const float* qs_all = shared_at(ws, pl.qs_all);
  const float* do_all = shared_at(ws, pl.do_all);
  float* P = t.at(pl.t_s);
  float* dS = t.at(pl.t_dp);
  float* dcap = p.softcap > 0.0f ? t.at(pl.t_dcap) : nullptr;
  // With pairs: K's pairs, then per query tile P^T's, dS^T's and dS's (Plan::t_pairs).
  uint32_t* k_pairs = uses_pairs<E>() ? reinterpret_cast<uint32_t*>(t.at(pl.t_pairs)) : nullptr;
  uint32_t* pairs_area = uses_pairs<E>() ? k_pairs + kBlockK / 2 * dp : nullptr;
  const float* lse2_all = shared_at(ws, pl.lse2);
  const float* lse2_lo_all = shared_at(ws, pl.lse2_lo);
  const float* delta_all = shared_at(ws, pl.delta);
  // This chunk's partial dQ for the group's query heads: [G, Nq, dp], contiguous.
  const int64_t chunk_stride = pl.slice_rows * dp;
  float* dq_part = shared_at(ws, pl.dq_part) + chunk * chunk_stride +
                   (scratch_row(p, seq, hk * G, 0) - slice_row0) * dp;
  std::fill(dq_part, dq_part + G * Nq * dp, 0.0f);

  const int64_t kt_begin = chunk * pl.tiles_k / chunks;
  const int64_t kt_end = std::min((chunk + 1) * pl.tiles_k / chunks, ceil_div(seq.len_k, kBlockK));
  for (int64_t kt = kt_begin; kt < kt_end; ++kt) {
    const int64_t j0 = kt * kBlockK;
    const int ncols = static_cast<int>(std::min<int64_t>(kBlockK, seq.len_k - j0));
    const int ncp = vec_round(ncols);
    if constexpr (uses_pairs<E>()) {
      pack_transposed_pairs(reinterpret_cast<uint32_t*>(Kt), kBlockK, a.k, b, seq.k_begin + j0,
                            ncols, ncp, hk, d);
      pack_transposed_pairs(reinterpret_cast<uint32_t*>(Vt), kBlockK, a.v, b, seq.k_begin + j0,
                            ncols, ncp, hk, dv);
    } else {
      pack_transposed<E>(Kt, kBlockK, a.k, b, seq.k_begin + j0, ncols, ncp, hk, d, 1.0f);
      pack_transposed<E>(Vt, kBlockK, a.v, b, seq.k_begin + j0, ncols, ncp, hk, dv, 1.0f);
    }
    for (int j = 0; j < ncols; ++j)
      pack_row<E>(K + j * dp, in_row<E>(a.k, b, seq.k_begin + j0 + j, hk), d, dp, 1.0f);
    // K as the pairs of dQ = dS K: [(ncols + 1) / 2][dp].
    if constexpr (uses_pairs<E>()) pack_pairs_down(k_pairs, dp, K, dp, ncols, dp);
    std::fill(dK, dK + static_cast<size_t>(ncols) * dp, 0.0f);
    std::fill(dV, dV + static_cast<size_t>(ncols) * dvp, 0.0f);
    // The queries that see some key of the tile.
    const int64_t first_row = mask.row_begin(j0);
    const int64_t end_row = mask.row_end(j0 + ncols - 1);
    for (int64_t g = 0; g < G && first_row < end_row; ++g) {
      const int64_t h = hk * G + g;
      const Logits lg = logits_of(p, a.variants, seq, b, h);
      const int64_t row_base = scratch_row(p, seq, h, 0);
      for (int64_t i0 = first_row / kBlockQ * kBlockQ; i0 < end_row; i0 += kBlockQ) {
        const int rows = static_cast<int>(std::min<int64_t>(kBlockQ, Nq - i0));
        const int64_t packed = row_base - slice_row0 + i0;
        const float* Q = q_all + packed * dp;
        const float* Qs = qs_all + packed * pl.qs_ld;
        const float* dO = do_all + packed * dvp;
        if constexpr (uses_pairs<E>()) {
          const uint32_t* q_pairs = reinterpret_cast<const uint32_t*>(Qs);
          gemm_pairs(rows, ncp, (d + 1) / 2, q_pairs, pl.qs_ld,
                     reinterpret_cast<const uint32_t*>(Kt), kBlockK, P, kBlockK,
                     p.scale * kLog2e);
          gemm_pairs(rows, ncp, (dv + 1) / 2, q_pairs + dp / 2, pl.qs_ld,
                     reinterpret_cast<const uint32_t*>(Vt), kBlockK, dS, kBlockK, 1.0f);
        } else {
          gemm(rows, ncp, d, Qs, pl.qs_ld, 1, Kt, kBlockK, P, kBlockK, false);
          gemm(rows, ncp, dv, dO, dvp, 1, Vt, kBlockK, dS, kBlockK, false);
        }
        const Ranges keys = keys_seen(mask, i0, rows, j0, ncols);
        const Ranges queries = rows_seeing(mask, i0, rows, j0, ncols);
        for (int r = 0; r < rows; ++r) {
          const int64_t row = row_base + i0 + r;
          float* dcap_row = dcap != nullptr ? dcap + r * kBlockK : nullptr;
          if (lg.active()) logits_row(P + r * kBlockK, ncp, lg, i0 + r + lg.diag - j0, -1, dcap_row);
          probs_row(P + r * kBlockK, keys.lo[r], keys.hi[r], ncp,
                    lse_shift(lse2_all[row], lse2_lo_all[row]));
          ds_row(P + r * kBlockK, dS + r * kBlockK, dcap_row, ncp, delta_all[row]);
        }
        float* dq_rows = dq_part + (g * Nq + i0) * dp;
        if constexpr (uses_pairs<E>()) {
          // dV += P^T dO, dK += dS^T Q, dQ += dS K on pairs (P and dS rounded to bf16, as the
          // GPU kernels round them), each row over its own range as in fp32.
          // Q's and dO's pairs down the rows come packed (flash_pack_q_item).
          constexpr int kQueryPairs = kBlockQ / 2, kKeyPairs = kBlockK / 2;
          const uint32_t* q_pairs = reinterpret_cast<const uint32_t*>(Q);    // [rows / 2][dp]
          const uint32_t* do_pairs = reinterpret_cast<const uint32_t*>(dO);  // [rows / 2][dvp]
          uint32_t* pt_pairs = pairs_area;                             // [ncp][kQueryPairs]
          uint32_t* dst_pairs = pt_pairs + kBlockK * kQueryPairs;      // [ncp][kQueryPairs]
          uint32_t* ds_pairs = dst_pairs + kBlockK * kQueryPairs;      // [rows][kKeyPairs]
          pack_pairs_transposed(pt_pairs, kQueryPairs, P, kBlockK, rows, ncp);
          pack_pairs_transposed(dst_pairs, kQueryPairs, dS, kBlockK, rows, ncp);
          pack_pairs_along(ds_pairs, kKeyPairs, dS, kBlockK, rows, ncp);
          gemm_pairs_ranges(ncols, dvp, queries, pt_pairs, kQueryPairs, do_pairs, dvp, dV, dvp);
          gemm_pairs_ranges(ncols, dp, queries, dst_pairs, kQueryPairs, q_pairs, dp, dK, dp);
          gemm_pairs_ranges(rows, dp, keys, ds_pairs, kKeyPairs, k_pairs, dp, dq_rows, dp);
          continue;
        }
        gemm_ranges(ncols, dvp, queries, P, 1, kBlockK, dO, dvp, dV, dvp, true);
        gemm_ranges(ncols, dp, queries, dS, 1, kBlockK, Q, dp, dK, dp, true);
        gemm_ranges(rows, dp, keys, dS, kBlockK, 1, K, dp, dq_rows, dp, true);
      }
    }
    for (int j = 0; j < ncols; ++j) {
      store_row<E>(out_row<E>(a.dk, b, seq.k_begin + j0 + j, hk), dK + j * dp, d, p.scale);
      store_row<E>(out_row<E>(a.dv, b, seq.k_begin + j0 + j, hk), dV + j * dvp, dv, 1.0f);
    }
  }
}

// Q, Q in log2 units and dO of one query tile, packed for flash_backward_item. With pairs: Q's
// and dO's pairs along their rows (the A operands of S and dP) in qs_all, and the pairs down
// the tile's rows (the B operands of dK and dV) where the tile's fp32 rows would lie in q_all
// and do_all ([rows / 2][dp] and [rows / 2][dvp], half of each).
template <class E>
void flash_pack_q_item(const BackwardArgs& a, const Plan& pl, char* ws, int64_t item,
                       int64_t slice_row0) {
  const Problem& p = a.problem;
  const QTileItem it = q_tile_item(p, a.variants, pl, item);
  const int d = static_cast<int>(p.head_dim), dp = static_cast<int>(pl.dp);
  const int dv = static_cast<int>(p.head_dim_v), dvp = static_cast<int>(pl.dvp);
  const int64_t row0 = scratch_row(p, it.seq, it.h, it.i0) - slice_row0;
  float* q = shared_at(ws, pl.q_all) + row0 * dp;
  float* qs = shared_at(ws, pl.qs_all) + row0 * pl.qs_ld;
  float* g = shared_at(ws, pl.do_all) + row0 * dvp;
  const float qmul = p.scale * kLog2e;
  if constexpr (uses_pairs<E>()) {
    const uint16_t* q_rows[kBlockQ];
    const uint16_t* do_rows[kBlockQ];
    for (int r = 0; r < it.rows; ++r) {
      const int64_t i = it.seq.q_begin + it.i0 + r;
      q_rows[r] = in_row<E>(a.q, it.b, i, it.h);
      do_rows[r] = in_row<E>(a.dout, it.b, i, it.h);
      uint32_t* pairs = reinterpret_cast<uint32_t*>(qs + r * pl.qs_ld);
      pack_row_pairs(pairs, q_rows[r], d, dp);
      pack_row_pairs(pairs + dp / 2, do_rows[r], dv, dvp);
    }
    pack_rows_pairs_down(reinterpret_cast<uint32_t*>(q), dp, q_rows, it.rows, d);
    pack_rows_pairs_down(reinterpret_cast<uint32_t*>(g), dvp, do_rows, it.rows, dv);
    return;
  }
  for (int r = 0; r < it.rows; ++r) {
    const int64_t i = it.seq.q_begin + it.i0 + r;
    const typename E::T* q_row = in_row<E>(a.q, it.b, i, it.h);
    const typename E::T* do_row = in_row<E>(a.dout, it.b, i, it.h);
    pack_row<E>(q + r * dp, q_row, d, dp, 1.0f);
    pack_row<E>(qs + r * pl.qs_ld, q_row, d, dp, qmul);
    pack_row<E>(g + r * dvp, do_row, dv, dvp, 1.0f);
  }
}

template <class E>
void flash_dq_item(const BackwardArgs& a, const Plan& pl, char* ws, int64_t item,
                   int64_t slice_row0) {
  const Problem& p = a.problem;
  const QTileItem it = q_tile_item(p, a.variants, pl, item);
  const int d = static_cast<int>(p.head_dim);
  const int64_t dp = pl.dp;
  const int64_t chunk_stride = pl.slice_rows * dp;
  const float* part =
      shared_at(ws, pl.dq_part) + (scratch_row(p, it.seq, it.h, it.i0) - slice_row0) * dp;
  float acc[256];  // head_dim <= 256
  for (int r = 0; r < it.rows; ++r) {
    const float* row = part + r * dp;
    std::copy(row, row + d, acc);
    for (int64_t c = 1; c < pl.key_chunks; ++c) {
      const float* rc = row + c * chunk_stride;
      for (int k = 0; k < d; ++k) acc[k] += rc[k];
    }
    store_row<E>(out_row<E>(a.dq, it.b, it.seq.q_begin + it.i0 + r, it.h), acc, d, p.scale);
  }
}

// ---- Standard backward ----------------------------------------------------------------------
// P and dS for all of [B, Hq, Nq, Nk] in the workspace: P = exp(S - LSE) recomputed from
// Q K^T, dP = dO V^T, dS = P * (dP - delta); then dQ = scale dS K row by row, and
// dK = scale dS^T Q, dV = P^T dO key tile by key tile.

template <class E>
void pack_q_item(const BackwardArgs& a, const Plan& pl, char* ws, int64_t item) {
  const Problem& p = a.problem;
  const QTileItem it = q_tile_item(p, a.variants, pl, item);
  const int d = static_cast<int>(p.head_dim), dp = static_cast<int>(pl.dp);
  const int dv = static_cast<int>(p.head_dim_v), dvp = static_cast<int>(pl.dvp);
  const int64_t row0 = scratch_row(p, it.seq, it.h, it.i0);
  float* q = shared_at(ws, pl.q_all) + row0 * dp;
  float* g = shared_at(ws, pl.do_all) + row0 * dvp;
  for (int r = 0; r < it.rows; ++r) {
    const int64_t i = it.seq.q_begin + it.i0 + r;
    pack_row<E>(q + r * dp, in_row<E>(a.q, it.b, i, it.h), d, dp, 1.0f);
    pack_row<E>(g + r * dvp, in_row<E>(a.dout, it.b, i, it.h), dv, dvp, 1.0f);
  }
}

template <class E>
void standard_dq_item(const BackwardArgs& a, const Plan& pl, char* ws, int64_t item, int worker) {
  const Problem& p = a.problem;
  const QTileItem it = q_tile_item(p, a.variants, pl, item);
  if (it.rows == 0) return;
  const int64_t b = it.b, h = it.h, bhk = b * p.heads_kv + h / p.group_size();
  const Seq& seq = it.seq;
  const Mask mask(p, seq);
  const Logits lg = logits_of(p, a.variants, seq, b, h);
  const int d = static_cast<int>(p.head_dim), dp = static_cast<int>(pl.dp);
  const int dv = static_cast<int>(p.head_dim_v), dvp = static_cast<int>(pl.dvp);
  const int64_t nkp = pl.nk_pad;
  const int64_t i0 = it.i0;
  const int rows = it.rows;
  const int64_t row0 = scratch_row(p, seq, h, i0);
  const float* dO = shared_at(ws, pl.do_all) + row0 * dvp;
  const float* K = shared_at(ws, pl.k_all) + bhk * p.seqlen_k * dp;
  const float* Kt = shared_at(ws, pl.kt_all) + bhk * d * nkp;
  const float* Vt = shared_at(ws, pl.vt_all) + bhk * dv * nkp;
  float* P = shared_at(ws, pl.s_all) + row0 * nkp;
  float* dS = shared_at(ws, pl.ds_all) + row0 * nkp;
  const float* lse2 = shared_at(ws, pl.lse2) + row0;
  const float* lse2_lo = shared_at(ws, pl.lse2_lo) + row0;
  const float* delta = shared_at(ws, pl.delta) + row0;
  const Thread t = thread_area(pl, ws, worker);
  float* Qs = t.at(pl.t_q);
  float* dQ = t.at(pl.t_o);
  float* dcap = p.softcap > 0.0f ? t.at(pl.t_dcap) : nullptr;  // one row

  const float qmul = p.scale * kLog2e;
  for (int r = 0; r < rows; ++r) {
    pack_row<E>(Qs + r * dp, in_row<E>(a.q, b, seq.q_begin + i0 + r, h), d, dp, qmul);
  }
  gemm(rows, nkp, d, Qs, dp, 1, Kt, nkp, P, nkp, false);
  gemm(rows, nkp, dv, dO, dvp, 1, Vt, nkp, dS, nkp, false);
  const Ranges keys = keys_seen(mask, i0, rows, 0, seq.len_k);
  for (int r = 0; r < rows; ++r) {
    if (lg.active()) logits_row(P + r * nkp, nkp, lg, i0 + r + lg.diag, -1, dcap);
    probs_row(P + r * nkp, keys.lo[r], keys.hi[r], nkp, lse_shift(lse2[r], lse2_lo[r]));
    ds_row(P + r * nkp, dS + r * nkp, dcap, nkp, delta[r]);
  }
  gemm_ranges(rows, dp, keys, dS, nkp, 1, K, dp, dQ, dp, false);
  for (int r = 0; r < rows; ++r)
    store_row<E>(out_row<E>(a.dq, b, seq.q_begin + i0 + r, h), dQ + r * dp, d, p.scale);
}

template <class E>
void standard_dkv_item(const BackwardArgs& a, const Plan& pl, char* ws, int64_t item, int worker) {
  const Problem& p = a.problem;
  const int64_t kt = item % pl.tiles_k, bhk = item / pl.tiles_k;
  const int64_t b = bhk / p.heads_kv, hk = bhk % p.heads_kv;
  const int64_t G = p.group_size();
  const Seq seq = seq_of(p, a.variants, b);
  const Mask mask(p, seq);
  const int d = static_cast<int>(p.head_dim), dp = static_cast<int>(pl.dp);
  const int dv = static_cast<int>(p.head_dim_v), dvp = static_cast<int>(pl.dvp);
  const int64_t nkp = pl.nk_pad, Nq = seq.len_q;
  const int64_t j0 = kt * kBlockK;
  if (j0 >= seq.len_k) return;
  const int ncols = static_cast<int>(std::min<int64_t>(kBlockK, seq.len_k - j0));
  const Thread t = thread_area(pl, ws, worker);
  float* dK = t.at(pl.t_dk);
  float* dV = t.at(pl.t_dv);
  const Ranges queries = rows_seeing(mask, 0, Nq, j0, ncols);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t row0 = scratch_row(p, seq, hk * G + g, 0);
    const float* P = shared_at(ws, pl.s_all) + row0 * nkp + j0;
    const float* dS = shared_at(ws, pl.ds_all) + row0 * nkp + j0;
    const float* Q = shared_at(ws, pl.q_all) + row0 * dp;
    const float* dO = shared_at(ws, pl.do_all) + row0 * dvp;
    gemm_ranges(ncols, dvp, queries, P, 1, nkp, dO, dvp, dV, dvp, g > 0);
    gemm_ranges(ncols, dp, queries, dS, 1, nkp, Q, dp, dK, dp, g > 0);
  }
  for (int j = 0; j < ncols; ++j) {
    store_row<E>(out_row<E>(a.dk, b, seq.k_begin + j0 + j, hk), dK + j * dp, d, p.scale);
    store_row<E>(out_row<E>(a.dv, b, seq.k_begin + j0 + j, hk), dV + j * dvp, dv, 1.0f);
  }
}

template <class E>
void backward_typed(const BackwardArgs& a, const Plan& pl, char* ws, ThreadPool& pool) {
  const Problem& p = a.problem;
  const int64_t q_items = p.batch * p.heads_q * pl.tiles_q;
  const int64_t k_items = p.batch * p.heads_kv * pl.tiles_k;
  pool.parallel_for(q_items, [&](int64_t item, int) { row_stats_item<E>(a, pl, ws, item); });
  if (a.dsinks.data != nullptr) sink_gradients(a, pl, ws);
  if (p.algorithm == Algorithm::Flash) {
    // Slice by slice: group g holds the query heads g * G .. g * G + G - 1 of its batch entry,
    // so a slice's query-tile items, key-chunk items and rows are each one contiguous range.
    const int64_t groups = p.batch * p.heads_kv, G = p.group_size();
    const int64_t q_per_group = G * pl.tiles_q;
    for (int64_t g0 = 0; g0 < groups; g0 += pl.slice_groups) {
      const int64_t g1 = std::min(groups, g0 + pl.slice_groups);
      const Seq first = seq_of(p, a.variants, g0 / p.heads_kv);
      const int64_t row0 = scratch_row(p, first, g0 % p.heads_kv * G, 0);
      const int64_t qi0 = g0 * q_per_group, qn = (g1 - g0) * q_per_group;
      pool.parallel_for(qn, [&](int64_t item, int) {
        flash_pack_q_item<E>(a, pl, ws, qi0 + item, row0);
      });
      pool.parallel_for((g1 - g0) * pl.key_chunks, [&](int64_t item, int worker) {
        flash_backward_item<E>(a, pl, ws, g0 * pl.key_chunks + item, worker, row0);
      });
      pool.parallel_for(qn, [&](int64_t item, int) {
        flash_dq_item<E>(a, pl, ws, qi0 + item, row0);
      });
    }
    return;
  }
  float* k_all = shared_at(ws, pl.k_all);
  float* kt_all = shared_at(ws, pl.kt_all);
  float* vt_all = shared_at(ws, pl.vt_all);
  const int d = static_cast<int>(p.head_dim), dv = static_cast<int>(p.head_dim_v);
  const int dp = static_cast<int>(pl.dp), dvp = static_cast<int>(pl.dvp);
  pool.parallel_for(k_items, [&](int64_t item, int) {
    pack_kv_item<E>(p, a.variants, pl, a.k, d, dp, kt_all, k_all, item);
    pack_kv_item<E>(p, a.variants, pl, a.v, dv, dvp, vt_all, nullptr, item);
  });
  pool.parallel_for(q_items, [&](int64_t item, int) { pack_q_item<E>(a, pl, ws, item); });
  pool.parallel_for(
      q_items, [&](int64_t item, int worker) { standard_dq_item<E>(a, pl, ws, item, worker); });
  pool.parallel_for(
      k_items, [&](int64_t item, int worker) { standard_dkv_item<E>(a, pl, ws, item, worker); });
}

void forward(const ForwardArgs& a, const Plan& pl, char* ws, ThreadPool& pool) {
#if FA_AMX
  amx::forget();
#endif
  switch (a.problem.dtype) {
    case DType::F32:
      return forward_typed<F32>(a, pl, ws, pool);
    case DType::F16:
      return forward_typed<F16>(a, pl, ws, pool);
    case DType::BF16:
      return forward_typed<BF16>(a, pl, ws, pool);
  }
}

void backward(const BackwardArgs& a, const Plan& pl, char* ws, ThreadPool& pool) {
#if FA_AMX
  amx::forget();
#endif
  switch (a.problem.dtype) {
    case DType::F32:
      return backward_typed<F32>(a, pl, ws, pool);
    case DType::F16:
      return backward_typed<F16>(a, pl, ws, pool);
    case DType::BF16:
      return backward_typed<BF16>(a, pl, ws, pool);
  }
}

#include "cpu/merge_impl.hpp"

const KernelSet kSet = {FA_ISA_NAME, &forward, &backward, &merge};

}  // namespace
}  // namespace FA_ISA_NS
}  // namespace cpu
}  // namespace flashattn

#if FA_W == 16 && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
