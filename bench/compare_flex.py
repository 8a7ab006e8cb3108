#!/usr/bin/env python3
"""Our attention variants beside PyTorch's compiled FlexAttention, in one process.

For each head dim and variant -- plain causal, causal with a sliding window, softcap, ALiBi and
attention sinks -- it times our flash forward and backward and FlexAttention's (torch.compile of
torch.nn.attention.flex_attention with the same score_mod / block mask), and cuDNN's plain
causal SDPA as the anchor. Shapes as the variants issue states them: bf16, batch 1, seqlen 16k,
hidden 2048 (heads = 2048 / head dim). TFLOP/s count the visible (query, key) positions only:
4 * B * H * visible * D forward, 2.5x that backward. FlexAttention's and SDPA's backward is
(forward + backward) - forward, as in compare_sdpa.py; ours is timed directly. Each row also
gives max |ours - flex| of the forward outputs (a check that both compute the same thing).

Sinks: FlexAttention has no sink term, so its row for sinks is its plain causal one (what a
model with sinks would pay at best); ours computes the sinks and, in the backward, their
gradient.

  python3 bench/compare_flex.py --lib build/lib/libflashattn.so [--dims 64,128] [--seqlen 16384]
                                [--variants causal,window,softcap,alibi,sinks] [--out flex.json]
"""

import argparse
import ctypes
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_sdpa import (  # noqa: E402  (the ctypes layer, shared)
    ALGO_FLASH, BACKEND_CUDA, DTYPE_BF16, DTYPE_F32, Args, Context, Lib, Options, tensor_view)

WINDOW_LEFT = 1024  # the window: 1024 keys to the left, causal on the right
SOFTCAP = 30.0      # Gemma 2's attention softcap


