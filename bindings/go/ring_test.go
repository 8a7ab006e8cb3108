package flashattn

import (
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"

	"flashattn.dev/flashattn/capi"
)

// The shared memory of rank goroutines: each exchange posts the rank's send bytes, waits for
// every rank, copies the previous rank's, and waits again.
type sharedRing struct {
	ranks  int
	posted [][]byte
	mu     sync.Mutex
	cond   *sync.Cond
	count  int
	gen    int
}

func newSharedRing(ranks int) *sharedRing {
	s := &sharedRing{ranks: ranks, posted: make([][]byte, ranks)}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *sharedRing) barrier() {
	s.mu.Lock()
	defer s.mu.Unlock()
	gen := s.gen
	s.count++
	if s.count == s.ranks {
		s.count, s.gen = 0, s.gen+1
		s.cond.Broadcast()
		return
	}
	for gen == s.gen {
		s.cond.Wait()
	}
}

func (s *sharedRing) exchangeFor(rank int) func(send, recv []byte) error {
	return func(send, recv []byte) error {
		s.mu.Lock()
		s.posted[rank] = append([]byte(nil), send...)
		s.mu.Unlock()
		s.barrier()
		s.mu.Lock()
		copy(recv, s.posted[(rank+s.ranks-1)%s.ranks])
		s.mu.Unlock()
		s.barrier()
		return nil
	}
}

// ringRows is the global token of each of rank's n local rows.
func ringRows(ranks, rank, n int, layout Layout) []int {
	rows := make([]int, 0, n)
	if layout == Contiguous {
		for i := 0; i < n; i++ {
			rows = append(rows, rank*n+i)
		}
		return rows
	}
	half := n / 2
	for i := 0; i < half; i++ {
		rows = append(rows, rank*half+i)
	}
	for i := 0; i < half; i++ {
		rows = append(rows, (2*ranks-1-rank)*half+i)
	}
	return rows
}

// gatherRows takes rows of a [batch, tokens, heads * dim] tensor.
func gatherRows(x []float32, batch, tokens, row int, rows []int) []float32 {
	var out []float32
	for b := 0; b < batch; b++ {
		for _, i := range rows {
			out = append(out, x[(b*tokens+i)*row:(b*tokens+i+1)*row]...)
		}
	}
	return out
}

// attendEx runs ForwardEx then BackwardEx (or the ring's) over fresh buffers of ctx: out, dq,
// dk, dv as slices.
func attendEx(t *testing.T, ctx *Context, ring *Ring, b, n, hq, hkv, d int, q, k, v, dout []float32, opts *Options) [4][]float32 {
	t.Helper()
	buf := func(x []float32) *Buffer {
		bb, err := ctx.NewBuffer(4 * len(x))
		if err != nil {
			t.Fatal(err)
		}
		if err := bb.WriteFloat32(x); err != nil {
			t.Fatal(err)
		}
		return bb
	}
	qs, ks := []int64{int64(b), int64(n), int64(hq), int64(d)}, []int64{int64(b), int64(n), int64(hkv), int64(d)}
	qb, kb, vb, dob := buf(q), buf(k), buf(v), buf(dout)
	ob, lb, dqb, dkb, dvb := buf(make([]float32, len(q))), buf(make([]float32, b*hq*n)), buf(make([]float32, len(q))), buf(make([]float32, len(k))), buf(make([]float32, len(v)))
	view := func(bb *Buffer, shape []int64) *Tensor { x := bb.View(Float32, shape...); return &x }
	a := &Args{Q: view(qb, qs), K: view(kb, ks), V: view(vb, ks), Out: view(ob, qs), LSE: view(lb, []int64{int64(b), int64(hq), int64(n)}),
		DOut: view(dob, qs), DQ: view(dqb, qs), DK: view(dkb, ks), DV: view(dvb, ks), Options: opts}
	var err error
	if ring == nil {
		if err = ctx.ForwardEx(a); err == nil {
			err = ctx.BackwardEx(a)
		}
	} else if err = ctx.RingForward(ring, a); err == nil {
		err = ctx.RingBackward(ring, a)
	}
	if err != nil {
		t.Fatal(err)
	}
	var res [4][]float32
	for i, bb := range []*Buffer{ob, dqb, dkb, dvb} {
		res[i] = make([]float32, bb.Size()/4)
		if err := bb.ReadFloat32(res[i]); err != nil {
			t.Fatal(err)
		}
	}
	return res
}

