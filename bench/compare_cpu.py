#!/usr/bin/env python3
"""libflashattn's CPU backend beside PyTorch's CPU scaled_dot_product_attention, in one process.

For each thread count (--threads: 2 and all cores by default), dtype (fp32, bf16; fp16 with
--dtypes), head dim (64, 128), seqlen (1k, 4k) and mask (causal and not) it times

  ours   libflashattn through ctypes (the .so given by --lib), backend CPU, algorithm flash,
         on [B, N, H, D] tensors, with flashattn_context_set_num_threads(threads);
  torch  torch.nn.functional.scaled_dot_product_attention on CPU tensors [B, H, N, D] holding
         the same values (its preferred layout), with torch.set_num_threads(threads);

forward, and forward+backward (ours: flashattn_forward then flashattn_backward; torch: the
forward with requires_grad and out.backward(dout)). The two alternate call by call (one
warm-up each, then --repeats timed pairs), so that both meet the same state of the machine;
the median of each is reported, and the ratio ours / torch (above 1: ours is faster). Each
timed call is followed by a pause of TORCH_SPIN_PAUSE_S (--no-spin-pause: none), so that no call
runs beside torch's OpenMP threads still spinning after its last one.
GFLOP/s: forward 4*B*H*N^2*D (causal: half), forward+backward 3.5x that. Once per shape the
outputs are compared (max |ours - torch| over out, and over dq, dk, dv).

Progress goes to stderr, one line as each shape starts; the table (markdown) to stdout; --json
writes every record.

torch is not needed to build or test the project; this program alone needs it:
  python3 -m venv venv && venv/bin/pip install numpy torch
  venv/bin/python bench/compare_cpu.py --lib build-cpu/lib/libflashattn.so [--quick]
"""

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_sdpa import (ALGO_FLASH, BACKEND_CPU, DTYPE_BF16, DTYPE_F16, DTYPE_F32, Args,  # noqa: E402
                          Call, Context, Lib, Progress, tensor_view)

FORWARD_FLOP_MULT = 1.0
FWDBWD_FLOP_MULT = 3.5  # backward = 2.5 forwards of matrix work


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default="build-cpu/lib/libflashattn.so")
    ap.add_argument("--threads", default="2,all",
                    help="comma-separated thread counts; 'all' = the CPUs this process may use")
    ap.add_argument("--dtypes", default="fp32,bf16", help="of fp32, bf16, fp16")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--seqlens", default="1024,4096")
    ap.add_argument("--causal", default="no,yes")
    ap.add_argument("--modes", default="fwd,fwdbwd", help="of fwd, fwdbwd")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="timed calls of each, interleaved")
    ap.add_argument("--quick", action="store_true", help="seqlen 1024 only, 2 repeats")
    ap.add_argument("--json", help="write the records here")
    ap.add_argument("--no-spin-pause", action="store_true",
                    help="time each call right after the other side's (no pause between calls)")
    ap.add_argument("--decode", action="store_true",
                    help="one query token against a KV cache instead (see --decode-shapes)")
    ap.add_argument("--decode-shapes", default="1x4096,1x16384,4x4096,8x2048",
                    help="BxN: batch entries and keys per sequence, one query token each")
    ap.add_argument("--decode-heads", default="32/8", help="query heads / KV heads")
    ap.add_argument("--decode-dim", type=int, default=128)
    args = ap.parse_args()
    # "all": the CPUs this process may run on (a container or taskset may allow fewer than exist)
    all_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = []
    for t in args.threads.split(","):
        n = all_cpus if t == "all" else int(t)
        if n not in threads:
            threads.append(n)
    args.threads = threads
    args.dtypes = args.dtypes.split(",")
    args.dims = [int(x) for x in args.dims.split(",")]
    args.seqlens = [int(x) for x in args.seqlens.split(",")]
    args.causal = [c == "yes" for c in args.causal.split(",")]
    args.modes = args.modes.split(",")
    for mode in args.modes:
        if mode not in ("fwd", "fwdbwd"):
            ap.error(f"--modes: {mode!r} is not one of fwd, fwdbwd")
    if args.quick:
        args.seqlens, args.repeats = [1024], 2
    return args


