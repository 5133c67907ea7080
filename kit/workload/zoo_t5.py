"""The zoo's Switch Transformer (Fedus et al. 2021: T5 blocks with a sparse MLP every other
layer) and the dense T5 it is built on (Raffel et al. 2020), as HF's SwitchTransformers and
T5ForConditionalGeneration run them.

Switch routing has data-dependent shapes, which cannot run on meta tensors. Each expert here
takes its `capacity` tokens, chosen by topk over its router column (expert-choice dispatch), so
the shapes are static and each expert does the work of a capacity-limited token-choice router:
capacity = min(expert_capacity, ceil(tokens·top_k / experts)) per sequence. (The Llama-style and
DeepSeek MoE follow HF 5's experts code instead: kit.workload.zoo_experts.)"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from kit.workload.zoo_models import gelu_new
from kit.workload.zoo_modern import RMSNorm, _ids


class T5LayerNorm(RMSNorm):
    """HF's T5LayerNorm: the variance in fp32, the input scaled in its own dtype, then cast to a
    half-precision weight's dtype (so an fp32 residual stream, as T5 gets behind an fp32 `wo`,
    goes back to fp16 at every norm)."""

    def forward(self, x):
        x = x * torch.rsqrt(x.to(torch.float32).pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return self.weight * x


class ExpertChoiceMoE(nn.Module):
    """Switch's router + experts with static per-expert capacity (the module docstring)."""

    def __init__(self, d: int, experts: nn.ModuleList, top_k: int, capacity: int | None):
        super().__init__()
        self.gate = nn.Linear(d, len(experts), bias=False)
        self.experts, self.top_k, self.capacity = experts, top_k, capacity

    def forward(self, x):
        shape = x.shape
        b, s = shape[0], shape[1]
        x = x.reshape(-1, shape[-1])
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        e = len(self.experts)
        cap = math.ceil(s * self.top_k / e)
        cap = min(b * min(cap, self.capacity) if self.capacity else b * cap, x.shape[0])
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            weight, idx = torch.topk(probs[:, i], cap)
            y = expert(x.index_select(0, idx)) * weight.to(x.dtype).unsqueeze(-1)
            out.index_add_(0, idx, y)
        return out.view(shape)


class T5Attention(nn.Module):
    def __init__(self, c, causal: bool, bias: bool):
        super().__init__()
        d, self.heads, self.d_kv = c["d_model"], c["num_heads"], c["d_kv"]
        inner = self.heads * self.d_kv
        self.q, self.k, self.v = (nn.Linear(d, inner, bias=False) for _ in range(3))
        self.o = nn.Linear(inner, d, bias=False)
        self.causal, self.dropout = causal, c.get("dropout_rate", 0.1)
        # T5 as HF 5 runs it: SDPA with the position bias as a float mask (its memory-efficient
        # kernel); the Switch Transformer as NeuSight's labels ran it under HF 4: eager
        self.sdpa = c.get("model_type") == "t5"
        self.buckets = c.get("relative_attention_num_buckets", 32)
        self.relative_attention_bias = nn.Embedding(self.buckets, self.heads) if bias else None

    def position_bias(self, s: int, dev):
        ctx = torch.arange(s, dtype=torch.long, device=dev)[:, None]
        rel = torch.arange(s, dtype=torch.long, device=dev)[None, :] - ctx
        rel = torch.abs(rel) if not self.causal else -torch.min(rel, torch.zeros_like(rel))
        large = (torch.log(rel.float().clamp(min=1) / 8) / math.log(128 / 8) * 8).to(torch.long) + 8
        bucket = torch.where(rel < 8, rel, torch.min(large, torch.full_like(large, self.buckets - 1)))
        return self.relative_attention_bias(bucket).permute(2, 0, 1).unsqueeze(0)

    def forward(self, h, kv=None, bias=None):
        b, s, _ = h.shape
        kv = h if kv is None else kv
        split = lambda t: t.view(b, -1, self.heads, self.d_kv).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(h)), split(self.k(kv)), split(self.v(kv))
        if bias is None and self.relative_attention_bias is not None:
            bias = self.position_bias(s, h.device)
        elif bias is None and kv is not h:  # HF: cross-attention bias = zeros + encoder mask, reused
            bias = torch.zeros(b, self.heads, s, kv.shape[1], dtype=q.dtype, device=q.device)
        if self.sdpa:  # T5 scales nothing: its init folds 1/sqrt(d_kv) into the weights
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=None if bias is None else bias.to(q.dtype),
                                               dropout_p=self.dropout if self.training else 0.0,
                                               scale=1.0)
            return self.o(a.transpose(1, 2).reshape(b, -1, self.heads * self.d_kv)), bias
        w = torch.matmul(q, k.transpose(3, 2))
        if bias is not None:
            w = w + bias
        w = F.dropout(F.softmax(w.float(), dim=-1).type_as(w), p=self.dropout, training=self.training)
        a = torch.matmul(w, v).transpose(1, 2).contiguous().view(b, -1, self.heads * self.d_kv)
        return self.o(a), bias


