"""The package on a CUDA GPU with torch tensors (and cupy arrays where cupy is installed), against
PyTorch SDPA: forward and gradients through autograd, with the tolerance rule
max|ours - ref64| <= 2 * max|sdpa - ref64| + atol, ref64 being float64 attention of the same
inputs and sdpa PyTorch's scaled_dot_product_attention in the inputs' dtype.

Skipped (with the reason) where torch, CUDA or a device the library can use is missing. Run:
  python3 -m pytest bindings/python/tests/test_gpu.py -q -rs
"""
import pytest

import flashattn

# The device first: on a machine without one, that is the reason worth reporting.
if flashattn.cuda_device_count() == 0:
    pytest.skip("no CUDA device: libflashattn finds none (%s)"
                % ("no driver or no device visible" if flashattn.has_cuda()
                   else "this libflashattn was built without CUDA"), allow_module_level=True)

torch = pytest.importorskip("torch")

from flashattn import _lib  # noqa: E402
from reference import ATOL  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: torch sees none", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

DEVICE = torch.device("cuda", 0)
DTYPES = [torch.float16, torch.bfloat16]
# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim); seqlen_q <= seqlen_k so that SDPA
# never meets a row with every key masked.
SHAPES = [(2, 128, 128, 8, 8, 64), (1, 197, 333, 8, 2, 128), (2, 64, 100, 4, 1, 96)]


def make(shape, dtype, seed=0, requires_grad=False):
    b, nq, nk, hq, hkv, d = shape
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(b, nq, hq, d, generator=g, device=DEVICE, dtype=dtype)
    k = torch.randn(b, nk, hkv, d, generator=g, device=DEVICE, dtype=dtype)
    v = torch.randn(b, nk, hkv, d, generator=g, device=DEVICE, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def sdpa(q, k, v, causal):
    """SDPA in [batch, seqlen, heads, head_dim], GQA expanded, causal aligned bottom-right."""
    g = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(g, dim=2) for t in (k, v))
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    mask = None
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        mask = j <= i + nk - nq
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)


def err(a, b):
    return (a.double() - b.double()).abs().max().item()


