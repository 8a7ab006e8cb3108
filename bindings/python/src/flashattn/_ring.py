"""Context parallelism (ring attention): flashattn_cp_forward / flashattn_cp_backward over a
Ring, this rank's place in the ring and the transport that joins it (docs/context-parallel.md).

The transport is the caller's, as the C API has it:
  - exchange: a Python callable exchange(send, recv) for host arrays (CPU contexts): send and
    recv are writable memoryviews of one size over the library's workspace; it sends send's
    bytes to rank + 1 and fills recv with rank - 1's, returning once both are done. It runs on
    the calling thread while the library waits (the GIL is held only inside it). An exception
    it raises fails the call and is raised again from it.
  - nccl_comm: the address (an int) of an ncclComm_t on the arrays' GPU (CUDA contexts).
Ring.from_process_group() makes either from a torch.distributed process group: gloo (or any
group that can send CPU tensors) for host arrays, an NCCL communicator of the group's ranks for
CUDA tensors (made through the NCCL that torch loaded; Ring.close() destroys it).
"""
import ctypes
import sys

from . import _arrays, _core
from ._lib import Error, low

_LAYOUTS = {"contiguous": low.FLASHATTN_CP_LAYOUT_CONTIGUOUS, "zigzag": low.FLASHATTN_CP_LAYOUT_ZIGZAG}
_EXCHANGE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_size_t)


class Ring:
    """This rank's place in a ring of `ranks` ranks, the layout of the shards, and the transport.

    layout: "zigzag" (rank r holds chunks r and 2 ranks - 1 - r of the sequence in 2 ranks
    chunks: the same causal work on every rank; the shard's token count must be even) or
    "contiguous" (rank r holds tokens [r n, (r + 1) n)). Give exchange (host arrays) or
    nccl_comm (CUDA); with ranks = 1 neither is needed."""

    def __init__(self, ranks, rank, *, layout="zigzag", exchange=None, nccl_comm=None):
        if layout not in _LAYOUTS:
            raise ValueError("layout is %r; 'zigzag' or 'contiguous'" % (layout,))
        if exchange is not None and nccl_comm is not None:
            raise ValueError("give one transport: exchange or nccl_comm")
        self.ranks, self.rank, self.layout = int(ranks), int(rank), layout
        self.exchange, self.nccl_comm = exchange, nccl_comm
        self._destroy = None  # what close() releases (a communicator made here)
        self._failure = None
        self._callback = _EXCHANGE(self._call_exchange) if exchange is not None else None

    @classmethod
    def from_process_group(cls, group=None, *, layout="zigzag", device=None):
        """The ring of a torch.distributed process group (None: the default group), in rank
        order. device None: host arrays, exchanged by the group's send/recv (gloo); a CUDA device
        (int or torch.device): an NCCL communicator over the group's ranks on that device, for
        CUDA tensors."""
        import torch.distributed as dist
        ranks, rank = dist.get_world_size(group), dist.get_rank(group)
        if device is None:
            return cls(ranks, rank, layout=layout, exchange=_group_exchange(group, ranks, rank))
        comm, destroy = _nccl_comm(group, ranks, rank, device)
        ring = cls(ranks, rank, layout=layout, nccl_comm=comm)
        ring._destroy = destroy
        return ring

    def close(self):
        if self._destroy is not None:
            self._destroy()
            self._destroy = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call_exchange(self, _user, send, recv, size):
        try:
            self.exchange(memoryview((ctypes.c_char * size).from_address(send)).cast("B"),
                          memoryview((ctypes.c_char * size).from_address(recv)).cast("B"))
            return 0
        except BaseException as e:  # an exception must not cross the C frames
            self._failure = e
            return 1

    def _args(self):
        cp = low.flashattn_cp_args_t()
        low.flashattn_cp_args_init(cp)
        cp.ranks, cp.rank, cp.layout = self.ranks, self.rank, _LAYOUTS[self.layout]
        if self.nccl_comm is not None:
            cp.nccl_comm = int(self.nccl_comm)
        if self._callback is not None:
            low.cp_args_set_exchange(cp, ctypes.cast(self._callback, ctypes.c_void_p).value, None)
        return cp

    def _run(self, call, ctx, args, device):
        if device >= 0 and self.exchange is not None:
            raise ValueError("a Python exchange moves host memory; CUDA tensors need a ring with "
                             "nccl_comm (Ring.from_process_group(device=...))")
        self._failure = None
        try:
            call(ctx.handle, self._args(), args.struct, None, 0)
        except Error as e:
            if self._failure is not None:
                failure, self._failure = self._failure, None
                raise failure from e
            raise


