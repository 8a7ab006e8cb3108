// The kernels for AMX (Sapphire Rapids and newer Xeons): the flash algorithm's bf16 GEMMs,
// P V included, on AMX tiles (kernels_impl.hpp, "AMX tiles"; amx_tiles.hpp), the ranged
// products' per-row remainders on AVX-512 BF16 pairs; everything else is the AVX-512 copy's
// code. Picked at run time where the CPU has AMX-BF16 and the OS grants this process the tile
// data (cpu_backend.cpp).
#if defined(__x86_64__)
#include "cpu/kernels_prelude.hpp"

#include "cpu/amx_tiles.hpp"

#define FA_TARGET "avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,avx2,fma"
#define FA_ISA_GETTER kernels_amx
#define FA_ISA_NS amxbf16
#define FA_ISA_NAME "amx"
#define FA_W 16
#define FA_RMAX 6
#define FA_NVMAX 4
#define FA_FMA 1
#define FA_VFMA(a, b, c) ((vf)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#define FA_VMAX(a, b) ((vf)_mm512_max_ps((__m512)(a), (__m512)(b)))
#define FA_BF16_PAIRS 1
#define FA_AMX 1
#include "cpu/kernels_copy.inc"
#endif