# flashattn_options_t through the variants' fields (window, softcap), after the first five:
# the size this script passes says which fields it knows; num_splits and later fields take
# their defaults.
class VariantOptions(Options):
    _fields_ = [
        ("window", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("softcap", ctypes.c_float),
    ]


def bind_ex(lib):
    so, P = lib.so, ctypes.POINTER
    so.flashattn_options_init_sized.argtypes = [P(VariantOptions), ctypes.c_size_t]
    so.flashattn_options_init_sized.restype = ctypes.c_int
    for name in ("flashattn_supported_ex",):
        getattr(so, name).argtypes = [ctypes.c_void_p, P(Args), ctypes.c_int]
        getattr(so, name).restype = ctypes.c_int
    so.flashattn_backward_ex.argtypes = [ctypes.c_void_p, P(Args), ctypes.c_void_p, ctypes.c_size_t]
    so.flashattn_backward_ex.restype = ctypes.c_int


def visible_pairs(n, window_left):
    """(query, key) pairs a causal mask (with a left window bound, or -1) leaves visible."""
    if window_left < 0:
        return n * (n + 1) // 2
    w = window_left
    # rows i < w see i + 1 keys; the rest see w + 1
    return (min(n, w) * (min(n, w) + 1)) // 2 + max(0, n - w) * (w + 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="path of libflashattn.so")
    ap.add_argument("--dims", default="128")
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--variants", default="causal,window,softcap,alibi,sinks")
    ap.add_argument("--warmup-ms", type=int, default=25)
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--out", help="JSON output path")
    args = ap.parse_args()

    import torch
    import triton.testing
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    lib = Lib(args.lib)
    bind_ex(lib)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    stream = torch.cuda.Stream(device=dev)  # not the legacy stream: see compare_sdpa.py
    torch.cuda.set_stream(stream)
    ctx = Context(lib, BACKEND_CUDA, 0)
    ctx.set_stream(stream.cuda_stream)
    # One compiled kernel per (variant, head dim, grad mode): past dynamo's default limit of 8
    # recompilations it would fall back to the unfused flex_attention (and run out of memory).
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    flex = torch.compile(flex_attention, dynamic=False)

    def bench(fn, grad_to_none=None):
        return triton.testing.do_bench(fn, warmup=args.warmup_ms, rep=args.rep_ms,
                                       grad_to_none=grad_to_none, return_mode="median")

    def view(t, dtype=DTYPE_BF16):
        return tensor_view(t.data_ptr(), dtype, list(t.shape), list(t.stride()))

    props = torch.cuda.get_device_properties(dev)
    print(f"compare_flex: {props.name}, torch {torch.__version__}, libflashattn {lib.version()}")
    print(f"bf16, B1 N{args.seqlen}, hidden 2048; TFLOP/s over visible positions; "
          "peers' backward = (fwd+bwd) - fwd\n")
    print(f"{'shape':<26} | {'fwd: ours':>9} {'flex':>6} {'/flex':>6} {'/causal':>8} | "
          f"{'bwd: ours':>9} {'flex':>6} {'/flex':>6} {'/causal':>8} | max|ours-flex|")
    records = []
    n = args.seqlen
    for d in (int(x) for x in args.dims.split(",")):
        h = 2048 // d
        g = torch.Generator(device=dev).manual_seed(1234)
        q, k, v, dout = (torch.randn(1, n, h, d, device=dev, dtype=torch.bfloat16, generator=g)
                         for _ in range(4))
        out = torch.empty_like(q)
        lse = torch.empty(1, h, n, device=dev, dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], device=dev)
        sinks = torch.linspace(-1.0, 1.0, h, device=dev)
        dsinks = torch.empty(h, device=dev)
        qh, kh, vh, doh = (t.transpose(1, 2).contiguous() for t in (q, k, v, dout))
        causal_ours = None

        # cuDNN's plain causal, the anchor of the variants issue.
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.no_grad():
            cudnn_fwd = bench(lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True))
        qg, kg, vg = (t.detach().requires_grad_(True) for t in (qh, kh, vh))

        def cudnn_step():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(doh)

        cudnn_fb = bench(cudnn_step, grad_to_none=[qg, kg, vg])
        pairs = visible_pairs(n, -1)
        f_c = 4.0 * h * pairs * d
        records.append({"peer": "cudnn", "case": "causal", "d": d, "N": n,
                        "fwd_tflops": f_c / (cudnn_fwd * 1e-3) / 1e12,
                        "bwd_tflops": 2.5 * f_c / ((cudnn_fb - cudnn_fwd) * 1e-3) / 1e12})
        print(f"{'d%d cudnn causal' % d:<26} | {records[-1]['fwd_tflops']:9.1f} {'':>6} {'':>6} "
              f"{'':>8} | {records[-1]['bwd_tflops']:9.1f}")

        for variant in args.variants.split(","):
            window_left = WINDOW_LEFT if variant == "window" else -1
            opts = VariantOptions()
            lib.check(lib.so.flashattn_options_init_sized(ctypes.byref(opts), ctypes.sizeof(opts)),
                      "options_init_sized")
            opts.causal = 1
            opts.algorithm = ALGO_FLASH
            if variant == "window":
                opts.window, opts.window_left, opts.window_right = 1, WINDOW_LEFT, 0
            if variant == "softcap":
                opts.softcap = SOFTCAP
            a = Args()
            lib.check(lib.so.flashattn_args_init_sized(ctypes.byref(a), ctypes.sizeof(a)),
                      "args_init_sized")
            views = {name: view(t) for name, t in
                     (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout), ("dq", dq),
                      ("dk", dk), ("dv", dv))}
            views["lse"] = view(lse, DTYPE_F32)
            if variant == "alibi":
                views["alibi_slopes"] = view(slopes, DTYPE_F32)
            if variant == "sinks":
                views["sinks"] = view(sinks, DTYPE_F32)
                views["dsinks"] = view(dsinks, DTYPE_F32)
            a.options = ctypes.cast(ctypes.pointer(opts), ctypes.c_void_p)
            for name, t in views.items():
                setattr(a, name, ctypes.cast(ctypes.pointer(t), ctypes.c_void_p))
            ar = ctypes.byref(a)

            def ours_fwd():
                lib.check(lib.so.flashattn_forward_ex(ctx.handle, ar, None, 0), "forward_ex")

            def ours_bwd():
                lib.check(lib.so.flashattn_backward_ex(ctx.handle, ar, None, 0), "backward_ex")

            ours_f = bench(ours_fwd)
            ours_fwd()
            ours_b = bench(ours_bwd)

            # FlexAttention: the same variant as score_mod / block mask ([B, H, N, D] layout).
            def causal_mask(b, hh, qi, kj):
                return qi >= kj

            def window_mask(b, hh, qi, kj):
                return (qi >= kj) & (qi - kj <= WINDOW_LEFT)

            score_mod = None
            if variant == "softcap":
                def score_mod(score, b, hh, qi, kj):
                    return SOFTCAP * torch.tanh(score / SOFTCAP)
            elif variant == "alibi":
                def score_mod(score, b, hh, qi, kj):
                    return score - slopes[hh] * (qi - kj).abs()
            block_mask = create_block_mask(window_mask if variant == "window" else causal_mask,
                                           1, 1, n, n, device=dev)
            with torch.no_grad():
                flex_out = flex(qh, kh, vh, score_mod=score_mod, block_mask=block_mask)
                flex_f = bench(lambda: flex(qh, kh, vh, score_mod=score_mod, block_mask=block_mask))

            def flex_step():
                flex(qg, kg, vg, score_mod=score_mod, block_mask=block_mask).backward(doh)

            flex_fb = bench(flex_step, grad_to_none=[qg, kg, vg])
            flex_b = flex_fb - flex_f
            ours_fwd()
            torch.cuda.synchronize()
            diff = float("nan") if variant == "sinks" else \
                (out.transpose(1, 2).float() - flex_out.float()).abs().max().item()

            pairs = visible_pairs(n, window_left)
            flops = 4.0 * h * pairs * d
            rec = {"case": variant, "d": d, "N": n, "peer": "ours",
                   "fwd_tflops": flops / (ours_f * 1e-3) / 1e12,
                   "bwd_tflops": 2.5 * flops / (ours_b * 1e-3) / 1e12,
                   "fwd_ms": ours_f, "bwd_ms": ours_b, "max_diff_vs_flex": diff}
            frec = {"case": variant if variant != "sinks" else "causal (no sinks)", "d": d,
                    "N": n, "peer": "flex", "fwd_tflops": flops / (flex_f * 1e-3) / 1e12,
                    "bwd_tflops": 2.5 * flops / (flex_b * 1e-3) / 1e12, "fwd_ms": flex_f,
                    "fwdbwd_ms": flex_fb}
            if variant == "causal":
                causal_ours = rec
            rel = (lambda key: rec[key] / causal_ours[key]) if causal_ours else (lambda key: math.nan)
            rec["fwd_vs_causal"], rec["bwd_vs_causal"] = rel("fwd_tflops"), rel("bwd_tflops")
            records += [rec, frec]
            print(f"{'d%d %s' % (d, variant):<26} | {rec['fwd_tflops']:9.1f} {frec['fwd_tflops']:6.1f} "
                  f"{rec['fwd_tflops'] / frec['fwd_tflops']:6.2f} {rec['fwd_vs_causal']:8.2f} | "
                  f"{rec['bwd_tflops']:9.1f} {frec['bwd_tflops']:6.1f} "
                  f"{rec['bwd_tflops'] / frec['bwd_tflops']:6.2f} {rec['bwd_vs_causal']:8.2f} | "
                  f"{diff:.3g}", flush=True)
            if args.out:  # after every row, so that a run cut short keeps what it measured
                with open(args.out, "w") as f:
                    json.dump(records, f, indent=1)
    ctx.close()
    if args.out:
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