class T5FF(nn.Module):
    """T5's feed-forward: wo(relu(wi(x))), or with feed_forward_proj "gated-gelu" / "gated-silu"
    (T5 v1.1, Flan-T5) wo(act(wi_0(x)) * wi_1(x)), act gelu_new or silu. HF's T5Config maps
    "gated-gelu" to gelu_new, NewGELUActivation: the tanh formula written out, eight elementwise
    kernels in eager mode, not F.gelu(approximate="tanh")'s one (which had left a Flan-T5 layer's
    FF 7 passes over its [tokens, d_ff] activation short, 14 more in training)."""

    def __init__(self, c):
        super().__init__()
        d, ff = c["d_model"], c["d_ff"]
        proj = c.get("feed_forward_proj", "relu")
        if proj not in ("relu", "gated-gelu", "gated-silu"):
            raise ValueError(f"feed_forward_proj {proj!r} is not one the zoo builds "
                             "(relu, gated-gelu, gated-silu)")
        self.gated = proj.startswith("gated")
        self.act = proj
        if self.gated:
            self.wi_0, self.wi_1 = nn.Linear(d, ff, bias=False), nn.Linear(d, ff, bias=False)
        else:
            self.wi = nn.Linear(d, ff, bias=False)
        self.wo = nn.Linear(ff, d, bias=False)
        self.dropout = nn.Dropout(c.get("dropout_rate", 0.1))

    def forward(self, x):
        if not self.gated:
            h = self.dropout(F.relu(self.wi(x)))
        else:
            g = self.wi_0(x)
            g = gelu_new(g) if self.act == "gated-gelu" else F.silu(g)
            h = self.dropout(g * self.wi_1(x))
        if h.dtype != self.wo.weight.dtype:  # HF keeps wo in fp32 under fp16 and casts into it
            h = h.to(self.wo.weight.dtype)
        return self.wo(h)


class SwitchBlock(nn.Module):
    def __init__(self, c, decoder: bool, sparse: bool, first: bool):
        super().__init__()
        d, eps = c["d_model"], c.get("layer_norm_epsilon", 1e-6)
        self.self_attn, self.ln_self = T5Attention(c, causal=decoder, bias=first), T5LayerNorm(d, eps)
        self.cross_attn = T5Attention(c, False, False) if decoder else None
        self.ln_cross = T5LayerNorm(d, eps) if decoder else None
        if sparse:
            experts = nn.ModuleList(T5FF(c) for _ in range(c["num_experts"]))
            self.mlp = ExpertChoiceMoE(d, experts, 1, c.get("expert_capacity"))
        else:
            self.mlp = T5FF(c)
        self.ln_ff, self.dropout = T5LayerNorm(d, eps), nn.Dropout(c.get("dropout_rate", 0.1))

    def forward(self, h, bias, enc=None, cross_bias=None):
        a, bias = self.self_attn(self.ln_self(h), bias=bias)
        h = h + self.dropout(a)
        if self.cross_attn is not None:
            a, cross_bias = self.cross_attn(self.ln_cross(h), kv=enc, bias=cross_bias)
            h = h + self.dropout(a)
        return h + self.dropout(self.mlp(self.ln_ff(h))), bias, cross_bias


