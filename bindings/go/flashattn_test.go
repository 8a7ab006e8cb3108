package flashattn

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"sync"
	"testing"

	"flashattn.dev/flashattn/capi"
)

// Sizes that are no tile multiples, GQA and MQA, and seqlen_q > seqlen_k (a causal mask then
// leaves the first rows no key at all).
var testDims = []Dims{
	{Batch: 2, SeqLenQ: 37, SeqLenK: 53, HeadsQ: 4, HeadsKV: 2, HeadDim: 32},
	{Batch: 1, SeqLenQ: 64, SeqLenK: 64, HeadsQ: 2, HeadsKV: 2, HeadDim: 16},
	{Batch: 1, SeqLenQ: 70, SeqLenK: 30, HeadsQ: 3, HeadsKV: 1, HeadDim: 40},
}

func cpuContext(t *testing.T) *Context {
	t.Helper()
	ctx, err := NewContext(CPU, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ctx.Close(); err != nil {
			t.Error(err)
		}
	})
	return ctx
}

func within(t *testing.T, what string, ours, ref, std []float64, tol float64) {
	t.Helper()
	if e, bound := maxError(ours, ref), 2*maxError(std, ref)+tol; !(e <= bound) {
		t.Errorf("%s: max error %.3g exceeds 2 x standard's %.3g + %g", what, e, maxError(std, ref), tol)
	}
}

type problem struct {
	d             Dims
	q, k, v, dout []float64
	scale         float64
}

func newProblem(d Dims, dtype DType, seed int64) problem {
	rng := rand.New(rand.NewSource(seed))
	nq, nk := elements(d.q()), elements(d.k())
	return problem{d, random(rng, nq, dtype), random(rng, nk, dtype), random(rng, nk, dtype),
		random(rng, nq, dtype), 1 / math.Sqrt(float64(d.HeadDim))}
}

func TestFloat32MatchesFloat64(t *testing.T) {
	ctx := cpuContext(t)
	for _, d := range testDims {
		for _, causal := range []bool{false, true} {
			t.Run(fmt.Sprintf("%+v/causal=%v", d, causal), func(t *testing.T) {
				p := newProblem(d, Float32, 1)
				opts := &Options{Causal: causal}
				out, lse, err := ctx.Attention(d, to32(p.q), to32(p.k), to32(p.v), opts)
				if err != nil {
					t.Fatal(err)
				}
				refOut, refLse := naive(d, p.q, p.k, p.v, causal, p.scale, exact)
				stdOut, _ := naive(d, p.q, p.k, p.v, causal, p.scale, roundTo(Float32))
				within(t, "out", from32(out), refOut, stdOut, atol[Float32])
				if e := maxError(from32(lse), refLse); e > 1e-4 {
					t.Errorf("lse: max error %g", e)
				}
				dq, dk, dv, err := ctx.AttentionBackward(d, to32(p.q), to32(p.k), to32(p.v), out, to32(p.dout), lse, opts)
				if err != nil {
					t.Fatal(err)
				}
				rq, rk, rv := naiveBackward(d, p.q, p.k, p.v, p.dout, causal, p.scale, exact)
				sq, sk, sv := naiveBackward(d, p.q, p.k, p.v, p.dout, causal, p.scale, roundTo(Float32))
				within(t, "dq", from32(dq), rq, sq, atol[Float32])
				within(t, "dk", from32(dk), rk, sk, atol[Float32])
				within(t, "dv", from32(dv), rv, sv, atol[Float32])
			})
		}
	}
}

