package flashattn

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"

	"flashattn.dev/flashattn/capi"
)

// The KV cache on the CPU backend, through AttentionKVCache and ForwardEx: a paged cache (any
// page size, a shuffled block table, unused entries -1) gives what a contiguous cache and the
// variable-length forward over the same tokens give, bit for bit, and what float64 attention
// gives; appended rows land in the cache exactly, nothing else there changes, and are attended;
// the rotary embedding (both layouts, a part of the head dim) against a float64 rotation; bad
// lengths and tables are refused with the library's status and message, the cache intact.

// cacheSentinel fills the rows of a cache that hold no token: a NaN, so that attention that
// read one would show it, and bits no computation makes, so that a write to one shows.
var cacheSentinel = math.Float32frombits(0x7fc0dead)

// sparePages are pages of a paged cache that no sequence uses.
const sparePages = 2

// cacheProblem is a batch of sequences whose keys a cache holds: lens[b] tokens of sequence b,
// its last nNew appended by the call; SeqLenQ queries per sequence (its last tokens).
type cacheProblem struct {
	d    Dims // SeqLenK is the layout's
	lens []int
	nNew int
	q    []float64   // [Batch, SeqLenQ, HeadsQ, HeadDim]
	k, v [][]float64 // per sequence: [lens[b], HeadsKV, HeadDim], [lens[b], HeadsKV, HeadDimV]
}

func newCacheProblem(d Dims, lens []int, nNew int, seed int64) cacheProblem {
	rng := rand.New(rand.NewSource(seed))
	d.Batch = len(lens)
	p := cacheProblem{d: d, lens: lens, nNew: nNew, q: random(rng, elements(d.q()), Float32)}
	for _, n := range lens {
		p.k = append(p.k, random(rng, n*d.HeadsKV*d.HeadDim, Float32))
		p.v = append(p.v, random(rng, n*d.HeadsKV*d.headDimV(), Float32))
	}
	return p
}

// cacheLayout places a problem's tokens: a contiguous cache of capacity tokens per sequence, or
// (pageSize > 0) pages of pageSize rows, as many per sequence as capacity needs, in an order
// shuffled by seed.
type cacheLayout struct {
	pageSize, capacity int
	seed               int64
}

// builtCache is a problem in a layout: the call's Dims and KVCache, the cache before the call
// and as the call must leave it.
type builtCache struct {
	dims           Dims
	kc             *KVCache
	k, v           []float32
	kAfter, vAfter []float32
	held           []int
	capacity       int
	kShape, vShape []int64            // of the cache's tensors
	row            func(b, t int) int // the cache row (slot * rows + row) of token t of sequence b
}

func maxInt(xs ...int) int {
	m := xs[0]
	for _, x := range xs {
		if x > m {
			m = x
		}
	}
	return m
}

func filled(n int, x float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = x
	}
	return s
}

