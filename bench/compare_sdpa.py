#!/usr/bin/env python3
"""libflashattn beside PyTorch's scaled_dot_product_attention, in one process on one GPU.

For the FlashAttention papers' shapes (16k tokens: batch = 16384 / seqlen; hidden 2048:
heads = 2048 / head_dim, rounded; head dims 64/128/256; seqlen 512..16k; causal and not) it
times, with triton.testing.do_bench (median, L2 flushed between runs):

  ours   libflashattn through ctypes (the .so given by --lib), algorithm flash (and standard
         with --algo both), on [B, N, H, D] tensors, enqueued on torch's current stream;
  FA2    F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.FLASH_ATTENTION);
  cuDNN  the same under sdpa_kernel(SDPBackend.CUDNN_ATTENTION);

forward, backward and forward+backward. SDPA runs on its own preferred contiguous
[B, H, N, D] tensors holding the same values (a transposed view could make it copy). Its
backward time is fwd+bwd minus fwd, as in /work/shared/perf; ours is timed directly (and
fwd+bwd too). TFLOP/s: forward 4*B*H*N^2*D (halved for causal), backward 2.5x, fwd+bwd 3.5x.
Once per shape our output is compared with SDPA's (max abs difference is printed).

Then the FlashAttention paper's GPT-2 medium step (batch 64, 16 heads, seqlen 1024, head dim
64, fp16, forward+backward): ours flash and standard, PyTorch's math (standard) backend, FA2
and cuDNN: time and the device memory the step adds beyond its inputs q, k, v, dout (ours:
workspace + out, lse, dq, dk, dv; torch: the peak of torch.cuda.max_memory_allocated over what
was allocated before the step).

Each shape's start goes to stderr with how many are left and a rough time left, so that a
long run shows where it is; the table goes to stdout. --plot draws the figures of
bench/plot_peers.py beside the JSON (needs matplotlib).

  python3 bench/compare_sdpa.py --lib build/lib/libflashattn.so --out peers.json [--quick] [--plot]
  python3 bench/compare_sdpa.py --lib build/lib/libflashattn.so --selftest-cpu   (no GPU)
"""

import argparse
import ctypes
import json
import math
import os
import sys
import time

# ---------------------------------------------------------------------------------------------
# The C API through ctypes (include/flashattn/flashattn.h).

SUCCESS = 0
UNSUPPORTED = 200
DTYPE_F32, DTYPE_F16, DTYPE_BF16 = 1, 2, 3
BACKEND_CPU, BACKEND_CUDA = 1, 2
ALGO_FLASH, ALGO_STANDARD = 0, 1


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
        ("strides", ctypes.c_int64 * 4),
    ]


# The first flashattn_options_t: its five fields are all this script sets. The exported
# flashattn_options_init is the first header's initializer and fills exactly this struct (size
# included), which keeps the script working with every later library. A version of the script
# that appends fields must call flashattn_options_init_sized(byref(o), ctypes.sizeof(Options)).
class Options(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("algorithm", ctypes.c_int),
        ("deterministic", ctypes.c_int32),
    ]


# flashattn_args_t of this header, every field (the KV cache's last): what forward_ex takes.
# Filled by flashattn_args_init_sized with its own size, so a library that knows fewer fields
# refuses it by name rather than misreading it.
class Args(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("options", ctypes.c_void_p)] + [
        (name, ctypes.c_void_p) for name in (
            "q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv", "alibi_slopes", "sinks",
            "dsinks", "cu_seqlens_q", "cu_seqlens_k")] + [
        ("max_seqlen_q", ctypes.c_int64), ("max_seqlen_k", ctypes.c_int64)] + [
        (name, ctypes.c_void_p) for name in (
            "cache_seqlens", "block_table", "k_new", "v_new", "rotary_cos", "rotary_sin")] + [
        ("rotary_interleaved", ctypes.c_int64)]


