// Placeholder until the kernels land: every flash request answers "unsupported".
#include "cuda/flash/flash.hpp"

namespace flashattn {
namespace cuda {

const char* flash_unsupported_reason(const Problem&, bool, const DeviceInfo&) {
  return "the flash CUDA kernels are not built yet";
}
const char* flash_unsupported_layout(const ForwardArgs&) { return nullptr; }
const char* flash_unsupported_layout(const BackwardArgs&) { return nullptr; }
size_t flash_workspace_size(const Problem&, bool, const DeviceInfo&) { return 0; }
cudaError_t flash_forward(const ForwardArgs&, void*, size_t, const DeviceInfo&, cudaStream_t) {
  return cudaErrorNotSupported;
}
cudaError_t flash_backward(const BackwardArgs&, void*, size_t, const DeviceInfo&, cudaStream_t) {
  return cudaErrorNotSupported;
}

}  // namespace cuda
}  // namespace flashattn
