"""Forward and backward through the low layer, for any supported array kind."""
from . import _arrays
from ._lib import Error, context_for, low

_ALGORITHMS = {"flash": low.FLASHATTN_ALGORITHM_FLASH, "standard": low.FLASHATTN_ALGORITHM_STANDARD}


def options(causal, scale, algorithm, deterministic, window=None, softcap=None, num_splits=None):
    """A low-level flashattn_options_t. scale None (or 0) selects 1/sqrt(head_dim); window None is
    no sliding window, else (left, right) with -1 for an unbounded side; softcap None (or 0) is
    none; num_splits None (or 0) lets the library choose. The library checks the values."""
    o = low.flashattn_options_t()
    low.flashattn_options_init(o)
    o.softmax_scale = 0.0 if scale is None else float(scale)
    o.causal = int(bool(causal))
    if isinstance(algorithm, str):
        if algorithm not in _ALGORITHMS:
            raise ValueError("algorithm must be one of %s, not %r" % (sorted(_ALGORITHMS), algorithm))
        algorithm = _ALGORITHMS[algorithm]
    o.algorithm = int(algorithm)
    o.deterministic = int(bool(deterministic))
    if window is not None:
        try:
            left, right = window
        except (TypeError, ValueError):
            raise ValueError("window must be None or a pair (left, right), not %r" % (window,)) from None
        o.window = 1
        o.window_left = int(left)
        o.window_right = int(right)
    o.softcap = 0.0 if softcap is None else float(softcap)
    o.num_splits = 0 if num_splits is None else int(num_splits)
    return o


class Variants:
    """The variants that need tensors of their own (flashattn_args_t): ALiBi slopes, attention
    sinks, and the offsets of a variable-length batch. Every field None (and the lengths 0) is
    plain attention."""

    __slots__ = ("alibi_slopes", "sinks", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                 "max_seqlen_k")

    def __init__(self, alibi_slopes=None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None,
                 max_seqlen_q=None, max_seqlen_k=None):
        self.alibi_slopes, self.sinks = alibi_slopes, sinks
        self.cu_seqlens_q, self.cu_seqlens_k = cu_seqlens_q, cu_seqlens_k
        self.max_seqlen_q, self.max_seqlen_k = max_seqlen_q, max_seqlen_k

    def any(self):
        """Whether the call needs the args struct (flashattn_forward_ex) at all."""
        return any(getattr(self, f) is not None for f in self.__slots__)

    def tensors(self):
        return (("alibi_slopes", self.alibi_slopes), ("sinks", self.sinks),
                ("cu_seqlens_q", self.cu_seqlens_q), ("cu_seqlens_k", self.cu_seqlens_k))


NO_VARIANTS = Variants()


def _max_seqlen(value, offsets):
    """The max length the library gets: the one given, else the longest sequence the offsets
    hold (read from host memory; a device array needs it given)."""
    if value is not None:
        return int(value)
    if offsets is None:
        return 0
    if offsets.device >= 0:
        raise ValueError("max_seqlen_q and max_seqlen_k must be given with offsets in device "
                         "memory (reading them would synchronize with the device)")
    import numpy as np
    host = np.asarray(offsets.obj)
    if host.ndim != 1 or host.size < 2:
        return 0  # the library names the offsets' wrong shape
    # Never below 0: decreasing offsets are then reported as such, not as a negative length.
    return max(0, int(np.diff(host.astype(np.int64)).max()))


def _context(like, context):
    ctx = context if context is not None else context_for(like.device)
    if like.device >= 0:
        ctx.set_stream(_arrays.current_stream(like))
    return ctx


def _lse_shape(q):
    # [batch, heads_q, seqlen_q], or [heads_q, total_q] for a variable-length batch; for a q of
    # another rank the library reports the rank.
    if len(q.shape) == 4:
        return (q.shape[0], q.shape[2], q.shape[1])
    if len(q.shape) == 3:
        return (q.shape[1], q.shape[0])
    return None


def _out_shape(q, v):
    # q's sizes with v's head_dim (d_v may differ from d_qk).
    if len(q.shape) >= 1 and len(v.shape) >= 1:
        return tuple(q.shape[:-1]) + (v.shape[-1],)
    return tuple(q.shape)


class _Args:
    """A flashattn_args_t and the views it points to (kept here: the struct holds raw pointers
    to them)."""

    def __init__(self, opts, variants, described):
        self.struct = low.flashattn_args_t()
        low.flashattn_args_init(self.struct)
        self.keep = [opts]
        self.struct.options = opts
        for name, array in described.items():
            self.set(name, array)
        self.struct.max_seqlen_q = _max_seqlen(variants.max_seqlen_q, described.get("cu_seqlens_q"))
        self.struct.max_seqlen_k = _max_seqlen(variants.max_seqlen_k, described.get("cu_seqlens_k"))

    def set(self, name, array):
        if array is None:
            return
        view = array.view()
        self.keep.append(view)
        setattr(self.struct, name, view)


