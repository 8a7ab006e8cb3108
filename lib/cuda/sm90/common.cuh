// Helpers shared by the Hopper kernels: shared-memory matrix descriptors, wgmma ordering,
// the generic-to-async proxy fence, and quad (row) reductions of the accumulator layout.
#pragma once

#include <cstdint>

#include "cuda/sm90/arch.cuh"

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
// Makes this thread's generic-proxy shared-memory writes (cp.async, st.shared) visible to the
// async proxy that wgmma reads through; a barrier must follow before another thread's wgmma.
__device__ __forceinline__ void fence_proxy_async() {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_min(float x) {
  x = fminf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fminf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace sm90
}  // namespace flashattn
