/*
 * flashattn.h: the public C API of libflashattn.
 *
 * Exact attention, softmax(scale * Q K^T + mask) V, computed the FlashAttention way (K and V
 * streamed through on-chip memory in tiles, the N x N score matrix never written out), on the
 * CPU or on CUDA GPUs, behind a C ABI that stays stable within a major version.
 *
 * Conventions, stated once for every function below:
 *  - Every function returns a flashattn_status_t; FLASHATTN_SUCCESS is 0. On failure the
 *    thread-local message flashattn_last_error() says what was wrong; on entry every function
 *    that returns a status clears it. The status, never the message, says whether a call failed.
 *  - Output parameters come first and are called `out`. On failure `*out` is left unchanged.
 *  - No function throws, aborts or exits; bad input returns a status.
 *  - Handles are opaque. `*_destroy(NULL)` is a no-op that returns FLASHATTN_SUCCESS.
 *  - A stale handle (destroyed already, or never returned by a create function) is refused
 *    like NULL, with FLASHATTN_ERROR_INVALID_ARGUMENT, by every function, destroy included: the
 *    library never reads it. Wherever a line below says "ctx is NULL" or "buf is NULL", a stale
 *    handle is meant too. (A later create may return the address of a destroyed handle again;
 *    the old handle then names the new object.)
 *  - A context is used by one thread at a time (its buffers too). A second thread entering a
 *    context that is in use gets FLASHATTN_ERROR_CONTEXT_BUSY and nothing happens. Different
 *    contexts are independent and may be used from different threads at once.
 *  - fork(): a child process may go on using the CPU contexts and buffers it inherited (a CPU
 *    context starts its threads anew there). A context that another thread of the parent was
 *    using at the moment of the fork stays busy in the child (FLASHATTN_ERROR_CONTEXT_BUSY).
 *    CUDA contexts follow CUDA's rule: use them only in the process that created them.
 *  - "Host memory" is ordinary CPU memory; "device memory" is memory of the context's GPU.
 *    For a CPU context every tensor lives in host memory; for a CUDA context in device memory
 *    of the context's device (cudaMalloc'd, managed, or a flashattn buffer).
 *  - CUDA work is asynchronous and ordered on the context's stream: a function returns once the
 *    work is enqueued, with no device-wide synchronization and, once the context is warm (its
 *    scratch memory sized by a first call), no allocation, so calls can be captured in a CUDA
 *    graph. CPU work is finished when the function returns.
 *  - Tensors are passed as flashattn_tensor_t views: the library reads them during the call
 *    (and, for CUDA, until the enqueued work completes) and keeps no pointer after it.
 *
 * Layout: Q, K, V, O and their gradients are [batch, seqlen, heads, head_dim], with any strides
 * (counted in elements) whose last one is 1. The log-sum-exp is [batch, heads_q, seqlen_q] fp32.
 * Variable-length batches (flashattn_args_t) pack them as [total_tokens, heads, head_dim] and
 * the log-sum-exp as [heads_q, total_q].
 */
#ifndef FLASHATTN_FLASHATTN_H
#define FLASHATTN_FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#include <flashattn/version.h>

#if defined(_WIN32) && !defined(__GNUC__)
#  ifdef FLASHATTN_BUILDING_LIBRARY
#    define FLASHATTN_API __declspec(dllexport)
#  else
#    define FLASHATTN_API __declspec(dllimport)
#  endif
#else
#  define FLASHATTN_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Status codes. Values are fixed and never renumbered; new ones are added inside their group. */

typedef enum flashattn_status {
  FLASHATTN_SUCCESS = 0,

  /* 1xx: the caller passed something that cannot be right. */
  FLASHATTN_ERROR_INVALID_ARGUMENT = 100,    /* null pointer or handle, bad enum or option value */
  FLASHATTN_ERROR_INVALID_SHAPE = 101,       /* rank, sizes, head dims or heads that do not agree */
  FLASHATTN_ERROR_INVALID_DTYPE = 102,       /* unknown dtype, or dtypes that do not agree */
  FLASHATTN_ERROR_INVALID_STRIDE = 103,      /* negative, non-unit last, overflowing, overlapping */
  FLASHATTN_ERROR_INVALID_MEMORY = 104,      /* pointer in the wrong memory, view past its buffer,
                                                an output sharing memory with another tensor */
  FLASHATTN_ERROR_WORKSPACE_TOO_SMALL = 105, /* caller's workspace smaller than the query said */
  FLASHATTN_ERROR_CONTEXT_BUSY = 106,        /* the context is in use by another thread */

  /* 2xx: a valid request this build, backend or device does not support. */
  FLASHATTN_ERROR_UNSUPPORTED = 200,         /* this configuration is not implemented here */
  FLASHATTN_ERROR_BACKEND_UNAVAILABLE = 201, /* backend not compiled in, no driver or no device */

  /* 3xx: memory. */
  FLASHATTN_ERROR_OUT_OF_MEMORY = 300,        /* host allocation failed */
  FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY = 301, /* device allocation failed; the context stays usable */

  /* 4xx: the device, driver or a CUDA library reported an error. */
  FLASHATTN_ERROR_DEVICE = 400,

  /* 5xx: a bug in flashattn; please report it with the message. */
  FLASHATTN_ERROR_INTERNAL = 500
} flashattn_status_t;

/* Element types. 0 is deliberately not a dtype, so a zero-filled view is rejected. */
typedef enum flashattn_dtype {
  FLASHATTN_DTYPE_FLOAT32 = 1,  /* IEEE binary32 (CPU backend only) */
  FLASHATTN_DTYPE_FLOAT16 = 2,  /* IEEE binary16 */
  FLASHATTN_DTYPE_BFLOAT16 = 3, /* bfloat16: the upper 16 bits of a binary32 */
  /* Integer types start at 16 (4 to 15 are kept for floating-point types). */
  FLASHATTN_DTYPE_INT32 = 16    /* int32: sequence offsets and lengths, block tables only */
} flashattn_dtype_t;

typedef enum flashattn_backend {
  FLASHATTN_BACKEND_AUTO = 0, /* CUDA when a device is usable, else the CPU */
  FLASHATTN_BACKEND_CPU = 1,
  FLASHATTN_BACKEND_CUDA = 2
} flashattn_backend_t;

/* The kernel copies of the CPU backend, one per instruction set
 * (flashattn_context_get_cpu_kernels). */
typedef enum flashattn_cpu_kernels {
  FLASHATTN_CPU_KERNELS_NONE = 0,       /* not a CPU context */
  FLASHATTN_CPU_KERNELS_GENERIC = 1,    /* the target's baseline (x86-64: SSE2) */
  FLASHATTN_CPU_KERNELS_AVX2 = 2,       /* AVX2 + FMA */
  FLASHATTN_CPU_KERNELS_AVX512 = 3,     /* AVX-512 F/VL/BW/DQ */
  FLASHATTN_CPU_KERNELS_AVX512BF16 = 4, /* AVX-512 BF16: bf16 products on vdpbf16ps pairs */
  FLASHATTN_CPU_KERNELS_AMX = 5         /* AMX-BF16: bf16 products on tiles */
} flashattn_cpu_kernels_t;

typedef enum flashattn_algorithm {
  FLASHATTN_ALGORITHM_FLASH = 0,   /* tiled, online softmax, memory linear in seqlen (default) */
  FLASHATTN_ALGORITHM_STANDARD = 1 /* S = QK^T and P = softmax(S) materialized: the baseline */
} flashattn_algorithm_t;

/* ------------------------------------------------------------------------------------------ */
/* Versions and errors. These need no context and are safe from any thread. */

