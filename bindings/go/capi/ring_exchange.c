// The C side of a Go exchange function for context parallelism: the library calls this
// trampoline (a flashattn_cp_exchange_fn); it calls the exported Go function, which finds the Go
// function through the cgo.Handle in user.
#include <stddef.h>

#include "_cgo_export.h"

int flashattn_go_exchange(void *user, const void *send, void *recv, size_t bytes) {
  return flashattnGoExchange(user, (void *)send, recv, bytes);
}
