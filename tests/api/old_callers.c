/* Callers compiled against another header than this library's: a program built against the
 * first header (its flashattn_options_t has five fields and it calls the exported
 * flashattn_options_init symbol), and one built against a newer header (structs larger than the
 * library's, filled through the _sized functions). Each struct is followed by guard bytes that
 * no initializer may touch. Built as C99 with -pedantic -Werror; exits 0 when every check holds. */
#include <flashattn/flashattn.h>

#include <stdio.h>
#include <string.h>

/* ---- the first header, as its callers saw it -------------------------------------------- */

/* flashattn_options_t of the first header. */
struct options_v1 {
  size_t size;
  float softmax_scale;
  int32_t causal;
  flashattn_algorithm_t algorithm;
  int32_t deterministic;
};

/* flashattn_args_t as its first header had it, before the KV cache's fields. */
struct args_v1 {
  size_t size;
  const flashattn_options_t *options;
  const flashattn_tensor_t *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
  const flashattn_tensor_t *alibi_slopes, *sinks, *dsinks, *cu_seqlens_q, *cu_seqlens_k;
  int64_t max_seqlen_q, max_seqlen_k;
};

/* The first header declared a function where this one has a macro. */
#undef flashattn_options_init
flashattn_status_t flashattn_options_init(struct options_v1 *out);

/* ---- checks ------------------------------------------------------------------------------- */

#define GUARD_BYTES 64
#define GUARD_VALUE 0xA5 /* nonzero: read as fields it would be refused */

static int failures = 0;

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);       \
      ++failures;                                                                    \
    }                                                                                \
  } while (0)

#define CHECK_OK(call)                                                                   \
  do {                                                                                   \
    flashattn_status_t st_ = (call);                                                     \
    if (st_ != FLASHATTN_SUCCESS) {                                                      \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,                  \
              flashattn_status_string(st_), flashattn_last_error());                     \
      ++failures;                                                                        \
    }                                                                                    \
  } while (0)

static int guard_intact(const unsigned char *guard) {
  int i;
  for (i = 0; i < GUARD_BYTES; ++i) {
    if (guard[i] != GUARD_VALUE) return 0;
  }
  return 1;
}

static int all_zero(const unsigned char *bytes, size_t n) {
  size_t i;
  for (i = 0; i < n; ++i) {
    if (bytes[i] != 0) return 0;
  }
  return 1;
}

/* ---- one small float32 problem on a CPU context ------------------------------------------- */

enum { kSeq = 5, kHeads = 2, kDim = 8, kElems = kSeq * kHeads * kDim };

struct problem {
  flashattn_context_t ctx;
  float q[kElems], k[kElems], v[kElems];
  flashattn_tensor_t tq, tk, tv;
};

