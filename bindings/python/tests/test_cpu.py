"""The package on the CPU backend with numpy arrays, against float64 attention in numpy."""
import sys
import threading

import numpy as np
import pytest

import flashattn
from flashattn import flashattn_swig as low
from reference import (ATOL, assert_within, max_error, reference, reference_grads, standard,
                       standard_grads)

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

DTYPES = ["float32", "float16"] + (["bfloat16"] if ml_dtypes is not None else [])

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim): no tile multiples, GQA and MQA,
# seqlen_q > seqlen_k (a causal mask then leaves the first rows no key at all).
SHAPES = [(2, 37, 53, 4, 2, 32), (1, 64, 64, 2, 2, 16), (1, 70, 30, 3, 1, 40)]


def np_dtype(name):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def inputs(shape, dtype_name, seed=0):
    b, nq, nk, hq, hkv, d = shape
    rng = np.random.default_rng(seed)
    dt = np_dtype(dtype_name)
    q = rng.standard_normal((b, nq, hq, d)).astype(dt)
    k = rng.standard_normal((b, nk, hkv, d)).astype(dt)
    v = rng.standard_normal((b, nk, hkv, d)).astype(dt)
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_matches_float64(shape, causal, dtype):
    q, k, v = inputs(shape, dtype)
    out, lse = flashattn.attention(q, k, v, causal=causal, return_lse=True)
    assert isinstance(out, np.ndarray) and out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (shape[0], shape[3], shape[1])
    ref_out, ref_lse = reference(q, k, v, causal)
    assert_within("out", out, ref_out, standard(q, k, v, dtype, causal), ATOL[dtype])
    # The LSE is fp32 whatever the dtype: compare it with a float32 rounding of the truth.
    assert max_error(lse, ref_lse) <= 1e-4 * max(1.0, float(np.abs(ref_lse[np.isfinite(ref_lse)]).max()))


