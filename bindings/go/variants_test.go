package flashattn

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"
)

// The attention variants on the CPU backend: each variant's forward and backward against the
// header's definition in float64 (variantReference), a variable-length batch against
// per-sequence calls, dsinks against finite differences, bad values refused with the library's
// status and message.

// variant is the configuration variantReference computes.
type variant struct {
	causal  bool
	window  *Window
	softcap float64
	alibi   []float64 // [HeadsQ] or [Batch * HeadsQ]
	sinks   []float64 // [HeadsQ]
	scale   float64
}

// variantReference is the header's definition for a fixed-length batch: per query head h,
// query i, key j, diag = SeqLenK - SeqLenQ: x = scale q.k, then c tanh(x / c) with a softcap,
// minus slope_h |i + diag - j| with ALiBi; keys hidden by causal or the window;
// Z = e^sink_h + sum of e^x over the visible keys; a row that sees no key: out 0, lse -inf, no
// gradient. Given dout, also dq, dk, dv and dsinks.
func variantReference(d Dims, q, k, v, dout []float64, va variant) (out, lse, dq, dk, dv, dsinks []float64) {
	dvh := d.headDimV()
	g := d.HeadsQ / d.HeadsKV
	qi := func(b, i, h, c int) int { return ((b*d.SeqLenQ+i)*d.HeadsQ+h)*d.HeadDim + c }
	ki := func(b, j, h, c int) int { return ((b*d.SeqLenK+j)*d.HeadsKV+h)*d.HeadDim + c }
	vi := func(b, j, h, c int) int { return ((b*d.SeqLenK+j)*d.HeadsKV+h)*dvh + c }
	oi := func(b, i, h, c int) int { return ((b*d.SeqLenQ+i)*d.HeadsQ+h)*dvh + c }
	out = make([]float64, d.Batch*d.SeqLenQ*d.HeadsQ*dvh)
	lse = make([]float64, d.Batch*d.HeadsQ*d.SeqLenQ)
	dq, dk, dv = make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
	dsinks = make([]float64, d.HeadsQ)
	diag := d.SeqLenK - d.SeqLenQ
	for b := 0; b < d.Batch; b++ {
		for h := 0; h < d.HeadsQ; h++ {
			hk := h / g
			for i := 0; i < d.SeqLenQ; i++ {
				x := make([]float64, d.SeqLenK)
				dcap := make([]float64, d.SeqLenK)
				seen := false
				m := math.Inf(-1)
				for j := range x {
					rel := i + diag - j
					visible := !(va.causal && rel < 0)
					if w := va.window; w != nil {
						visible = visible && (w.Left < 0 || rel <= w.Left) && (w.Right < 0 || -rel <= w.Right)
					}
					if !visible {
						x[j] = math.Inf(-1)
						continue
					}
					s := 0.0
					for c := 0; c < d.HeadDim; c++ {
						s += q[qi(b, i, h, c)] * k[ki(b, j, hk, c)]
					}
					s *= va.scale
					dcap[j] = 1
					if va.softcap != 0 {
						t := math.Tanh(s / va.softcap)
						s, dcap[j] = va.softcap*t, 1-t*t
					}
					if va.alibi != nil {
						slope := va.alibi[h]
						if len(va.alibi) > d.HeadsQ {
							slope = va.alibi[b*d.HeadsQ+h]
						}
						s -= slope * math.Abs(float64(rel))
					}
					x[j], seen, m = s, true, math.Max(m, s)
				}
				li := (b*d.HeadsQ+h)*d.SeqLenQ + i
				if !seen {
					lse[li] = math.Inf(-1)
					continue
				}
				if va.sinks != nil {
					m = math.Max(m, va.sinks[h])
				}
				z := 0.0
				for j := range x {
					z += math.Exp(x[j] - m)
				}
				if va.sinks != nil {
					z += math.Exp(va.sinks[h] - m)
				}
				lse[li] = m + math.Log(z)
				p := make([]float64, len(x))
				for j := range x {
					p[j] = math.Exp(x[j] - lse[li])
					for c := 0; c < dvh; c++ {
						out[oi(b, i, h, c)] += p[j] * v[vi(b, j, hk, c)]
					}
				}
				if dout == nil {
					continue
				}
				delta := 0.0
				for c := 0; c < dvh; c++ {
					delta += dout[oi(b, i, h, c)] * out[oi(b, i, h, c)]
				}
				for j := range x {
					if p[j] == 0 {
						continue
					}
					dp := 0.0
					for c := 0; c < dvh; c++ {
						dp += dout[oi(b, i, h, c)] * v[vi(b, j, hk, c)]
						dv[vi(b, j, hk, c)] += p[j] * dout[oi(b, i, h, c)]
					}
					ds := p[j] * (dp - delta) * dcap[j] * va.scale
					for c := 0; c < d.HeadDim; c++ {
						dq[qi(b, i, h, c)] += ds * k[ki(b, j, hk, c)]
						dk[ki(b, j, hk, c)] += ds * q[qi(b, i, h, c)]
					}
				}
				if va.sinks != nil {
					dsinks[h] -= math.Exp(va.sinks[h]-lse[li]) * delta
				}
			}
		}
	}
	return
}