def _describe_variants(variants, first):
    """Arrays for the variant tensors given, checked to be of the inputs' kind and device."""
    names = [n for n, t in variants.tensors() if t is not None]
    arrays = [t for n, t in variants.tensors() if t is not None]
    described = _arrays.describe_all(["q"] + names, [first.obj] + arrays)[1:]
    return dict(zip(names, described))


def forward(q, k, v, causal=False, scale=None, algorithm="flash", deterministic=False, window=None,
            softcap=None, num_splits=None, want_lse=True, context=None, variants=NO_VARIANTS):
    """(out, lse or None) as arrays of the inputs' kind."""
    aq, ak, av = _arrays.describe_all(("q", "k", "v"), (q, k, v))
    # Rows past a variable-length batch's last offset are not written: they read as 0.
    packed = variants.cu_seqlens_q is not None
    out = _arrays.empty(aq, _out_shape(aq, av), zero=packed)
    lse_shape = _lse_shape(aq)
    lse = (_arrays.empty(aq, lse_shape, float32=True, zero=packed) if want_lse and lse_shape
           else None)
    a_out = _arrays.describe("out", out)
    a_lse = _arrays.describe("lse", lse) if lse is not None else None
    opts = options(causal, scale, algorithm, deterministic, window, softcap, num_splits)
    if not variants.any():
        ctx = _context(aq, context)
        low.flashattn_forward(ctx.handle, aq.view(), ak.view(), av.view(), a_out.view(),
                              a_lse.view() if a_lse is not None else None, opts, None, 0)
        return out, lse
    described = _describe_variants(variants, aq)
    args = _Args(opts, variants, dict(q=aq, k=ak, v=av, out=a_out, lse=a_lse, **described))
    ctx = _context(aq, context)
    low.flashattn_forward_ex(ctx.handle, args.struct, None, 0)
    return out, lse


class KVCache:
    """The tensors of a KV cache call (flashattn_args_t's cache fields): the tokens each sequence
    holds (cache_seqlens), the pages of a paged cache (block_table), the rows to append (k_new,
    v_new) and the rotary tables (rotary_cos, rotary_sin) with their layout."""

    __slots__ = ("cache_seqlens", "block_table", "k_new", "v_new", "rotary_cos", "rotary_sin",
                 "rotary_interleaved")

    def __init__(self, cache_seqlens, block_table=None, k_new=None, v_new=None, rotary_cos=None,
                 rotary_sin=None, rotary_interleaved=False):
        self.cache_seqlens, self.block_table = cache_seqlens, block_table
        self.k_new, self.v_new = k_new, v_new
        self.rotary_cos, self.rotary_sin = rotary_cos, rotary_sin
        self.rotary_interleaved = rotary_interleaved

    def tensors(self):
        """(field name, array or None) of every field but the layout flag."""
        return tuple((n, getattr(self, n)) for n in self.__slots__ if n != "rotary_interleaved")


def _writable(array, why):
    """Refuses an array the call writes into that its owner marked read-only (a numpy array; torch
    and cupy arrays have no such flag): the library would write through the address regardless,
    and a copy would leave the caller's array without the result."""
    if array.kind == "numpy" and not array.obj.flags.writeable:
        raise ValueError("%s: the array is read-only, but %s; pass a writable array"
                         % (array.name, why))


def kvcache_forward(q, k_cache, v_cache, cache, causal=False, scale=None, algorithm="flash",
                    window=None, softcap=None, num_splits=None, alibi_slopes=None, sinks=None,
                    out=None, want_lse=False, context=None):
    """(out, lse or None) of a KV cache forward (flashattn_forward_ex with cache_seqlens); with
    cache.k_new the rows are written into k_cache and v_cache in place first. out is written when
    given, else allocated like q."""
    named = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)]
    named += [(n, t) for n, t in cache.tensors() if t is not None]
    named += [(n, t) for n, t in (("alibi_slopes", alibi_slopes), ("sinks", sinks), ("out", out))
              if t is not None]
    described = dict(zip([n for n, _ in named],
                         _arrays.describe_all([n for n, _ in named], [t for _, t in named])))
    aq, ak, av = described.pop("q"), described.pop("k_cache"), described.pop("v_cache")
    if cache.k_new is not None:
        for a in (ak, av):
            _writable(a, "k_new is given and the call appends the new rows into the cache in place")
    a_out = described.pop("out", None)
    if a_out is None:
        out = _arrays.empty(aq, _out_shape(aq, av))
        a_out = _arrays.describe("out", out)
    else:
        _writable(a_out, "the call writes its result there")
    lse_shape = _lse_shape(aq)
    lse = _arrays.empty(aq, lse_shape, float32=True) if want_lse and lse_shape else None
    a_lse = _arrays.describe("lse", lse) if lse is not None else None
    # deterministic is a backward setting: a forward has nothing to choose there.
    opts = options(causal, scale, algorithm, deterministic=False, window=window, softcap=softcap,
                   num_splits=num_splits)
    # The struct's fields: the cache is the call's k and v.
    args = _Args(opts, NO_VARIANTS, dict(q=aq, k=ak, v=av, out=a_out, lse=a_lse, **described))
    args.struct.rotary_interleaved = int(bool(cache.rotary_interleaved))
    ctx = _context(aq, context)
    low.flashattn_forward_ex(ctx.handle, args.struct, None, 0)
    return out, lse


