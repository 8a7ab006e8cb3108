// The kernels for AVX-512 (x86-64-v4), picked at run time when the CPU has it.
#if defined(__x86_64__)
#define FA_TARGET "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"
#define FA_ISA_GETTER kernels_avx512
#define FA_ISA_NS avx512
#define FA_ISA_NAME "avx512"
#define FA_W 16
#define FA_RMAX 6
#define FA_NVMAX 4
#define FA_FMA 1
#define FA_VFMA(a, b, c) ((vf)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#define FA_VMAX(a, b) ((vf)_mm512_max_ps((__m512)(a), (__m512)(b)))
#include "cpu/kernels_copy.inc"
#endif
