"""flashattn.attention_with_kvcache with numpy arrays on the CPU backend: a paged cache (any page
size, a shuffled block table) gives the out and lse of a contiguous cache and of the
variable-length attention over the same tokens, bit for bit; rows appended land in the cache at
each sequence's end and are attended; the rotary embedding (both layouts, a part of head_dim)
against a float64 rotation; bad lengths, tables and read-only caches are refused with the cache
left as it was."""
import numpy as np
import pytest

import flashattn
from flashattn import flashattn_swig as low
from reference import ATOL, assert_within, reference, standard

HQ, HKV, D, DV = 4, 2, 32, 24  # GQA, and v with a head_dim of its own
DTYPES = [np.float32, np.float16]
# Page sizes: one token a page, one that divides no length, one as large as a tile row block.
PAGE_SIZES = [1, 7, 16]
SPARE_PAGES = 2  # pages no sequence uses (poisoned: reading one shows as NaN)
# An exactly representable value that no input holds: an output or cache row the call must
# leave alone is filled with it.
SENTINEL = -7.0


def tokens(lengths, dtype, seed, dv=DV):
    """Per sequence, its keys [n, HKV, D] and values [n, HKV, dv]."""
    rng = np.random.default_rng(seed)
    ks = [rng.standard_normal((n, HKV, D)).astype(dtype) for n in lengths]
    vs = [rng.standard_normal((n, HKV, dv)).astype(dtype) for n in lengths]
    return ks, vs


def queries(batch, nq, dtype, seed):
    return np.random.default_rng(seed + 1000).standard_normal((batch, nq, HQ, D)).astype(dtype)


