// The kernels for the target's baseline instruction set (SSE2 on x86-64): always usable.
#define FA_ISA_GETTER kernels_generic
#define FA_ISA_NS generic
#define FA_ISA_NAME "generic"
#define FA_W 4
#define FA_RMAX 4
#define FA_NVMAX 2
#define FA_FMA 0
#include "cpu/kernels_copy.inc"