func (p cacheProblem) build(l cacheLayout) builtCache {
	d, hkv, hd, hdv := p.d, p.d.HeadsKV, p.d.HeadDim, p.d.headDimV()
	capacity := maxInt(append([]int{l.capacity, 1}, p.lens...)...)
	c := builtCache{kc: &KVCache{}}
	rows, slots := capacity, d.Batch
	if l.pageSize > 0 {
		pagesPerSeq := (capacity + l.pageSize - 1) / l.pageSize
		capacity = pagesPerSeq * l.pageSize
		rows, slots = l.pageSize, d.Batch*pagesPerSeq+sparePages
		order := rand.New(rand.NewSource(l.seed)).Perm(slots)
		table := make([]int32, d.Batch*pagesPerSeq)
		for i := range table {
			table[i] = -1 // past the pages a sequence uses
		}
		for b, n := range p.lens {
			for j := 0; j < (n+l.pageSize-1)/l.pageSize; j++ {
				table[b*pagesPerSeq+j] = int32(order[b*pagesPerSeq+j])
			}
		}
		c.kc.BlockTable, c.kc.PageSize = table, l.pageSize
		c.row = func(b, t int) int { return int(table[b*pagesPerSeq+t/l.pageSize])*rows + t%l.pageSize }
	} else {
		c.row = func(b, t int) int { return b*rows + t }
	}
	c.capacity = capacity
	c.dims = d
	if l.pageSize == 0 {
		c.dims.SeqLenK = capacity
	} else {
		c.dims.SeqLenK = 0 // not used by a paged cache
	}
	c.kShape = []int64{int64(slots), int64(rows), int64(hkv), int64(hd)}
	c.vShape = []int64{int64(slots), int64(rows), int64(hkv), int64(hdv)}
	c.k, c.kAfter = filled(slots*rows*hkv*hd, cacheSentinel), filled(slots*rows*hkv*hd, cacheSentinel)
	c.v, c.vAfter = filled(slots*rows*hkv*hdv, cacheSentinel), filled(slots*rows*hkv*hdv, cacheSentinel)
	if p.nNew > 0 {
		c.kc.KNew = make([]float32, d.Batch*p.nNew*hkv*hd)
		c.kc.VNew = make([]float32, d.Batch*p.nNew*hkv*hdv)
	}
	for b, n := range p.lens {
		held := n - p.nNew
		c.held = append(c.held, held)
		c.kc.SeqLens = append(c.kc.SeqLens, int32(held))
		for t := 0; t < n; t++ {
			kRow, vRow := p.k[b][t*hkv*hd:(t+1)*hkv*hd], p.v[b][t*hkv*hdv:(t+1)*hkv*hdv]
			at := c.row(b, t)
			copy(c.kAfter[at*hkv*hd:], to32(kRow))
			copy(c.vAfter[at*hkv*hdv:], to32(vRow))
			if t < held {
				copy(c.k[at*hkv*hd:], to32(kRow))
				copy(c.v[at*hkv*hdv:], to32(vRow))
			} else {
				i := b*p.nNew + t - held
				copy(c.kc.KNew[i*hkv*hd:], to32(kRow))
				copy(c.kc.VNew[i*hkv*hdv:], to32(vRow))
			}
		}
	}
	return c
}

// rounded is the problem with its values rounded to dtype (exactly representable then).
func (p cacheProblem) rounded(dtype DType) cacheProblem {
	r := roundTo(dtype)
	each := func(x []float64) []float64 {
		out := make([]float64, len(x))
		for i, v := range x {
			out[i] = r(v)
		}
		return out
	}
	out := p
	out.q, out.k, out.v = each(p.q), nil, nil
	for b := range p.lens {
		out.k, out.v = append(out.k, each(p.k[b])), append(out.v, each(p.v[b]))
	}
	return out
}

// varlen is the variable-length forward over the problem's tokens (the held and the appended
// ones): out [Batch, SeqLenQ, HeadsQ, HeadDimV] and the LSE reordered to [Batch, HeadsQ,
// SeqLenQ], the cache call's layout.
func (p cacheProblem) varlen(t *testing.T, ctx *Context, opts *Options) (out, lse []float32) {
	t.Helper()
	d := p.d
	cuQ, cuK := []int32{0}, []int32{0}
	var k, v []float64
	for b := range p.lens {
		cuQ = append(cuQ, cuQ[b]+int32(d.SeqLenQ))
		cuK = append(cuK, cuK[b]+int32(p.lens[b]))
		k, v = append(k, p.k[b]...), append(v, p.v[b]...)
	}
	packed := d
	packed.SeqLenQ, packed.SeqLenK = d.Batch*d.SeqLenQ, int(cuK[d.Batch])
	out, packedLse, err := ctx.AttentionEx(packed, to32(p.q), to32(k), to32(v), opts, &Variants{CuSeqlensQ: cuQ, CuSeqlensK: cuK})
	if err != nil {
		t.Fatal(err)
	}
	lse = make([]float32, len(packedLse))
	for b := 0; b < d.Batch; b++ {
		for h := 0; h < d.HeadsQ; h++ {
			for i := 0; i < d.SeqLenQ; i++ {
				lse[(b*d.HeadsQ+h)*d.SeqLenQ+i] = packedLse[h*packed.SeqLenQ+b*d.SeqLenQ+i]
			}
		}
	}
	return out, lse
}

// reference is float64 attention per sequence (variantReference) over q and the keys k, in the
// cache call's layout.
func (p cacheProblem) reference(q []float64, k [][]float64, va variant) (out, lse []float64) {
	d := p.d
	nq := d.SeqLenQ * d.HeadsQ * d.HeadDim
	for b, n := range p.lens {
		one := d
		one.Batch, one.SeqLenK = 1, n
		o, l, _, _, _, _ := variantReference(one, q[b*nq:(b+1)*nq], k[b], p.v[b], nil, va)
		out, lse = append(out, o...), append(lse, l...)
	}
	return out, lse
}

