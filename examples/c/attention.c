/* attention.c: the smallest complete use of libflashattn.
 *
 * Computes softmax(Q K^T / sqrt(d)) V for a small problem on the CPU, checks every output
 * element against a naive loop written here, and prints one line. Build it against an
 * installed library with:
 *
 *   cc attention.c $(pkg-config --cflags --libs flashattn) -lm -o attention
 */
#include <flashattn/flashattn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { B = 2, N = 64, H = 4, D = 32 }; /* batch, sequence length, heads, head dim */

/* Stops the program with the status name and the library's message when a call fails. */
#define CHECK(call)                                                                    \
  do {                                                                                 \
    flashattn_status_t st_ = (call);                                                   \
    if (st_ != FLASHATTN_SUCCESS) {                                                    \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, flashattn_status_string(st_),     \
              flashattn_last_error());                                                 \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

static float q[B][N][H][D], k[B][N][H][D], v[B][N][H][D], out[B][N][H][D];

/* The textbook computation for one output row: scores, softmax, weighted sum of values. */
static double naive_max_error(void) {
  double worst = 0.0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < N; ++i) {
        double s[N], m = -INFINITY, l = 0.0;
        for (int j = 0; j < N; ++j) {
          double dot = 0.0;
          for (int x = 0; x < D; ++x) dot += (double)q[b][i][h][x] * k[b][j][h][x];
          s[j] = dot / sqrt((double)D);
          if (s[j] > m) m = s[j];
        }
        for (int j = 0; j < N; ++j) l += exp(s[j] - m);
        for (int x = 0; x < D; ++x) {
          double o = 0.0;
          for (int j = 0; j < N; ++j) o += exp(s[j] - m) / l * v[b][j][h][x];
          double e = fabs(o - out[b][i][h][x]);
          if (!(e <= worst)) worst = e; /* a NaN sticks */
        }
      }
  return worst;
}

/* Uniform in [-0.5, 0.5]. */
static float uniform(void) { return (float)((double)rand() / RAND_MAX - 0.5); }

int main(void) {
  srand(1);
  for (int i = 0; i < B * N * H * D; ++i) {
    (&q[0][0][0][0])[i] = uniform();
    (&k[0][0][0][0])[i] = uniform();
    (&v[0][0][0][0])[i] = uniform();
  }

  flashattn_context_t ctx;
  CHECK(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CPU, 0));

  flashattn_tensor_t tq, tk, tv, tout; /* [batch, seqlen, heads, head_dim] views */
  CHECK(flashattn_tensor_4d(&tq, q, FLASHATTN_DTYPE_FLOAT32, B, N, H, D));
  CHECK(flashattn_tensor_4d(&tk, k, FLASHATTN_DTYPE_FLOAT32, B, N, H, D));
  CHECK(flashattn_tensor_4d(&tv, v, FLASHATTN_DTYPE_FLOAT32, B, N, H, D));
  CHECK(flashattn_tensor_4d(&tout, out, FLASHATTN_DTYPE_FLOAT32, B, N, H, D));

  flashattn_options_t opts = FLASHATTN_OPTIONS_INIT; /* scale 1/sqrt(D), no mask, flash */
  CHECK(flashattn_forward(ctx, &tq, &tk, &tv, &tout, NULL, &opts, NULL, 0));
  CHECK(flashattn_context_destroy(ctx));

  double err = naive_max_error();
  int ok = err <= 1e-5;
  printf("flashattn %s: attention [%d, %d, %d, %d] on the CPU, max |flash - naive| = %.2e: %s\n",
         flashattn_version_string(), B, N, H, D, err, ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
