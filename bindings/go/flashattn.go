// Package flashattn is the Go binding of libflashattn: exact attention,
// softmax(scale · Q Kᵀ + mask) V, computed the FlashAttention way on the CPU or a CUDA GPU.
//
//	ctx, err := flashattn.NewContext(flashattn.CPU, 0)
//	defer ctx.Close()
//	dims := flashattn.Dims{Batch: 1, SeqLenQ: 16, SeqLenK: 16, HeadsQ: 2, HeadsKV: 2, HeadDim: 8}
//	out, lse, err := ctx.Attention(dims, q, k, v, &flashattn.Options{Causal: true})
//
// Layout: q is [batch, seqlen_q, heads_q, head_dim], k and v [batch, seqlen_k, heads_kv,
// head_dim] (heads_q a multiple of heads_kv), the LSE [batch, heads_q, seqlen_q] float32. Host
// data is []float32, or []uint16 holding float16 or bfloat16 bits (see Float16FromFloat32).
// AttentionEx takes the variants (a sliding window, a softcap, ALiBi, sinks, variable-length
// batches), AttentionKVCache a KV cache, contiguous or paged, that new rows are appended to;
// ForwardEx both, over buffers.
//
// Contexts and buffers are released by Close (a finalizer does it for one that is forgotten).
// A context is used by one goroutine at a time. Every failure is an error; one that the library
// reports is an *Error carrying its status and message. Package capi beneath is the C API as
// SWIG generates it.
package flashattn

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"flashattn.dev/flashattn/capi"
)

// Error is a failing status of the library with its message, e.g. "flashattn_forward: k:
// head_dim 16 differs from q's 32". errors.Is(err, ErrInvalidShape) tests its status.
type Error = capi.Error

// Status is a flashattn_status_t.
type Status = capi.Status

// The statuses of the C API (values fixed by the header).
const (
	StatusSuccess            Status = 0
	StatusInvalidArgument    Status = 100
	StatusInvalidShape       Status = 101
	StatusInvalidDType       Status = 102
	StatusInvalidStride      Status = 103
	StatusInvalidMemory      Status = 104
	StatusWorkspaceTooSmall  Status = 105
	StatusContextBusy        Status = 106
	StatusUnsupported        Status = 200
	StatusBackendUnavailable Status = 201
	StatusOutOfMemory        Status = 300
	StatusDeviceOutOfMemory  Status = 301
	StatusDevice             Status = 400
	StatusInternal           Status = 500
)

// Targets for errors.Is, one per failing status.
var (
	ErrInvalidArgument    = &Error{Status: StatusInvalidArgument}
	ErrInvalidShape       = &Error{Status: StatusInvalidShape}
	ErrInvalidDType       = &Error{Status: StatusInvalidDType}
	ErrInvalidStride      = &Error{Status: StatusInvalidStride}
	ErrInvalidMemory      = &Error{Status: StatusInvalidMemory}
	ErrWorkspaceTooSmall  = &Error{Status: StatusWorkspaceTooSmall}
	ErrContextBusy        = &Error{Status: StatusContextBusy}
	ErrUnsupported        = &Error{Status: StatusUnsupported}
	ErrBackendUnavailable = &Error{Status: StatusBackendUnavailable}
	ErrOutOfMemory        = &Error{Status: StatusOutOfMemory}
	ErrDeviceOutOfMemory  = &Error{Status: StatusDeviceOutOfMemory}
	ErrDevice             = &Error{Status: StatusDevice}
	ErrInternal           = &Error{Status: StatusInternal}
)

// Backend selects where a context computes.
type Backend = capi.Backend

const (
	Auto Backend = 0 // CUDA when a device is usable, else the CPU
	CPU  Backend = 1
	CUDA Backend = 2
)

// CPUKernels names the kernel copy a CPU context computes with (Context.CPUKernels).
type CPUKernels = capi.CPUKernels