def test_fully_masked_rows_give_zero_and_minus_inf():
    q, k, v = inputs((1, 8, 4, 2, 2, 16), "float32")
    out, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    # Row i sees keys j <= i + 4 - 8: rows 0..3 see none.
    assert np.all(out[:, :4] == 0) and np.all(np.isneginf(lse[:, :, :4]))
    assert np.all(np.isfinite(lse[:, :, 4:]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_backward_matches_float64(shape, causal, dtype):
    q, k, v = inputs(shape, dtype)
    dout = np.random.default_rng(1).standard_normal(q.shape).astype(q.dtype)
    out, lse = flashattn.attention(q, k, v, causal=causal, return_lse=True)
    grads = flashattn.attention_backward(dout, q, k, v, out, lse, causal=causal)
    refs = reference_grads(dout, q, k, v, causal)
    stds = standard_grads(dout, q, k, v, dtype, causal)
    for name, ours, ref, std, like in zip(("dq", "dk", "dv"), grads, refs, stds, (q, k, v)):
        assert ours.dtype == q.dtype and ours.shape == like.shape
        assert_within(name, ours, ref, std, ATOL[dtype])


def test_scale_and_standard_algorithm():
    q, k, v = inputs(SHAPES[0], "float32")
    for algorithm in ("flash", "standard"):
        out = flashattn.attention(q, k, v, scale=0.3, algorithm=algorithm)
        assert_within(algorithm, out, reference(q, k, v, scale=0.3)[0],
                      standard(q, k, v, "float32", scale=0.3), ATOL["float32"])


def test_strided_views_are_read_in_place():
    b, n, h, d = 2, 33, 4, 32
    qkv = np.random.default_rng(2).standard_normal((b, n, 3, h, d)).astype(np.float32)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # a packed QKV tensor, not copied
    assert not q.flags.c_contiguous
    ours = flashattn.attention(q, k, v, causal=True)
    assert np.array_equal(ours, flashattn.attention(*(np.ascontiguousarray(t) for t in (q, k, v)),
                                                    causal=True))
    # [batch, heads, seqlen, head_dim] storage seen through a transposed view
    bhsd = np.ascontiguousarray(q.transpose(0, 2, 1, 3))
    assert np.array_equal(flashattn.attention(bhsd.transpose(0, 2, 1, 3), k, v, causal=True), ours)


def test_broadcast_inputs_are_read_in_place():
    q, k, v = inputs((1, 20, 30, 4, 2, 16), "float32")
    k2, v2 = np.broadcast_to(k, (3,) + k.shape[1:]), np.broadcast_to(v, (3,) + v.shape[1:])
    q2 = np.concatenate([q, 2 * q, 3 * q])
    assert k2.strides[0] == 0
    out = flashattn.attention(q2, k2, v2)
    for b in range(3):
        assert np.array_equal(out[b:b + 1], flashattn.attention(q2[b:b + 1], k, v))


def test_the_gil_is_released_during_the_call():
    q, k, v = inputs((1, 1024, 1024, 4, 4, 64), "float32")
    ctx = flashattn.Context("cpu")
    ctx.set_num_threads(1)
    views = [flashattn._arrays.describe(n, a).view() for n, a in zip("qkv", (q, k, v))]
    out = np.empty_like(q)
    args = [ctx.handle] + views + [flashattn._arrays.describe("out", out).view(), None,
                                   flashattn._core.options(False, None, "flash", False), None, 0]
    state = {"done": False}

    def work():
        low.flashattn_forward(*args)
        state["done"] = True

    # With a switch interval this long, a thread holding the GIL keeps it until it blocks or ends.
    # This thread therefore runs again only when the worker lets go of the GIL: inside the call
    # if the binding releases it there, or once the worker has finished otherwise.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        worker = threading.Thread(target=work)
        worker.start()
        finished_first = state["done"]
        worker.join()
    finally:
        sys.setswitchinterval(interval)
    ctx.close()
    assert state["done"] and not finished_first


def test_deterministic_backward_is_bit_identical():
    q, k, v = inputs(SHAPES[0], "float32")
    dout = np.ones_like(q)
    out, lse = flashattn.attention(q, k, v, return_lse=True)
    first = flashattn.attention_backward(dout, q, k, v, out, lse, deterministic=True)
    again = flashattn.attention_backward(dout, q, k, v, out, lse, deterministic=True)
    for a, b in zip(first, again):
        assert a.tobytes() == b.tobytes()


def test_threads_compute_on_their_own_contexts():
    cases = [inputs(SHAPES[i % len(SHAPES)], "float32", seed=i) for i in range(6)]
    expected = [flashattn.attention(*c) for c in cases]
    results, errors = [None] * len(cases), []

    def work(i):
        try:
            for _ in range(5):
                results[i] = flashattn.attention(*cases[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for r, e in zip(results, expected):
        assert np.array_equal(r, e)


def test_explicit_context():
    q, k, v = inputs(SHAPES[1], "float32")
    with flashattn.Context("cpu") as ctx:
        assert ctx.backend == "cpu" and ctx.device == -1 and ctx.stream == 0
        ctx.set_num_threads(1)
        out = flashattn.attention(q, k, v, context=ctx)
        ctx.synchronize()
    assert np.array_equal(out, flashattn.attention(q, k, v))
    with pytest.raises(ValueError, match="closed"):
        ctx.handle


def test_cpu_kernels(monkeypatch):
    copies = ("generic", "avx2", "avx512", "avx512bf16", "amx")
    monkeypatch.delenv("FLASHATTN_CPU_ISA", raising=False)
    with flashattn.Context("cpu") as ctx:
        best = ctx.cpu_kernels
    assert best in copies
    # FLASHATTN_CPU_ISA caps the copy of a context created after it is set.
    monkeypatch.setenv("FLASHATTN_CPU_ISA", "generic")
    with flashattn.Context("cpu") as ctx:
        assert ctx.cpu_kernels == "generic"
    monkeypatch.setenv("FLASHATTN_CPU_ISA", "amx")
    with flashattn.Context("cpu") as ctx:
        assert ctx.cpu_kernels == best


# ---- bad input: flashattn.Error carrying the library's message, never a crash ----

def test_shape_mismatch_raises_the_library_message():
    q, k, v = inputs(SHAPES[0], "float32")
    with pytest.raises(flashattn.Error) as e:
        flashattn.attention(q, k[..., :16], v)
    assert e.value.status == low.FLASHATTN_ERROR_INVALID_SHAPE
    assert e.value.status_name == "FLASHATTN_ERROR_INVALID_SHAPE"
    assert e.value.message == "flashattn_forward: k: head_dim 16 differs from q's 32"
    assert str(e.value) == "FLASHATTN_ERROR_INVALID_SHAPE: " + e.value.message


def test_rank_and_stride_errors_come_from_the_library():
    q, k, v = inputs(SHAPES[0], "float32")
    with pytest.raises(flashattn.Error, match="q: rank is 3, expected 4"):
        flashattn.attention(q[0], k, v)
    with pytest.raises(flashattn.Error, match=r"k: strides\[3\] \(head_dim\) is 2, must be 1"):
        flashattn.attention(q[..., :16], k[..., ::2], v[..., :16])
    with pytest.raises(flashattn.Error, match="must be >= 0"):
        flashattn.attention(q[:, ::-1], k, v)


def test_backward_options_and_lse_errors():
    q, k, v = inputs(SHAPES[0], "float32")
    out, lse = flashattn.attention(q, k, v, return_lse=True)
    with pytest.raises(flashattn.Error, match="lse: shape"):
        flashattn.attention_backward(out, q, k, v, out, lse[:, :, :5])
    with pytest.raises(flashattn.Error, match="softmax_scale is inf, must be finite"):
        flashattn.attention(q, k, v, scale=float("inf"))


def test_unsupported_inputs_raise_python_errors():
    q, k, v = inputs(SHAPES[0], "float32")
    with pytest.raises(flashattn.Error, match="dtype float64 is not supported") as e:
        flashattn.attention(q.astype(np.float64), k, v)
    assert e.value.status == low.FLASHATTN_ERROR_INVALID_DTYPE
    with pytest.raises(TypeError, match="a numpy array, torch tensor or cupy array"):
        flashattn.attention(q.tolist(), k, v)
    with pytest.raises(flashattn.Error, match="rank is 5, at most 4"):
        flashattn.attention(q[None], k, v)
    with pytest.raises(ValueError, match="algorithm"):
        flashattn.attention(q, k, v, algorithm="fast")


def test_cuda_context_without_a_device_is_an_error():
    if flashattn.cuda_device_count() > 0:
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(flashattn.Error) as e:
        flashattn.Context("cuda", 0)
    assert e.value.status == low.FLASHATTN_ERROR_BACKEND_UNAVAILABLE
    assert e.value.message.startswith("flashattn_context_create: ")


# ---- the low layer itself ----

def test_low_layer_versions_and_errors():
    assert low.flashattn_version_number() == low.FLASHATTN_VERSION_NUMBER
    assert low.flashattn_version_string() == low.FLASHATTN_VERSION_STRING == flashattn.version()
    with pytest.raises(low.Error) as e:
        low.flashattn_buffer_create(None, 16)
    assert e.value.message == "flashattn_buffer_create: ctx is NULL"
    assert low.flashattn_last_error() == e.value.message  # reading does not clear it
    length, text = low.flashattn_last_error_r(11)
    assert length == len(e.value.message) and text == e.value.message[:10]
    assert low.flashattn_status_string(12345) == "FLASHATTN_UNKNOWN_STATUS"


def test_low_layer_buffers_round_trip():
    ctx = low.flashattn_context_create(low.FLASHATTN_BACKEND_CPU, 0)
    try:
        buf = low.flashattn_buffer_create(ctx, 64)
        try:
            assert low.flashattn_buffer_size(buf) == 64
            assert low.flashattn_buffer_data(buf) % 256 == 0
            src = np.arange(16, dtype=np.float32)
            low.flashattn_buffer_write(buf, 0, src)
            dst = np.zeros(8, dtype=np.float32)
            low.flashattn_buffer_read(buf, 32, dst)
            assert np.array_equal(dst, src[8:])
            with pytest.raises(low.Error, match="exceeds the buffer's 64 bytes"):
                low.flashattn_buffer_read(buf, 8, bytearray(64))
            with pytest.raises(BufferError):
                low.flashattn_buffer_read(buf, 0, b"read-only bytes")
        finally:
            low.flashattn_buffer_destroy(buf)
    finally:
        low.flashattn_context_destroy(ctx)



# What a forked child finds in its copy of the parent's memory (arguments would be pickled).
_INHERITED = {}


def _forward_in_child():
    return flashattn.attention(*_INHERITED["qkv"], causal=True, context=_INHERITED["context"])


def test_a_forked_child_computes_with_an_inherited_context():
    # multiprocessing's "fork" start method: the child inherits a context whose thread pool has
    # started its workers in the parent; it must start its own, not wait for the parent's.
    import multiprocessing

    qkv = inputs(SHAPES[0], "float32")
    context = flashattn.Context("cpu")
    context.set_num_threads(2)
    want = flashattn.attention(*qkv, causal=True, context=context)
    _INHERITED.update(qkv=qkv, context=context)
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            got = pool.apply_async(_forward_in_child).get(timeout=60)
    finally:
        _INHERITED.clear()
    np.testing.assert_array_equal(got, want)
    context.close()