// sameBits reports the first element where got and want differ in their bits.
func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Errorf("%s: element %d is %g (%#08x), want %g (%#08x)", what, i, got[i],
				math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			return
		}
	}
}

func TestPagedCacheIsContiguousCacheIsVarlen(t *testing.T) {
	ctx := cpuContext(t)
	// A sequence with no token, one with one (its queries mostly see none), none a page
	// multiple; GQA; three queries per sequence.
	d := Dims{SeqLenQ: 3, HeadsQ: 4, HeadsKV: 2, HeadDim: 16}
	p := newCacheProblem(d, []int{0, 1, 9, 23}, 0, 1)
	scale := 1 / math.Sqrt(float64(d.HeadDim))
	for _, va := range []variant{{causal: true, scale: scale}, {window: &Window{Left: 4, Right: 1}, scale: scale}} {
		refOut, refLse := p.reference(p.q, p.k, va)
		for _, alg := range []Algorithm{Flash, Standard} {
			opts := toOptions(va)
			opts.Algorithm = alg
			name := fmt.Sprintf("causal=%v/window=%v/algorithm=%d", va.causal, va.window != nil, alg)
			t.Run(name, func(t *testing.T) {
				wantOut, wantLse := p.varlen(t, ctx, opts)
				closeTo(t, "varlen out", wantOut, refOut)
				closeTo(t, "varlen lse", wantLse, refLse)
				for _, l := range []cacheLayout{{capacity: 30}, {pageSize: 1, seed: 1}, {pageSize: 7, seed: 7}, {pageSize: 16, seed: 16}} {
					c := p.build(l)
					out, lse, err := ctx.AttentionKVCache(c.dims, to32(p.q), c.k, c.v, c.kc, opts, nil)
					if err != nil {
						t.Fatalf("page size %d: %v", l.pageSize, err)
					}
					what := fmt.Sprintf("page size %d", l.pageSize)
					sameBits(t, what+": out", out, wantOut)
					sameBits(t, what+": lse", lse, wantLse)
					// Nothing appended: nothing written.
					sameBits(t, what+": k after the call", c.k, c.kAfter)
					sameBits(t, what+": v after the call", c.v, c.vAfter)
				}
			})
		}
	}
}

func TestAppendedRowsLandInTheCacheAndAreAttended(t *testing.T) {
	ctx := cpuContext(t)
	// Sequence 0 holds no token before the call; v's head dim differs from k's.
	d := Dims{SeqLenQ: 2, HeadsQ: 4, HeadsKV: 2, HeadDim: 16, HeadDimV: 8}
	p := newCacheProblem(d, []int{3, 12, 20}, 3, 2)
	opts := &Options{Causal: true}
	wantOut, wantLse := p.varlen(t, ctx, opts)
	refOut, refLse := p.reference(p.q, p.k, variant{causal: true, scale: 1 / math.Sqrt(float64(d.HeadDim))})
	closeTo(t, "varlen out", wantOut, refOut)
	closeTo(t, "varlen lse", wantLse, refLse)
	for _, l := range []cacheLayout{{capacity: 24}, {pageSize: 1, seed: 2}, {pageSize: 7, seed: 3}, {pageSize: 16, seed: 4}} {
		c := p.build(l)
		before := append([]float32{}, c.k...)
		out, lse, err := ctx.AttentionKVCache(c.dims, to32(p.q), c.k, c.v, c.kc, opts, nil)
		if err != nil {
			t.Fatalf("page size %d: %v", l.pageSize, err)
		}
		what := fmt.Sprintf("page size %d", l.pageSize)
		// The whole cache: the appended rows at their slots, every other row as it was.
		sameBits(t, what+": k after the call", c.k, c.kAfter)
		sameBits(t, what+": v after the call", c.v, c.vAfter)
		sameBits(t, what+": out", out, wantOut)
		sameBits(t, what+": lse", lse, wantLse)
		changed := 0
		for i := range before {
			if math.Float32bits(before[i]) != math.Float32bits(c.k[i]) {
				changed++
			}
		}
		if want := len(p.lens) * p.nNew * d.HeadsKV * d.HeadDim; changed != want {
			t.Errorf("%s: %d elements of k changed, want the %d appended", what, changed, want)
		}
	}
}

