// The thread-local last-error message and the firewall every extern "C" body runs inside.
#pragma once

#include <exception>
#include <new>

#include "core/error.hpp"

namespace flashattn {

void clear_last_error() noexcept;
// Records "function: message" as this thread's last error and returns status.
flashattn_status_t record_error(flashattn_status_t status, const char* function,
                                const char* message) noexcept;

// Runs body() and turns whatever it throws into a status and a message. No exception crosses.
template <class Body>
flashattn_status_t guarded(const char* function, Body&& body) noexcept {
  clear_last_error();
  try {
    body();
    return FLASHATTN_SUCCESS;
  } catch (const Error& e) {
    return record_error(e.status(), function, e.what());
  } catch (const std::bad_alloc&) {
    return record_error(FLASHATTN_ERROR_OUT_OF_MEMORY, function, "host memory allocation failed");
  } catch (const std::exception& e) {
    return record_error(FLASHATTN_ERROR_INTERNAL, function, e.what());
  } catch (...) {
    return record_error(FLASHATTN_ERROR_INTERNAL, function, "unknown internal exception");
  }
}

}  // namespace flashattn
