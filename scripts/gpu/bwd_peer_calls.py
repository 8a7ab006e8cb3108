#!/usr/bin/env python3
"""Backward calls of ours and of cuDNN (through PyTorch SDPA) for a profiler to set side by side
(nothing is timed here): per shape, one forward of ours (its out and LSE), three backward calls
of ours, then three forward+backward calls of cuDNN, each after a 256 MB write that flushes the
L2, as do_bench does. ncu then lists every kernel of both, so that a backward's time can be
split into its launches (ours: preprocess, main kernel, postprocess) beside cuDNN's:

    ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,\\
dram__bytes_write.sum python3 scripts/gpu/bwd_peer_calls.py build-gpu/lib/libflashattn.so \\
        8x2048x16x128 1x16384x16x128c

and the two main kernels' sections side by side (our third backward's, then cuDNN's first; kernel
log run 134):

    ncu --clock-control none -k regex:"bwd_kernel|bprop" --launch-skip 2 --launch-count 2 \
        --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis python3 scripts/gpu/bwd_peer_calls.py \
        build-gpu/lib/libflashattn.so 8x2048x16x128

Shapes are BxNxHxD, a trailing c for causal (default 8x2048x16x128: the sweep's d128 2k);
bf16, [B, N, H, D] for ours and SDPA's [B, H, N, D] holding the same values, as in
bench/compare_sdpa.py; set up as decode_calls.py does; needs torch with CUDA.
"""
import sys

import decode_calls as dc  # beside this script: its context set-up (compare_sdpa's ctypes layer)
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

cs = dc.cs

CALLS = 3
FLUSH_BYTES = 256 * 1024 * 1024


def parse_shape(text):
    causal = text.endswith("c")
    B, N, H, D = (int(x) for x in text.rstrip("c").split("x"))
    return B, N, H, D, causal


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    _, ctx, view_of = dc.open_context(sys.argv[1])
    dev = torch.device("cuda", 0)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=dev)
    for text in sys.argv[2:] or ["8x2048x16x128"]:
        B, N, H, D, causal = parse_shape(text)
        g = torch.Generator(device=dev).manual_seed(1234)
        q, k, v, dout = (torch.randn(B, N, H, D, device=dev, dtype=torch.bfloat16, generator=g)
                         for _ in range(4))
        out = torch.empty_like(q)
        lse = torch.empty(B, H, N, device=dev, dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        call = cs.Call(ctx, q, k, v, out, lse, dout, dq, dk, dv, cs.DTYPE_BF16, causal,
                       cs.ALGO_FLASH, view_of)
        call.forward()
        for _ in range(CALLS):
            flush.zero_()
            call.backward()
        qh, kh, vh, doh = (t.transpose(1, 2).contiguous().requires_grad_(t is not dout)
                           for t in (q, k, v, dout))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for _ in range(CALLS):
                flush.zero_()
                o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
                o.backward(doh)
        torch.cuda.synchronize(dev)
        print(f"{text}: {CALLS} backward calls of ours, {CALLS} forward+backward of cuDNN",
              flush=True)
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
