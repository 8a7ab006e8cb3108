"""Every case of the bad-input catalogue (tests/catalogue/bad_inputs.tsv, format in
tests/catalogue/FORMAT.md) run through the low layer, flashattn.flashattn_swig: the call raises
flashattn.Error with the expected status and a message holding the expected fragment, and no
buffer changes (outputs are poisoned beforehand; a KV cache call's k and v, written as well as
read when k_new is given, are compared like every other buffer). FLASHATTN_CATALOGUE names
another file.

The low layer returns workspace_size's `out` instead of taking it, so the C runner's sentinel
check has no counterpart here: a failing call returns nothing."""
import math
import os
from pathlib import Path

import numpy as np
import pytest

from flashattn import flashattn_swig as low

REPO = Path(__file__).resolve().parents[3]
CATALOGUE = Path(os.environ.get("FLASHATTN_CATALOGUE") or REPO / "tests" / "catalogue" / "bad_inputs.tsv")

B, NQ, NK, HQ, HKV, D = 2, 64, 48, 4, 2, 32
SHAPES = {
    "q": (B, NQ, HQ, D), "k": (B, NK, HKV, D), "v": (B, NK, HKV, D), "out": (B, NQ, HQ, D),
    "lse": (B, HQ, NQ), "dout": (B, NQ, HQ, D), "dq": (B, NQ, HQ, D), "dk": (B, NK, HKV, D),
    "dv": (B, NK, HKV, D),
}
# The variant tensors of the _ex ops ([heads_q] float32, [batch + 1] int32): name -> (shape,
# dtype, buffer bytes, contents).
OFFSETS = {"cu_seqlens_q": (0, NQ, 2 * NQ), "cu_seqlens_k": (0, NK, 2 * NK)}
VARIANT_TENSORS = {
    "alibi_slopes": ((HQ,), "float32", B * HQ * 4),  # room for [batch, heads_q]
    "sinks": ((HQ,), "float32", HQ * 4),
    "dsinks": ((HQ,), "float32", HQ * 4),
    "cu_seqlens_q": ((B + 1,), "int32", (B + 1) * 4),
    "cu_seqlens_k": ((B + 1,), "int32", (B + 1) * 4),
}
# The KV cache tensors of the _ex ops, created after the variant tensors (FORMAT.md): name ->
# (shape, strides, dtype, contents of an int32 tensor). Each buffer holds exactly its view.
NQ_CACHE, N_NEW, PAGE_SIZE = 4, 4, 16  # query rows and appended rows of the cache form; rows a page
PAGES = NK // PAGE_SIZE  # pages per sequence: capacity 3 x 16 = 48 = NK tokens
CACHE_SEQLENS = (40, 44)
ROTARY_HALF = D // 2
KV_TENSORS = {
    "cache_seqlens": ((B,), (1,), "int32", CACHE_SEQLENS),
    "block_table": ((B, PAGES), (PAGES, 1), "int32", tuple(range(B * PAGES))),
    "k_new": ((B, N_NEW, HKV, D), (N_NEW * HKV * D, HKV * D, D, 1), "float32", None),
    "v_new": ((B, N_NEW, HKV, D), (N_NEW * HKV * D, HKV * D, D, 1), "float32", None),
    "rotary_cos": ((NK, ROTARY_HALF), (ROTARY_HALF, 1), "float32", None),
    "rotary_sin": ((NK, ROTARY_HALF), (ROTARY_HALF, 1), "float32", None),
}
# The rows appended hold a value of their own: a refused call that wrote them anyway would show
# in k and v, which already hold the inputs' 0.5.
NEW_ROWS_VALUE = 0.25
OUTPUTS = {"forward": ("out", "lse"), "backward": ("dq", "dk", "dv"), "supported": (),
           "workspace_size": (), "forward_ex": ("out", "lse"),
           "backward_ex": ("dq", "dk", "dv", "dsinks"), "supported_ex": (),
           "workspace_size_ex": (), "merge": ("out", "lse"), "cp_forward": ("out", "lse"),
           "cp_backward": ("dq", "dk", "dv", "dsinks"), "cp_workspace_size": ()}
