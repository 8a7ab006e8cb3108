#include "cuda/cuda_util.hpp"

namespace flashattn {
namespace cuda {

void fail_cuda(cudaError_t error, const char* what) {
  (void)cudaGetLastError();  // a non-sticky error must not be reported again by the next call
  if (error == cudaErrorMemoryAllocation) {
    fail(FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY, "%s: out of device memory (%s)", what,
         cudaGetErrorName(error));
  }
  fail(FLASHATTN_ERROR_DEVICE, "%s failed: %s (%s)", what, cudaGetErrorName(error),
       cudaGetErrorString(error));
}

DeviceGuard::DeviceGuard(int device) {
  check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    restore_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (restore_) (void)cudaSetDevice(previous_);
}

RelaxedCaptureScope::RelaxedCaptureScope() {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess) {
    saved_ = mode;
    restore_ = true;
  } else {
    (void)cudaGetLastError();
  }
}

RelaxedCaptureScope::~RelaxedCaptureScope() {
  if (restore_) (void)cudaThreadExchangeStreamCaptureMode(&saved_);
}

}  // namespace cuda
}  // namespace flashattn
