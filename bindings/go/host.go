package flashattn

import (
	"fmt"
)

// Dims are the sizes of one attention call: q [Batch, SeqLenQ, HeadsQ, HeadDim], k [Batch,
// SeqLenK, HeadsKV, HeadDim], v [Batch, SeqLenK, HeadsKV, HeadDimV], out [Batch, SeqLenQ,
// HeadsQ, HeadDimV], the LSE [Batch, HeadsQ, SeqLenQ]. HeadDimV 0 means HeadDim.
type Dims struct {
	Batch, SeqLenQ, SeqLenK, HeadsQ, HeadsKV, HeadDim int
	HeadDimV                                          int
}

func (d Dims) headDimV() int {
	if d.HeadDimV == 0 {
		return d.HeadDim
	}
	return d.HeadDimV
}

func (d Dims) q() []int64 {
	return []int64{int64(d.Batch), int64(d.SeqLenQ), int64(d.HeadsQ), int64(d.HeadDim)}
}
func (d Dims) k() []int64 {
	return []int64{int64(d.Batch), int64(d.SeqLenK), int64(d.HeadsKV), int64(d.HeadDim)}
}
func (d Dims) v() []int64 {
	return []int64{int64(d.Batch), int64(d.SeqLenK), int64(d.HeadsKV), int64(d.headDimV())}
}
func (d Dims) out() []int64 {
	return []int64{int64(d.Batch), int64(d.SeqLenQ), int64(d.HeadsQ), int64(d.headDimV())}
}
func (d Dims) lse() []int64 { return []int64{int64(d.Batch), int64(d.HeadsQ), int64(d.SeqLenQ)} }

// packed drops the batch dimension: the shapes of a variable-length batch, whose SeqLenQ and
// SeqLenK count every sequence's tokens.
func (d Dims) packed() Dims {
	d.Batch = 1
	return d
}

func dropBatch(shape []int64) []int64 { return shape[1:] }

func elements(shape []int64) int {
	n := 1
	for _, s := range shape {
		n *= int(s)
	}
	return n
}

func (d Dims) check() error { return d.checkExcept("") }

// checkExcept checks every size but the one named unused (one the call does not read).
func (d Dims) checkExcept(unused string) error {
	for _, f := range []struct {
		name string
		v    int
	}{{"Batch", d.Batch}, {"SeqLenQ", d.SeqLenQ}, {"SeqLenK", d.SeqLenK}, {"HeadsQ", d.HeadsQ},
		{"HeadsKV", d.HeadsKV}, {"HeadDim", d.HeadDim}, {"HeadDimV", d.headDimV()}} {
		if f.v < 1 && f.name != unused {
			return &Error{Status: StatusInvalidShape, Message: fmt.Sprintf("dims: %s is %d, must be >= 1", f.name, f.v)}
		}
	}
	return nil
}

// host is one tensor of a host-memory call: its data, shape and dtype; written marks an input
// that the call also writes (a KV cache that rows are appended to).
type host struct {
	name    string
	data    []byte
	count   int
	shape   []int64
	dtype   DType
	written bool
}

// run copies the inputs into buffers of c, calls fn with views of them and of new output
// buffers, and copies the outputs back, and the inputs marked written, once fn succeeded (a
// failed call leaves the caller's slices as they were). A slice of the wrong length is an
// error.
func (c *Context) run(ins, outs []host, fn func(in, out []Tensor) error) error {
	var bufs []*Buffer
	defer func() {
		for _, b := range bufs {
			b.Close()
		}
	}()
	views := func(hs []host, write bool) ([]Tensor, error) {
		ts := make([]Tensor, len(hs))
		for i, h := range hs {
			if want := elements(h.shape); h.count != want {
				return nil, &Error{Status: StatusInvalidShape,
					Message: fmt.Sprintf("%s: %d values for shape %v, want %d", h.name, h.count, h.shape, want)}
			}
			b, err := c.NewBuffer(len(h.data))
			if err != nil {
				return nil, err
			}
			bufs = append(bufs, b)
			if write {
				if err := b.Write(0, h.data); err != nil {
					return nil, err
				}
			}
			ts[i] = b.View(h.dtype, h.shape...)
		}
		return ts, nil
	}
	in, err := views(ins, true)
	if err != nil {
		return err
	}
	out, err := views(outs, false)
	if err != nil {
		return err
	}
	if err := fn(in, out); err != nil {
		return err
	}
	for i, h := range outs {
		if err := out[i].Buffer.Read(0, h.data); err != nil {
			return err
		}
	}
	for i, h := range ins {
		if h.written {
			if err := in[i].Buffer.Read(0, h.data); err != nil {
				return err
			}
		}
	}
	return nil
}

