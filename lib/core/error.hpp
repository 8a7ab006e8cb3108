// The internal error type. Internals throw flashattn::Error; only the C API layer catches it
// and turns it into a status plus the thread-local message.
#pragma once

#include <stdexcept>
#include <string>

#include <flashattn/flashattn.h>

namespace flashattn {

class Error : public std::runtime_error {
 public:
  Error(flashattn_status_t status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  flashattn_status_t status() const noexcept { return status_; }

 private:
  flashattn_status_t status_;
};

// printf-style message formatting for errors: fail(FLASHATTN_ERROR_INVALID_SHAPE, "q: %s", x).
[[noreturn]] void fail(flashattn_status_t status, const char* format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

std::string format(const char* format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

}  // namespace flashattn