const (
	CPUKernelsNone       CPUKernels = 0 // not a CPU context
	CPUKernelsGeneric    CPUKernels = 1 // the target's baseline
	CPUKernelsAVX2       CPUKernels = 2 // AVX2 + FMA
	CPUKernelsAVX512     CPUKernels = 3 // AVX-512 F/VL/BW/DQ
	CPUKernelsAVX512BF16 CPUKernels = 4 // AVX-512 BF16: bf16 products on vdpbf16ps pairs
	CPUKernelsAMX        CPUKernels = 5 // AMX-BF16: bf16 products on tiles
)

// cpuKernelsNames are FLASHATTN_CPU_ISA's names of the copies, by CPUKernels.
var cpuKernelsNames = [...]string{"none", "generic", "avx2", "avx512", "avx512bf16", "amx"}

// CPUKernelsName is the copy's name as FLASHATTN_CPU_ISA spells it ("amx", ...; "none").
func CPUKernelsName(k CPUKernels) string {
	if k >= 0 && int(k) < len(cpuKernelsNames) {
		return cpuKernelsNames[k]
	}
	return fmt.Sprintf("CPUKernels(%d)", int32(k))
}

// DType is an element type.
type DType = capi.DType

const (
	Float32  DType = 1 // CPU backend only
	Float16  DType = 2
	BFloat16 DType = 3
	Int32    DType = 16 // offsets of a variable-length batch, a KV cache's lengths and block table
)

func dtypeSize(t DType) int {
	if t == Float32 || t == Int32 {
		return 4
	}
	return 2
}

// Algorithm selects flash (the default) or standard attention (S and P materialized).
type Algorithm = capi.Algorithm

const (
	Flash    Algorithm = 0
	Standard Algorithm = 1
)

// Version is the loaded library's "MAJOR.MINOR.PATCH".
func Version() string { return capi.Flashattn_version_string() }

// HasCUDA tells whether the loaded library has its CUDA backend compiled in.
func HasCUDA() bool { return capi.Flashattn_has_cuda() != 0 }

// CUDADeviceCount is the number of CUDA devices the library can use (0 without CUDA, driver or
// device).
func CUDADeviceCount() (int, error) {
	var n int32
	err := capi.Flashattn_cuda_device_count(&n)
	return int(n), err
}

// Options of a call; the zero value (or nil) is the default: scale 1/sqrt(head_dim), no mask,
// flash algorithm.
type Options struct {
	Scale         float32 // 0: 1/sqrt(head_dim)
	Causal        bool    // key j masked for query i when j > i + seqlen_k - seqlen_q
	Algorithm     Algorithm
	Deterministic bool    // bit-identical backward results run after run
	Window        *Window // nil: no sliding window
	Softcap       float32 // 0: none; else c > 0: each score s becomes c * tanh(s / c)
	// NumSplits: 0 lets the library choose; n > 0 is the number of parts the flash forward
	// splits each sequence's keys into (CUDA: where it splits them, few query rows against many
	// keys; CPU: every work item's keys), merged by their LSE.
	NumSplits int
}

// Window is a sliding window: query i sees the keys j with i + diag - Left <= j <= i + diag +
// Right, diag = seqlen_k - seqlen_q (bottom-right aligned, as Causal); -1 leaves a side
// unbounded. With Causal the right bound is at most 0.
type Window struct {
	Left, Right int
}

func (o *Options) raw() (*capi.Options, error) {
	r := &capi.Options{}
	if err := capi.Flashattn_options_init(r); err != nil {
		return nil, err
	}
	if err := o.fill(r); err != nil {
		return nil, err
	}
	return r, nil
}

