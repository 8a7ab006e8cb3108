// Helpers shared by the Hopper kernels: shared-memory matrix descriptors, wgmma ordering, the
// K-major GEMM loop, and the staging of dQ rows in the sm90 accumulator layout.
#pragma once

#include <cstdint>

#include "cuda/common/arch.cuh"
#include "cuda/common/dq_layout.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace flashattn {
namespace sm90 {

// Shared-memory matrix descriptor for a 128B-swizzled operand.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr & 0x3ffff) >> 4);
  d |= static_cast<uint64_t>((lbo & 0x3ffff) >> 4) << 16;
  d |= static_cast<uint64_t>((sbo & 0x3ffff) >> 4) << 32;
  d |= static_cast<uint64_t>(1) << 62;  // SWIZZLE_128B
  return d;
}

// The descriptor of the operand `bytes` (a multiple of 16) past desc's. The start address is the
// descriptor's low field, addr >> 4 in 14 bits; the CTA's shared memory ends below 2^18 bytes,
// so an offset inside it never carries out of the field. One add instead of the mask, shift
// and or of smem_desc at every k-step's wgmma (d128 backward: ~5 instructions a wgmma, 32
// wgmmas a step).
__device__ __forceinline__ uint64_t smem_desc_plus(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Pins accumulator registers after a wgmma wait: the compiler may not move their reads above
// it (the wait itself names no registers).
template <int N>
__device__ __forceinline__ void fence_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// The same for the packed 16-bit A operands of register-A wgmmas: they must stay untouched
// until the wgmma that reads them has been waited on.
template <int M>
__device__ __forceinline__ void fence_registers(uint32_t (&r)[M][4]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// acc = A B^T over k = kK for two K-major operands (rows of kK elements in 128B-swizzled tiles
// stored as 64-column blocks, a_block and b_block bytes apart): the shape of S = Q K^T.
template <class T, int N, int kK>
__device__ __forceinline__ void wgmma_ss_k(float (&acc)[N / 2], uint32_t a, uint32_t a_block,
                                           uint32_t b, uint32_t b_block) {
  const uint64_t desc_a = smem_desc(a, 16, 1024), desc_b = smem_desc(b, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    wgmma_ss<T, N>(acc, smem_desc_plus(desc_a, (kk % 4) * 32 + (kk / 4) * a_block),
                   smem_desc_plus(desc_b, (kk % 4) * 32 + (kk / 4) * b_block), kk > 0);
  }
}

// Writes this thread's part of a warp's 16 accumulator rows (m64nN layout: rows g, g + 8 of the
// warp, columns 8 j + 2 t (+1)) into consecutive 64 x 64 tiles of that layout; `rows` is the
// first tile's row 16 warp + g. dq_tile_offset(r, 8 j + 2 t) = 64 r + 8 (j ^ (r % 8)) + 2 t with
// r % 8 == g, so each 16-byte chunk costs one XOR; the rest is immediates.
template <int N>
__device__ __forceinline__ void stage_dq_rows(float* rows, const float (&acc)[N / 2], int g,
                                              int t) {
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    float* dst = rows + (j / 8) * 4096 + (((j % 8) ^ g) << 3) + 2 * t;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      *reinterpret_cast<float2*>(dst + hh * 8 * 64) =
          make_float2(acc[4 * j + 2 * hh], acc[4 * j + 2 * hh + 1]);
    }
  }
}

}  // namespace sm90
}  // namespace flashattn
