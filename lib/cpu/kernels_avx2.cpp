// The kernels for AVX2 + FMA (x86-64-v3), picked at run time when the CPU has them.
#if defined(__x86_64__)
#define FA_TARGET "avx2,fma"
#define FA_ISA_GETTER kernels_avx2
#define FA_ISA_NS avx2
#define FA_ISA_NAME "avx2"
#define FA_W 8
// GEMM block 6 rows x 2 vectors: 12 accumulators, 2 B vectors and a broadcast fill the 16 ymm
// registers, and 64-column tiles split into whole 16-column blocks (4 x 24 left a 16 remainder).
#define FA_RMAX 6
#define FA_NVMAX 2
#define FA_FMA 1
// Flash forward: 128 keys a step, P V's depth twice a tile's: forward 1.5-5 % faster than 64 on
// an AVX2 EPYC Zen 1 (docs/perf/cpu-2026-12-06-zen1.md).
#define FA_FORWARD_KEYS 128
#define FA_VFMA(a, b, c) ((vf)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define FA_VMAX(a, b) ((vf)_mm256_max_ps((__m256)(a), (__m256)(b)))
#include "cpu/kernels_copy.inc"
#endif