# The merge's parts (FORMAT.md): three parts of out's and lse's shapes in buffers of their own,
# part 0's view; name -> (shape of part 0, buffer bytes).
PARTS = 3
MERGE_TENSORS = {"parts_out": (SHAPES["out"], PARTS * B * NQ * HQ * D * 4),
                 "parts_lse": (SHAPES["lse"], PARTS * B * HQ * NQ * 4)}
ARGS_FIELDS = ("q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv", "alibi_slopes", "sinks",
               "dsinks", "cu_seqlens_q", "cu_seqlens_k") + tuple(KV_TENSORS)
POISON = 0xA5
OPTIONS_BLOCK = 4096
INT32 = (-(1 << 31), (1 << 31) - 1)


class Case:
    def __init__(self, line, fields):
        self.line = line
        self.id, self.op, self.mutations, self.status, self.fragment = fields


def load(path):
    """The cases of the catalogue; a malformed line fails the whole run, loudly."""
    cases = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.rstrip("\r")
        if not line or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 5:
            raise ValueError("%s:%d: 5 tab-separated fields expected, got %d" % (path, n, len(fields)))
        case = Case(n, fields)
        if case.op not in OUTPUTS:
            raise ValueError("%s:%d: unknown op %r" % (path, n, case.op))
        cases.append(case)
    if not cases:
        raise ValueError("%s: no cases" % path)
    return cases


CASES = load(CATALOGUE)
STATUSES = {low.flashattn_status_string(c): c for c in range(1000)}
STATUSES.pop("FLASHATTN_UNKNOWN_STATUS", None)


def _int32(value, what):
    if not INT32[0] <= value <= INT32[1]:
        raise ValueError("%s=%d does not fit the 32-bit field" % (what, value))
    return value


def _float(text):
    """The binary32 value of a float field: the literal rounded to float32, as C's strtof does."""
    special = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
    return special[text] if text in special else float(np.float32(text))


