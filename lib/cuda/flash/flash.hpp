// The flash kernels' entry points, as the CUDA backend sees them. Kernels know nothing of
// contexts or error strings: they report "unsupported" through a static reason and launch
// failures through cudaError_t.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "core/problem.hpp"

namespace flashattn {
namespace cuda {

struct DeviceInfo {
  int ordinal = 0;
  int sm_major = 0;
  int sm_minor = 0;
  int sm_count = 0;
  size_t smem_per_block_optin = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
  size_t l2_bytes = 0;
};

// nullptr when the flash kernels can run p on dev, else a static sentence saying why not.
const char* flash_unsupported_reason(const Problem& p, bool backward, const DeviceInfo& dev);

// Layout requirements that only the call's views can answer: a KV cache's rows must be
// 16-byte aligned (other views are copied to aligned rows); nullptr when met, else a static
// sentence saying what is required.
const char* flash_unsupported_layout(const ForwardArgs& a);

// Device scratch bytes the flash forward/backward need for p (0: none), the copies of the views
// p.unaligned_rows names included; and for a call's own views (its data pointers and outputs,
// which a query may not have been shown).
size_t flash_workspace_size(const Problem& p, bool backward, const DeviceInfo& dev);
size_t flash_call_workspace_size(const ForwardArgs& a, const DeviceInfo& dev);
size_t flash_call_workspace_size(const BackwardArgs& a, const DeviceInfo& dev);

// Enqueue on `stream`. No allocation, no synchronization. The workspace is at least
// flash_workspace_size bytes of device memory.
cudaError_t flash_forward(const ForwardArgs& a, void* workspace, size_t workspace_size,
                          const DeviceInfo& dev, cudaStream_t stream);
cudaError_t flash_backward(const BackwardArgs& a, void* workspace, size_t workspace_size,
                           const DeviceInfo& dev, cudaStream_t stream);

}  // namespace cuda
}  // namespace flashattn
