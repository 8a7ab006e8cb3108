#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_api (tests/fuzz/corpus/) in the harness's input encoding.

Each seed is a short program of API calls: one opcode byte, then the operands the harness reads
for it (fuzz_api.cpp, class Harness, the op_* functions). The seeds give the fuzzer a start in
every region of the API: valid forward/backward calls in every dtype and layout, each class of
invalid view, options of every size, workspaces, buffers, contexts and the context-free calls.

    python3 tests/fuzz/make_corpus.py            # rewrites tests/fuzz/corpus/
"""
import os
import shutil
import struct
import sys

# Opcodes: the order of Harness::Op.
CTX_CREATE, CTX_DESTROY, CTX_MISC, BUF_CREATE, BUF_DESTROY, BUF_WRITE, BUF_READ, BUF_INFO, \
    VIEW_MAKE, VIEW_TWEAK, PROBLEM, OPTIONS, CALL, MISC = range(14)

FORWARD, BACKWARD, SUPPORTED, WORKSPACE_SIZE = range(4)
F32, F16, BF16 = 1, 2, 3
# Slots of the consistent problem: q k v out lse dout dq dk dv.
Q, K, V, OUT, LSE, DOUT, DQ, DK, DV = range(9)

# fuzz_i64 modes: index into the harness's kInteresting table.
INTERESTING = [0, 1, 2, 3, 7, 16, 31, 32, 33, 64, 65, 128, 255, 256, 257, 4096, 65536,
               2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**56, 2**62, 2**63 - 1, 2**63 - 2,
               -1, -2, -2**31, -2**63, -2**63 + 1]
DIMS = [16, 31, 32, 33, 64, 80, 96, 128, 160, 192, 255, 256]


def u8(v):
    return bytes([v & 0xff])


def u16(v):
    return struct.pack('<H', v & 0xffff)


def u32(v):
    return struct.pack('<I', v & 0xffffffff)


def u64(v):
    return struct.pack('<Q', v & 0xffffffffffffffff)


def i64(v):
    """Operand bytes for fuzz_i64 that decode to v."""
    if 1 <= v <= 16:
        return u8(0) + u8(v - 1)
    if v in INTERESTING:
        return u8(4) + u8(INTERESTING.index(v))
    if -16 <= v <= 0:
        return u8(7) + u8(-v)
    return u8(6) + u64(v)


def i32_sel(index):
    """fuzz_i32 picking entry `index` of the harness's table."""
    return u8(index)


def i32_raw(v):
    return u8(255) + u32(v)


def ctx_create(slot=0, backend=0, device=0, null_out=False, raw_backend=None, raw_device=None):
    mode = backend | (device << 2) | (16 if null_out else 0)
    out = u8(CTX_CREATE) + u8(slot) + u8(mode)
    if backend == 3:
        out += u32(raw_backend)
    if device == 3:
        out += u32(raw_device)
    return out


def ctx_destroy(slot=0):
    return u8(CTX_DESTROY) + u8(slot)


def ctx_misc(slot, what, null_out=False, extra=b''):
    return u8(CTX_MISC) + u8(slot) + u8(what | (0x80 if null_out else 0)) + extra


def buf_create(slot, ctx, size_mode, operand=b''):
    return u8(BUF_CREATE) + u8(slot) + u8(ctx) + u8(size_mode) + operand


def buf_destroy(slot):
    return u8(BUF_DESTROY) + u8(slot)


def buf_copy(write, slot, offset_mode, bytes_mode, fill=0x41, null_host=False, extra=b''):
    mode = 0 if null_host else 1
    return u8(BUF_WRITE if write else BUF_READ) + u8(slot) + u8(mode) + u8(offset_mode) + extra + \
        u8(bytes_mode) + u8(fill)


def buf_info(slot, size=True, null_out=False):
    return u8(BUF_INFO) + u8(slot) + u8((1 if size else 0) | (2 if null_out else 0))


