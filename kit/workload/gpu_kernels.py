"""The fused kernels a GPU runs where a meta capture would take torch's CPU paths: scaled
dot-product attention (flash or memory-efficient attention), dropout (native_dropout) and
recurrent layers (kit.workload.rnn_capture), routed by a TorchFunctionMode for the capture.

F.scaled_dot_product_attention goes to the fused kernel a GPU would pick (memory-efficient
attention for fp32, flash attention for fp16/bf16 without a mask), so it is costed as one
attention kernel rather than the math fallback that meta tensors would take. Inputs without a
heads dimension (3-D or 2-D q, k, v) take torch's math path, as on a GPU: its fused kernels take
4-D inputs only (sdp_utils check_tensor_shapes).
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


def _fused_dropout(input, p=0.5, training=True, inplace=False):
    if not training or p == 0:
        return input
    return torch.native_dropout(input, p, True)[0]


_TORCH_SDPA = F.scaled_dot_product_attention  # torch's own, whatever _functional_fused swaps in


def _fused_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False):
    if min(q.dim(), k.dim(), v.dim()) < 4:  # no heads dimension: torch's math path, as on a GPU
        return _TORCH_SDPA(q, k, v, attn_mask, dropout_p, is_causal, scale=scale,
                           enable_gqa=enable_gqa)
    # flash attention needs one head size for q, k and v: values of their own width (DeepSeek's
    # MLA) go to the memory-efficient kernel, as torch's dispatcher sends them
    flash = (q.dtype in (torch.float16, torch.bfloat16) and attn_mask is None
             and v.shape[-1] == q.shape[-1])
    if k.shape[-3] != q.shape[-3]:  # grouped-query attention
        if q.shape[-3] % k.shape[-3]:
            raise KitError(f"attention: {q.shape[-3]} query heads are not a multiple of "
                           f"{k.shape[-3]} key/value heads")
        if not (flash and enable_gqa):  # only flash attention reads grouped K/V heads as they
            rep = q.shape[-3] // k.shape[-3]  # are (torch's SDPA docs, "GQA"); the rest repeat
            k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    if flash:
        return torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, dropout_p, is_causal, False, scale=scale)[0]
    need_lse = torch.is_grad_enabled() and q.requires_grad
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, attn_mask, need_lse, dropout_p, is_causal, scale=scale)[0]
