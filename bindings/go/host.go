package flashattn

import (
	"fmt"
)

// Dims are the sizes of one attention call: q [Batch, SeqLenQ, HeadsQ, HeadDim], k and v
// [Batch, SeqLenK, HeadsKV, HeadDim], the LSE [Batch, HeadsQ, SeqLenQ].
type Dims struct {
	Batch, SeqLenQ, SeqLenK, HeadsQ, HeadsKV, HeadDim int
}

func (d Dims) q() []int64 {
	return []int64{int64(d.Batch), int64(d.SeqLenQ), int64(d.HeadsQ), int64(d.HeadDim)}
}
func (d Dims) k() []int64 {
	return []int64{int64(d.Batch), int64(d.SeqLenK), int64(d.HeadsKV), int64(d.HeadDim)}
}
func (d Dims) lse() []int64 { return []int64{int64(d.Batch), int64(d.HeadsQ), int64(d.SeqLenQ)} }

func elements(shape []int64) int {
	n := 1
	for _, s := range shape {
		n *= int(s)
	}
	return n
}

func (d Dims) check() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"Batch", d.Batch}, {"SeqLenQ", d.SeqLenQ}, {"SeqLenK", d.SeqLenK}, {"HeadsQ", d.HeadsQ},
		{"HeadsKV", d.HeadsKV}, {"HeadDim", d.HeadDim}} {
		if f.v < 1 {
			return &Error{Status: StatusInvalidShape, Message: fmt.Sprintf("dims: %s is %d, must be >= 1", f.name, f.v)}
		}
	}
	return nil
}

// host is one tensor of a host-memory call: its data, shape and dtype.
type host struct {
	name  string
	data  []byte
	count int
	shape []int64
	dtype DType
}

// run copies the inputs into buffers of c, calls fn with views of them and of new output
// buffers, and copies the outputs back. A slice of the wrong length is an error.
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
	return nil
}

func hostOf[T float32 | uint16](name string, s []T, shape []int64, dtype DType) host {
	return host{name: name, data: asBytes(s), count: len(s), shape: shape, dtype: dtype}
}

func forwardHost[T float32 | uint16](c *Context, dtype DType, d Dims, q, k, v []T, opts *Options) ([]T, []float32, error) {
	if err := d.check(); err != nil {
		return nil, nil, err
	}
	out := make([]T, elements(d.q()))
	lse := make([]float32, elements(d.lse()))
	err := c.run(
		[]host{hostOf("q", q, d.q(), dtype), hostOf("k", k, d.k(), dtype), hostOf("v", v, d.k(), dtype)},
		[]host{hostOf("out", out, d.q(), dtype), hostOf("lse", lse, d.lse(), Float32)},
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
	dv := make([]T, elements(d.k()))
	err := c.run(
		[]host{hostOf("q", q, d.q(), dtype), hostOf("k", k, d.k(), dtype), hostOf("v", v, d.k(), dtype),
			hostOf("out", out, d.q(), dtype), hostOf("dout", dout, d.q(), dtype), hostOf("lse", lse, d.lse(), Float32)},
		[]host{hostOf("dq", dq, d.q(), dtype), hostOf("dk", dk, d.k(), dtype), hostOf("dv", dv, d.k(), dtype)},
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
