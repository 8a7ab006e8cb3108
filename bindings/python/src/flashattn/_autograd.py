"""attention() for torch tensors that require grad: a torch.autograd.Function, so that
loss.backward() runs flashattn's backward."""
import torch

from . import _core


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, algorithm, deterministic, context):
        out, lse = _core.forward(q, k, v, causal, scale, algorithm, deterministic, True, context)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.flashattn_options = (causal, scale, algorithm, deterministic, context)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout.stride(-1) != 1:
            # autograd hands out expanded gradients (e.g. of out.sum(), every stride 0); the
            # library needs unit stride along head_dim.
            dout = dout.contiguous()
        dq, dk, dv = _core.backward(dout, q, k, v, out, lse, *ctx.flashattn_options)
        return dq, dk, dv, None, None, None, None, None


def attention(q, k, v, causal, scale, algorithm, deterministic, context):
    return AttentionFunction.apply(q, k, v, causal, scale, algorithm, deterministic, context)
