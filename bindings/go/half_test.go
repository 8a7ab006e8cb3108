package flashattn

import (
	"math"
	"testing"
)

func TestFloat16RoundTripsEveryValue(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := Float32FromFloat16(uint16(h))
		if f != f {
			if g := Float16FromFloat32(f); g&0x7c00 != 0x7c00 || g&0x3ff == 0 {
				t.Fatalf("NaN %#04x came back as %#04x", h, g)
			}
			continue
		}
		if g := Float16FromFloat32(f); g != uint16(h) {
			t.Fatalf("%#04x -> %g -> %#04x", h, f, g)
		}
	}
}

func TestBFloat16RoundTripsEveryValue(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := Float32FromBFloat16(uint16(h))
		if f != f {
			continue
		}
		if g := BFloat16FromFloat32(f); g != uint16(h) {
			t.Fatalf("%#04x -> %g -> %#04x", h, f, g)
		}
	}
}

func TestRoundingToNearestEven(t *testing.T) {
	cases := []struct {
		f    float32
		f16  uint16
		bf16 uint16
	}{
		{1, 0x3c00, 0x3f80},
		{-2, 0xc000, 0xc000},
		{65504, 0x7bff, 0x4780},
		{65520, 0x7c00, 0x4780},                 // halfway to the next binade: rounds to infinity
		{1 + 1.0/2048, 0x3c00, 0x3f80},          // tie, even stays
		{1 + 3.0/2048, 0x3c02, 0x3f80},          // tie, odd rounds up
		{5.960464477539063e-08, 0x0001, 0x3380}, // smallest subnormal half
		{2.9e-08, 0x0000, 0x32f9},               // below half of it: zero
		{float32(math.Inf(-1)), 0xfc00, 0xff80},
		{1 + 1.0/256, 0x3c04, 0x3f80}, // bf16 tie (even stays)
		{1 + 3.0/256, 0x3c0c, 0x3f82}, // bf16 tie (odd rounds up)
	}
	for _, c := range cases {
		if got := Float16FromFloat32(c.f); got != c.f16 {
			t.Errorf("float16(%g) = %#04x, want %#04x", c.f, got, c.f16)
		}
		if got := BFloat16FromFloat32(c.f); got != c.bf16 {
			t.Errorf("bfloat16(%g) = %#04x, want %#04x", c.f, got, c.bf16)
		}
	}
}
