#include "api/last_error.hpp"

#include <cstring>
#include <string>

namespace flashattn {

namespace {
// A fixed buffer per thread: recording an error never allocates, so it cannot itself fail.
constexpr size_t kMaxMessage = 1024;
thread_local char t_message[kMaxMessage] = {0};
}  // namespace

void clear_last_error() noexcept { t_message[0] = '\0'; }

flashattn_status_t record_error(flashattn_status_t status, const char* function,
                                const char* message) noexcept {
  size_t used = 0;
  auto append = [&](const char* s) {
    while (*s != '\0' && used + 1 < kMaxMessage) t_message[used++] = *s++;
  };
  append(function);
  append(": ");
  append(message != nullptr && message[0] != '\0' ? message : "unspecified error");
  t_message[used] = '\0';
  return status;
}

}  // namespace flashattn

extern "C" {

FLASHATTN_API const char* flashattn_last_error(void) { return flashattn::t_message; }

FLASHATTN_API size_t flashattn_last_error_r(char* buf, size_t len) {
  size_t n = std::strlen(flashattn::t_message);
  if (buf != nullptr && len > 0) {
    size_t copy = n < len - 1 ? n : len - 1;
    std::memcpy(buf, flashattn::t_message, copy);
    buf[copy] = '\0';
  }
  return n;
}

}  // extern "C"
