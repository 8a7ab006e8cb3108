#!/usr/bin/env python3
"""Decode calls of ours and of cuDNN (through PyTorch SDPA, enable_gqa) for a profiler to set
side by side (nothing is timed here): per shape, three calls of ours on a contiguous cache, then
three of cuDNN, each after a 256 MB write that flushes the L2, as do_bench does.

    ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \\
        python3 scripts/gpu/decode_peer_calls.py build-gpu/lib/libflashattn.so 1x8192 32x8192

Shapes are BxNk (default 1x8192): one query token, 32 query heads over 8 KV heads, d 128, bf16.
Uses bench/compare_sdpa.py's ctypes layer; needs torch with CUDA.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import compare_sdpa as cs  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

CALLS = 3
FLUSH_BYTES = 256 * 1024 * 1024


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    lib = cs.Lib(os.path.abspath(sys.argv[1]))
    shapes = [tuple(int(x) for x in s.split("x")) for s in sys.argv[2:]] or [(1, 8192)]
    Hq, Hkv, D = 32, 8, 128
    dev = torch.device("cuda", 0)
    stream = torch.cuda.Stream(device=dev)
    torch.cuda.set_stream(stream)
    ctx = cs.Context(lib, cs.BACKEND_CUDA, 0)
    ctx.set_stream(stream.cuda_stream)

    def view_of(t, dt):
        return cs.tensor_view(t.data_ptr(), dt, list(t.shape), list(t.stride()))

    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=dev)
    for B, Nk in shapes:
        g = torch.Generator(device=dev).manual_seed(1)
        q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, Nk, Hkv, D, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, Nk, Hkv, D, device=dev, dtype=torch.bfloat16, generator=g)
        out = torch.empty_like(q)
        lse = torch.empty(B, Hq, 1, device=dev, dtype=torch.float32)
        call = cs.Call(ctx, q, k, v, out, lse, out, out, k, v, cs.DTYPE_BF16, False, cs.ALGO_FLASH,
                       view_of)
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        for _ in range(CALLS):
            flush.zero_()
            call.forward()
        with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for _ in range(CALLS):
                flush.zero_()
                F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)
        torch.cuda.synchronize()
        print(f"B{B} Nk{Nk}: {CALLS} calls of ours, {CALLS} of cuDNN", flush=True)
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
