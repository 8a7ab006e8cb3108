/* The public header as a C99 program sees it: compiled with -std=c99 -pedantic -Werror -Wall
 * -Wextra as part of the build, included twice to prove its include guard, then run. */
#include <flashattn/flashattn.h>
#include <flashattn/flashattn.h>

#include <stdio.h>
#include <string.h>

/* Every public type and macro usable from C. */
static const flashattn_options_t kDefaults = FLASHATTN_OPTIONS_INIT;

int main(void) {
  flashattn_options_t o;
  flashattn_tensor_t t;
  flashattn_context_t ctx = NULL;
  flashattn_buffer_t buf = NULL;
  flashattn_status_t st;
  int failures = 0;

  if (flashattn_version_number() != FLASHATTN_VERSION_NUMBER) {
    fprintf(stderr, "library version %u, header %d\n", flashattn_version_number(),
            FLASHATTN_VERSION_NUMBER);
    ++failures;
  }
  if (strcmp(flashattn_version_string(), FLASHATTN_VERSION_STRING) != 0) ++failures;
  if (flashattn_has_cuda() != FLASHATTN_HAS_CUDA) ++failures;

  st = flashattn_options_init(&o);
  if (st != FLASHATTN_SUCCESS || o.size != kDefaults.size || o.causal != kDefaults.causal ||
      o.algorithm != kDefaults.algorithm) {
    ++failures;
  }
  st = flashattn_tensor_4d(&t, NULL, FLASHATTN_DTYPE_FLOAT16, 1, 2, 3, 4);
  if (st != FLASHATTN_SUCCESS || t.rank != 4 || t.strides[0] != 24) ++failures;
  if (FLASHATTN_MAX_RANK != 4) ++failures;

  st = flashattn_context_create(&ctx, FLASHATTN_BACKEND_CPU, 0);
  if (st != FLASHATTN_SUCCESS) ++failures;
  st = flashattn_buffer_create(&buf, ctx, 0);
  if (st != FLASHATTN_ERROR_INVALID_ARGUMENT || buf != NULL || flashattn_last_error()[0] == '\0') {
    ++failures;
  }
  if (strcmp(flashattn_status_string(st), "FLASHATTN_ERROR_INVALID_ARGUMENT") != 0) ++failures;
  flashattn_context_destroy(ctx);

  if (failures != 0) {
    fprintf(stderr, "header_c99: %d check(s) failed\n", failures);
    return 1;
  }
  printf("header_c99: ok (flashattn %s)\n", flashattn_version_string());
  return 0;
}
