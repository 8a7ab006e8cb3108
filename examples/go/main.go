// The small attention every binding's example computes: batch 1, seqlen 16, heads 2, head_dim 8,
// causal, inputs from a fixed linear congruential generator, on the CPU; checked against a naive
// float64 loop. Prints OK and the largest difference.
package main

import (
	"fmt"
	"log"
	"math"

	"flashattn.dev/flashattn"
)

const B, N, H, D = 1, 16, 2, 8

// lcgValues returns n values in [-1, 1) from x = (1103515245 x + 12345) mod 2^31.
func lcgValues(n int, state *uint64) []float32 {
	out := make([]float32, n)
	for i := range out {
		*state = (1103515245**state + 12345) % (1 << 31)
		out[i] = float32(float64(*state)/(1<<30) - 1)
	}
	return out
}

func naive(q, k, v []float32) []float64 {
	at := func(x []float32, b, s, h, c int) float64 { return float64(x[((b*N+s)*H+h)*D+c]) }
	out := make([]float64, B*N*H*D)
	for b := 0; b < B; b++ {
		for h := 0; h < H; h++ {
			for i := 0; i < N; i++ {
				s := make([]float64, i+1) // causal: keys j <= i
				m := math.Inf(-1)
				for j := range s {
					for c := 0; c < D; c++ {
						s[j] += at(q, b, i, h, c) * at(k, b, j, h, c)
					}
					s[j] /= math.Sqrt(D)
					m = math.Max(m, s[j])
				}
				sum := 0.0
				for j := range s {
					s[j] = math.Exp(s[j] - m)
					sum += s[j]
				}
				for j := range s {
					for c := 0; c < D; c++ {
						out[((b*N+i)*H+h)*D+c] += s[j] / sum * at(v, b, j, h, c)
					}
				}
			}
		}
	}
	return out
}

func main() {
	state := uint64(1)
	q, k, v := lcgValues(B*N*H*D, &state), lcgValues(B*N*H*D, &state), lcgValues(B*N*H*D, &state)

	ctx, err := flashattn.NewContext(flashattn.CPU, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Close()
	dims := flashattn.Dims{Batch: B, SeqLenQ: N, SeqLenK: N, HeadsQ: H, HeadsKV: H, HeadDim: D}
	out, _, err := ctx.Attention(dims, q, k, v, &flashattn.Options{Causal: true})
	if err != nil {
		log.Fatal(err)
	}

	worst := 0.0
	for i, want := range naive(q, k, v) {
		worst = math.Max(worst, math.Abs(float64(out[i])-want))
	}
	if !(worst < 1e-5) {
		log.Fatalf("FAILED: max error %g", worst)
	}
	fmt.Printf("OK go: max error %.3g\n", worst)
}
