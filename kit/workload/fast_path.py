"""PyTorch's inference fast path for nn.TransformerEncoderLayer and nn.MultiheadAttention.

In eval mode without grad, torch replaces these modules' Python forward with native kernels
("BetterTransformer", torch >= 1.12): `torch._transformer_encoder_layer_fwd` and
`torch._native_multi_head_attention`. A capture on meta tensors never takes that path: meta is
not a device torch allows there, the capture's own module hooks and TorchFunctionMode block it
too. So the capture would record the slow path (a transposed input, a batched GEMM per token,
a separate bias add and ReLU), which a GPU does not run for such a model.

`swapped(model, rec, names)` gives each such module, for one inference capture, a forward that
decides as torch does (`why_not_encoder`, `why_not_mha`: the conditions of torch's own forward,
less the three the capture itself causes) and, where torch would take the fast path, runs the
kernels of torch's CUDA implementation (aten/src/ATen/native/transformers: attention.cpp
`native_multi_head_attention_cuda`, transformer.cpp `transformer_encoder_layer_forward`):

* attention, self-attention without a mask and without the weights returned, head size a
  multiple of 8: the QKV projection (one addmm), fused SDPA, the output projection;
* otherwise: the QKV GEMM, one kernel adding the bias into q, k, v (`_transform_bias_rescale_qkv`),
  Q·Kᵀ (bmm), softmax, attn·V (bmm), a copy back to (batch, token, head) order, the output addmm,
  and, when the weights are returned averaged, their sum over heads and a division;
* the encoder layer: that attention, an in-place residual add, layer norm, the first FFN GEMM with
  its bias and activation in the epilogue (`_addmm_activation`), the second, the residual add and
  layer norm (pre-norm moves the norms as torch does).

Not modelled: a key-padding mask turns the input into a nested tensor in nn.TransformerEncoder,
which then skips the padded tokens; how many there are depends on the data, so the capture costs
every token. The masked softmax's read of the mask (one byte a token) is left out.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


def _first(checks) -> str:
    """The first reason whose check holds, in torch's order ("" if none does)."""
    return next((why for why, bad in checks if bad()), "")


def why_not_encoder(layer: nn.TransformerEncoderLayer, src, user_hooks: bool = False) -> str:
    """Why torch's TransformerEncoderLayer.forward would not take its fast path ("" if it
    would). The device, the capture's own hooks and its torch-function mode are not reasons:
    they are the capture's, not the model's; nor are the masks, which only matter to torch for a
    nested-tensor input. user_hooks: the user's own hooks on the layer."""
    sa = layer.self_attn
    return _first((
        ("torch.backends.mha fast path disabled", lambda: not torch.backends.mha.get_fastpath_enabled()),
        (f"input not batched (src.dim() is {src.dim()})", lambda: src.dim() != 3),
        ("training is enabled", lambda: layer.training),
        ("self_attn.batch_first was not True", lambda: not sa.batch_first),
        ("self_attn was passed bias=False", lambda: sa.in_proj_bias is None),
        ("self_attn._qkv_same_embed_dim was not True", lambda: not sa._qkv_same_embed_dim),
        ("the activation is neither relu nor gelu", lambda: not layer.activation_relu_or_gelu),
        ("norm1.eps is not equal to norm2.eps", lambda: layer.norm1.eps != layer.norm2.eps),
        ("num_heads is odd", lambda: sa.num_heads % 2 == 1),
        ("autocast is enabled", torch.is_autocast_enabled),
        ("forward pre-/hooks are attached to the module", lambda: user_hooks),
        ("grad is enabled and a weight requires grad",
         lambda: torch.is_grad_enabled() and any(p.requires_grad for p in layer.parameters())),
    ))


def why_not_mha(mha: nn.MultiheadAttention, query, key, value, key_padding_mask=None,
                attn_mask=None) -> str:
    """Why torch's MultiheadAttention.forward would not take its fast path ("" if it would),
    the capture's own device and torch-function mode aside."""
    def float_mask():
        return any(m is not None and torch.is_floating_point(m)
                   for m in (attn_mask, key_padding_mask))

    def grad():
        tensors = (query, mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight,
                   mha.out_proj.bias)
        return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)

    return _first((
        ("floating-point masks are not supported for fast path", float_mask),
        ("torch.backends.mha fast path disabled", lambda: not torch.backends.mha.get_fastpath_enabled()),
        (f"input not batched (query.dim() is {query.dim()})", lambda: query.dim() != 3),
        ("not self-attention (query, key and value differ)",
         lambda: query is not key or key is not value),
        ("query and in_proj_bias have different dtypes",
         lambda: mha.in_proj_bias is not None and query.dtype != mha.in_proj_bias.dtype),
        ("in_proj_weight was None", lambda: mha.in_proj_weight is None),
        ("query and in_proj_weight have different dtypes",
         lambda: query.dtype != mha.in_proj_weight.dtype),
        ("training is enabled", lambda: mha.training),
        ("num_heads is not even", lambda: mha.num_heads % 2 != 0),
        ("batch_first was not True", lambda: not mha.batch_first),
        ("bias_k/bias_v were given", lambda: mha.bias_k is not None or mha.bias_v is not None),
        ("add_zero_attn was enabled", lambda: mha.add_zero_attn),
        ("_qkv_same_embed_dim was not True", lambda: not mha._qkv_same_embed_dim),
        ("autocast is enabled", torch.is_autocast_enabled),
        ("grad is enabled and a weight requires grad", grad),
        ("bias=False", lambda: mha.in_proj_bias is None),  # torch then runs the slow path too
    ))


