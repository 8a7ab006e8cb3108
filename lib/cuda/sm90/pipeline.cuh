// The Hopper primitives of a warp-specialized kernel (PTX ISA: mbarrier, cp.async.bulk.tensor,
// bar, setmaxnreg): shared-memory barriers with transaction counts, tensor-map (TMA) loads and
// stores, named barriers between warpgroups, and the register hand-over between the producer
// and the consumers. Compiled to nothing outside sm_90a device passes.
#pragma once

#include <cstdint>

#include "cuda/common/arch.cuh"
#include "cuda/common/ptx.cuh"

namespace flashattn {
namespace sm90 {

// ---- mbarrier (shared::cta) --------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(uint64_t* bar, int arrivals) {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(common::smem_u32(bar)),
               "r"(arrivals)
               : "memory");
#endif
}
// Makes the initializations visible to the async proxy (the copy engine completes on them).
__device__ __forceinline__ void mbar_fence_init() {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// One arrival that also announces `bytes` still to come from copies completing on the barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   common::smem_u32(bar)),
               "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(common::smem_u32(bar))
               : "memory");
#endif
}
// Waits until the phase of the given parity has completed. Waiting on parity 1 of a barrier
// that was just initialized returns at once: that is how a ring's first pass finds its slots
// free.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#ifdef FLASHATTN_SM90A_DEVICE
  const uint32_t addr = common::smem_u32(bar);
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
#endif
}

// A slot of a ring of `kStages` buffers: its index and the parity of its current use, advanced
// in the same order by the producer and the consumers.
template <int kStages>
struct RingSlot {
  int index = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1;
    }
  }
};

// ---- tensor-map copies ----------------------------------------------------------------------

// Loads the box at coordinates (c0 innermost .. c3) of a 4-D tensor map into shared memory,
// completing `bytes` of the barrier's transaction count. Out-of-bounds elements read as zero.
__device__ __forceinline__ void tma_load_4d(void* smem, const void* tmap, uint64_t* bar, int c0,
                                            int c1, int c2, int c3) {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(common::smem_u32(smem)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(common::smem_u32(bar)), "r"(c0), "r"(c1),
      "r"(c2), "r"(c3)
      : "memory");
#endif
}
// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) of contiguous global memory
// into shared memory, completing them on the barrier's transaction count.
__device__ __forceinline__ void bulk_load(void* smem, const void* gmem, uint32_t bytes,
                                          uint64_t* bar) {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(common::smem_u32(smem)), "l"(gmem), "r"(bytes), "r"(common::smem_u32(bar))
      : "memory");
#endif
}
// Stores a box from shared memory (in this thread's bulk group); out-of-bounds elements are
// not written.
__device__ __forceinline__ void tma_store_4d(const void* tmap, const void* smem, int c0, int c1,
                                             int c2, int c3) {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
      ::"l"(reinterpret_cast<uint64_t>(tmap)), "r"(common::smem_u32(smem)), "r"(c0), "r"(c1),
      "r"(c2), "r"(c3)
      : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit() {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void prefetch_tensor_map(const void* tmap) {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
#endif
}

// ---- named barriers and registers -----------------------------------------------------------

// Barrier 0 is __syncthreads(); the kernels number theirs from kFirstNamedBarrier.
constexpr int kFirstNamedBarrier = 1;

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

// The register budget of the executing warpgroup (a multiple of 8 in [24, 256]).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifdef FLASHATTN_SM90A_DEVICE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

}  // namespace sm90
}  // namespace flashattn
