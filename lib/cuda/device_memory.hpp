// Device memory of one CUDA device: allocation, copies, and the checks that tell a host pointer,
// another device's memory or a view running past its allocation from usable device memory.
// Callers hold a DeviceGuard for the device.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace flashattn {
namespace cuda {

// cudaMalloc (256-byte aligned). Throws DEVICE_OUT_OF_MEMORY naming the bytes, with CUDA's
// error state cleared so that the context stays usable; DEVICE for other failures.
void* device_allocate(size_t bytes);

// cudaFree after the work enqueued on `stream` has finished. Never throws; returns the first
// CUDA error met (an earlier asynchronous error shows up here).
cudaError_t device_free(void* ptr, cudaStream_t stream) noexcept;

// Synchronous copies ordered after the work on `stream`. Throw DEVICE.
void copy_host_to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream);
void copy_device_to_host(void* dst, const void* src, size_t bytes, cudaStream_t stream);

// Throws INVALID_MEMORY when [ptr, ptr + bytes) is not device memory of `device` (or managed
// memory) lying inside one allocation. `name` names the argument in the message.
void check_device_pointer(const void* ptr, size_t bytes, const char* name, int device);

}  // namespace cuda
}  // namespace flashattn
