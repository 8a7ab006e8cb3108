#include "api/buffer_registry.hpp"

#include <map>
#include <mutex>

namespace flashattn {

namespace {
std::mutex g_mutex;
std::map<uintptr_t, RegisteredRange>& ranges() {
  static auto* m = new std::map<uintptr_t, RegisteredRange>();  // never destroyed: safe at exit
  return *m;
}
}  // namespace

void registry_add(const void* data, size_t size, const ContextState* owner) {
  std::lock_guard<std::mutex> lock(g_mutex);
  uintptr_t b = reinterpret_cast<uintptr_t>(data);
  ranges()[b] = RegisteredRange{b, size, owner};
}

void registry_remove(const void* data) noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  ranges().erase(reinterpret_cast<uintptr_t>(data));
}

bool registry_find(const void* p, RegisteredRange* out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto& m = ranges();
  auto it = m.upper_bound(a);
  if (it == m.begin()) return false;
  --it;
  if (a - it->second.begin >= it->second.size) return false;
  *out = it->second;
  return true;
}

}  // namespace flashattn