/* FLASHATTN_VERSION_NUMBER of the library that is loaded. A caller can check that header and
 * library agree: flashattn_version_number() / 10000 == FLASHATTN_VERSION_MAJOR. */
FLASHATTN_API unsigned flashattn_version_number(void);

/* "MAJOR.MINOR.PATCH" of the loaded library: a static string, never freed. */
FLASHATTN_API const char *flashattn_version_string(void);

/* 1 when the loaded library has its CUDA backend compiled in (it may still find no device). */
FLASHATTN_API int flashattn_has_cuda(void);

/* The name of a status ("FLASHATTN_ERROR_INVALID_SHAPE"): a static string, never NULL, never
 * freed; "FLASHATTN_UNKNOWN_STATUS" for a value that is not a status. */
FLASHATTN_API const char *flashattn_status_string(flashattn_status_t status);

/* What the last failing call on this thread found wrong ("k: head_dim 96 differs from q's 128"),
 * or "" when the last call succeeded. Owned by the library, never NULL, valid on this thread
 * until its next flashattn call. Reading it does not clear it. */
FLASHATTN_API const char *flashattn_last_error(void);

/* Copies the last error message of this thread into buf (host memory, len bytes, always
 * NUL-terminated when len > 0, truncated if needed) and returns the message's full length,
 * snprintf-style: call with len 0 to size a buffer. Does not change the error state. */
FLASHATTN_API size_t flashattn_last_error_r(char *buf, size_t len);

/* The number of CUDA devices usable by this process: 0 (and FLASHATTN_SUCCESS) when the CUDA
 * backend is not compiled in or there is no driver or device. Initializes CUDA on first use.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out is NULL */
FLASHATTN_API flashattn_status_t flashattn_cuda_device_count(int *out);

/* ------------------------------------------------------------------------------------------ */
/* Contexts. A context binds one backend and device and owns what work on it needs: the CPU
 * backend's thread pool; the CUDA backend's stream, cuBLAS handle, device properties and
 * scratch memory. */

typedef struct flashattn_context *flashattn_context_t;

/* Creates a context. `device` is the CUDA device ordinal (ignored for FLASHATTN_BACKEND_CPU;
 * for AUTO it is used when CUDA is chosen). The CUDA backend creates its own non-blocking
 * stream; see flashattn_context_set_stream. *out is owned by the caller: destroy it with
 * flashattn_context_destroy.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT     out is NULL, unknown backend, negative device
 * \retval FLASHATTN_ERROR_BACKEND_UNAVAILABLE  CUDA not compiled in, no driver, no such device,
 *                                              or cuBLAS could not be loaded
 * \retval FLASHATTN_ERROR_OUT_OF_MEMORY        host allocation failed
 * \retval FLASHATTN_ERROR_DEVICE               a CUDA call failed */
FLASHATTN_API flashattn_status_t flashattn_context_create(flashattn_context_t *out,
                                                          flashattn_backend_t backend, int device);

/* Destroys a context: waits for its enqueued work, then frees its stream (not a stream set by
 * the caller), handles, threads and scratch memory. Buffers created from it stay valid until
 * they are destroyed themselves (a buffer keeps what it needs alive), so contexts and buffers
 * may be destroyed in any order. NULL is a no-op. Must not race with another call on ctx.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  ctx is stale (destroyed already); nothing happens
 * \retval FLASHATTN_ERROR_DEVICE            waiting for the stream reported an earlier
 *                                           asynchronous error (the context is destroyed all
 *                                           the same) */
FLASHATTN_API flashattn_status_t flashattn_context_destroy(flashattn_context_t ctx);

/* The backend the context runs on (CPU or CUDA; AUTO is resolved at creation).
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out or ctx is NULL */
FLASHATTN_API flashattn_status_t flashattn_context_get_backend(flashattn_backend_t *out,
                                                               flashattn_context_t ctx);

/* The CUDA device ordinal of the context, or -1 for a CPU context.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out or ctx is NULL */
FLASHATTN_API flashattn_status_t flashattn_context_get_device(int *out, flashattn_context_t ctx);

/* The kernel copy a CPU context computes with, chosen for this CPU when the context was created:
 * AMX (where the OS grants the tile state), AVX512BF16 (AMD CPUs with AVX-512 BF16, which issue
 * vdpbf16ps at the FMA's rate), AVX512, AVX2 or GENERIC; the environment variable
 * FLASHATTN_CPU_ISA (generic, avx2, avx512, avx512bf16 or amx), read at creation, caps it.
 * FLASHATTN_CPU_KERNELS_NONE for a CUDA context. Two copies may differ in the last bits of a
 * bf16 or fp16 result; one copy computes the same bits on every run.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out or ctx is NULL */
FLASHATTN_API flashattn_status_t flashattn_context_get_cpu_kernels(flashattn_cpu_kernels_t *out,
                                                                   flashattn_context_t ctx);

/* Makes later work on a CUDA context run on `stream` (a cudaStream_t of the context's device,
 * owned by the caller, who keeps it alive while the context uses it); NULL returns to the
 * context's own stream. Work already enqueued is not moved. For a CPU context only NULL is
 * accepted.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  ctx is NULL, or a non-NULL stream for a CPU context
 * \retval FLASHATTN_ERROR_CONTEXT_BUSY      another thread is using ctx */
FLASHATTN_API flashattn_status_t flashattn_context_set_stream(flashattn_context_t ctx,
                                                              void *stream);

/* The stream work is enqueued on (a cudaStream_t; NULL for a CPU context). The caller does not
 * own it and must not destroy it.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out or ctx is NULL */
FLASHATTN_API flashattn_status_t flashattn_context_get_stream(void **out, flashattn_context_t ctx);

/* Sets how many threads a CPU context computes with (0: one per hardware thread, the
 * default). Has no effect on a CUDA context.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  ctx is NULL, or num_threads is negative
 * \retval FLASHATTN_ERROR_CONTEXT_BUSY      another thread is using ctx */
FLASHATTN_API flashattn_status_t flashattn_context_set_num_threads(flashattn_context_t ctx,
                                                                   int num_threads);

/* Blocks the calling thread until all work enqueued on the context's stream has finished
 * (immediate for a CPU context).
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  ctx is NULL
 * \retval FLASHATTN_ERROR_CONTEXT_BUSY      another thread is using ctx
 * \retval FLASHATTN_ERROR_DEVICE            the stream reported an asynchronous error */
FLASHATTN_API flashattn_status_t flashattn_context_synchronize(flashattn_context_t ctx);

/* ------------------------------------------------------------------------------------------ */
/* Buffers: memory owned by the library, for callers with no array type of their own. A CUDA
 * context's buffers are device memory of its device; a CPU context's are host memory. Both are
 * aligned to 256 bytes. A view whose data lies in a buffer, at its end or up to 256 bytes past
 * it, is checked against the buffer's end: FLASHATTN_ERROR_INVALID_MEMORY when it does not fit.
 * A CUDA buffer may be used only with the context that created it (another context's work would
 * not be ordered against the stream the buffer is freed on): FLASHATTN_ERROR_INVALID_MEMORY. */

typedef struct flashattn_buffer *flashattn_buffer_t;

/* Allocates `bytes` (> 0) of memory for ctx. Contents are undefined. *out is owned by the
 * caller: destroy it with flashattn_buffer_destroy.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT      out or ctx is NULL, or bytes is 0
 * \retval FLASHATTN_ERROR_CONTEXT_BUSY          another thread is using ctx
 * \retval FLASHATTN_ERROR_OUT_OF_MEMORY         host allocation failed
 * \retval FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY  device allocation failed (ctx stays usable) */