// closeTo: fp32 results against float64, relative to the reference's largest magnitude.
func closeTo(t *testing.T, what string, ours []float32, ref []float64) {
	t.Helper()
	if len(ours) != len(ref) {
		t.Fatalf("%s: %d values, want %d", what, len(ours), len(ref))
	}
	big := 1.0
	for _, r := range ref {
		if !math.IsInf(r, 0) {
			big = math.Max(big, math.Abs(r))
		}
	}
	if e := maxError(from32(ours), ref); !(e <= 2e-4*big) {
		t.Errorf("%s: max error %.3g exceeds %.3g", what, e, 2e-4*big)
	}
}

func toOptions(va variant) *Options {
	return &Options{Causal: va.causal, Window: va.window, Softcap: float32(va.softcap), Scale: float32(va.scale)}
}

func toVariants(va variant) *Variants {
	vars := &Variants{}
	if va.alibi != nil {
		vars.AlibiSlopes = to32(va.alibi)
	}
	if va.sinks != nil {
		vars.Sinks = to32(va.sinks)
	}
	return vars
}

func TestVariantsMatchFloat64(t *testing.T) {
	ctx := cpuContext(t)
	d := Dims{Batch: 2, SeqLenQ: 21, SeqLenK: 29, HeadsQ: 4, HeadsKV: 2, HeadDim: 16}
	cases := []struct {
		name string
		va   variant
		d    Dims
	}{
		{"window", variant{window: &Window{Left: 5, Right: 3}}, d},
		{"window_left_only", variant{window: &Window{Left: 7, Right: -1}}, d},
		{"window_causal", variant{window: &Window{Left: 6, Right: 4}, causal: true}, d},
		{"softcap", variant{softcap: 0.7}, d},
		{"alibi_per_head", variant{alibi: []float64{0.5, 0.25, 0.125, 0.0625}}, d},
		{"alibi_per_batch", variant{alibi: []float64{0.5, 0.1, 0.3, 0.2, 0.05, 0.4, 0, 1}}, d},
		{"sinks", variant{sinks: []float64{0.5, -1, 2, 0}}, d},
		{"head_dim_v", variant{causal: true}, Dims{Batch: 2, SeqLenQ: 19, SeqLenK: 23, HeadsQ: 4, HeadsKV: 2, HeadDim: 24, HeadDimV: 40}},
		{"all", variant{window: &Window{Left: 9, Right: 2}, causal: true, softcap: 2,
			alibi: []float64{0.3, 0.2, 0.1, 0.05}, sinks: []float64{1, 0, -0.5, 3}}, d},
	}
	for n, tc := range cases {
		tc := tc
		t.Run(tc.name, func(t *testing.T) {
			d := tc.d
			rng := rand.New(rand.NewSource(int64(n + 1)))
			q := random(rng, elements(d.q()), Float32)
			k := random(rng, elements(d.k()), Float32)
			v := random(rng, elements(d.v()), Float32)
			dout := random(rng, elements(d.out()), Float32)
			va := tc.va
			va.scale = 1 / math.Sqrt(float64(d.HeadDim))
			opts, vars := toOptions(va), toVariants(va)
			out, lse, err := ctx.AttentionEx(d, to32(q), to32(k), to32(v), opts, vars)
			if err != nil {
				t.Fatal(err)
			}
			rOut, rLse, rq, rk, rv, rs := variantReference(d, q, k, v, dout, va)
			closeTo(t, "out", out, rOut)
			closeTo(t, "lse", lse, rLse)
			dq, dk, dv, dsinks, err := ctx.AttentionBackwardEx(d, to32(q), to32(k), to32(v), out, to32(dout), lse, opts, vars)
			if err != nil {
				t.Fatal(err)
			}
			closeTo(t, "dq", dq, rq)
			closeTo(t, "dk", dk, rk)
			closeTo(t, "dv", dv, rv)
			if va.sinks != nil {
				closeTo(t, "dsinks", dsinks, rs)
			} else if dsinks != nil {
				t.Error("dsinks without sinks")
			}
			// The variant matters: plain attention differs (d_v alone excepted, it changes shapes).
			if tc.name != "head_dim_v" {
				plain, _, err := ctx.Attention(d, to32(q), to32(k), to32(v), &Options{Causal: va.causal})
				if err != nil {
					t.Fatal(err)
				}
				if maxError(from32(plain), from32(out)) < 1e-3 {
					t.Error("the variant changed nothing")
				}
			}
		})
	}
}