def problem(ctx=0, batch=2, nq=64, nk=48, hkv=2, group=2, d=32, dtype=F32, layout=0, seed=1):
    if d <= 64:
        dsel = d - 1
    else:
        dsel = 132 + DIMS.index(d)
    return u8(PROBLEM) + u8(ctx) + u8(batch - 1) + u8(nq - 1) + u8(nk - 1) + u8(hkv - 1) + \
        u8(group - 1) + u8(dsel) + u8(dtype - 1) + u8(layout) + u32(seed)


FLAG_INDEX = {0: 0, 1: 1, 2: 4, -1: 5, 5: 6, 7: 7}


def options(size=None, scale_index=None, causal=None, algorithm=None, deterministic=None,
            tail=None):
    """size None: sizeof; an int 0..88 exactly; ('table', i) or ('raw', v) otherwise."""
    out = u8(OPTIONS)
    if size is None:
        out += u8(0)
    elif isinstance(size, int):
        out += u8(3) + u8(size)
    elif size[0] == 'table':
        out += u8(5) + u8(size[1])
    else:
        out += u8(6) + u64(size[1])
    fields = 0
    operands = b''
    if scale_index is not None:
        fields |= 1
        operands += u8(scale_index)
    for bit, value in ((2, causal), (4, algorithm), (8, deterministic)):
        if value is not None:
            fields |= bit
            operands += i32_sel(FLAG_INDEX[value]) if value in FLAG_INDEX else i32_raw(value)
    if tail == 'one':
        fields |= 0x10
    elif tail == 'all':
        fields |= 0x30
    out += u8(fields) + operands
    if tail == 'one':
        out += u16(0) + u8(0x80)
    return out


def call(fn, ctx=0, slots=None, opts=True, backward_flag=0, ws_mode=0, ws_operands=b''):
    out = u8(CALL) + u8(fn) + u8(ctx)
    if slots is None:
        out += u8(0)
    else:
        out += u8(3) + b''.join(u8(s) for s in slots)
    out += u8(1 if opts else 0) + u8({0: 0, 1: 1, 2: 4, -1: 5}[backward_flag]) + u8(ws_mode)
    return out + ws_operands


def tweak(slot, field, operands):
    return u8(VIEW_TWEAK) + u8(slot) + u8(field) + operands


def shape(slot, dim, value):
    return tweak(slot, 0, u8(dim) + i64(value))


def stride(slot, dim, value):
    return tweak(slot, 1, u8(dim) + i64(value))


def dtype(slot, value_sel):
    return tweak(slot, 2, u8(value_sel))


def rank(slot, rank_sel, operand=b''):
    return tweak(slot, 3, u8(rank_sel) + operand)


def alias(slot, other):
    return tweak(slot, 4, u8(other))


def nudge(slot, delta, odd=True):
    return tweak(slot, 5, u8(delta & 0xff) + u8(0 if odd else 1))


def view_make(slot, shape4, dtype_sel=0, rank_sel=0, data=b''):
    """A view with contiguous strides; `data` are fuzz_data's operands."""
    return u8(VIEW_MAKE) + u8(slot) + u8(dtype_sel) + u8(rank_sel) + b''.join(i64(x) for x in shape4) + \
        u8(0) + data


def in_buffer(slot, offset_mode=0, operand=b''):
    return u8(2) + u8(slot) + u8(offset_mode) + operand


def misc(sel, operands=b''):
    return u8(MISC) + u8(sel) + operands


KV_CACHE_OP = 0xFF  # Harness::kKvCacheOpByte: op_kv_cache, a self-contained KV cache call