// rotaryTables are cos and sin of position * 10000^(-2r / dim), [positions, dim / 2].
func rotaryTables(positions, dim int) (cos, sin []float32) {
	for pos := 0; pos < positions; pos++ {
		for r := 0; r < dim/2; r++ {
			angle := float64(pos) * math.Pow(10000, -2*float64(r)/float64(dim))
			cos, sin = append(cos, float32(math.Cos(angle))), append(sin, float32(math.Sin(angle)))
		}
	}
	return cos, sin
}

// rotate64 rotates, in float64, the rows of x ([rows][heads][headDim]) that position places
// (position(row) < 0: left alone), and returns the bound of fp32's error for each element: one
// unit in the last place of the result and of each term of the pair (0 for the features not
// rotated, which must come back exactly).
func rotate64(x []float64, rows, heads, headDim, dim int, interleaved bool, cos, sin []float32, position func(row int) int) (out, bound []float64) {
	const ulp = 0x1p-23
	out, bound = append([]float64{}, x...), make([]float64, len(x))
	half := dim / 2
	for row := 0; row < rows; row++ {
		pos := position(row)
		if pos < 0 {
			continue
		}
		for h := 0; h < heads; h++ {
			e := (row*heads + h) * headDim
			for r := 0; r < half; r++ {
				i0, i1 := e+r, e+r+half
				if interleaved {
					i0, i1 = e+2*r, e+2*r+1
				}
				a, b := x[i0], x[i1]
				cs, sn := float64(cos[pos*half+r]), float64(sin[pos*half+r])
				out[i0], out[i1] = a*cs-b*sn, a*sn+b*cs
				terms := 2 * ulp * (math.Abs(a) + math.Abs(b))
				bound[i0], bound[i1] = ulp*math.Abs(out[i0])+terms, ulp*math.Abs(out[i1])+terms
			}
		}
	}
	return out, bound
}

func TestRotaryMatchesFloat64Rotation(t *testing.T) {
	ctx := cpuContext(t)
	const rotaryDim = 8 // of head dim 16: the last 8 features are not rotated
	d := Dims{SeqLenQ: 3, HeadsQ: 4, HeadsKV: 2, HeadDim: 16}
	p := newCacheProblem(d, []int{3, 10, 17}, 2, 3)
	d = p.d // Batch set
	va := variant{causal: true, scale: 1 / math.Sqrt(float64(d.HeadDim))}
	for _, interleaved := range []bool{false, true} {
		for _, l := range []cacheLayout{{capacity: 20}, {pageSize: 7, seed: 5}} {
			t.Run(fmt.Sprintf("interleaved=%v/page=%d", interleaved, l.pageSize), func(t *testing.T) {
				c := p.build(l)
				cos, sin := rotaryTables(c.capacity, rotaryDim)
				c.kc.RotaryCos, c.kc.RotarySin, c.kc.RotaryDim, c.kc.RotaryInterleaved = cos, sin, rotaryDim, interleaved
				out, lse, err := ctx.AttentionKVCache(c.dims, to32(p.q), c.k, c.v, c.kc, toOptions(va), nil)
				if err != nil {
					t.Fatal(err)
				}
				// Query i of sequence b at position lens[b] - SeqLenQ + i, new token t at t; the
				// held tokens are taken as rotated already.
				q, _ := rotate64(p.q, d.Batch*d.SeqLenQ, d.HeadsQ, d.HeadDim, rotaryDim, interleaved, cos, sin,
					func(row int) int { return p.lens[row/d.SeqLenQ] - d.SeqLenQ + row%d.SeqLenQ })
				k := make([][]float64, len(p.lens))
				for b, n := range p.lens {
					var bound []float64
					k[b], bound = rotate64(p.k[b], n, d.HeadsKV, d.HeadDim, rotaryDim, interleaved, cos, sin,
						func(t int) int {
							if t < c.held[b] {
								return -1
							}
							return t
						})
					for tok := c.held[b]; tok < n; tok++ {
						for e := 0; e < d.HeadsKV*d.HeadDim; e++ {
							got, want := float64(c.k[c.row(b, tok)*d.HeadsKV*d.HeadDim+e]), k[b][tok*d.HeadsKV*d.HeadDim+e]
							if !(math.Abs(got-want) <= bound[tok*d.HeadsKV*d.HeadDim+e]) {
								t.Fatalf("sequence %d token %d element %d in the cache: %g, the float64 rotation %g", b, tok, e, got, want)
							}
						}
					}
				}
				refOut, refLse := p.reference(q, k, va)
				closeTo(t, "out", out, refOut)
				closeTo(t, "lse", lse, refLse)
				// The rotation matters: attention over the unrotated tokens is another.
				plainOut, _ := p.reference(p.q, p.k, va)
				if maxError(from32(out), plainOut) < 1e-2 {
					t.Error("the rotary embedding changed nothing")
				}
			})
		}
	}
}

