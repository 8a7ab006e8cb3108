#include "api/registry.hpp"

#include <pthread.h>

#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace flashattn {

namespace {

struct Registry {
  std::unordered_set<const flashattn_context*> contexts;
  std::unordered_map<const flashattn_buffer*, uintptr_t> buffers;  // handle -> range begin
  std::map<uintptr_t, RegisteredRange> ranges;                      // by begin

  bool empty() const { return contexts.empty() && buffers.empty(); }
};

std::mutex g_mutex;
// Allocated with the first live handle and freed with the last: never destroyed while a handle
// may still be released (a finalizer late at exit is safe), and nothing is left behind when the
// library is unloaded with dlclose (a process-lifetime map leaked once per load).
Registry* g_registry = nullptr;

// Every call takes the lock; a fork() while another thread holds it would leave the child's copy
// locked for good. Holding it across fork() hands both processes an unlocked mutex. (glibc drops
// these handlers when the library is unloaded.)
const int g_fork_handlers = pthread_atfork([] { g_mutex.lock(); }, [] { g_mutex.unlock(); },
                                           [] { g_mutex.unlock(); });

Registry& registry_for_add() {
  if (g_registry == nullptr) g_registry = new Registry();
  return *g_registry;
}

void release_if_empty() noexcept {
  if (g_registry != nullptr && g_registry->empty()) {
    delete g_registry;
    g_registry = nullptr;
  }
}

}  // namespace

void registry_add(const flashattn_context* ctx) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Registry& r = registry_for_add();
  try {
    r.contexts.insert(ctx);
  } catch (...) {
    release_if_empty();
    throw;
  }
}

bool registry_remove(const flashattn_context* ctx) noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_registry == nullptr || g_registry->contexts.erase(ctx) == 0) return false;
  release_if_empty();
  return true;
}

bool registry_contains(const flashattn_context* ctx) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_registry != nullptr && g_registry->contexts.count(ctx) != 0;
}

void registry_add(const flashattn_buffer* buf, const RegisteredRange& range) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Registry& r = registry_for_add();
  try {
    r.ranges[range.begin] = range;
    try {
      r.buffers[buf] = range.begin;
    } catch (...) {
      r.ranges.erase(range.begin);
      throw;
    }
  } catch (...) {
    release_if_empty();
    throw;
  }
}

bool registry_remove(const flashattn_buffer* buf) noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_registry == nullptr) return false;
  auto it = g_registry->buffers.find(buf);
  if (it == g_registry->buffers.end()) return false;
  g_registry->ranges.erase(it->second);
  g_registry->buffers.erase(it);
  release_if_empty();
  return true;
}

bool registry_contains(const flashattn_buffer* buf) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_registry != nullptr && g_registry->buffers.count(buf) != 0;
}

bool registry_find(const void* p, RegisteredRange* out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_registry == nullptr) return false;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const auto& m = g_registry->ranges;
  auto it = m.upper_bound(a);
  if (it == m.begin()) return false;
  --it;
  if (a - it->second.begin >= it->second.reserved) return false;
  *out = it->second;
  return true;
}

}  // namespace flashattn