def cpu_model():
    """The CPU's model name from /proc/cpuinfo, or "unknown CPU"."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


DECODE_LAYOUTS = ("plain", "cache", "paged16", "paged64")
TORCH_SPIN_PAUSE_S = 0.05  # longer than libgomp's spin before its threads sleep


def run_decode(args, lib, ctx, torch, F, cpu_name):
    """One query token per sequence (a decode step), ours in four layouts beside torch.

    plain: flashattn_forward_ex over k, v [B, N, Hkv, D]; cache: the same tensors as a
    contiguous KV cache holding N tokens (cache_seqlens); paged16, paged64: the same tokens in
    pages of 16 and 64 rows in a shuffled order (block_table). torch: SDPA with enable_gqa on
    q [B, Hq, 1, D], k, v [B, Hkv, N, D]. GB/s: the bytes of K and V over the time (every key is
    read once per step, which is what bounds a decode step).
    """
    hq, hkv = (int(x) for x in args.decode_heads.split("/"))
    D = args.decode_dim
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.decode_shapes.split(",")]
    tdtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    cdtypes = {"fp32": DTYPE_F32, "bf16": DTYPE_BF16, "fp16": DTYPE_F16}
    print(f"compare_cpu --decode: {cpu_name}, torch {torch.__version__}, libflashattn "
          f"{lib.version()}; one query token, {hq}/{hkv} heads, d{D}; median of "
          f"{args.repeats} interleaved calls; load average {os.getloadavg()[0]:.2f}\n")
    print("| threads | dtype | B | N | " + " | ".join(f"{l} GB/s" for l in DECODE_LAYOUTS) +
          " | torch GB/s | cache / torch | max abs diff |")
    print("|---|---|---|---|" + "---|" * (len(DECODE_LAYOUTS) + 3))
    records = []
    keep = []  # views and arrays the calls point into, alive until the calls are done
    for threads in args.threads:
        torch.set_num_threads(threads)
        lib.check(lib.so.flashattn_context_set_num_threads(ctx.handle, threads), "set_num_threads")
        for dtype_name in args.dtypes:
            dtype, cdt = tdtypes[dtype_name], cdtypes[dtype_name]
            for B, N in shapes:
                g = torch.Generator().manual_seed(4321)
                q = torch.randn(B, 1, hq, D, generator=g).to(dtype)
                k, v = (torch.randn(B, N, hkv, D, generator=g).to(dtype) for _ in range(2))
                outs = {l: torch.empty(B, 1, hq, D, dtype=dtype) for l in DECODE_LAYOUTS}
                lengths = torch.full((B,), N, dtype=torch.int32)

                def view(t, dt=cdt):
                    return tensor_view(t.data_ptr(), dt, list(t.shape), list(t.stride()))

                def paged(rows):
                    pages_per_seq = -(-N // rows)
                    perm = torch.randperm(B * pages_per_seq, generator=g)
                    kp = torch.zeros(B * pages_per_seq, rows, hkv, D, dtype=dtype)
                    vp = torch.zeros_like(kp)
                    table = perm.reshape(B, pages_per_seq).to(torch.int32).contiguous()
                    for b in range(B):
                        for j in range(pages_per_seq):
                            n = min(rows, N - j * rows)
                            kp[table[b, j]][:n] = k[b, j * rows:j * rows + n]
                            vp[table[b, j]][:n] = v[b, j * rows:j * rows + n]
                    return kp, vp, table

                calls = {}
                for layout in DECODE_LAYOUTS:
                    a = Args()
                    lib.check(lib.so.flashattn_args_init_sized(ctypes.byref(a), ctypes.sizeof(a)),
                              "args_init")
                    kk, vv, table = k, v, None
                    if layout.startswith("paged"):
                        kk, vv, table = paged(int(layout[5:]))
                    views = [view(q), view(kk), view(vv), view(outs[layout])]
                    a.q, a.k, a.v, a.out = (ctypes.addressof(t) for t in views)
                    if layout != "plain":
                        views.append(view(lengths, 16))
                        a.cache_seqlens = ctypes.addressof(views[-1])
                    if table is not None:
                        views.append(view(table, 16))
                        a.block_table = ctypes.addressof(views[-1])
                    keep.append((views, kk, vv, table, a))
                    calls[layout] = a

                def ours(layout):
                    a = calls[layout]
                    return lambda: lib.check(
                        lib.so.flashattn_forward_ex(ctx.handle, ctypes.byref(a), None, 0), layout)

                qh, kh, vh = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), \
                    v.transpose(1, 2).contiguous()

                def torch_fn():
                    with torch.no_grad():
                        return F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)

                fns = {l: ours(l) for l in DECODE_LAYOUTS}
                fns["torch"] = torch_fn
                times = {name: [] for name in fns}
                for fn in fns.values():
                    fn()  # warm-up
                for _ in range(args.repeats):
                    for name, fn in fns.items():
                        start = time.perf_counter()
                        fn()
                        times[name].append(time.perf_counter() - start)
                        if name == "torch":
                            # torch's OpenMP threads spin for a while after a call: let them
                            # sleep before the next of ours runs beside them.
                            time.sleep(TORCH_SPIN_PAUSE_S)
                kv_bytes = 2 * B * N * hkv * D * q.element_size()
                gbs = {name: kv_bytes / statistics.median(t) / 1e9 for name, t in times.items()}
                ref = torch_fn().transpose(1, 2).float()
                diff = max(float((outs[l].float() - ref).abs().max()) for l in DECODE_LAYOUTS)
                print(f"| {threads} | {dtype_name} | {B} | {N} | " +
                      " | ".join(f"{gbs[l]:.1f}" for l in DECODE_LAYOUTS) +
                      f" | {gbs['torch']:.1f} | {gbs['cache'] / gbs['torch']:.2f} | {diff:.2g} |",
                      flush=True)
                records.append({"threads": threads, "dtype": dtype_name, "batch": B, "seqlen_k": N,
                                "heads_q": hq, "heads_kv": hkv, "head_dim": D,
                                "seconds": times, "gb_per_s": gbs, "max_abs_diff": diff,
                                "load_average": os.getloadavg()[0]})
    return records


def main():
    args = parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        sys.exit("compare_cpu.py needs torch: python3 -m venv venv && venv/bin/pip install numpy "
                 "torch, then run it with venv/bin/python")

    lib = Lib(args.lib)
    lib.so.flashattn_context_set_num_threads.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.so.flashattn_context_set_num_threads.restype = ctypes.c_int
    ctx = Context(lib, BACKEND_CPU)
    if args.decode:
        cpu_name = cpu_model()
        records = run_decode(args, lib, ctx, torch, F, cpu_name)
        ctx.close()
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"cpu": cpu_name, "torch": torch.__version__, "records": records}, f,
                          indent=1)
        return
    tdtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    cdtypes = {"fp32": DTYPE_F32, "bf16": DTYPE_BF16, "fp16": DTYPE_F16}

    def view_of(t, dtype):
        return tensor_view(t.data_ptr(), dtype, list(t.shape), list(t.stride()))

    def timed(fn):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def pause():
        if not args.no_spin_pause:
            time.sleep(TORCH_SPIN_PAUSE_S)

    def gflops(B, N, H, D, causal, seconds, mult):
        flops = 4.0 * B * H * N * N * D * (0.5 if causal else 1.0) * mult
        return flops / seconds / 1e9

    cpu_name = cpu_model()
    print(f"compare_cpu: {cpu_name}, {os.cpu_count()} CPUs, torch {torch.__version__} "
          f"(CPU capability {torch.backends.cpu.get_cpu_capability()}), libflashattn "
          f"{lib.version()} ({args.lib}); load average {os.getloadavg()[0]:.2f}")
    print(f"B={args.batch} H={args.heads} Nq=Nk, median of {args.repeats} interleaved calls "
          f"({'no pause' if args.no_spin_pause else f'{TORCH_SPIN_PAUSE_S * 1e3:.0f} ms pause'} "
          "after each); "
          "GFLOP/s forward 4BHN^2D (causal half), fwd+bwd 3.5x; ratio = ours / torch\n")
    print("| threads | dtype | D | N | causal | mode | ours ms | torch ms | ours GFLOP/s | "
          "torch GFLOP/s | ours/torch | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")

    shapes = [(th, dt, d, n, c) for th in args.threads for dt in args.dtypes for d in args.dims
              for n in args.seqlens for c in args.causal]
    progress = Progress(len(shapes), "compare_cpu")
    records = []
    B, H = args.batch, args.heads
    for threads, dtype_name, D, N, causal in shapes:
        progress.step(f"{threads} threads {dtype_name} d{D} n{N}{' causal' if causal else ''}")
        torch.set_num_threads(threads)
        lib.check(lib.so.flashattn_context_set_num_threads(ctx.handle, threads), "set_num_threads")
        dtype = tdtypes[dtype_name]
        g = torch.Generator().manual_seed(1234)
        q, k, v, dout = (torch.randn(B, N, H, D, generator=g).to(dtype) for _ in range(4))
        out = torch.empty_like(q)
        lse = torch.empty(B, H, N, dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        call = Call(ctx, q, k, v, out, lse, dout, dq, dk, dv, cdtypes[dtype_name], causal,
                    ALGO_FLASH, view_of)
        qh, kh, vh, doh = (t.transpose(1, 2).contiguous() for t in (q, k, v, dout))
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (qh, kh, vh))

        def torch_forward():
            with torch.no_grad():
                return F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)

        def torch_fwdbwd():
            for t in (qg, kg, vg):
                t.grad = None
            F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(doh)

        def ours_fwdbwd():
            call.forward()
            call.backward()

        runs = {"fwd": (call.forward, torch_forward, FORWARD_FLOP_MULT),
                "fwdbwd": (ours_fwdbwd, torch_fwdbwd, FWDBWD_FLOP_MULT)}
        for mode in args.modes:
            ours_fn, torch_fn, mult = runs[mode]
            ours_fn()
            torch_fn()
            ours_t, torch_t = [], []
            for _ in range(args.repeats):
                # After every call a pause, so that the next one does not share the cores with
                # torch's OpenMP threads, which spin for a while after a call (ours block at
                # once): on 2 cores, ours right after torch took 3-6 ms longer, a 10-15 % loss
                # at N1k (docs/perf/cpu-2026-12-03-zen3.md). --no-spin-pause times it that way.
                ours_t.append(timed(ours_fn))
                pause()
                torch_t.append(timed(torch_fn))
                pause()
            ours_s, torch_s = statistics.median(ours_t), statistics.median(torch_t)
            if mode == "fwd":
                ref = torch_forward().transpose(1, 2)
                diff = float((out.float() - ref.float()).abs().max())
            else:
                diff = max(float((mine.float() - theirs.grad.transpose(1, 2).float()).abs().max())
                           for mine, theirs in ((dq, qg), (dk, kg), (dv, vg)))
            ours_g = gflops(B, N, H, D, causal, ours_s, mult)
            torch_g = gflops(B, N, H, D, causal, torch_s, mult)
            print(f"| {threads} | {dtype_name} | {D} | {N} | {'yes' if causal else 'no'} | "
                  f"{'fwd' if mode == 'fwd' else 'fwd+bwd'} | {ours_s * 1e3:.1f} | "
                  f"{torch_s * 1e3:.1f} | {ours_g:.0f} | {torch_g:.0f} | "
                  f"{ours_g / torch_g:.2f} | {diff:.2g} |", flush=True)
            records.append({"threads": threads, "dtype": dtype_name, "head_dim": D, "seqlen": N,
                            "batch": B, "heads": H, "causal": causal, "mode": mode,
                            "ours_s": ours_t, "torch_s": torch_t, "ours_gflops": ours_g,
                            "torch_gflops": torch_g, "ratio": ours_g / torch_g,
                            "max_abs_diff": diff, "load_average": os.getloadavg()[0]})
    ctx.close()
    ratios = [r["ratio"] for r in records]
    if ratios:
        print(f"\nours / torch: min {min(ratios):.2f}, median {statistics.median(ratios):.2f}, "
              f"max {max(ratios):.2f} over {len(ratios)} rows; load average now "
              f"{os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name, "torch": torch.__version__, "records": records}, f,
                      indent=1)


if __name__ == "__main__":
    main()