func TestHalfPrecisionMatchesFloat64(t *testing.T) {
	ctx := cpuContext(t)
	d := testDims[0]
	for _, dtype := range []DType{Float16, BFloat16} {
		t.Run(fmt.Sprint(dtype), func(t *testing.T) {
			p := newProblem(d, dtype, 2)
			opts := &Options{Causal: true}
			out, lse, err := ctx.Attention16(dtype, d, to16(p.q, dtype), to16(p.k, dtype), to16(p.v, dtype), opts)
			if err != nil {
				t.Fatal(err)
			}
			refOut, _ := naive(d, p.q, p.k, p.v, true, p.scale, exact)
			stdOut, _ := naive(d, p.q, p.k, p.v, true, p.scale, roundTo(dtype))
			within(t, "out", from16(out, dtype), refOut, stdOut, atol[dtype])
			dq, dk, dv, err := ctx.AttentionBackward16(dtype, d, to16(p.q, dtype), to16(p.k, dtype), to16(p.v, dtype),
				out, to16(p.dout, dtype), lse, opts)
			if err != nil {
				t.Fatal(err)
			}
			rq, rk, rv := naiveBackward(d, p.q, p.k, p.v, p.dout, true, p.scale, exact)
			sq, sk, sv := naiveBackward(d, p.q, p.k, p.v, p.dout, true, p.scale, roundTo(dtype))
			within(t, "dq", from16(dq, dtype), rq, sq, atol[dtype])
			within(t, "dk", from16(dk, dtype), rk, sk, atol[dtype])
			within(t, "dv", from16(dv, dtype), rv, sv, atol[dtype])
		})
	}
}

func TestFullyMaskedRows(t *testing.T) {
	ctx := cpuContext(t)
	d := Dims{Batch: 1, SeqLenQ: 8, SeqLenK: 4, HeadsQ: 2, HeadsKV: 2, HeadDim: 16}
	p := newProblem(d, Float32, 3)
	out, lse, err := ctx.Attention(d, to32(p.q), to32(p.k), to32(p.v), &Options{Causal: true})
	if err != nil {
		t.Fatal(err)
	}
	for h := 0; h < d.HeadsQ; h++ {
		for i := 0; i < d.SeqLenQ; i++ {
			l := lse[h*d.SeqLenQ+i]
			if masked := i < 4; masked != math.IsInf(float64(l), -1) {
				t.Errorf("row %d head %d: lse %g", i, h, l)
			}
			for c := 0; c < d.HeadDim; c++ {
				if o := out[d.qi(0, i, h, c)]; i < 4 && o != 0 {
					t.Errorf("row %d head %d: out %g, want 0", i, h, o)
				}
			}
		}
	}
}

// Strided views of one packed QKV buffer give what contiguous copies give.
func TestViewsOfAPackedBuffer(t *testing.T) {
	ctx := cpuContext(t)
	const b, n, h, dim = 2, 33, 4, 32
	p := newProblem(Dims{Batch: b, SeqLenQ: n, SeqLenK: n, HeadsQ: 3 * h, HeadsKV: 3 * h, HeadDim: dim}, Float32, 4)
	packed, err := ctx.NewBuffer(4 * len(p.q))
	if err != nil {
		t.Fatal(err)
	}
	defer packed.Close()
	if err := packed.WriteFloat32(to32(p.q)); err != nil { // [b, n, 3, h, dim]
		t.Fatal(err)
	}
	out, err := ctx.NewBuffer(4 * b * n * h * dim)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	strides := []int64{n * 3 * h * dim, 3 * h * dim, dim, 1}
	view := func(i int) Tensor {
		return Tensor{Buffer: packed, Offset: 4 * i * h * dim, DType: Float32, Shape: []int64{b, n, h, dim}, Strides: strides}
	}
	if err := ctx.Forward(view(0), view(1), view(2), out.View(Float32, b, n, h, dim), nil, &Options{Causal: true}); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, b*n*h*dim)
	if err := out.ReadFloat32(got); err != nil {
		t.Fatal(err)
	}
	parts := make([][]float32, 3)
	for i := range parts {
		for bi := 0; bi < b; bi++ {
			for s := 0; s < n; s++ {
				start := ((bi*n+s)*3 + i) * h * dim
				parts[i] = append(parts[i], to32(p.q[start:start+h*dim])...)
			}
		}
	}
	d := Dims{Batch: b, SeqLenQ: n, SeqLenK: n, HeadsQ: h, HeadsKV: h, HeadDim: dim}
	want, _, err := ctx.Attention(d, parts[0], parts[1], parts[2], &Options{Causal: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("element %d: %g from strided views, %g from copies", i, got[i], want[i])
		}
	}
}

