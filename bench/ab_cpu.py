#!/usr/bin/env python3
"""Two builds of libflashattn's CPU backend timed against each other, in one process.

For an A/B of a change: each --libs entry is a libflashattn.so (a build before and one after),
loaded side by side (ctypes keeps their symbols apart). For each shape the builds' calls
alternate call by call (A, B, A, B, ...) on the same tensors, so that both meet the same state
of a noisy machine; the best and the median of each are printed, and B / A of the best
GFLOP/s (above 1: B is faster). Also checks that both wrote the same output.

  venv/bin/python bench/ab_cpu.py --libs build-a/lib/libflashattn.so,build-b/lib/libflashattn.so \
      --dtypes fp32 --dims 64,128 --seqlens 1024,4096 --causal no --repeats 9

Needs torch (for the tensors only): python3 -m venv venv && venv/bin/pip install numpy torch.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_sdpa import (ALGO_FLASH, BACKEND_CPU, DTYPE_BF16, DTYPE_F32, Call, Context,  # noqa: E402
                          Lib, tensor_view)

FWDBWD_FLOP_MULT = 3.5  # as compare_cpu.py: backward = 2.5 forwards of matrix work


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--libs", required=True, help="A.so,B.so")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", default="fp32")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--seqlens", default="1024,4096")
    ap.add_argument("--causal", default="no,yes")
    ap.add_argument("--modes", default="fwd", help="of fwd, fwdbwd")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7, help="timed calls of each, interleaved")
    args = ap.parse_args()
    import ctypes
    import torch

    libs = [Lib(path) for path in args.libs.split(",")]
    ctxs = []
    for lib in libs:
        lib.so.flashattn_context_set_num_threads.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.so.flashattn_context_set_num_threads.restype = ctypes.c_int
        ctx = Context(lib, BACKEND_CPU)
        lib.check(lib.so.flashattn_context_set_num_threads(ctx.handle, args.threads), "threads")
        ctxs.append(ctx)
    tdtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    cdtypes = {"fp32": DTYPE_F32, "bf16": DTYPE_BF16}

    def view_of(t, dtype):
        return tensor_view(t.data_ptr(), dtype, list(t.shape), list(t.stride()))

    print(f"ab_cpu: {args.threads} threads, B={args.batch} H={args.heads}, {args.repeats} "
          f"interleaved calls each; load average {os.getloadavg()[0]:.2f}")
    for i, path in enumerate(args.libs.split(",")):
        print(f"  {'AB'[i] if i < 2 else i}: {path}")
    print("\n| dtype | D | N | causal | mode | A best ms | B best ms | A median ms | B median ms "
          "| A GFLOP/s | B GFLOP/s | B/A (best) | B/A (median) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    B, H = args.batch, args.heads
    for dtype_name in args.dtypes.split(","):
        for D in (int(x) for x in args.dims.split(",")):
            for N in (int(x) for x in args.seqlens.split(",")):
                for causal in (c == "yes" for c in args.causal.split(",")):
                    g = torch.Generator().manual_seed(1234)
                    dtype = tdtypes[dtype_name]
                    q, k, v, dout = (torch.randn(B, N, H, D, generator=g).to(dtype)
                                     for _ in range(4))
                    outs, calls = [], []
                    for ctx in ctxs:
                        out = torch.empty_like(q)
                        lse = torch.empty(B, H, N, dtype=torch.float32)
                        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                        outs.append((out, lse, dq, dk, dv))
                        calls.append(Call(ctx, q, k, v, out, lse, dout, dq, dk, dv,
                                          cdtypes[dtype_name], causal, ALGO_FLASH, view_of))
                    for mode in args.modes.split(","):
                        def fn(c, mode=mode):
                            c.forward()
                            if mode == "fwdbwd":
                                c.backward()
                        times = [[] for _ in calls]
                        for c in calls:
                            fn(c)  # warm-up
                        for _ in range(args.repeats):
                            for i, c in enumerate(calls):
                                start = time.perf_counter()
                                fn(c)
                                times[i].append(time.perf_counter() - start)
                        same = all(torch.equal(outs[0][0], o[0]) for o in outs[1:])
                        flops = 4.0 * B * H * N * N * D * (0.5 if causal else 1.0) * (
                            FWDBWD_FLOP_MULT if mode == "fwdbwd" else 1.0)
                        best = [min(t) for t in times]
                        med = [statistics.median(t) for t in times]
                        print(f"| {dtype_name} | {D} | {N} | {'yes' if causal else 'no'} | "
                              f"{mode} | {best[0] * 1e3:.1f} | {best[1] * 1e3:.1f} | "
                              f"{med[0] * 1e3:.1f} | {med[1] * 1e3:.1f} | "
                              f"{flops / best[0] / 1e9:.0f} | {flops / best[1] / 1e9:.0f} | "
                              f"{best[0] / best[1]:.3f} | {med[0] / med[1]:.3f} |"
                              + ("" if same else " outputs differ"), flush=True)
    for ctx in ctxs:
        ctx.close()


if __name__ == "__main__":
    main()
