// The public header as a C++17 program sees it (-std=c++17 -pedantic -Werror -Wall -Wextra):
// included twice, its types usable in C++ without casts beyond the enums'.
#include <flashattn/flashattn.h>
#include <flashattn/flashattn.h>

#include <cstdio>
#include <type_traits>

static_assert(std::is_standard_layout<flashattn_tensor_t>::value, "tensor view is plain data");
static_assert(std::is_trivially_copyable<flashattn_options_t>::value, "options are plain data");
static_assert(sizeof(flashattn_status_t) == sizeof(int), "status is an int-sized enum");

int main() {
  const flashattn_options_t defaults = FLASHATTN_OPTIONS_INIT;
  flashattn_options_t o{};
  int failures = 0;
  if (flashattn_options_init(&o) != FLASHATTN_SUCCESS || o.size != defaults.size) ++failures;
  if (flashattn_version_number() != FLASHATTN_VERSION_NUMBER) ++failures;
  flashattn_context_t ctx = nullptr;
  if (flashattn_context_create(&ctx, FLASHATTN_BACKEND_CPU, 0) != FLASHATTN_SUCCESS) ++failures;
  if (flashattn_context_destroy(ctx) != FLASHATTN_SUCCESS) ++failures;
  if (failures != 0) {
    std::fprintf(stderr, "header_cxx: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("header_cxx: ok\n");
  return 0;
}
