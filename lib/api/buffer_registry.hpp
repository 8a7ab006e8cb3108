// The address ranges of live flashattn buffers, so that a view pointing into one is checked
// against the buffer's end and against the context it belongs to.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashattn {

struct ContextState;

struct RegisteredRange {
  uintptr_t begin = 0;
  size_t size = 0;
  const ContextState* owner = nullptr;
};

void registry_add(const void* data, size_t size, const ContextState* owner);
void registry_remove(const void* data) noexcept;
// The live buffer containing address p, if any.
bool registry_find(const void* p, RegisteredRange* out);

}  // namespace flashattn