class Call:
    """The baseline call of the format, built through the low layer."""

    def __init__(self, op):
        self.op = op
        self.ctx = low.flashattn_context_create(low.FLASHATTN_BACKEND_CPU, 0)
        self.call_ctx = self.ctx
        self.buffers, self.views, self.passed, self.contents = {}, {}, {}, {}
        self.ends = {}
        # The variant tensors' buffers, then the KV cache's, exist for the _ex ops only
        # (FORMAT.md).
        variant_names = (list(VARIANT_TENSORS) + list(KV_TENSORS)
                         if op.endswith("_ex") or op.startswith("cp_") else [])
        # And the merge's parts for the merge only, after the nine.
        parts_names = list(MERGE_TENSORS) if op == "merge" else []
        for name in list(SHAPES) + variant_names + parts_names:
            if name in VARIANT_TENSORS:
                nbytes = VARIANT_TENSORS[name][2]
            elif name in KV_TENSORS:
                nbytes = int(np.prod(KV_TENSORS[name][0])) * 4
            elif name in MERGE_TENSORS:
                nbytes = MERGE_TENSORS[name][1]
            else:
                nbytes = int(np.prod(SHAPES[name])) * 4
            buf = low.flashattn_buffer_create(self.ctx, nbytes)
            self.buffers[name] = buf
            self.ends[name] = low.flashattn_buffer_data(buf) + nbytes
            if name in OUTPUTS[op]:
                data = np.full(nbytes, POISON, dtype=np.uint8)
            elif name in OFFSETS:
                data = np.array(OFFSETS[name], dtype=np.int32).view(np.uint8)
            elif name in KV_TENSORS and KV_TENSORS[name][3] is not None:
                data = np.array(KV_TENSORS[name][3], dtype=np.int32).view(np.uint8)
            elif name in ("k_new", "v_new"):
                data = np.full(nbytes // 4, NEW_ROWS_VALUE, dtype=np.float32).view(np.uint8)
            else:
                data = np.full(nbytes // 4, 0.5, dtype=np.float32).view(np.uint8)
            low.flashattn_buffer_write(buf, 0, data)
            self.contents[name] = data
            t = low.flashattn_tensor_t()
            address = low.flashattn_buffer_data(buf)
            if name in ("lse", "parts_lse"):
                low.flashattn_tensor_lse(t, address, B, HQ, NQ)
            elif name in VARIANT_TENSORS:
                shape, dtype, _ = VARIANT_TENSORS[name]
                t.data = address
                t.dtype = low.FLASHATTN_DTYPE_INT32 if dtype == "int32" else low.FLASHATTN_DTYPE_FLOAT32
                t.rank = 1
                t.shape = (shape[0], 0, 0, 0)
                t.strides = (1, 0, 0, 0)
            elif name in KV_TENSORS:
                shape, strides, dtype, _ = KV_TENSORS[name]
                pad = (0,) * (low.FLASHATTN_MAX_RANK - len(shape))
                t.data = address
                t.dtype = low.FLASHATTN_DTYPE_INT32 if dtype == "int32" else low.FLASHATTN_DTYPE_FLOAT32
                t.rank = len(shape)
                t.shape = shape + pad
                t.strides = strides + pad
            else:
                shape = MERGE_TENSORS[name][0] if name in MERGE_TENSORS else SHAPES[name]
                low.flashattn_tensor_4d(t, address, low.FLASHATTN_DTYPE_FLOAT32, *shape)
            self.views[name] = t
            self.passed[name] = None if name in VARIANT_TENSORS or name in KV_TENSORS else t
        self.args = low.flashattn_args_t()
        low.flashattn_args_init(self.args)
        self.merge_args = low.flashattn_merge_args_t()
        low.flashattn_merge_args_init(self.merge_args)
        self.merge_args.num_parts = PARTS
        self.merge_args.parts_out_stride = B * NQ * HQ * D
        self.merge_args.parts_lse_stride = B * HQ * NQ
        self.pass_args = True
        self.cp = low.flashattn_cp_args_t()
        low.flashattn_cp_args_init(self.cp)
        self.pass_cp = True
        self.comm_stand_in = np.zeros(8, dtype=np.uint8)  # cp.nccl_comm=set: no communicator
        if op.startswith("cp_"):
            self._make_self_attention()
        # The options sit at the start of a zero-filled block, so sizes up to 4096 read zeros.
        self.options_block = np.zeros(OPTIONS_BLOCK, dtype=np.uint8)
        self.options = low.options_at(self.options_block.ctypes.data)
        low.flashattn_options_init(self.options)
        self.options_sizeof = self.options.size
        self.pass_options = True
        self.workspace_memory = None
        self.workspace, self.workspace_size = None, 0
        self.backward_flag = 0

    def mutate(self, text):
        key, _, value = text.partition("=")
        if not _:
            raise ValueError("mutation %r has no '='" % text)
        if key == "ctx" and value == "null":
            self.call_ctx = None
        elif key == "ctx" and value == "destroyed":
            stale = low.flashattn_context_create(low.FLASHATTN_BACKEND_CPU, 0)
            low.flashattn_context_destroy(stale)
            self.call_ctx = stale
        elif key == "options" and value == "null":
            self.pass_options = False
        elif key.startswith("options."):
            self._mutate_options(key[len("options."):], value)
        elif key == "workspace":
            n = int(value)
            self.workspace_memory = np.zeros(max(n, 1), dtype=np.uint8)
            self.workspace, self.workspace_size = self.workspace_memory.ctypes.data, n
        elif key == "workspace_size":
            self.workspace_size = int(value)
        elif key == "backward":
            self.backward_flag = int(value)
        elif key == "args" and value == "null":
            self.pass_args = False
        elif key == "cp" and value == "null":
            self.pass_cp = False
        elif key == "cp.size":
            self.cp.size = int(value) & ((1 << 64) - 1)
        elif key in ("cp.ranks", "cp.rank", "cp.layout"):
            setattr(self.cp, key[len("cp."):], int(value))
        elif key == "cp.nccl_comm" and value == "set":
            self.cp.nccl_comm = self.comm_stand_in.ctypes.data
        elif key == "args.size":
            struct = self.merge_args if self.op == "merge" else self.args
            struct.size = int(value) & ((1 << 64) - 1)
        elif key in ("args.num_parts", "args.parts_out_stride", "args.parts_lse_stride"):
            if self.op != "merge":
                raise ValueError("%s belongs to the merge op" % key)
            setattr(self.merge_args, key[len("args."):], int(value))
        elif key in ("args.max_seqlen_q", "args.max_seqlen_k", "args.rotary_interleaved"):
            setattr(self.args, key[len("args."):], int(value))
        elif key == "varlen" and value == "1":
            self._make_varlen()
        elif key == "cache" and value == "1":
            self._make_cache()
        elif key == "paged" and value == "1":
            self._make_paged()
        elif (key in VARIANT_TENSORS or key in KV_TENSORS) and key not in self.views:
            raise ValueError("%s: a variant tensor needs an _ex op" % key)
        elif key in self.views and value == "null":
            self.passed[key] = None
        elif key in self.views and value == "given":
            self.passed[key] = self.views[key]
        else:
            self._mutate_view(key, value)

    def _mutate_options(self, field, value):
        o = self.options
        if field == "size":
            o.size = int(value) & ((1 << 64) - 1)
        elif field == "softmax_scale":
            o.softmax_scale = _float(value)
        elif field == "num_splits":
            o.num_splits = int(value)
        elif field in ("causal", "algorithm", "deterministic", "window", "window_left",
                       "window_right"):
            setattr(o, field, _int32(int(value), "options." + field))
        elif field == "softcap":
            o.softcap = _float(value)
        elif field == "tail":
            end = min(o.size, OPTIONS_BLOCK)
            self.options_block[self.options_sizeof:end] = int(value)
        else:
            raise ValueError("unknown options field %r" % field)

    def _mutate_view(self, key, value):
        name, _, field = key.partition(".")
        if name not in self.views:
            raise ValueError("unknown tensor %r" % name)
        t = self.views[name]
        if field in ("dtype", "rank"):
            setattr(t, field, _int32(int(value), key))
        elif field.startswith(("shape[", "strides[")) and field.endswith("]"):
            attr, index = field[:-1].split("[")
            values = list(getattr(t, attr))
            values[int(index)] = int(value)
            setattr(t, attr, values)
        elif field.startswith("values[") and field.endswith("]"):
            index = int(field[len("values["):-1])
            element = np.array([_int32(int(value), key)], dtype=np.int32).view(np.uint8)
            low.flashattn_buffer_write(self.buffers[name], 4 * index, element)
            self.contents[name][4 * index:4 * index + 4] = element
        elif field == "data":
            if value == "null":
                t.data = None
            elif value == "misalign":
                t.data = t.data + 1
            elif value.startswith("alias:"):
                t.data = self.views[value[len("alias:"):]].data
            elif value.startswith("end+"):
                past = int(value[len("end+"):])
                if not 0 <= past <= 255:
                    raise ValueError("end+ takes 0..255, not %d" % past)
                t.data = self.ends[name] + past
            else:
                raise ValueError("unknown data mutation %r" % value)
        else:
            raise ValueError("unknown mutation %r" % key)

    def _make_varlen(self):
        """The variable-length form of the baseline (FORMAT.md)."""
        for name in ("q", "out", "dout", "dq", "k", "v", "dk", "dv"):
            rows, heads = (B * NK, HKV) if name in ("k", "v", "dk", "dv") else (B * NQ, HQ)
            t = self.views[name]
            t.rank = 3
            t.shape = (rows, heads, D, 0)
            t.strides = (heads * D, D, 1, 0)
        lse = self.views["lse"]
        lse.rank = 2
        lse.shape = (HQ, B * NQ, 0, 0)
        lse.strides = (B * NQ, 1, 0, 0)
        for name in OFFSETS:
            if name in self.views:
                self.passed[name] = self.views[name]
        self.args.max_seqlen_q, self.args.max_seqlen_k = NQ, NK

    def _make_self_attention(self):
        """The cp ops' baseline (FORMAT.md): q, out, dout and dq hold NK tokens, like k, over the
        start of their buffers; lse [B, HQ, NK]."""
        for name in ("q", "out", "dout", "dq"):
            self._set_dims(name, {1: NK}, {0: NK * HQ * D})
        self._set_dims("lse", {2: NK}, {0: HQ * NK, 1: NK})

    def _make_cache(self):
        """The KV cache form of the baseline (FORMAT.md): four query rows per sequence,
        contiguous over the start of q's and out's buffers (and lse [B, HQ, 4]); k and v, as they
        are, a contiguous cache of NK tokens; cache_seqlens given."""
        for name in ("q", "out"):
            self._set_dims(name, {1: NQ_CACHE}, {0: NQ_CACHE * HQ * D})
        self._set_dims("lse", {2: NQ_CACHE}, {0: HQ * NQ_CACHE, 1: NQ_CACHE})
        if "cache_seqlens" in self.views:
            self.passed["cache_seqlens"] = self.views["cache_seqlens"]

    def _make_paged(self):
        """The paged form of the cache: k and v as B * PAGES pages of PAGE_SIZE rows over the
        same buffers; the block table given."""
        for name in ("k", "v"):
            self._set_dims(name, {0: B * PAGES, 1: PAGE_SIZE}, {0: PAGE_SIZE * HKV * D})
        if "block_table" in self.views:
            self.passed["block_table"] = self.views["block_table"]

    def _set_dims(self, name, shape, strides):
        """Sets some sizes and strides of a view ({index: value}), the rest as they are."""
        t = self.views[name]
        new_shape, new_strides = list(t.shape), list(t.strides)
        for i, n in shape.items():
            new_shape[i] = n
        for i, n in strides.items():
            new_strides[i] = n
        t.shape, t.strides = new_shape, new_strides

    def _args(self):
        if not self.pass_args:
            return None
        self.args.options = self.options if self.pass_options else None
        for name in ARGS_FIELDS:
            setattr(self.args, name, self.passed.get(name))
        return self.args

    def _cp(self):
        return self.cp if self.pass_cp else None

    def _merge_args(self):
        if not self.pass_args:
            return None
        m = self.merge_args
        m.parts_out, m.parts_lse = self.passed["parts_out"], self.passed["parts_lse"]
        m.out, m.lse = self.passed["out"], self.passed["lse"]
        return m

    def run(self):
        p = self.passed
        opts = self.options if self.pass_options else None
        if self.op == "merge":
            low.flashattn_merge(self.call_ctx, self._merge_args())
        elif self.op == "forward_ex":
            low.flashattn_forward_ex(self.call_ctx, self._args(), self.workspace, self.workspace_size)
        elif self.op == "backward_ex":
            low.flashattn_backward_ex(self.call_ctx, self._args(), self.workspace, self.workspace_size)
        elif self.op == "supported_ex":
            low.flashattn_supported_ex(self.call_ctx, self._args(), self.backward_flag)
        elif self.op == "workspace_size_ex":
            low.flashattn_workspace_size_ex(self.call_ctx, self._args(), self.backward_flag)
        elif self.op == "cp_forward":
            low.flashattn_cp_forward(self.call_ctx, self._cp(), self._args(), self.workspace,
                                     self.workspace_size)
        elif self.op == "cp_backward":
            low.flashattn_cp_backward(self.call_ctx, self._cp(), self._args(), self.workspace,
                                      self.workspace_size)
        elif self.op == "cp_workspace_size":
            low.flashattn_cp_workspace_size(self.call_ctx, self._cp(), self._args(),
                                            self.backward_flag)
        elif self.op == "forward":
            low.flashattn_forward(self.call_ctx, p["q"], p["k"], p["v"], p["out"], p["lse"], opts,
                                  self.workspace, self.workspace_size)
        elif self.op == "backward":
            low.flashattn_backward(self.call_ctx, p["q"], p["k"], p["v"], p["out"], p["dout"],
                                   p["lse"], p["dq"], p["dk"], p["dv"], opts, self.workspace,
                                   self.workspace_size)
        elif self.op == "supported":
            low.flashattn_supported(self.call_ctx, p["q"], p["k"], p["v"], opts, self.backward_flag)
        else:
            low.flashattn_workspace_size(self.call_ctx, p["q"], p["k"], p["v"], opts,
                                         self.backward_flag)

    def changed_buffers(self):
        changed = []
        for name, buf in self.buffers.items():
            now = np.empty_like(self.contents[name])
            low.flashattn_buffer_read(buf, 0, now)
            if not np.array_equal(now, self.contents[name]):
                changed.append(name)
        return changed

    def close(self):
        for buf in self.buffers.values():
            low.flashattn_buffer_destroy(buf)
        low.flashattn_context_destroy(self.ctx)


# The unmutated baselines succeed (else a case could pass for a reason other than its mutation),
# the _ex ops also with every variant tensor given and in the variable-length form.
BASELINES = [(op, "-") for op in OUTPUTS] + [
    (op, m) for op in OUTPUTS if op.endswith("_ex")
    for m in ("alibi_slopes=given;sinks=given;dsinks=given", "varlen=1",
              "varlen=1;sinks=given;dsinks=given;alibi_slopes=given;alibi_slopes.rank=2;"
              "alibi_slopes.shape[0]=2;alibi_slopes.shape[1]=4;alibi_slopes.strides[0]=4")] + [
    ("merge", m) for m in ("lse=null", "out.data=alias:parts_out;lse.data=alias:parts_lse",
                           "args.parts_out_stride=0;args.parts_lse_stride=0")] + [
    (op, m) for op in OUTPUTS if op.startswith("cp_")
    for m in ("cp.layout=1", "sinks=given;dsinks=given")]


@pytest.mark.parametrize("op,mutations", BASELINES)
@pytest.mark.parametrize("backward", [0, 1])
def test_baseline_succeeds(op, mutations, backward):
    call = Call(op)
    try:
        if mutations != "-":
            for m in mutations.split(";"):
                call.mutate(m)
        call.backward_flag = backward
        call.run()
    finally:
        call.close()


# The KV cache forms succeed too, forward only: contiguous and paged, with rows appended and with
# the rotary embedding in either layout (supported_ex and workspace_size_ex with backward=0).
CACHE_BASELINES = [(op, m) for op in ("forward_ex", "supported_ex", "workspace_size_ex")
                   for m in ("cache=1", "cache=1;paged=1", "cache=1;k_new=given;v_new=given",
                             "cache=1;paged=1;k_new=given;v_new=given;rotary_cos=given;"
                             "rotary_sin=given;args.rotary_interleaved=1;sinks=given",
                             "cache=1;rotary_cos=given;rotary_sin=given;args.rotary_interleaved=1")]


def cache_rows(call, name):
    """The cache k or v of the contiguous cache form as float32 [B, NK, HKV, D]."""
    now = np.empty(B * NK * HKV * D, dtype=np.float32)
    low.flashattn_buffer_read(call.buffers[name], 0, now.view(np.uint8))
    return now.reshape(B, NK, HKV, D)


@pytest.mark.parametrize("op,mutations", CACHE_BASELINES)
def test_cache_baseline_succeeds(op, mutations):
    call = Call(op)
    try:
        for m in mutations.split(";"):
            call.mutate(m)
        call.run()
        if op == "forward_ex" and "k_new=given" in mutations and "rotary" not in mutations:
            # The rows appended where each sequence's tokens end (a paged cache with the identity
            # table stores token t of sequence b at row b * NK + t as well), nothing else; rows
            # a rotary embedding changed are tested in test_kvcache.py.
            for name in ("k", "v"):
                rows = cache_rows(call, name)
                for b, held in enumerate(CACHE_SEQLENS):
                    assert np.all(rows[b, held:held + N_NEW] == NEW_ROWS_VALUE), (name, b)
                    assert np.all(rows[b, :held] == 0.5) and np.all(rows[b, held + N_NEW:] == 0.5)
    finally:
        call.close()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case):
    assert case.status in STATUSES, "line %d: unknown status %s" % (case.line, case.status)
    call = Call(case.op)
    try:
        if case.mutations != "-":
            for m in case.mutations.split(";"):
                call.mutate(m)
        with pytest.raises(low.Error) as caught:
            call.run()
        err = caught.value
        assert err.status_name == case.status, "line %d: %s" % (case.line, err)
        assert case.fragment in err.message, "line %d: %s" % (case.line, err)
        assert call.changed_buffers() == [], "line %d: a rejected call wrote memory" % case.line
    finally:
        call.close()
