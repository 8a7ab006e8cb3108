#!/usr/bin/env python3
"""One decode shape called a few times each way, for a profiler to take apart (nothing is
timed here): contiguous K/V, then pages of 16 and of 64 rows in order, then shuffled.

    ncu --clock-control none -k regex:decode_kernel --launch-count 12 \\
        --section SpeedOfLight --section InstructionStats \\
        python3 scripts/gpu/decode_calls.py build-gpu/lib/libflashattn.so [B Nk]

Default shape: B32 Nk8192, one query token, 32 query heads over 8 KV heads, d 128, bf16.
Uses bench/compare_sdpa.py's ctypes layer; needs torch with CUDA.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import compare_sdpa as cs  # noqa: E402
import torch  # noqa: E402

CALLS = 3


HQ, HKV, D = 32, 8, 128  # query heads over KV heads, head dim


def open_context(lib_path):
    """The library, a CUDA context on device 0 whose stream is torch's current one, and the
    tensor-view maker of compare_sdpa's ctypes layer."""
    lib = cs.Lib(os.path.abspath(lib_path))
    dev = torch.device("cuda", 0)
    stream = torch.cuda.Stream(device=dev)
    torch.cuda.set_stream(stream)
    ctx = cs.Context(lib, cs.BACKEND_CUDA, 0)
    ctx.set_stream(stream.cuda_stream)

    def view_of(t, dt):
        return cs.tensor_view(t.data_ptr(), dt, list(t.shape), list(t.stride()))

    return lib, ctx, view_of


def decode_inputs(ctx, view_of, B, Nk):
    """One query token against Nk keys per sequence (bf16, random normal): q, k, v, out, and
    our contiguous forward call over them."""
    dev = torch.device("cuda", 0)
    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(B, 1, HQ, D, device=dev, dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Nk, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Nk, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
    out = torch.empty_like(q)
    lse = torch.empty(B, HQ, 1, device=dev, dtype=torch.float32)
    call = cs.Call(ctx, q, k, v, out, lse, out, out, k, v, cs.DTYPE_BF16, False, cs.ALGO_FLASH,
                   view_of)
    return q, k, v, out, call


def main():
    if len(sys.argv) not in (2, 4):
        print(__doc__)
        return 2
    lib, ctx, view_of = open_context(sys.argv[1])
    B, Nk = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) == 4 else (32, 8192)
    q, k, v, out, call = decode_inputs(ctx, view_of, B, Nk)
    ways = [("contiguous", call.forward)]
    for shuffled in (False, True):
        for rows in (16, 64):
            ways.append((f"pages of {rows} {'shuffled' if shuffled else 'in order'}",
                         cs.paged_decode_call(lib, ctx, q, k, v, out, rows, False, view_of,
                                              shuffled=shuffled)))
    for name, forward in ways:
        for _ in range(CALLS):
            forward()
        print(f"{CALLS} calls: {name}")
    torch.cuda.synchronize()
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
