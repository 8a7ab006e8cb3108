"""attention() for torch tensors that require grad: a torch.autograd.Function, so that
loss.backward() runs flashattn's backward (dsinks too, when the sinks require grad)."""
import torch

from . import _core


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, variants, options, context):
        out, lse = _core.forward(q, k, v, *options, want_lse=True, context=context,
                                 variants=variants)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.flashattn_call = (variants, options, context)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        variants, options, context = ctx.flashattn_call
        if dout.stride(-1) != 1:
            # autograd hands out expanded gradients (e.g. of out.sum(), every stride 0); the
            # library needs unit stride along head_dim.
            dout = dout.contiguous()
        grads = _core.backward(dout, q, k, v, out, lse, *options, context=context,
                               variants=variants)
        dsinks = grads[3] if len(grads) > 3 else None
        return grads[0], grads[1], grads[2], dsinks, None, None, None


def attention(q, k, v, variants, options, context):
    """(out, lse); options is (causal, scale, algorithm, deterministic, window, softcap,
    num_splits)."""
    return AttentionFunction.apply(q, k, v, variants.sinks, variants, options, context)
