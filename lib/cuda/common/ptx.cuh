// Thin wrappers over the PTX every kernel family uses (PTX ISA): shared-memory addresses,
// cp.async, ldmatrix, 16-bit packing, the quad reductions of the accumulator layouts, exp2, and
// (in sm_90a device passes) the bulk copies and the generic-to-async proxy fence.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/arch.cuh"

namespace flashattn {
namespace common {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that reads src_bytes (0..16) and zero-fills the rest.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                            uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                                  uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// Two floats -> one register of two 16-bit values, lo in the low half.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t v);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
  __half2 h = *reinterpret_cast<__half2*>(&v);
  return __half22float2(h);
}

// Reductions over the 4 lanes (t = 0..3) that hold one row of an m16n8 accumulator fragment.
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

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Makes this thread's generic-proxy shared-memory writes (cp.async, st.shared) visible to the
// async proxy that wgmma and the bulk copies read through; a barrier must follow before another
// thread's wgmma or copy.
__device__ __forceinline__ void fence_proxy_async() {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Bulk reduce-add of `bytes` (a multiple of 16) of fp32 from shared to global memory, in this
// thread's bulk group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const float* smem, int bytes) {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(gmem),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem))), "r"(bytes)
      : "memory");
#endif
}
// Waits until this thread's bulk operations have read their shared memory.
__device__ __forceinline__ void bulk_wait_read() {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
// Waits until this thread's bulk operations are complete (their writes performed).
__device__ __forceinline__ void bulk_wait_all() {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

// An upper bound on the SMs of the device (%nsmid: SM identifiers may have gaps).
__device__ __forceinline__ int sm_id_count() {
  int n;
  asm("mov.u32 %0, %%nsmid;\n" : "=r"(n));
  return n;
}

// A load of an int in global memory that other CTAs write, ordered before this thread's later
// accesses (acquire, GPU scope): for polling a semaphore.
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// The same load, relaxed: its value is current at GPU scope, but it orders nothing, so it can be
// issued early and its latency hidden (see common::WarpDqTurn for when that is enough).
__device__ __forceinline__ int ld_relaxed_gpu(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// *p += v at GPU scope, after this thread's earlier writes (release); nothing comes back, so the
// thread does not wait for it.
__device__ __forceinline__ void red_release_gpu_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// Programmatic dependent launch (sm_90 on; no-ops before, where the launch attribute is not
// set): a grid lets the next kernel of its stream start launching (its CTAs then run up to
// wait_for_prior_grid) ...
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// ... which waits until the grid before it has completed and its writes are visible.
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace common
}  // namespace flashattn
