"""The attention variants through the package with numpy arrays on the CPU backend: a sliding
window, a softcap, ALiBi slopes, attention sinks (and dsinks), v with its own head_dim, and
variable-length batches; forward and backward against the float64 definition of the header
(reference.variant_reference), varlen batches against per-sequence calls, dsinks against finite
differences, and bad values refused with the library's status and message."""
import numpy as np
import pytest

import flashattn
from flashattn import flashattn_swig as low
from reference import max_error, variant_reference


def inputs(b, nq, nk, hq, hkv, d, dv=None, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, nq, hq, d)).astype(np.float32)
    k = rng.standard_normal((b, nk, hkv, d)).astype(np.float32)
    v = rng.standard_normal((b, nk, hkv, dv or d)).astype(np.float32)
    dout = rng.standard_normal((b, nq, hq, dv or d)).astype(np.float32)
    return q, k, v, dout


def close(what, ours, ref, rel=2e-4):
    """fp32 results against float64: relative to the reference's largest magnitude."""
    ref = np.asarray(ref)
    finite = ref[np.isfinite(ref)]
    bound = rel * max(1.0, float(np.abs(finite).max()) if finite.size else 1.0)
    err = max_error(ours, ref)
    assert err <= bound, "%s: max error %.3g exceeds %.3g" % (what, err, bound)


# (name, keyword arguments of attention()): each variant alone, and a few together.
VARIANTS = [
    ("window_left_right", dict(window=(5, 3))),
    ("window_left_only", dict(window=(7, -1))),
    ("window_right_only", dict(window=(-1, 0))),
    ("window_causal", dict(window=(6, 4), causal=True)),
    ("softcap", dict(softcap=0.7, scale=1.0)),
    ("alibi_per_head", dict(alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625], np.float32))),
    ("alibi_per_batch", dict(alibi_slopes=np.array([[0.5, 0.1, 0.3, 0.2], [0.05, 0.4, 0.0, 1.0]],
                                                   np.float32))),
    ("sinks", dict(sinks=np.array([0.5, -1.0, 2.0, 0.0], np.float32))),
    ("all", dict(window=(9, 2), causal=True, softcap=2.0,
                 alibi_slopes=np.array([0.3, 0.2, 0.1, 0.05], np.float32),
                 sinks=np.array([1.0, 0.0, -0.5, 3.0], np.float32))),
]


