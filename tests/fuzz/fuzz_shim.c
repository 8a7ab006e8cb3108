/* The calls that pass an enum by value, made from C as a C caller would: in C any int converts
 * to an enum type, while the C++ harness cannot even load an out-of-range enum value without
 * undefined behaviour (UBSan's enum check would stop the harness, not the library). */
#include <flashattn/flashattn.h>

flashattn_status_t fuzz_context_create(flashattn_context_t *out, int backend, int device) {
  return flashattn_context_create(out, (flashattn_backend_t)backend, device);
}

const char *fuzz_status_string(int status) {
  return flashattn_status_string((flashattn_status_t)status);
}

flashattn_status_t fuzz_tensor_4d(flashattn_tensor_t *out, void *data, int dtype, int64_t batch,
                                  int64_t seqlen, int64_t heads, int64_t head_dim) {
  return flashattn_tensor_4d(out, data, (flashattn_dtype_t)dtype, batch, seqlen, heads, head_dim);
}
