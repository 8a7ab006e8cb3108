// Kernels that write with bulk (TMA) stores — cuBLAS's Hopper GEMMs, the Hopper flash forward's
// output — are not recorded by compute-sanitizer's initcheck, which then reports every later
// read of what they wrote as uninitialized (a program of one cuBLAS GEMM and one reading kernel
// shows it; docs/reliability.md). The NVTX memory API tells the tool that the range is written,
// in stream order. Without a tool attached the call returns at once.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExtMemCudaRt.h>

namespace flashattn {
namespace cuda {

inline void mark_written(void* ptr, size_t bytes, cudaStream_t stream) {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("flashattn");
  nvtxMemVirtualRangeDesc_t range{};
  range.ptr = ptr;
  range.size = bytes;
  nvtxMemMarkInitializedBatch_t desc{};
  desc.extCompatID = NVTX_EXT_COMPATID_MEM;
  desc.structSize = sizeof(desc);
  desc.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  desc.regionDescCount = 1;
  desc.regionDescElementSize = sizeof(range);
  desc.regionDescElements = &range;
  nvtxMemCudaMarkInitialized(domain, stream, 0, &desc);
}

}  // namespace cuda
}  // namespace flashattn
