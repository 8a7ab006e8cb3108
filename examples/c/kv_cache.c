/* kv_cache.c: generation steps against a paged KV cache.
 *
 * Two sequences share one pool of pages (16 tokens each, handed out in no particular order by
 * a block table). A prompt of PROMPT tokens is written into the cache and attended in one call
 * (k_new / v_new appended, causal), then each of STEPS decode steps appends one token and
 * attends with one query. The caller owns the cache and its lengths: after each call it adds
 * the rows it appended to cache_seqlens. The last step's output is checked against a naive
 * loop over every token written. Build it against an installed library with:
 *
 *   cc kv_cache.c $(pkg-config --cflags --libs flashattn) -lm -o kv_cache
 */
#include <flashattn/flashattn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum {
  B = 2,             /* sequences */
  HQ = 8, HKV = 2,   /* query heads, KV heads (GQA groups of 4) */
  D = 32,            /* head dim */
  PAGE = 16,         /* tokens per page */
  PAGES_PER_SEQ = 4, /* the block table's columns: a capacity of 64 tokens per sequence */
  PROMPT = 20,       /* tokens of each prompt */
  STEPS = 10,        /* decode steps after it */
  TOKENS = PROMPT + STEPS
};

#define CHECK(call)                                                                    \
  do {                                                                                 \
    flashattn_status_t st_ = (call);                                                   \
    if (st_ != FLASHATTN_SUCCESS) {                                                    \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, flashattn_status_string(st_),     \
              flashattn_last_error());                                                 \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

/* The cache: a pool of pages for both sequences; the block table gives sequence b its pages
 * (here in reverse order, to show that any order works). */
static float k_pages[B * PAGES_PER_SEQ][PAGE][HKV][D], v_pages[B * PAGES_PER_SEQ][PAGE][HKV][D];
static int32_t block_table[B][PAGES_PER_SEQ];
static int32_t cache_seqlens[B];

/* Every token's K and V as generated, for the check; the queries of the last step. */
static float k_all[B][TOKENS][HKV][D], v_all[B][TOKENS][HKV][D];
static float q[B][PROMPT][HQ][D], out[B][PROMPT][HQ][D];

static float value(int b, int t, int h, int x, int which) {
  return (float)sin(0.37 * (b + 1) + 0.11 * t + 0.7 * h + 0.05 * x + which);
}

/* Attention of sequence b's last query (head h) over its `tokens` keys, the textbook way. */
static double naive_error(int b, int tokens) {
  double worst = 0.0;
  for (int h = 0; h < HQ; ++h) {
    const int g = h / (HQ / HKV);
    double s[TOKENS], m = -INFINITY, l = 0.0;
    for (int j = 0; j < tokens; ++j) {
      double dot = 0.0;
      for (int x = 0; x < D; ++x) dot += (double)q[b][0][h][x] * k_all[b][j][g][x];
      s[j] = dot / sqrt((double)D);
      if (s[j] > m) m = s[j];
    }
    for (int j = 0; j < tokens; ++j) l += exp(s[j] - m);
    for (int x = 0; x < D; ++x) {
      double o = 0.0;
      for (int j = 0; j < tokens; ++j) o += exp(s[j] - m) / l * v_all[b][j][g][x];
      const double e = fabs(o - out[b][0][h][x]);
      if (e > worst) worst = e;
    }
  }
  return worst;
}

static void view(flashattn_tensor_t *t, void *data, flashattn_dtype_t dtype, int rank,
                 const int64_t *shape) {
  int64_t stride = 1;
  t->data = data;
  t->dtype = dtype;
  t->rank = rank;
  for (int i = rank - 1; i >= 0; --i) {
    t->shape[i] = shape[i];
    t->strides[i] = stride;
    stride *= shape[i];
  }
}

/* One call: q's `n` tokens per sequence against the cache, appending k_new / v_new (n rows). */
static void step(flashattn_context_t ctx, int n, float *k_new, float *v_new) {
  const int64_t q_shape[] = {B, n, HQ, D}, new_shape[] = {B, n, HKV, D};
  const int64_t page_shape[] = {B * PAGES_PER_SEQ, PAGE, HKV, D};
  const int64_t lens_shape[] = {B}, table_shape[] = {B, PAGES_PER_SEQ};
  flashattn_tensor_t tq, tout, tk, tv, tkn, tvn, tlens, ttable;
  view(&tq, q, FLASHATTN_DTYPE_FLOAT32, 4, q_shape);
  view(&tout, out, FLASHATTN_DTYPE_FLOAT32, 4, q_shape);
  view(&tk, k_pages, FLASHATTN_DTYPE_FLOAT32, 4, page_shape);
  view(&tv, v_pages, FLASHATTN_DTYPE_FLOAT32, 4, page_shape);
  view(&tkn, k_new, FLASHATTN_DTYPE_FLOAT32, 4, new_shape);
  view(&tvn, v_new, FLASHATTN_DTYPE_FLOAT32, 4, new_shape);
  view(&tlens, cache_seqlens, FLASHATTN_DTYPE_INT32, 1, lens_shape);
  view(&ttable, block_table, FLASHATTN_DTYPE_INT32, 2, table_shape);
  /* q and out are [B, PROMPT, HQ, D] arrays; a step of n tokens uses their first n rows. */
  tq.strides[0] = tout.strides[0] = (int64_t)PROMPT * HQ * D;

  flashattn_options_t opts = FLASHATTN_OPTIONS_INIT;
  opts.causal = 1; /* aligned at the end: query i sees the keys up to its own position */
  flashattn_args_t args = FLASHATTN_ARGS_INIT;
  args.options = &opts;
  args.q = &tq;
  args.k = &tk;
  args.v = &tv;
  args.out = &tout;
  args.cache_seqlens = &tlens;
  args.block_table = &ttable;
  args.k_new = &tkn;
  args.v_new = &tvn;
  CHECK(flashattn_forward_ex(ctx, &args, NULL, 0));
  for (int b = 0; b < B; ++b) cache_seqlens[b] += n; /* the caller keeps the lengths */
}

int main(void) {
  static float k_new[B][PROMPT][HKV][D], v_new[B][PROMPT][HKV][D];
  static float k_one[B][1][HKV][D], v_one[B][1][HKV][D];
  for (int b = 0; b < B; ++b)
    for (int p = 0; p < PAGES_PER_SEQ; ++p) block_table[b][p] = (B - b) * PAGES_PER_SEQ - 1 - p;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < TOKENS; ++t)
      for (int h = 0; h < HKV; ++h)
        for (int x = 0; x < D; ++x) {
          k_all[b][t][h][x] = value(b, t, h, x, 0);
          v_all[b][t][h][x] = value(b, t, h, x, 1);
        }

  flashattn_context_t ctx;
  CHECK(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CPU, 0));

  /* The prompt: PROMPT tokens appended and attended, causal among themselves. */
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < PROMPT; ++t) {
      for (int h = 0; h < HKV; ++h)
        for (int x = 0; x < D; ++x) {
          k_new[b][t][h][x] = k_all[b][t][h][x];
          v_new[b][t][h][x] = v_all[b][t][h][x];
        }
      for (int h = 0; h < HQ; ++h)
        for (int x = 0; x < D; ++x) q[b][t][h][x] = value(b, t, h, x, 2);
    }
  step(ctx, PROMPT, &k_new[0][0][0][0], &v_new[0][0][0][0]);

  /* Decode: one token per step, its K and V appended, its query attending over everything. */
  for (int s = 0; s < STEPS; ++s) {
    const int t = PROMPT + s;
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < HKV; ++h)
        for (int x = 0; x < D; ++x) {
          k_one[b][0][h][x] = k_all[b][t][h][x];
          v_one[b][0][h][x] = v_all[b][t][h][x];
        }
      for (int h = 0; h < HQ; ++h)
        for (int x = 0; x < D; ++x) q[b][0][h][x] = value(b, t, h, x, 2);
    }
    step(ctx, 1, &k_one[0][0][0][0], &v_one[0][0][0][0]);
  }
  CHECK(flashattn_context_destroy(ctx));

  double worst = 0.0;
  for (int b = 0; b < B; ++b) {
    const double e = naive_error(b, TOKENS);
    if (e > worst) worst = e;
  }
  printf("kv_cache: %d sequences, %d prompt tokens then %d decode steps in pages of %d: "
         "max |error| of the last step %.2e\n", B, PROMPT, STEPS, PAGE, worst);
  return worst < 1e-4 ? 0 : 1;
}