def kv_cache(bf16=0, batch=2, nq=1, hkv=1, group=2, d_sel=0, paged=0, page=16, per_seq=2,
             pages=4, capacity=30, n_new=0, rotary=0, rotary_half=4, positions=50, interleaved=0,
             causal=1, lens=(5, 9), table=(0, 1, 2, 3)):
    """op_kv_cache's operands in its read order (each a byte: sizes as the harness reduces
    them, 1 + x % n, so pass x = size - 1)."""
    b = u8(KV_CACHE_OP) + u8(bf16) + u8(batch - 1) + u8(nq - 1) + u8(hkv - 1) + u8(group - 1) + \
        u8(d_sel) + u8(paged) + u8(page - 1) + u8(per_seq - 1) + u8(pages - 1)
    if not paged:
        b += u8(capacity - 1)
    b += u8(n_new) + u8(rotary) + u8(rotary_half - 1) + u8(positions - 1) + u8(interleaved) + \
        u8(causal)
    # A length (a table entry) of the harness's range is one byte, taken modulo; any other
    # value a marker byte then its 32 bits.
    b += b''.join(u8(x) if 0 <= x < 200 else u8(250) + u32(x) for x in lens)
    b += b''.join(u8(x) if 0 <= x < 220 else u8(250) + u32(x) for x in table)
    return b


CP_OP = 0xFE  # Harness::kCpOpByte: op_cp, a self-contained context-parallel call


def cp(bf16=0, batch=1, hkv=1, group=2, d_sel=0, dv_sel=1, ranks=3, rank=1, zigzag=1, n_sel=3,
       causal=1, window=0, left=-1, right=-1, softcap=0, sinks=0, backward=1):
    """op_cp's operands in its read order (sizes as the harness reduces them: pass size - 1;
    n_sel: the shard holds 2 (n_sel + 1) tokens with zigzag, n_sel + 1 without; window sides
    -1 .. 9)."""
    return (u8(CP_OP) + u8(bf16) + u8(batch - 1) + u8(hkv - 1) + u8(group - 1) + u8(d_sel) +
            u8(dv_sel) + u8(ranks - 1) + u8(rank) + u8(zigzag) + u8(n_sel) + u8(causal) +
            u8(window) + u8(left + 1) + u8(right + 1) + u8(softcap) + u8(sinks) + u8(backward))


def fwd_bwd(**kw):
    return problem(**kw) + call(FORWARD) + call(BACKWARD)