def check(what, ours, ref64, theirs, dtype):
    atol = ATOL[str(dtype).replace("torch.", "")]
    bound = 2 * err(theirs, ref64) + atol
    assert err(ours, ref64) <= bound, "%s: error %.3g > 2 x SDPA's %.3g + %g" % (
        what, err(ours, ref64), err(theirs, ref64), atol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_and_gradients_against_sdpa(shape, causal, dtype):
    q, k, v = make(shape, dtype, requires_grad=True)
    dout = torch.randn(q.shape, device=DEVICE, dtype=dtype)

    out = flashattn.attention(q, k, v, causal=causal)
    assert out.dtype == dtype and out.device == q.device and out.shape == q.shape
    out.backward(dout)
    ours = [out.detach(), q.grad, k.grad, v.grad]

    def run(fn, cast):
        xs = [t.detach().to(cast).requires_grad_(True) for t in (q, k, v)]
        o = fn(*xs, causal)
        o.backward(dout.to(cast))
        return [o.detach()] + [x.grad for x in xs]

    ref64 = run(sdpa, torch.float64)
    theirs = run(sdpa, dtype)
    for name, a, r, t in zip(("out", "dq", "dk", "dv"), ours, ref64, theirs):
        check(name, a, r, t, dtype)


def test_current_stream_is_used():
    q, k, v = make(SHAPES[0], torch.float16)
    expected = flashattn.attention(q, k, v)
    side = torch.cuda.Stream(device=DEVICE)
    side.wait_stream(torch.cuda.current_stream(DEVICE))
    with torch.cuda.stream(side):
        out = flashattn.attention(q, k, v)
        assert _lib.context_for(0).stream == side.cuda_stream
    side.synchronize()
    assert torch.equal(out, expected)
    flashattn.attention(q, k, v)  # back on the default stream: cudaStreamLegacy
    assert _lib.context_for(0).stream == 1


def test_strided_views_are_read_in_place():
    b, n, h, d = 2, 77, 4, 64
    qkv = torch.randn(b, n, 3, h, d, device=DEVICE, dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    assert torch.equal(flashattn.attention(q, k, v, causal=True),
                       flashattn.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True))


def test_bad_input_raises_the_library_message():
    q, k, v = make(SHAPES[0], torch.float16)
    with pytest.raises(flashattn.Error, match="head_dim 32 differs from q's 64"):
        flashattn.attention(q, k[..., :32], v)
    with pytest.raises(flashattn.Error) as e:
        flashattn.attention(q.float(), k.float(), v.float())
    assert e.value.message.startswith("flashattn_forward: ")
    with pytest.raises(TypeError, match="one kind and device"):
        flashattn.attention(q, k.cpu(), v)


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    q, k, v = make(SHAPES[1], torch.float16, seed=7)
    cq, ck, cv = (cupy.from_dlpack(t) for t in (q, k, v))
    out, lse = flashattn.attention(cq, ck, cv, causal=True, return_lse=True)
    assert isinstance(out, cupy.ndarray) and out.dtype == cupy.float16 and lse.dtype == cupy.float32
    expected, expected_lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(torch.from_dlpack(out), expected)
    assert torch.equal(torch.from_dlpack(lse), expected_lse)
    dq, dk, dv = flashattn.attention_backward(cupy.ones_like(out), cq, ck, cv, out, lse, causal=True)
    assert isinstance(dq, cupy.ndarray) and dk.shape == ck.shape and dv.shape == cv.shape


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_merge_of_split_keys_is_the_whole_attention(dtype, causal):
    q, k, v = make((2, 77, 300, 8, 2, 128), dtype, seed=5)
    whole, whole_lse = flashattn.attention(q, k, v, causal=causal, return_lse=True)
    bounds = [0, 64, 65, 200, 300]
    outs, lses = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        window = (-1, k.shape[1] - b) if causal else None  # the whole range's mask on the part
        o, l = flashattn.attention(q, k[:, a:b], v[:, a:b], window=window, return_lse=True)
        outs.append(o)
        lses.append(l)
    parts, parts_lse = torch.stack(outs), torch.stack(lses)
    merged, merged_lse = flashattn.merge(parts, parts_lse, return_lse=True)
    assert merged.is_cuda and merged.dtype == dtype
    # Rounded once more than the whole attention: a few units in the last place apart.
    ulp = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}[dtype]
    assert err(merged, whole) <= 4 * ulp * max(1.0, whole.abs().max().item())
    assert err(merged_lse, whole_lse) <= 1e-4
    # In place into part 0, on the current stream.
    flashattn.merge(parts, parts_lse, out=parts[0], lse=parts_lse[0])
    torch.cuda.synchronize()
    assert torch.equal(parts[0], merged) and torch.equal(parts_lse[0], merged_lse)


@pytest.mark.parametrize("page_size", [0, 16, 7])
def test_kvcache_on_cuda_is_the_cpu_result(page_size):
    # One decode step appending a token, contiguous and paged: CUDA's output and cache beside
    # the CPU backend's on the same values (torch CPU tensors).
    b, capacity, hq, hkv, d = 2, 64, 8, 2, 64
    g = torch.Generator().manual_seed(3)
    q = torch.randn(b, 1, hq, d, generator=g).to(torch.float16)
    k_new, v_new = (torch.randn(b, 1, hkv, d, generator=g).to(torch.float16) for _ in range(2))
    seqlens = torch.tensor([3, 40], dtype=torch.int32)
    if page_size:
        pages = b * (capacity // page_size + 1)
        k_cache, v_cache = (torch.randn(pages, page_size, hkv, d, generator=g).to(torch.float16)
                            for _ in range(2))
        table = torch.randperm(pages, generator=g)[:b * (capacity // page_size)]
        table = table.reshape(b, -1).to(torch.int32).contiguous()
    else:
        k_cache, v_cache = (torch.randn(b, capacity, hkv, d, generator=g).to(torch.float16)
                            for _ in range(2))
        table = None
    gpu = [t.to(DEVICE) if t is not None else None
           for t in (q, k_cache, v_cache, seqlens, table, k_new, v_new)]
    out_gpu = flashattn.attention_with_kvcache(gpu[0], gpu[1], gpu[2], gpu[3], block_table=gpu[4],
                                               k_new=gpu[5], v_new=gpu[6], causal=True)
    out_cpu = flashattn.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table,
                                               k_new=k_new, v_new=v_new, causal=True)
    torch.cuda.synchronize()
    assert torch.equal(gpu[1].cpu(), k_cache) and torch.equal(gpu[2].cpu(), v_cache)
    assert err(out_gpu.cpu().float(), out_cpu.float()) <= 4 * ATOL["float16"]
