/* demo.c: FlashAttention beside standard attention, on the GPU when there is one, else the CPU.
 *
 * Runs one attention problem with FLASHATTN_ALGORITHM_FLASH (tiled, the N x N score matrix never
 * written) and FLASHATTN_ALGORITHM_STANDARD (S and P materialized), prints the time per call,
 * the workspace each needs and the largest difference between their outputs, and exits
 * nonzero when they disagree beyond the tolerance of the dtype.
 *
 *   flashattn_demo [--cpu] [--batch B] [--heads H] [--seqlen N] [--dim D] [--causal]
 *                  [--iters I]
 *
 * Defaults: batch 2, heads 8, head_dim 64, seqlen 2048 fp16 on a GPU, 1024 fp32 on the CPU.
 */
#define _POSIX_C_SOURCE 200809L

#include <flashattn/flashattn.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void check(flashattn_status_t st, const char *what) {
  if (st != FLASHATTN_SUCCESS) {
    fprintf(stderr, "demo: %s failed: %s\n  %s\n", what, flashattn_status_string(st),
            flashattn_last_error());
    exit(1);
  }
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* IEEE binary16 <-> binary32, round to nearest even (inputs here are finite and small). */
static uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, abs = x & 0x7fffffffu;
  if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow to inf */
  if (abs < 0x38800000u) {                                     /* subnormal or zero */
    if (abs < 0x33000000u) return (uint16_t)sign;
    uint32_t e = abs >> 23, m = (abs & 0x7fffffu) | 0x800000u, s = 126 - e;
    uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return (uint16_t)(sign | q);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);
  return (uint16_t)(sign | ((r - (112u << 23)) >> 13));
}

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0) {
    float v = ldexpf((float)m, -24);
    return sign ? -v : v;
  }
  x = e == 0x1f ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112u) << 23) | (m << 13));
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* Standard normal numbers (Box-Muller) from a fixed seed. */
static double randn(void) {
  double u1 = ((double)rand() + 1.0) / ((double)RAND_MAX + 2.0);
  double u2 = ((double)rand() + 1.0) / ((double)RAND_MAX + 2.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

typedef struct {
  flashattn_context_t ctx;
  flashattn_dtype_t dtype;
  size_t elem, count;
} Setup;

/* A buffer of `count` elements filled with random values, or left as is when fill is 0. */
static flashattn_buffer_t make_buffer(const Setup *s, int fill) {
  flashattn_buffer_t buf;
  check(flashattn_buffer_create(&buf, s->ctx, s->count * s->elem), "flashattn_buffer_create");
  if (fill) {
    void *host = malloc(s->count * s->elem);
    if (host == NULL) {
      fprintf(stderr, "demo: out of host memory\n");
      exit(1);
    }
    for (size_t i = 0; i < s->count; ++i) {
      float x = (float)randn();
      if (s->dtype == FLASHATTN_DTYPE_FLOAT32) {
        ((float *)host)[i] = x;
      } else {
        ((uint16_t *)host)[i] = float_to_half(x);
      }
    }
    check(flashattn_buffer_write(buf, 0, host, s->count * s->elem), "flashattn_buffer_write");
    free(host);
  }
  return buf;
}

static float *read_floats(const Setup *s, flashattn_buffer_t buf) {
  float *out = malloc(s->count * sizeof(float));
  void *raw = malloc(s->count * s->elem);
  if (out == NULL || raw == NULL) {
    fprintf(stderr, "demo: out of host memory\n");
    exit(1);
  }
  check(flashattn_buffer_read(buf, 0, raw, s->count * s->elem), "flashattn_buffer_read");
  for (size_t i = 0; i < s->count; ++i) {
    out[i] = s->dtype == FLASHATTN_DTYPE_FLOAT32 ? ((float *)raw)[i]
                                                 : half_to_float(((uint16_t *)raw)[i]);
  }
  free(raw);
  return out;
}

static void *buffer_data(flashattn_buffer_t b) {
  void *p;
  check(flashattn_buffer_data(&p, b), "flashattn_buffer_data");
  return p;
}

static void print_bytes(size_t bytes) {
  if (bytes >= (size_t)1 << 20) {
    printf("%9.1f MiB", (double)bytes / (1 << 20));
  } else if (bytes >= 1024) {
    printf("%9.1f KiB", (double)bytes / 1024);
  } else {
    printf("%11zu B", bytes);
  }
}

static long parse(const char *flag, const char *value) {
  char *end;
  long v = value ? strtol(value, &end, 10) : 0;
  if (value == NULL || *end != '\0' || v < 1) {
    fprintf(stderr, "demo: %s needs a positive integer\n", flag);
    exit(2);
  }
  return v;
}

int main(int argc, char **argv) {
  int force_cpu = 0, causal = 0;
  long batch = 2, heads = 8, seqlen = 0, dim = 64, iters = 0;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--cpu") == 0) {
      force_cpu = 1;
    } else if (strcmp(a, "--causal") == 0) {
      causal = 1;
    } else if (strcmp(a, "--batch") == 0) {
      batch = parse(a, next), ++i;
    } else if (strcmp(a, "--heads") == 0) {
      heads = parse(a, next), ++i;
    } else if (strcmp(a, "--seqlen") == 0) {
      seqlen = parse(a, next), ++i;
    } else if (strcmp(a, "--dim") == 0) {
      dim = parse(a, next), ++i;
    } else if (strcmp(a, "--iters") == 0) {
      iters = parse(a, next), ++i;
    } else {
      fprintf(stderr,
              "usage: %s [--cpu] [--batch B] [--heads H] [--seqlen N] [--dim D] [--causal] "
              "[--iters I]\n",
              argv[0]);
      return 2;
    }
  }

  int devices = 0;
  check(flashattn_cuda_device_count(&devices), "flashattn_cuda_device_count");
  Setup s;
  check(flashattn_context_create(&s.ctx, force_cpu ? FLASHATTN_BACKEND_CPU : FLASHATTN_BACKEND_AUTO,
                                 0),
        "flashattn_context_create");
  flashattn_backend_t backend;
  check(flashattn_context_get_backend(&backend, s.ctx), "flashattn_context_get_backend");
  const int gpu = backend == FLASHATTN_BACKEND_CUDA;

  printf("flashattn %s\n", flashattn_version_string());
  if (gpu) {
    printf("backend: CUDA, device 0 of %d\n", devices);
  } else {
    printf("backend: CPU (%s)\n", force_cpu             ? "asked for with --cpu"
                                  : !flashattn_has_cuda() ? "this build has no CUDA backend"
                                                          : "no CUDA device found");
  }
  if (seqlen == 0) seqlen = gpu ? 2048 : 1024;
  if (iters == 0) iters = gpu ? 20 : 2;
  s.dtype = gpu ? FLASHATTN_DTYPE_FLOAT16 : FLASHATTN_DTYPE_FLOAT32;
  s.elem = gpu ? 2 : 4;
  s.count = (size_t)batch * seqlen * heads * dim;
  const double tolerance = gpu ? 5e-3 : 1e-4;
  printf("problem: batch %ld, heads %ld, seqlen %ld, head_dim %ld, %s%s\n\n", batch, heads,
         seqlen, dim, gpu ? "float16" : "float32", causal ? ", causal" : "");

  srand(2024);
  flashattn_buffer_t bq = make_buffer(&s, 1), bk = make_buffer(&s, 1), bv = make_buffer(&s, 1);
  flashattn_buffer_t bout[2] = {make_buffer(&s, 0), make_buffer(&s, 0)};
  flashattn_tensor_t q, k, v, out[2];
  check(flashattn_tensor_4d(&q, buffer_data(bq), s.dtype, batch, seqlen, heads, dim), "q view");
  check(flashattn_tensor_4d(&k, buffer_data(bk), s.dtype, batch, seqlen, heads, dim), "k view");
  check(flashattn_tensor_4d(&v, buffer_data(bv), s.dtype, batch, seqlen, heads, dim), "v view");
  for (int a = 0; a < 2; ++a) {
    check(flashattn_tensor_4d(&out[a], buffer_data(bout[a]), s.dtype, batch, seqlen, heads, dim),
          "out view");
  }

  /* 4 B H N^2 d multiply-adds counted twice (QK^T and PV), halved by a causal mask. */
  const double flops = 4.0 * batch * heads * (double)seqlen * seqlen * dim * (causal ? 0.5 : 1.0);
  const char *names[2] = {"flash", "standard"};
  const flashattn_algorithm_t algos[2] = {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD};
  /* GFLOP/s on a CPU, TFLOP/s on a GPU: numbers of a readable size either way. */
  const double unit = gpu ? 1e12 : 1e9;
  printf("%-10s %14s %12s %15s\n", "algorithm", "time/call", gpu ? "TFLOP/s" : "GFLOP/s",
         "workspace");
  for (int a = 0; a < 2; ++a) {
    flashattn_options_t o;
    check(flashattn_options_init(&o), "flashattn_options_init");
    o.algorithm = algos[a];
    o.causal = causal;
    flashattn_status_t st = flashattn_supported(s.ctx, &q, &k, &v, &o, 0);
    if (st != FLASHATTN_SUCCESS) {
      printf("%-10s not available here: %s (%s)\n", names[a], flashattn_status_string(st),
             flashattn_last_error());
      return 1;
    }
    size_t ws = 0;
    check(flashattn_workspace_size(&ws, s.ctx, &q, &k, &v, &o, 0), "flashattn_workspace_size");
    /* One call first: it sizes the context's scratch memory, so the timed ones allocate nothing. */
    check(flashattn_forward(s.ctx, &q, &k, &v, &out[a], NULL, &o, NULL, 0), "flashattn_forward");
    check(flashattn_context_synchronize(s.ctx), "flashattn_context_synchronize");
    const double t0 = now_seconds();
    for (long i = 0; i < iters; ++i) {
      check(flashattn_forward(s.ctx, &q, &k, &v, &out[a], NULL, &o, NULL, 0), "flashattn_forward");
    }
    check(flashattn_context_synchronize(s.ctx), "flashattn_context_synchronize");
    const double per_call = (now_seconds() - t0) / (double)iters;
    printf("%-10s %11.3f ms %12.3f ", names[a], per_call * 1e3, flops / per_call / unit);
    print_bytes(ws);
    printf("\n");
  }

  float *flash = read_floats(&s, bout[0]), *standard = read_floats(&s, bout[1]);
  double worst = 0.0, largest = 0.0;
  for (size_t i = 0; i < s.count; ++i) {
    double e = fabs((double)flash[i] - standard[i]);
    if (!(e <= worst)) worst = e; /* a NaN sticks */
    if (fabs(standard[i]) > largest) largest = fabs(standard[i]);
  }
  const int agree = worst <= tolerance;
  printf("\nmax |flash - standard| = %.3g (outputs up to %.3g; tolerance %.0e): %s\n", worst,
         largest, tolerance, agree ? "agree" : "DISAGREE");
  printf("standard attention's scores for one call: %ld x %ld x %ld x %ld floats = ", batch, heads,
         seqlen, seqlen);
  print_bytes((size_t)batch * heads * seqlen * seqlen * 4);
  printf("; flash never writes them.\n");

  free(flash);
  free(standard);
  flashattn_buffer_destroy(bq);
  flashattn_buffer_destroy(bk);
  flashattn_buffer_destroy(bv);
  flashattn_buffer_destroy(bout[0]);
  flashattn_buffer_destroy(bout[1]);
  check(flashattn_context_destroy(s.ctx), "flashattn_context_destroy");
  return agree ? 0 : 1;
}
