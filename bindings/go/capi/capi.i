/*
 * The Go side of the SWIG interface: package capi (flashattn.dev/flashattn/capi), the low layer
 * under package flashattn. capi.go and capi_wrap.c are generated from this file by
 * bindings/go/generate.sh (swig -go -cgo -intgosize 64) and checked in, so building the module
 * needs no swig; the test step checks that regenerating them changes nothing.
 *
 * How the C API looks from here:
 *  - A function returning a flashattn_status_t returns an error: nil on success, else an *Error
 *    holding the status and the library's message. Go has no exceptions, so the shared
 *    %exception has nothing to raise (FLASHATTN_SWIG_RAISE is empty): the status's out typemap
 *    below reads flashattn_last_error() in the same C call, on the thread that made it.
 *  - flashattn_tensor_t, flashattn_options_t, flashattn_args_t, flashattn_merge_args_t and
 *    flashattn_cp_args_t are the Go structs Tensor, Options, Args, MergeArgs and CpArgs of the
 *    same layout (types.go, args.go;
 *    capi_test.go checks it), passed by pointer; nil is NULL. An Args or a MergeArgs holds C
 *    addresses and lives in C memory (ArgsBlock, MergeBlock).
 *  - Handles are the types Context and Buffer; void * is uintptr; output parameters are Go
 *    pointers; host memory to copy from or to is a []byte.
 */
%module capi

%{
#include <stdio.h>
#include <stddef.h>
#include <string.h>

#include <flashattn/flashattn.h>

#define FLASHATTN_SWIG_RAISE(status) do { } while (0)
%}

/* ---- statuses: error values ---- */
%typemap(gotype) flashattn_status_t "error"
%typemap(imtype) flashattn_status_t "string"
%typemap(out, fragment="AllocateString") flashattn_status_t %{
  if ($1 == FLASHATTN_SUCCESS) {
    $result = Swig_AllocateString("", 0);
  } else {
    /* "<status> <message>", parsed by statusError (types.go) */
    char text[1100];
    int n = snprintf(text, sizeof text, "%d %s", (int)$1, flashattn_last_error());
    $result = Swig_AllocateString(text, n < 0 ? 0 : (size_t)n < sizeof text ? (size_t)n : sizeof text - 1);
  }
%}
%typemap(goout, fragment="CopyString") flashattn_status_t %{ $result = statusError(swigCopyString($1)) %}

/* flashattn_status_string's argument stays a plain status. */
%typemap(gotype) flashattn_status_t status "Status"
%typemap(imtype) flashattn_status_t status "int"
%typemap(goin) flashattn_status_t status "$result = int($input)"
%typemap(in) flashattn_status_t status %{ $1 = (flashattn_status_t)$input; %}

/* ---- enums: the Go types of types.go ---- */
%define FLASHATTN_GO_ENUM(CTYPE, GOTYPE)
%typemap(gotype) CTYPE "GOTYPE"
%typemap(imtype) CTYPE "int"
%typemap(goin) CTYPE "$result = int($input)"
%typemap(in) CTYPE %{ $1 = (CTYPE)$input; %}
%enddef
FLASHATTN_GO_ENUM(flashattn_backend_t, Backend)
FLASHATTN_GO_ENUM(flashattn_cpu_kernels_t, CPUKernels)
FLASHATTN_GO_ENUM(flashattn_dtype_t, DType)

/* ---- handles ---- */
%define FLASHATTN_GO_HANDLE(CTYPE, GOTYPE)
%typemap(gotype) CTYPE "GOTYPE"
%typemap(imtype) CTYPE "uintptr"
%typemap(goin) CTYPE "$result = uintptr($input)"
%typemap(in) CTYPE %{ $1 = (CTYPE)$input; %}
%enddef
FLASHATTN_GO_HANDLE(flashattn_context_t, Context)
FLASHATTN_GO_HANDLE(flashattn_buffer_t, Buffer)

/* ---- pointers to Go memory: output parameters and the two structs ---- */
%define FLASHATTN_GO_POINTER(CTYPE, GOTYPE)
%typemap(gotype) CTYPE "GOTYPE"
%typemap(imtype) CTYPE "unsafe.Pointer"
%typemap(goin) CTYPE "$result = unsafe.Pointer($input)"
%typemap(in) CTYPE %{ $1 = ($1_ltype)$input; %}
%enddef
FLASHATTN_GO_POINTER(flashattn_context_t *out, *Context)
FLASHATTN_GO_POINTER(flashattn_buffer_t *out, *Buffer)
FLASHATTN_GO_POINTER(flashattn_backend_t *out, *Backend)
FLASHATTN_GO_POINTER(flashattn_cpu_kernels_t *out, *CPUKernels)
FLASHATTN_GO_POINTER(int *out, *int32)
FLASHATTN_GO_POINTER(size_t *out, *uint64)
FLASHATTN_GO_POINTER(void **out, *uintptr)
FLASHATTN_GO_POINTER(flashattn_tensor_t *, *Tensor)
FLASHATTN_GO_POINTER(const flashattn_tensor_t *, *Tensor)
FLASHATTN_GO_POINTER(flashattn_options_t *, *Options)
FLASHATTN_GO_POINTER(const flashattn_options_t *, *Options)
FLASHATTN_GO_POINTER(flashattn_args_t *, *Args)
FLASHATTN_GO_POINTER(const flashattn_args_t *, *Args)
FLASHATTN_GO_POINTER(flashattn_merge_args_t *, *MergeArgs)
FLASHATTN_GO_POINTER(const flashattn_merge_args_t *, *MergeArgs)
FLASHATTN_GO_POINTER(const flashattn_cp_args_t *, *CpArgs)
FLASHATTN_GO_POINTER(flashattn_cp_args_t *, *CpArgs)