func TestBadCacheValuesAreRefusedAndTheCacheKept(t *testing.T) {
	ctx := cpuContext(t)
	d := Dims{SeqLenQ: 1, HeadsQ: 2, HeadsKV: 1, HeadDim: 16}
	p := newCacheProblem(d, []int{5, 20, 9}, 1, 4)
	cases := []struct {
		name     string
		layout   cacheLayout
		mutate   func(*builtCache)
		fragment string
	}{
		{"past the capacity", cacheLayout{capacity: 24}, func(c *builtCache) { c.kc.SeqLens[1] = 24 },
			"sequence 1: cache_seqlens[1] = 24 and 1 new rows make 25 tokens, past the cache's 24"},
		{"negative", cacheLayout{capacity: 24}, func(c *builtCache) { c.kc.SeqLens[2] = -3 },
			"cache_seqlens[2] is -3, must be >= 0"},
		{"past the pages", cacheLayout{pageSize: 8, seed: 6}, func(c *builtCache) { c.kc.SeqLens[0] = 24 },
			"sequence 0: cache_seqlens[0] = 24 and 1 new rows make 25 tokens, past the cache's 24"},
		{"table entry", cacheLayout{pageSize: 8, seed: 6}, func(c *builtCache) { c.kc.BlockTable[1*3+2] = -1 },
			"block_table[1, 2] is -1, outside k's 11 pages (sequence 1 uses its first 3 entries)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := p.build(tc.layout)
			tc.mutate(&c)
			k, v := append([]float32{}, c.k...), append([]float32{}, c.v...)
			out, lse, err := ctx.AttentionKVCache(c.dims, to32(p.q), c.k, c.v, c.kc, nil, nil)
			var e *Error
			if !errors.As(err, &e) || e.Status != StatusInvalidShape || !errors.Is(err, ErrInvalidShape) {
				t.Fatalf("want an *Error of status INVALID_SHAPE, got %v", err)
			}
			if want := "flashattn_forward_ex: " + tc.fragment; e.Message != want {
				t.Errorf("message %q, want %q", e.Message, want)
			}
			if out != nil || lse != nil {
				t.Error("a refused call returned results")
			}
			sameBits(t, "k", c.k, k)
			sameBits(t, "v", c.v, v)
		})
	}
}

