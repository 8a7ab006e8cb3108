#include "api/buffer_registry.hpp"

#include <map>
#include <mutex>

namespace flashattn {

namespace {
std::mutex g_mutex;
// Allocated with the first live buffer and freed with the last: never destroyed while a buffer
// may still be released (a finalizer late at exit is safe), and nothing is left behind when the
// library is unloaded with dlclose (a process-lifetime map leaked once per load).
std::map<uintptr_t, RegisteredRange>* g_ranges = nullptr;
}  // namespace

void registry_add(const void* data, size_t size, const ContextState* owner) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_ranges == nullptr) g_ranges = new std::map<uintptr_t, RegisteredRange>();
  uintptr_t b = reinterpret_cast<uintptr_t>(data);
  (*g_ranges)[b] = RegisteredRange{b, size, owner};
}

void registry_remove(const void* data) noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_ranges == nullptr) return;
  g_ranges->erase(reinterpret_cast<uintptr_t>(data));
  if (g_ranges->empty()) {
    delete g_ranges;
    g_ranges = nullptr;
  }
}

bool registry_find(const void* p, RegisteredRange* out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_ranges == nullptr) return false;
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto& m = *g_ranges;
  auto it = m.upper_bound(a);
  if (it == m.begin()) return false;
  --it;
  if (a - it->second.begin >= it->second.size) return false;
  *out = it->second;
  return true;
}

}  // namespace flashattn