FLASHATTN_API flashattn_status_t flashattn_buffer_create(flashattn_buffer_t *out,
                                                         flashattn_context_t ctx, size_t bytes);

/* Frees a buffer after the work enqueued on its context's stream has finished. Never refused
 * for a busy context (finalizers may call it from any thread). NULL is a no-op.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  buf is stale (destroyed already); nothing happens
 * \retval FLASHATTN_ERROR_DEVICE            freeing reported an earlier asynchronous error (the
 *                                           buffer is released all the same) */
FLASHATTN_API flashattn_status_t flashattn_buffer_destroy(flashattn_buffer_t buf);

/* Copies `bytes` from host memory `src` to the buffer at byte `offset`, ordered after the work
 * enqueued on the context's stream, and returns when the copy is done (src may be reused).
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  buf or src is NULL, or offset + bytes exceeds the
 *                                           buffer; nothing is copied
 * \retval FLASHATTN_ERROR_CONTEXT_BUSY      another thread is using the buffer's context
 * \retval FLASHATTN_ERROR_DEVICE            the copy failed */
FLASHATTN_API flashattn_status_t flashattn_buffer_write(flashattn_buffer_t buf, size_t offset,
                                                        const void *src, size_t bytes);

/* Copies `bytes` from the buffer at byte `offset` to host memory `dst`, after the work enqueued
 * on the context's stream, and returns when dst holds them.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  buf or dst is NULL, or offset + bytes exceeds the
 *                                           buffer; dst is untouched
 * \retval FLASHATTN_ERROR_CONTEXT_BUSY      another thread is using the buffer's context
 * \retval FLASHATTN_ERROR_DEVICE            the copy failed (dst is undefined) */
FLASHATTN_API flashattn_status_t flashattn_buffer_read(flashattn_buffer_t buf, size_t offset,
                                                       void *dst, size_t bytes);

/* The buffer's base address (device memory for a CUDA context), for building tensor views. The
 * pointer is owned by the buffer and valid until flashattn_buffer_destroy.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out or buf is NULL */
FLASHATTN_API flashattn_status_t flashattn_buffer_data(void **out, flashattn_buffer_t buf);

/* The buffer's size in bytes.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out or buf is NULL */
FLASHATTN_API flashattn_status_t flashattn_buffer_size(size_t *out, flashattn_buffer_t buf);

/* ------------------------------------------------------------------------------------------ */
/* Tensor views. */

#define FLASHATTN_MAX_RANK 4

/* A strided view of memory the caller owns (or a buffer's). shape[i] and strides[i] (counted in
 * elements, not bytes) are read for i < rank. Q, K, V, O, dO, dQ, dK, dV have rank 4,
 * [batch, seqlen, heads, head_dim], strides[3] == 1 and other strides >= 0; the LSE has rank 3,
 * [batch, heads_q, seqlen_q], dtype FLOAT32. Strides of 0 are allowed in inputs (broadcast);
 * outputs must not overlap themselves, each other, or any input. */
typedef struct flashattn_tensor {
  void *data;
  flashattn_dtype_t dtype;
  int32_t rank;
  int64_t shape[FLASHATTN_MAX_RANK];
  int64_t strides[FLASHATTN_MAX_RANK];
} flashattn_tensor_t;

/* Fills *out with a contiguous (row-major) rank-4 view [batch, seqlen, heads, head_dim].
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out is NULL
 * \retval FLASHATTN_ERROR_INVALID_SHAPE     a size is < 1, or their product overflows */
FLASHATTN_API flashattn_status_t flashattn_tensor_4d(flashattn_tensor_t *out, void *data,
                                                     flashattn_dtype_t dtype, int64_t batch,
                                                     int64_t seqlen, int64_t heads,
                                                     int64_t head_dim);

/* Fills *out with a contiguous rank-3 FLOAT32 view [batch, heads, seqlen] for the LSE.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out is NULL
 * \retval FLASHATTN_ERROR_INVALID_SHAPE     a size is < 1, or their product overflows */
FLASHATTN_API flashattn_status_t flashattn_tensor_lse(flashattn_tensor_t *out, void *data,
                                                      int64_t batch, int64_t heads,
                                                      int64_t seqlen);

/* ------------------------------------------------------------------------------------------ */
/* Options. The struct starts with its own size; fields are only ever appended, and 0 is the
 * default of every appended field. The library reads the first `size` bytes it knows of and
 * defaults the rest (a size must end at a field's end); a larger size from a newer header is
 * accepted when the bytes it does not know are all zero. Fill the struct with
 * flashattn_options_init(&o) or FLASHATTN_OPTIONS_INIT, both of which set size to this header's
 * sizeof(flashattn_options_t), then set the fields wanted. */

/* The largest |softmax_scale| accepted; beyond it every operation returns
 * FLASHATTN_ERROR_INVALID_ARGUMENT (on every backend). Up to it no fp16 input (|x| <= 65504,
 * head_dim <= 256) can take a score scale * q.k, nor its base-2 form scale * log2(e) * q.k,
 * past fp32's range, so finite fp16 inputs give finite outputs and LSEs; at it the softmax of
 * ordinary inputs is one-hot, the limit of any larger scale. dq and dk carry the scale as a
 * factor: like any result they round to infinity where they pass their dtype's range. (Large
 * float32 and bfloat16 inputs can overflow a score at any scale: see "Non-finite values".) */
#define FLASHATTN_MAX_SOFTMAX_SCALE 1e26f

typedef struct flashattn_options {
  size_t size;             /* sizeof(flashattn_options_t) as the caller compiled it */
  float softmax_scale;     /* 0 (default): 1/sqrt(head_dim); else used as given (finite, at most
                              FLASHATTN_MAX_SOFTMAX_SCALE in magnitude) */
  int32_t causal;          /* 0 or 1; 1 masks key j for query i when j > i + seqlen_k - seqlen_q
                              (bottom-right aligned, as FlashAttention-2 and cuDNN) */
  flashattn_algorithm_t algorithm; /* FLASH (default) or STANDARD */
  int32_t deterministic;   /* 0 or 1; 1: bit-identical backward results run after run */
  /* Fields added with the attention variants. Every one is 0 by default, and 0 means "off": a
   * struct zero-filled past the fields a caller sets is the default. */
  int32_t window;          /* 0 (default) or 1; 1: the sliding window below masks every key
                              outside i + diag - window_left <= j <= i + diag + window_right, where
                              diag = seqlen_k - seqlen_q (bottom-right aligned, as causal) */
  int32_t window_left;     /* keys before the diagonal a query sees; -1: unbounded. 0 when window
                              is 0 */
  int32_t window_right;    /* keys after the diagonal a query sees; -1: unbounded. 0 when window
                              is 0. With causal = 1 the right bound is min(window_right, 0) (an
                              unbounded one becomes 0) */
  float softcap;           /* 0 (default): none; else c > 0 and finite: each score s = scale * q.k
                              becomes c * tanh(s / c) before the masks, ALiBi and the softmax.
                              The CUDA flash kernels take tanh from the GPU's approximation
                              (relative error <= 2^-11): a logit, and so the LSE, may be off
                              by up to c * 2^-11 */
  /* Added with the decode path. */
  int64_t num_splits;      /* >= 0. 0 (default): the library chooses. n > 0: where the CUDA flash
                              forward splits the keys of each (batch entry, KV head) across
                              thread blocks and merges the parts (few query rows against many
                              keys: one query token, or query tokens times a KV group's heads at
                              most 16), it makes n parts, fewer when the keys fill fewer blocks
                              of 64 or n passes 128. The CPU backend's flash forward splits
                              every work item's keys into n parts (fewer when the keys fill fewer
                              tiles of 64 or n passes 64; its own choice splits only where few
                              query rows meet many keys). The result is the same attention up to
                              rounding; other paths ignore it. The choice, like the library's
                              own, depends only on shapes (never on a CPU context's threads), so
                              a CUDA graph stays valid */
} flashattn_options_t;