def stack_layers(c: dict) -> tuple[int, int]:
    """The encoder's and decoder's blocks: a num_decoder_layers of null is num_layers, as HF's
    T5 and Switch configs set it (a null had reached range() and 'NoneType' // int)."""
    n_dec = c.get("num_decoder_layers")
    return c["num_layers"], c["num_layers"] if n_dec is None else n_dec


def sparse_steps(c: dict) -> tuple[int, int]:
    """The encoder's and decoder's sparse steps, as HF's SwitchTransformersConfig sets them: a
    stack's step is its layers // num_sparse_*_layers (whose default is 3), a step given outright
    wins (the config's kwargs are set after), and T5 has none. A config of num_layers 12 and
    num_sparse_encoder_layers 12 (every block sparse, step 1) had been built with the default
    step 2: half its experts. HF gives 0 sparse layers the step num_layers, under which its
    i % step == 1 rule still makes block 1 sparse; its comment says it means none, and none is
    built."""
    if c.get("model_type") == "t5":
        return 0, 0
    n_enc, n_dec = stack_layers(c)

    def step(given: str, count: str, layers: int) -> int:
        if c.get(given) is not None:
            return c[given]
        sparse = c.get(count, 3)
        return layers // sparse if sparse else 0

    return (step("encoder_sparse_step", "num_sparse_encoder_layers", n_enc),
            step("decoder_sparse_step", "num_sparse_decoder_layers", n_dec))


def _sparse(i: int, step: int) -> bool:
    """Whether block i of a stack with sparse step `step` has experts, as HF's
    SwitchTransformersStack decides: every step-th block from the second (i % step == 1), every
    block for a step of 1 (Switch-C, Switch-XXL), none for 0."""
    return step > 0 and (step == 1 or i % step == 1)


class SwitchTransformer(nn.Module):
    """Switch Transformer, or with model_type t5 the dense T5 it is built on (no sparse layers;
    the LM head tied to the shared embedding unless tie_word_embeddings is false, and then the
    decoder output scaled by d_model^-0.5 as HF's T5ForConditionalGeneration does)."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        d = c["d_model"]
        t5 = c.get("model_type") == "t5"
        # HF's T5 keeps wo in fp32 in an fp16 model (the capture reads this, as HF's loader does)
        self._keep_in_fp32_modules = ["wo"] if t5 else []
        self.shared = nn.Embedding(c["vocab_size"], d)
        n_enc, n_dec = stack_layers(c)
        es, ds = sparse_steps(c)
        self.encoder = nn.ModuleList(SwitchBlock(c, False, _sparse(i, es), i == 0) for i in range(n_enc))
        self.decoder = nn.ModuleList(SwitchBlock(c, True, _sparse(i, ds), i == 0) for i in range(n_dec))
        eps = c.get("layer_norm_epsilon", 1e-6)
        self.enc_ln, self.dec_ln = T5LayerNorm(d, eps), T5LayerNorm(d, eps)
        self.dropout = nn.Dropout(c.get("dropout_rate", 0.1))
        self.lm_head = nn.Linear(d, c["vocab_size"], bias=False)
        # HF ties the head to the shared embedding under tie_word_embeddings (PretrainedConfig's
        # default, true), T5 and Switch alike, and scales the decoder output by d_model^-0.5 then
        # only (NeuSight's L4 switch4 graph: a mul by 0.0361 = 768^-0.5 before lm_head). The
        # Switch head had been scaled but left untied: 24.7M parameters too many for
        # switch-base-4 (768 x 32128), 32.9M for switch-xl4
        self.scaled = bool(c.get("tie_word_embeddings", True))
        if self.scaled:
            self.lm_head.weight = self.shared.weight

    def forward(self, input_ids, decoder_input_ids):
        h, bias = self.dropout(self.shared(input_ids)), None
        for block in self.encoder:
            h, bias, _ = block(h, bias)
        enc = self.dropout(self.enc_ln(h))
        h, bias, cross = self.dropout(self.shared(decoder_input_ids)), None, None
        for block in self.decoder:
            h, bias, cross = block(h, bias, enc, cross)
        h = self.dropout(self.dec_ln(h))
        if self.scaled:
            h = h * (self.config["d_model"] ** -0.5)
        return self.lm_head(h)

    def example_inputs(self, batch, seq):
        return (_ids(batch, seq), _ids(batch, seq))