func TestDsinksMatchFiniteDifferences(t *testing.T) {
	ctx := cpuContext(t)
	d := Dims{Batch: 1, SeqLenQ: 12, SeqLenK: 15, HeadsQ: 2, HeadsKV: 1, HeadDim: 8}
	rng := rand.New(rand.NewSource(11))
	q, k, v := to32(random(rng, elements(d.q()), Float32)), to32(random(rng, elements(d.k()), Float32)), to32(random(rng, elements(d.k()), Float32))
	dout := to32(random(rng, elements(d.q()), Float32))
	sinks := []float32{0.3, -0.8}
	out, lse, err := ctx.AttentionEx(d, q, k, v, nil, &Variants{Sinks: sinks})
	if err != nil {
		t.Fatal(err)
	}
	_, _, _, dsinks, err := ctx.AttentionBackwardEx(d, q, k, v, out, dout, lse, nil, &Variants{Sinks: sinks})
	if err != nil {
		t.Fatal(err)
	}
	loss := func(s []float32) float64 {
		o, _, err := ctx.AttentionEx(d, q, k, v, nil, &Variants{Sinks: s})
		if err != nil {
			t.Fatal(err)
		}
		l := 0.0
		for i := range o {
			l += float64(o[i]) * float64(dout[i])
		}
		return l
	}
	const eps = 1e-2
	for h := range sinks {
		plus, minus := append([]float32{}, sinks...), append([]float32{}, sinks...)
		plus[h] += eps
		minus[h] -= eps
		numeric := (loss(plus) - loss(minus)) / (2 * eps)
		if diff := math.Abs(float64(dsinks[h]) - numeric); diff > 2e-3+1e-2*math.Abs(numeric) {
			t.Errorf("dsinks[%d] = %g, finite differences %g", h, dsinks[h], numeric)
		}
	}
}

