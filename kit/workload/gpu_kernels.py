"""The fused kernels a GPU runs where a meta capture would take torch's CPU paths: scaled
dot-product attention (flash or memory-efficient attention), dropout (native_dropout), RMS norm
(torch's _fused_rms_norm CUDA kernel) and recurrent layers (kit.workload.rnn_capture), routed by
a TorchFunctionMode for the capture.

F.scaled_dot_product_attention goes to the fused kernel a GPU would pick (memory-efficient
attention for fp32, flash attention for fp16/bf16 without a mask), so it is costed as one
attention kernel rather than the math fallback that meta tensors would take. Inputs without a
heads dimension (3-D or 2-D q, k, v) take torch's math path, as on a GPU: its fused kernels take
4-D inputs only (sdp_utils check_tensor_shapes).

F.rms_norm (nn.RMSNorm) calls aten._fused_rms_norm, which has a CUDA kernel (one pass forward,
_fused_rms_norm_backward's two kernels backward) but no meta one: on meta tensors it ran as its
composite (pow, mean, add, rsqrt, two muls; a dozen kernels backward), 7-10x the bytes.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from kit.errors import KitError
from kit.workload import rnn_capture


class GpuKernels(TorchFunctionMode):
    """Route F.scaled_dot_product_attention, dropout and recurrent layers to the fused kernels a
    GPU would run (recurrent layers: kit.workload.rnn_capture, recorded through `rec`, the
    capture's kit.workload.recorder.Recorder)."""

    def __init__(self, rec):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return _fused_sdpa(*args, **kwargs)
        if func is F.dropout:  # a GPU runs the fused native_dropout kernel
            return _fused_dropout(*args, **kwargs)
        if func is torch.dropout:  # at::dropout takes native_dropout on a GPU (not on meta)
            return _fused_dropout(*args, **kwargs)
        if func in (F.rms_norm, torch.rms_norm):
            return _fused_rms_norm(self.rec, *args, **kwargs)
        if func in rnn_capture.SEQUENCE or func in rnn_capture.CELLS:
            out = rnn_capture.fused(self.rec, func, args, kwargs)
            if out is not NotImplemented:
                return out
        if getattr(func, "__module__", None) == F.__name__:  # this mode is off while func runs:
            with _functional_fused():  # F.multi_head_attention_forward's own SDPA and dropout
                return func(*args, **kwargs)  # calls must still reach the fused kernels
        return func(*args, **kwargs)


@contextmanager
def _functional_fused():
    """Point torch.nn.functional's own names scaled_dot_product_attention and dropout at the
    fused kernels a GPU runs, for the duration of one composite functional call. Such a call
    (nn.MultiheadAttention's F.multi_head_attention_forward, under nn.Transformer* too) runs
    with _GpuKernels off, so its inner calls by module-global name were the CPU's: math
    attention, upcast to fp32 in 16-bit dtypes, and an unfused dropout."""
    saved = F.scaled_dot_product_attention, F.dropout
    F.scaled_dot_product_attention, F.dropout = _fused_sdpa, _fused_dropout
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout = saved


def _fused_dropout(input, p=0.5, training=True, inplace=False, *, train=None):
    if train is not None:  # torch.dropout(input, p, train)
        training = train
    if not training or p == 0:
        return input
    return torch.native_dropout(input, p, True)[0]


class _FusedRmsNorm(torch.autograd.Function):
    """aten._fused_rms_norm as CUDA runs it: one recorded node forward (the composite runs muted
    for the output's shape and dtype), aten._fused_rms_norm_backward (a meta kernel of its own,
    recorded as dispatched) backward. Saves x and rstd, as the CUDA kernel's autograd does."""

    @staticmethod
    def forward(ctx, rec, shape, eps, x, weight):
        from kit.workload.mapping import map_op

        with rec.muted():
            y, rstd = torch.ops.aten._fused_rms_norm(x, shape, weight, eps)
        op, op_class, kernels = map_op("_fused_rms_norm", (x, shape, weight, eps), {}, (y, rstd))
        rec.record_fused("aten._fused_rms_norm.default", op, op_class, kernels,
                         [t for t in (x, weight) if t is not None], [y, rstd])
        ctx.shape, ctx.has_weight = shape, weight is not None
        ctx.save_for_backward(x, rstd, weight)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad[3:5]
        dx, dw = torch.ops.aten._fused_rms_norm_backward(
            grad, x, ctx.shape, rstd, weight, [bool(needs[0]), bool(needs[1]) and ctx.has_weight])
        return None, None, None, dx if needs[0] else None, dw if needs[1] else None


def _fused_rms_norm(rec, input, normalized_shape, weight=None, eps=None):
    shape = [int(s) for s in ((normalized_shape,) if isinstance(normalized_shape, int)
                              else normalized_shape)]
    if (not isinstance(input, torch.Tensor) or input.device.type != "meta"
            or input.dim() < len(shape) or list(input.shape[input.dim() - len(shape):]) != shape
            # a weight of another dtype (an fp32 norm in a bf16 body): torch's rms_norm warns
            # "Cannot dispatch to fused implementation" and runs the composite on a GPU too
            or (isinstance(weight, torch.Tensor) and weight.dtype != input.dtype)):
        return torch.rms_norm(input, normalized_shape, weight, eps)  # torch's own error or path
    return _FusedRmsNorm.apply(rec, shape, eps, input, weight)


_TORCH_SDPA = F.scaled_dot_product_attention  # torch's own, whatever _functional_fused swaps in


def _fused_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False):
    if min(q.dim(), k.dim(), v.dim()) < 4:  # no heads dimension: torch's math path, as on a GPU
        return _TORCH_SDPA(q, k, v, attn_mask, dropout_p, is_causal, scale=scale,
                           enable_gqa=enable_gqa)
    # flash attention needs one head size for q, k and v: values of their own width (DeepSeek's
    # MLA) go to the memory-efficient kernel, as torch's dispatcher sends them
    # nor is_causal over more keys than queries (generate's prefill over a preallocated static
    # cache): FlashAttention-2 aligns a non-square causal mask lower-right, so torch refuses it
    # (sdp_utils.cpp check_flash_causal_non_square_seqlens) for the efficient kernel's upper-left
    flash = (q.dtype in (torch.float16, torch.bfloat16) and attn_mask is None
             and v.shape[-1] == q.shape[-1]
             and not (is_causal and q.shape[-2] != k.shape[-2]))
    if k.shape[-3] != q.shape[-3]:  # grouped-query attention
        if not enable_gqa and k.shape[-3] != 1:  # torch broadcasts one K/V head, and no other
            raise RuntimeError(f"scaled_dot_product_attention: {q.shape[-3]} query heads and "
                               f"{k.shape[-3]} key/value heads need enable_gqa=True (torch: the "
                               f"size of tensor a ({q.shape[-3]}) must match the size of tensor "
                               f"b ({k.shape[-3]}) at non-singleton dimension 1)")
        if q.shape[-3] % k.shape[-3]:
            raise KitError(f"attention: {q.shape[-3]} query heads are not a multiple of "
                           f"{k.shape[-3]} key/value heads")
        if not (flash and enable_gqa):  # only flash attention reads grouped K/V heads as they
            rep = q.shape[-3] // k.shape[-3]  # are (torch's SDPA docs, "GQA"); the rest repeat
            k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # torch's SDPA makes a boolean mask additive in q's dtype before any fused kernel
        # (attention.cpp convert_boolean_attn_mask: where(mask, 0, -inf)), a kernel of its own,
        # and the attention kernel reads that mask, not the bool one
        dev = attn_mask.device
        attn_mask = torch.where(attn_mask, torch.scalar_tensor(0.0, dtype=q.dtype, device=dev),
                                torch.scalar_tensor(float("-inf"), dtype=q.dtype, device=dev))
    if flash:
        return torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, dropout_p, is_causal, False, scale=scale)[0]
    need_lse = torch.is_grad_enabled() and q.requires_grad
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, attn_mask, need_lse, dropout_p, is_causal, scale=scale)[0]