#define FLASHATTN_OPTIONS_INIT \
  { sizeof(flashattn_options_t), 0.0f, 0, FLASHATTN_ALGORITHM_FLASH, 0, 0, 0, 0, 0.0f, 0 }

/* Fills the first `size` bytes of *out with the defaults (what FLASHATTN_OPTIONS_INIT gives)
 * and sets out->size = size. `size` is the size of the struct as the caller compiled it, so the
 * library never writes past the caller's struct: C and C++ callers write
 * flashattn_options_init(&o), the macro below, which passes sizeof(o); bindings and callers
 * through dlsym/ctypes call this function with their own struct's size. A size larger than
 * this library's struct (a newer header) is accepted: the fields it does not know are set to 0,
 * which is every appended field's default.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out is NULL; size is below that of the first
 *                                           flashattn_options_t (size, softmax_scale, causal,
 *                                           algorithm, deterministic), ends inside a field, or
 *                                           is above 4096 (nothing is written) */
FLASHATTN_API flashattn_status_t flashattn_options_init_sized(flashattn_options_t *out,
                                                              size_t size);

/* flashattn_options_init(out): fills *out, a flashattn_options_t of this header, with the
 * defaults; statuses as flashattn_options_init_sized. `out` is a pointer to a
 * flashattn_options_t (sizeof(*(out)) is taken, so a bare NULL does not compile).
 * The library also exports a function of this name: the first header's flashattn_options_init,
 * which programs built against that header call. It writes only the first version's fields and
 * sets size to that version's size, so those programs keep working unchanged. This header does
 * not declare it and new code should not resolve it: a struct it fills says it ends after
 * `deterministic`, so the library would ignore every field set after those. */
#define flashattn_options_init(out) flashattn_options_init_sized((out), sizeof(*(out)))

/* ------------------------------------------------------------------------------------------ */
/* Attention. Shapes: q [B, Nq, Hq, D], k [B, Nk, Hkv, D], v [B, Nk, Hkv, Dv], Hq a multiple of
 * Hkv (GQA/MQA: query head h reads key/value head h / (Hq / Hkv)), 1 <= D, Dv <= 256 (Dv, the
 * head dim of v and of the output, may differ from D, that of q and k). out, dout
 * [B, Nq, Hq, Dv]; dq like q, dk like k, dv like v; lse [B, Hq, Nq] FLOAT32. q, k, v and every
 * output share one dtype.
 *
 * What is computed, per batch entry and query head h, for query i and key j (diag = Nk - Nq):
 *   x_ij = s, with s = scale * q_i.k_j
 *          -> c * tanh(s / c)                  with a softcap c (options.softcap)
 *          -> ... - slope_h * |i + diag - j|    with ALiBi slopes (flashattn_args_t)
 *   key j is visible to query i unless causal hides it (j > i + diag) or the sliding window
 *   does (options.window); out_i = sum_j p_ij v_j and lse_i = log(Z_i) over the visible keys,
 *   p_ij = e^{x_ij} / Z_i, Z_i = e^{sink_h} + sum_j e^{x_ij} (the sink term only with attention
 *   sinks, flashattn_args_t, which act as one more key with value 0).
 * A query row that sees no key gets output 0 and LSE -inf (a sink notwithstanding), dq 0, and
 * adds nothing to any other gradient.
 *
 * Non-finite values. Scores scale * q.k are computed in fp32; one past fp32's range counts as
 * infinite. A NaN or an infinity where a mask (causal, window) hides it never reaches a result:
 * a key a query row does not see adds nothing to that row's output, LSE and dq, and the row
 * nothing to that key's dk and dv; a row that sees no key gets output 0, LSE -inf and dq 0, and
 * adds nothing to any dk or dv, whatever its q, dout and out hold. A NaN or an infinity where a
 * row sees it (in that row's q or dout, in k or v of a key it sees, or in its out for the
 * backward) may make every result computed from it NaN or infinite, as the arithmetic gives:
 * that row's output and LSE; its dq; the dk and dv of the keys it sees. */

/* Is this configuration supported by ctx (and, for the backward, `backward` = 1)? Only shapes,
 * dtypes, strides and options are examined; data pointers may be NULL.
 * \retval FLASHATTN_SUCCESS            supported
 * \retval FLASHATTN_ERROR_UNSUPPORTED  valid, but not implemented for this backend or device
 * \retval FLASHATTN_ERROR_INVALID_*    ctx is NULL (INVALID_ARGUMENT), or the views or options
 *                                     are wrong (the message says how) */
FLASHATTN_API flashattn_status_t flashattn_supported(flashattn_context_t ctx,
                                                     const flashattn_tensor_t *q,
                                                     const flashattn_tensor_t *k,
                                                     const flashattn_tensor_t *v,
                                                     const flashattn_options_t *options,
                                                     int backward);

/* The workspace (bytes of host memory for a CPU context, device memory for CUDA) that
 * flashattn_forward (backward = 0) or flashattn_backward (backward = 1) needs for this
 * configuration. Data pointers may be NULL. 0 means none.
 * On CUDA the flash algorithm reads views whose rows do not start on 16-byte boundaries (a head
 * dim that is not a multiple of 8, a stride that is not, a data pointer off 16 bytes) through
 * aligned copies in the workspace; the forward on Hopper (sm_90) also views whose head dim is
 * above 64 and a multiple of 8 but not of 16, such as 104 (its kernels read such rows faster
 * copied, zero-padded to 16), unless it is a decode step (few query rows). The answer
 * counts the copies of what it is shown: the head dims, the strides of q, k and v, and their data
 * pointers when given (outputs are taken to be aligned when their head dim is a multiple of 8).
 * A call whose views need more (an output's strides, a pointer the query did not see) answers
 * FLASHATTN_ERROR_WORKSPACE_TOO_SMALL with the size it needs; with a NULL workspace the
 * context's scratch grows to it.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out or ctx is NULL
 * \retval FLASHATTN_ERROR_INVALID_*, FLASHATTN_ERROR_UNSUPPORTED  as flashattn_supported
 * \retval FLASHATTN_ERROR_OUT_OF_MEMORY     the workspace this configuration needs is too large
 *                                           for a size_t (such a call could never run) */
FLASHATTN_API flashattn_status_t flashattn_workspace_size(size_t *out, flashattn_context_t ctx,
                                                          const flashattn_tensor_t *q,
                                                          const flashattn_tensor_t *k,
                                                          const flashattn_tensor_t *v,
                                                          const flashattn_options_t *options,
                                                          int backward);