// What the binding itself works out from the slices' lengths, and what it leaves to the
// library: each error names the field and says what is wrong.
func TestKVCacheShapesThatDoNotFit(t *testing.T) {
	ctx := cpuContext(t)
	d := Dims{Batch: 2, SeqLenQ: 1, SeqLenK: 8, HeadsQ: 2, HeadsKV: 2, HeadDim: 4}
	q, k := make([]float32, elements(d.q())), make([]float32, elements(d.k()))
	lens := []int32{3, 5}
	cases := []struct {
		cache    *KVCache
		vars     *Variants
		target   error
		fragment string
	}{
		{nil, nil, ErrInvalidArgument, "kv cache: cache is nil"},
		{&KVCache{SeqLens: lens, PageSize: 4}, nil, ErrInvalidArgument, "kv cache: PageSize is 4 but BlockTable is empty (a contiguous cache has no pages)"},
		{&KVCache{SeqLens: lens, BlockTable: []int32{0, 1}}, nil, ErrInvalidArgument, "kv cache: PageSize is 0; a paged cache (BlockTable given) needs PageSize >= 1"},
		{&KVCache{SeqLens: lens, BlockTable: []int32{0, 1, 2}, PageSize: 4}, nil, ErrInvalidShape, "block_table: 3 values are not [Batch, pages per sequence] = [2, n] for any n >= 1"},
		{&KVCache{SeqLens: lens, BlockTable: []int32{0, 1}, PageSize: 3}, nil, ErrInvalidShape, "k: 128 values are not [pages, PageSize, HeadsKV, HeadDim] = [n, 3, 2, 4] for any n >= 1"},
		{&KVCache{SeqLens: lens, KNew: make([]float32, 12), VNew: make([]float32, 16)}, nil, ErrInvalidShape, "k_new: 12 values are not [Batch, N_new, HeadsKV, HeadDim] = [2, n, 2, 4] for any n >= 1"},
		{&KVCache{SeqLens: lens, RotaryCos: make([]float32, 8), RotarySin: make([]float32, 8), RotaryDim: 3}, nil, ErrInvalidArgument, "kv cache: the rotary dim is 3, must be even and >= 2"},
		{&KVCache{SeqLens: lens, RotaryCos: make([]float32, 7), RotarySin: make([]float32, 7)}, nil, ErrInvalidShape, "rotary_cos: 7 values are not [positions, RotaryDim / 2] = [n, 2] for any n >= 1"},
		{&KVCache{SeqLens: []int32{3}}, nil, ErrInvalidShape, "cache_seqlens: 1 values for shape [2], want 2"},
		// The library's own messages.
		{&KVCache{SeqLens: lens, KNew: make([]float32, 16)}, nil, ErrInvalidArgument, "flashattn_forward_ex: v_new is NULL but k_new is given"},
		{&KVCache{SeqLens: lens, RotaryCos: make([]float32, 16)}, nil, ErrInvalidArgument, "flashattn_forward_ex: rotary_sin is NULL but rotary_cos is given"},
		{&KVCache{SeqLens: lens}, &Variants{CuSeqlensQ: []int32{0, 1, 2}, CuSeqlensK: []int32{0, 3, 8}}, ErrInvalidArgument, "flashattn_forward_ex: args: cache_seqlens and cu_seqlens_q are both set; a KV cache call takes a fixed-length q and no offsets"},
	}
	for i, c := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			_, _, err := ctx.AttentionKVCache(d, q, k, k, c.cache, nil, c.vars)
			var e *Error
			if !errors.As(err, &e) || !errors.Is(err, c.target) || !strings.Contains(e.Message, c.fragment) {
				t.Errorf("want %v with %q, got %v", c.target, c.fragment, err)
			}
		})
	}
}

