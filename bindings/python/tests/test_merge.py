"""flashattn.merge with numpy arrays on the CPU backend (and torch CPU tensors where torch is
installed): attention over parts of the keys, merged by the LSE, is attention over all of them;
stacked and listed parts, in place, -inf parts, and bad inputs refused with the library's status
and message."""
import numpy as np
import pytest

import flashattn
from flashattn import flashattn_swig as low


def inputs(b, nq, nk, hq, hkv, d, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(dtype)
                 for shape in ((b, nq, hq, d), (b, nk, hkv, d), (b, nk, hkv, d)))


def parts_of(q, k, v, bounds, causal):
    """out and lse of attention over each part [bounds[i], bounds[i + 1]) of the keys, the mask
    of the whole range shifted onto the part (a window whose right bound is the keys after it)."""
    nk = k.shape[1]
    outs, lses = [], []
    for begin, end in zip(bounds[:-1], bounds[1:]):
        window = (-1, nk - end) if causal else None
        o, l = flashattn.attention(q, k[:, begin:end], v[:, begin:end], window=window,
                                   return_lse=True)
        outs.append(o)
        lses.append(l)
    return outs, lses


def assert_close(what, got, want, rel):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert np.array_equal(np.isneginf(got), np.isneginf(want)), what + ": -inf rows differ"
    finite = np.isfinite(want)
    err = np.abs(got[finite] - want[finite]).max() if finite.any() else 0.0
    bound = rel * max(1.0, np.abs(want[finite]).max() if finite.any() else 1.0)
    assert err <= bound, "%s: max error %.3g exceeds %.3g" % (what, err, bound)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,rel", [(np.float32, 1e-5), (np.float16, 4e-3)])
def test_merged_parts_are_the_whole_attention(causal, dtype, rel):
    q, k, v = inputs(2, 19, 41, 4, 2, 16, dtype, seed=3)
    out, lse = flashattn.attention(q, k, v, causal=causal, return_lse=True)
    bounds = [0, 5, 6, 20, 41]
    outs, lses = parts_of(q, k, v, bounds, causal)
    merged, merged_lse = flashattn.merge(outs, lses, return_lse=True)
    assert merged.dtype == dtype and merged.shape == out.shape
    assert merged_lse.dtype == np.float32 and merged_lse.shape == lse.shape
    assert_close("out", merged, out, rel)
    assert_close("lse", merged_lse, lse, 1e-5)
    # A stacked array gives the same bits as the list.
    again = flashattn.merge(np.stack(outs), np.stack(lses))
    assert np.array_equal(again, merged)


def test_rows_that_see_no_key_and_empty_parts():
    # Nq > Nk with causal: the first rows see no key of any part.
    q, k, v = inputs(1, 12, 5, 2, 2, 8, seed=4)
    outs, lses = parts_of(q, k, v, [0, 2, 5], causal=True)
    empty_out = np.full_like(outs[0], np.nan)
    empty_lse = np.full_like(lses[0], -np.inf)
    merged, merged_lse = flashattn.merge(outs + [empty_out], lses + [empty_lse], return_lse=True)
    assert not np.isnan(merged).any()
    assert np.all(merged[:, :7] == 0.0)
    assert np.all(np.isneginf(merged_lse[:, :, :7]))
    out, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    assert_close("out", merged, out, 1e-5)


def test_in_place_into_part_zero():
    q, k, v = inputs(1, 6, 30, 2, 1, 8, seed=5)
    outs, lses = parts_of(q, k, v, [0, 10, 30], causal=False)
    parts, parts_lse = np.stack(outs), np.stack(lses)
    out, lse = flashattn.merge(parts, parts_lse, out=parts[0], lse=parts_lse[0])
    assert out is parts[0] or np.shares_memory(out, parts)
    whole, whole_lse = flashattn.attention(q, k, v, return_lse=True)
    assert_close("out", parts[0], whole, 1e-5)
    assert_close("lse", parts_lse[0], whole_lse, 1e-5)


def test_strided_parts():
    q, k, v = inputs(2, 7, 24, 2, 2, 8, seed=6)
    outs, lses = parts_of(q, k, v, [0, 11, 24], causal=False)
    # Parts interleaved along the head axis: [parts, b, n, h, d] as a transposed view.
    parts = np.ascontiguousarray(np.stack(outs).transpose(1, 2, 3, 0, 4)).transpose(3, 0, 1, 2, 4)
    merged = flashattn.merge(parts, np.stack(lses))
    whole = flashattn.attention(q, k, v)
    assert_close("out", merged, whole, 1e-5)


def test_one_part_is_the_identity():
    q, k, v = inputs(1, 5, 9, 1, 1, 4, seed=7)
    o, l = flashattn.attention(q, k, v, return_lse=True)
    merged, merged_lse = flashattn.merge([o], [l], return_lse=True)
    assert np.array_equal(merged, o) and np.array_equal(merged_lse, l)


def test_bad_inputs_are_refused_with_the_library_message():
    o = np.zeros((2, 1, 3, 2, 4), np.float32)
    l = np.zeros((2, 1, 2, 3), np.float32)
    with pytest.raises(flashattn.Error) as e:
        flashattn.merge(o, np.zeros((3, 1, 2, 3), np.float32))
    assert e.value.status == low.FLASHATTN_ERROR_INVALID_SHAPE
    assert "parts_lse: 3 parts differ from parts_out's 2" in str(e.value)
    with pytest.raises(flashattn.Error) as e:
        flashattn.merge(o, np.zeros((2, 1, 2, 4), np.float32))
    assert e.value.status == low.FLASHATTN_ERROR_INVALID_SHAPE
    assert "parts_lse: shape [1, 2, 4]" in str(e.value)
    with pytest.raises(flashattn.Error) as e:
        flashattn.merge(o, l, out=np.zeros((1, 3, 2, 4), np.float16))
    assert e.value.status == low.FLASHATTN_ERROR_INVALID_DTYPE
    flashattn.merge(o, l, out=o[1])  # exactly part 1: in place, allowed
    with pytest.raises(flashattn.Error) as e:
        flashattn.merge(o, l, out=o.reshape(-1)[1:25].reshape(1, 3, 2, 4))
    assert e.value.status == low.FLASHATTN_ERROR_INVALID_MEMORY
    assert "shares memory with part" in str(e.value)
    with pytest.raises(flashattn.Error) as e:
        flashattn.merge(o[:0], l[:0])
    assert e.value.status == low.FLASHATTN_ERROR_INVALID_ARGUMENT
    assert "num_parts is 0" in str(e.value)


def test_torch_tensors_merge():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(x) for x in inputs(1, 8, 20, 2, 2, 8, seed=8))
    outs, lses = parts_of(q, k, v, [0, 7, 20], causal=True)
    merged, merged_lse = flashattn.merge(outs, lses, return_lse=True)
    assert isinstance(merged, torch.Tensor)
    whole, whole_lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    assert_close("out", merged.numpy(), whole.numpy(), 1e-5)
    assert_close("lse", merged_lse.numpy(), whole_lse.numpy(), 1e-5)