func TestSupportedAndWorkspace(t *testing.T) {
	ctx := cpuContext(t)
	buf, err := ctx.NewBuffer(4 * 2 * 16 * 2 * 8)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	q := buf.View(Float32, 2, 16, 2, 8)
	if err := ctx.Supported(q, q, q, nil, true); err != nil {
		t.Errorf("float32 on the CPU: %v", err)
	}
	if _, err := ctx.WorkspaceSize(q, q, q, &Options{Causal: true}, false); err != nil {
		t.Error(err)
	}
	err = ctx.Supported(q, buf.View(Float32, 2, 16, 2, 4), q, nil, false)
	if !errors.Is(err, ErrInvalidShape) || !strings.Contains(err.Error(), "k: head_dim 4 differs from q's 8") {
		t.Errorf("got %v", err)
	}
}

// ---- bad input: an error carrying the library's message, never a crash ----

func TestBadInputGivesTheLibraryMessage(t *testing.T) {
	ctx := cpuContext(t)
	d := testDims[0]
	buffer := func(n int) *Buffer {
		b, err := ctx.NewBuffer(4 * n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	qb, kb, vb, ob := buffer(elements(d.q())), buffer(elements(d.k())), buffer(elements(d.k())), buffer(elements(d.q()))
	q, k, v, out := qb.View(Float32, d.q()...), kb.View(Float32, d.k()...), vb.View(Float32, d.k()...), ob.View(Float32, d.q()...)
	bad := d
	bad.HeadDim = 16

	err := ctx.Forward(q, kb.View(Float32, bad.k()...), v, out, nil, nil)
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusInvalidShape || e.Message != "flashattn_forward: k: head_dim 16 differs from q's 32" {
		t.Fatalf("got %v", err)
	}
	if !errors.Is(err, ErrInvalidShape) || errors.Is(err, ErrInvalidDType) {
		t.Error("errors.Is does not follow the status")
	}
	if err.Error() != "FLASHATTN_ERROR_INVALID_SHAPE: flashattn_forward: k: head_dim 16 differs from q's 32" {
		t.Errorf("Error() = %q", err.Error())
	}

	p := newProblem(d, Float32, 5)
	cases := []struct {
		name string
		err  error
		want *Error
		text string
	}{
		{"unknown dtype", ctx.Forward(qb.View(7, d.q()...), k, v, out, nil, nil), ErrInvalidDType, "q: unknown dtype 7"},
		{"rank 5", ctx.Forward(qb.View(Float32, 1, 2, 3, 4, 5), k, v, out, nil, nil), ErrInvalidShape, "q: rank is 5, at most 4"},
		{"no buffer", ctx.Forward(Tensor{DType: Float32, Shape: d.q()}, k, v, out, nil, nil), ErrInvalidArgument, "q: data is NULL"},
		{"offset outside the buffer", ctx.Forward(Tensor{Buffer: qb, Offset: qb.Size(), DType: Float32, Shape: d.q()}, k, v, out, nil, nil),
			ErrInvalidMemory, "q: offset 37888 is outside the 37888-byte buffer"},
		{"view past the buffer's end", ctx.Forward(Tensor{Buffer: qb, Offset: 4, DType: Float32, Shape: d.q()}, k, v, out, nil, nil),
			ErrInvalidMemory, "q: the view spans 37888 bytes from offset 4, past the end of its 37888-byte buffer"},
		{"misaligned view", ctx.Forward(Tensor{Buffer: qb, Offset: 2, DType: Float32, Shape: d.q()}, k, v, out, nil, nil),
			ErrInvalidMemory, "is not aligned to its 4-byte elements"},
		{"out aliases q", ctx.Forward(q, k, v, q, nil, nil), ErrInvalidMemory, "out: shares memory with q"},
		{"lse without data", ctx.Backward(q, k, v, out, out, Tensor{DType: Float32, Shape: d.lse()}, q, k, v, nil),
			ErrInvalidArgument, "lse: data is NULL"},
		{"infinite scale", ctx.Supported(q, k, v, &Options{Scale: float32(math.Inf(1))}, false), ErrInvalidArgument, "softmax_scale is inf, must be finite"},
		{"slice length", func() error {
			_, _, err := ctx.Attention(d, to32(p.q[:5]), to32(p.k), to32(p.v), nil)
			return err
		}(), ErrInvalidShape, "q: 5 values for shape [2 37 4 32], want 9472"},
		{"zero dims", func() error {
			_, _, err := ctx.Attention(Dims{}, nil, nil, nil, nil)
			return err
		}(), ErrInvalidShape, "dims: Batch is 0, must be >= 1"},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) || !strings.Contains(c.err.Error(), c.text) {
			t.Errorf("%s: got %v, want status %v with %q", c.name, c.err, c.want.Status, c.text)
		}
	}
}

func TestClosedContextAndCUDAWithoutDevice(t *testing.T) {
	ctx, err := NewContext(CPU, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ctx.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := ctx.NewBuffer(16); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "ctx is NULL") {
		t.Errorf("a closed context: %v", err)
	}
	if n, err := CUDADeviceCount(); err != nil || n > 0 {
		t.Skipf("CUDA devices: %d (%v)", n, err)
	}
	if _, err := NewContext(CUDA, 0); !errors.Is(err, ErrBackendUnavailable) || !strings.HasPrefix(err.(*Error).Message, "flashattn_context_create: ") {
		t.Errorf("CUDA without a device: %v", err)
	}
}

func TestCPUKernelsCappedByEnvironment(t *testing.T) {
	t.Setenv("FLASHATTN_CPU_ISA", "generic")
	ctx := cpuContext(t)
	k, err := ctx.CPUKernels()
	if err != nil || k != CPUKernelsGeneric || CPUKernelsName(k) != "generic" {
		t.Errorf("CPUKernels under FLASHATTN_CPU_ISA=generic: %v (%s) %v", k, CPUKernelsName(k), err)
	}
	if name := CPUKernelsName(CPUKernelsAMX); name != "amx" {
		t.Errorf("CPUKernelsName(CPUKernelsAMX) = %q", name)
	}
	if name := CPUKernelsName(CPUKernels(42)); name != "CPUKernels(42)" {
		t.Errorf("CPUKernelsName(42) = %q", name)
	}
}

func TestContextAccessors(t *testing.T) {
	ctx := cpuContext(t)
	if b, err := ctx.Backend(); err != nil || b != CPU {
		t.Errorf("Backend: %v %v", b, err)
	}
	if d, err := ctx.Device(); err != nil || d != -1 {
		t.Errorf("Device: %v %v", d, err)
	}
	if s, err := ctx.Stream(); err != nil || s != 0 {
		t.Errorf("Stream: %v %v", s, err)
	}
	if err := ctx.SetNumThreads(1); err != nil {
		t.Error(err)
	}
	if k, err := ctx.CPUKernels(); err != nil || k < CPUKernelsGeneric || k > CPUKernelsAMX {
		t.Errorf("CPUKernels: %v %v", k, err)
	}
	if err := ctx.SetStream(0x1234); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "a CPU context takes no stream") {
		t.Errorf("SetStream: %v", err)
	}
	if err := ctx.Synchronize(); err != nil {
		t.Error(err)
	}
}

