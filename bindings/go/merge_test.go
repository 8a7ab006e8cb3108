package flashattn

import (
	"errors"
	"math"
	"math/rand"
	"strings"
	"testing"
)

// Merge on the CPU backend: attention over parts of the keys, merged by the LSE, is attention
// over all of them (causal parts through a window shifted onto each part); -inf parts; in place
// through buffers; bad inputs refused with the library's status and message.

// keyRows are rows [begin, end) of a [Batch, SeqLenK, HeadsKV, HeadDim] slice.
func keyRows(d Dims, x []float32, begin, end int) []float32 {
	row := d.HeadsKV * d.HeadDim
	var out []float32
	for b := 0; b < d.Batch; b++ {
		out = append(out, x[(b*d.SeqLenK+begin)*row:(b*d.SeqLenK+end)*row]...)
	}
	return out
}

func TestMergeOfSplitKeysIsTheWholeAttention(t *testing.T) {
	ctx := cpuContext(t)
	for _, causal := range []bool{false, true} {
		d := Dims{Batch: 2, SeqLenQ: 11, SeqLenK: 29, HeadsQ: 4, HeadsKV: 2, HeadDim: 8}
		rng := rand.New(rand.NewSource(5))
		q := to32(random(rng, elements(d.q()), Float32))
		k := to32(random(rng, elements(d.k()), Float32))
		v := to32(random(rng, elements(d.v()), Float32))
		whole, wholeLSE, err := ctx.Attention(d, q, k, v, &Options{Causal: causal})
		if err != nil {
			t.Fatal(err)
		}
		bounds := []int{0, 3, 4, 17, 29}
		var outs, lses []float32
		for p := 0; p+1 < len(bounds); p++ {
			part := d
			part.SeqLenK = bounds[p+1] - bounds[p]
			opts := &Options{}
			if causal {
				opts.Window = &Window{Left: -1, Right: d.SeqLenK - bounds[p+1]}
			}
			o, l, err := ctx.Attention(part, q, keyRows(d, k, bounds[p], bounds[p+1]), keyRows(d, v, bounds[p], bounds[p+1]), opts)
			if err != nil {
				t.Fatal(err)
			}
			outs, lses = append(outs, o...), append(lses, l...)
		}
		out, lse, err := ctx.MergeParts(d, len(bounds)-1, outs, lses)
		if err != nil {
			t.Fatal(err)
		}
		if e := maxError(from32(out), from32(whole)); e > 1e-5 {
			t.Errorf("causal %v: out differs from the whole attention by %g", causal, e)
		}
		if e := maxError(from32(lse), from32(wholeLSE)); e > 1e-5 {
			t.Errorf("causal %v: lse differs from the whole attention's by %g", causal, e)
		}
	}
}

func TestMergeOfHalfPrecisionParts(t *testing.T) {
	ctx := cpuContext(t)
	d := Dims{Batch: 1, SeqLenQ: 3, SeqLenK: 1, HeadsQ: 1, HeadsKV: 1, HeadDim: 4}
	outs := to16([]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, -1, -2, -3, -4, 0.5, 0.5, 0.5, 0.5, 1, 1, 1, 1}, Float16)
	inf := float32(math.Inf(1))
	// Row 0: equal weights; row 1: part 1 only (part 0 -inf); row 2: both -inf.
	lses := []float32{0, -inf, -inf, 0, 3, -inf}
	out, lse, err := ctx.MergeParts16(Float16, d, 2, outs, lses)
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{0, 0, 0, 0, 0.5, 0.5, 0.5, 0.5, 0, 0, 0, 0}
	if e := maxError(from16(out, Float16), want); e != 0 {
		t.Errorf("merged %v, want %v", from16(out, Float16), want)
	}
	if math.Abs(float64(lse[0])-math.Log(2)) > 1e-6 || lse[1] != 3 || !math.IsInf(float64(lse[2]), -1) {
		t.Errorf("merged lse %v", lse)
	}
}

func TestMergeInPlaceThroughBuffers(t *testing.T) {
	ctx := cpuContext(t)
	outs, err := ctx.NewBuffer(2 * 4 * 4)
	if err != nil {
		t.Fatal(err)
	}
	defer outs.Close()
	lses, err := ctx.NewBuffer(2 * 4)
	if err != nil {
		t.Fatal(err)
	}
	defer lses.Close()
	if err := outs.WriteFloat32([]float32{1, 1, 1, 1, 3, 3, 3, 3}); err != nil {
		t.Fatal(err)
	}
	if err := lses.WriteFloat32([]float32{0, 0}); err != nil {
		t.Fatal(err)
	}
	first := outs.View(Float32, 1, 1, 1, 4)
	firstLSE := lses.View(Float32, 1, 1, 1)
	if err := ctx.Merge(PartsBackToBack(2, first, firstLSE), first, &firstLSE); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 8)
	if err := outs.ReadFloat32(got); err != nil {
		t.Fatal(err)
	}
	if got[0] != 2 || got[3] != 2 || got[4] != 3 {
		t.Errorf("in place: %v", got)
	}
	// A view one element into part 0 is not part 0.
	shifted := first
	shifted.Offset = 4
	err = ctx.Merge(PartsBackToBack(2, first, firstLSE), shifted, nil)
	if !errors.Is(err, ErrInvalidMemory) || !strings.Contains(err.Error(), "shares memory with part 0 of parts_out") {
		t.Errorf("overlap: %v", err)
	}
}

func TestMergeRefusesBadInputs(t *testing.T) {
	ctx := cpuContext(t)
	d := Dims{Batch: 1, SeqLenQ: 2, SeqLenK: 1, HeadsQ: 1, HeadsKV: 1, HeadDim: 4}
	if _, _, err := ctx.MergeParts(d, 0, nil, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("no parts: %v", err)
	}
	if _, _, err := ctx.MergeParts(d, 2, make([]float32, 16), make([]float32, 3)); !errors.Is(err, ErrInvalidShape) {
		t.Errorf("short lses: %v", err)
	}
	buf, err := ctx.NewBuffer(1024)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	parts := PartsBackToBack(2, buf.View(Float32, 1, 2, 1, 4), Tensor{Buffer: buf, Offset: 256, DType: Float32, Shape: []int64{1, 1, 2}})
	parts.LSEStride = -1
	out := Tensor{Buffer: buf, Offset: 512, DType: Float32, Shape: []int64{1, 2, 1, 4}}
	err = ctx.Merge(parts, out, nil)
	if !errors.Is(err, ErrInvalidStride) || !strings.Contains(err.Error(), "parts_lse_stride is -1") {
		t.Errorf("negative part stride: %v", err)
	}
	parts.LSEStride = 2
	out.DType = Float16
	if err := ctx.Merge(parts, out, nil); !errors.Is(err, ErrInvalidDType) {
		t.Errorf("out of another dtype: %v", err)
	}
}