@pytest.mark.parametrize("name,kw", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_variant_forward_and_backward_match_float64(name, kw):
    q, k, v, dout = inputs(2, 21, 29, 4, 2, 16, seed=hash(name) % 1000)
    out, lse = flashattn.attention(q, k, v, return_lse=True, **kw)
    ref_out, ref_lse, *ref_grads = variant_reference(q, k, v, dout, **kw)
    close("out", out, ref_out)
    close("lse", lse, ref_lse)
    grads = flashattn.attention_backward(dout, q, k, v, out, lse, **kw)
    assert len(grads) == (4 if "sinks" in kw else 3)
    names = ("dq", "dk", "dv", "dsinks")
    for what, ours, ref in zip(names, grads, ref_grads):
        close(what, ours, ref)
    # The variant changes the result: the same call without it differs.
    plain = flashattn.attention(q, k, v, causal=kw.get("causal", False), scale=kw.get("scale"))
    assert max_error(out, plain) > 1e-3


def test_head_dim_of_v_differs():
    q, k, v, dout = inputs(2, 19, 23, 4, 2, 24, dv=40, seed=7)
    out, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    assert out.shape == (2, 19, 4, 40)
    ref_out, ref_lse, dq, dk, dv, _ = variant_reference(q, k, v, dout, causal=True)
    close("out", out, ref_out)
    grads = flashattn.attention_backward(dout, q, k, v, out, lse, causal=True)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    for what, ours, ref in zip(("dq", "dk", "dv"), grads, (dq, dk, dv)):
        close(what, ours, ref)


def test_dsinks_match_finite_differences():
    q, k, v, dout = inputs(1, 12, 15, 2, 1, 8, seed=11)
    sinks = np.array([0.3, -0.8], np.float32)
    out, lse = flashattn.attention(q, k, v, sinks=sinks, return_lse=True)
    dsinks = flashattn.attention_backward(dout, q, k, v, out, lse, sinks=sinks)[3]
    assert dsinks.shape == (2,) and dsinks.dtype == np.float32

    def loss(s):
        return float((flashattn.attention(q, k, v, sinks=s).astype(np.float64) * dout).sum())

    eps = 1e-2
    for h in range(2):
        step = np.zeros(2, np.float32)
        step[h] = eps
        numeric = (loss(sinks + step) - loss(sinks - step)) / (2 * eps)
        assert abs(dsinks[h] - numeric) <= 2e-3 + 1e-2 * abs(numeric), (h, dsinks[h], numeric)
    # The header's closed form, from the forward's out and lse.
    delta = np.einsum("bqhd,bqhd->bhq", dout.astype(np.float64), out)
    closed = -(np.exp(sinks[None, :, None] - lse) * delta).sum(axis=(0, 2))
    np.testing.assert_allclose(dsinks, closed, rtol=1e-4, atol=1e-5)


# ---- variable-length batches -------------------------------------------------------------------

def packed(seqs_q, seqs_k, hq=4, hkv=2, d=16, dv=None, seed=0):
    """Packed q, k, v, dout of sequences of the given lengths, the offsets, and the per-sequence
    [1, n, h, d] tensors."""
    rng = np.random.default_rng(seed)
    tq, tk = sum(seqs_q), sum(seqs_k)
    q = rng.standard_normal((tq, hq, d)).astype(np.float32)
    k = rng.standard_normal((tk, hkv, d)).astype(np.float32)
    v = rng.standard_normal((tk, hkv, dv or d)).astype(np.float32)
    dout = rng.standard_normal((tq, hq, dv or d)).astype(np.float32)
    cu_q = np.concatenate([[0], np.cumsum(seqs_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(seqs_k)]).astype(np.int32)
    return q, k, v, dout, cu_q, cu_k


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(window=(3, 1), softcap=1.5),
                                dict(sinks=np.array([0.2, -0.4, 1.0, 0.0], np.float32))],
                         ids=["plain", "causal", "window_softcap", "sinks"])