/* Forward attention: out = softmax(scale * q k^T + mask) v, and lse = log-sum-exp of each row
 * of scale * q k^T + mask (natural log; NULL lse: not written).
 * Memory: all views in the context's memory (see conventions); the caller owns them.
 * Workspace: NULL with workspace_size 0 uses the context's own scratch (allocated, then kept,
 * on first need); otherwise at least flashattn_workspace_size bytes in the context's memory,
 * owned by the caller, not touched after the work completes.
 * Stream: enqueued on the context's stream (CUDA); done on return (CPU).
 * Outputs: on a status other than SUCCESS returned before any work starts (every 1xx and 2xx
 * status) out and lse are untouched; after a 3xx/4xx/5xx status their contents are undefined.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT     ctx, q, k, v, out NULL; NULL data; bad options
 * \retval FLASHATTN_ERROR_INVALID_SHAPE        ranks, sizes, heads or head dims disagree
 * \retval FLASHATTN_ERROR_INVALID_DTYPE        dtypes unknown or not all equal; lse not FLOAT32
 * \retval FLASHATTN_ERROR_INVALID_STRIDE       negative, non-unit last, overflowing, overlapping
 * \retval FLASHATTN_ERROR_INVALID_MEMORY       a pointer not in the context's memory, a view past
 *                                              the end of its buffer, an output aliasing another
 * \retval FLASHATTN_ERROR_WORKSPACE_TOO_SMALL  workspace_size below the query's answer
 * \retval FLASHATTN_ERROR_CONTEXT_BUSY         another thread is using ctx
 * \retval FLASHATTN_ERROR_UNSUPPORTED          dtype, head dim or device not supported here
 * \retval FLASHATTN_ERROR_OUT_OF_MEMORY        host scratch could not be allocated (or would
 *                                              need more than a size_t holds)
 * \retval FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY device scratch could not be allocated
 * \retval FLASHATTN_ERROR_DEVICE               a launch or CUDA library call failed */
FLASHATTN_API flashattn_status_t flashattn_forward(flashattn_context_t ctx,
                                                   const flashattn_tensor_t *q,
                                                   const flashattn_tensor_t *k,
                                                   const flashattn_tensor_t *v,
                                                   const flashattn_tensor_t *out,
                                                   const flashattn_tensor_t *lse,
                                                   const flashattn_options_t *options,
                                                   void *workspace, size_t workspace_size);

/* Backward attention: given q, k, v, the forward's out and lse (required), and the gradient
 * dout of the loss with respect to out, writes dq, dk and dv (each overwritten, not added to).
 * For GQA/MQA dk and dv are summed over the query heads that share a key/value head. Options
 * must match the forward's (scale, causal). Memory, workspace, stream and output guarantees as
 * flashattn_forward (outputs: dq, dk, dv).
 * \retval as flashattn_forward */
FLASHATTN_API flashattn_status_t flashattn_backward(flashattn_context_t ctx,
                                                    const flashattn_tensor_t *q,
                                                    const flashattn_tensor_t *k,
                                                    const flashattn_tensor_t *v,
                                                    const flashattn_tensor_t *out,
                                                    const flashattn_tensor_t *dout,
                                                    const flashattn_tensor_t *lse,
                                                    const flashattn_tensor_t *dq,
                                                    const flashattn_tensor_t *dk,
                                                    const flashattn_tensor_t *dv,
                                                    const flashattn_options_t *options,
                                                    void *workspace, size_t workspace_size);

/* ------------------------------------------------------------------------------------------ */
/* Attention with every tensor named: what flashattn_forward and flashattn_backward take, and the
 * variants that need tensors of their own (ALiBi slopes, attention sinks and their gradient,
 * variable-length batches). The struct starts with its own size and is read as
 * flashattn_options_t is (fields are only appended; the library reads the first `size` bytes it
 * knows, defaults the rest, and accepts a larger size when the bytes it does not know are all
 * zero); NULL pointers and zeros are the defaults. A call reads only the fields it uses (a
 * forward does not read dout, dq, dk, dv or dsinks), so one struct can serve a forward and then
 * its backward.
 * Memory: every tensor is owned by the caller and lives in the context's memory (host memory for
 * a CPU context, device memory of its device for CUDA; see the conventions), read or written
 * during the call (CUDA: until the enqueued work completes); the library keeps no pointer.
 *
 * Variable-length batches: with cu_seqlens_q and cu_seqlens_k (both or neither), q, k, v, out,
 * dout, dq, dk and dv have rank 3, [total_tokens, heads, head_dim], holding the tokens of B
 * sequences one after another, and lse has rank 2, [Hq, total_q]. Sequence b owns the query rows
 * [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and the key rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]);
 * every mask is aligned per sequence (diag = its key count - its query count); a sequence may
 * have no query or no key (its queries then see no key). Rows past the last offset are neither
 * read nor written. The offsets start at 0, never decrease and end at most at the tensor's
 * total_tokens; max_seqlen_q and max_seqlen_k are at least every sequence's length and at most
 * the total, so that a CUDA launch needs no look at the offsets (the kernels read them on the
 * device: such calls may be captured in a CUDA graph). A CPU context checks the offsets against
 * these rules (FLASHATTN_ERROR_INVALID_SHAPE, nothing written); a CUDA context cannot without
 * reading device memory, and bad offsets there make the results undefined.
 *
 * KV cache (forward only): with cache_seqlens, k and v are a cache that sequence b fills from
 * its start, holding cache_seqlens[b] tokens before the call. The cache is contiguous, k of
 * shape [B, capacity, Hkv, d] and v [B, capacity, Hkv, dv], or, with block_table, paged: k of
 * shape [num_pages, page_size, Hkv, d], v [num_pages, page_size, Hkv, dv], any page_size >= 1,
 * and token t of sequence b in page block_table[b, t / page_size] at row t % page_size (capacity
 * = page_size * the table's pages per sequence). Pages may be shared by sequences that read
 * them, and only the entries of the pages a sequence uses are read (the rest may hold anything).
 * With k_new and v_new ([B, N_new, Hkv, d] and [B, N_new, Hkv, dv]), the call first writes them
 * into the cache as tokens cache_seqlens[b] .. cache_seqlens[b] + N_new - 1 of each sequence
 * (k and v are then written as well as read: they must share no byte with any other view), and
 * attends over all of them: sequence b has len_k = cache_seqlens[b] + N_new keys (at most
 * capacity), its queries are q's N_q rows, and every mask is aligned as elsewhere (diag = len_k
 * - N_q: the queries are the last tokens). cache_seqlens itself is not updated. A token written
 * by one sequence must not be read or written by another in the same call (undefined results).
 * With rotary_cos and rotary_sin ([positions, R / 2], float32 or q's dtype, R even, <= d), the
 * first R features of q and of k_new are rotated before use, in fp32 and rounded to their dtype:
 * query i of sequence b at position len_k - N_q + i, new token i at cache_seqlens[b] + i (a
 * cached token is taken as already rotated). A pair (x, y) at position t and index r < R / 2
 * becomes (x cos - y sin, x sin + y cos), cos = rotary_cos[t, r], sin = rotary_sin[t, r]; the
 * pair is (2r, 2r + 1) with rotary_interleaved = 1 (GPT-J's layout), (r, r + R / 2) with 0
 * (GPT-NeoX's, the default). q is read, never written: its rotated copy lives in the workspace.
 * A CPU context checks the lengths (0 <= cache_seqlens[b], len_k <= capacity), the table
 * entries a sequence uses (in [0, num_pages)), the rotary positions (0 <= len_k - N_q whenever
 * rotary is given, every position below the table's rows) and that no two sequences append into
 * one page row (FLASHATTN_ERROR_INVALID_SHAPE, nothing written). A CUDA context (the flash
 * algorithm; the standard one answers FLASHATTN_ERROR_UNSUPPORTED) cannot check those values
 * without reading device memory: values that break the rules make the results undefined (reads
 * and writes may land outside the cache). The lengths and the table live in device memory, and
 * the launch depends on shapes only, so that a decode step may be captured in a CUDA graph and
 * replayed with new lengths. On CUDA a paged cache is read by the decode path: N_q times a KV
 * group's query heads at most 16, with every key visible to all of a sequence's queries or to
 * none (one token; several without a causal mask); other paged calls answer
 * FLASHATTN_ERROR_UNSUPPORTED and say so; a contiguous cache takes any N_q. The cache takes no
 * cu_seqlens_q, cu_seqlens_k or max lengths. */

