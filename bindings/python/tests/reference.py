"""Reference attention in numpy, and the project's tolerance rule.

reference(): float64, the truth. standard(): the standard algorithm (S and P materialized) in
the inputs' precision, with fp32 arithmetic and every materialized matrix rounded to the dtype,
whose error sets the bound: max|ours - ref64| <= 2 * max|standard - ref64| + atol."""
import numpy as np

ATOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 2e-2}


def round_bf16(x):
    """float32 -> nearest bfloat16 (ties to even), returned as float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).reshape(np.shape(x))


def rounder(dtype_name):
    if dtype_name == "float32":
        return lambda x: np.asarray(x, dtype=np.float32)
    if dtype_name == "float16":
        return lambda x: np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)
    return round_bf16


def _expand(x, g):
    return np.repeat(x, g, axis=2)


def _scores(q, k, scale, causal):
    """scale * q k^T as [B, H, Nq, Nk], masked keys at -inf."""
    nq, nk = q.shape[1], k.shape[1]
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        i = np.arange(nq)[:, None]
        j = np.arange(nk)[None, :]
        s = np.where(j > i + nk - nq, -np.inf, s)
    return s


def _softmax(s):
    """(P, LSE); a row with every key masked gives P = 0 and LSE = -inf."""
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = (np.log(l) + m_safe)[..., 0]
        p = np.where(l > 0, p / np.where(l > 0, l, 1.0), 0.0)
    return p, lse


def _attention(q, k, v, causal, scale, r, dt):
    g = q.shape[2] // k.shape[2]
    kk, vv = _expand(k, g), _expand(v, g)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[3])
    s = r(_scores(q, kk, scale, causal).astype(dt))
    p, lse = _softmax(s)
    p = r(p.astype(dt))
    out = r(np.einsum("bhqk,bkhd->bqhd", p, vv).astype(dt))
    return out, lse, p, kk, vv, scale


def reference(q, k, v, causal=False, scale=None):
    """(out, lse) in float64."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    out, lse, *_ = _attention(q, k, v, causal, scale, lambda x: x, np.float64)
    return out, lse


def standard(q, k, v, dtype_name, causal=False, scale=None):
    """out of the standard algorithm in dtype_name's precision (fp32 arithmetic)."""
    q, k, v = (np.asarray(t, dtype=np.float32) for t in (q, k, v))
    out, *_ = _attention(q, k, v, causal, scale, rounder(dtype_name), np.float32)
    return out


def _gradients(dout, q, k, v, causal, scale, r, dt):
    out, _, p, kk, vv, scale = _attention(q, k, v, causal, scale, r, dt)
    b, nk, hkv, d = k.shape
    g = q.shape[2] // hkv
    dv = np.einsum("bhqk,bqhd->bkhd", p, dout).reshape(b, nk, hkv, g, d).sum(axis=3)
    dp = r(np.einsum("bqhd,bkhd->bhqk", dout, vv).astype(dt))
    delta = np.einsum("bqhd,bqhd->bhq", dout, out)[..., None]
    ds = r((p * (dp - delta)).astype(dt))
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kk) * scale
    dk = (np.einsum("bhqk,bqhd->bkhd", ds, q) * scale).reshape(b, nk, hkv, g, d).sum(axis=3)
    return r(dq.astype(dt)), r(dk.astype(dt)), r(dv.astype(dt))


def reference_grads(dout, q, k, v, causal=False, scale=None):
    """(dq, dk, dv) in float64."""
    dout, q, k, v = (np.asarray(t, dtype=np.float64) for t in (dout, q, k, v))
    return _gradients(dout, q, k, v, causal, scale, lambda x: x, np.float64)


def standard_grads(dout, q, k, v, dtype_name, causal=False, scale=None):
    dout, q, k, v = (np.asarray(t, dtype=np.float32) for t in (dout, q, k, v))
    return _gradients(dout, q, k, v, causal, scale, rounder(dtype_name), np.float32)


