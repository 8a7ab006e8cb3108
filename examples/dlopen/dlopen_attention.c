/* dlopen_attention.c: use libflashattn without linking it, as a runtime or plugin host would.
 *
 *   dlopen_attention /path/to/libflashattn.so.0
 *
 * Opens the library, resolves the functions with dlsym, checks that its major version is the
 * one this program was compiled against, runs a small causal attention on the CPU and checks it
 * against a naive loop. Only the header's types and constants are used at compile time.
 * Build: cc -I<prefix>/include dlopen_attention.c -ldl -lm
 */
#include <flashattn/flashattn.h>

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 1, NQ = 24, NK = 40, HQ = 4, HKV = 2, D = 16 };

/* The functions this program calls, resolved at run time. */
static struct {
  unsigned (*version_number)(void);
  const char *(*version_string)(void);
  const char *(*status_string)(flashattn_status_t);
  const char *(*last_error)(void);
  flashattn_status_t (*context_create)(flashattn_context_t *, flashattn_backend_t, int);
  flashattn_status_t (*context_destroy)(flashattn_context_t);
  flashattn_status_t (*tensor_4d)(flashattn_tensor_t *, void *, flashattn_dtype_t, int64_t,
                                  int64_t, int64_t, int64_t);
  flashattn_status_t (*options_init_sized)(flashattn_options_t *, size_t);
  flashattn_status_t (*forward)(flashattn_context_t, const flashattn_tensor_t *,
                                const flashattn_tensor_t *, const flashattn_tensor_t *,
                                const flashattn_tensor_t *, const flashattn_tensor_t *,
                                const flashattn_options_t *, void *, size_t);
} fa;

static void *resolve(void *lib, const char *name) {
  void *f = dlsym(lib, name);
  if (f == NULL) {
    fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
    exit(1);
  }
  return f;
}

/* Function pointers cannot be assigned from void* in ISO C; POSIX guarantees this copy works. */
#define RESOLVE(field, name)                               \
  do {                                                     \
    void *p_ = resolve(lib, name);                         \
    memcpy(&fa.field, &p_, sizeof p_);                     \
  } while (0)

static void check(flashattn_status_t st, const char *what) {
  if (st != FLASHATTN_SUCCESS) {
    fprintf(stderr, "%s failed: %s (%s)\n", what, fa.status_string(st), fa.last_error());
    exit(1);
  }
}

static float q[B][NQ][HQ][D], k[B][NK][HKV][D], v[B][NK][HKV][D], out[B][NQ][HQ][D];

/* Uniform in [-0.5, 0.5]. */
static float uniform(void) { return (float)((double)rand() / RAND_MAX - 0.5); }

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s /path/to/libflashattn.so.%d\n", argv[0], FLASHATTN_VERSION_MAJOR);
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  RESOLVE(version_number, "flashattn_version_number");
  RESOLVE(version_string, "flashattn_version_string");
  RESOLVE(status_string, "flashattn_status_string");
  RESOLVE(last_error, "flashattn_last_error");
  RESOLVE(context_create, "flashattn_context_create");
  RESOLVE(context_destroy, "flashattn_context_destroy");
  RESOLVE(tensor_4d, "flashattn_tensor_4d");
  RESOLVE(options_init_sized, "flashattn_options_init_sized");
  RESOLVE(forward, "flashattn_forward");

  /* The sqlite habit: refuse a library of another major version than the header's. */
  if (fa.version_number() / 10000 != FLASHATTN_VERSION_MAJOR) {
    fprintf(stderr, "library %s is not of major version %d\n", fa.version_string(),
            FLASHATTN_VERSION_MAJOR);
    return 1;
  }

  srand(7);
  for (int i = 0; i < B * NQ * HQ * D; ++i) (&q[0][0][0][0])[i] = uniform();
  for (int i = 0; i < B * NK * HKV * D; ++i) {
    (&k[0][0][0][0])[i] = uniform();
    (&v[0][0][0][0])[i] = uniform();
  }

  flashattn_context_t ctx;
  flashattn_tensor_t tq, tk, tv, tout;
  flashattn_options_t opts;
  check(fa.context_create(&ctx, FLASHATTN_BACKEND_CPU, 0), "context_create");
  check(fa.tensor_4d(&tq, q, FLASHATTN_DTYPE_FLOAT32, B, NQ, HQ, D), "tensor_4d(q)");
  check(fa.tensor_4d(&tk, k, FLASHATTN_DTYPE_FLOAT32, B, NK, HKV, D), "tensor_4d(k)");
  check(fa.tensor_4d(&tv, v, FLASHATTN_DTYPE_FLOAT32, B, NK, HKV, D), "tensor_4d(v)");
  check(fa.tensor_4d(&tout, out, FLASHATTN_DTYPE_FLOAT32, B, NQ, HQ, D), "tensor_4d(out)");
  /* What the header's flashattn_options_init(&opts) expands to: the size of the struct this
   * program was compiled with, so the library writes no byte past it. */
  check(fa.options_init_sized(&opts, sizeof opts), "options_init_sized");
  opts.causal = 1; /* bottom-right aligned: query i sees keys j <= i + NK - NQ */
  check(fa.forward(ctx, &tq, &tk, &tv, &tout, NULL, &opts, NULL, 0), "forward");
  check(fa.context_destroy(ctx), "context_destroy");

  /* Naive causal grouped-query attention. */
  double worst = 0.0;
  for (int h = 0; h < HQ; ++h) {
    int hk = h / (HQ / HKV);
    for (int i = 0; i < NQ; ++i) {
      double s[NK], m = -INFINITY, l = 0.0;
      int last = i + NK - NQ;
      for (int j = 0; j <= last; ++j) {
        double dot = 0.0;
        for (int x = 0; x < D; ++x) dot += (double)q[0][i][h][x] * k[0][j][hk][x];
        s[j] = dot / sqrt((double)D);
        if (s[j] > m) m = s[j];
      }
      for (int j = 0; j <= last; ++j) l += exp(s[j] - m);
      for (int x = 0; x < D; ++x) {
        double o = 0.0;
        for (int j = 0; j <= last; ++j) o += exp(s[j] - m) / l * v[0][j][hk][x];
        double e = fabs(o - out[0][i][h][x]);
        if (!(e <= worst)) worst = e;
      }
    }
  }
  int ok = worst <= 1e-5;
  printf("dlopen(%s): flashattn %s, causal GQA attention, max |flash - naive| = %.2e: %s\n",
         argv[1], fa.version_string(), worst, ok ? "ok" : "MISMATCH");
  dlclose(lib);
  return ok ? 0 : 1;
}