def test_varlen_matches_per_sequence_calls(kw):
    lens_q, lens_k = [7, 0, 13, 5], [9, 4, 13, 0]  # an empty query side and an empty key side
    q, k, v, dout, cu_q, cu_k = packed(lens_q, lens_k, dv=24, seed=3)
    out, lse = flashattn.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                   return_lse=True, **kw)
    assert out.shape == (q.shape[0], 4, 24) and lse.shape == (4, q.shape[0])
    grads = flashattn.attention_backward(dout, q, k, v, out, lse, cu_seqlens_q=cu_q,
                                         cu_seqlens_k=cu_k, **kw)
    dsinks_total = np.zeros(4)
    for b in range(len(lens_q)):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] == 0:
            continue
        if lens_k[b] == 0:  # queries that see no key
            assert np.all(out[rq] == 0) and np.all(np.isneginf(lse[:, rq]))
            assert np.all(grads[0][rq] == 0)
            continue
        one = [x[None] for x in (q[rq], k[rk], v[rk], dout[rq])]
        o1, l1 = flashattn.attention(*one[:3], return_lse=True, **kw)
        np.testing.assert_allclose(out[rq], o1[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse[:, rq], l1[0], rtol=1e-5, atol=1e-6)
        g1 = flashattn.attention_backward(one[3], *one[:3], o1, l1, **kw)
        np.testing.assert_allclose(grads[0][rq], g1[0][0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(grads[1][rk], g1[1][0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(grads[2][rk], g1[2][0], rtol=1e-4, atol=1e-5)
        if "sinks" in kw:
            dsinks_total += g1[3]
    if "sinks" in kw:
        np.testing.assert_allclose(grads[3], dsinks_total, rtol=1e-4, atol=1e-5)
    # Key rows of the empty key sequence get zero gradients (nothing attends to them).
    assert len(grads) == (4 if "sinks" in kw else 3)


def test_varlen_rows_past_the_last_offset_stay_zero():
    q, k, v, dout, cu_q, cu_k = packed([6, 4], [5, 8], seed=4)
    pad = lambda x: np.concatenate([x, np.full((3,) + x.shape[1:], np.nan, x.dtype)])  # noqa: E731
    out, lse = flashattn.attention(pad(q), k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                   return_lse=True)
    assert np.all(out[10:] == 0) and np.all(lse[:, 10:] == 0)
    assert np.all(np.isfinite(out[:10]))


def test_varlen_alibi_per_sequence_and_explicit_max_lengths():
    q, k, v, dout, cu_q, cu_k = packed([6, 9], [11, 3], seed=5)
    slopes = np.array([[0.5, 0.1, 0.2, 0.3], [1.0, 0.0, 0.25, 0.75]], np.float32)
    out = flashattn.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=12,
                              max_seqlen_k=14, alibi_slopes=slopes, causal=True)
    for b in range(2):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        ref, _ = variant_reference(q[rq][None], k[rk][None], v[rk][None], causal=True,
                                   alibi_slopes=slopes[b])
        close("out of sequence %d" % b, out[rq], ref[0])


# ---- bad values: flashattn.Error with the library's status and message ------------------------

def raises(status, fragment, **kw):
    q, k, v, _ = inputs(2, 8, 8, 4, 2, 16)
    with pytest.raises(flashattn.Error) as e:
        flashattn.attention(q, k, v, **kw)
    assert e.value.status_name == status, e.value
    assert fragment in e.value.message, e.value
    return e.value


def test_bad_window_and_softcap_are_refused():
    raises("FLASHATTN_ERROR_INVALID_ARGUMENT", "options: window_left is -2, must be >= 0, or -1",
           window=(-2, 0))
    raises("FLASHATTN_ERROR_INVALID_ARGUMENT", "options: window_right is -7", window=(3, -7))
    for cap, text in ((-1.0, "-1"), (float("nan"), "nan"), (float("inf"), "inf")):
        e = raises("FLASHATTN_ERROR_INVALID_ARGUMENT",
                   "options: softcap is %s, must be 0 (none) or a finite cap > 0" % text,
                   softcap=cap)
        assert e.message.startswith("flashattn_forward: ")
    with pytest.raises(ValueError, match="window must be None or a pair"):
        raises("", "", window=4)


def test_num_splits_reaches_the_library():
    e = raises("FLASHATTN_ERROR_INVALID_ARGUMENT",
               "options: num_splits is -1, must be 0 (the library chooses)", num_splits=-1)
    assert e.message.startswith("flashattn_forward: ")
    # Eight keys are one tile of the CPU backend: nothing to split, the same result.
    q, k, v, _ = inputs(2, 8, 8, 4, 2, 16)
    np.testing.assert_array_equal(flashattn.attention(q, k, v, num_splits=5),
                                  flashattn.attention(q, k, v))
    # 700 keys in 5 parts merged by their LSE: the same attention up to rounding, and not the
    # same bits (the count reached the CPU backend's split).
    q, k, v, _ = inputs(1, 2, 700, 4, 1, 16, seed=7)
    split = flashattn.attention(q, k, v, num_splits=5, causal=True)
    whole = flashattn.attention(q, k, v, num_splits=1, causal=True)
    np.testing.assert_allclose(split, whole, rtol=0, atol=2e-6)
    assert not np.array_equal(split, whole)


def test_bad_slopes_and_sinks_are_refused():
    e = raises("FLASHATTN_ERROR_INVALID_SHAPE", "alibi_slopes: shape [3], expected [heads_q] = [4]",
               alibi_slopes=np.zeros(3, np.float32))
    assert e.message.startswith("flashattn_forward_ex: ")
    raises("FLASHATTN_ERROR_INVALID_DTYPE", "alibi_slopes: dtype float16, must be float32",
           alibi_slopes=np.zeros(4, np.float16))
    raises("FLASHATTN_ERROR_INVALID_SHAPE", "sinks: rank is 2, expected 1 ([heads_q])",
           sinks=np.zeros((2, 4), np.float32))
    raises("FLASHATTN_ERROR_INVALID_DTYPE", "sinks: dtype int32, must be float32",
           sinks=np.zeros(4, np.int32))
    raises("FLASHATTN_ERROR_INVALID_DTYPE", "sinks: dtype float64 is not supported",
           sinks=np.zeros(4))
    with pytest.raises(TypeError, match="sinks: a numpy array"):
        raises("", "", sinks=[0.0] * 4)


def test_bad_offsets_and_lengths_are_refused():
    q, k, v, dout, cu_q, cu_k = packed([6, 4], [5, 8], seed=6)

    def refused(status, fragment, **kw):
        args = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        args.update(kw)
        with pytest.raises(flashattn.Error) as e:
            flashattn.attention(q, k, v, **args)
        assert (e.value.status_name, fragment in e.value.message) == (status, True), e.value

    refused("FLASHATTN_ERROR_INVALID_DTYPE", "cu_seqlens_q: dtype float32, must be int32",
            cu_seqlens_q=cu_q.astype(np.float32))
    refused("FLASHATTN_ERROR_INVALID_DTYPE", "cu_seqlens_k: dtype int64 is not supported",
            cu_seqlens_k=cu_k.astype(np.int64))
    refused("FLASHATTN_ERROR_INVALID_SHAPE", "cu_seqlens_k: 2 offsets differ from cu_seqlens_q's 3",
            cu_seqlens_k=cu_k[:2])
    refused("FLASHATTN_ERROR_INVALID_SHAPE", "cu_seqlens_q: rank is 2, expected 1",
            cu_seqlens_q=cu_q[None])
    refused("FLASHATTN_ERROR_INVALID_ARGUMENT", "cu_seqlens_k is NULL but cu_seqlens_q is given",
            cu_seqlens_k=None)
    refused("FLASHATTN_ERROR_INVALID_SHAPE", "sequence 0 has 6 queries, more than max_seqlen_q = 5",
            max_seqlen_q=5)
    refused("FLASHATTN_ERROR_INVALID_SHAPE", "args: max_seqlen_k is 14, more than k's 13 tokens",
            max_seqlen_k=14)
    refused("FLASHATTN_ERROR_INVALID_SHAPE", "cu_seqlens_q[2] is 3, below cu_seqlens_q[1] = 6; "
            "the offsets must not decrease", cu_seqlens_q=np.array([0, 6, 3], np.int32),
            max_seqlen_q=6)
    refused("FLASHATTN_ERROR_INVALID_SHAPE", "cu_seqlens_q[1] is -2, below cu_seqlens_q[0] = 0",
            cu_seqlens_q=np.array([0, -2, -4], np.int32))  # max_seqlen_q read from them: 0
    refused("FLASHATTN_ERROR_INVALID_SHAPE", "cu_seqlens_k[2] is 14, past the end of k's 13 tokens",
            cu_seqlens_k=np.array([0, 5, 14], np.int32), max_seqlen_k=9)
    with pytest.raises(flashattn.Error, match="q: rank is 4, expected 3"):
        flashattn.attention(q[None], k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    # Max lengths belong to a variable-length batch.
    qf, kf, vf, _ = inputs(2, 8, 8, 4, 2, 16)
    with pytest.raises(flashattn.Error) as e:
        flashattn.attention(qf, kf, vf, max_seqlen_q=8)
    assert e.value.status == low.FLASHATTN_ERROR_INVALID_ARGUMENT
    assert "args: max_seqlen_q is 8 but there are no offsets" in e.value.message


def test_low_layer_args_struct():
    args = low.flashattn_args_t()
    low.flashattn_args_init(args)
    assert args.q is None and args.sinks is None and args.max_seqlen_q == 0
    assert args.size > 0
    o = low.flashattn_options_t()
    low.flashattn_options_init(o)
    assert (o.window, o.window_left, o.window_right, o.softcap) == (0, 0, 0, 0.0)
    # The module's init passes the size of the struct it allocates, window and softcap included
    # (the first options struct ended after `deterministic`).
    assert args.size == low.SIZEOF_ARGS and o.size == low.SIZEOF_OPTIONS
    with pytest.raises(low.Error, match="size 8 is smaller than the first flashattn_options_t"):
        low.flashattn_options_init_sized(o, 8)
    assert o.size == low.SIZEOF_OPTIONS
    with pytest.raises(low.Error, match="args is NULL"):
        low.flashattn_forward_ex(flashattn._lib.context_for(-1).handle, None, None, 0)