SEEDS = {
    # Valid calls: dtypes, shapes, options, layouts.
    'fwd_f32': problem() + call(FORWARD),
    'fwd_bwd_f32': fwd_bwd(),
    'fwd_bwd_f16': fwd_bwd(dtype=F16, seed=2),
    'fwd_bwd_bf16': fwd_bwd(dtype=BF16, seed=3),
    'fwd_bwd_causal': options(causal=1) + fwd_bwd(nq=33, nk=70),
    'fwd_bwd_causal_nq_gt_nk': options(causal=1) + fwd_bwd(nq=70, nk=9, d=16),
    'fwd_bwd_standard': options(algorithm=1) + fwd_bwd(d=33, dtype=F16),
    'fwd_bwd_deterministic': options(deterministic=1, causal=1) + fwd_bwd(dtype=BF16),
    'fwd_scales': options(scale_index=2) + problem() + call(FORWARD) +
                  options(scale_index=5) + call(FORWARD) + options(scale_index=7) + call(FORWARD),
    'layout_packed': fwd_bwd(layout=1, d=64, nq=20, nk=20),
    'layout_qkv_interleaved': fwd_bwd(layout=2, hkv=3, group=1, nq=17, nk=17, d=16),
    'layout_bhsd': fwd_bwd(layout=3, dtype=F16, d=96, nq=9, nk=12, batch=1),
    'layout_broadcast_kv': fwd_bwd(layout=4, nq=5, nk=31),
    'layout_padded_rows': fwd_bwd(layout=5, dtype=BF16, d=31),
    'head_dims': b''.join(problem(d=d, nq=3, nk=5, batch=1, hkv=1, group=1) + call(FORWARD)
                          for d in (1, 7, 64, 128, 192, 256)),
    'mqa_gqa': fwd_bwd(hkv=1, group=3, nq=11, nk=13) + fwd_bwd(hkv=3, group=3, nq=2, nk=2, d=8),
    'no_lse_forward': problem() + call(FORWARD, slots=[Q, K, V, OUT, 12, DOUT, DQ, DK, DV]),
    'options_null': problem() + call(FORWARD, opts=False) + call(BACKWARD, opts=False),
    # Workspaces: query, exact, one short, inside a buffer, NULL with a size.
    'workspace_exact': problem() + call(WORKSPACE_SIZE) + call(FORWARD, ws_mode=6, ws_operands=u8(0)) +
                       call(WORKSPACE_SIZE, backward_flag=1) +
                       call(BACKWARD, ws_mode=6, ws_operands=u8(0)),
    'workspace_short': options(algorithm=1) + problem() + call(WORKSPACE_SIZE) +
                       call(FORWARD, ws_mode=6, ws_operands=u8(1)),
    'workspace_in_buffer': problem() + buf_create(10, 0, 0, u16(60000)) +
                           call(FORWARD, ws_mode=7, ws_operands=u8(2) + u8(10) + u8(0) + u8(0)),
    'workspace_overlaps_output': problem() +
                                 call(FORWARD, ws_mode=7, ws_operands=u8(2) + u8(OUT) + u8(0) + u8(0)),
    'workspace_null_sized': problem() + call(FORWARD, ws_mode=5, ws_operands=u16(100)),
    'supported_and_sizes': problem(dtype=F16) + call(SUPPORTED) + call(SUPPORTED, backward_flag=1) +
                           call(SUPPORTED, backward_flag=-1) + call(WORKSPACE_SIZE, backward_flag=2) +
                           call(WORKSPACE_SIZE, ws_mode=4),
    # Invalid views: each class once, on a valid problem.
    'bad_negative_stride': problem() + stride(Q, 0, -1) + call(FORWARD),
    'bad_last_stride': problem() + stride(K, 3, 2) + call(FORWARD),
    'bad_extent_overflow': problem() + shape(Q, 1, 2**31 - 1) + stride(Q, 1, 2**40) + call(FORWARD) +
                           call(SUPPORTED),
    'bad_extent_2p56': problem() + stride(V, 0, 2**56) + call(WORKSPACE_SIZE),
    'bad_huge_broadcast': problem() + shape(K, 1, 2**31 - 1) + stride(K, 1, 0) +
                          shape(V, 1, 2**31 - 1) + stride(V, 1, 0) + call(WORKSPACE_SIZE) +
                          call(FORWARD),
    'bad_output_overlap': problem() + stride(OUT, 1, 0) + call(FORWARD) + stride(DK, 2, 16) +
                          call(BACKWARD),
    'bad_alias': problem() + alias(OUT, Q) + call(FORWARD) + problem() + alias(DQ, DOUT) +
                 call(BACKWARD),
    'bad_misaligned': problem() + nudge(Q, 1) + call(FORWARD) + problem(dtype=F16) + nudge(V, 2, False) +
                      call(FORWARD),
    'bad_past_buffer': problem(nq=16, nk=16) + stride(Q, 0, 16 * 4 * 32 + 1) + call(FORWARD) +
                       problem() + nudge(LSE, 8, False) + call(FORWARD),
    'bad_dtypes': problem() + dtype(K, 3) + call(FORWARD) + dtype(K, 6) + u8(1) + call(SUPPORTED) +
                  dtype(LSE, 3) + call(FORWARD),
    'bad_ranks': problem() + rank(Q, 5) + call(FORWARD) + rank(Q, 6, u8(6)) + call(SUPPORTED),
    'bad_shapes': problem() + shape(K, 0, 0) + call(FORWARD) + problem() + shape(Q, 2, 3) +
                  call(SUPPORTED) + problem() + shape(Q, 3, 257) + shape(K, 3, 257) + shape(V, 3, 257) +
                  call(WORKSPACE_SIZE) + problem() + shape(LSE, 2, 63) + call(BACKWARD),
    'bad_null_views': problem() + call(FORWARD, slots=[12, K, V, OUT, LSE, DOUT, DQ, DK, DV]) +
                      call(BACKWARD, slots=[Q, K, V, OUT, 12, DOUT, DQ, DK, DV]) +
                      call(FORWARD, ctx=4),
    'bad_lse_strides': problem() + stride(LSE, 0, 0) + call(FORWARD) + stride(LSE, 2, -1) + call(FORWARD),
    # Options of every kind of size and value.
    'options_sizes': problem(nq=4, nk=4) + b''.join(options(size=s) + call(SUPPORTED)
                                                    for s in (0, 7, 8, 12, 16, 23, 24, 25, 88)) +
                     b''.join(options(size=('table', i)) + call(SUPPORTED) for i in (15, 16, 17, 19)),
    'options_tails': problem(nq=4, nk=4) + options(size=32, tail='one') + call(FORWARD) +
                     options(size=88, tail='all') + call(SUPPORTED) + options(size=88) + call(FORWARD),
    'options_values': problem(nq=4, nk=4) + options(scale_index=9) + call(FORWARD) +
                      options(scale_index=10) + call(SUPPORTED) + options(causal=2) + call(FORWARD) +
                      options(algorithm=7) + call(FORWARD) + options(deterministic=5) + call(BACKWARD) +
                      options(algorithm=-2**31) + call(WORKSPACE_SIZE),
    # Buffers and contexts.
    'buffers_edges': ctx_create() + buf_create(0, 0, 0, u16(1000)) +
                     buf_copy(True, 0, 0, 2) + buf_copy(False, 0, 2, 0) + buf_copy(True, 0, 1, 2) +
                     buf_copy(False, 0, 6, 1) + buf_copy(True, 0, 7, 2) + buf_copy(True, 0, 0, 0, null_host=True) +
                     buf_info(0) + buf_info(0, size=False) + buf_info(0, null_out=True) + buf_info(12) +
                     buf_destroy(0) + buf_destroy(12),
    'buffers_absurd': ctx_create() + b''.join(buf_create(1, 0, 13, u8(i)) for i in range(8)) +
                      buf_create(1, 0, 12) + buf_create(1, 4, 0, u16(10)),
    'contexts': ctx_create(0, 2) + ctx_create(1, 1) + ctx_create(2, 3, raw_backend=7) +
                ctx_create(2, 0, 2) + ctx_create(3, 0, null_out=True) + ctx_create(3, 2, 3, raw_device=99) +
                ctx_misc(1, 0) + ctx_misc(1, 1) + ctx_misc(1, 2) + ctx_misc(1, 3) + ctx_misc(1, 4, extra=u8(0)) +
                ctx_misc(1, 5) + ctx_misc(4, 0) + ctx_misc(1, 0, null_out=True) + ctx_destroy(1) +
                ctx_destroy(4),
    'context_destroyed_before_buffers': problem() + ctx_destroy(0) + buf_copy(True, 0, 0, 2) +
                                        buf_copy(False, 3, 5, 5) + ctx_create(0) + call(FORWARD),
    'threads': problem(nq=30, nk=30) + ctx_misc(0, 6, extra=i32_sel(2)) + call(FORWARD) +
               ctx_misc(0, 6, extra=i32_sel(1)) + call(BACKWARD) + ctx_misc(0, 6, extra=i32_sel(5)) +
               ctx_misc(0, 6, extra=i32_sel(8)) + call(FORWARD) + call(WORKSPACE_SIZE) +
               ctx_misc(0, 6, extra=i32_sel(0)) + call(FORWARD),
    'two_contexts': problem(ctx=0) + ctx_create(1) + call(FORWARD, ctx=1) + call(BACKWARD, ctx=1),
    # Context-free calls.
    'misc': b''.join(misc(0, i32_sel(i)) for i in range(21)) + misc(0, i32_raw(12345)) +
            problem() + stride(Q, 0, -1) + call(FORWARD) + misc(1, u8(0) + u8(0)) + misc(1, u8(0) + u8(1)) +
            misc(1, u8(1) + u8(0)) + misc(1, u8(2) + u8(0)) + misc(1, u8(3) + u8(0)) +
            misc(1, u8(4) + u8(7) + u8(0)) + misc(2, u8(9)) + misc(3) +
            misc(4, u8(0)) + misc(4, u8(1)) + misc(5, u8(0)) + misc(5, u8(1)),
    'tensor_constructors': misc(6, u8(0) + u8(0) + u8(1) + i64(2) + i64(64) + i64(4) + i64(32) + u8(0) + u8(0)) +
                           misc(6, u8(0) + u8(1) + u8(1) + i64(2**31) + i64(2**32) + i64(2**32) + i64(7) +
                                u8(0) + u8(0)) +
                           misc(6, u8(1) + u8(2) + u8(1) + i64(0) + i64(4) + i64(4) + i64(4) + u8(0) + u8(0)) +
                           misc(6, u8(1) + u8(3) + u8(1) + i64(2**62) + i64(4) + i64(1) + i64(1) + u8(0) + u8(0)),
    # The KV cache call (op_kv_cache): valid contiguous, paged with rows appended and rotary,
    # then an entry outside the pages, a length past the cache, two sequences on one row.
    'kv_cache': kv_cache() +
                kv_cache(bf16=1, paged=1, page=4, per_seq=3, pages=8, n_new=2, rotary=1,
                         lens=(3, 10), table=(0, 1, 2, 3, 4, 5)) +
                kv_cache(paged=1, page=4, per_seq=3, pages=6, lens=(9, 2), table=(0, 1, 5, 2, 3, 4)) +
                kv_cache(paged=1, page=4, per_seq=2, pages=6, lens=(3, 2), table=(0, -1, -1, 2)) +
                kv_cache(n_new=3, capacity=10, lens=(8, 1)) + kv_cache(lens=(-7, 2)) +
                kv_cache(paged=1, page=4, per_seq=2, pages=4, n_new=1, lens=(1, 1),
                         table=(0, 1, 0, 2)),
    # Context parallelism (op_cp): causal zigzag, unmasked contiguous with sinks and GQA (its
    # gradients checked), a window, bf16 with softcap, one rank.
    'cp': cp() + cp(zigzag=0, causal=0, sinks=1, hkv=2, group=2, n_sel=10, ranks=4, rank=3) +
          cp(window=1, left=4, right=2, causal=0, ranks=2, rank=0) +
          cp(bf16=1, softcap=1, d_sel=1, dv_sel=0, batch=2) + cp(ranks=1, rank=0, zigzag=0),
    'views_from_scratch': ctx_create() + buf_create(0, 0, 0, u16(8191)) +
                          view_make(0, (1, 4, 2, 8), data=in_buffer(0)) +
                          view_make(1, (1, 4, 1, 8), data=in_buffer(0, 2, u16(2048))) +
                          view_make(2, (1, 4, 1, 8), data=in_buffer(0, 3, u16(1024))) +
                          view_make(3, (1, 4, 2, 8), data=in_buffer(0, 2, u16(3000))) +
                          call(FORWARD, slots=[0, 1, 2, 3, 12, 5, 6, 7, 8]) +
                          call(FORWARD, slots=[0, 1, 1, 3, 12, 5, 6, 7, 8]) +
                          view_make(4, (1, 2, 4, 0), rank_sel=5, data=in_buffer(0, 2, u16(2000))) +
                          call(FORWARD, slots=[0, 1, 2, 3, 4, 5, 6, 7, 8]),
}


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'corpus')
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    total = 0
    for name, data in sorted(SEEDS.items()):
        with open(os.path.join(out_dir, name), 'wb') as f:
            f.write(data)
        total += len(data)
    print(f'{len(SEEDS)} seeds, {total} bytes, in {out_dir}', file=sys.stderr)


if __name__ == '__main__':
    main()