func TestRingEqualsOneCall(t *testing.T) {
	const b, hq, hkv, d = 2, 4, 2, 8
	for _, layout := range []Layout{Contiguous, Zigzag} {
		for _, ranks := range []int{1, 2, 3} {
			for _, opts := range []*Options{{}, {Causal: true}, {Window: &Window{Left: 3, Right: 0}}} {
				n := 6
				tokens := ranks * n
				rng := rand.New(rand.NewSource(int64(ranks)))
				q, k, v, dout := to32(random(rng, b*tokens*hq*d, Float32)), to32(random(rng, b*tokens*hkv*d, Float32)),
					to32(random(rng, b*tokens*hkv*d, Float32)), to32(random(rng, b*tokens*hq*d, Float32))
				whole := attendEx(t, cpuContext(t), nil, b, tokens, hq, hkv, d, q, k, v, dout, opts)
				shared := newSharedRing(ranks)
				var wg sync.WaitGroup
				results := make([][4][]float32, ranks)
				for r := 0; r < ranks; r++ {
					wg.Add(1)
					go func(r int) {
						defer wg.Done()
						rows := ringRows(ranks, r, n, layout)
						ctx := cpuContext(t)
						ring := &Ring{Ranks: ranks, Rank: r, Layout: layout, Exchange: shared.exchangeFor(r)}
						results[r] = attendEx(t, ctx, ring, b, n, hq, hkv, d, gatherRows(q, b, tokens, hq*d, rows), gatherRows(k, b, tokens, hkv*d, rows),
							gatherRows(v, b, tokens, hkv*d, rows), gatherRows(dout, b, tokens, hq*d, rows), opts)
					}(r)
				}
				wg.Wait()
				for r := 0; r < ranks; r++ {
					rows := ringRows(ranks, r, n, layout)
					for i, row := range []int{hq * d, hq * d, hkv * d, hkv * d} {
						want := gatherRows(whole[i], b, tokens, row, rows)
						if e := maxError(from32(results[r][i]), from32(want)); e > 1e-4 {
							t.Errorf("%v ranks %d %+v rank %d: result %d differs from one call by %g", layout, ranks, opts, r, i, e)
						}
					}
				}
			}
		}
	}
}

func TestLayoutsAreTheHeaders(t *testing.T) {
	if int64(Contiguous) != int64(capi.FLASHATTN_CP_LAYOUT_CONTIGUOUS) || int64(Zigzag) != int64(capi.FLASHATTN_CP_LAYOUT_ZIGZAG) {
		t.Fatal("Contiguous and Zigzag differ from flashattn_cp_layout_t")
	}
}

func TestRingExchangeErrorIsTheCallsError(t *testing.T) {
	ctx := cpuContext(t)
	cut := errors.New("the wire is cut")
	q := make([]float32, 64)
	qb, err := ctx.NewBuffer(4 * len(q))
	if err != nil {
		t.Fatal(err)
	}
	ob, _ := ctx.NewBuffer(4 * len(q))
	qt, ot := qb.View(Float32, 1, 4, 2, 8), ob.View(Float32, 1, 4, 2, 8)
	a := &Args{Q: &qt, K: &qt, V: &qt, Out: &ot}
	err = ctx.RingForward(&Ring{Ranks: 2, Layout: Zigzag, Exchange: func(_, _ []byte) error { return cut }}, a)
	if !errors.Is(err, cut) || !strings.Contains(fmt.Sprint(err), "exchange function returned 1") {
		t.Fatalf("want the exchange's error with the library's, got %v", err)
	}
	err = ctx.RingForward(&Ring{Ranks: 2, Layout: Zigzag, Exchange: func(_, _ []byte) error { panic("no wire") }}, a)
	if !errors.Is(err, ErrDevice) || !strings.Contains(fmt.Sprint(err), "no wire") {
		t.Fatalf("want a DEVICE error naming the panic, got %v", err)
	}
	if _, err := ctx.RingWorkspaceSize(&Ring{Ranks: 2, Rank: 2}, a, false); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("rank 2 of 2: want INVALID_ARGUMENT, got %v", err)
	}
}