static void problem_init(struct problem *p) {
  int i;
  memset(p, 0, sizeof *p);
  for (i = 0; i < kElems; ++i) {
    p->q[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
    p->k[i] = (float)((i * 5) % 13) / 13.0f - 0.5f;
    p->v[i] = (float)((i * 3) % 17) / 17.0f - 0.5f;
  }
  CHECK_OK(flashattn_context_create(&p->ctx, FLASHATTN_BACKEND_CPU, 0));
  CHECK_OK(flashattn_tensor_4d(&p->tq, p->q, FLASHATTN_DTYPE_FLOAT32, 1, kSeq, kHeads, kDim));
  CHECK_OK(flashattn_tensor_4d(&p->tk, p->k, FLASHATTN_DTYPE_FLOAT32, 1, kSeq, kHeads, kDim));
  CHECK_OK(flashattn_tensor_4d(&p->tv, p->v, FLASHATTN_DTYPE_FLOAT32, 1, kSeq, kHeads, kDim));
}

/* out = attention with `options`; the status of the forward. */
static flashattn_status_t problem_forward(struct problem *p, const flashattn_options_t *options,
                                          float *out) {
  flashattn_tensor_t tout;
  flashattn_status_t st = flashattn_tensor_4d(&tout, out, FLASHATTN_DTYPE_FLOAT32, 1, kSeq,
                                              kHeads, kDim);
  if (st != FLASHATTN_SUCCESS) return st;
  return flashattn_forward(p->ctx, &p->tq, &p->tk, &p->tv, &tout, NULL, options, NULL, 0);
}

/* The same options as this header's struct, the reference for what a forward should give. */
static void current_options(flashattn_options_t *o, float scale, int causal) {
  CHECK_OK(flashattn_options_init_sized(o, sizeof *o));
  o->softmax_scale = scale;
  o->causal = causal;
}

/* ---- a program built against the first header --------------------------------------------- */

static void first_header_caller(struct problem *p) {
  struct {
    struct options_v1 options;
    unsigned char guard[GUARD_BYTES];
  } frame;
  flashattn_options_t current;
  float out[kElems], expected[kElems];
  int h, d;

  memset(&frame, GUARD_VALUE, sizeof frame);
  CHECK_OK(flashattn_options_init(&frame.options));
  CHECK(guard_intact(frame.guard));
  CHECK(frame.options.size == sizeof(struct options_v1));
  CHECK(frame.options.softmax_scale == 0.0f);
  CHECK(frame.options.causal == 0);
  CHECK(frame.options.algorithm == FLASHATTN_ALGORITHM_FLASH);
  CHECK(frame.options.deterministic == 0);

  /* Its options reach the library as the fields it set, and nothing past them is read. */
  frame.options.softmax_scale = 0.5f;
  frame.options.causal = 1;
  CHECK_OK(problem_forward(p, (const flashattn_options_t *)&frame.options, out));
  current_options(&current, 0.5f, 1);
  CHECK_OK(problem_forward(p, &current, expected));
  CHECK(memcmp(out, expected, sizeof out) == 0);
  /* Causal with seqlen_q == seqlen_k: query 0 sees key 0 alone, so its output is v's row 0. */
  for (h = 0; h < kHeads; ++h) {
    for (d = 0; d < kDim; ++d) CHECK(out[h * kDim + d] == p->v[h * kDim + d]);
  }
  CHECK(guard_intact(frame.guard));

  CHECK(flashattn_options_init(NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(flashattn_last_error(), "flashattn_options_init: out is NULL") == 0);
}

/* ---- a program built against a newer header ----------------------------------------------- */

/* A newer header's structs: this library's fields, then fields it does not know. */
struct options_future {
  flashattn_options_t known;
  int32_t future_a;
  float future_b;
};
struct args_future {
  flashattn_args_t known;
  const flashattn_tensor_t *future_tensor;
  int64_t future_length;
};

static void newer_header_caller(struct problem *p) {
  struct {
    struct options_future options;
    unsigned char guard[GUARD_BYTES];
  } of;
  struct {
    struct args_future args;
    unsigned char guard[GUARD_BYTES];
  } af;
  const flashattn_options_t defaults = FLASHATTN_OPTIONS_INIT;
  const flashattn_args_t args_defaults = FLASHATTN_ARGS_INIT;
  flashattn_options_t current;
  flashattn_tensor_t tout;
  float out[kElems], expected[kElems];

  memset(&of, GUARD_VALUE, sizeof of);
  CHECK_OK(flashattn_options_init_sized(&of.options.known, sizeof of.options));
  CHECK(guard_intact(of.guard));
  CHECK(of.options.known.size == sizeof of.options);
  CHECK(memcmp((const unsigned char *)&of.options.known + sizeof(size_t),
               (const unsigned char *)&defaults + sizeof(size_t),
               sizeof defaults - sizeof(size_t)) == 0);
  CHECK(all_zero((const unsigned char *)&of.options + sizeof(flashattn_options_t),
                 sizeof of.options - sizeof(flashattn_options_t)));
  of.options.known.softmax_scale = 0.5f;
  of.options.known.causal = 1;
  CHECK_OK(problem_forward(p, &of.options.known, out));
  current_options(&current, 0.5f, 1);
  CHECK_OK(problem_forward(p, &current, expected));
  CHECK(memcmp(out, expected, sizeof out) == 0);
  CHECK(guard_intact(of.guard));

  memset(&af, GUARD_VALUE, sizeof af);
  CHECK_OK(flashattn_args_init_sized(&af.args.known, sizeof af.args));
  CHECK(guard_intact(af.guard));
  CHECK(af.args.known.size == sizeof af.args);
  CHECK(af.args.known.options == NULL && af.args.known.q == NULL && af.args.known.sinks == NULL &&
        af.args.known.cu_seqlens_k == NULL && af.args.known.max_seqlen_k == 0);
  CHECK(memcmp((const unsigned char *)&af.args.known + sizeof(size_t),
               (const unsigned char *)&args_defaults + sizeof(size_t),
               sizeof args_defaults - sizeof(size_t)) == 0);
  CHECK(all_zero((const unsigned char *)&af.args + sizeof(flashattn_args_t),
                 sizeof af.args - sizeof(flashattn_args_t)));
  CHECK_OK(flashattn_tensor_4d(&tout, out, FLASHATTN_DTYPE_FLOAT32, 1, kSeq, kHeads, kDim));
  memset(out, 0, sizeof out);
  af.args.known.options = &of.options.known;
  af.args.known.q = &p->tq;
  af.args.known.k = &p->tk;
  af.args.known.v = &p->tv;
  af.args.known.out = &tout;
  CHECK_OK(flashattn_forward_ex(p->ctx, &af.args.known, NULL, 0));
  CHECK(memcmp(out, expected, sizeof out) == 0);
  CHECK(guard_intact(af.guard));
}

/* ---- sizes the _sized functions refuse, writing nothing ----------------------------------- */

/* ---- a caller of the first flashattn_args_t: its size, its fields where they were ------- */

static void first_args_caller(struct problem *p) {
  struct {
    struct args_v1 args;
    unsigned char guard[GUARD_BYTES];
  } a;
  flashattn_options_t options;
  flashattn_tensor_t tout;
  float out[kElems], expected[kElems];

  memset(&a, GUARD_VALUE, sizeof a);
  CHECK_OK(flashattn_args_init_sized((flashattn_args_t *)&a.args, sizeof a.args));
  CHECK(guard_intact(a.guard));
  CHECK(a.args.size == sizeof a.args && a.args.q == NULL && a.args.max_seqlen_k == 0);
  current_options(&options, 0.5f, 1);
  CHECK_OK(flashattn_tensor_4d(&tout, out, FLASHATTN_DTYPE_FLOAT32, 1, kSeq, kHeads, kDim));
  a.args.options = &options;
  a.args.q = &p->tq;
  a.args.k = &p->tk;
  a.args.v = &p->tv;
  a.args.out = &tout;
  memset(out, 0, sizeof out);
  CHECK_OK(flashattn_forward_ex(p->ctx, (const flashattn_args_t *)&a.args, NULL, 0));
  CHECK_OK(problem_forward(p, &options, expected));
  CHECK(memcmp(out, expected, sizeof out) == 0);
  CHECK(guard_intact(a.guard));
}

static void refused_sizes(void) {
  const size_t first_options = sizeof(struct options_v1);
  const size_t bad_options[] = {0, sizeof(size_t), first_options - 4, first_options + 2, 4097};
  const size_t bad_args[] = {0, sizeof(size_t), sizeof(struct args_v1) - 8,
                             sizeof(struct args_v1) + 4, 4097};
  struct {
    flashattn_options_t options;
    unsigned char guard[GUARD_BYTES];
  } of;
  struct {
    flashattn_args_t args;
    unsigned char guard[GUARD_BYTES];
  } af;
  size_t i;

  for (i = 0; i < sizeof bad_options / sizeof bad_options[0]; ++i) {
    memset(&of, GUARD_VALUE, sizeof of);
    if (flashattn_options_init_sized(&of.options, bad_options[i]) !=
        FLASHATTN_ERROR_INVALID_ARGUMENT) {
      fprintf(stderr, "options size %zu was not refused\n", bad_options[i]);
      ++failures;
    }
    CHECK(strstr(flashattn_last_error(), "flashattn_options_init_sized: size") != NULL);
    CHECK(guard_intact((const unsigned char *)&of));
  }
  for (i = 0; i < sizeof bad_args / sizeof bad_args[0]; ++i) {
    memset(&af, GUARD_VALUE, sizeof af);
    if (flashattn_args_init_sized(&af.args, bad_args[i]) != FLASHATTN_ERROR_INVALID_ARGUMENT) {
      fprintf(stderr, "args size %zu was not refused\n", bad_args[i]);
      ++failures;
    }
    CHECK(strstr(flashattn_last_error(), "flashattn_args_init_sized: size") != NULL);
    CHECK(guard_intact((const unsigned char *)&af));
  }
  CHECK(flashattn_options_init_sized(NULL, sizeof(flashattn_options_t)) ==
        FLASHATTN_ERROR_INVALID_ARGUMENT);
  CHECK(flashattn_args_init_sized(NULL, sizeof(flashattn_args_t)) ==
        FLASHATTN_ERROR_INVALID_ARGUMENT);

  /* The first version's size through _sized writes exactly what the v1 symbol writes. */
  memset(&of, GUARD_VALUE, sizeof of);
  CHECK_OK(flashattn_options_init_sized(&of.options, first_options));
  CHECK(of.options.size == first_options);
  CHECK(((const unsigned char *)&of)[first_options] == GUARD_VALUE);
  CHECK(guard_intact(of.guard));
}

int main(void) {
  struct problem p;
  problem_init(&p);
  first_header_caller(&p);
  newer_header_caller(&p);
  first_args_caller(&p);
  refused_sizes();
  flashattn_context_destroy(p.ctx);
  if (failures != 0) {
    fprintf(stderr, "old_callers: %d check(s) failed\n", failures);
    return 1;
  }
  printf("old_callers: ok\n");
  return 0;
}
