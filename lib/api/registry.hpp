// What the library has handed out and not taken back: the live context and buffer handles, so
// that a call given a destroyed (or made-up) handle is refused instead of reading freed memory,
// and the address ranges of live buffers, so that a view pointing into one is checked against
// the buffer's end and against the context it belongs to.
#pragma once

#include <cstddef>
#include <cstdint>

struct flashattn_context;
struct flashattn_buffer;

namespace flashattn {

struct ContextState;

struct RegisteredRange {
  uintptr_t begin = 0;
  size_t size = 0;      // the buffer's bytes
  size_t reserved = 0;  // the bytes the library owns from begin: size and a guard after it
  const ContextState* owner = nullptr;
};

// Adding throws std::bad_alloc; removing returns false when the handle was not live.
void registry_add(const flashattn_context* ctx);
bool registry_remove(const flashattn_context* ctx) noexcept;
bool registry_contains(const flashattn_context* ctx);

void registry_add(const flashattn_buffer* buf, const RegisteredRange& range);
bool registry_remove(const flashattn_buffer* buf) noexcept;
bool registry_contains(const flashattn_buffer* buf);

// The live buffer whose reserved bytes hold address p, if any.
bool registry_find(const void* p, RegisteredRange* out);

}  // namespace flashattn