def backward(dout, q, k, v, out, lse, causal=False, scale=None, algorithm="flash",
             deterministic=False, window=None, softcap=None, num_splits=None, context=None,
             variants=NO_VARIANTS):
    """(dq, dk, dv) as arrays of the inputs' kind, and dsinks (float32 [heads_q]) after them when
    variants has sinks."""
    arrays = _arrays.describe_all(("dout", "q", "k", "v", "out", "lse"), (dout, q, k, v, out, lse))
    a_dout, aq, ak, av, a_out, a_lse = arrays
    packed = variants.cu_seqlens_q is not None  # rows past the last offset read as 0
    grads = [_arrays.empty(a, a.shape, zero=packed) for a in (aq, ak, av)]
    a_dq, a_dk, a_dv = (_arrays.describe(n, g) for n, g in zip(("dq", "dk", "dv"), grads))
    opts = options(causal, scale, algorithm, deterministic, window, softcap, num_splits)
    if not variants.any():
        ctx = _context(aq, context)
        low.flashattn_backward(ctx.handle, aq.view(), ak.view(), av.view(), a_out.view(),
                               a_dout.view(), a_lse.view(), a_dq.view(), a_dk.view(), a_dv.view(),
                               opts, None, 0)
        return tuple(grads)
    described = _describe_variants(variants, aq)
    dsinks = None
    if variants.sinks is not None:
        sinks = described["sinks"]
        dsinks = _arrays.empty(sinks, sinks.shape if len(sinks.shape) == 1 else (aq.shape[-2],),
                               float32=True)
        described["dsinks"] = _arrays.describe("dsinks", dsinks)
    args = _Args(opts, variants, dict(q=aq, k=ak, v=av, out=a_out, lse=a_lse, dout=a_dout, dq=a_dq,
                                      dk=a_dk, dv=a_dv, **described))
    ctx = _context(aq, context)
    low.flashattn_backward_ex(ctx.handle, args.struct, None, 0)
    return tuple(grads) + ((dsinks,) if dsinks is not None else ())


def merge(parts_out, parts_lse, out=None, lse=None, want_lse=False, context=None):
    """(out, lse or None): the parts merged by their LSE; out and lse are written when given
    (in place when they are one part's), else allocated like parts_out."""
    if isinstance(parts_out, (list, tuple)):
        parts_out = _arrays.stack("parts_out", parts_out)
    if isinstance(parts_lse, (list, tuple)):
        parts_lse = _arrays.stack("parts_lse", parts_lse)
    a_parts, a_lses = _arrays.describe_all(("parts_out", "parts_lse"), (parts_out, parts_lse))
    for a in (a_parts, a_lses):
        if len(a.shape) < 2:
            raise Error(low.FLASHATTN_ERROR_INVALID_SHAPE,
                        "%s: rank is %d; a leading parts dimension and a part's own are expected"
                        % (a.name, len(a.shape)))
    if a_lses.shape[0] != a_parts.shape[0]:
        raise Error(low.FLASHATTN_ERROR_INVALID_SHAPE,
                    "parts_lse: %d parts differ from parts_out's %d"
                    % (a_lses.shape[0], a_parts.shape[0]))
    first, out_stride = _arrays.part(a_parts)
    first_lse, lse_stride = _arrays.part(a_lses)
    if out is None:
        out = _arrays.empty(a_parts, first.shape)
    if lse is None and want_lse:
        lse = _arrays.empty(a_parts, first_lse.shape, float32=True)
    named = [("out", out)] + ([("lse", lse)] if lse is not None else [])
    outputs = _arrays.describe_all(["parts_out"] + [n for n, _ in named],
                                   [parts_out] + [x for _, x in named])[1:]
    m = low.flashattn_merge_args_t()
    low.flashattn_merge_args_init(m)
    views = [first.view(), first_lse.view()] + [a.view() for a in outputs]
    m.num_parts = a_parts.shape[0]
    m.parts_out = views[0]
    m.parts_out_stride = out_stride
    m.parts_lse = views[1]
    m.parts_lse_stride = lse_stride
    m.out = views[2]
    m.lse = views[3] if lse is not None else None
    ctx = _context(a_parts, context)
    low.flashattn_merge(ctx.handle, m)
    return out, lse
