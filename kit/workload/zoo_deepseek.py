"""The zoo's DeepSeek-V3 (model_type deepseek_v3), as HF's DeepseekV3ForCausalLM runs it eagerly.

* Multi-head latent attention (DeepSeek-AI, "DeepSeek-V2", arXiv:2405.04434): q through a low-rank
  pair (q_a_proj, RMSNorm, q_b_proj; or one q_proj without q_lora_rank); keys and values from
  one shared compressed vector (kv_a_proj_with_mqa, RMSNorm, kv_b_proj) plus a rotary part
  (qk_rope_head_dim) shared by the heads; the query and key heads are qk_nope + qk_rope wide, the
  value heads v_head_dim. HF 5 caches the compressed vector and the rotary key (kv_lora_rank +
  qk_rope_head_dim a token and layer) and expands them after the cache, so a decode step runs
  kv_b_proj over every cached token, and generate's prefill over all the cache returns (a static
  cache's whole preallocated length, its empty rows too); so does this model.
* Mixture of experts from layer first_k_dense_replace on: n_routed_experts of width
  moe_intermediate_size behind a sigmoid router with group-limited top-k (n_group, topk_group),
  plus n_shared_experts fused into one MLP that every token goes through, added ungated;
  the first layers are dense (intermediate_size). The experts run as HF 5 runs them
  (kit.workload.zoo_experts: grouped_mm, batched_mm in a decode step).

A key a config leaves out takes HF's DeepseekV3Config default (DEFAULTS: first_k_dense_replace 3,
n_group 8, topk_group 4, routed_scaling_factor 2.5, q_lora_rank 1536, ...); an explicit null
q_lora_rank means one q_proj. The attention kernel costs the values on their own head size (128
against the queries' 192 on V3). The multi-token-prediction module is not built (HF's model has
none).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kit.workload.hf_masks import decode_mask
from kit.workload.kv_cache import cache_update, check_decode_step, make_cache
from kit.workload.zoo_experts import TopKMoE
from kit.workload.zoo_models import hf_decode_attention
from kit.workload.zoo_modern import RMSNorm, SwiGLU, _ids, _rotate_half, rope_tables

# HF transformers' DeepseekV3Config defaults for the keys that shape the model
DEFAULTS = {"first_k_dense_replace": 3, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
            "q_lora_rank": 1536, "n_shared_experts": 1, "num_experts_per_tok": 8,
            "n_routed_experts": 256, "moe_intermediate_size": 2048, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}


def _get(c, key):
    return c[key] if key in c else DEFAULTS[key]


class MLAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, eps = c["hidden_size"], c.get("rms_norm_eps", 1e-6)
        self.heads = c["num_attention_heads"]
        self.nope, self.rope = _get(c, "qk_nope_head_dim"), _get(c, "qk_rope_head_dim")
        self.v_dim, self.rank = _get(c, "v_head_dim"), _get(c, "kv_lora_rank")
        self.qk_dim = self.nope + self.rope
        bias = bool(c.get("attention_bias", False))
        q_rank = _get(c, "q_lora_rank")
        if q_rank:
            self.q_a_proj = nn.Linear(d, q_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(q_rank, eps)
            self.q_b_proj = nn.Linear(q_rank, self.heads * self.qk_dim, bias=False)
        else:
            self.q_proj = nn.Linear(d, self.heads * self.qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, self.rank + self.rope, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.rank, eps)
        self.kv_b_proj = nn.Linear(self.rank, self.heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.heads * self.v_dim, d, bias=bias)

    def forward(self, h, cos, sin, cache=None, mask=None):
        b, s, _ = h.shape
        q = (self.q_b_proj(self.q_a_layernorm(self.q_a_proj(h))) if hasattr(self, "q_a_proj")
             else self.q_proj(h))
        q = q.view(b, s, self.heads, self.qk_dim).transpose(1, 2)
        q_pass, q_rot = torch.split(q, [self.nope, self.rope], dim=-1)
        latent, k_rot = torch.split(self.kv_a_proj_with_mqa(h), [self.rank, self.rope], dim=-1)
        latent = self.kv_a_layernorm(latent).view(b, 1, s, self.rank)  # one "head" each, as HF
        k_rot = k_rot.view(b, 1, s, self.rope)
        q_rot, k_rot = q_rot * cos + _rotate_half(q_rot) * sin, k_rot * cos + _rotate_half(k_rot) * sin
        if cache is not None:  # the cache holds the compressed latent and the rotary key
            latent, k_rot = cache_update(cache, latent, k_rot)
        q = torch.cat((q_pass, q_rot), dim=-1)
        k, v = self._expand(latent, k_rot)
        if cache is not None:  # a decode step or generate's prefill, as HF 5.25 runs it
            # (modeling_deepseek_v3.py:441-466: the cache updated with the compressed latents,
            # then expand_kv over all it returns, a static cache's whole preallocated length)
            return self.o_proj(hf_decode_attention(q, k, v, mask, self.qk_dim ** -0.5))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.qk_dim ** -0.5)
        return self.o_proj(a.transpose(1, 2).reshape(b, s, -1))

    def _expand(self, latent, k_rot):
        """Keys and values of every head from the latent (kv_b_proj over all cached tokens), the
        shared rotary key copied to each head, as HF 5's expand_kv does after the cache."""
        b, _, length, _ = latent.shape
        kv = self.kv_b_proj(latent).view(b, length, self.heads, self.nope + self.v_dim).transpose(1, 2)
        k_pass, v = torch.split(kv, [self.nope, self.v_dim], dim=-1)
        k = kv.new_empty(b, self.heads, length, self.qk_dim)
        k[..., :self.nope].copy_(k_pass)
        k[..., self.nope:].copy_(k_rot.expand(-1, self.heads, -1, -1))
        return k, v


