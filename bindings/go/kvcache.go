package flashattn

import (
	"fmt"
	"strings"
)

// KVCache is the cache of AttentionKVCache (the header's "KV cache"): kCache and vCache hold the
// keys and values of the tokens each sequence has seen so far, and the call's queries are each
// sequence's last tokens: with len_k = SeqLens[b] + N_new, query i of sequence b is token
// len_k - SeqLenQ + i, and every mask (Causal, Window, ALiBi) is aligned that way.
type KVCache struct {
	// SeqLens: [Batch], the tokens each sequence holds before the call, from the start of its
	// rows (or of its first page). The call does not update it: add N_new for the next step.
	SeqLens []int32
	// BlockTable: empty for a contiguous cache, kCache [Batch, SeqLenK, HeadsKV, HeadDim] and
	// vCache [Batch, SeqLenK, HeadsKV, HeadDimV], SeqLenK the tokens a sequence has room for.
	// Else the cache is paged: kCache and vCache are pages of PageSize rows, [pages, PageSize,
	// HeadsKV, HeadDim] (the number of pages follows from their length), and BlockTable
	// [Batch, pages per sequence] names the page of each block of PageSize tokens of a
	// sequence. Only the entries of the pages a sequence uses are read (-1 marks the others by
	// custom); pages may be shared by sequences that only read them. Dims.SeqLenK is not used
	// then: a sequence has room for PageSize times its pages.
	BlockTable []int32
	PageSize   int
	// KNew, VNew: [Batch, N_new, HeadsKV, HeadDim] and [Batch, N_new, HeadsKV, HeadDimV], rows
	// appended to each sequence as its tokens SeqLens[b] .. SeqLens[b] + N_new - 1 before it
	// is attended; AttentionKVCache writes them into kCache and vCache. Empty: none.
	KNew, VNew []float32
	// RotaryCos, RotarySin: [positions, RotaryDim / 2], a rotary embedding of the first
	// RotaryDim features (0: all HeadDim; even) of q and of KNew, by their positions (new token
	// i of sequence b at SeqLens[b] + i; the cached rows are taken as rotated already). Empty:
	// none. The pair (x, y) of index r at position t becomes (x cos - y sin, x sin + y cos),
	// cos = RotaryCos[t, r], sin = RotarySin[t, r]; the pair is the features (r, r + RotaryDim
	// / 2) (GPT-NeoX's layout), or (2r, 2r + 1) with RotaryInterleaved (GPT-J's).
	RotaryCos, RotarySin []float32
	RotaryDim            int
	RotaryInterleaved    bool
}

// paged tells whether the cache has a block table.
func (kc *KVCache) paged() bool { return len(kc.BlockTable) > 0 }

// solve is shape with its dimension at worked out from values, the tensor's length; an error
// that names the shape (its dimensions called names) when no size >= 1 fits.
func solve(name, names string, values int, shape []int64, at int) ([]int64, error) {
	out := append([]int64{}, shape...)
	out[at] = 1
	if row := elements(out); values >= row && values%row == 0 {
		out[at] = int64(values / row)
		return out, nil
	}
	dims := make([]string, len(shape))
	for i, s := range shape {
		dims[i] = fmt.Sprint(s)
	}
	dims[at] = "n"
	return nil, &Error{Status: StatusInvalidShape,
		Message: fmt.Sprintf("%s: %d values are not %s = [%s] for any n >= 1", name, values, names, strings.Join(dims, ", "))}
}

// cacheShapes are the shapes of a cache call's tensors that the slices' lengths decide.
type cacheShapes struct {
	k, v, table, kNew, vNew, rotary []int64
}