func TestBufferOutlivesItsContext(t *testing.T) {
	ctx, err := NewContext(CPU, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := ctx.NewBuffer(8)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.Close(); err != nil {
		t.Fatal(err)
	}
	if err := buf.WriteUint16([]uint16{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	got := make([]uint16, 4)
	if err := buf.ReadUint16(got); err != nil || got[3] != 4 {
		t.Errorf("read %v, %v", got, err)
	}
	if err := buf.Close(); err != nil || buf.Ptr() != 0 {
		t.Error(err)
	}
}

func TestGoroutinesWithTheirOwnContexts(t *testing.T) {
	d := testDims[1]
	p := newProblem(d, Float32, 6)
	ref := cpuContext(t)
	want, _, err := ref.Attention(d, to32(p.q), to32(p.k), to32(p.v), nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, err := NewContext(CPU, 0)
			if err != nil {
				errs <- err
				return
			}
			defer ctx.Close()
			for i := 0; i < 5; i++ {
				got, _, err := ctx.Attention(d, to32(p.q), to32(p.k), to32(p.v), nil)
				if err != nil {
					errs <- err
					return
				}
				for j := range got {
					if got[j] != want[j] {
						errs <- fmt.Errorf("element %d differs", j)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestConstantsMatchTheHeader(t *testing.T) {
	pairs := []struct {
		name    string
		ours, c int
	}{
		{"SUCCESS", int(StatusSuccess), int(capi.FLASHATTN_SUCCESS)},
		{"INVALID_ARGUMENT", int(StatusInvalidArgument), int(capi.FLASHATTN_ERROR_INVALID_ARGUMENT)},
		{"INVALID_SHAPE", int(StatusInvalidShape), int(capi.FLASHATTN_ERROR_INVALID_SHAPE)},
		{"INVALID_DTYPE", int(StatusInvalidDType), int(capi.FLASHATTN_ERROR_INVALID_DTYPE)},
		{"INVALID_STRIDE", int(StatusInvalidStride), int(capi.FLASHATTN_ERROR_INVALID_STRIDE)},
		{"INVALID_MEMORY", int(StatusInvalidMemory), int(capi.FLASHATTN_ERROR_INVALID_MEMORY)},
		{"WORKSPACE_TOO_SMALL", int(StatusWorkspaceTooSmall), int(capi.FLASHATTN_ERROR_WORKSPACE_TOO_SMALL)},
		{"CONTEXT_BUSY", int(StatusContextBusy), int(capi.FLASHATTN_ERROR_CONTEXT_BUSY)},
		{"UNSUPPORTED", int(StatusUnsupported), int(capi.FLASHATTN_ERROR_UNSUPPORTED)},
		{"BACKEND_UNAVAILABLE", int(StatusBackendUnavailable), int(capi.FLASHATTN_ERROR_BACKEND_UNAVAILABLE)},
		{"OUT_OF_MEMORY", int(StatusOutOfMemory), int(capi.FLASHATTN_ERROR_OUT_OF_MEMORY)},
		{"DEVICE_OUT_OF_MEMORY", int(StatusDeviceOutOfMemory), int(capi.FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY)},
		{"DEVICE", int(StatusDevice), int(capi.FLASHATTN_ERROR_DEVICE)},
		{"INTERNAL", int(StatusInternal), int(capi.FLASHATTN_ERROR_INTERNAL)},
		{"BACKEND_AUTO", int(Auto), int(capi.FLASHATTN_BACKEND_AUTO)},
		{"BACKEND_CPU", int(CPU), int(capi.FLASHATTN_BACKEND_CPU)},
		{"BACKEND_CUDA", int(CUDA), int(capi.FLASHATTN_BACKEND_CUDA)},
		{"DTYPE_FLOAT32", int(Float32), int(capi.FLASHATTN_DTYPE_FLOAT32)},
		{"DTYPE_FLOAT16", int(Float16), int(capi.FLASHATTN_DTYPE_FLOAT16)},
		{"DTYPE_BFLOAT16", int(BFloat16), int(capi.FLASHATTN_DTYPE_BFLOAT16)},
		{"ALGORITHM_FLASH", int(Flash), int(capi.FLASHATTN_ALGORITHM_FLASH)},
		{"ALGORITHM_STANDARD", int(Standard), int(capi.FLASHATTN_ALGORITHM_STANDARD)},
	}
	for _, p := range pairs {
		if p.ours != p.c {
			t.Errorf("%s: Go has %d, the header %d", p.name, p.ours, p.c)
		}
	}
	if Version() != capi.FLASHATTN_VERSION_STRING {
		t.Errorf("library %s, header %s", Version(), capi.FLASHATTN_VERSION_STRING)
	}
}