class DeepseekMoE(TopKMoE):
    """Sigmoid router with a per-expert correction bias and group-limited top-k (HF's
    DeepseekV3TopkRouter), the routed experts, and the shared experts added ungated."""

    def __init__(self, c):
        d, e = c["hidden_size"], _get(c, "n_routed_experts")
        width, n_shared = _get(c, "moe_intermediate_size"), _get(c, "n_shared_experts")
        shared = SwiGLU(d, width * n_shared) if n_shared else None
        super().__init__(d, e, _get(c, "num_experts_per_tok"), width,
                         implementation=c.get("experts_implementation") or "grouped_mm",
                         shared=shared, gated_shared=False)
        self.groups, self.top_groups = _get(c, "n_group"), _get(c, "topk_group")
        if e % self.groups or self.top_groups > self.groups or (self.groups > 1 and e // self.groups < 2):
            raise ValueError(f"{e} experts do not split into n_group {self.groups} groups of two or "
                             f"more of which topk_group {self.top_groups} are kept")
        self.scale = _get(c, "routed_scaling_factor")
        self.register_buffer("e_score_correction_bias", torch.empty(e), persistent=False)

    def route(self, x):
        e = self.experts.num_experts
        scores = torch.sigmoid(F.linear(x.float(), self.gate.weight.float()))
        choice = scores + self.e_score_correction_bias
        if self.groups > 1:  # keep the topk_group groups whose two best experts score highest
            best = choice.view(-1, self.groups, e // self.groups).topk(2, dim=-1)[0].sum(dim=-1)
            keep = torch.zeros_like(best).scatter_(1, torch.topk(best, self.top_groups, dim=-1)[1], 1)
            keep = keep.unsqueeze(-1).expand(-1, self.groups, e // self.groups).reshape(-1, e)
            choice = choice.masked_fill(~keep.bool(), 0.0)
        index = torch.topk(choice, self.top_k, dim=-1)[1]
        weights = scores.gather(1, index)
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * self.scale
        return weights, index  # fp32, as HF's router leaves them


class DeepseekLayer(nn.Module):
    def __init__(self, c, moe: bool):
        super().__init__()
        d, eps = c["hidden_size"], c.get("rms_norm_eps", 1e-6)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.self_attn = MLAttention(c)
        self.mlp = DeepseekMoE(c) if moe else SwiGLU(d, c["intermediate_size"])

    def forward(self, h, cos, sin, cache=None, mask=None):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, cache, mask)
        x = self.post_attention_layernorm(h)
        # an MoE's decode step (a forward with a cache, not generate's prefill) runs as HF's
        # generate runs it
        decode = cache is not None and not cache.prefill
        return h + (self.mlp(x, decode=decode) if isinstance(self.mlp, DeepseekMoE) else self.mlp(x))


class DeepseekV3ForCausalLM(nn.Module):
    # HF keeps the router in fp32 whatever the model's dtype (the capture reads this, as HF does)
    _keep_in_fp32_modules_strict = ["e_score_correction_bias", "gate.weight"]

    def __init__(self, c):
        super().__init__()
        self.config = c
        d = c["hidden_size"]
        dense = _get(c, "first_k_dense_replace")
        self.embed_tokens = nn.Embedding(c["vocab_size"], d)
        self.layers = nn.ModuleList(DeepseekLayer(c, i >= dense)
                                    for i in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(d, c.get("rms_norm_eps", 1e-6))
        self.lm_head = nn.Linear(d, c["vocab_size"], bias=False)
        self.register_buffer("inv_freq", torch.empty(_get(c, "qk_rope_head_dim") // 2), persistent=False)

    def forward(self, input_ids, kv_cache=None):
        b, s = input_ids.shape
        past = check_decode_step(kv_cache, s)
        h = self.embed_tokens(input_ids)
        cos, sin = rope_tables(self.inv_freq, past, s, h)
        masks = {}  # one mask a step (create_causal_mask, modeling_deepseek_v3.py:593)
        for i, layer in enumerate(self.layers):
            cache = kv_cache[i] if kv_cache is not None else None
            h = layer(h, cos, sin, cache, None if cache is None else decode_mask(masks, cache, 0, h))
        return self.lm_head(self.norm(h))

    def example_inputs(self, batch, seq):
        return (_ids(batch, seq),)

    def decode_inputs(self, batch, context, cache="static", capacity=None):
        """HF 5's cache for MLA: a layer keeps the compressed latent (kv_lora_rank) and the shared
        rotary key (qk_rope_head_dim) of each token, one head of each, not per-head keys and
        values."""
        c = self.config
        return (_ids(batch, 1), make_cache(cache, batch, c["num_hidden_layers"], 1, context,
                                           _get(c, "kv_lora_rank"),
                                           value_dim=_get(c, "qk_rope_head_dim"), capacity=capacity))
