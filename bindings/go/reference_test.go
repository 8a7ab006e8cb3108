package flashattn

import (
	"math"
	"math/rand"
)

// The naive algorithm in float64 arithmetic, every materialized value (S, P, O; dP, dS and the
// gradients) passed through round: the identity gives the float64 truth; rounding to a dtype
// gives the standard algorithm in that precision, whose error sets the tolerance:
// max|ours - ref64| <= 2 * max|standard - ref64| + atol.

type rounding func(float64) float64

func exact(x float64) float64 { return x }

func roundTo(dtype DType) rounding {
	switch dtype {
	case Float16:
		return func(x float64) float64 { return float64(Float32FromFloat16(Float16FromFloat32(float32(x)))) }
	case BFloat16:
		return func(x float64) float64 { return float64(Float32FromBFloat16(BFloat16FromFloat32(float32(x)))) }
	}
	return func(x float64) float64 { return float64(float32(x)) }
}

var atol = map[DType]float64{Float32: 2e-5, Float16: 2e-3, BFloat16: 2e-2}

func (d Dims) qi(b, i, h, c int) int { return ((b*d.SeqLenQ+i)*d.HeadsQ+h)*d.HeadDim + c }
func (d Dims) ki(b, j, h, c int) int { return ((b*d.SeqLenK+j)*d.HeadsKV+h)*d.HeadDim + c }

// probabilities of row (b, h, i): P (rounded) per key, and the row's LSE.
func (d Dims) probabilities(q, k []float64, b, h, i int, causal bool, scale float64, r rounding) ([]float64, float64) {
	hk := h / (d.HeadsQ / d.HeadsKV)
	s := make([]float64, d.SeqLenK)
	m := math.Inf(-1)
	for j := range s {
		if causal && j > i+d.SeqLenK-d.SeqLenQ {
			s[j] = math.Inf(-1)
			continue
		}
		acc := 0.0
		for c := 0; c < d.HeadDim; c++ {
			acc += q[d.qi(b, i, h, c)] * k[d.ki(b, j, hk, c)]
		}
		s[j] = r(acc * scale)
		m = math.Max(m, s[j])
	}
	p := make([]float64, d.SeqLenK)
	if math.IsInf(m, -1) {
		return p, m // no key: P = 0, LSE = -inf
	}
	l := 0.0
	for j := range s {
		p[j] = math.Exp(s[j] - m)
		l += p[j]
	}
	for j := range p {
		p[j] = r(p[j] / l)
	}
	return p, m + math.Log(l)
}

func naive(d Dims, q, k, v []float64, causal bool, scale float64, r rounding) (out, lse []float64) {
	out = make([]float64, len(q))
	lse = make([]float64, d.Batch*d.HeadsQ*d.SeqLenQ)
	g := d.HeadsQ / d.HeadsKV
	for b := 0; b < d.Batch; b++ {
		for h := 0; h < d.HeadsQ; h++ {
			for i := 0; i < d.SeqLenQ; i++ {
				p, l := d.probabilities(q, k, b, h, i, causal, scale, r)
				lse[(b*d.HeadsQ+h)*d.SeqLenQ+i] = l
				for c := 0; c < d.HeadDim; c++ {
					acc := 0.0
					for j, pj := range p {
						acc += pj * v[d.ki(b, j, h/g, c)]
					}
					out[d.qi(b, i, h, c)] = r(acc)
				}
			}
		}
	}
	return out, lse
}

func naiveBackward(d Dims, q, k, v, dout []float64, causal bool, scale float64, r rounding) (dq, dk, dv []float64) {
	out, _ := naive(d, q, k, v, causal, scale, r)
	dq, dk, dv = make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
	g := d.HeadsQ / d.HeadsKV
	for b := 0; b < d.Batch; b++ {
		for h := 0; h < d.HeadsQ; h++ {
			hk := h / g
			for i := 0; i < d.SeqLenQ; i++ {
				p, _ := d.probabilities(q, k, b, h, i, causal, scale, r)
				delta := 0.0
				for c := 0; c < d.HeadDim; c++ {
					delta += dout[d.qi(b, i, h, c)] * out[d.qi(b, i, h, c)]
				}
				for j, pj := range p {
					if pj == 0 {
						continue
					}
					dp := 0.0
					for c := 0; c < d.HeadDim; c++ {
						dp += dout[d.qi(b, i, h, c)] * v[d.ki(b, j, hk, c)]
					}
					ds := r(pj * (r(dp) - delta))
					for c := 0; c < d.HeadDim; c++ {
						dq[d.qi(b, i, h, c)] += scale * ds * k[d.ki(b, j, hk, c)]
						dk[d.ki(b, j, hk, c)] += scale * ds * q[d.qi(b, i, h, c)]
						dv[d.ki(b, j, hk, c)] += pj * dout[d.qi(b, i, h, c)]
					}
				}
			}
		}
	}
	for _, s := range [][]float64{dq, dk, dv} {
		for i := range s {
			s[i] = r(s[i])
		}
	}
	return dq, dk, dv
}

// maxError is max|a - b|, equal infinities counting as 0 and NaN as infinite.
func maxError(a, b []float64) float64 {
	m := 0.0
	for i := range a {
		if a[i] == b[i] {
			continue
		}
		e := math.Abs(a[i] - b[i])
		if math.IsNaN(e) {
			return math.Inf(1)
		}
		m = math.Max(m, e)
	}
	return m
}

func random(rng *rand.Rand, n int, dtype DType) []float64 {
	r := roundTo(dtype)
	out := make([]float64, n)
	for i := range out {
		out[i] = r(rng.NormFloat64())
	}
	return out
}

func to32(x []float64) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(v)
	}
	return out
}

func to16(x []float64, dtype DType) []uint16 {
	out := make([]uint16, len(x))
	for i, v := range x {
		if dtype == Float16 {
			out[i] = Float16FromFloat32(float32(v))
		} else {
			out[i] = BFloat16FromFloat32(float32(v))
		}
	}
	return out
}

func from32(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

func from16(x []uint16, dtype DType) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		if dtype == Float16 {
			out[i] = float64(Float32FromFloat16(v))
		} else {
			out[i] = float64(Float32FromBFloat16(v))
		}
	}
	return out
}