// fill writes the options into r (initialized by Flashattn_options_init).
func (o *Options) fill(r *capi.Options) error {
	if o != nil && o.Window != nil {
		for _, side := range []struct {
			name string
			v    int
		}{{"Left", o.Window.Left}, {"Right", o.Window.Right}} {
			if side.v < math.MinInt32 || side.v > math.MaxInt32 {
				return &Error{Status: StatusInvalidArgument,
					Message: fmt.Sprintf("options: Window.%s is %d, beyond the 32 bits of the C field", side.name, side.v)}
			}
		}
		r.Window, r.WindowLeft, r.WindowRight = 1, int32(o.Window.Left), int32(o.Window.Right)
	}
	if o != nil {
		r.NumSplits = int64(o.NumSplits)
		r.Softcap = o.Softcap
		r.SoftmaxScale = o.Scale
		r.Algorithm = o.Algorithm
		if o.Causal {
			r.Causal = 1
		}
		if o.Deterministic {
			r.Deterministic = 1
		}
	}
	return nil
}

// Context binds one backend and device. It is used by one goroutine at a time. (Every method
// keeps the Context reachable until the library returns, so that its finalizer cannot run
// during a call.)
type Context struct {
	h capi.Context
}

// NewContext creates a context for backend (and, for CUDA, device). Close it when done.
func NewContext(backend Backend, device int) (*Context, error) {
	var h capi.Context
	if err := capi.Flashattn_context_create(&h, backend, device); err != nil {
		return nil, err
	}
	c := &Context{h: h}
	runtime.SetFinalizer(c, (*Context).Close)
	return c, nil
}

// Close destroys the context (waiting for its work). Buffers created from it stay usable until
// they are closed. Closing twice is a no-op.
func (c *Context) Close() error {
	if c == nil || c.h == 0 {
		return nil
	}
	h := c.h
	c.h = 0
	runtime.SetFinalizer(c, nil)
	return capi.Flashattn_context_destroy(h)
}

// Backend is the backend the context runs on (Auto resolved).
func (c *Context) Backend() (Backend, error) {
	defer runtime.KeepAlive(c)
	var b Backend
	err := capi.Flashattn_context_get_backend(&b, c.h)
	return b, err
}

// Device is the CUDA device ordinal, -1 for a CPU context.
func (c *Context) Device() (int, error) {
	defer runtime.KeepAlive(c)
	var d int32
	err := capi.Flashattn_context_get_device(&d, c.h)
	return int(d), err
}

// CPUKernels is the kernel copy a CPU context computes with, chosen for this CPU at creation
// and capped by FLASHATTN_CPU_ISA; CPUKernelsNone for a CUDA context.
func (c *Context) CPUKernels() (CPUKernels, error) {
	defer runtime.KeepAlive(c)
	var k CPUKernels
	err := capi.Flashattn_context_get_cpu_kernels(&k, c.h)
	return k, err
}

// SetStream makes later work run on a cudaStream_t of the caller's (0: the context's own).
func (c *Context) SetStream(stream uintptr) error {
	defer runtime.KeepAlive(c)
	return capi.Flashattn_context_set_stream(c.h, stream)
}

// Stream is the cudaStream_t work is enqueued on (0 for a CPU context).
func (c *Context) Stream() (uintptr, error) {
	defer runtime.KeepAlive(c)
	var s uintptr
	err := capi.Flashattn_context_get_stream(&s, c.h)
	return s, err
}

// SetNumThreads sets the threads of a CPU context (0: one per hardware thread).
func (c *Context) SetNumThreads(n int) error {
	defer runtime.KeepAlive(c)
	return capi.Flashattn_context_set_num_threads(c.h, n)
}

// Synchronize waits for the work enqueued on the context's stream.
func (c *Context) Synchronize() error {
	defer runtime.KeepAlive(c)
	return capi.Flashattn_context_synchronize(c.h)
}

// Buffer is memory of a context: device memory for CUDA, host memory for the CPU.
type Buffer struct {
	h    capi.Buffer
	size int
	ptr  uintptr
}

// NewBuffer allocates bytes (> 0) of the context's memory (contents undefined). Close it.
func (c *Context) NewBuffer(bytes int) (*Buffer, error) {
	defer runtime.KeepAlive(c)
	var h capi.Buffer
	if err := capi.Flashattn_buffer_create(&h, c.h, int64(bytes)); err != nil {
		return nil, err
	}
	var ptr uintptr
	if err := capi.Flashattn_buffer_data(&ptr, h); err != nil {
		capi.Flashattn_buffer_destroy(h)
		return nil, err
	}
	b := &Buffer{h: h, size: bytes, ptr: ptr}
	runtime.SetFinalizer(b, (*Buffer).Close)
	return b, nil
}

