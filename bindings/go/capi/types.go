// Package capi is the C API of libflashattn as SWIG generates it (capi.go, capi_wrap.c, from
// capi.i and the shared bindings/flashattn.i): one Go function per C function, named as in C
// (Flashattn_forward for flashattn_forward). Package flashattn, above it, is the one to use; this
// layer is for tests and for callers that need the C API exactly.
//
// A failing status comes back as an error of type *Error, holding the status and the library's
// message (read in the same C call, so on the thread that set it). The C structs are the Go
// structs Tensor and Options below and Args (args.go), of the same layout; handles are Context
// and Buffer.
package capi

// #cgo pkg-config: flashattn
import "C"

import (
	"strconv"
	"strings"
	"unsafe"
)

// Status is a flashattn_status_t (FLASHATTN_SUCCESS, FLASHATTN_ERROR_*).
type Status int32

// String is the status's name, e.g. "FLASHATTN_ERROR_INVALID_SHAPE".
func (s Status) String() string { return Flashattn_status_string(s) }

// DType is a flashattn_dtype_t (FLASHATTN_DTYPE_*).
type DType int32

// Backend is a flashattn_backend_t (FLASHATTN_BACKEND_*).
type Backend int32

// CPUKernels is a flashattn_cpu_kernels_t (FLASHATTN_CPU_KERNELS_*).
type CPUKernels int32

// Algorithm is a flashattn_algorithm_t (FLASHATTN_ALGORITHM_*).
type Algorithm int32

// Context is a flashattn_context_t; 0 is NULL.
type Context uintptr

// Buffer is a flashattn_buffer_t; 0 is NULL.
type Buffer uintptr

// Tensor is flashattn_tensor_t: a strided view, counted in elements. Data is an address of C
// memory (a flashattn buffer's, or memory of the caller's C or device allocator): the library
// reads it during the call, so it must not be Go memory.
type Tensor struct {
	Data    uintptr
	Dtype   DType
	Rank    int32
	Shape   [FLASHATTN_MAX_RANK]int64
	Strides [FLASHATTN_MAX_RANK]int64
}

// Options is flashattn_options_t; fill it with Flashattn_options_init.
type Options struct {
	Size          uint64
	SoftmaxScale  float32
	Causal        int32
	Algorithm     Algorithm
	Deterministic int32
	Window        int32
	WindowLeft    int32
	WindowRight   int32
	Softcap       float32
	NumSplits     int64
}

// Flashattn_options_init fills o with the defaults, Size included. It is what C's
// flashattn_options_init(&o) macro expands to, flashattn_options_init_sized with the struct's
// size, here the size of Options (which is the header's flashattn_options_t: capi_test.go checks
// the layout), so the library writes exactly the struct Go has.
func Flashattn_options_init(o *Options) error {
	return Flashattn_options_init_sized(o, int64(unsafe.Sizeof(Options{})))
}

// Error is a failing status of the C API and the message flashattn_last_error() gave for it.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string { return e.Status.String() + ": " + e.Message }

// Is makes errors.Is(err, &Error{Status: s}) true for every error of status s.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Status == e.Status
}

// statusError turns the "<status> <message>" string of a failed call (capi.i) into an *Error.
func statusError(s string) error {
	if s == "" {
		return nil
	}
	code, message, _ := strings.Cut(s, " ")
	n, err := strconv.Atoi(code)
	if err != nil {
		return &Error{Status: Status(FLASHATTN_ERROR_INTERNAL), Message: "unreadable status: " + s}
	}
	return &Error{Status: Status(n), Message: message}
}