func hostOf[T float32 | uint16 | int32](name string, s []T, shape []int64, dtype DType) host {
	return host{name: name, data: asBytes(s), count: len(s), shape: shape, dtype: dtype}
}

func forwardHost[T float32 | uint16](c *Context, dtype DType, d Dims, q, k, v []T, opts *Options) ([]T, []float32, error) {
	if err := d.check(); err != nil {
		return nil, nil, err
	}
	out := make([]T, elements(d.out()))
	lse := make([]float32, elements(d.lse()))
	err := c.run(
		[]host{hostOf("q", q, d.q(), dtype), hostOf("k", k, d.k(), dtype), hostOf("v", v, d.v(), dtype)},
		[]host{hostOf("out", out, d.out(), dtype), hostOf("lse", lse, d.lse(), Float32)},
		func(in, o []Tensor) error { return c.Forward(in[0], in[1], in[2], o[0], &o[1], opts) })
	if err != nil {
		return nil, nil, err
	}
	return out, lse, nil
}

func backwardHost[T float32 | uint16](c *Context, dtype DType, d Dims, q, k, v, out, dout []T, lse []float32, opts *Options) ([]T, []T, []T, error) {
	if err := d.check(); err != nil {
		return nil, nil, nil, err
	}
	dq := make([]T, elements(d.q()))
	dk := make([]T, elements(d.k()))
	dv := make([]T, elements(d.v()))
	err := c.run(
		[]host{hostOf("q", q, d.q(), dtype), hostOf("k", k, d.k(), dtype), hostOf("v", v, d.v(), dtype),
			hostOf("out", out, d.out(), dtype), hostOf("dout", dout, d.out(), dtype), hostOf("lse", lse, d.lse(), Float32)},
		[]host{hostOf("dq", dq, d.q(), dtype), hostOf("dk", dk, d.k(), dtype), hostOf("dv", dv, d.v(), dtype)},
		func(in, o []Tensor) error {
			return c.Backward(in[0], in[1], in[2], in[3], in[4], in[5], o[0], o[1], o[2], opts)
		})
	if err != nil {
		return nil, nil, nil, err
	}
	return dq, dk, dv, nil
}

// Attention computes attention of float32 host data (through buffers of the context, so any
// backend that supports float32). It returns out [Batch, SeqLenQ, HeadsQ, HeadDim] and the LSE
// [Batch, HeadsQ, SeqLenQ].
func (c *Context) Attention(d Dims, q, k, v []float32, opts *Options) (out, lse []float32, err error) {
	return forwardHost(c, Float32, d, q, k, v, opts)
}

// AttentionBackward computes dq, dk, dv of float32 host data, given the forward's out and lse and
// the gradient dout.
func (c *Context) AttentionBackward(d Dims, q, k, v, out, dout, lse []float32, opts *Options) (dq, dk, dv []float32, err error) {
	return backwardHost(c, Float32, d, q, k, v, out, dout, lse, opts)
}

// Attention16 is Attention for Float16 or BFloat16 data, given as its bits.
func (c *Context) Attention16(dtype DType, d Dims, q, k, v []uint16, opts *Options) (out []uint16, lse []float32, err error) {
	return forwardHost(c, dtype, d, q, k, v, opts)
}

// AttentionBackward16 is AttentionBackward for Float16 or BFloat16 data, given as its bits.
func (c *Context) AttentionBackward16(dtype DType, d Dims, q, k, v, out, dout []uint16, lse []float32, opts *Options) (dq, dk, dv []uint16, err error) {
	return backwardHost(c, dtype, d, q, k, v, out, dout, lse, opts)
}

// Variants of a host-memory call (AttentionEx, AttentionBackwardEx): the variants that need
// tensors of their own. Every field nil (or 0) is off.
type Variants struct {
	// AlibiSlopes: [HeadsQ], or [Batch, HeadsQ] (Batch the number of sequences).
	AlibiSlopes []float32
	// Sinks: [HeadsQ]; AttentionBackwardEx returns their gradient.
	Sinks []float32
	// CuSeqlensQ, CuSeqlensK: [Batch + 1] offsets of a variable-length batch (both or neither).
	// The host slices are then packed: q [SeqLenQ, HeadsQ, HeadDim] with SeqLenQ the tokens of
	// every sequence, k and v [SeqLenK, HeadsKV, ...], out likewise, the LSE [HeadsQ, SeqLenQ];
	// Dims.Batch is not used. MaxSeqlenQ and MaxSeqlenK: the longest sequence, 0: the longest
	// the offsets hold.
	CuSeqlensQ, CuSeqlensK []int32
	MaxSeqlenQ, MaxSeqlenK int
}

