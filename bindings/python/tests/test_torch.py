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
