#!/usr/bin/env python3
"""Decode calls of ours and of cuDNN (through PyTorch SDPA, enable_gqa) for a profiler to set
side by side (nothing is timed here): per shape, three calls of ours on a contiguous cache, then
three of cuDNN, each after a 256 MB write that flushes the L2, as do_bench does.

    ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \\
        python3 scripts/gpu/decode_peer_calls.py build-gpu/lib/libflashattn.so 1x8192 32x8192

Shapes are BxNk (default 1x8192): one query token, 32 query heads over 8 KV heads, d 128, bf16.
Uses decode_calls.py's set-up (bench/compare_sdpa.py's ctypes layer); needs torch with CUDA.
"""
import sys

import decode_calls as dc  # beside this script: its context and inputs
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CALLS = 3
FLUSH_BYTES = 256 * 1024 * 1024


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    _, ctx, view_of = dc.open_context(sys.argv[1])
    shapes = [tuple(int(x) for x in s.split("x")) for s in sys.argv[2:]] or [(1, 8192)]
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=torch.device("cuda", 0))
    for B, Nk in shapes:
        q, k, v, _, call = dc.decode_inputs(ctx, view_of, B, Nk)
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