func TestVarlenMatchesPerSequenceCalls(t *testing.T) {
	ctx := cpuContext(t)
	lensQ, lensK := []int{7, 0, 13, 5}, []int{9, 4, 13, 0} // an empty query side and an empty key side
	offsets := func(lens []int) []int32 {
		o := []int32{0}
		for _, l := range lens {
			o = append(o, o[len(o)-1]+int32(l))
		}
		return o
	}
	cuQ, cuK := offsets(lensQ), offsets(lensK)
	hq, hkv, hd, hdv := 4, 2, 16, 24
	totalQ, totalK := int(cuQ[len(cuQ)-1]), int(cuK[len(cuK)-1])
	d := Dims{Batch: len(lensQ), SeqLenQ: totalQ, SeqLenK: totalK, HeadsQ: hq, HeadsKV: hkv, HeadDim: hd, HeadDimV: hdv}
	rng := rand.New(rand.NewSource(3))
	q := to32(random(rng, totalQ*hq*hd, Float32))
	k := to32(random(rng, totalK*hkv*hd, Float32))
	v := to32(random(rng, totalK*hkv*hdv, Float32))
	dout := to32(random(rng, totalQ*hq*hdv, Float32))
	sinks := []float32{0.2, -0.4, 1, 0}
	opts := &Options{Causal: true, Window: &Window{Left: 5, Right: -1}}
	vars := &Variants{CuSeqlensQ: cuQ, CuSeqlensK: cuK, Sinks: sinks}
	out, lse, err := ctx.AttentionEx(d, q, k, v, opts, vars)
	if err != nil {
		t.Fatal(err)
	}
	dq, dk, dv, dsinks, err := ctx.AttentionBackwardEx(d, q, k, v, out, dout, lse, opts, vars)
	if err != nil {
		t.Fatal(err)
	}
	sum := make([]float64, hq)
	for b := range lensQ {
		q0, q1, k0, k1 := int(cuQ[b]), int(cuQ[b+1]), int(cuK[b]), int(cuK[b+1])
		if q1 == q0 {
			continue
		}
		if k1 == k0 { // queries that see no key: out 0, LSE -inf, dq 0
			for i := q0 * hq * hdv; i < q1*hq*hdv; i++ {
				if out[i] != 0 {
					t.Fatalf("sequence %d: out[%d] = %g, want 0", b, i, out[i])
				}
			}
			for h := 0; h < hq; h++ {
				for i := q0; i < q1; i++ {
					if !math.IsInf(float64(lse[h*totalQ+i]), -1) {
						t.Fatalf("sequence %d: lse not -inf", b)
					}
				}
			}
			continue
		}
		one := Dims{Batch: 1, SeqLenQ: q1 - q0, SeqLenK: k1 - k0, HeadsQ: hq, HeadsKV: hkv, HeadDim: hd, HeadDimV: hdv}
		oq, ok, ov, od := q[q0*hq*hd:q1*hq*hd], k[k0*hkv*hd:k1*hkv*hd], v[k0*hkv*hdv:k1*hkv*hdv], dout[q0*hq*hdv:q1*hq*hdv]
		o1, l1, err := ctx.AttentionEx(one, oq, ok, ov, opts, &Variants{Sinks: sinks})
		if err != nil {
			t.Fatal(err)
		}
		g1q, g1k, g1v, g1s, err := ctx.AttentionBackwardEx(one, oq, ok, ov, o1, od, l1, opts, &Variants{Sinks: sinks})
		if err != nil {
			t.Fatal(err)
		}
		check := func(what string, packed, single []float32) {
			if e := maxError(from32(packed), from32(single)); e > 1e-5 {
				t.Errorf("sequence %d: %s differs from the per-sequence call by %g", b, what, e)
			}
		}
		check("out", out[q0*hq*hdv:q1*hq*hdv], o1)
		lseSeq := make([]float32, 0, hq*(q1-q0))
		for h := 0; h < hq; h++ {
			lseSeq = append(lseSeq, lse[h*totalQ+q0:h*totalQ+q1]...)
		}
		check("lse", lseSeq, l1)
		check("dq", dq[q0*hq*hd:q1*hq*hd], g1q)
		check("dk", dk[k0*hkv*hd:k1*hkv*hd], g1k)
		check("dv", dv[k0*hkv*hdv:k1*hkv*hdv], g1v)
		for h := range sum {
			sum[h] += float64(g1s[h])
		}
	}
	if e := maxError(from32(dsinks), sum); e > 1e-4 {
		t.Errorf("dsinks differ from the sum of the per-sequence ones by %g", e)
	}
}

