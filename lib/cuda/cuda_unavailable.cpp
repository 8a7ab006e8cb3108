// The CUDA entry points of a CPU-only build: the backend exists in the API, never on this build.
#include "core/backend.hpp"
#include "core/error.hpp"

namespace flashattn {

std::unique_ptr<Backend> make_cuda_backend(int) {
  fail(FLASHATTN_ERROR_BACKEND_UNAVAILABLE,
       "this libflashattn was built without CUDA (no toolkit found at configure time)");
}

int cuda_device_count() noexcept { return 0; }

}  // namespace flashattn