class Cache:
    """k and v caches holding each sequence's tokens: contiguous ([B, capacity, ...]) with
    page_size None, else paged ([num_pages, page_size, ...]) in a shuffled order with -1 past the
    pages a sequence uses. Every slot that holds no token is NaN. room: per sequence, the tokens
    it will hold once rows are appended (the pages the table gives it; by default its own)."""

    def __init__(self, ks, vs, capacity, page_size=None, seed=0, room=None):
        self.page_size, self.batch = page_size, len(ks)
        dtype, dv = ks[0].dtype, vs[0].shape[-1]
        if page_size is None:
            self.capacity, self.table = capacity, None
            shape = (self.batch, capacity)
        else:
            per_seq = -(-capacity // page_size)  # whole pages
            self.capacity = per_seq * page_size
            num_pages = self.batch * per_seq + SPARE_PAGES
            order = np.random.default_rng(seed).permutation(num_pages)
            self.table = np.full((self.batch, per_seq), -1, dtype=np.int32)
            for b, k in enumerate(ks):
                used = -(-(len(k) if room is None else room[b]) // page_size)
                self.table[b, :used] = order[b * per_seq:b * per_seq + used]
            shape = (num_pages, page_size)
        self.k = np.full(shape + (HKV, D), np.nan, dtype=dtype)
        self.v = np.full(shape + (HKV, dv), np.nan, dtype=dtype)
        for b, (k, v) in enumerate(zip(ks, vs)):
            for t in range(len(k)):
                self.k[self.slot(b, t)] = k[t]
                self.v[self.slot(b, t)] = v[t]

    def slot(self, b, t):
        """Where token t of sequence b lies: (batch or page, row)."""
        if self.table is None:
            return b, t
        return int(self.table[b, t // self.page_size]), t % self.page_size

    def rows(self, cache, b, start, stop):
        return np.stack([cache[self.slot(b, t)] for t in range(start, stop)])

    def kwargs(self):
        return {} if self.table is None else {"block_table": self.table}


def varlen(q, ks, vs, **kw):
    """attention() of every sequence's queries over its tokens as one variable-length batch,
    with out and lse in the cache call's layout ([B, Nq, Hq, dv] and [B, Hq, Nq])."""
    batch, nq = q.shape[:2]
    lengths = [len(k) for k in ks]
    cu_q = np.arange(0, (batch + 1) * nq, nq, dtype=np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    out, lse = flashattn.attention(q.reshape(batch * nq, HQ, D), np.concatenate(ks),
                                   np.concatenate(vs), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                   return_lse=True, **kw)
    return (out.reshape(batch, nq, HQ, -1),
            lse.reshape(HQ, batch, nq).transpose(1, 0, 2))


def same_bits(what, got, want):
    np.testing.assert_array_equal(got, want, err_msg=what)


# ---- (a) the layouts of the cache against each other and the variable-length forward ---------

LAYOUTS = [None] + PAGE_SIZES  # None: contiguous


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("algorithm", ["flash", "standard"])
def test_paged_and_contiguous_caches_are_the_varlen_forward(dtype, causal, algorithm):
    # Lengths of 0 and 1 (below the query count: rows that see no key with causal), one past a
    # tile, none a multiple of a page.
    lengths, nq, capacity = [0, 1, 37, 70, 9], 3, 75
    ks, vs = tokens(lengths, dtype, seed=1)
    q = queries(len(lengths), nq, dtype, seed=1)
    seqlens = np.array(lengths, dtype=np.int32)
    want_out, want_lse = varlen(q, ks, vs, causal=causal, algorithm=algorithm)
    assert np.isneginf(want_lse[0]).all()  # sequence 0 holds no token
    for page_size in LAYOUTS:
        cache = Cache(ks, vs, capacity, page_size, seed=page_size or 0)
        k_before, v_before = cache.k.copy(), cache.v.copy()
        out, lse = flashattn.attention_with_kvcache(q, cache.k, cache.v, seqlens, causal=causal,
                                                    algorithm=algorithm, return_lse=True,
                                                    **cache.kwargs())
        what = "page size %s" % page_size
        assert out.shape == (len(lengths), nq, HQ, DV) and out.dtype == dtype
        assert lse.shape == (len(lengths), HQ, nq) and lse.dtype == np.float32
        same_bits(what + " out", out, want_out)
        same_bits(what + " lse", lse, want_lse)
        # Without k_new the cache is only read.
        same_bits(what + " k", cache.k, k_before)
        same_bits(what + " v", cache.v, v_before)


def test_block_table_entries_past_the_used_pages_are_not_read():
    lengths = [5, 12]
    ks, vs = tokens(lengths, np.float32, seed=2)
    q = queries(2, 1, np.float32, seed=2)
    cache = Cache(ks, vs, 16, page_size=4, seed=3)
    seqlens = np.array(lengths, dtype=np.int32)
    want = flashattn.attention_with_kvcache(q, cache.k, cache.v, seqlens, **cache.kwargs())
    table = cache.table.copy()
    table[0, 2:] = np.iinfo(np.int32).max  # sequence 0 uses 2 pages of 4
    got = flashattn.attention_with_kvcache(q, cache.k, cache.v, seqlens, block_table=table)
    same_bits("out", got, want)


def test_pages_shared_for_reading():
    # Sequences 1 and 2 read sequence 0's first two pages (their first 14 tokens are its own).
    page, shared = 7, 2
    lengths = [20, 15, 30]
    ks, vs = tokens(lengths, np.float32, seed=4)
    for b in (1, 2):
        ks[b][:page * shared], vs[b][:page * shared] = ks[0][:page * shared], vs[0][:page * shared]
    q = queries(3, 2, np.float32, seed=4)
    cache = Cache(ks, vs, 30, page_size=page, seed=5)
    cache.table[1:, :shared] = cache.table[0, :shared]
    out = flashattn.attention_with_kvcache(q, cache.k, cache.v, np.array(lengths, np.int32),
                                           block_table=cache.table, causal=True)
    same_bits("out", out, varlen(q, ks, vs, causal=True)[0])


VARIANTS = [
    ("window", dict(window=(6, 0), causal=True)),
    ("softcap", dict(softcap=1.5)),
    ("alibi_per_batch", dict(alibi_slopes=np.array([[0.5, 0.1, 0.3, 0.2], [0.05, 0.4, 0.0, 1.0],
                                                    [0.2, 0.2, 0.7, 0.1]], np.float32))),
    ("sinks", dict(sinks=np.array([0.5, -1.0, 2.0, 0.0], np.float32), scale=0.3)),
]


@pytest.mark.parametrize("name,kw", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_variants_through_the_cache(name, kw):
    lengths = [4, 33, 18]
    ks, vs = tokens(lengths, np.float32, seed=6)
    q = queries(3, 2, np.float32, seed=6)
    cache = Cache(ks, vs, 40, page_size=7, seed=7)
    seqlens = np.array(lengths, dtype=np.int32)
    out, lse = flashattn.attention_with_kvcache(q, cache.k, cache.v, seqlens,
                                                block_table=cache.table, return_lse=True, **kw)
    want_out, want_lse = varlen(q, ks, vs, **kw)
    same_bits(name + " out", out, want_out)
    same_bits(name + " lse", lse, want_lse)
    # The variant reaches the library: without it the result differs.
    plain = flashattn.attention_with_kvcache(q, cache.k, cache.v, seqlens,
                                             block_table=cache.table,
                                             causal=kw.get("causal", False))
    assert np.abs(plain - out).max() > 1e-3


def test_out_is_written_in_place():
    lengths = [3, 10]
    ks, vs = tokens(lengths, np.float32, seed=8)
    q = queries(2, 2, np.float32, seed=8)
    cache = Cache(ks, vs, 12)
    seqlens = np.array(lengths, dtype=np.int32)
    want = flashattn.attention_with_kvcache(q, cache.k, cache.v, seqlens)
    # A strided view: every other row of a larger array, whose other rows stay as they were.
    block = np.full((2, 4, HQ, DV), SENTINEL, dtype=np.float32)
    target = block[:, ::2]
    got = flashattn.attention_with_kvcache(q, cache.k, cache.v, seqlens, out=target)
    assert got is target
    same_bits("out", block[:, ::2], want)
    assert (block[:, 1::2] == SENTINEL).all()


# ---- (b) rows appended ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("page_size", LAYOUTS, ids=lambda p: "contiguous" if p is None else
                         "page%d" % p)
@pytest.mark.parametrize("nq", [1, 3])  # fewer queries than new rows, and more
def test_new_rows_are_written_into_the_cache_and_attended(dtype, page_size, nq):
    held, n_new, capacity = [0, 5, 30, 14], 2, 32
    total = [h + n_new for h in held]
    ks, vs = tokens(total, dtype, seed=9)
    q = queries(len(held), nq, dtype, seed=9)
    # The table as the caller sizes it for the rows to come.
    cache = Cache([k[:h] for k, h in zip(ks, held)], [v[:h] for v, h in zip(vs, held)], capacity,
                  page_size, seed=10, room=total)
    k_new = np.stack([k[h:] for k, h in zip(ks, held)])
    v_new = np.stack([v[h:] for v, h in zip(vs, held)])
    k_before, v_before = cache.k.copy(), cache.v.copy()
    out, lse = flashattn.attention_with_kvcache(q, cache.k, cache.v, np.array(held, np.int32),
                                                k_new=k_new, v_new=v_new, causal=True,
                                                return_lse=True, **cache.kwargs())
    # Token held[b] + i of sequence b is k_new[b, i], exactly; no other slot changed.
    written = np.zeros(cache.k.shape[:2], dtype=bool)
    for b, h in enumerate(held):
        same_bits("k rows of sequence %d" % b, cache.rows(cache.k, b, h, h + n_new), k_new[b])
        same_bits("v rows of sequence %d" % b, cache.rows(cache.v, b, h, h + n_new), v_new[b])
        for t in range(h, h + n_new):
            written[cache.slot(b, t)] = True
    same_bits("k elsewhere", cache.k[~written], k_before[~written])
    same_bits("v elsewhere", cache.v[~written], v_before[~written])
    want_out, want_lse = varlen(q, ks, vs, causal=True)
    same_bits("out", out, want_out)
    same_bits("lse", lse, want_lse)


def test_a_cache_filled_to_its_last_token():
    ks, vs = tokens([16, 16], np.float32, seed=11)
    cache = Cache([k[:12] for k in ks], [v[:12] for v in vs], 16, page_size=4, seed=12,
                  room=[16, 16])
    q = queries(2, 4, np.float32, seed=11)
    out = flashattn.attention_with_kvcache(q, cache.k, cache.v, np.array([12, 12], np.int32),
                                           k_new=np.stack([k[12:] for k in ks]),
                                           v_new=np.stack([v[12:] for v in vs]),
                                           block_table=cache.table, causal=True)
    same_bits("out", out, varlen(q, ks, vs, causal=True)[0])
    assert not np.isnan(cache.k[cache.table.ravel()]).any()  # every used page is full


# ---- (c) the rotary embedding ----------------------------------------------------------------

def rotary_tables(positions, rotary_dim, dtype):
    """cos and sin of the angles pos * 10000^(-2r / R), in `dtype`."""
    r = np.arange(rotary_dim // 2)
    angle = np.arange(positions)[:, None] * 10000.0 ** (-2.0 * r[None, :] / rotary_dim)
    return np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)


def pairs(rotary_dim, interleaved):
    """The feature pairs (first, second) a rotation mixes."""
    half = np.arange(rotary_dim // 2)
    return (2 * half, 2 * half + 1) if interleaved else (half, half + rotary_dim // 2)


def rotate64(x, positions, cos, sin, interleaved):
    """x [n, heads, d] rotated in float64, row i at positions[i], with the tables' values."""
    x = np.asarray(x, dtype=np.float64).copy()
    first, second = pairs(2 * cos.shape[1], interleaved)
    c = cos.astype(np.float64)[positions][:, None, :]
    s = sin.astype(np.float64)[positions][:, None, :]
    a, b = x[..., first].copy(), x[..., second].copy()
    x[..., first], x[..., second] = a * c - b * s, a * s + b * c
    return x


# One unit in the last place of each dtype, relative (float32 and float16 mantissas).
ULP = {np.float32: 2.0 ** -23, np.float16: 2.0 ** -10}
# fp32's own rounding of x cos - y sin: a few units of float32 at the pair's magnitude.
FP32_ROUNDING = 2.0 ** -22


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half_split", "interleaved"])
@pytest.mark.parametrize("table_dtype", ["float32", "q"])
@pytest.mark.parametrize("page_size", [None, 7], ids=["contiguous", "page7"])
def test_rotary_against_a_float64_rotation(dtype, interleaved, table_dtype, page_size):
    rotary_dim, n_new, nq = 16, 2, 3  # a part of head_dim D = 32 rotated
    held, capacity = [1, 20, 41], 48
    total = [h + n_new for h in held]
    ks, vs = tokens(total, dtype, seed=13, dv=D)
    q = queries(len(held), nq, dtype, seed=13)
    cos, sin = rotary_tables(capacity, rotary_dim,
                             np.float32 if table_dtype == "float32" else dtype)
    cache = Cache([k[:h] for k, h in zip(ks, held)], [v[:h] for v, h in zip(vs, held)], capacity,
                  page_size, seed=14, room=total)
    k_new = np.stack([k[h:] for k, h in zip(ks, held)])
    v_new = np.stack([v[h:] for v, h in zip(vs, held)])
    q_before, k_before, v_before = q.copy(), cache.k.copy(), cache.v.copy()
    out, lse = flashattn.attention_with_kvcache(
        q, cache.k, cache.v, np.array(held, np.int32), k_new=k_new, v_new=v_new, rotary_cos=cos,
        rotary_sin=sin, rotary_interleaved=interleaved, causal=True, return_lse=True,
        **cache.kwargs())
    same_bits("q is read only", q, q_before)
    first, second = pairs(rotary_dim, interleaved)
    for b, h in enumerate(held):
        positions = np.arange(h, h + n_new)
        want = rotate64(k_new[b], positions, cos, sin, interleaved)
        got = cache.rows(cache.k, b, h, h + n_new).astype(np.float64)
        # The rotated features: one unit in the dtype's last place, plus fp32's rounding of the
        # products, bounded by the pair's inputs.
        x, y = k_new[b][..., first].astype(np.float64), k_new[b][..., second].astype(np.float64)
        for idx in (first, second):
            bound = ULP[dtype] * np.abs(want[..., idx]) + FP32_ROUNDING * (np.abs(x) + np.abs(y))
            err = np.abs(got[..., idx] - want[..., idx])
            assert (err <= bound).all(), "sequence %d: rotated k off by %.3g (bound %.3g)" % (
                b, err.max(), bound[err > bound].min())
        # Features past R are copied, as are the values.
        same_bits("k past R", got[..., rotary_dim:], k_new[b][..., rotary_dim:].astype(np.float64))
        same_bits("v rows", cache.rows(cache.v, b, h, h + n_new), v_new[b])
        # Attention over the rotated tokens: the cached ones as they are, the new ones and the
        # queries rotated (query i at len_k - Nq + i), by the project's tolerance rule.
        len_k = h + n_new
        q_rot = rotate64(q[b], np.arange(len_k - nq, len_k), cos, sin, interleaved)
        k_rot = np.concatenate([ks[b][:h].astype(np.float64), want])
        ref_out, ref_lse = reference(q_rot[None], k_rot[None], vs[b][None], causal=True)
        name = np.dtype(dtype).name
        # The standard algorithm in the dtype attends over the tokens as the dtype holds them.
        std = standard(q_rot.astype(dtype)[None], k_rot.astype(dtype)[None], vs[b][None], name,
                       causal=True)
        assert_within("out of sequence %d" % b, out[b][None], ref_out, std, ATOL[name])
        assert np.abs(lse[b] - ref_lse[0]).max() <= ATOL[name] * max(1.0, np.abs(ref_lse).max())
    # The rotation reaches the library: the same call without it differs.
    plain = flashattn.attention_with_kvcache(q, k_before, v_before, np.array(held, np.int32),
                                             k_new=k_new, v_new=v_new, causal=True,
                                             **cache.kwargs())
    assert np.abs(plain.astype(np.float64) - out).max() > 1e-2


def test_rotary_layouts_differ_and_q_alone_is_rotated_without_new_rows():
    lengths, nq, rotary_dim = [6, 9], 2, 8
    ks, vs = tokens(lengths, np.float32, seed=15)
    q = queries(2, nq, np.float32, seed=15)
    cos, sin = rotary_tables(16, rotary_dim, np.float32)
    cache = Cache(ks, vs, 16)
    seqlens = np.array(lengths, np.int32)
    outs = {}
    for interleaved in (False, True):
        outs[interleaved] = flashattn.attention_with_kvcache(
            q, cache.k, cache.v, seqlens, rotary_cos=cos, rotary_sin=sin,
            rotary_interleaved=interleaved)
        # Without new rows only q is rotated: attention of the rotated q over the cache.
        for b, n in enumerate(lengths):
            q_rot = rotate64(q[b], np.arange(n - nq, n), cos, sin, interleaved)
            ref, _ = reference(q_rot[None], ks[b][None], vs[b][None])
            assert np.abs(outs[interleaved][b] - ref[0]).max() <= 1e-5
    assert np.abs(outs[False] - outs[True]).max() > 1e-3


# ---- (d) bad values: flashattn.Error with the library's status and message, nothing written ---

def small_case(page_size=None):
    held = [3, 15]
    ks, vs = tokens(held, np.float32, seed=16)
    cache = Cache(ks, vs, 16, page_size, seed=17, room=[h + 1 for h in held])
    k_new, v_new = (np.ones((2, 2, HKV, n), np.float32) for n in (D, DV))
    return cache, np.array(held, np.int32), k_new, v_new, queries(2, 1, np.float32, seed=16)


def refused(status, fragment, cache, seqlens, q, **kw):
    """The call raises flashattn.Error(status) with the fragment; the cache and out are left
    as they were."""
    k_before, v_before = cache.k.copy(), cache.v.copy()
    out = np.full((q.shape[0], q.shape[1], HQ, DV), SENTINEL, np.float32)
    with pytest.raises(flashattn.Error) as e:
        flashattn.attention_with_kvcache(q, cache.k, cache.v, seqlens, out=out, **kw)
    assert e.value.status == getattr(low, status), e.value
    assert e.value.status_name == status
    assert fragment in e.value.message, e.value
    assert e.value.message.startswith("flashattn_forward_ex: ")
    same_bits("k after a refused call", cache.k, k_before)
    same_bits("v after a refused call", cache.v, v_before)
    assert (out == SENTINEL).all(), "a refused call wrote out"


def test_new_rows_past_the_capacity_are_refused():
    cache, seqlens, k_new, v_new, q = small_case()
    refused("FLASHATTN_ERROR_INVALID_SHAPE", "sequence 1: cache_seqlens[1] = 15 and 2 new rows "
            "make 17 tokens, past the cache's 16", cache, seqlens, q, k_new=k_new, v_new=v_new)
    # The same lengths with one new row fit.
    flashattn.attention_with_kvcache(q, cache.k, cache.v, seqlens, k_new=k_new[:, :1],
                                     v_new=v_new[:, :1])
    assert (cache.k[1, 15] == 1).all()


def test_bad_lengths_and_tables_are_refused():
    cache, seqlens, k_new, v_new, q = small_case()
    refused("FLASHATTN_ERROR_INVALID_SHAPE", "cache_seqlens[0] is -1, must be >= 0", cache,
            np.array([-1, 4], np.int32), q)
    refused("FLASHATTN_ERROR_INVALID_SHAPE", "cache_seqlens[1] = 17 and 0 new rows make 17 tokens",
            cache, np.array([3, 17], np.int32), q)
    paged, seqlens, k_new, v_new, q = small_case(page_size=4)
    table = paged.table.copy()
    table[1, 3] = -1  # sequence 1 uses 4 pages of 4 for its 15 tokens
    refused("FLASHATTN_ERROR_INVALID_SHAPE", "block_table[1, 3] is -1, outside k's %d pages "
            "(sequence 1 uses its first 4 entries)" % paged.k.shape[0], paged, seqlens, q,
            block_table=table, k_new=k_new[:, :1], v_new=v_new[:, :1])
    cos, sin = rotary_tables(8, 8, np.float32)
    refused("FLASHATTN_ERROR_INVALID_SHAPE", "sequence 1: position 14 is past rotary_cos's 8 rows",
            paged, seqlens, q, block_table=paged.table, rotary_cos=cos, rotary_sin=sin)


def test_bad_dtypes_and_arguments_are_refused():
    cache, seqlens, k_new, v_new, q = small_case()
    refused("FLASHATTN_ERROR_INVALID_DTYPE", "cache_seqlens: dtype float32, must be int32", cache,
            seqlens.astype(np.float32), q)
    # A dtype the library has no code for is named by the package, before any call.
    with pytest.raises(flashattn.Error, match="block_table: dtype int64 is not supported") as e:
        flashattn.attention_with_kvcache(q, cache.k, cache.v, seqlens,
                                         block_table=np.zeros((2, 4), np.int64))
    assert e.value.status == low.FLASHATTN_ERROR_INVALID_DTYPE
    refused("FLASHATTN_ERROR_INVALID_ARGUMENT", "v_new is NULL but k_new is given", cache, seqlens,
            q, k_new=k_new)
    refused("FLASHATTN_ERROR_INVALID_ARGUMENT", "rotary_interleaved is set but rotary_cos is NULL",
            cache, seqlens, q, rotary_interleaved=True)
    with pytest.raises(TypeError, match="cache_seqlens: a numpy array"):
        flashattn.attention_with_kvcache(q, cache.k, cache.v, [3, 15])


def test_a_read_only_cache_is_refused_when_rows_are_appended():
    cache, seqlens, k_new, v_new, q = small_case()
    k_before = cache.k.copy()
    cache.k.flags.writeable = False
    with pytest.raises(ValueError, match="k_cache: the array is read-only, but k_new is given"):
        flashattn.attention_with_kvcache(q, cache.k, cache.v, seqlens, k_new=k_new[:, :1],
                                         v_new=v_new[:, :1])
    same_bits("k", cache.k, k_before)
    assert np.isnan(cache.v[0, 3]).all()  # v's slot for the new row was not written either
    # Read, never written, without new rows: a read-only cache is fine.
    out = flashattn.attention_with_kvcache(q, cache.k, cache.v, seqlens)
    assert np.isfinite(out).all()
    with pytest.raises(ValueError, match="out: the array is read-only"):
        target = np.zeros_like(out)
        target.flags.writeable = False
        flashattn.attention_with_kvcache(q, cache.k, cache.v, seqlens, out=target)


def test_low_layer_args_struct_has_the_cache_fields():
    args = low.flashattn_args_t()
    low.flashattn_args_init(args)
    assert args.size == low.SIZEOF_ARGS
    names = ("cache_seqlens", "block_table", "k_new", "v_new", "rotary_cos", "rotary_sin")
    assert all(getattr(args, n) is None for n in names) and args.rotary_interleaved == 0
    # On LP64 every field is 8 bytes: size, options, 14 tensors, the two max lengths, and the
    # cache's six tensors and rotary_interleaved.
    assert low.SIZEOF_ARGS == (2 + 14 + 2 + 6 + 1) * 8
    args.rotary_interleaved = 1
    assert args.rotary_interleaved == 1