func TestForwardExThroughBuffers(t *testing.T) {
	// The Tensor-level call: views of buffers, Int32 offsets, the LSE of a packed batch.
	ctx := cpuContext(t)
	tq, tk, h, hd := 10, 12, 2, 8
	buf := func(n int) *Buffer {
		b, err := ctx.NewBuffer(n * 4)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	rng := rand.New(rand.NewSource(5))
	qb, kb, vb, ob, lb, cqb, ckb := buf(tq*h*hd), buf(tk*h*hd), buf(tk*h*hd), buf(tq*h*hd), buf(h*tq), buf(3), buf(3)
	q, k, v := to32(random(rng, tq*h*hd, Float32)), to32(random(rng, tk*h*hd, Float32)), to32(random(rng, tk*h*hd, Float32))
	for _, w := range []struct {
		b *Buffer
		x []float32
	}{{qb, q}, {kb, k}, {vb, v}} {
		if err := w.b.WriteFloat32(w.x); err != nil {
			t.Fatal(err)
		}
	}
	if err := cqb.WriteInt32([]int32{0, 4, 10}); err != nil {
		t.Fatal(err)
	}
	if err := ckb.WriteInt32([]int32{0, 7, 12}); err != nil {
		t.Fatal(err)
	}
	qt, kt, vt := qb.View(Float32, int64(tq), int64(h), int64(hd)), kb.View(Float32, int64(tk), int64(h), int64(hd)), vb.View(Float32, int64(tk), int64(h), int64(hd))
	ot, lt := ob.View(Float32, int64(tq), int64(h), int64(hd)), lb.View(Float32, int64(h), int64(tq))
	cq, ck := cqb.View(Int32, 3), ckb.View(Int32, 3)
	a := &Args{Q: &qt, K: &kt, V: &vt, Out: &ot, LSE: &lt, CuSeqlensQ: &cq, CuSeqlensK: &ck, MaxSeqlenQ: 6, MaxSeqlenK: 7}
	if err := ctx.SupportedEx(a, false); err != nil {
		t.Fatal(err)
	}
	if n, err := ctx.WorkspaceSizeEx(a, false); err != nil || n < 0 {
		t.Fatal(n, err)
	}
	if err := ctx.ForwardEx(a); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, tq*h*hd)
	if err := ob.ReadFloat32(out); err != nil {
		t.Fatal(err)
	}
	want, _, err := ctx.Attention(Dims{Batch: 1, SeqLenQ: 6, SeqLenK: 5, HeadsQ: h, HeadsKV: h, HeadDim: hd}, q[4*h*hd:], k[7*h*hd:], v[7*h*hd:], nil)
	if err != nil {
		t.Fatal(err)
	}
	if e := maxError(from32(out[4*h*hd:]), from32(want)); e > 1e-5 {
		t.Errorf("the second sequence differs from its own call by %g", e)
	}
	a.MaxSeqlenQ = 5 // the second sequence has 6 queries
	err = ctx.ForwardEx(a)
	if !errors.Is(err, ErrInvalidShape) || !strings.Contains(err.Error(), "sequence 1 has 6 queries, more than max_seqlen_q = 5") {
		t.Errorf("got %v", err)
	}
}

