// The kernels for AVX-512 with bf16 pair dot products (vdpbf16ps), picked at run time on CPUs
// that issue them at the rate of their fp32 fused multiply-add (kernels_impl.hpp, "bf16 pairs");
// everything but the flash algorithm's bf16 GEMMs is the AVX-512 copy's code.
#if defined(__x86_64__)
#define FA_TARGET "avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,avx2,fma"
#define FA_ISA_GETTER kernels_avx512bf16
#define FA_ISA_NS avx512bf16
#define FA_ISA_NAME "avx512bf16"
#define FA_W 16
#define FA_RMAX 6
#define FA_NVMAX 4
#define FA_FMA 1
#define FA_VFMA(a, b, c) ((vf)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#define FA_VMAX(a, b) ((vf)_mm512_max_ps((__m512)(a), (__m512)(b)))
#define FA_BF16_PAIRS 1
#include "cpu/kernels_copy.inc"
#endif
