"""Torch tensors on the CPU backend: outputs of the input's type, and autograd through the
torch.autograd.Function. Skipped where torch is not installed."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from reference import ATOL, assert_within, reference, reference_grads, standard, standard_grads  # noqa: E402


def make(shape, seed=0):
    b, nq, nk, hq, hkv, d = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, nq, hq, d, generator=g)
    k = torch.randn(b, nk, hkv, d, generator=g)
    v = torch.randn(b, nk, hkv, d, generator=g)
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
def test_forward_returns_tensors(causal):
    q, k, v = make((2, 37, 53, 4, 2, 32))
    out, lse = flashattn.attention(q, k, v, causal=causal, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == q.dtype and out.device == q.device
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (2, 4, 37)
    n = [t.numpy() for t in (q, k, v)]
    assert_within("out", out.numpy(), reference(*n, causal)[0], standard(*n, "float32", causal),
                  ATOL["float32"])


@pytest.mark.parametrize("causal", [False, True])
def test_autograd_matches_float64(causal):
    q, k, v = make((2, 37, 53, 4, 2, 32), seed=3)
    for t in (q, k, v):
        t.requires_grad_(True)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(4))
    out = flashattn.attention(q, k, v, causal=causal)
    assert out.requires_grad
    (out * dout).sum().backward()
    n = [t.detach().numpy() for t in (dout, q, k, v)]
    refs = reference_grads(*n, causal)
    stds = standard_grads(*n, "float32", causal)
    for name, t, ref, std in zip(("dq", "dk", "dv"), (q, k, v), refs, stds):
        assert_within(name, t.grad.numpy(), ref, std, ATOL["float32"])


def test_autograd_with_expanded_gradient_and_lse():
    q, k, v = make((1, 16, 16, 2, 2, 8), seed=5)
    q.requires_grad_(True)
    out, lse = flashattn.attention(q, k, v, return_lse=True)
    assert not lse.requires_grad
    out.sum().backward()  # autograd passes ones with every stride 0
    expected = flashattn.attention_backward(torch.ones_like(out), q.detach(), k, v, out.detach(), lse)
    torch.testing.assert_close(q.grad, expected[0], rtol=1e-5, atol=1e-6)
    assert k.grad is None and v.grad is None


def test_no_grad_takes_the_plain_path():
    q, k, v = make((1, 16, 16, 2, 2, 8))
    q.requires_grad_(True)
    with torch.no_grad():
        out = flashattn.attention(q, k, v)
    assert not out.requires_grad


def test_bfloat16_tensors_on_the_cpu():
    q, k, v = (t.to(torch.bfloat16) for t in make((1, 40, 24, 4, 2, 32), seed=6))
    out = flashattn.attention(q, k, v, causal=True)
    assert out.dtype == torch.bfloat16
    n = [t.float().numpy() for t in (q, k, v)]
    assert_within("out", out.float().numpy(), reference(*n, True)[0],
                  standard(*n, "bfloat16", True), ATOL["bfloat16"])


def test_mixed_kinds_are_refused():
    q, k, v = make((1, 16, 16, 2, 2, 8))
    with pytest.raises(TypeError, match="one kind and device"):
        flashattn.attention(q, k.numpy(), v)
    assert np.array_equal(flashattn.attention(q.numpy(), k.numpy(), v.numpy()),
                          flashattn.attention(q, k, v).numpy())


# ---- the variants through autograd ---------------------------------------------------------------

from reference import variant_reference  # noqa: E402


def _close(what, ours, ref, rel=2e-4):
    ref = np.asarray(ref)
    bound = rel * max(1.0, float(np.abs(ref[np.isfinite(ref)]).max()))
    err = float(np.abs(ours.detach().double().numpy() - ref).max())
    assert err <= bound, "%s: max error %.3g exceeds %.3g" % (what, err, bound)


@pytest.mark.parametrize("kw", [dict(window=(4, 2)), dict(softcap=0.9, causal=True),
                                dict(alibi_slopes=torch.tensor([0.5, 0.25, 0.1, 0.7])),
                                dict(window=(8, -1), alibi_slopes=torch.rand(2, 4))],
                         ids=["window", "softcap_causal", "alibi", "window_alibi_per_batch"])
def test_autograd_of_variants_matches_float64(kw):
    q, k, v = make((2, 19, 27, 4, 2, 16), seed=7)
    for t in (q, k, v):
        t.requires_grad_(True)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(8))
    out = flashattn.attention(q, k, v, **kw)
    (out * dout).sum().backward()
    ref_kw = {n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()}
    ref = variant_reference(*(t.detach().numpy() for t in (q, k, v)), dout.numpy(), **ref_kw)
    _close("out", out, ref[0])
    for name, t, r in zip(("dq", "dk", "dv"), (q, k, v), ref[2:5]):
        _close(name, t.grad, r)


def test_autograd_gives_the_sinks_their_gradient():
    q, k, v = make((2, 17, 23, 4, 2, 16), seed=9)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    q.requires_grad_(True)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(10))
    out = flashattn.attention(q, k, v, sinks=sinks, causal=True)
    (out * dout).sum().backward()
    ref = variant_reference(q.detach().numpy(), k.numpy(), v.numpy(), dout.numpy(), causal=True,
                            sinks=sinks.detach().numpy())
    _close("dq", q.grad, ref[2])
    _close("dsinks", sinks.grad, ref[5])
    assert k.grad is None
    # Sinks alone requiring grad go through autograd too.
    s2 = sinks.detach().clone().requires_grad_(True)
    out2 = flashattn.attention(q.detach(), k, v, sinks=s2, causal=True)
    assert out2.requires_grad
    (out2 * dout).sum().backward()
    torch.testing.assert_close(s2.grad, sinks.grad, rtol=1e-5, atol=1e-6)


def test_autograd_of_a_variable_length_batch_matches_per_sequence_calls():
    lens_q, lens_k = [5, 9, 0, 4], [7, 3, 6, 11]
    g = torch.Generator().manual_seed(11)
    q = torch.randn(sum(lens_q), 4, 16, generator=g, requires_grad=True)
    k = torch.randn(sum(lens_k), 2, 16, generator=g, requires_grad=True)
    v = torch.randn(sum(lens_k), 2, 8, generator=g, requires_grad=True)  # d_v != d_qk
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lens_q)]), dtype=torch.int32)
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lens_k)]), dtype=torch.int32)
    sinks = torch.tensor([0.1, 0.2, -0.3, 1.0], requires_grad=True)
    out = flashattn.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, sinks=sinks,
                              causal=True)
    assert out.shape == (sum(lens_q), 4, 8)
    dout = torch.randn(out.shape, generator=g)
    (out * dout).sum().backward()
    dsinks = torch.zeros(4)
    for b in range(4):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] == 0:
            continue
        qb, kb, vb = (t.detach()[r][None].clone().requires_grad_(True)
                      for t, r in ((q, rq), (k, rk), (v, rk)))
        sb = sinks.detach().clone().requires_grad_(True)
        ob = flashattn.attention(qb, kb, vb, sinks=sb, causal=True)
        (ob * dout[rq][None]).sum().backward()
        torch.testing.assert_close(out[rq].detach(), ob[0].detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(q.grad[rq], qb.grad[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(k.grad[rk], kb.grad[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(v.grad[rk], vb.grad[0], rtol=1e-4, atol=1e-5)
        dsinks += sb.grad
    torch.testing.assert_close(sinks.grad, dsinks, rtol=1e-4, atol=1e-5)


def test_errors_in_the_autograd_path_carry_the_library_message():
    q, k, v = make((1, 8, 8, 2, 2, 8))
    q.requires_grad_(True)
    with pytest.raises(flashattn.Error, match="sinks: shape \\[3\\], expected \\[heads_q\\] = \\[2\\]"):
        flashattn.attention(q, k, v, sinks=torch.zeros(3, requires_grad=True))
    with pytest.raises(flashattn.Error, match="softcap is -2"):
        flashattn.attention(q, k, v, softcap=-2.0)