func TestBadVariantValuesAreRefused(t *testing.T) {
	ctx := cpuContext(t)
	d := Dims{Batch: 2, SeqLenQ: 8, SeqLenK: 8, HeadsQ: 4, HeadsKV: 2, HeadDim: 16}
	rng := rand.New(rand.NewSource(6))
	q, k := to32(random(rng, elements(d.q()), Float32)), to32(random(rng, elements(d.k()), Float32))
	cases := []struct {
		opts     *Options
		vars     *Variants
		d        Dims
		target   error
		fragment string
	}{
		{&Options{Window: &Window{Left: -2, Right: 0}}, nil, d, ErrInvalidArgument, "options: window_left is -2, must be >= 0, or -1 for no bound on that side"},
		{&Options{Window: &Window{Left: 1, Right: -9}}, nil, d, ErrInvalidArgument, "options: window_right is -9"},
		{&Options{Window: &Window{Left: math.MaxInt32 + 1}}, nil, d, ErrInvalidArgument, "options: Window.Left is 2147483648, beyond the 32 bits"},
		{&Options{Softcap: -1}, nil, d, ErrInvalidArgument, "options: softcap is -1, must be 0 (none) or a finite cap > 0"},
		{&Options{Softcap: float32(math.NaN())}, nil, d, ErrInvalidArgument, "options: softcap is nan"},
		{&Options{Softcap: float32(math.Inf(1))}, nil, d, ErrInvalidArgument, "options: softcap is inf"},
		{&Options{NumSplits: -1}, nil, d, ErrInvalidArgument, "options: num_splits is -1, must be 0 (the library chooses) or a number of parts > 0"},
		{nil, &Variants{AlibiSlopes: []float32{1, 2, 3}}, d, ErrInvalidShape, "alibi_slopes: shape [3], expected [heads_q] = [4] or [batch, heads_q] = [2, 4]"},
		{nil, &Variants{Sinks: []float32{1, 2}}, d, ErrInvalidShape, "sinks: shape [2], expected [heads_q] = [4]"},
		{nil, &Variants{CuSeqlensQ: []int32{0, 8, 16}}, d.packedDims(16, 16), ErrInvalidArgument, "cu_seqlens_k is NULL but cu_seqlens_q is given"},
		{nil, &Variants{CuSeqlensQ: []int32{0, 8, 16}, CuSeqlensK: []int32{0, 8}}, d.packedDims(16, 16), ErrInvalidShape, "cu_seqlens_k: 2 offsets differ from cu_seqlens_q's 3"},
		{nil, &Variants{CuSeqlensQ: []int32{0, 8, 16}, CuSeqlensK: []int32{0, 8, 16}, MaxSeqlenQ: 7}, d.packedDims(16, 16), ErrInvalidShape, "sequence 0 has 8 queries, more than max_seqlen_q = 7"},
		{nil, &Variants{CuSeqlensQ: []int32{0, 9, 8}, CuSeqlensK: []int32{0, 8, 16}, MaxSeqlenQ: 9}, d.packedDims(16, 16), ErrInvalidShape, "cu_seqlens_q[2] is 8, below cu_seqlens_q[1] = 9; the offsets must not decrease"},
		{nil, &Variants{CuSeqlensQ: []int32{0, 8, 16}, CuSeqlensK: []int32{0, 8, 17}}, d.packedDims(16, 16), ErrInvalidShape, "cu_seqlens_k[2] is 17, past the end of k's 16 tokens"},
		{nil, &Variants{MaxSeqlenQ: 8}, d, ErrInvalidArgument, "args: max_seqlen_q is 8 but there are no offsets"},
	}
	for i, c := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			qq, kk := q, k
			if c.d != d {
				qq, kk = to32(random(rng, c.d.SeqLenQ*c.d.HeadsQ*c.d.HeadDim, Float32)), to32(random(rng, c.d.SeqLenK*c.d.HeadsKV*c.d.HeadDim, Float32))
			}
			_, _, err := ctx.AttentionEx(c.d, qq, kk, kk, c.opts, c.vars)
			var e *Error
			if !errors.As(err, &e) || !errors.Is(err, c.target) || !strings.Contains(e.Message, c.fragment) {
				t.Errorf("want %v with %q, got %v", c.target, c.fragment, err)
			}
		})
	}
	// The Tensor-level call refuses an Int32 view where a Float32 one belongs, with the library's
	// message.
	sb, err := ctx.NewBuffer(16)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	sinks := sb.View(Int32, 4)
	qt := sb.View(Float32, 1, 1, 1, 4)
	err = ctx.SupportedEx(&Args{Q: &qt, K: &qt, V: &qt, Sinks: &sinks}, false)
	if !errors.Is(err, ErrInvalidDType) || !strings.Contains(err.Error(), "flashattn_supported_ex: sinks: dtype int32, must be float32") {
		t.Errorf("got %v", err)
	}
}

// packedDims are the Dims of a variable-length batch of totalQ and totalK tokens.
func (d Dims) packedDims(totalQ, totalK int) Dims {
	d.SeqLenQ, d.SeqLenK = totalQ, totalK
	return d
}
