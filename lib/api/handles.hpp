// What the opaque C handles are. A context and its buffers share one ContextState, so that
// contexts and buffers can be destroyed in any order (finalizers in Go and Python run in none).
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>

#include "core/backend.hpp"

namespace flashattn {

struct ContextState {
  std::unique_ptr<Backend> backend;
  std::atomic<bool> busy{false};

  // The context's own scratch memory: grown when a call needs more, kept for the next call.
  std::mutex scratch_mutex;
  void* scratch = nullptr;
  size_t scratch_size = 0;

  Workspace scratch_of_size(size_t bytes);  // grows (reallocates) if needed
  void release_scratch() noexcept;
  ~ContextState();
};

// Marks the state in use for one API call; a second thread gets CONTEXT_BUSY instead of a race.
class ContextUse {
 public:
  explicit ContextUse(ContextState& state);
  ~ContextUse();
  ContextUse(const ContextUse&) = delete;
  ContextUse& operator=(const ContextUse&) = delete;

 private:
  ContextState& state_;
};

}  // namespace flashattn

struct flashattn_context {
  std::shared_ptr<flashattn::ContextState> state;
};

struct flashattn_buffer {
  std::shared_ptr<flashattn::ContextState> state;
  void* data = nullptr;
  size_t size = 0;
};
