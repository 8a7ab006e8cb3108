/*
 * flashattn.i: the one SWIG interface of libflashattn, over the public header only
 * (include/flashattn/flashattn.h). The Python and Go bindings include it from a thin file of
 * their own (bindings/python/flashattn_swig.i, bindings/go/capi/capi.i), which first defines
 *
 *   FLASHATTN_SWIG_RAISE(status)   C code run inside the wrapper when a call failed: it turns
 *                                  the status and flashattn_last_error() into the language's
 *                                  error (Python: raises flashattn.Error; Go: the wrapper's
 *                                  out typemap returns an error value, see capi.i)
 *
 * and its language's typemaps for output parameters, handles and raw memory.
 */

%{
#include <flashattn/flashattn.h>
%}

%include <stdint.i>

/* FLASHATTN_API is an export attribute; it means nothing to a wrapper. */
#define __attribute__(x)

/* Every function returning a flashattn_status_t: a failing status becomes the language's error.
 * The message is read right after the call, in the same wrapper, so on the same thread as the
 * call that set it (it is thread-local). The status, never the message, says whether it failed. */
%exception {
  $action
  if (result != FLASHATTN_SUCCESS) {
    FLASHATTN_SWIG_RAISE(result);
  }
}
/* Functions that return something other than a status, and the structs' accessors. */
%noexception flashattn_version_number;
%noexception flashattn_version_string;
%noexception flashattn_has_cuda;
%noexception flashattn_status_string;
%noexception flashattn_last_error;
%noexception flashattn_last_error_r;
%noexception flashattn_tensor;
%noexception flashattn_options;
%noexception flashattn_tensor::~flashattn_tensor;
%noexception flashattn_options::~flashattn_options;
%noexception flashattn_tensor::data;
%noexception flashattn_tensor::dtype;
%noexception flashattn_tensor::rank;
%noexception flashattn_tensor::shape;
%noexception flashattn_tensor::strides;
%noexception flashattn_options::size;
%noexception flashattn_options::softmax_scale;
%noexception flashattn_options::causal;
%noexception flashattn_options::algorithm;
%noexception flashattn_options::deterministic;
%noexception flashattn_options::window;
%noexception flashattn_options::window_left;
%noexception flashattn_options::window_right;
%noexception flashattn_options::softcap;
%noexception flashattn_options::num_splits;
%noexception flashattn_args;
%noexception flashattn_args::~flashattn_args;
%noexception flashattn_args::size;
%noexception flashattn_args::options;
%noexception flashattn_args::q;
%noexception flashattn_args::k;
%noexception flashattn_args::v;
%noexception flashattn_args::out;
%noexception flashattn_args::lse;
%noexception flashattn_args::dout;
%noexception flashattn_args::dq;
%noexception flashattn_args::dk;
%noexception flashattn_args::dv;
%noexception flashattn_args::alibi_slopes;
%noexception flashattn_args::sinks;
%noexception flashattn_args::dsinks;
%noexception flashattn_args::cu_seqlens_q;
%noexception flashattn_args::cu_seqlens_k;
%noexception flashattn_args::max_seqlen_q;
%noexception flashattn_args::max_seqlen_k;
%noexception flashattn_merge_args;
%noexception flashattn_merge_args::~flashattn_merge_args;
%noexception flashattn_merge_args::size;
%noexception flashattn_merge_args::num_parts;
%noexception flashattn_merge_args::parts_out;
%noexception flashattn_merge_args::parts_out_stride;
%noexception flashattn_merge_args::parts_lse;
%noexception flashattn_merge_args::parts_lse_stride;
%noexception flashattn_merge_args::out;
%noexception flashattn_merge_args::lse;
%noexception flashattn_cp_args;
%noexception flashattn_cp_args::~flashattn_cp_args;
%noexception flashattn_cp_args::size;
%noexception flashattn_cp_args::ranks;
%noexception flashattn_cp_args::rank;
%noexception flashattn_cp_args::layout;
%noexception flashattn_cp_args::nccl_comm;
%noexception flashattn_cp_args::exchange_user;

/* 0 or 1 depending on how the library was built, so a generated binding would depend on the
 * build too: callers ask the loaded library with flashattn_has_cuda(). */
%ignore FLASHATTN_HAS_CUDA;
/* C initializer lists, not values. Nor are flashattn_options_init(out), flashattn_args_init(out)
 * and flashattn_merge_args_init(out) wrapped: they are function-like macros passing sizeof(*out) to flashattn_options_init_sized and
 * flashattn_args_init_sized, and SWIG wraps no such macro. Each binding calls the _sized
 * functions with the size of the struct it was compiled with (its own counterpart of the macros:
 * Python's flashattn_swig.flashattn_options_init, Go's capi.Flashattn_options_init), so the
 * library never writes past a binding's struct nor reads a field the binding does not have. */
%ignore FLASHATTN_OPTIONS_INIT;
%ignore FLASHATTN_ARGS_INIT;
%ignore FLASHATTN_MERGE_ARGS_INIT;

/* Context parallelism: the struct's exchange is a C function pointer called back from the
 * library, which no binding makes from its own language (a binding passes nccl_comm, or leaves
 * both NULL for one rank). */
%ignore flashattn_cp_exchange_fn;
%ignore flashattn_cp_args::exchange;
%ignore FLASHATTN_CP_ARGS_INIT;

%include <flashattn/version.h>
%include <flashattn/flashattn.h>