def _group_exchange(group, ranks, rank):
    """exchange(send, recv) over a process group's point-to-point send and recv."""
    import torch
    import torch.distributed as dist
    to_global = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
    nxt, prev = to_global((rank + 1) % ranks), to_global((rank - 1) % ranks)

    def exchange(send, recv):
        s = torch.frombuffer(send, dtype=torch.uint8)
        r = torch.frombuffer(recv, dtype=torch.uint8)
        for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, s, nxt, group),
                                               dist.P2POp(dist.irecv, r, prev, group)]):
            request.wait()
    return exchange


def _nccl_comm(group, ranks, rank, device):
    """(address of an ncclComm_t over the group's ranks on device, a function destroying it),
    made with the NCCL torch loaded: rank 0's unique id broadcast through the group."""
    import torch
    import torch.distributed as dist
    try:
        nccl = ctypes.CDLL("libnccl.so.2")
    except OSError:
        import nvidia.nccl
        nccl = ctypes.CDLL(list(nvidia.nccl.__path__)[0] + "/lib/libnccl.so.2")

    class UniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]  # NCCL_UNIQUE_ID_BYTES

    uid = UniqueId()
    if rank == 0 and nccl.ncclGetUniqueId(ctypes.byref(uid)) != 0:
        raise RuntimeError("ncclGetUniqueId failed")
    box = [ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid)) if rank == 0 else None]
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast_object_list(box, src=src, group=group)
    ctypes.memmove(ctypes.addressof(uid), box[0], len(box[0]))
    comm = ctypes.c_void_p()
    with torch.cuda.device(device):
        status = nccl.ncclCommInitRank(ctypes.byref(comm), ranks, uid, rank)
    if status != 0:
        raise RuntimeError("ncclCommInitRank failed: NCCL status %d" % status)
    return comm.value, lambda: nccl.ncclCommDestroy(comm)


def _variants(sinks):
    return _core.Variants(sinks=sinks)


def forward(q, k, v, ring, options, sinks=None, context=None):
    """(out, lse) of this rank's queries over the whole sequence, as arrays of q's kind."""
    aq, ak, av = _arrays.describe_all(("q", "k", "v"), (q, k, v))
    out = _arrays.empty(aq, _core._out_shape(aq, av))
    lse = _arrays.empty(aq, _core._lse_shape(aq), float32=True)
    variants = _variants(sinks)
    described = _core._describe_variants(variants, aq)
    args = _core._Args(_core.options(*options), variants,
                       dict(q=aq, k=ak, v=av, out=_arrays.describe("out", out),
                            lse=_arrays.describe("lse", lse), **described))
    ring._run(low.flashattn_cp_forward, _core._context(aq, context), args, aq.device)
    return out, lse


def backward(dout, q, k, v, out, lse, ring, options, sinks=None, context=None):
    """(dq, dk, dv) of this rank's shard, and its share of dsinks after them with sinks."""
    arrays = _arrays.describe_all(("dout", "q", "k", "v", "out", "lse"), (dout, q, k, v, out, lse))
    a_dout, aq, ak, av, a_out, a_lse = arrays
    grads = [_arrays.empty(a, a.shape) for a in (aq, ak, av)]
    a_dq, a_dk, a_dv = (_arrays.describe(n, g) for n, g in zip(("dq", "dk", "dv"), grads))
    variants = _variants(sinks)
    described = _core._describe_variants(variants, aq)
    dsinks = None
    if sinks is not None:
        dsinks = _arrays.empty(described["sinks"], described["sinks"].shape, float32=True)
        described["dsinks"] = _arrays.describe("dsinks", dsinks)
    args = _core._Args(_core.options(*options), variants,
                       dict(q=aq, k=ak, v=av, out=a_out, lse=a_lse, dout=a_dout, dq=a_dq,
                            dk=a_dk, dv=a_dv, **described))
    ring._run(low.flashattn_cp_backward, _core._context(aq, context), args, aq.device)
    return tuple(grads) + ((dsinks,) if dsinks is not None else ())


def needs_autograd(q, k, v, sinks):
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(q, torch.Tensor) or not torch.is_grad_enabled():
        return False
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, sinks))


def autograd_forward(q, k, v, ring, options, sinks, context):
    """(out, lse) through a torch.autograd.Function whose backward is flashattn_cp_backward."""
    import torch

    class RingAttention(torch.autograd.Function):
        @staticmethod
        def forward(fctx, q, k, v, sinks):
            out, lse = forward(q, k, v, ring, options, sinks, context)
            fctx.save_for_backward(q, k, v, out, lse)
            fctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(fctx, dout, _dlse):
            q, k, v, out, lse = fctx.saved_tensors
            if dout.stride(-1) != 1:
                dout = dout.contiguous()
            grads = backward(dout, q, k, v, out, lse, ring, options, sinks, context)
            return grads[0], grads[1], grads[2], (grads[3] if len(grads) > 3 else None)

    return RingAttention.apply(q, k, v, sinks)
