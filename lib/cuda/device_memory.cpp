#include "cuda/device_memory.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <mutex>

#include "core/error.hpp"
#include "cuda/cuda_util.hpp"

namespace flashattn {
namespace cuda {

namespace {

double gib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

// Driver functions the pointer checks use, from the driver the runtime already opened (no
// -lcuda link). A null one means the driver does not offer it: that check is skipped, never
// guessed.
struct DriverFns {
  PFN_cuMemGetAddressRange_v3020 address_range = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 retain_handle = nullptr;
  PFN_cuMemRelease_v10020 release_handle = nullptr;
};

template <class F>
void entry_point(const char* name, unsigned version, F* out) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &found) ==
          cudaSuccess &&
      found == cudaDriverEntryPointSuccess) {
    *out = reinterpret_cast<F>(p);
  } else {
    (void)cudaGetLastError();
  }
}

const DriverFns& driver() {
  static std::once_flag once;
  static DriverFns fns;
  std::call_once(once, [] {
    entry_point("cuMemGetAddressRange", 12000, &fns.address_range);
    entry_point("cuMemRetainAllocationHandle", 12000, &fns.retain_handle);
    entry_point("cuMemRelease", 12000, &fns.release_handle);
  });
  return fns;
}

// True for memory mapped through the virtual memory management API (cuMemCreate + cuMemMap:
// PyTorch's expandable segments, for one). There one tensor may span several mappings that
// lie back to back, each its own "allocation" to cuMemGetAddressRange.
bool is_vmm_mapping(const DriverFns& d, CUdeviceptr p) {
  if (d.retain_handle == nullptr || d.release_handle == nullptr) return false;
  CUmemGenericAllocationHandle handle = 0;
  if (d.retain_handle(&handle, reinterpret_cast<void*>(static_cast<uintptr_t>(p))) !=
      CUDA_SUCCESS) {
    return false;
  }
  d.release_handle(handle);
  return true;
}

}  // namespace

void* device_allocate(size_t bytes) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaSuccess) return p;
  (void)cudaGetLastError();  // cudaMalloc's failure is not sticky: clear it, the context lives on
  if (e == cudaErrorMemoryAllocation) {
    size_t free_bytes = 0, total_bytes = 0;
    int device = -1;
    (void)cudaGetDevice(&device);
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
    fail(FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY,
         "cannot allocate %zu bytes (%.2f GiB) of device memory on device %d: %.2f GiB of "
         "%.2f GiB free",
         bytes, gib(bytes), device, gib(free_bytes), gib(total_bytes));
  }
  fail_cuda(e, "cudaMalloc");
}

cudaError_t device_free(void* ptr, cudaStream_t stream) noexcept {
  if (ptr == nullptr) return cudaSuccess;
  cudaError_t first = cudaSuccess;
  // The work enqueued on the stream may still read or write the memory. A stream being
  // captured into a graph cannot be waited on (and freeing during a capture is the caller's
  // error anyway); cudaFree itself also waits for the device.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capturing) == cudaSuccess &&
      capturing == cudaStreamCaptureStatusNone) {
    first = cudaStreamSynchronize(stream);
  }
  cudaError_t e = cudaFree(ptr);
  if (first == cudaSuccess) first = e;
  (void)cudaGetLastError();
  return first;
}

void copy_host_to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize after a host-to-device copy");
}

void copy_device_to_host(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize after a device-to-host copy");
}

void check_device_pointer(const void* ptr, size_t bytes, const char* name, int device) {
  RelaxedCaptureScope relaxed;  // pure queries: they must not break a caller's graph capture
  cudaPointerAttributes attr{};
  cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail(FLASHATTN_ERROR_INVALID_MEMORY,
         "%s: %p is not memory CUDA knows (%s); a CUDA context needs device memory of device %d",
         name, ptr, cudaGetErrorString(e), device);
  }
  switch (attr.type) {
    case cudaMemoryTypeUnregistered:
      fail(FLASHATTN_ERROR_INVALID_MEMORY,
           "%s: is host memory; a CUDA context needs device memory (of device %d)", name, device);
    case cudaMemoryTypeHost:
      fail(FLASHATTN_ERROR_INVALID_MEMORY,
           "%s: is pinned host memory; a CUDA context needs device memory (of device %d)", name,
           device);
    case cudaMemoryTypeDevice:
      if (attr.device != device) {
        fail(FLASHATTN_ERROR_INVALID_MEMORY,
             "%s: is memory of device %d; this context is on device %d", name, attr.device,
             device);
      }
      break;
    case cudaMemoryTypeManaged:
      break;  // migrates to whichever device touches it
  }
  const DriverFns& d = driver();
  if (d.address_range == nullptr) return;
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUdeviceptr p = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(ptr));
  if (d.address_range(&base, &size, p) != CUDA_SUCCESS || p < base || p - base > size) return;
  size_t remain = size - static_cast<size_t>(p - base);
  if (bytes > remain && is_vmm_mapping(d, p)) {
    // Follow back-to-back mappings of the same kind; a plain cudaMalloc allocation ends where
    // it ends, even when the next one happens to start right after it.
    CUdeviceptr next = base + size;
    while (remain < bytes) {
      CUdeviceptr b = 0;
      size_t s = 0;
      if (d.address_range(&b, &s, next) != CUDA_SUCCESS || b != next || s == 0 ||
          !is_vmm_mapping(d, next)) {
        break;
      }
      remain += s;
      next = b + s;
    }
  }
  if (bytes > remain) {
    fail(FLASHATTN_ERROR_INVALID_MEMORY,
         "%s: the view spans %zu bytes but only %zu remain in its allocation (of %zu bytes)", name,
         bytes, remain, size);
  }
}

}  // namespace cuda
}  // namespace flashattn