class FlashattnError(RuntimeError):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class Lib:
    def __init__(self, path):
        self.so = ctypes.CDLL(path)
        so = self.so
        P = ctypes.POINTER
        so.flashattn_status_string.restype = ctypes.c_char_p
        so.flashattn_last_error.restype = ctypes.c_char_p
        so.flashattn_version_string.restype = ctypes.c_char_p
        so.flashattn_context_create.argtypes = [P(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
        so.flashattn_context_destroy.argtypes = [ctypes.c_void_p]
        so.flashattn_context_set_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        so.flashattn_context_synchronize.argtypes = [ctypes.c_void_p]
        so.flashattn_options_init.argtypes = [P(Options)]
        so.flashattn_supported.argtypes = [ctypes.c_void_p, P(Tensor), P(Tensor), P(Tensor),
                                           P(Options), ctypes.c_int]
        so.flashattn_workspace_size.argtypes = [P(ctypes.c_size_t), ctypes.c_void_p, P(Tensor),
                                                P(Tensor), P(Tensor), P(Options), ctypes.c_int]
        so.flashattn_forward.argtypes = [ctypes.c_void_p, P(Tensor), P(Tensor), P(Tensor),
                                         P(Tensor), P(Tensor), P(Options), ctypes.c_void_p,
                                         ctypes.c_size_t]
        so.flashattn_backward.argtypes = [ctypes.c_void_p, P(Tensor), P(Tensor), P(Tensor),
                                          P(Tensor), P(Tensor), P(Tensor), P(Tensor), P(Tensor),
                                          P(Tensor), P(Options), ctypes.c_void_p, ctypes.c_size_t]
        so.flashattn_args_init_sized.argtypes = [P(Args), ctypes.c_size_t]
        so.flashattn_forward_ex.argtypes = [ctypes.c_void_p, P(Args), ctypes.c_void_p,
                                            ctypes.c_size_t]
        for name in ("flashattn_args_init_sized", "flashattn_forward_ex"):
            getattr(so, name).restype = ctypes.c_int
        for name in ("flashattn_context_create", "flashattn_context_destroy",
                     "flashattn_context_set_stream", "flashattn_context_synchronize",
                     "flashattn_options_init", "flashattn_supported", "flashattn_workspace_size",
                     "flashattn_forward", "flashattn_backward"):
            getattr(so, name).restype = ctypes.c_int

    def version(self):
        return self.so.flashattn_version_string().decode()

    def last_error(self):
        return self.so.flashattn_last_error().decode(errors="replace")

    def check(self, status, what):
        if status != SUCCESS:
            name = self.so.flashattn_status_string(status).decode()
            raise FlashattnError(status, f"{what}: {name}: {self.last_error()}")

    def options(self, causal, algorithm):
        o = Options()
        self.check(self.so.flashattn_options_init(ctypes.byref(o)), "options_init")
        o.causal = 1 if causal else 0
        o.algorithm = algorithm
        return o


def tensor_view(ptr, dtype, shape, strides):
    t = Tensor()
    t.data = ptr
    t.dtype = dtype
    t.rank = len(shape)
    for i, (s, st) in enumerate(zip(shape, strides)):
        t.shape[i] = s
        t.strides[i] = st
    return t


class Context:
    def __init__(self, lib, backend, device=0):
        self.lib = lib
        self.handle = ctypes.c_void_p()
        lib.check(lib.so.flashattn_context_create(ctypes.byref(self.handle), backend, device),
                  "context_create")

    def set_stream(self, stream_ptr):
        self.lib.check(self.lib.so.flashattn_context_set_stream(self.handle, stream_ptr),
                       "context_set_stream")

    def close(self):
        if self.handle:
            self.lib.so.flashattn_context_destroy(self.handle)
            self.handle = ctypes.c_void_p()


class Call:
    """Prepared views and options for one shape: forward()/backward() are one ctypes call."""

    def __init__(self, ctx, q, k, v, out, lse, dout, dq, dk, dv, dtype, causal, algorithm,
                 view_of):
        lib = ctx.lib
        self.lib, self.ctx = lib, ctx
        self.views = [view_of(t, dtype) for t in (q, k, v, out, dout, dq, dk, dv)]
        self.lse = view_of(lse, DTYPE_F32)
        self.opts = lib.options(causal, algorithm)
        r = ctypes.byref
        qv, kv, vv, ov, dov, dqv, dkv, dvv = self.views
        so, h = lib.so, ctx.handle
        self._fwd = (h, r(qv), r(kv), r(vv), r(ov), r(self.lse), r(self.opts), None, 0)
        self._bwd = (h, r(qv), r(kv), r(vv), r(ov), r(dov), r(self.lse), r(dqv), r(dkv), r(dvv),
                     r(self.opts), None, 0)
        self._qkv = (h, r(qv), r(kv), r(vv), r(self.opts))
        self._f, self._b = so.flashattn_forward, so.flashattn_backward

    def supported(self, backward):
        st = self.lib.so.flashattn_supported(*self._qkv, 1 if backward else 0)
        return st == SUCCESS, ("" if st == SUCCESS else self.lib.last_error())

    def workspace(self, backward):
        n = ctypes.c_size_t(0)
        h, q, k, v, o = self._qkv
        self.lib.check(self.lib.so.flashattn_workspace_size(ctypes.byref(n), h, q, k, v, o,
                                                            1 if backward else 0),
                       "workspace_size")
        return n.value

    def forward(self):
        st = self._f(*self._fwd)
        if st != SUCCESS:
            self.lib.check(st, "forward")

    def backward(self):
        st = self._b(*self._bwd)
        if st != SUCCESS:
            self.lib.check(st, "backward")


# ---------------------------------------------------------------------------------------------
# A check of the ctypes layer on the CPU backend (runs anywhere: numpy only).

def selftest_cpu(lib):
    import numpy as np

    rng = np.random.default_rng(0)
    b, n, h, d = 2, 37, 3, 16
    q, k, v = (rng.standard_normal((b, n, h, d)).astype(np.float32) for _ in range(3))
    out = np.full_like(q, np.nan)
    lse = np.full((b, h, n), np.nan, dtype=np.float32)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    dq, dk, dv = (np.full_like(q, np.nan) for _ in range(3))

    def view_of(a, dtype):
        return tensor_view(a.ctypes.data, dtype, a.shape, [s // a.itemsize for s in a.strides])

    ctx = Context(lib, BACKEND_CPU)
    try:
        call = Call(ctx, q, k, v, out, lse, dout, dq, dk, dv, DTYPE_F32, True, ALGO_FLASH,
                    view_of)
        ok, why = call.supported(False)
        if not ok:
            print(f"selftest: the CPU backend does not run this ({why}); ctypes layer loaded")
            return 0
        call.forward()
        # numpy reference, bottom-right causal
        s = np.einsum("bihd,bjhd->bhij", q.astype(np.float64), k.astype(np.float64)) / math.sqrt(d)
        mask = np.triu(np.ones((n, n), dtype=bool), 1)
        s[:, :, mask] = -np.inf
        m = s.max(-1, keepdims=True)
        p = np.exp(s - m)
        l = p.sum(-1, keepdims=True)
        ref = np.einsum("bhij,bjhd->bihd", p / l, v.astype(np.float64))
        ref_lse = (m + np.log(l))[..., 0]
        err = float(np.abs(out - ref).max())
        err_lse = float(np.abs(lse - ref_lse).max())
        print(f"selftest (CPU backend through ctypes): max|out - ref| = {err:.2e}, "
              f"max|lse - ref| = {err_lse:.2e}")
        if not (err < 1e-4 and err_lse < 1e-4):
            print("selftest FAILED")
            return 1
        call.backward()
        if np.isnan(dq).any() or np.isnan(dk).any() or np.isnan(dv).any():
            print("selftest FAILED: backward left NaN")
            return 1
        print("selftest passed")
        return 0
    finally:
        ctx.close()


# ---------------------------------------------------------------------------------------------
# The GPU comparison.

class Progress:
    """One stderr line as each of `total` steps starts: which, how many are left after it, the
    time so far and, from the mean time of the steps done, a rough time left."""

    def __init__(self, total, what):
        self.total, self.what, self.done = total, what, 0
        self.start = time.monotonic()

    @staticmethod
    def clock(seconds):
        return f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"

    def step(self, label):
        elapsed = time.monotonic() - self.start
        eta = f", ~{self.clock(elapsed / self.done * (self.total - self.done))} left" if self.done else ""
        self.done += 1
        print(f"[{self.what} {self.done}/{self.total}] {label}: {self.total - self.done} left after "
              f"this, {self.clock(elapsed)} so far{eta}", file=sys.stderr, flush=True)


def sweep_shapes(args):
    """(batch, seqlen, heads, head_dim, causal) of the sweep, in the order they run: 16k tokens
    and hidden 2048, so seqlens that do not divide 16384 are left out; a head dim that does not
    divide 2048 (72, 104, ...) gets the nearest whole number of heads (hidden within a head dim
    of 2048), which its row in the table shows."""
    return [(16384 // n, n, max(1, round(2048 / d)), d, causal)
            for d in args.dims for causal in args.causal for n in args.seqlens
            if 16384 % n == 0]


# Page sizes of the paged decode columns (ours only: the peers take no pages through SDPA).
PAGED_DECODE_ROWS = (16, 64)


def paged_decode_call(lib, ctx, q, k, v, out, rows, causal, view_of, shuffled=True):
    """A forward over k, v's tokens as a paged KV cache of `rows`-row pages, shuffled (else in
    order: sequence after sequence); returns the call (a closure over its views, which it keeps
    alive)."""
    import torch
    B, N, Hkv, D = k.shape
    per_seq = -(-N // rows)
    perm = (torch.randperm(B * per_seq, device=k.device) if shuffled
            else torch.arange(B * per_seq, device=k.device))
    table = perm.reshape(B, per_seq).to(torch.int32).contiguous()
    pad = per_seq * rows - N
    kp, vp = (torch.nn.functional.pad(t, (0, 0, 0, 0, 0, pad)).reshape(B * per_seq, rows, Hkv, D)
              for t in (k, v))
    kpages, vpages = torch.empty_like(kp), torch.empty_like(vp)
    kpages[perm], vpages[perm] = kp, vp
    lens = torch.full((B,), N, dtype=torch.int32, device=k.device)
    dt = {torch.bfloat16: DTYPE_BF16, torch.float16: DTYPE_F16}[q.dtype]
    views = [view_of(q, dt), view_of(kpages, dt), view_of(vpages, dt), view_of(out, dt),
             view_of(lens, 16), view_of(table, 16)]
    opts = lib.options(causal, ALGO_FLASH)
    a = Args()
    lib.check(lib.so.flashattn_args_init_sized(ctypes.byref(a), ctypes.sizeof(a)), "args_init")
    a.options = ctypes.addressof(opts)
    a.q, a.k, a.v, a.out, a.cache_seqlens, a.block_table = (ctypes.addressof(t) for t in views)
    keep = (views, opts, kpages, vpages, lens, table)

    def forward():
        st = lib.so.flashattn_forward_ex(ctx.handle, ctypes.byref(a), None, 0)
        if st != SUCCESS:
            lib.check(st, f"paged forward ({rows}-row pages)")
        return keep
    return forward


def fmt(x, width=7, digits=1):
    return f"{x:{width}.{digits}f}" if isinstance(x, (int, float)) and math.isfinite(x) else f"{'n/a':>{width}}"


def run_gpu(args, lib):
    import torch
    import torch.nn.functional as F
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    cdtype = {torch.bfloat16: DTYPE_BF16, torch.float16: DTYPE_F16, torch.float32: DTYPE_F32}
    # A stream of our own: torch's default stream is the legacy stream (handle 0), which the
    # library would read as "its own stream" and not order against torch's work.
    stream = torch.cuda.Stream(device=dev)
    torch.cuda.set_stream(stream)
    ctx = Context(lib, BACKEND_CUDA, args.device)
    ctx.set_stream(stream.cuda_stream)

    def view_of(t, dtype):
        return tensor_view(t.data_ptr(), dtype, list(t.shape), list(t.stride()))

    def bench(fn, grad_to_none=None):
        return triton.testing.do_bench(fn, warmup=args.warmup_ms, rep=args.rep_ms,
                                       grad_to_none=grad_to_none, return_mode="median")

    props = torch.cuda.get_device_properties(dev)
    print(f"compare_sdpa: {props.name}, torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}, libflashattn {lib.version()} ({args.lib})")
    print("TFLOP/s: forward 4*B*H*N^2*D (causal: half), backward 2.5x, fwd+bwd 3.5x; "
          "SDPA backward = (fwd+bwd) - fwd; ours timed directly\n")

    algos = [("flash", ALGO_FLASH)] + ([("standard", ALGO_STANDARD)] if args.algo == "both" else [])
    records = []

    def measure_ours(shape, tensors, algorithm):
        B, N, H, D, causal = shape
        q, k, v, out, lse, dout, dq, dk, dv = tensors
        call = Call(ctx, q, k, v, out, lse, dout, dq, dk, dv, cdtype[q.dtype], causal, algorithm,
                    view_of)
        r = {"fwd_ms": None, "bwd_ms": None, "fwdbwd_ms": None, "why": ""}
        ok, why = call.supported(False)
        if not ok:
            r["why"] = why
            return r, call
        ws_f = call.workspace(False)
        okb, whyb = call.supported(True)
        ws_b = call.workspace(True) if okb else 0
        free, _ = torch.cuda.mem_get_info(dev)
        if max(ws_f, ws_b) > 0.9 * free:
            r["why"] = f"needs {max(ws_f, ws_b) / 1e9:.1f} GB of workspace, {free / 1e9:.1f} GB free"
            return r, call
        r["workspace_fwd"], r["workspace_bwd"] = ws_f, ws_b
        try:
            r["fwd_ms"] = bench(call.forward)
            if okb:
                call.forward()
                r["bwd_ms"] = bench(call.backward)

                def step():
                    call.forward()
                    call.backward()

                r["fwdbwd_ms"] = bench(step)
            else:
                r["why"] = "backward: " + whyb
        except FlashattnError as e:
            r["why"] = str(e)
        return r, call

    def measure_sdpa(backend, qh, kh, vh, doh, causal):
        r = {"fwd_ms": None, "bwd_ms": None, "fwdbwd_ms": None, "why": ""}
        try:
            with sdpa_kernel(backend):
                with torch.no_grad():
                    r["fwd_ms"] = bench(lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal))
                qg, kg, vg = (t.detach().requires_grad_(True) for t in (qh, kh, vh))

                def step():
                    o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                    o.backward(doh)

                r["fwdbwd_ms"] = bench(step, grad_to_none=[qg, kg, vg])
                r["bwd_ms"] = r["fwdbwd_ms"] - r["fwd_ms"]
        except Exception as e:  # a backend that declines the shape raises RuntimeError
            r["why"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return r

    def tflops(shape, ms, mult):
        B, N, H, D, causal = shape
        f = 4.0 * B * H * N * N * D * (0.5 if causal else 1.0) * mult
        return f / (ms * 1e-3) / 1e12 if ms else float("nan")

    def make_tensors(B, N, H, D, dtype):
        g = torch.Generator(device=dev).manual_seed(1234)
        q, k, v, dout = (torch.randn(B, N, H, D, device=dev, dtype=dtype, generator=g) for _ in range(4))
        out = torch.empty_like(q)
        lse = torch.empty(B, H, N, device=dev, dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        return q, k, v, out, lse, dout, dq, dk, dv

    # ---- the sweep ----
    if args.sweep:
        head = (f"{'shape':<28} {'algo':<8} | {'fwd: ours':>9} {'FA2':>6} {'cuDNN':>6} {'/FA2':>5} {'/cuDNN':>6} "
                f"| {'bwd: ours':>9} {'FA2':>6} {'cuDNN':>6} {'/FA2':>5} {'/cuDNN':>6} "
                f"| {'f+b: ours':>9} {'FA2':>6} {'cuDNN':>6} | {'max|diff|':>9}")
        print(head)
        print("-" * len(head))
        shapes = sweep_shapes(args)
        progress = Progress(len(shapes), "sweep")
        for B, n, H, d, causal in shapes:
            shape = (B, n, H, d, causal)
            label = f"b{B} h{H} n{n} d{d}{' causal' if causal else ''}"
            progress.step(label)
            tensors = make_tensors(B, n, H, d, tdtype)
            q, k, v, out, lse, dout = tensors[:6]
            # SDPA's preferred layout, same values
            qh, kh, vh, doh = (t.transpose(1, 2).contiguous() for t in (q, k, v, dout))
            fa2 = measure_sdpa(SDPBackend.FLASH_ATTENTION, qh, kh, vh, doh, causal)
            cudnn = measure_sdpa(SDPBackend.CUDNN_ATTENTION, qh, kh, vh, doh, causal)
            with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                ref = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal).transpose(1, 2)
            for name, algorithm in algos:
                ours, call = measure_ours(shape, tensors, algorithm)
                maxdiff = None
                if ours["fwd_ms"] is not None:
                    out.fill_(float("nan"))
                    call.forward()
                    torch.cuda.synchronize(dev)
                    maxdiff = float((out.float() - ref.float()).abs().max().item())
                rec = {"dtype": args.dtype, "batch": B, "seqlen": n, "heads": H, "head_dim": d,
                       "causal": causal, "algo": name, "ours": ours, "fa2": fa2, "cudnn": cudnn,
                       "max_abs_diff_vs_fa2": maxdiff}
                for who, r in (("ours", ours), ("fa2", fa2), ("cudnn", cudnn)):
                    for mode, mult in (("fwd", 1.0), ("bwd", 2.5), ("fwdbwd", 3.5)):
                        ms = r.get(f"{mode}_ms")
                        rec[f"{who}_{mode}_tflops"] = tflops(shape, ms, mult) if ms else None
                records.append(rec)

                def tf(who, mode):
                    x = rec[f"{who}_{mode}_tflops"]
                    return x if x is not None else float("nan")

                def ratio(a, b):
                    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else float("nan")

                cols = []
                for mode in ("fwd", "bwd"):
                    o, f2, cd = tf("ours", mode), tf("fa2", mode), tf("cudnn", mode)
                    cols.append(f"{fmt(o, 9)} {fmt(f2, 6)} {fmt(cd, 6)} {fmt(ratio(o, f2), 5, 2)} {fmt(ratio(o, cd), 6, 2)}")
                o, f2, cd = tf("ours", "fwdbwd"), tf("fa2", "fwdbwd"), tf("cudnn", "fwdbwd")
                cols.append(f"{fmt(o, 9)} {fmt(f2, 6)} {fmt(cd, 6)}")
                md = f"{maxdiff:9.2e}" if maxdiff is not None else f"{'n/a':>9}"
                print(f"{label:<28} {name:<8} | " + " | ".join(cols) + f" | {md}")
                for who, r in (("ours", ours), ("FA2", fa2), ("cuDNN", cudnn)):
                    if r["why"]:
                        print(f"{'':<28} {'':<8}   {who}: {r['why'][:140]}")
                sys.stdout.flush()
            del tensors, q, k, v, out, lse, dout, qh, kh, vh, doh, ref
            torch.cuda.empty_cache()
        print()

    # ---- GPT-2 medium, forward + backward, time and memory ----
    gpt2 = []
    if args.gpt2:
        B, N, H, D = 64, 1024, 16, 64
        print("FlashAttention paper, GPT-2 medium (batch 64, 16 heads, seqlen 1024, head dim 64, fp16), "
              "forward + backward.\nPaper (A100): standard 41.7 ms, FlashAttention 7.3 ms.")
        print(f"{'':<26} {'causal':>6} {'fwd+bwd ms':>11} {'extra memory GB':>16}")
        gpt2_cases = (False, True)
        progress = Progress(len(gpt2_cases), "GPT-2 medium")
        for causal in gpt2_cases:
            progress.step("causal" if causal else "not causal")
            tensors = make_tensors(B, N, H, D, torch.float16)
            q, k, v, out, lse, dout, dq, dk, dv = tensors
            # Comparable with torch's peak over its inputs: what the step adds beyond q, k, v
            # and dout, i.e. our workspace plus the outputs out, lse, dq, dk, dv.
            output_bytes = sum(t.numel() * t.element_size() for t in (out, lse, dq, dk, dv))
            for name, algorithm in (("ours flash", ALGO_FLASH), ("ours standard", ALGO_STANDARD)):
                r, call = measure_ours((B, N, H, D, causal), tensors, algorithm)
                ws = mem = None
                if r["fwdbwd_ms"] is not None:
                    ws = max(r.get("workspace_fwd", 0), r.get("workspace_bwd", 0))
                    mem = ws + output_bytes
                gpt2.append({"name": name, "causal": causal, "fwdbwd_ms": r["fwdbwd_ms"],
                             "workspace_bytes": ws, "peak_extra_bytes": mem, "why": r["why"]})
                ms = r["fwdbwd_ms"]
                print(f"{name:<26} {str(causal):>6} {fmt(ms, 11, 2)} {fmt(mem / 1e9 if mem is not None else None, 16, 3)}"
                      f"   (workspace {fmt(ws / 1e9 if ws is not None else None, 0, 3).strip()} GB + outputs)"
                      f"{'  ' + r['why'][:100] if r['why'] else ''}")
            qh, kh, vh, doh = (t.transpose(1, 2).contiguous() for t in (q, k, v, dout))
            for name, backend in (("torch math (standard)", SDPBackend.MATH),
                                  ("torch FA2", SDPBackend.FLASH_ATTENTION),
                                  ("torch cuDNN", SDPBackend.CUDNN_ATTENTION)):
                r = measure_sdpa(backend, qh, kh, vh, doh, causal)
                mem = None
                if r["fwdbwd_ms"] is not None:
                    try:
                        with sdpa_kernel(backend):
                            qg, kg, vg = (t.detach().requires_grad_(True) for t in (qh, kh, vh))
                            torch.cuda.synchronize(dev)
                            base = torch.cuda.memory_allocated(dev)
                            torch.cuda.reset_peak_memory_stats(dev)
                            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                            o.backward(doh)
                            torch.cuda.synchronize(dev)
                            mem = torch.cuda.max_memory_allocated(dev) - base
                            del o, qg, kg, vg
                    except Exception as e:
                        r["why"] = str(e).splitlines()[0]
                gpt2.append({"name": name, "causal": causal, "fwdbwd_ms": r["fwdbwd_ms"],
                             "peak_extra_bytes": mem, "why": r["why"]})
                print(f"{name:<26} {str(causal):>6} {fmt(r['fwdbwd_ms'], 11, 2)} "
                      f"{fmt(mem / 1e9 if mem is not None else None, 16, 3)}   (peak over inputs)"
                      f"{'  ' + r['why'][:100] if r['why'] else ''}")
            del tensors, q, k, v, out, lse, dout, dq, dk, dv, qh, kh, vh, doh
            torch.cuda.empty_cache()

    # ---- decode: a few query tokens against a long KV cache (bandwidth of K and V read once) ----
    decode = []
    if args.decode:
        Hq, Hkv, D = 32, 8, 128
        cases = [(1, 8192, 1, False), (1, 131072, 1, False), (8, 32768, 1, False),
                 (32, 8192, 1, False), (32, 32768, 1, False), (64, 4096, 1, False),
                 (32, 8192, 4, True)]
        print(f"\ndecode: {Hq} query heads over {Hkv} KV heads, d {D}, {args.dtype}; TB/s of K and V "
              "read once (ours, FA2, cuDNN; SDPA with enable_gqa, else K/V repeated per query head); "
              f"pages {args.decode_pages}")
        print(f"{'case':<24} {'ours':>6} " + " ".join(f"{'p' + str(r):>6}" for r in PAGED_DECODE_ROWS) +
              f" {'FA2':>6} {'cuDNN':>6} {'/cuDNN':>7} {'max|diff|':>10}")
        progress = Progress(len(cases), "decode")
        for B, Nk, Nq, causal in cases:
            label = f"B{B} Nk{Nk} Nq{Nq}{' causal' if causal else ''}"
            progress.step(label)
            g = torch.Generator(device=dev).manual_seed(99)
            q = torch.randn(B, Nq, Hq, D, device=dev, dtype=tdtype, generator=g)
            k = torch.randn(B, Nk, Hkv, D, device=dev, dtype=tdtype, generator=g)
            v = torch.randn(B, Nk, Hkv, D, device=dev, dtype=tdtype, generator=g)
            out, dout, dq = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
            lse = torch.empty(B, Hq, Nq, device=dev, dtype=torch.float32)
            call = Call(ctx, q, k, v, out, lse, dout, dq, k, v, cdtype[tdtype], causal, ALGO_FLASH,
                        view_of)
            kv_bytes = 2.0 * B * Nk * Hkv * D * q.element_size()
            rec = {"B": B, "Nk": Nk, "Nq": Nq, "causal": causal, "why": ""}
            ok, why = call.supported(False)
            rec["ours_ms"] = bench(call.forward) if ok else None
            rec["why"] = "" if ok else why
            # The same tokens as a KV cache in pages (shuffled), through forward_ex.
            for rows in PAGED_DECODE_ROWS:
                paged_ms, paged_why = None, ""
                try:
                    forward = paged_decode_call(lib, ctx, q, k, v, out, rows, causal, view_of,
                                                shuffled=args.decode_pages == "shuffled")
                    forward()
                    paged_ms = bench(forward)
                except FlashattnError as e:
                    paged_why = str(e)
                rec[f"ours_paged{rows}_ms"], rec[f"ours_paged{rows}_why"] = paged_ms, paged_why
            qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
            # SDPA's is_causal aligns the diagonal top-left when Nq != Nk; ours (as FA2's and
            # cuDNN's own APIs) bottom-right: the same mask through causal_lower_right.
            mask_kw = {"is_causal": causal}
            if causal and Nq != Nk:
                from torch.nn.attention.bias import causal_lower_right
                mask_kw = {"attn_mask": causal_lower_right(Nq, Nk)}
            ref = None
            for who, backend in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                ms, how = None, ""
                for gqa in (True, False):
                    try:
                        kk, vv = (kh, vh) if gqa else (t.repeat_interleave(Hq // Hkv, dim=1) for t in (kh, vh))
                        kw = {"enable_gqa": True} if gqa else {}
                        with torch.no_grad(), sdpa_kernel(backend):
                            fn = lambda: F.scaled_dot_product_attention(qh, kk, vv, **mask_kw, **kw)
                            ms = bench(fn)
                            if ref is None:
                                ref = fn().transpose(1, 2)
                        how = "enable_gqa" if gqa else "repeated K/V"
                        break
                    except Exception as e:  # a backend that declines the shape raises
                        how = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                rec[f"{who}_ms"], rec[f"{who}_how"] = ms, how
            maxdiff = None
            if rec["ours_ms"] is not None and ref is not None:
                out.fill_(float("nan"))
                call.forward()
                torch.cuda.synchronize(dev)
                maxdiff = float((out.float() - ref.float()).abs().max().item())
            rec["max_abs_diff"] = maxdiff
            for who in ("ours", "fa2", "cudnn") + tuple(f"ours_paged{r}" for r in PAGED_DECODE_ROWS):
                ms = rec.get(f"{who}_ms")
                rec[f"{who}_TBps"] = kv_bytes / (ms * 1e-3) / 1e12 if ms else None
            decode.append(rec)
            ratio = (rec["ours_TBps"] / rec["cudnn_TBps"]) if rec["ours_TBps"] and rec["cudnn_TBps"] else float("nan")
            paged = " ".join(fmt(rec[f"ours_paged{r}_TBps"], 6, 2) for r in PAGED_DECODE_ROWS)
            print(f"{label:<24} {fmt(rec['ours_TBps'], 6, 2)} {paged} {fmt(rec['fa2_TBps'], 6, 2)} "
                  f"{fmt(rec['cudnn_TBps'], 6, 2)} {ratio:7.2f} {maxdiff if maxdiff is not None else float('nan'):10.2e}"
                  f"{'  ' + rec['why'][:80] if rec['why'] else ''}")
            del q, k, v, out, dout, dq, lse, qh, kh, vh, ref, call
            torch.cuda.empty_cache()

    ctx.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": props.name, "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "libflashattn": lib.version(),
                       "dtype": args.dtype, "sweep": records, "gpt2_medium": gpt2,
                       "decode": decode, "decode_pages": args.decode_pages,
                       "time": time.strftime("%Y-%m-%d %H:%M:%S")}, f, indent=1)
        print(f"\nwrote {args.out}")
        if args.plot:
            from plot_peers import plot_run  # beside this script
            written = plot_run(args.out, None, os.path.dirname(os.path.abspath(args.out)))
            if written:
                print(f"drew {', '.join(written)} beside it")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="path of libflashattn.so")
    ap.add_argument("--out", help="JSON output path")
    ap.add_argument("--plot", action="store_true",
                    help="draw bench/plot_peers.py's figures beside --out (needs matplotlib)")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--algo", choices=["flash", "both"], default="flash",
                    help="ours: flash only, or flash and standard, in the sweep")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--quick", action="store_true", help="seqlens 1k, 4k, 16k; dims 64, 128")
    ap.add_argument("--no-sweep", dest="sweep", action="store_false")
    ap.add_argument("--no-gpt2", dest="gpt2", action="store_false")
    ap.add_argument("--decode", action="store_true",
                    help="also the decode cases: 32 query heads over 8 KV heads, d 128, 1 or 4 "
                         "query tokens against 4k-128k keys, in TB/s of K and V read once")
    ap.add_argument("--decode-pages", choices=["shuffled", "ordered"], default="shuffled",
                    help="the paged decode columns' pages: a random permutation (default), or "
                         "in order, sequence after sequence")
    ap.add_argument("--warmup-ms", type=int, default=25)
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--selftest-cpu", action="store_true",
                    help="check the ctypes layer on the CPU backend (numpy only) and exit")
    args = ap.parse_args()
    if args.plot and not args.out:
        ap.error("--plot draws beside the JSON file: give --out")
    if args.quick:
        args.seqlens, args.dims = "1024,4096,16384", "64,128"
    args.dims = [int(x) for x in args.dims.split(",")]
    args.seqlens = [int(x) for x in args.seqlens.split(",")]
    args.causal = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    lib = Lib(os.path.abspath(args.lib))
    if args.selftest_cpu:
        return selftest_cpu(lib)
    return run_gpu(args, lib)


if __name__ == "__main__":
    sys.exit(main())
