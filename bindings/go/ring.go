package flashattn

import (
	"fmt"
	"runtime"

	"flashattn.dev/flashattn/capi"
)

// Layout places a rank's shard in the sequence of Ranks * n tokens (n: the shard's tokens).
type Layout int64

// The values of flashattn_cp_layout_t (fixed by the header; ring_test.go checks them).
const (
	// Contiguous: rank r holds tokens [r n, (r + 1) n).
	Contiguous Layout = 0
	// Zigzag: the sequence in 2 Ranks chunks of n / 2 tokens (n even); rank r holds chunk r,
	// then chunk 2 Ranks - 1 - r, so that a causal mask gives every rank the same work.
	Zigzag Layout = 1
)

// Ring is a rank's place in a context-parallel ring (the header's "Context parallelism") and
// its transport: Exchange (host memory: CPU contexts) or NcclComm (the address of an ncclComm_t
// on a CUDA context's device). With Ranks 1 neither is needed.
type Ring struct {
	Ranks, Rank int
	Layout      Layout
	// Exchange sends send to rank + 1 and fills recv (as long, the library's workspace, valid
	// during the call only) from rank - 1, returning nil once both are done. An error it returns
	// (or a panic) fails the call, which returns that error.
	Exchange func(send, recv []byte) error
	NcclComm uintptr
}

// RingForward is this rank's part of a context-parallel forward: a's Out and LSE (its queries
// over the whole sequence) from its shard a.Q, a.K, a.V ([batch, n, heads, head_dim]). Masks
// of a.Options are the sequence's (positions global); a may carry Sinks (not ALiBi, offsets or
// a cache). A collective call: every rank of the ring makes it.
func (c *Context) RingForward(r *Ring, a *Args) error {
	defer runtime.KeepAlive(c)
	return withRing(r, func(cp *capi.CpArgs) error {
		return withArgs(a, func(ra *capi.Args) error { return capi.Flashattn_cp_forward(c.h, cp, ra, 0, 0) })
	})
}

// RingBackward is this rank's part of the backward: a's DQ, DK, DV of its shard (DSinks: its
// rows' share; sum it over the ranks) from the shard's tensors and RingForward's Out and LSE.
func (c *Context) RingBackward(r *Ring, a *Args) error {
	defer runtime.KeepAlive(c)
	return withRing(r, func(cp *capi.CpArgs) error {
		return withArgs(a, func(ra *capi.Args) error { return capi.Flashattn_cp_backward(c.h, cp, ra, 0, 0) })
	})
}

// RingWorkspaceSize is the scratch the ring calls need, and whether they would be refused
// (every rank should ask, and agree, before the first call: a rank refused later leaves the
// others waiting). The transport is not used.
func (c *Context) RingWorkspaceSize(r *Ring, a *Args, backward bool) (int, error) {
	defer runtime.KeepAlive(c)
	var n uint64
	err := withRing(r, func(cp *capi.CpArgs) error {
		return withArgs(a, func(ra *capi.Args) error {
			return capi.Flashattn_cp_workspace_size(&n, c.h, cp, ra, boolFlag(backward))
		})
	})
	return int(n), err
}

// withRing runs fn with r's flashattn_cp_args_t; the exchange's own error wins over the
// library's report of it.
func withRing(r *Ring, fn func(*capi.CpArgs) error) error {
	if r == nil {
		r = &Ring{Ranks: 1}
	}
	cp := new(capi.CpArgs) // an allocation of its own, holding no Go pointer
	if err := capi.Flashattn_cp_args_init(cp); err != nil {
		return err
	}
	cp.Ranks, cp.Rank, cp.Layout, cp.NcclComm = int64(r.Ranks), int64(r.Rank), int64(r.Layout), r.NcclComm
	if r.Exchange == nil {
		return fn(cp)
	}
	call := capi.NewExchangeCall(cp, r.Exchange)
	err := fn(cp)
	if xerr := call.Close(); xerr != nil {
		return fmt.Errorf("%w (the library: %v)", xerr, err)
	}
	return err
}