/* ---- host memory: byte slices ---- */
%typemap(gotype) (const void *src, size_t bytes), (void *dst, size_t bytes), (char *buf, size_t len) "[]byte"
%typemap(in) (const void *src, size_t bytes), (void *dst, size_t bytes), (char *buf, size_t len)
%{ $1 = ($1_ltype)$input.array; $2 = (size_t)$input.len; %}

/* The structs are Go structs (types.go, args.go), not SWIG proxies. */
%ignore flashattn_tensor;
%ignore flashattn_options;
%ignore flashattn_args;
%ignore flashattn_merge_args;
%ignore flashattn_cp_args;

%include "../../flashattn.i"

/* The C layout of the structs, for layout_test.go. */
%constant int64_t SizeofTensor = sizeof(flashattn_tensor_t);
%constant int64_t OffsetofTensorDtype = offsetof(flashattn_tensor_t, dtype);
%constant int64_t OffsetofTensorRank = offsetof(flashattn_tensor_t, rank);
%constant int64_t OffsetofTensorShape = offsetof(flashattn_tensor_t, shape);
%constant int64_t OffsetofTensorStrides = offsetof(flashattn_tensor_t, strides);
%constant int64_t SizeofOptions = sizeof(flashattn_options_t);
%constant int64_t OffsetofOptionsSoftmaxScale = offsetof(flashattn_options_t, softmax_scale);
%constant int64_t OffsetofOptionsCausal = offsetof(flashattn_options_t, causal);
%constant int64_t OffsetofOptionsAlgorithm = offsetof(flashattn_options_t, algorithm);
%constant int64_t OffsetofOptionsDeterministic = offsetof(flashattn_options_t, deterministic);
%constant int64_t OffsetofOptionsWindow = offsetof(flashattn_options_t, window);
%constant int64_t OffsetofOptionsWindowLeft = offsetof(flashattn_options_t, window_left);
%constant int64_t OffsetofOptionsWindowRight = offsetof(flashattn_options_t, window_right);
%constant int64_t OffsetofOptionsSoftcap = offsetof(flashattn_options_t, softcap);
%constant int64_t OffsetofOptionsNumSplits = offsetof(flashattn_options_t, num_splits);
%constant int64_t SizeofArgs = sizeof(flashattn_args_t);
%constant int64_t OffsetofArgsOptions = offsetof(flashattn_args_t, options);
%constant int64_t OffsetofArgsQ = offsetof(flashattn_args_t, q);
%constant int64_t OffsetofArgsDv = offsetof(flashattn_args_t, dv);
%constant int64_t OffsetofArgsAlibiSlopes = offsetof(flashattn_args_t, alibi_slopes);
%constant int64_t OffsetofArgsSinks = offsetof(flashattn_args_t, sinks);
%constant int64_t OffsetofArgsDsinks = offsetof(flashattn_args_t, dsinks);
%constant int64_t OffsetofArgsCuSeqlensQ = offsetof(flashattn_args_t, cu_seqlens_q);
%constant int64_t OffsetofArgsCuSeqlensK = offsetof(flashattn_args_t, cu_seqlens_k);
%constant int64_t OffsetofArgsMaxSeqlenQ = offsetof(flashattn_args_t, max_seqlen_q);
%constant int64_t OffsetofArgsMaxSeqlenK = offsetof(flashattn_args_t, max_seqlen_k);
%constant int64_t OffsetofArgsCacheSeqlens = offsetof(flashattn_args_t, cache_seqlens);
%constant int64_t OffsetofArgsBlockTable = offsetof(flashattn_args_t, block_table);
%constant int64_t OffsetofArgsKNew = offsetof(flashattn_args_t, k_new);
%constant int64_t OffsetofArgsVNew = offsetof(flashattn_args_t, v_new);
%constant int64_t OffsetofArgsRotaryCos = offsetof(flashattn_args_t, rotary_cos);
%constant int64_t OffsetofArgsRotarySin = offsetof(flashattn_args_t, rotary_sin);
%constant int64_t OffsetofArgsRotaryInterleaved = offsetof(flashattn_args_t, rotary_interleaved);
%constant int64_t SizeofMergeArgs = sizeof(flashattn_merge_args_t);
%constant int64_t OffsetofMergeArgsNumParts = offsetof(flashattn_merge_args_t, num_parts);
%constant int64_t OffsetofMergeArgsPartsOut = offsetof(flashattn_merge_args_t, parts_out);
%constant int64_t OffsetofMergeArgsPartsOutStride = offsetof(flashattn_merge_args_t, parts_out_stride);
%constant int64_t OffsetofMergeArgsPartsLse = offsetof(flashattn_merge_args_t, parts_lse);
%constant int64_t OffsetofMergeArgsPartsLseStride = offsetof(flashattn_merge_args_t, parts_lse_stride);
%constant int64_t OffsetofMergeArgsOut = offsetof(flashattn_merge_args_t, out);
%constant int64_t OffsetofMergeArgsLse = offsetof(flashattn_merge_args_t, lse);
%constant int64_t SizeofCpArgs = sizeof(flashattn_cp_args_t);
%constant int64_t OffsetofCpArgsRanks = offsetof(flashattn_cp_args_t, ranks);
%constant int64_t OffsetofCpArgsRank = offsetof(flashattn_cp_args_t, rank);
%constant int64_t OffsetofCpArgsLayout = offsetof(flashattn_cp_args_t, layout);
%constant int64_t OffsetofCpArgsNcclComm = offsetof(flashattn_cp_args_t, nccl_comm);
%constant int64_t OffsetofCpArgsExchange = offsetof(flashattn_cp_args_t, exchange);
%constant int64_t OffsetofCpArgsExchangeUser = offsetof(flashattn_cp_args_t, exchange_user);
