package flashattn

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

// A forward and backward on a CUDA context (through device buffers), against float64 attention
// with the project's tolerance rule; the standard algorithm of the CPU backend in the same dtype
// sets the bound. Skipped where the library finds no CUDA device. On a GPU machine:
//
//	LD_LIBRARY_PATH=<dir of libflashattn.so> ./flashattn_go.test -test.run GPU -test.v
func gpuContext(t *testing.T) *Context {
	t.Helper()
	n, err := CUDADeviceCount()
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Skip("no CUDA device usable by libflashattn (built without CUDA, or no driver or device)")
	}
	ctx, err := NewContext(CUDA, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	return ctx
}

func TestGPUForwardBackward(t *testing.T) {
	gpu := gpuContext(t)
	cpu := cpuContext(t)
	dims := []Dims{
		{Batch: 2, SeqLenQ: 128, SeqLenK: 160, HeadsQ: 4, HeadsKV: 2, HeadDim: 64},
		{Batch: 1, SeqLenQ: 77, SeqLenK: 77, HeadsQ: 2, HeadsKV: 2, HeadDim: 128},
	}
	for _, d := range dims {
		for _, dtype := range []DType{Float16, BFloat16} {
			for _, causal := range []bool{false, true} {
				t.Run(fmt.Sprintf("%+v/%d/causal=%v", d, dtype, causal), func(t *testing.T) {
					p := newProblem(d, dtype, 7)
					q, k, v, dout := to16(p.q, dtype), to16(p.k, dtype), to16(p.v, dtype), to16(p.dout, dtype)
					opts := &Options{Causal: causal}
					std := &Options{Causal: causal, Algorithm: Standard}

					out, lse, err := gpu.Attention16(dtype, d, q, k, v, opts)
					if err != nil {
						t.Fatal(err)
					}
					stdOut, stdLse, err := cpu.Attention16(dtype, d, q, k, v, std)
					if err != nil {
						t.Fatal(err)
					}
					refOut, _ := naive(d, p.q, p.k, p.v, causal, p.scale, exact)
					within(t, "out", from16(out, dtype), refOut, from16(stdOut, dtype), atol[dtype])

					dq, dk, dv, err := gpu.AttentionBackward16(dtype, d, q, k, v, out, dout, lse, opts)
					if err != nil {
						t.Fatal(err)
					}
					sq, sk, sv, err := cpu.AttentionBackward16(dtype, d, q, k, v, stdOut, dout, stdLse, std)
					if err != nil {
						t.Fatal(err)
					}
					rq, rk, rv := naiveBackward(d, p.q, p.k, p.v, p.dout, causal, p.scale, exact)
					within(t, "dq", from16(dq, dtype), rq, from16(sq, dtype), atol[dtype])
					within(t, "dk", from16(dk, dtype), rk, from16(sk, dtype), atol[dtype])
					within(t, "dv", from16(dv, dtype), rv, from16(sv, dtype), atol[dtype])
				})
			}
		}
	}
}

// Views of device buffers, the stream, and the library's messages for device-side mistakes.
func TestGPUBuffersAndErrors(t *testing.T) {
	gpu := gpuContext(t)
	cpu := cpuContext(t)
	d := Dims{Batch: 1, SeqLenQ: 64, SeqLenK: 64, HeadsQ: 2, HeadsKV: 2, HeadDim: 64}
	p := newProblem(d, Float16, 8)
	q := to16(p.q, Float16)
	want, _, err := gpu.Attention16(Float16, d, q, q, q, nil)
	if err != nil {
		t.Fatal(err)
	}

	in, err := gpu.NewBuffer(2 * len(q))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := gpu.NewBuffer(2 * len(q))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := in.WriteUint16(q); err != nil {
		t.Fatal(err)
	}
	view := in.View(Float16, d.q()...)
	if err := gpu.Forward(view, view, view, out.View(Float16, d.q()...), nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := gpu.Synchronize(); err != nil {
		t.Fatal(err)
	}
	got := make([]uint16, len(q))
	if err := out.ReadUint16(got); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("element %d: %#04x through buffers, %#04x through Attention16", i, got[i], want[i])
		}
	}
	if s, err := gpu.Stream(); err != nil || s == 0 {
		t.Errorf("a CUDA context's stream: %#x, %v", s, err)
	}

	host, err := cpu.NewBuffer(2 * len(q))
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	err = gpu.Forward(host.View(Float16, d.q()...), view, view, out.View(Float16, d.q()...), nil, nil)
	if !errors.Is(err, ErrInvalidMemory) || !strings.Contains(err.Error(), "q: points into a buffer of another context's host memory") {
		t.Errorf("a host buffer on the GPU: %v", err)
	}
	f32 := in.View(Float32, 1, 32, 2, 64)
	var e *Error
	if err := gpu.Forward(f32, f32, f32, out.View(Float32, 1, 32, 2, 64), nil, nil); !errors.As(err, &e) ||
		!strings.HasPrefix(e.Message, "flashattn_forward: ") {
		t.Errorf("float32 on the GPU: %v", err)
	}
}