// shapes checks d against the cache's layout and works out the shapes that follow from the
// slices' lengths: the pages of a paged cache, the block table's pages per sequence, N_new and
// the rotary tables' positions.
func (kc *KVCache) shapes(d Dims, kValues int) (*cacheShapes, error) {
	unused := ""
	if kc.paged() {
		unused = "SeqLenK"
	}
	if err := d.checkExcept(unused); err != nil {
		return nil, err
	}
	batch, hkv, hd, hdv := int64(d.Batch), int64(d.HeadsKV), int64(d.HeadDim), int64(d.headDimV())
	s := &cacheShapes{k: d.k(), v: d.v()}
	switch {
	case kc.paged() && kc.PageSize < 1:
		return nil, &Error{Status: StatusInvalidArgument,
			Message: fmt.Sprintf("kv cache: PageSize is %d; a paged cache (BlockTable given) needs PageSize >= 1", kc.PageSize)}
	case !kc.paged() && kc.PageSize != 0:
		return nil, &Error{Status: StatusInvalidArgument,
			Message: fmt.Sprintf("kv cache: PageSize is %d but BlockTable is empty (a contiguous cache has no pages)", kc.PageSize)}
	case kc.paged():
		table, err := solve("block_table", "[Batch, pages per sequence]", len(kc.BlockTable), []int64{batch, 0}, 1)
		if err != nil {
			return nil, err
		}
		rows := int64(kc.PageSize)
		k, err := solve("k", "[pages, PageSize, HeadsKV, HeadDim]", kValues, []int64{0, rows, hkv, hd}, 0)
		if err != nil {
			return nil, err
		}
		s.table, s.k, s.v = table, k, []int64{k[0], rows, hkv, hdv}
	}
	// N_new from whichever of KNew and VNew is given (the library names the other if missing).
	switch {
	case len(kc.KNew) > 0:
		kNew, err := solve("k_new", "[Batch, N_new, HeadsKV, HeadDim]", len(kc.KNew), []int64{batch, 0, hkv, hd}, 1)
		if err != nil {
			return nil, err
		}
		s.kNew, s.vNew = kNew, []int64{batch, kNew[1], hkv, hdv}
	case len(kc.VNew) > 0:
		vNew, err := solve("v_new", "[Batch, N_new, HeadsKV, HeadDimV]", len(kc.VNew), []int64{batch, 0, hkv, hdv}, 1)
		if err != nil {
			return nil, err
		}
		s.kNew, s.vNew = []int64{batch, vNew[1], hkv, hd}, vNew
	}
	if len(kc.RotaryCos) > 0 || len(kc.RotarySin) > 0 {
		r := kc.RotaryDim
		if r == 0 {
			r = d.HeadDim
		}
		if r < 2 || r%2 != 0 {
			return nil, &Error{Status: StatusInvalidArgument,
				Message: fmt.Sprintf("kv cache: the rotary dim is %d, must be even and >= 2 (RotaryDim 0: HeadDim)", r)}
		}
		table, name := kc.RotaryCos, "rotary_cos"
		if len(table) == 0 {
			table, name = kc.RotarySin, "rotary_sin"
		}
		rotary, err := solve(name, "[positions, RotaryDim / 2]", len(table), []int64{0, int64(r / 2)}, 0)
		if err != nil {
			return nil, err
		}
		s.rotary = rotary
	}
	return s, nil
}

// AttentionKVCache computes attention of float32 host data over a KV cache (see KVCache): q
// [Batch, SeqLenQ, HeadsQ, HeadDim] against kCache and vCache as cache lays them out, after
// appending cache.KNew and cache.VNew to them. It returns out [Batch, SeqLenQ, HeadsQ, HeadDimV]
// and the LSE [Batch, HeadsQ, SeqLenQ], and writes the appended (and rotated) rows into kCache
// and vCache; a call that fails leaves them as they were. opts and vars (nil: none) are those of
// AttentionEx, less the variable-length offsets, which a cache call does not take. The library
// checks the lengths, the table's entries and the rotary positions (ErrInvalidShape, with what
// is wrong). Forward only; a cache of Float16 or BFloat16 goes through ForwardEx.
func (c *Context) AttentionKVCache(d Dims, q, kCache, vCache []float32, cache *KVCache, opts *Options, vars *Variants) (out, lse []float32, err error) {
	if cache == nil {
		return nil, nil, &Error{Status: StatusInvalidArgument, Message: "kv cache: cache is nil"}
	}
	s, err := cache.shapes(d, len(kCache))
	if err != nil {
		return nil, nil, err
	}
	e := &exHost{}
	a := c.variantArgs(d, vars, opts, e)
	appending := s.kNew != nil
	e.in(hostOf("q", q, d.q(), Float32), &a.Q)
	k, v := hostOf("k", kCache, s.k, Float32), hostOf("v", vCache, s.v, Float32)
	k.written, v.written = appending, appending
	e.in(k, &a.K)
	e.in(v, &a.V)
	e.in(hostOf("cache_seqlens", cache.SeqLens, []int64{int64(d.Batch)}, Int32), &a.CacheSeqlens)
	if s.table != nil {
		e.in(hostOf("block_table", cache.BlockTable, s.table, Int32), &a.BlockTable)
	}
	for _, t := range []struct {
		name  string
		data  []float32
		shape []int64
		field **Tensor
	}{{"k_new", cache.KNew, s.kNew, &a.KNew}, {"v_new", cache.VNew, s.vNew, &a.VNew},
		{"rotary_cos", cache.RotaryCos, s.rotary, &a.RotaryCos},
		{"rotary_sin", cache.RotarySin, s.rotary, &a.RotarySin}} {
		if len(t.data) > 0 { // an empty slice is NULL: the library names what is missing
			e.in(hostOf(t.name, t.data, t.shape, Float32), t.field)
		}
	}
	a.RotaryInterleaved = cache.RotaryInterleaved
	out = make([]float32, elements(d.out()))
	lse = make([]float32, elements(d.lse()))
	e.out(hostOf("out", out, d.out(), Float32), &a.Out)
	e.out(hostOf("lse", lse, d.lse(), Float32), &a.LSE)
	if err := c.runEx(e, a, c.ForwardEx); err != nil {
		return nil, nil, err
	}
	return out, lse, nil
}