typedef struct flashattn_args {
  size_t size;                        /* sizeof(flashattn_args_t) as the caller compiled it */
  const flashattn_options_t *options; /* NULL: the defaults */
  const flashattn_tensor_t *q;        /* read */
  const flashattn_tensor_t *k;        /* read */
  const flashattn_tensor_t *v;        /* read */
  const flashattn_tensor_t *out;      /* forward: written; backward: read (the forward's) */
  const flashattn_tensor_t *lse;      /* forward: written (NULL: not wanted); backward: read
                                         (required) */
  const flashattn_tensor_t *dout;     /* backward: read */
  const flashattn_tensor_t *dq;       /* backward: written */
  const flashattn_tensor_t *dk;       /* backward: written */
  const flashattn_tensor_t *dv;       /* backward: written */
  const flashattn_tensor_t *alibi_slopes; /* read; NULL: no ALiBi. FLOAT32, [Hq] (a slope per
                                         query head) or [B, Hq] (per batch entry and head) */
  const flashattn_tensor_t *sinks;    /* read; NULL: no sinks. FLOAT32 [Hq]: one logit per query
                                         head, in every row's softmax denominator */
  const flashattn_tensor_t *dsinks;   /* backward: written (overwritten, not added to), NULL: not
                                         wanted; needs sinks. FLOAT32 [Hq]: the gradient of the
                                         loss with respect to sinks, summed over batch and rows:
                                         -sum_i e^{sink_h - lse_i} rowsum(dout_i * out_i) */
  const flashattn_tensor_t *cu_seqlens_q; /* read; NULL: a fixed-length batch. INT32 [B + 1]:
                                         where each sequence's queries start in the packed rows */
  const flashattn_tensor_t *cu_seqlens_k; /* read; INT32 [B + 1]: likewise for keys and values */
  int64_t max_seqlen_q;               /* variable-length batches: the largest query count of a
                                         sequence (an upper bound); 0 otherwise */
  int64_t max_seqlen_k;               /* variable-length batches: the largest key count; 0
                                         otherwise */
  /* Added with the KV cache (see "KV cache" above; forward only). */
  const flashattn_tensor_t *cache_seqlens; /* read; NULL: no cache. INT32 [B]: the tokens each
                                         sequence holds in k and v before the call */
  const flashattn_tensor_t *block_table; /* read; NULL: a contiguous cache. INT32 [B, pages per
                                         sequence]: the page of k and v holding each block of
                                         page_size tokens of a sequence */
  const flashattn_tensor_t *k_new;    /* read; NULL: nothing appended. [B, N_new, Hkv, d] */
  const flashattn_tensor_t *v_new;    /* read; with k_new. [B, N_new, Hkv, dv] */
  const flashattn_tensor_t *rotary_cos; /* read; NULL: no rotary embedding. [positions, R / 2] */
  const flashattn_tensor_t *rotary_sin; /* read; with rotary_cos, of its shape and dtype */
  int64_t rotary_interleaved;         /* 0 (default): pairs (r, r + R / 2); 1: pairs (2r, 2r + 1) */
} flashattn_args_t;

#define FLASHATTN_ARGS_INIT                                                                   \
  { sizeof(flashattn_args_t), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
    NULL, NULL, NULL, NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, 0 }

/* Fills the first `size` bytes of *out with the defaults (what FLASHATTN_ARGS_INIT gives: every
 * pointer NULL, every length 0) and sets out->size = size; `size` is handled as by
 * flashattn_options_init_sized (at least the size of this, the first, flashattn_args_t; a larger
 * one gets zeros past the fields this library knows).
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out is NULL; size below the first flashattn_args_t,
 *                                           inside a field or above 4096 (nothing is written) */
FLASHATTN_API flashattn_status_t flashattn_args_init_sized(flashattn_args_t *out, size_t size);

/* flashattn_args_init(out): fills *out, a flashattn_args_t of this header, with the defaults;
 * statuses as flashattn_args_init_sized. Only this macro has the name: there is no exported
 * function flashattn_args_init (bindings and dlsym callers use flashattn_args_init_sized). */
#define flashattn_args_init(out) flashattn_args_init_sized((out), sizeof(*(out)))

/* flashattn_supported for the configuration `args` describes: the options and the shapes,
 * dtypes and strides of q, k, v and of the variant tensors (alibi_slopes, sinks, cu_seqlens_q,
 * cu_seqlens_k, and with backward = 1 dsinks), and max_seqlen_q, max_seqlen_k. Data pointers
 * may be NULL and are not read, so offsets are not checked.
 * \retval FLASHATTN_SUCCESS            supported
 * \retval FLASHATTN_ERROR_UNSUPPORTED  valid, but not implemented for this backend or device (the
 *                                     message names the variant)
 * \retval FLASHATTN_ERROR_INVALID_*    ctx or args is NULL (INVALID_ARGUMENT), or the views,
 *                                     options or lengths are wrong (the message says how) */
FLASHATTN_API flashattn_status_t flashattn_supported_ex(flashattn_context_t ctx,
                                                        const flashattn_args_t *args,
                                                        int backward);

/* flashattn_workspace_size for `args` (examined as flashattn_supported_ex does).
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out, ctx or args is NULL
 * \retval FLASHATTN_ERROR_INVALID_*, FLASHATTN_ERROR_UNSUPPORTED  as flashattn_supported_ex
 * \retval FLASHATTN_ERROR_OUT_OF_MEMORY     the workspace is too large for a size_t */
FLASHATTN_API flashattn_status_t flashattn_workspace_size_ex(size_t *out, flashattn_context_t ctx,
                                                             const flashattn_args_t *args,
                                                             int backward);

/* flashattn_forward for `args`: out and (when given) lse from q, k, v and the variants.
 * Memory, workspace, stream and output guarantees as flashattn_forward; every status below means
 * what it means there, and also:
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT     args is NULL; max lengths without offsets
 * \retval FLASHATTN_ERROR_INVALID_SHAPE        slopes or sinks of the wrong shape; offsets or
 *                                              max lengths that break the rules above
 * \retval FLASHATTN_ERROR_INVALID_DTYPE        slopes, sinks or dsinks not FLOAT32; offsets not
 *                                              INT32
 * \retval FLASHATTN_ERROR_INVALID_STRIDE       a variant tensor's strides
 * \retval FLASHATTN_ERROR_INVALID_MEMORY       a variant tensor's memory
 * \retval FLASHATTN_ERROR_WORKSPACE_TOO_SMALL
 * \retval FLASHATTN_ERROR_CONTEXT_BUSY
 * \retval FLASHATTN_ERROR_UNSUPPORTED          a variant this backend does not implement (the
 *                                              message names it); fields of args past those
 *                                              this library knows are set
 * \retval FLASHATTN_ERROR_OUT_OF_MEMORY
 * \retval FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY
 * \retval FLASHATTN_ERROR_DEVICE */
FLASHATTN_API flashattn_status_t flashattn_forward_ex(flashattn_context_t ctx,
                                                      const flashattn_args_t *args,
                                                      void *workspace, size_t workspace_size);

/* flashattn_backward for `args`: dq, dk, dv (and dsinks when given) from q, k, v, out, lse,
 * dout and the variants, which must be the forward's. Memory, workspace, stream and output
 * guarantees as flashattn_forward (outputs: dq, dk, dv, dsinks).
 * \retval as flashattn_forward_ex */