// Merge on a CUDA context against the CPU backend's merge of the same parts: the same
// arithmetic in float32, so at most one unit in the last place of the dtype apart.
func TestGPUMerge(t *testing.T) {
	gpu := gpuContext(t)
	cpu := cpuContext(t)
	d := Dims{Batch: 2, SeqLenQ: 33, SeqLenK: 1, HeadsQ: 4, HeadsKV: 4, HeadDim: 64}
	const parts = 5
	for _, dtype := range []DType{Float16, BFloat16} {
		p := newProblem(Dims{Batch: parts * d.Batch, SeqLenQ: d.SeqLenQ, SeqLenK: 1, HeadsQ: d.HeadsQ, HeadsKV: d.HeadsQ, HeadDim: d.HeadDim}, dtype, 11)
		outs := to16(p.q, dtype)
		lses := make([]float32, parts*elements(d.lse()))
		for i := range lses {
			lses[i] = float32(p.k[i%len(p.k)] * 3)
			if i%7 == 0 {
				lses[i] = float32(math.Inf(-1))
			}
		}
		gOut, gLSE, err := gpu.MergeParts16(dtype, d, parts, outs, lses)
		if err != nil {
			t.Fatal(err)
		}
		cOut, cLSE, err := cpu.MergeParts16(dtype, d, parts, outs, lses)
		if err != nil {
			t.Fatal(err)
		}
		ulp := map[DType]float64{Float16: 1.0 / 1024, BFloat16: 1.0 / 128}[dtype]
		if e := maxError(from16(gOut, dtype), from16(cOut, dtype)); e > ulp*8 { // one unit in the last place of values up to 8
			t.Errorf("dtype %d: GPU and CPU merges differ by %g", dtype, e)
		}
		if e := maxError(from32(gLSE), from32(cLSE)); e > 1e-5 {
			t.Errorf("dtype %d: GPU and CPU merged LSEs differ by %g", dtype, e)
		}
	}
}

// The KV cache on a CUDA context (a paged cache in device buffers, a row appended): within the
// project's rule of float64 attention, the CPU backend's standard algorithm setting the bound,
// and the cache left as the CPU leaves it. The CUDA backend has a KV cache path
// (lib/cuda/kvcache): UNSUPPORTED here is a failure.
func TestGPUKVCache(t *testing.T) {
	gpu := gpuContext(t)
	cpu := cpuContext(t)
	for _, dtype := range []DType{Float16, BFloat16} {
		p := newCacheProblem(Dims{SeqLenQ: 1, HeadsQ: 8, HeadsKV: 2, HeadDim: 64}, []int{1, 70, 129}, 1, 13).rounded(dtype)
		c := p.build(cacheLayout{pageSize: 16, seed: 13})
		out, _, k, v, err := cacheForward16(t, gpu, dtype, c, p.q, &Options{Causal: true})
		if err != nil {
			t.Fatal(err)
		}
		stdOut, _, stdK, stdV, err := cacheForward16(t, cpu, dtype, c, p.q, &Options{Causal: true, Algorithm: Standard})
		if err != nil {
			t.Fatal(err)
		}
		refOut, _ := p.reference(p.q, p.k, variant{causal: true, scale: 1 / math.Sqrt(float64(p.d.HeadDim))})
		within(t, fmt.Sprintf("dtype %d: out", dtype), from16(out, dtype), refOut, from16(stdOut, dtype), atol[dtype])
		for i := range k {
			if k[i] != stdK[i] || v[i] != stdV[i] {
				t.Fatalf("dtype %d: element %d of the cache differs from the CPU's", dtype, i)
			}
		}
	}
}
