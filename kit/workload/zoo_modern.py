"""The zoo's Llama-style decoder (RMSNorm, RoPE, SwiGLU, grouped-query SDPA) and its
mixture-of-experts variants (Mixtral, Qwen2-MoE, Qwen3-MoE: top-k experts as HF transformers 5
runs them, kit.workload.zoo_experts). The Switch Transformer and T5 are in kit.workload.zoo_t5,
DLRM in kit.workload.zoo_dlrm.

The Llama-style decoder also builds the families that differ from Llama only in a few places, as
HF's modeling files write them (transformers/models/<family>):
* qwen2: biases on the q, k and v projections;
* qwen3: no biases, an RMSNorm over each head of q and k before RoPE (q_norm, k_norm);
* gemma: a GeGLU MLP (gelu, tanh approximation), head_dim of its own (256 on Gemma-7B: 16 heads
  of 256 over a 3072 model), the embedding scaled by sqrt(hidden), RMSNorm scaling by (1 + w)
  in fp32, the LM head tied to the embedding;
* phi3: the q, k, v projections fused into one qkv_proj (sliced apart), gate and up into one
  gate_up_proj; RoPE on a head's first head_dim x partial_rotary_factor dimensions, the rest
  passed and joined back by a cat;
* gemma2: Gemma with a norm after attention and around the MLP (four a layer), attention logits
  soft-capped (tanh(w / 50) * 50), which SDPA cannot do, so HF runs it eagerly (matmul, scale,
  the cap, an additive causal mask, an fp32 softmax, matmul, with the KV heads repeated), and
  the final logits soft-capped too; scaled by query_pre_attn_scalar^-0.5;
* gemma3_text: Gemma 2's four norms with Qwen3's q/k norms, SDPA without soft-capping;
their sliding-window layers attend as HF 5 runs them under SDPA: with is_causal while the
sequence is shorter than the window, and from the window on with a boolean window mask, built
once a forward, which keeps SDPA from skipping the causal half (the full square is computed);
Gemma 2's eager attention computes the full square either way. Any of them ties the LM head to
the embedding with tie_word_embeddings (the same GEMM, one weight fewer in memory and in the
optimizer). llama's attention_bias adds biases to all four
projections (Qwen3's and Gemma's too; Mistral, Mixtral, Qwen2 and Phi-3 ignore it, as HF does),
llama's mlp_bias to the MLP's three.

"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kit.workload.hf_masks import causal_prefill_keys, decode_mask
from kit.workload.kv_cache import cache_update, check_decode_step, make_cache
# sliding_windows: re-exported, kit.workload.generation and the tests import it from here
from kit.workload.modes import TIED_BY_DEFAULT, linear_biases, sliding_windows  # noqa: F401
from kit.workload.zoo_configs import HF_DEFAULTS, hf_value
from kit.workload.zoo_experts import OaiMoE, TopKMoE, activate


def _ids(batch: int, seq: int) -> torch.Tensor:
    return torch.zeros(batch, seq, dtype=torch.long, device="meta")


class RMSNorm(nn.Module):
    """HF LlamaRMSNorm / T5LayerNorm, eager: fp32 variance, rsqrt, scale. offset (Gemma): scale
    by (1 + weight) in fp32, then cast. scale_fp32 (GPT-OSS): the weight times the fp32 value,
    then cast."""

    def __init__(self, d: int, eps: float = 1e-6, offset: bool = False, scale_fp32: bool = False):
        super().__init__()
        self.weight, self.eps, self.offset = nn.Parameter(torch.empty(d)), eps, offset
        self.scale_fp32 = scale_fp32

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (x * (1.0 + self.weight.float())).to(dtype)
        if self.scale_fp32:
            return (self.weight * x).to(dtype)
        return self.weight * x.to(dtype)


GEMMA = ("gemma", "gemma2", "gemma3_text")
QWEN_MOE = ("qwen2_moe", "qwen3_moe")
SANDWICH = ("gemma2", "gemma3_text")  # a norm before and after attention and the MLP


def _family(c) -> str:
    return c.get("model_type", "llama")


def _gemma(c) -> bool:
    return _family(c) in GEMMA


def head_dim_of(c) -> int:
    """The attention head's width: head_dim; where the config leaves it out, HF's default for the
    family (zoo_configs.HF_DEFAULTS: Qwen3 128, Gemma 256, GPT-OSS 64); else, or where it is null,
    hidden_size / num_attention_heads (HF's LlamaConfig, MistralConfig, MixtralConfig read null
    so; a null had failed the build with "unsupported operand type(s) for *: 'int' and 'NoneType'")."""
    return hf_value(c, "head_dim") or c["hidden_size"] // c["num_attention_heads"]


def kv_heads_of(c) -> int:
    """Key/value heads: num_key_value_heads; where the config leaves it out, HF's default for the
    family (Mistral and Mixtral 8, Qwen2 32, Gemma 16, ...: zoo_configs.HF_DEFAULTS); else, or
    where it is null, one a query head (HF's configs read null as multi-head attention)."""
    return hf_value(c, "num_key_value_heads") or c["num_attention_heads"]


def _norm(c, d: int) -> RMSNorm:
    return RMSNorm(d, c.get("rms_norm_eps", 1e-6 if _gemma(c) else 1e-5), offset=_gemma(c),
                   scale_fp32=_family(c) == "gpt_oss")


def rope_tables(inv_freq, past: int, s: int, like, halves: bool = False):
    """The rotary cos and sin, (1, 1, s, 2 * len(inv_freq)) in like's dtype, for positions
    past .. past + s - 1, as HF's rotary embedding computes them. halves (GPT-OSS): one copy of
    the frequencies, (1, 1, s, len(inv_freq)), times YaRN's attention scaling, as its rotary
    embedding returns them."""
    pos = (torch.arange(past, past + s, device=like.device, dtype=torch.float32) if past else
           torch.arange(s, device=like.device, dtype=torch.float32))
    freqs = torch.outer(pos, inv_freq.float())
    if halves:  # times YaRN's attention factor, a scalar (its value changes no cost)
        return ((freqs.cos() * 1.0).to(like.dtype)[None, None],
                (freqs.sin() * 1.0).to(like.dtype)[None, None])
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(like.dtype)[None, None], emb.sin().to(like.dtype)[None, None]


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_part(x, cos, sin):
    """HF Phi-3's rotary: the first cos.shape[-1] dimensions turned, the rest passed, joined by a
    cat (run for a full rotary too, an empty rest: Phi-3-mini). Phi-4-mini's
    partial_rotary_factor 0.75 turns 96 of each head's 128."""
    width = cos.shape[-1]
    turned, rest = x[..., :width], x[..., width:]
    return torch.cat([turned * cos + _rotate_half(turned) * sin, rest], dim=-1)


def rotary_dim(c) -> int:
    """The dimensions of a head that rotary embeddings turn: all but in Phi-3, whose HF model
    turns head_dim x partial_rotary_factor (top-level in a config.json, or in HF 5's
    rope_parameters)."""
    if _family(c) != "phi3":
        return head_dim_of(c)
    factor = c.get("partial_rotary_factor") or (c.get("rope_parameters") or {}).get("partial_rotary_factor")
    return int(head_dim_of(c) * (factor or 1.0))


def _rotate_halves(x, cos, sin):
    """GPT-OSS's rotary: the two halves of x turned by half-width tables, then joined."""
    first, second = torch.chunk(x, 2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def _window_mask(b: int, s: int, w: int, device):
    """HF's sliding-window causal mask for a prefill of s >= w tokens (transformers 5
    masking_utils: once the keys reach the window, SDPA cannot use is_causal and gets this boolean
    mask, so its kernel computes the full square): key j is seen from query i when
    i - w < j <= i. One mask a forward, shared by the sliding layers."""
    pos = torch.arange(s, device=device)
    rel = pos[None, :] - pos[:, None]  # key minus query
    return ((rel <= 0) & (rel > -w))[None, None].expand(b, 1, s, s)


class LlamaAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, family = c["hidden_size"], _family(c)
        self.heads = c["num_attention_heads"]
        self.kv_heads, self.head_dim = kv_heads_of(c), head_dim_of(c)
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        # biases on all four projections, where HF's attention reads attention_bias; Mistral,
        # Mixtral, Qwen2(-MoE) and Phi-3 ignore the key (none; q, k, v for the Qwens: Qwen2's
        # always, Qwen2-MoE's as its qkv_bias says): modes.linear_biases
        qkv_bias, every, _ = linear_biases(c)
        self.fused = self.partial = family == "phi3"
        if self.fused:
            self.qkv_proj = nn.Linear(d, q + 2 * kv, bias=qkv_bias)
        else:
            self.q_proj = nn.Linear(d, q, bias=qkv_bias)
            self.k_proj = nn.Linear(d, kv, bias=qkv_bias)
            self.v_proj = nn.Linear(d, kv, bias=qkv_bias)
        self.o_proj = nn.Linear(q, d, bias=every)
        self.q_norm = self.k_norm = None
        if family in ("qwen3", "qwen3_moe", "gemma3_text"):
            self.q_norm, self.k_norm = _norm(c, self.head_dim), _norm(c, self.head_dim)
        self.scaling = (c.get("query_pre_attn_scalar", self.head_dim) ** -0.5 if family in SANDWICH
                        else self.head_dim ** -0.5 if family == "gpt_oss" else None)
        self.softcap = c.get("attn_logit_softcapping", 50.0) if family == "gemma2" else None
        # GPT-OSS: a learned sink logit per head joins every row's softmax (HF runs it eagerly)
        self.sinks = nn.Parameter(torch.empty(self.heads)) if family == "gpt_oss" else None
        self.eager = self.softcap is not None or self.sinks is not None

    def _eager(self, q, k, v, mask):
        """HF's eager attention (Gemma 2's soft-capped logits): KV heads repeated to the query
        heads, scores, the cap, the additive mask, an fp32 softmax, the weighted sum."""
        rep = self.heads // self.kv_heads
        if rep > 1:
            b, kv, s, d = k.shape
            k = k[:, :, None].expand(b, kv, rep, s, d).reshape(b, kv * rep, s, d)
            v = v[:, :, None].expand(b, kv, rep, s, d).reshape(b, kv * rep, s, d)
        w = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        if self.softcap is not None:
            w = torch.tanh(w / self.softcap) * self.softcap
        if mask is not None:
            w = w + mask
        if self.sinks is not None:  # GPT-OSS: the sinks as one more column, max-shifted, dropped after
            b, h, sq, _ = w.shape
            w = torch.cat([w, self.sinks.reshape(1, -1, 1, 1).expand(b, -1, sq, -1)], dim=-1)
            w = w - w.max(dim=-1, keepdim=True).values
            w = F.softmax(w, dim=-1, dtype=w.dtype)[..., :-1].to(v.dtype)
        else:
            w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(w, v)

    def forward(self, h, cos, sin, cache=None, mask=None):
        b, s, _ = h.shape
        if self.fused:
            # three slices, as HF's Phi3Attention takes them (a split's backward is one cat, the
            # slices' three slice_backward fills and their sum)
            qkv, q_end = self.qkv_proj(h), self.heads * self.head_dim
            k_end = q_end + self.kv_heads * self.head_dim
            q, k, v = qkv[..., :q_end], qkv[..., q_end:k_end], qkv[..., k_end:]
        else:
            q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        q = q.view(b, s, self.heads, self.head_dim)
        k = k.view(b, s, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.sinks is not None:  # GPT-OSS
            q, k = _rotate_halves(q, cos, sin), _rotate_halves(k, cos, sin)
        elif self.partial:  # Phi-3: a head's first rotary_dim dimensions, the rest passed
            q, k = _rotate_part(q, cos, sin), _rotate_part(k, cos, sin)
        else:
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if cache is not None:  # one new token attends to every cached one: no causal mask
            k, v = cache_update(cache, k, v)
        if self.eager:
            a = self._eager(q, k, v, mask)
        elif mask is not None and cache is not None and s == 1 and self.kv_heads != self.heads:
            # a masked decode step (a static cache, a full window): HF's sdpa_attention_forward
            # packs the query heads of a KV head into its rows (pack_gqa) instead of SDPA's
            # enable_gqa, which it keeps for unmasked calls (sdpa_attention.py:42-51, 119-128)
            rows = q.reshape(b, self.kv_heads, self.heads // self.kv_heads, self.head_dim)
            a = F.scaled_dot_product_attention(rows, k, v, attn_mask=mask, scale=self.scaling)
            a = a.reshape(b, self.heads, s, self.head_dim)
        elif mask is not None:  # a sliding window's boolean mask: the full square, no causal skip
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling,
                                               enable_gqa=self.kv_heads != self.heads)
        else:
            # is_causal for several queries unmasked (sdpa_attention.py:149): a prefill, generate's
            # over an empty static cache (its first s rows of the preallocated keys,
            # causal_prefill_keys) or the prompt's rows of a dynamic one (kv_cache.prefill_cache)
            k, v = causal_prefill_keys(q, k, v, s > 1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=s > 1, scale=self.scaling,
                                               enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(a.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    """The gated MLP: down(act(gate(x)) * up(x)); act silu (SwiGLU) or tanh-approximated gelu
    (Gemma's GeGLU); fused (Phi-3): gate and up are one GEMM, split after. bias: on all three
    projections (HF Llama's mlp_bias)."""

    def __init__(self, d: int, ff: int, act: str = "silu", fused: bool = False, bias: bool = False):
        super().__init__()
        if act not in ("silu", "gelu_pytorch_tanh", "gelu"):
            raise ValueError(f"hidden_act {act!r} is not a gated-MLP activation the zoo builds "
                             "(silu, gelu_pytorch_tanh, gelu)")
        self.act, self.fused = act, fused
        if fused:
            self.gate_up_proj = nn.Linear(d, 2 * ff, bias=bias)
        else:
            self.gate_proj, self.up_proj = nn.Linear(d, ff, bias=bias), nn.Linear(d, ff, bias=bias)
        self.down_proj = nn.Linear(ff, d, bias=bias)

    def forward(self, x):
        if self.fused:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(activate(self.act, gate) * up)


def _moe_key(c, key: str, default=None):
    """A MoE key of the config; where it is left out or null, HF's default for its family
    (zoo_configs.HF_DEFAULTS: a Mixtral config without num_local_experts is HF's 8 experts,
    top-2, not a dense model); else default. Qwen-MoE's num_experts has none there: a config
    without it is refused (missing key)."""
    if c.get(key) is not None:
        return c[key]
    return HF_DEFAULTS.get(_family(c), {}).get(key, default)


def _experts(c) -> int:
    """Routed experts a layer has: Mixtral's and GPT-OSS's num_local_experts (HF's default when
    left out), Qwen-MoE's num_experts; 0 (dense) for the other families unless they give
    num_local_experts."""
    if _family(c) in QWEN_MOE:
        return c["num_experts"]
    return _moe_key(c, "num_local_experts", 0)


def sparse_layer(c, i: int) -> bool:
    """Whether layer i's MLP is the MoE: every layer's in Mixtral; in Qwen-MoE (HF's rule) those
    not in mlp_only_layers whose i + 1 is a multiple of decoder_sparse_step."""
    if _family(c) not in QWEN_MOE:
        return True
    return i not in (c.get("mlp_only_layers") or []) and (i + 1) % c.get("decoder_sparse_step", 1) == 0


def _act(c) -> str:
    return c.get("hidden_activation") or c.get("hidden_act") or ("gelu_pytorch_tanh" if _gemma(c) else "silu")


def _mlp_of(c, d: int, ff: int) -> SwiGLU:
    # mlp_bias: only HF's LlamaMLP reads it (the other families' MLPs have no biases); it had been
    # dropped, Llama-3-8B's layers 2 x 14,336 + 4,096 parameters short each and their bias grads
    return SwiGLU(d, ff, _act(c), fused=_family(c) == "phi3", bias=linear_biases(c)[2])


class LlamaLayer(nn.Module):
    def __init__(self, c, moe: bool):
        super().__init__()
        d, ff = c["hidden_size"], c["intermediate_size"]
        self.input_layernorm, self.post_attention_layernorm = _norm(c, d), _norm(c, d)
        self.sandwich = _family(c) in SANDWICH
        if self.sandwich:
            self.pre_feedforward_layernorm, self.post_feedforward_layernorm = _norm(c, d), _norm(c, d)
        self.self_attn = LlamaAttention(c)
        self.moe = moe
        if moe and _family(c) == "gpt_oss":
            self.mlp = OaiMoE(d, _experts(c), _moe_key(c, "num_experts_per_tok"), ff,
                              c.get("experts_implementation") or "grouped_mm",
                              c.get("swiglu_alpha", 1.702), c.get("swiglu_limit", 7.0))
        elif moe:
            shared_ff = _moe_key(c, "shared_expert_intermediate_size")
            shared = _mlp_of(c, d, shared_ff) if shared_ff else None
            self.mlp = TopKMoE(d, _experts(c), _moe_key(c, "num_experts_per_tok", 2),
                               _moe_key(c, "moe_intermediate_size", ff), _act(c),
                               c.get("experts_implementation") or "grouped_mm",
                               c.get("norm_topk_prob", _family(c) not in QWEN_MOE),
                               cast=_family(c) in QWEN_MOE, shared=shared)
        else:
            self.mlp = _mlp_of(c, d, ff)

    def forward(self, h, cos, sin, cache=None, mask=None):
        a = self.self_attn(self.input_layernorm(h), cos, sin, cache, mask)
        if self.sandwich:  # Gemma 2/3: the norms also close attention and the MLP
            h = h + self.post_attention_layernorm(a)
            return h + self.post_feedforward_layernorm(self._mlp(self.pre_feedforward_layernorm(h), cache))
        h = h + a
        return h + self._mlp(self.post_attention_layernorm(h), cache)

    def _mlp(self, x, cache):
        """The MLP; an MoE's decode step (a forward with a cache) runs as HF's generate runs it."""
        return self.mlp(x, decode=cache is not None and not cache.prefill) if self.moe else self.mlp(x)


class LlamaForCausalLM(nn.Module):
    """Llama-style decoder; Mixtral-style MoE layers for mixtral and gpt_oss (HF's expert count
    when the config leaves it out) or any config with "num_local_experts", Qwen-MoE's for its own;
    Qwen2, Qwen3, Gemma (1, 2, 3) and Phi-3 by their model_type (the module docstring)."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        d = c["hidden_size"]
        self.head_dim = head_dim_of(c)
        self.theta = c.get("rope_theta", 10000.0)
        self.embed_tokens = nn.Embedding(c["vocab_size"], d)
        moe = bool(_experts(c))
        self.layers = nn.ModuleList(LlamaLayer(c, moe and sparse_layer(c, i))
                                    for i in range(c["num_hidden_layers"]))
        self.norm = _norm(c, d)
        self.lm_head = nn.Linear(d, c["vocab_size"], bias=False)
        if c.get("tie_word_embeddings", _family(c) in TIED_BY_DEFAULT):  # as GPTSpec.tied reads it
            self.lm_head.weight = self.embed_tokens.weight
        self.scale = d ** 0.5 if _gemma(c) else None
        # soft-capped (Gemma 2) and sink (GPT-OSS) attention run eagerly, on an explicit mask
        self.eager = _family(c) in ("gemma2", "gpt_oss")
        if _family(c) == "gpt_oss":  # HF keeps the norms in fp32 in an fp16 model
            self._keep_in_fp32_modules = ["post_attention_layernorm", "input_layernorm", "norm"]
        self.final_softcap = (c.get("final_logit_softcapping", 30.0) if _family(c) == "gemma2"
                              else c.get("final_logit_softcapping"))
        self.register_buffer("inv_freq", torch.empty(rotary_dim(c) // 2), persistent=False)
        self.windows = sliding_windows(c)

    def forward(self, input_ids, kv_cache=None):
        b, s = input_ids.shape
        past = check_decode_step(kv_cache, s)
        h = self.embed_tokens(input_ids)
        if self.scale is not None:  # Gemma: the embedding times sqrt(hidden), in its dtype
            h = h * torch.tensor(self.scale, dtype=h.dtype)
        cos, sin = rope_tables(self.inv_freq, past, s, h, halves=_family(self.config) == "gpt_oss")
        if kv_cache is None:
            mask = (torch.full((s, s), float("-inf"), dtype=h.dtype, device=h.device).triu(1)[None, None]
                    if self.eager else None)
            window = None
            for layer, w in zip(self.layers, self.windows):
                if w and s >= w and not self.eager and window is None:
                    window = _window_mask(b, s, w, h.device)
                h = layer(h, cos, sin, mask=window if w and s >= w and not self.eager else mask)
        else:
            # no model-wide cache_position: HF 5.25's cache layers make their own positions
            # (kit.workload.kv_cache.hf_static_update), and generate passes position_ids
            masks = {}  # HF builds one mask a forward for each kind of layer (full, sliding)
            for i, layer in enumerate(self.layers):
                h = layer(h, cos, sin, kv_cache[i],
                          decode_mask(masks, kv_cache[i], self.windows[i], h, self.eager))
        logits = self.lm_head(self.norm(h))
        if self.final_softcap:  # Gemma 2: tanh(logits / cap) * cap
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    def example_inputs(self, batch, seq):
        return (_ids(batch, seq),)

    def decode_inputs(self, batch, context, cache="static", capacity=None):
        """One new token a sequence and the cache of `context` tokens (capacity: a static
        cache's preallocated length, kit.workload.kv_cache.make_cache)."""
        c = self.config
        return (_ids(batch, 1), make_cache(cache, batch, c["num_hidden_layers"], kv_heads_of(c), context,
                                           self.head_dim, sliding_windows(c), capacity=capacity))