// Close frees the buffer once the work enqueued on its context is done. Closing twice is a
// no-op.
func (b *Buffer) Close() error {
	if b == nil || b.h == 0 {
		return nil
	}
	h := b.h
	b.h, b.ptr = 0, 0
	runtime.SetFinalizer(b, nil)
	return capi.Flashattn_buffer_destroy(h)
}

// Size is the buffer's size in bytes.
func (b *Buffer) Size() int { return b.size }

// Ptr is the buffer's address (device memory for a CUDA context); 0 once closed.
func (b *Buffer) Ptr() uintptr { return b.ptr }

// Write copies src to the buffer at byte offset.
func (b *Buffer) Write(offset int, src []byte) error {
	err := capi.Flashattn_buffer_write(b.h, int64(offset), src)
	runtime.KeepAlive(b)
	return err
}

// Read copies from the buffer at byte offset into dst.
func (b *Buffer) Read(offset int, dst []byte) error {
	err := capi.Flashattn_buffer_read(b.h, int64(offset), dst)
	runtime.KeepAlive(b)
	return err
}

func asBytes[T float32 | uint16 | int32](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// WriteFloat32 copies src to the start of the buffer.
func (b *Buffer) WriteFloat32(src []float32) error { return b.Write(0, asBytes(src)) }

// ReadFloat32 fills dst from the start of the buffer.
func (b *Buffer) ReadFloat32(dst []float32) error { return b.Read(0, asBytes(dst)) }

// WriteInt32 copies src (e.g. sequence offsets) to the start of the buffer.
func (b *Buffer) WriteInt32(src []int32) error { return b.Write(0, asBytes(src)) }

// WriteUint16 copies src (float16 or bfloat16 bits) to the start of the buffer.
func (b *Buffer) WriteUint16(src []uint16) error { return b.Write(0, asBytes(src)) }

// ReadUint16 fills dst (float16 or bfloat16 bits) from the start of the buffer.
func (b *Buffer) ReadUint16(dst []uint16) error { return b.Read(0, asBytes(dst)) }

// Tensor is a view of a buffer: Shape [batch, seqlen, heads, head_dim] (the LSE: [batch, heads,
// seqlen]; a variable-length batch: [total_tokens, heads, head_dim] and [heads, total_q]) and
// Strides counted in elements (nil: contiguous), starting Offset bytes into Buffer.
type Tensor struct {
	Buffer  *Buffer
	Offset  int
	DType   DType
	Shape   []int64
	Strides []int64
}

// View is a contiguous view of the buffer from its start.
func (b *Buffer) View(dtype DType, shape ...int64) Tensor {
	return Tensor{Buffer: b, DType: dtype, Shape: shape}
}

func (t *Tensor) raw(name string) (*capi.Tensor, error) {
	rank := len(t.Shape)
	if rank > capi.FLASHATTN_MAX_RANK {
		return nil, &Error{Status: StatusInvalidShape,
			Message: fmt.Sprintf("%s: rank is %d, at most %d is possible", name, rank, capi.FLASHATTN_MAX_RANK)}
	}
	if t.Strides != nil && len(t.Strides) != rank {
		return nil, &Error{Status: StatusInvalidShape,
			Message: fmt.Sprintf("%s: %d strides for %d dimensions", name, len(t.Strides), rank)}
	}
	r := &capi.Tensor{Dtype: t.DType, Rank: int32(rank)}
	if t.Buffer != nil && t.Buffer.ptr != 0 {
		// Inside the buffer, the library checks the view against its end; outside, host memory
		// of a CPU context could not be checked at all.
		if t.Offset < 0 || t.Offset >= t.Buffer.size {
			return nil, &Error{Status: StatusInvalidMemory,
				Message: fmt.Sprintf("%s: offset %d is outside the %d-byte buffer", name, t.Offset, t.Buffer.size)}
		}
		r.Data = t.Buffer.ptr + uintptr(t.Offset)
	}
	stride := int64(1)
	for i := rank - 1; i >= 0; i-- {
		r.Shape[i] = t.Shape[i]
		if t.Strides != nil {
			r.Strides[i] = t.Strides[i]
		} else {
			r.Strides[i] = stride
			stride *= t.Shape[i]
		}
	}
	return r, nil
}

func raws(names []string, ts []*Tensor) ([]*capi.Tensor, error) {
	out := make([]*capi.Tensor, len(ts))
	for i, t := range ts {
		if t == nil {
			continue
		}
		r, err := t.raw(names[i])
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	return out, nil
}

func keepAlive(ts []*Tensor) {
	for _, t := range ts {
		if t != nil {
			runtime.KeepAlive(t.Buffer)
		}
	}
}

// Forward computes out = attention(q, k, v) and, when lse is not nil, the log-sum-exp of each
// row. On a CUDA context it is enqueued on the context's stream.
func (c *Context) Forward(q, k, v, out Tensor, lse *Tensor, opts *Options) error {
	ts := []*Tensor{&q, &k, &v, &out, lse}
	r, err := raws([]string{"q", "k", "v", "out", "lse"}, ts)
	if err != nil {
		return err
	}
	o, err := opts.raw()
	if err != nil {
		return err
	}
	err = capi.Flashattn_forward(c.h, r[0], r[1], r[2], r[3], r[4], o, 0, 0)
	keepAlive(ts)
	runtime.KeepAlive(c)
	return err
}

// Backward computes dq, dk and dv from the forward's q, k, v, out and lse and the gradient dout.
// opts must be the forward's.
func (c *Context) Backward(q, k, v, out, dout, lse, dq, dk, dv Tensor, opts *Options) error {
	ts := []*Tensor{&q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv}
	r, err := raws([]string{"q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv"}, ts)
	if err != nil {
		return err
	}
	o, err := opts.raw()
	if err != nil {
		return err
	}
	err = capi.Flashattn_backward(c.h, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], o, 0, 0)
	keepAlive(ts)
	runtime.KeepAlive(c)
	return err
}

// Supported returns nil when the context can run this configuration (the backward too when
// backward is set), an error saying why not otherwise.
func (c *Context) Supported(q, k, v Tensor, opts *Options, backward bool) error {
	_, err := c.query(q, k, v, opts, backward, false)
	return err
}

// WorkspaceSize is the scratch memory a call needs (the context allocates and keeps it).
func (c *Context) WorkspaceSize(q, k, v Tensor, opts *Options, backward bool) (int, error) {
	return c.query(q, k, v, opts, backward, true)
}

func (c *Context) query(q, k, v Tensor, opts *Options, backward, size bool) (int, error) {
	defer runtime.KeepAlive(c)
	r, err := raws([]string{"q", "k", "v"}, []*Tensor{&q, &k, &v})
	if err != nil {
		return 0, err
	}
	o, err := opts.raw()
	if err != nil {
		return 0, err
	}
	flag := 0
	if backward {
		flag = 1
	}
	if !size {
		return 0, capi.Flashattn_supported(c.h, r[0], r[1], r[2], o, flag)
	}
	var n uint64
	err = capi.Flashattn_workspace_size(&n, c.h, r[0], r[1], r[2], o, flag)
	return int(n), err
}

// Args are the tensors of one call, as flashattn_args_t names them, for ForwardEx, BackwardEx,
// SupportedEx and WorkspaceSizeEx: they take the variants that need tensors of their own, and
// the KV cache. ForwardEx reads Q, K, V and the variants and writes Out and LSE (nil: not
// wanted), and K and V too when KNew appends rows to a cache; BackwardEx also reads Out, LSE and
// DOut and writes DQ, DK, DV and DSinks (nil: not wanted), so one Args can serve a forward and
// then its backward. A nil tensor is NULL.
type Args struct {
	Q, K, V, Out, LSE, DOut, DQ, DK, DV *Tensor
	// AlibiSlopes: Float32 [HeadsQ] or [Batch, HeadsQ]; slope_h * |i + diag - j| is subtracted
	// from each score.
	AlibiSlopes *Tensor
	// Sinks: Float32 [HeadsQ], one logit per head in every row's softmax denominator; DSinks
	// (Float32 [HeadsQ]) receives its gradient.
	Sinks, DSinks *Tensor
	// CuSeqlensQ, CuSeqlensK: Int32 [Batch + 1], the offsets of a variable-length batch (both or
	// neither): the other tensors are then [total_tokens, heads, head_dim], the LSE [HeadsQ,
	// total_q]. MaxSeqlenQ and MaxSeqlenK bound every sequence's length.
	CuSeqlensQ, CuSeqlensK *Tensor
	MaxSeqlenQ, MaxSeqlenK int
	Options                *Options
	// CacheSeqlens (forward only): Int32 [Batch], the tokens each sequence holds in K and V,
	// which are then a KV cache (the header's "KV cache"): contiguous, [Batch, capacity,
	// HeadsKV, HeadDim], or, with BlockTable (Int32 [Batch, pages per sequence]: the page of
	// each block of page_size tokens), paged, [pages, page_size, HeadsKV, HeadDim]. The queries
	// are each sequence's last tokens. nil: no cache.
	CacheSeqlens, BlockTable *Tensor
	// KNew, VNew: [Batch, N_new, HeadsKV, HeadDim] and [..., HeadDimV], written into the cache
	// as tokens CacheSeqlens[b] onwards before attending (K and V are written in place;
	// CacheSeqlens is not updated).
	KNew, VNew *Tensor
	// RotaryCos, RotarySin: [positions, R / 2] (Float32 or Q's dtype), a rotary embedding of
	// the first R features of Q and KNew; RotaryInterleaved pairs features (2r, 2r + 1)
	// (GPT-J) instead of (r, r + R / 2) (GPT-NeoX).
	RotaryCos, RotarySin *Tensor
	RotaryInterleaved    bool
}

func (a *Args) tensors() []*Tensor {
	return []*Tensor{a.Q, a.K, a.V, a.Out, a.LSE, a.DOut, a.DQ, a.DK, a.DV, a.AlibiSlopes, a.Sinks,
		a.DSinks, a.CuSeqlensQ, a.CuSeqlensK, a.CacheSeqlens, a.BlockTable, a.KNew, a.VNew,
		a.RotaryCos, a.RotarySin}
}

// argsNames are the C names of tensors(), in the order of capi's ArgTensor fields.
var argsNames = []string{"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv", "alibi_slopes",
	"sinks", "dsinks", "cu_seqlens_q", "cu_seqlens_k", "cache_seqlens", "block_table", "k_new",
	"v_new", "rotary_cos", "rotary_sin"}

// withArgs builds a's flashattn_args_t in C memory and calls fn with it.
func withArgs(a *Args, fn func(*capi.Args) error) error {
	if a == nil {
		a = &Args{}
	}
	block, err := capi.NewArgsBlock()
	if err != nil {
		return err
	}
	defer block.Free()
	ts := a.tensors()
	raw, err := raws(argsNames, ts)
	if err != nil {
		return err
	}
	for i, r := range raw {
		block.SetTensor(capi.ArgTensor(i), r)
	}
	if err := a.Options.fill(block.Options()); err != nil {
		return err
	}
	block.Args().MaxSeqlenQ, block.Args().MaxSeqlenK = int64(a.MaxSeqlenQ), int64(a.MaxSeqlenK)
	block.Args().RotaryInterleaved = int64(boolFlag(a.RotaryInterleaved))
	err = fn(block.Args())
	keepAlive(ts)
	return err
}

// ForwardEx is Forward for Args: out and, when a.LSE is set, the log-sum-exp, with every
// variant a sets (its options too), over a KV cache when a.CacheSeqlens is set (appending
// a.KNew and a.VNew into a.K and a.V first). On a CUDA context it is enqueued on the context's
// stream.
func (c *Context) ForwardEx(a *Args) error {
	defer runtime.KeepAlive(c)
	return withArgs(a, func(r *capi.Args) error { return capi.Flashattn_forward_ex(c.h, r, 0, 0) })
}

// BackwardEx is Backward for Args: dq, dk, dv, and dsinks when a.DSinks is set. Everything but
// the gradients must be the forward's.
func (c *Context) BackwardEx(a *Args) error {
	defer runtime.KeepAlive(c)
	return withArgs(a, func(r *capi.Args) error { return capi.Flashattn_backward_ex(c.h, r, 0, 0) })
}

// SupportedEx is Supported for Args (shapes, dtypes, strides, options and lengths; no data is
// read).
func (c *Context) SupportedEx(a *Args, backward bool) error {
	defer runtime.KeepAlive(c)
	return withArgs(a, func(r *capi.Args) error { return capi.Flashattn_supported_ex(c.h, r, boolFlag(backward)) })
}

// WorkspaceSizeEx is WorkspaceSize for Args.
func (c *Context) WorkspaceSizeEx(a *Args, backward bool) (int, error) {
	defer runtime.KeepAlive(c)
	var n uint64
	err := withArgs(a, func(r *capi.Args) error {
		return capi.Flashattn_workspace_size_ex(&n, c.h, r, boolFlag(backward))
	})
	return int(n), err
}

func boolFlag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Parts are the partial results that Merge combines: attention over parts of the keys, part p's
// output normalized over that part's keys, and its LSE. They are one strided view with a
// leading parts dimension, given as part 0's views and the element strides from one part to the
// next (PartsBackToBack lays them one after another).
type Parts struct {
	Count int // the number of parts, >= 1
	// Out is part 0's output [batch, seqlen, heads, head_dim] (a variable-length batch:
	// [total_tokens, heads, head_dim]); OutStride the elements from one part's output to the
	// next's.
	Out       Tensor
	OutStride int64
	// LSE is part 0's Float32 LSE [batch, heads, seqlen] ([heads, total_tokens]); LSEStride the
	// elements from one part's LSE to the next's.
	LSE       Tensor
	LSEStride int64
}

// PartsBackToBack are count parts one after another from the start of out's and lse's views,
// which must be contiguous (no Strides).
func PartsBackToBack(count int, out, lse Tensor) Parts {
	return Parts{Count: count, Out: out, OutStride: int64(elements(out.Shape)), LSE: lse,
		LSEStride: int64(elements(lse.Shape))}
}

// Merge combines the parts by their LSE into out (part 0's shape and dtype) and, when lse is not
// nil, the merged LSE: lse = log(sum_p exp(lse_p)), out = sum_p exp(lse_p - lse) out_p, in
// float32, rounded once. A part whose LSE is -inf adds nothing; a row whose parts are all -inf
// gets 0 and -inf; a NaN LSE makes its row NaN, +inf gives LSE +inf and a NaN output. out and
// lse may be one part's own views (in place); nothing else may overlap the parts. On a CUDA
// context it is enqueued on the context's stream.
func (c *Context) Merge(p Parts, out Tensor, lse *Tensor) error {
	ts := []*Tensor{&p.Out, &p.LSE, &out, lse}
	r, err := raws([]string{"parts_out", "parts_lse", "out", "lse"}, ts)
	if err != nil {
		return err
	}
	block, err := capi.NewMergeBlock()
	if err != nil {
		return err
	}
	defer block.Free()
	for i, t := range r {
		block.SetTensor(capi.MergeTensor(i), t)
	}
	a := block.Args()
	a.NumParts, a.PartsOutStride, a.PartsLseStride = int64(p.Count), p.OutStride, p.LSEStride
	err = capi.Flashattn_merge(c.h, a)
	keepAlive(ts)
	runtime.KeepAlive(c)
	return err
}