def native_mha(x, mha: nn.MultiheadAttention, mask=None, need_weights: bool = False,
               average: bool = True):
    """The kernels of torch's native self-attention on x (batch, tokens, embed): (out, weights)."""
    b, t, e = x.shape
    h = mha.num_heads
    d = e // h
    if mask is None and not need_weights and d % 8 == 0:  # the SDPA path
        qkv = F.linear(x, mha.in_proj_weight, mha.in_proj_bias)
        q, k, v = (c.view(b, t, h, d).transpose(1, 2) for c in qkv.chunk(3, -1))
        y = F.scaled_dot_product_attention(q, k, v)  # the capture routes it to a fused kernel
        y = y.transpose(1, 2).reshape(b, t, e)
        return F.linear(y, mha.out_proj.weight, mha.out_proj.bias), None
    qkv = torch.mm(x.reshape(b * t, e), mha.in_proj_weight.t())
    heads = torch.empty(3, b, h, t, d, dtype=x.dtype, device=x.device)
    torch.add(qkv.view(b, t, 3, h, d).permute(2, 0, 3, 1, 4),
              mha.in_proj_bias.view(3, 1, h, 1, d), out=heads)  # the bias: one kernel
    q, k, v = (heads[i].reshape(b * h, t, d) for i in range(3))
    scores = torch.empty(b * h, t, t, dtype=x.dtype, device=x.device)
    # torch scales q in the bias kernel; here the GEMM's alpha does it (the same kernels)
    scores = torch.baddbmm(scores, q, k.transpose(1, 2), beta=0, alpha=d ** -0.5)
    attn = torch.softmax(scores, -1)
    ctx = torch.bmm(attn, v).view(b, h, t, d).transpose(1, 2).contiguous()  # transform_0213
    out = torch.addmm(mha.out_proj.bias, ctx.view(b * t, e), mha.out_proj.weight.t())
    weights = None
    if need_weights:
        weights = attn.view(b, h, t, t)
        if average:
            weights = weights.sum(1)
            weights.div_(h)
    return out.view(b, t, e), weights


def _merged(mha: nn.MultiheadAttention, attn_mask, key_padding_mask, query):
    """The one mask torch's native attention gets: both masks made float as torch's forward
    makes them (F._canonical_mask), then merged by the module (merge_masks)."""
    kpm = F._canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                            other_type=F._none_or_dtype(attn_mask), other_name="attn_mask",
                            target_type=query.dtype)
    am = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None,
                           other_name="", target_type=query.dtype, check_other=False)
    return mha.merge_masks(am, kpm, query)[0]


def encoder_layer(layer: nn.TransformerEncoderLayer, src, mask, rec, names: dict):
    """torch's transformer_encoder_layer_forward, kernel by kernel."""
    def at(mod):
        return rec.within(names.get(id(mod), rec.stack[-1]))

    def norm(mod, x):
        with at(mod):
            return F.layer_norm(x, mod.normalized_shape, mod.weight, mod.bias, mod.eps)

    b, t, e = src.shape
    x = norm(layer.norm1, src) if layer.norm_first else src
    with at(layer.self_attn):
        x = native_mha(x, layer.self_attn, mask)[0]
    x.add_(src)
    if not layer.norm_first:
        x = norm(layer.norm1, x)
    residual = x
    if layer.norm_first:
        x = norm(layer.norm2, x)
    with at(layer.linear1):
        x = torch._addmm_activation(layer.linear1.bias, x.reshape(b * t, e),
                                    layer.linear1.weight.t(),
                                    use_gelu=layer.activation_relu_or_gelu == 2)
    with at(layer.linear2):
        x = torch.addmm(layer.linear2.bias, x, layer.linear2.weight.t()).view(b, t, e)
    x.add_(residual)
    return norm(layer.norm2, x) if not layer.norm_first else x


@contextmanager
def swapped(model: nn.Module, rec, names: dict, taken: Counter, declined: Counter):
    """For one inference capture: the encoder layers and attention modules of `model` run
    torch's fast path where torch would take it. `taken` counts them by class, `declined`
    counts the reasons torch would give for the slow path."""
    patched = []

    def encoder_forward(layer, hooked):
        slow = layer.forward

        def forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False):
            why = why_not_encoder(layer, src, hooked)
            if why:
                declined[f"{type(layer).__name__}: {why}"] += 1
                return slow(src, src_mask, src_key_padding_mask, is_causal=is_causal)
            taken[type(layer).__name__] += 1
            mask = _merged(layer.self_attn, src_mask, src_key_padding_mask, src)
            return encoder_layer(layer, src, mask, rec, names)
        return forward

    def mha_forward(mha):
        slow = mha.forward

        def forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                    average_attn_weights=True, is_causal=False):
            why = why_not_mha(mha, query, key, value, key_padding_mask, attn_mask)
            if why:
                declined[f"{type(mha).__name__}: {why}"] += 1
                return slow(query, key, value, key_padding_mask=key_padding_mask,
                            need_weights=need_weights, attn_mask=attn_mask,
                            average_attn_weights=average_attn_weights, is_causal=is_causal)
            taken[type(mha).__name__] += 1
            mask = _merged(mha, attn_mask, key_padding_mask, query)
            return native_mha(query, mha, mask, need_weights, average_attn_weights)
        return forward

    for mod in model.modules():
        if "forward" in vars(mod):  # the user replaced this instance's forward: leave it
            continue
        if isinstance(mod, nn.TransformerEncoderLayer):
            hooked = any(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in mod.modules())
            mod.forward = encoder_forward(mod, hooked)
        elif isinstance(mod, nn.MultiheadAttention):
            mod.forward = mha_forward(mod)
        else:
            continue
        patched.append(mod)
    try:
        yield
    finally:
        for mod in patched:
            del mod.forward