// The Tensor-level call in Float16: a paged cache in buffers, one row appended per sequence,
// the queries rotated; the appended rows' bits land in the k and v buffers.
func TestForwardExOverAPagedFloat16Cache(t *testing.T) {
	if len(argsNames) != int(capi.NumArgTensors) {
		t.Fatalf("%d names for the %d tensor fields of capi.Args", len(argsNames), capi.NumArgTensors)
	}
	ctx := cpuContext(t)
	const dtype = Float16
	const batch, pageSize, pages, heads, headDim, held = 2, 4, 5, 2, 8, 6
	table := []int32{3, 0, -1, 4, 1, -1} // [2, 3]: sequence 0 in pages 3, 0; 1 in 4, 1
	rng := rand.New(rand.NewSource(9))
	q := to16(random(rng, batch*heads*headDim, dtype), dtype)
	kNew, vNew := to16(random(rng, batch*heads*headDim, dtype), dtype), to16(random(rng, batch*heads*headDim, dtype), dtype)
	kPages, vPages := to16(random(rng, pages*pageSize*heads*headDim, dtype), dtype), to16(random(rng, pages*pageSize*heads*headDim, dtype), dtype)
	cos, sin := rotaryTables(held+1, headDim)
	buffer := func(data []byte) *Buffer { return filledBuffer(t, ctx, data) }
	qb, kb, vb, knb, vnb := buffer(asBytes(q)), buffer(asBytes(kPages)), buffer(asBytes(vPages)), buffer(asBytes(kNew)), buffer(asBytes(vNew))
	lb, tb := buffer(asBytes([]int32{held, held})), buffer(asBytes(table))
	cb, sb := buffer(asBytes(cos)), buffer(asBytes(sin))
	ob, lseb := buffer(make([]byte, len(q)*2)), buffer(make([]byte, batch*heads*4))
	qt, ot := qb.View(dtype, batch, 1, heads, headDim), ob.View(dtype, batch, 1, heads, headDim)
	kt, vt := kb.View(dtype, pages, pageSize, heads, headDim), vb.View(dtype, pages, pageSize, heads, headDim)
	knt, vnt := knb.View(dtype, batch, 1, heads, headDim), vnb.View(dtype, batch, 1, heads, headDim)
	lens, bt, lt := lb.View(Int32, batch), tb.View(Int32, batch, 3), lseb.View(Float32, batch, heads, 1)
	ct, st := cb.View(Float32, held+1, headDim/2), sb.View(Float32, held+1, headDim/2)
	a := &Args{Q: &qt, K: &kt, V: &vt, Out: &ot, LSE: &lt, CacheSeqlens: &lens, BlockTable: &bt,
		KNew: &knt, VNew: &vnt, RotaryCos: &ct, RotarySin: &st, Options: &Options{Causal: true}}
	if err := ctx.SupportedEx(a, false); err != nil {
		t.Fatal(err)
	}
	if err := ctx.SupportedEx(a, true); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "forward only") {
		t.Errorf("the backward of a cache call: %v", err)
	}
	if n, err := ctx.WorkspaceSizeEx(a, false); err != nil || n <= 0 {
		t.Errorf("workspace of a rotated q: %d, %v", n, err)
	}
	if err := ctx.ForwardEx(a); err != nil {
		t.Fatal(err)
	}
	gotK, gotV := make([]uint16, len(kPages)), make([]uint16, len(vPages))
	if err := kb.ReadUint16(gotK); err != nil {
		t.Fatal(err)
	}
	if err := vb.ReadUint16(gotV); err != nil {
		t.Fatal(err)
	}
	row := heads * headDim
	// The first element of token tok of sequence b in the pages.
	slot := func(b, tok int) int { return (int(table[b*3+tok/pageSize])*pageSize + tok%pageSize) * row }
	appended := map[int]bool{}
	for b := 0; b < batch; b++ {
		at := slot(b, held)
		// v is written as given; k rotated at position held.
		for e := 0; e < row; e++ {
			appended[at+e] = true
			if gotV[at+e] != vNew[b*row+e] {
				t.Fatalf("sequence %d: v's appended element %d is %#04x, want %#04x", b, e, gotV[at+e], vNew[b*row+e])
			}
		}
		kRot, bound := rotate64(from16(kNew[b*row:(b+1)*row], dtype), 1, heads, headDim, headDim, false, cos, sin,
			func(int) int { return held })
		for e := 0; e < row; e++ {
			// fp32's rotation, then rounded once to fp16: half a unit in fp16's last place more.
			tol := bound[e] + 0x1p-11*math.Abs(kRot[e])
			if got := float64(Float32FromFloat16(gotK[at+e])); !(math.Abs(got-kRot[e]) <= tol) {
				t.Fatalf("sequence %d: k's appended element %d is %g, the float64 rotation %g", b, e, got, kRot[e])
			}
		}
	}
	for i := range gotK {
		if !appended[i] && (gotK[i] != kPages[i] || gotV[i] != vPages[i]) {
			t.Fatalf("element %d of the cache, in no appended row, changed", i)
		}
	}
	out := make([]uint16, len(q))
	if err := ob.ReadUint16(out); err != nil {
		t.Fatal(err)
	}
	// Against float64 attention over the rotated query and the cache as the call left it.
	qRot, _ := rotate64(from16(q, dtype), batch, heads, headDim, headDim, false, cos, sin, func(int) int { return held })
	one := Dims{Batch: 1, SeqLenQ: 1, SeqLenK: held + 1, HeadsQ: heads, HeadsKV: heads, HeadDim: headDim}
	for b := 0; b < batch; b++ {
		var k, v []float64
		for tok := 0; tok <= held; tok++ {
			at := slot(b, tok)
			k, v = append(k, from16(gotK[at:at+row], dtype)...), append(v, from16(gotV[at:at+row], dtype)...)
		}
		ref, _ := naive(one, qRot[b*row:(b+1)*row], k, v, true, 1/math.Sqrt(headDim), exact)
		// The dtype's atol twice: q's rotation and out are each rounded to fp16.
		if e := maxError(from16(out[b*row:(b+1)*row], dtype), ref); e > 2*atol[dtype] {
			t.Errorf("sequence %d: out differs from float64 attention by %g", b, e)
		}
	}
}