def max_error(a, b):
    """max |a - b|, equal infinities counting as 0 and a NaN as infinite."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        d = np.where(a == b, 0.0, np.abs(a - b))
    d = np.where(np.isnan(d), np.inf, d)
    return float(d.max()) if d.size else 0.0


def assert_within(what, ours, ref64, std, atol):
    err = max_error(ours, ref64)
    bound = 2.0 * max_error(std, ref64) + atol
    assert err <= bound, "%s: max error %.3g exceeds 2 x standard's %.3g + %.1g" % (
        what, err, max_error(std, ref64), atol)


def variant_reference(q, k, v, dout=None, causal=False, scale=None, window=None, softcap=None,
                      alibi_slopes=None, sinks=None):
    """The header's definition of every variant, in float64, for a fixed-length batch
    (q [B, Nq, Hq, D], k [B, Nk, Hkv, D], v [B, Nk, Hkv, Dv]): (out, lse) and, given dout,
    (out, lse, dq, dk, dv, dsinks). Per query head h, query i, key j, diag = Nk - Nq:
    x = scale q.k, then c tanh(x / c) with a softcap, minus slope_h |i + diag - j| with ALiBi;
    keys hidden by causal (j > i + diag) or the window; Z = e^sink_h + sum of e^x over the
    visible keys. A row that sees no key: out 0, lse -inf, no gradient."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    b, nq, hq, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    kk, vv = _expand(k, g), _expand(v, g)
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    raw = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    capped, dcap = raw, np.ones_like(raw)
    if softcap:
        t = np.tanh(raw / softcap)
        capped, dcap = softcap * t, 1.0 - t * t
    i = np.arange(nq)[:, None]
    j = np.arange(nk)[None, :]
    rel = i + (nk - nq) - j  # > 0: a key before the diagonal
    x = capped
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, dtype=np.float64)
        slopes = slopes.reshape(1, hq) if slopes.ndim == 1 else slopes
        x = x - slopes[:, :, None, None] * np.abs(rel)[None, None]
    visible = np.ones((nq, nk), dtype=bool)
    if causal:
        visible &= rel >= 0
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= rel <= left
        if right >= 0:
            visible &= -rel <= right
    x = np.where(visible, x, -np.inf)
    sink = (np.zeros(hq) if sinks is None else np.asarray(sinks, dtype=np.float64))[None, :, None]
    seen = visible.any(axis=1)[None, None, :]  # [1, 1, Nq]
    m = np.max(x, axis=-1)
    if sinks is not None:
        m = np.maximum(m, sink)
    m = np.where(seen, m, 0.0)
    e = np.exp(x - m[..., None])
    z = e.sum(axis=-1) + (np.exp(sink - m) if sinks is not None else 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, np.log(np.where(seen, z, 1.0)) + m, -np.inf)
    p = np.where(seen[..., None], e / np.where(seen, z, 1.0)[..., None], 0.0)
    out = np.einsum("bhqk,bkhd->bqhd", p, vv)
    if dout is None:
        return out, lse
    dout = np.asarray(dout, dtype=np.float64)
    dv = np.einsum("bhqk,bqhd->bkhd", p, dout).reshape(b, nk, hkv, g, -1).sum(axis=3)
    dp = np.einsum("bqhd,bkhd->bhqk", dout, vv)
    delta = np.einsum("bqhd,bqhd->bhq", dout, out)
    dx = p * (dp - delta[..., None])
    draw = dx * dcap
    dq = np.einsum("bhqk,bkhd->bqhd", draw, kk) * scale
    dk = (np.einsum("bhqk,bqhd->bkhd", draw, q) * scale).reshape(b, nk, hkv, g, d).sum(axis=3)
    dsinks = None
    if sinks is not None:
        with np.errstate(invalid="ignore"):
            weight = np.where(seen, np.exp(sink - np.where(seen, lse, 0.0)), 0.0)
        dsinks = -(weight * delta).sum(axis=(0, 2))
    return out, lse, dq, dk, dv, dsinks