FLASHATTN_API flashattn_status_t flashattn_backward_ex(flashattn_context_t ctx,
                                                       const flashattn_args_t *args,
                                                       void *workspace, size_t workspace_size);

/* ------------------------------------------------------------------------------------------ */
/* Merging partial results. Attention over a key range split into parts gives, per part p, an
 * output O_p (normalized over that part's keys) and its log-sum-exp LSE_p. The result over the
 * union of the parts is, per query row,
 *   LSE = log(sum_p e^{LSE_p}),   O = sum_p e^{LSE_p - LSE} O_p,
 * what split-KV decode computes inside and cascade inference (a shared prefix and each
 * sequence's own keys) and context parallelism (ring attention) need outside.
 *
 * Layout of the parts: one strided view with a leading parts dimension, [parts, batch, seqlen,
 * heads, head_dim] for the outputs and [parts, batch, heads, seqlen] for the LSEs, given as the
 * first part's view (rank 4, as a forward's out; rank 3, as its lse) and the element stride from
 * one part to the next. Why one view and not an array of pointers: a forward writes out and lse
 * into any strided view, so the parts can be written straight into slices of one buffer; one
 * view keeps the call free of per-part descriptors, so any number of parts merges in one launch,
 * with no workspace and no table of pointers to copy to the device. (flashattn_tensor_t holds at
 * most FLASHATTN_MAX_RANK dimensions and cannot grow, hence the count and strides beside it.)
 * Variable-length batches merge too: parts_out of rank 3, [total_tokens, heads, head_dim], and
 * parts_lse of rank 2, [heads, total_tokens], as flashattn_forward_ex writes them.
 *
 * Arithmetic, per row: m = max_p LSE_p, w_p = e^{LSE_p - m} (so no difference of LSEs can
 * overflow), accumulated in fp32 and rounded once into out's dtype:
 *  - a part with LSE -inf (its keys all hidden from the row, or no keys) adds nothing, whatever
 *    its output holds; a row whose parts are all -inf gets output 0 and LSE -inf, never NaN;
 *  - a NaN LSE in any part makes the row's output and LSE NaN;
 *  - otherwise a +inf LSE (a forward gives it only from infinite scores) makes the row's LSE
 *    +inf and its output NaN: the parts' weights are undefined.
 * NaN or infinite values in a part's output reach the row's output as the arithmetic gives,
 * unless that part's weight is 0.
 *
 * In-place use: out may be exactly one part's output (data at that part's address, the same
 * shape and strides), and lse exactly one part's LSE, e.g. to fold each new part of a ring into
 * a running result held as part 0: each element is read before it is written. Any other overlap
 * of out or lse with the parts, or with each other, is refused (FLASHATTN_ERROR_INVALID_MEMORY). */

typedef struct flashattn_merge_args {
  size_t size;                          /* sizeof(flashattn_merge_args_t) as the caller compiled
                                           it; read as flashattn_args_t is */
  int64_t num_parts;                    /* >= 1 */
  const flashattn_tensor_t *parts_out;  /* read: part 0's output, [B, N, H, D] (any strides,
                                           the last 1); FLOAT16 or BFLOAT16 (FLOAT32 too on the
                                           CPU) */
  int64_t parts_out_stride;             /* elements from one part's output to the next's, >= 0;
                                           part p's element (b, n, h, d) is at
                                           data + p * parts_out_stride + the view's offset */
  const flashattn_tensor_t *parts_lse;  /* read: part 0's LSE, [B, H, N] FLOAT32 */
  int64_t parts_lse_stride;             /* elements from one part's LSE to the next's, >= 0 */
  const flashattn_tensor_t *out;        /* written: [B, N, H, D] in parts_out's dtype */
  const flashattn_tensor_t *lse;        /* written: [B, H, N] FLOAT32; NULL: not wanted */
} flashattn_merge_args_t;

#define FLASHATTN_MERGE_ARGS_INIT \
  { sizeof(flashattn_merge_args_t), 0, NULL, 0, NULL, 0, NULL, NULL }

/* Fills the first `size` bytes of *out with the defaults (what FLASHATTN_MERGE_ARGS_INIT gives:
 * every pointer NULL, every count and stride 0) and sets out->size = size; `size` is handled
 * as by flashattn_options_init_sized.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out is NULL; size below the first
 *                                           flashattn_merge_args_t, inside a field or above
 *                                           4096 (nothing is written) */
FLASHATTN_API flashattn_status_t flashattn_merge_args_init_sized(flashattn_merge_args_t *out,
                                                                 size_t size);

/* flashattn_merge_args_init(out): fills *out, a flashattn_merge_args_t of this header, with the
 * defaults (there is no exported function of this name; see flashattn_args_init). */
#define flashattn_merge_args_init(out) flashattn_merge_args_init_sized((out), sizeof(*(out)))

/* Merges the parts that `args` describes into out (and lse when given). Needs no workspace.
 * Memory: every view in the context's memory, owned by the caller; the library keeps no
 * pointer. Stream: enqueued on the context's stream (CUDA), with no allocation; done on return
 * (CPU). Outputs: untouched on every 1xx and 2xx status; undefined after a 4xx/5xx one.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  ctx, args, parts_out, parts_lse or out is NULL; NULL
 *                                           data; num_parts below 1
 * \retval FLASHATTN_ERROR_INVALID_SHAPE     ranks or sizes that disagree; a size below 1 or past
 *                                           2^31 - 1 (num_parts included)
 * \retval FLASHATTN_ERROR_INVALID_DTYPE     an unknown or integer dtype; out's dtype not
 *                                           parts_out's; an LSE not FLOAT32
 * \retval FLASHATTN_ERROR_INVALID_STRIDE    negative strides (part strides included), a last
 *                                           stride of parts_out or out not 1, an output that
 *                                           overlaps itself, a view past 2^56 bytes
 * \retval FLASHATTN_ERROR_INVALID_MEMORY    a pointer not in the context's memory or not aligned
 *                                           to its elements, a view past its buffer's end, an
 *                                           output sharing memory with anything other than the
 *                                           in-place case above
 * \retval FLASHATTN_ERROR_CONTEXT_BUSY      another thread is using ctx
 * \retval FLASHATTN_ERROR_UNSUPPORTED       FLOAT32 on CUDA; fields of args past those this
 *                                           library knows are set
 * \retval FLASHATTN_ERROR_DEVICE            the launch failed */
FLASHATTN_API flashattn_status_t flashattn_merge(flashattn_context_t ctx,
                                                 const flashattn_merge_args_t *args);