func longest(offsets []int32) int {
	n := 0
	for i := 1; i < len(offsets); i++ {
		if l := int(offsets[i] - offsets[i-1]); l > n {
			n = l
		}
	}
	return n
}

// exHost is one call of AttentionEx / AttentionBackwardEx: the inputs and outputs as host
// tensors, in the order of the Args fields they fill.
type exHost struct {
	ins, outs       []host
	inArgs, outArgs []**Tensor
}

func (e *exHost) in(h host, field **Tensor) {
	e.ins, e.inArgs = append(e.ins, h), append(e.inArgs, field)
}
func (e *exHost) out(h host, field **Tensor) {
	e.outs, e.outArgs = append(e.outs, h), append(e.outArgs, field)
}

func (c *Context) runEx(e *exHost, a *Args, fn func(*Args) error) error {
	return c.run(e.ins, e.outs, func(in, out []Tensor) error {
		for i := range in {
			*e.inArgs[i] = &in[i]
		}
		for i := range out {
			*e.outArgs[i] = &out[i]
		}
		return fn(a)
	})
}

// shapes of a call's tensors: batched, or packed for a variable-length batch.
func (d Dims) shapes(vars *Variants) (q, k, v, out, lse []int64) {
	if vars == nil || vars.CuSeqlensQ == nil && vars.CuSeqlensK == nil {
		return d.q(), d.k(), d.v(), d.out(), d.lse()
	}
	p := d.packed()
	return dropBatch(p.q()), dropBatch(p.k()), dropBatch(p.v()), dropBatch(p.out()),
		[]int64{int64(d.HeadsQ), int64(d.SeqLenQ)}
}

func (c *Context) variantArgs(d Dims, vars *Variants, opts *Options, e *exHost) *Args {
	a := &Args{Options: opts}
	if vars == nil {
		return a
	}
	if vars.AlibiSlopes != nil {
		shape := []int64{int64(len(vars.AlibiSlopes))}
		if d.HeadsQ > 0 && len(vars.AlibiSlopes) != d.HeadsQ && len(vars.AlibiSlopes)%d.HeadsQ == 0 {
			shape = []int64{int64(len(vars.AlibiSlopes) / d.HeadsQ), int64(d.HeadsQ)}
		}
		e.in(hostOf("alibi_slopes", vars.AlibiSlopes, shape, Float32), &a.AlibiSlopes)
	}
	if vars.Sinks != nil {
		e.in(hostOf("sinks", vars.Sinks, []int64{int64(len(vars.Sinks))}, Float32), &a.Sinks)
	}
	for _, o := range []struct {
		name    string
		offsets []int32
		field   **Tensor
		max     int
		maxArg  *int
	}{{"cu_seqlens_q", vars.CuSeqlensQ, &a.CuSeqlensQ, vars.MaxSeqlenQ, &a.MaxSeqlenQ},
		{"cu_seqlens_k", vars.CuSeqlensK, &a.CuSeqlensK, vars.MaxSeqlenK, &a.MaxSeqlenK}} {
		if o.offsets != nil {
			e.in(hostOf(o.name, o.offsets, []int64{int64(len(o.offsets))}, Int32), o.field)
			if o.max == 0 {
				o.max = longest(o.offsets)
			}
		}
		*o.maxArg = o.max
	}
	return a
}

// AttentionEx is Attention with the variants of vars (nil: none) and of opts (Window,
// Softcap): it returns out and the LSE, packed as the inputs for a variable-length batch.
func (c *Context) AttentionEx(d Dims, q, k, v []float32, opts *Options, vars *Variants) (out, lse []float32, err error) {
	if err := d.check(); err != nil {
		return nil, nil, err
	}
	qs, ks, vs, os, ls := d.shapes(vars)
	e := &exHost{}
	a := c.variantArgs(d, vars, opts, e)
	e.in(hostOf("q", q, qs, Float32), &a.Q)
	e.in(hostOf("k", k, ks, Float32), &a.K)
	e.in(hostOf("v", v, vs, Float32), &a.V)
	out = make([]float32, elements(os))
	lse = make([]float32, elements(ls))
	e.out(hostOf("out", out, os, Float32), &a.Out)
	e.out(hostOf("lse", lse, ls, Float32), &a.LSE)
	if err := c.runEx(e, a, c.ForwardEx); err != nil {
		return nil, nil, err
	}
	return out, lse, nil
}

