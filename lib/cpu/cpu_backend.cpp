// Placeholder until the CPU backend lands.
#include <cstdlib>
#include <cstring>

#include "core/backend.hpp"
#include "core/error.hpp"

namespace flashattn {
namespace {
class CpuBackend final : public Backend {
 public:
  flashattn_backend_t kind() const override { return FLASHATTN_BACKEND_CPU; }
  int device() const override { return -1; }
  void check_supported(const Problem&, bool) const override {
    fail(FLASHATTN_ERROR_UNSUPPORTED, "not yet");
  }
  size_t workspace_size(const Problem&, bool) const override { return 0; }
  void forward(const ForwardArgs&, Workspace) override {}
  void backward(const BackwardArgs&, Workspace) override {}
  void* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!p) fail(FLASHATTN_ERROR_OUT_OF_MEMORY, "could not allocate %zu bytes", bytes);
    return p;
  }
  void deallocate(void* p) noexcept override { std::free(p); }
  void copy_from_host(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
  void copy_to_host(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
  void check_memory(const void*, size_t, const char*) const override {}
  void set_stream(void*) override {}
  void* stream() const override { return nullptr; }
  void synchronize() override {}
  void set_num_threads(int) override {}
};
}  // namespace
std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }
}  // namespace flashattn
