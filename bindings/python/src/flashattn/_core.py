"""Forward and backward through the low layer, for any supported array kind."""
from . import _arrays
from ._lib import context_for, low

_ALGORITHMS = {"flash": low.FLASHATTN_ALGORITHM_FLASH, "standard": low.FLASHATTN_ALGORITHM_STANDARD}


def options(causal, scale, algorithm, deterministic):
    """A low-level flashattn_options_t. scale None (or 0) selects 1/sqrt(head_dim)."""
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
    return o


def _context(like, context):
    ctx = context if context is not None else context_for(like.device)
    if like.device >= 0:
        ctx.set_stream(_arrays.current_stream(like))
    return ctx


def _lse_shape(q):
    # [batch, heads_q, seqlen_q]; for a q of another rank the library reports the rank.
    return (q.shape[0], q.shape[2], q.shape[1]) if len(q.shape) == 4 else None


def forward(q, k, v, causal=False, scale=None, algorithm="flash", deterministic=False,
            want_lse=True, context=None):
    """(out, lse or None) as arrays of the inputs' kind."""
    aq, ak, av = _arrays.describe_all(("q", "k", "v"), (q, k, v))
    out = _arrays.empty(aq, aq.shape)
    lse_shape = _lse_shape(aq)
    lse = _arrays.empty(aq, lse_shape, float32=True) if want_lse and lse_shape else None
    a_out = _arrays.describe("out", out)
    a_lse = _arrays.describe("lse", lse) if lse is not None else None
    ctx = _context(aq, context)
    low.flashattn_forward(ctx.handle, aq.view(), ak.view(), av.view(), a_out.view(),
                          a_lse.view() if a_lse is not None else None,
                          options(causal, scale, algorithm, deterministic), None, 0)
    return out, lse


def backward(dout, q, k, v, out, lse, causal=False, scale=None, algorithm="flash",
             deterministic=False, context=None):
    """(dq, dk, dv) as arrays of the inputs' kind."""
    arrays = _arrays.describe_all(("dout", "q", "k", "v", "out", "lse"), (dout, q, k, v, out, lse))
    a_dout, aq, ak, av, a_out, a_lse = arrays
    grads = [_arrays.empty(aq, aq.shape), _arrays.empty(ak, ak.shape), _arrays.empty(av, av.shape)]
    a_dq, a_dk, a_dv = (_arrays.describe(n, g) for n, g in zip(("dq", "dk", "dv"), grads))
    ctx = _context(aq, context)
    low.flashattn_backward(ctx.handle, aq.view(), ak.view(), av.view(), a_out.view(), a_dout.view(),
                           a_lse.view(), a_dq.view(), a_dk.view(), a_dv.view(),
                           options(causal, scale, algorithm, deterministic), None, 0)
    return tuple(grads)