/* ------------------------------------------------------------------------------------------ */
/* Context parallelism (ring attention). The tokens of one sequence (per batch entry) are sharded
 * over `ranks` ranks, each with its own context. Every rank calls flashattn_cp_forward (and later
 * flashattn_cp_backward) with its shard of q, k, v (and of out, lse, dout, dq, dk, dv): the views
 * of a flashattn_args_t, [B, n, heads, d], n the shard's tokens, the same shapes, dtypes and
 * options on every rank. The shards of k and v travel around the ring (rank r sends to r + 1 and
 * receives from r - 1, modulo ranks); each rank attends its queries to each shard as it arrives,
 * the next shard's transfer overlapping this one's attention, and combines the parts by their
 * LSE in fp32 (flashattn_merge's arithmetic), rounding once into out. The backward passes k and
 * v around again; the gradients of each shard's keys travel with it, summed in fp32, and return
 * to their rank.
 *
 * Layout: the global sequence has N = ranks * n tokens (q and k alike: self-attention):
 *  - FLASHATTN_CP_LAYOUT_CONTIGUOUS: rank r holds tokens [r n, (r + 1) n);
 *  - FLASHATTN_CP_LAYOUT_ZIGZAG: N in 2 ranks chunks of n / 2 tokens (n even); rank r holds chunk
 *    r, then chunk 2 ranks - 1 - r. With a causal mask every rank then has the same work (with
 *    CONTIGUOUS, rank r has r + 1 shards' work and the last rank sets the pace).
 * Masks and positions are the global sequence's: causal and the sliding window (diag = 0), with
 * softcap, GQA, d_v != d and sinks as in one call over the whole sequence. lse is the global
 * row's; dsinks is this rank's share (the sum over its rows): sum it over the ranks, as every
 * parameter gradient under context parallelism. ALiBi, variable-length batches and KV caches are
 * FLASHATTN_ERROR_UNSUPPORTED here. With ranks = 1 the calls are flashattn_forward_ex and
 * flashattn_backward_ex.
 *
 * Transport (the caller's; the library has none of its own), one of:
 *  - nccl_comm (CUDA contexts): an ncclComm_t the caller created and owns, of `ranks` ranks, this
 *    rank `rank`, on the context's device (checked). NCCL is not linked: libnccl.so.2 is opened
 *    at the first call (the copy the process loaded to create the communicator). Transfers run on
 *    a stream of the context's own, ordered against the context's stream by events, each
 *    overlapping the attention of the shard before it; the call returns once the work is
 *    enqueued, as flashattn_forward, and may be captured in a CUDA graph.
 *  - exchange (any context; the only one for CPU contexts): a function of the caller's (over
 *    MPI, sockets, shared memory, cudaMemcpy), called as exchange(exchange_user, send, recv,
 *    bytes) from the calling thread once the context's work so far is finished (a CUDA context's
 *    stream synchronized): it sends the `bytes` at send to rank + 1, receives as many from
 *    rank - 1 into recv (both in the workspace, in the context's memory), and returns once both
 *    are done: 0 on success; any other value fails the call with FLASHATTN_ERROR_DEVICE (the
 *    message names the value; out, lse, dq, dk, dv are then undefined). Nothing overlaps, and a
 *    CUDA context's call does not return before its work is done.
 * Ownership: cp and what it points to (the communicator, the exchange and exchange_user) stay
 * the caller's; the library reads them during a call and keeps none of them after it returns
 * (with nccl_comm, the transfers it enqueued use the communicator until they complete). The
 * calls are collective: every rank makes each one, in the same order. Each rank validates
 * its own arguments, and a rank refused before its first transfer leaves the others waiting:
 * call flashattn_cp_workspace_size on every rank first (it examines all a call does but
 * pointers and memory), and agree on the result. */

typedef enum flashattn_cp_layout {
  FLASHATTN_CP_LAYOUT_CONTIGUOUS = 0,
  FLASHATTN_CP_LAYOUT_ZIGZAG = 1
} flashattn_cp_layout_t;

/* Sends `bytes` bytes at send to the next rank and receives as many from the previous rank
 * into recv; returns 0 on success. */
typedef int (*flashattn_cp_exchange_fn)(void *user, const void *send, void *recv, size_t bytes);

typedef struct flashattn_cp_args {
  size_t size;                      /* sizeof(flashattn_cp_args_t) as the caller compiled it;
                                       read as flashattn_args_t is */
  int64_t ranks;                    /* >= 1 (default 1) */
  int64_t rank;                     /* this rank: 0 <= rank < ranks */
  int64_t layout;                   /* a flashattn_cp_layout_t (default CONTIGUOUS) */
  void *nccl_comm;                  /* the ncclComm_t (CUDA contexts), or NULL */
  flashattn_cp_exchange_fn exchange; /* the exchange, or NULL; with ranks > 1 one of the two */
  void *exchange_user;              /* passed to exchange as is */
} flashattn_cp_args_t;

#define FLASHATTN_CP_ARGS_INIT \
  { sizeof(flashattn_cp_args_t), 1, 0, FLASHATTN_CP_LAYOUT_CONTIGUOUS, NULL, NULL, NULL }

/* Fills the first `size` bytes of *out with the defaults (FLASHATTN_CP_ARGS_INIT) and sets
 * out->size = size; `size` is handled as by flashattn_options_init_sized.
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out is NULL; size below the first
 *                                           flashattn_cp_args_t, inside a field or above 4096 */
FLASHATTN_API flashattn_status_t flashattn_cp_args_init_sized(flashattn_cp_args_t *out,
                                                              size_t size);

/* flashattn_cp_args_init(out): fills *out, a flashattn_cp_args_t of this header, with the
 * defaults (no exported function has this name; see flashattn_args_init). */
#define flashattn_cp_args_init(out) flashattn_cp_args_init_sized((out), sizeof(*(out)))

/* The workspace (the context's memory) flashattn_cp_forward (backward = 0) or
 * flashattn_cp_backward (backward = 1) needs: two shards of k and v, the parts and their fp32
 * sums (the backward's: the travelling fp32 gradients of k and v, and dq's sum), and what the
 * calls on each part need. Examines cp and args as the call does, but for data pointers and
 * memory; the transport is not used (an nccl_comm is checked against cp by the calls).
 * \retval FLASHATTN_SUCCESS
 * \retval FLASHATTN_ERROR_INVALID_ARGUMENT  out, ctx, cp or args is NULL; ranks < 1; rank out of
 *                                           range; an unknown layout; with ranks > 1 no transport;
 *                                           both given; nccl_comm on a CPU context
 * \retval FLASHATTN_ERROR_INVALID_SHAPE     q and k of different token counts; ZIGZAG with an odd
 *                                           count
 * \retval FLASHATTN_ERROR_INVALID_*, FLASHATTN_ERROR_UNSUPPORTED  as flashattn_supported_ex
 * \retval FLASHATTN_ERROR_UNSUPPORTED     also for ALiBi, variable-length batches, a KV cache,
 *                                           and cp fields past those this library knows
 * \retval FLASHATTN_ERROR_OUT_OF_MEMORY     the workspace is too large for a size_t */
FLASHATTN_API flashattn_status_t flashattn_cp_workspace_size(size_t *out, flashattn_context_t ctx,
                                                             const flashattn_cp_args_t *cp,
                                                             const flashattn_args_t *args,
                                                             int backward);

/* This rank's part of the context-parallel forward: out and lse (NULL: not wanted) of its
 * queries over the whole sequence. Memory, workspace (the size flashattn_cp_workspace_size
 * answers; NULL and 0: the context's own scratch), stream and output guarantees as
 * flashattn_forward_ex.
 * \retval as flashattn_cp_workspace_size
 * \retval as flashattn_forward_ex
 * \retval FLASHATTN_ERROR_DEVICE  a transfer failed (NCCL's message, or the exchange's value) */
FLASHATTN_API flashattn_status_t flashattn_cp_forward(flashattn_context_t ctx,
                                                      const flashattn_cp_args_t *cp,
                                                      const flashattn_args_t *args,
                                                      void *workspace, size_t workspace_size);

/* This rank's part of the context-parallel backward: dq, dk, dv of its shard (dsinks: its
 * share) from q, k, v, out, lse (the forward's, required) and dout of its shard.
 * \retval as flashattn_cp_forward
 * \retval as flashattn_backward_ex */
FLASHATTN_API flashattn_status_t flashattn_cp_backward(flashattn_context_t ctx,
                                                       const flashattn_cp_args_t *cp,
                                                       const flashattn_args_t *args,
                                                       void *workspace, size_t workspace_size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHATTN_FLASHATTN_H */