// cacheForward16 runs a cache call of Float16 or BFloat16 data through ForwardEx over buffers
// of ctx (device memory on a CUDA context): c's cache and q converted to dtype; out, the LSE and
// the cache as the call left it.
func cacheForward16(t *testing.T, ctx *Context, dtype DType, c builtCache, q []float64, opts *Options) (out []uint16, lse []float32, k, v []uint16, err error) {
	t.Helper()
	d := c.dims
	buffer := func(data []byte) *Buffer { return filledBuffer(t, ctx, data) }
	k, v = to16(from32(c.k), dtype), to16(from32(c.v), dtype)
	qb, kb, vb := buffer(asBytes(to16(q, dtype))), buffer(asBytes(k)), buffer(asBytes(v))
	out, lse = make([]uint16, elements(d.out())), make([]float32, elements(d.lse()))
	ob, lb := buffer(asBytes(out)), buffer(asBytes(lse))
	qt, kt, vt := qb.View(dtype, d.q()...), kb.View(dtype, c.kShape...), vb.View(dtype, c.vShape...)
	ot, lt := ob.View(dtype, d.out()...), lb.View(Float32, d.lse()...)
	seqlens := buffer(asBytes(c.kc.SeqLens)).View(Int32, int64(d.Batch))
	a := &Args{Q: &qt, K: &kt, V: &vt, Out: &ot, LSE: &lt, CacheSeqlens: &seqlens, Options: opts}
	if c.kc.BlockTable != nil {
		table := buffer(asBytes(c.kc.BlockTable)).View(Int32, int64(d.Batch), int64(len(c.kc.BlockTable)/d.Batch))
		a.BlockTable = &table
	}
	if c.kc.KNew != nil {
		n := int64(len(c.kc.KNew) / (d.Batch * d.HeadsKV * d.HeadDim))
		kNew := buffer(asBytes(to16(from32(c.kc.KNew), dtype))).View(dtype, int64(d.Batch), n, int64(d.HeadsKV), int64(d.HeadDim))
		vNew := buffer(asBytes(to16(from32(c.kc.VNew), dtype))).View(dtype, int64(d.Batch), n, int64(d.HeadsKV), int64(d.headDimV()))
		a.KNew, a.VNew = &kNew, &vNew
	}
	if err := ctx.ForwardEx(a); err != nil {
		return nil, nil, nil, nil, err
	}
	for _, r := range []struct {
		b   *Buffer
		dst []byte
	}{{ob, asBytes(out)}, {lb, asBytes(lse)}, {kb, asBytes(k)}, {vb, asBytes(v)}} {
		if err := r.b.Read(0, r.dst); err != nil {
			t.Fatal(err)
		}
	}
	return out, lse, k, v, nil
}

// A paged BFloat16 cache through buffers, a row appended: the flash algorithm within the
// project's rule of float64 attention (the standard algorithm in BFloat16 sets the bound), the
// cache left as both algorithms agree, bit for bit.
func TestCacheForward16MatchesFloat64(t *testing.T) {
	ctx := cpuContext(t)
	const dtype = BFloat16
	p := newCacheProblem(Dims{SeqLenQ: 2, HeadsQ: 8, HeadsKV: 2, HeadDim: 32}, []int{1, 40, 77}, 1, 12).rounded(dtype)
	c := p.build(cacheLayout{pageSize: 16, seed: 12})
	va := variant{causal: true, scale: 1 / math.Sqrt(float64(p.d.HeadDim))}
	out, lse, k, v, err := cacheForward16(t, ctx, dtype, c, p.q, &Options{Causal: true})
	if err != nil {
		t.Fatal(err)
	}
	stdOut, _, stdK, stdV, err := cacheForward16(t, ctx, dtype, c, p.q, &Options{Causal: true, Algorithm: Standard})
	if err != nil {
		t.Fatal(err)
	}
	refOut, refLse := p.reference(p.q, p.k, va)
	within(t, "out", from16(out, dtype), refOut, from16(stdOut, dtype), atol[dtype])
	closeTo(t, "lse", lse, refLse) // fp32 arithmetic on exact inputs
	// The cache as it must be left, in dtype (the sentinel NaN becomes dtype's NaN).
	kAfter, vAfter := to16(from32(c.kAfter), dtype), to16(from32(c.vAfter), dtype)
	for i := range k {
		if k[i] != kAfter[i] || v[i] != vAfter[i] || k[i] != stdK[i] || v[i] != stdV[i] {
			t.Fatalf("element %d of the cache: k %#04x, v %#04x (standard: %#04x, %#04x), want %#04x, %#04x",
				i, k[i], v[i], stdK[i], stdV[i], kAfter[i], vAfter[i])
		}
	}
}

// filledBuffer: a buffer of ctx holding data, closed when the test ends.
func filledBuffer(t *testing.T, ctx *Context, data []byte) *Buffer {
	t.Helper()
	b, err := ctx.NewBuffer(len(data))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := b.Write(0, data); err != nil {
		t.Fatal(err)
	}
	return b
}
