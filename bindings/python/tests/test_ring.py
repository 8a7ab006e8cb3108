"""flashattn.ring_attention on the CPU backend: `ranks` threads, each with its shard of one
sequence and its own context, passing shards through a Python exchange over shared memory (the
library releases the GIL while it computes; the exchange takes it back); each rank's results
against one attention call over the whole sequence. Then a torch.distributed ring of processes
over gloo (Ring.from_process_group, autograd), where torch is installed."""
import socket
import threading

import numpy as np
import pytest

import flashattn

RNG = np.random.default_rng(7)


def global_rows(ranks, rank, n, layout):
    """The global token of each of rank's n local rows."""
    if layout == "contiguous":
        return np.arange(rank * n, (rank + 1) * n)
    half = n // 2
    return np.concatenate([np.arange(rank * half, (rank + 1) * half),
                           np.arange((2 * ranks - 1 - rank) * half, (2 * ranks - rank) * half)])


class SharedRing:
    """The ranks' shared memory: post, wait for all, copy the previous rank's, wait again."""

    def __init__(self, ranks):
        self.ranks, self.posted = ranks, [None] * ranks
        self.barrier = threading.Barrier(ranks)

    def exchange_for(self, rank):
        def exchange(send, recv):
            self.posted[rank] = send
            self.barrier.wait()
            recv[:] = self.posted[(rank - 1) % self.ranks]
            self.barrier.wait()
        return exchange


def run_ring(ranks, layout, n, causal=False, window=None, sinks=False, batch=2, hq=4, hkv=2, d=16,
             dv=8):
    tokens = ranks * n
    q = RNG.standard_normal((batch, tokens, hq, d), dtype=np.float32)
    k = RNG.standard_normal((batch, tokens, hkv, d), dtype=np.float32)
    v = RNG.standard_normal((batch, tokens, hkv, dv), dtype=np.float32)
    dout = RNG.standard_normal((batch, tokens, hq, dv), dtype=np.float32)
    s = RNG.standard_normal(hq, dtype=np.float32) if sinks else None
    kw = dict(causal=causal, window=window, sinks=s)
    want_out, want_lse = flashattn.attention(q, k, v, return_lse=True, **kw)
    want = flashattn.attention_backward(dout, q, k, v, want_out, want_lse, **kw)

    shared = SharedRing(ranks)
    results, errors = [None] * ranks, []

    def rank_main(r):
        try:
            rows = global_rows(ranks, r, n, layout)
            shard = [np.ascontiguousarray(x[:, rows]) for x in (q, k, v, dout)]
            ring = flashattn.Ring(ranks, r, layout=layout, exchange=shared.exchange_for(r))
            with flashattn.Context("cpu") as ctx:
                out, lse = flashattn.ring_attention(*shard[:3], ring, return_lse=True, context=ctx,
                                                    **kw)
                grads = flashattn.ring_attention_backward(shard[3], *shard[:3], out, lse, ring,
                                                          context=ctx, **kw)
            results[r] = (rows, out, lse, grads)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            shared.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    dsinks = 0
    for rows, out, lse, grads in results:
        np.testing.assert_allclose(out, want_out[:, rows], rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(lse, want_lse[:, :, rows], rtol=2e-5, atol=2e-5)
        for got, full in zip(grads[:3], want[:3]):
            np.testing.assert_allclose(got, full[:, rows], rtol=1e-4, atol=1e-4)
        if sinks:
            dsinks = dsinks + grads[3]
    if sinks:
        np.testing.assert_allclose(dsinks, want[3], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_equals_one_call(ranks, layout, causal):
    run_ring(ranks, layout, 6, causal=causal)


def test_ring_window_sinks_gqa():
    run_ring(3, "zigzag", 10, causal=True, window=(5, 0), sinks=True, hq=4, hkv=1)
    run_ring(2, "contiguous", 7, window=(3, 2), sinks=True)


def test_exchange_error_is_raised_from_the_call():
    class Broken(Exception):
        pass

    def exchange(send, recv):
        raise Broken("the wire is cut")

    q = RNG.standard_normal((1, 4, 2, 8), dtype=np.float32)
    ring = flashattn.Ring(2, 0, exchange=exchange)
    with pytest.raises(Broken, match="the wire is cut") as info:
        flashattn.ring_attention(q, q, q, ring)
    assert isinstance(info.value.__cause__, flashattn.Error)


def test_ring_arguments_refused():
    q = RNG.standard_normal((1, 5, 2, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="layout"):
        flashattn.Ring(2, 0, layout="spiral")
    with pytest.raises(flashattn.Error, match="odd"):  # zigzag needs an even shard
        flashattn.ring_attention(q, q, q, flashattn.Ring(2, 0, exchange=lambda s, r: None))
    with pytest.raises(flashattn.Error, match="exchange is NULL"):
        flashattn.ring_attention(q, q, q, flashattn.Ring(2, 1, layout="contiguous"))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_worker(rank, ranks, port, seed, failures):
    import torch
    import torch.distributed as dist
    try:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                                world_size=ranks)
        g = torch.Generator().manual_seed(seed)
        n, tokens = 8, 8 * ranks
        q, k, v, dout = (torch.randn(1, tokens, 2, 16, generator=g) for _ in range(4))
        sinks = torch.randn(2, generator=g)
        whole = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
        out = flashattn.attention(*whole[:3], causal=True, sinks=whole[3])
        out.backward(dout)
        rows = torch.from_numpy(global_rows(ranks, rank, n, "zigzag"))
        shard = [t[:, rows].clone().requires_grad_() for t in (q, k, v)]
        s = sinks.clone().requires_grad_()
        ring = flashattn.Ring.from_process_group(layout="zigzag")
        ring_out = flashattn.ring_attention(*shard, ring, causal=True, sinks=s)
        ring_out.backward(dout[:, rows])
        dist.all_reduce(s.grad)  # each rank holds its rows' share
        torch.testing.assert_close(ring_out, out[:, rows].detach(), rtol=2e-5, atol=2e-5)
        for got, full in zip(shard, whole[:3]):
            torch.testing.assert_close(got.grad, full.grad[:, rows], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(s.grad, whole[3].grad, rtol=1e-4, atol=1e-4)
        dist.destroy_process_group()
    except BaseException as e:
        failures.put("rank %d: %r" % (rank, e))
        raise


def test_torch_distributed_gloo_ring():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed has no gloo backend here")
    import torch.multiprocessing as mp
    ranks = 3
    ctx = mp.get_context("spawn")
    failures = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_gloo_worker, args=(r, ranks, port, 3, failures))
             for r in range(ranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    messages = []
    while not failures.empty():
        messages.append(failures.get())
    assert all(p.exitcode == 0 for p in procs), messages

