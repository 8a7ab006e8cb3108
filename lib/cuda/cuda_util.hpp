// Small helpers shared by the CUDA backend's host code: CUDA errors as flashattn errors, and the
// scopes every entry point runs in.
#pragma once

#include <cuda_runtime.h>

#include "core/error.hpp"

namespace flashattn {
namespace cuda {

// Throws the flashattn error for a failed CUDA call: DEVICE_OUT_OF_MEMORY for an allocation
// failure, DEVICE otherwise, with the error's name and text. Clears the thread's last CUDA error
// first so that a non-sticky failure does not leak into the next call.
[[noreturn]] void fail_cuda(cudaError_t error, const char* what);

inline void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) fail_cuda(error, what);
}

// Makes `device` current for a scope and restores the caller's device afterwards: callers may
// be using other devices on the same thread.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool restore_ = false;
};

// Puts this thread's stream-capture interaction mode to relaxed for a scope. Only used around
// pure queries (pointer attributes, address ranges, a stream's device), which enqueue nothing
// but which CUDA's global capture mode may otherwise count as "potentially unsafe" and thereby
// invalidate a caller's graph capture in progress.
class RelaxedCaptureScope {
 public:
  RelaxedCaptureScope();
  ~RelaxedCaptureScope();
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

 private:
  cudaStreamCaptureMode saved_ = cudaStreamCaptureModeRelaxed;
  bool restore_ = false;
};

}  // namespace cuda
}  // namespace flashattn