// AttentionBackwardEx is AttentionBackward with the variants of vars and opts, which must be
// the forward's. dsinks, the gradient of vars.Sinks, is nil without sinks.
func (c *Context) AttentionBackwardEx(d Dims, q, k, v, out, dout, lse []float32, opts *Options, vars *Variants) (dq, dk, dv, dsinks []float32, err error) {
	if err := d.check(); err != nil {
		return nil, nil, nil, nil, err
	}
	qs, ks, vs, os, ls := d.shapes(vars)
	e := &exHost{}
	a := c.variantArgs(d, vars, opts, e)
	for _, in := range []struct {
		name  string
		data  []float32
		shape []int64
		field **Tensor
	}{{"q", q, qs, &a.Q}, {"k", k, ks, &a.K}, {"v", v, vs, &a.V}, {"out", out, os, &a.Out},
		{"dout", dout, os, &a.DOut}, {"lse", lse, ls, &a.LSE}} {
		e.in(hostOf(in.name, in.data, in.shape, Float32), in.field)
	}
	dq, dk, dv = make([]float32, elements(qs)), make([]float32, elements(ks)), make([]float32, elements(vs))
	e.out(hostOf("dq", dq, qs, Float32), &a.DQ)
	e.out(hostOf("dk", dk, ks, Float32), &a.DK)
	e.out(hostOf("dv", dv, vs, Float32), &a.DV)
	if vars != nil && vars.Sinks != nil {
		dsinks = make([]float32, len(vars.Sinks))
		e.out(hostOf("dsinks", dsinks, []int64{int64(len(dsinks))}, Float32), &a.DSinks)
	}
	if err := c.runEx(e, a, c.BackwardEx); err != nil {
		return nil, nil, nil, nil, err
	}
	return dq, dk, dv, dsinks, nil
}

func mergeHost[T float32 | uint16](c *Context, dtype DType, d Dims, parts int, outs []T, lses []float32) ([]T, []float32, error) {
	if err := d.check(); err != nil {
		return nil, nil, err
	}
	if parts < 1 {
		return nil, nil, &Error{Status: StatusInvalidArgument, Message: fmt.Sprintf("parts is %d, must be >= 1", parts)}
	}
	// The parts as [parts * Batch, ...]: part p holds batch entries p * Batch onwards.
	stacked := func(shape []int64) []int64 {
		return append([]int64{int64(parts) * shape[0]}, shape[1:]...)
	}
	out := make([]T, elements(d.out()))
	lse := make([]float32, elements(d.lse()))
	err := c.run(
		[]host{hostOf("parts_out", outs, stacked(d.out()), dtype), hostOf("parts_lse", lses, stacked(d.lse()), Float32)},
		[]host{hostOf("out", out, d.out(), dtype), hostOf("lse", lse, d.lse(), Float32)},
		func(in, o []Tensor) error {
			first, firstLSE := in[0], in[1]
			first.Shape, firstLSE.Shape = d.out(), d.lse()
			return c.Merge(PartsBackToBack(parts, first, firstLSE), o[0], &o[1])
		})
	if err != nil {
		return nil, nil, err
	}
	return out, lse, nil
}

// MergeParts merges float32 partial results in host memory (see Merge): outs holds `parts`
// outputs [Batch, SeqLenQ, HeadsQ, HeadDimV] one after another, lses their LSEs [Batch, HeadsQ,
// SeqLenQ]; it returns the merged output and LSE. SeqLenK is not used.
func (c *Context) MergeParts(d Dims, parts int, outs, lses []float32) (out, lse []float32, err error) {
	return mergeHost(c, Float32, d, parts, outs, lses)
}

// MergeParts16 is MergeParts for Float16 or BFloat16 outputs, given as their bits.
func (c *Context) MergeParts16(dtype DType, d Dims, parts int, outs []uint16, lses []float32) (out []uint16, lse []float32, err error) {
	return mergeHost(c, dtype, d, parts, outs, lses)
}
