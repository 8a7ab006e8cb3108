package flashattn

import "math"

// Float16FromFloat32 rounds f to the nearest IEEE binary16 (ties to even) and returns its bits.
func Float16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 // NaN
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00 // too large: infinity
	}
	if e <= 0 { // a subnormal half, or zero
		if e < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint(14 - e)
		r := mant >> shift
		rem, half := mant&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | mant>>13
	if rem := mant & 0x1fff; rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent: the largest values round to infinity
	}
	return sign | uint16(r)
}

// Float32FromFloat16 is the value of the binary16 bits h.
func Float32FromFloat16(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0:
		f := float32(mant) / (1 << 24) // subnormal (or zero): mant * 2^-24, exact
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}

// BFloat16FromFloat32 rounds f to the nearest bfloat16 (ties to even) and returns its bits.
func BFloat16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40 // NaN stays a (quiet) NaN
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// Float32FromBFloat16 is the value of the bfloat16 bits h.
func Float32FromBFloat16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }
