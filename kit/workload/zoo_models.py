"""Transformer models of the zoo, in plain torch, written the way HF transformers' eager
implementations run them, so the aten ops (and therefore the kernels) match what a user of those
models launches: GPT-2/GPT-3 (Conv1D addmm, explicit matmul attention with a causal `where`,
the tanh-form "gelu_new" as eight elementwise ops), BERT (BertForPreTraining), OPT, and a
Llama-style decoder (RMSNorm, RoPE, SwiGLU, grouped-query SDPA) with an optional mixture of experts.

Each model takes a config dict (HF key names) and exposes `example_inputs(batch, seq)`. The
decoders (GPT-2/3, OPT, Llama) also take a KV cache and expose `decode_inputs(batch,
context)`: one new token per sequence, with `context` tokens already in the cache
(kit.workload.kv_cache). GPT-2's and OPT's decode steps run as HF transformers 5.25 runs them
(hf_decode_attention: SDPA, its default, under the cache's mask), and so does generate's prefill
(a forward over the prompt with kv_cache.prefill_cache's empty cache, each layer initialising its
cache layer: SDPA is_causal over the first P rows of the preallocated static cache, or over the
prompt's rows concatenated onto an empty dynamic one); their inference without a cache and training run HF 4's
eager attention, as NeuSight's labels were measured.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from kit.errors import KitError
from kit.workload.hf_masks import causal_prefill_keys, decode_mask
from kit.workload.kv_cache import cache_update, check_decode_step, make_cache


def _ids(batch: int, seq: int) -> torch.Tensor:
    return torch.zeros(batch, seq, dtype=torch.long, device="meta")


class Conv1D(nn.Module):
    """GPT-2's linear layer: y = addmm(bias, x, W) with W stored (in, out)."""

    def __init__(self, nf: int, nx: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.empty(nf))

    def forward(self, x):
        shape = x.size()[:-1] + (self.weight.size(-1),)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(shape)


def gelu_new(x):
    """HF NewGELUActivation (tanh approximation), eight elementwise kernels in eager mode."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACT = {"gelu_new": gelu_new, "gelu": F.gelu, "relu": F.relu, "silu": F.silu}


def act_of(c: dict, key: str, default: str):
    """The activation a config names under key (default where it names none); KitError naming
    an unknown one (it had read as the config missing a key of that name)."""
    name = c.get(key, default)
    if not isinstance(name, str) or name not in ACT:
        raise KitError(f"config {key} {name!r} is not one the zoo builds: choose one of {', '.join(ACT)}")
    return ACT[name]


def hf_decode_attention(q, k, v, mask, scale: float):
    """A decode step's attention as HF 5.25 runs GPT-2's, OPT's and DeepSeek-V3's by default:
    sdpa_attention_forward (integrations/sdpa_attention.py:86-176; "sdpa" is the default of a
    model that supports it, modeling_utils.py:1856, and all three set _supports_sdpa). SDPA over
    the keys the cache layer returns (a static cache's whole preallocated tensor) under the
    step's mask (kit.workload.hf_masks.decode_mask; None over a dynamic cache's full layers:
    unmasked, and is_causal False for one query, :140; is_causal for several unmasked, over the
    first q_length keys, hf_masks.causal_prefill_keys), then the heads moved back and made
    contiguous (:173-174): (batch, 1, heads * value dim). The zoo had run GPT-2's and OPT's
    steps with HF 4's eager matmul-softmax-matmul over context + 1 rows, unmasked."""
    # is_causal as sdpa_attention_forward sets it (:149): several queries and no mask (generate's
    # prefill into an empty static or dynamic cache, hf_masks.decode_mask)
    causal = q.size(-2) > 1 and mask is None
    k, v = causal_prefill_keys(q, k, v, causal)
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, is_causal=causal)
    a = a.transpose(1, 2).contiguous()
    return a.reshape(*a.shape[:-2], -1)


# -- GPT-2 / GPT-3 ------------------------------------------------------------------------------
class GPT2Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, n_pos = c["n_embd"], c.get("n_positions", 1024)
        self.heads, self.head_dim = c["n_head"], d // c["n_head"]
        self.register_buffer("bias", torch.empty(1, 1, n_pos, n_pos, dtype=torch.bool), persistent=False)
        self.c_attn, self.c_proj = Conv1D(3 * d, d), Conv1D(d, d)
        self.attn_dropout = nn.Dropout(c.get("attn_pdrop", 0.1))
        self.resid_dropout = nn.Dropout(c.get("resid_pdrop", 0.1))

    def _split(self, t):
        return t.view(t.size()[:-1] + (self.heads, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, h, cache=None, mask=None):
        q, k, v = self.c_attn(h).split(h.size(-1), dim=2)
        q, k, v = self._split(q), self._split(k), self._split(v)
        if cache is not None:  # a decode step or generate's prefill, as HF 5.25 runs it (hf_decode_attention)
            a = hf_decode_attention(q, *cache_update(cache, k, v), mask, self.head_dim ** -0.5)
            return self.resid_dropout(self.c_proj(a))
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        ql, kl = q.size(-2), k.size(-2)
        mask = self.bias[:, :, kl - ql:kl, :kl]
        w = torch.where(mask, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device))
        w = self.attn_dropout(F.softmax(w, dim=-1).type(v.dtype))
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous()
        a = a.view(a.size()[:-2] + (self.heads * self.head_dim,))
        return self.resid_dropout(self.c_proj(a))


class GPT2MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["n_embd"]
        inner = c.get("n_inner") or 4 * d
        self.c_fc, self.c_proj = Conv1D(inner, d), Conv1D(d, inner)
        self.act = act_of(c, "activation_function", "gelu_new")
        self.dropout = nn.Dropout(c.get("resid_pdrop", 0.1))

    def forward(self, h):
        return self.dropout(self.c_proj(self.act(self.c_fc(h))))


class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        eps = c.get("layer_norm_epsilon", 1e-5)
        self.ln_1, self.ln_2 = nn.LayerNorm(c["n_embd"], eps=eps), nn.LayerNorm(c["n_embd"], eps=eps)
        self.attn, self.mlp = GPT2Attention(c), GPT2MLP(c)

    def forward(self, h, cache=None, mask=None):
        h = self.attn(self.ln_1(h), cache, mask) + h
        return h + self.mlp(self.ln_2(h))


class GPT2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["n_embd"]
        self.wte = nn.Embedding(c["vocab_size"], d)
        self.wpe = nn.Embedding(c.get("n_positions", 1024), d)
        self.drop = nn.Dropout(c.get("embd_pdrop", 0.1))
        self.h = nn.ModuleList(GPT2Block(c) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(d, eps=c.get("layer_norm_epsilon", 1e-5))

    def forward(self, input_ids, kv_cache=None):
        shape = input_ids.size()
        input_ids = input_ids.view(-1, shape[-1])
        past = check_decode_step(kv_cache, shape[-1])
        pos = torch.arange(past, past + shape[-1], dtype=torch.long, device=input_ids.device).unsqueeze(0)
        h = self.drop(self.wte(input_ids) + self.wpe(pos))
        masks = {}  # HF 5.25 builds the step's mask once (create_causal_mask)
        for i, block in enumerate(self.h):
            h = block(h) if kv_cache is None else block(h, kv_cache[i],
                                                        decode_mask(masks, kv_cache[i], 0, h))
        return self.ln_f(h).view(shape + (h.size(-1),))


class GPT2LMHeadModel(nn.Module):
    """GPT-2 and GPT-3 (same architecture; GPT-3's sparse attention layers are run dense, as in
    NeuSight's GPT-3 configs)."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.transformer = GPT2Model(c)
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        if c.get("tie_word_embeddings", True):  # HF's default for GPT-2 (and GPTSpec.tied's)
            self.lm_head.weight = self.transformer.wte.weight

    def forward(self, input_ids, kv_cache=None):
        return self.lm_head(self.transformer(input_ids, kv_cache))

    def example_inputs(self, batch, seq):
        return (_ids(batch, seq),)

    def decode_inputs(self, batch, context, cache="static", capacity=None):
        """One new token a sequence and the cache of `context` tokens (capacity: a static
        cache's preallocated length, kit.workload.kv_cache.make_cache)."""
        c = self.config
        return (_ids(batch, 1), make_cache(cache, batch, c["n_layer"], c["n_head"], context,
                                           c["n_embd"] // c["n_head"], capacity=capacity))


# -- BERT ---------------------------------------------------------------------------------------
class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, eps = c["hidden_size"], c.get("layer_norm_eps", 1e-12)
        self.heads, self.head_dim = c["num_attention_heads"], d // c["num_attention_heads"]
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.attn_dropout = nn.Dropout(c.get("attention_probs_dropout_prob", 0.1))
        self.attn_out, self.attn_ln = nn.Linear(d, d), nn.LayerNorm(d, eps=eps)
        self.intermediate = nn.Linear(d, c["intermediate_size"])
        self.act = act_of(c, "hidden_act", "gelu")
        self.output, self.out_ln = nn.Linear(c["intermediate_size"], d), nn.LayerNorm(d, eps=eps)
        self.dropout = nn.Dropout(c.get("hidden_dropout_prob", 0.1))

    def _split(self, t):
        return t.view(t.size()[:-1] + (self.heads, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, h, mask):
        q, k, v = self._split(self.query(h)), self._split(self.key(h)), self._split(self.value(h))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        p = self.attn_dropout(F.softmax(s + mask, dim=-1))
        a = torch.matmul(p, v).permute(0, 2, 1, 3).contiguous()
        a = a.view(a.size()[:-2] + (self.heads * self.head_dim,))
        h = self.attn_ln(self.dropout(self.attn_out(a)) + h)
        return self.out_ln(self.dropout(self.output(self.act(self.intermediate(h)))) + h)


class BertForPreTraining(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        d, eps = c["hidden_size"], c.get("layer_norm_eps", 1e-12)
        self.word_embeddings = nn.Embedding(c["vocab_size"], d)
        self.position_embeddings = nn.Embedding(c.get("max_position_embeddings", 512), d)
        self.token_type_embeddings = nn.Embedding(c.get("type_vocab_size", 2), d)
        self.emb_ln, self.emb_dropout = nn.LayerNorm(d, eps=eps), nn.Dropout(c.get("hidden_dropout_prob", 0.1))
        self.layer = nn.ModuleList(BertLayer(c) for _ in range(c["num_hidden_layers"]))
        self.pooler = nn.Linear(d, d)
        self.transform, self.transform_ln = nn.Linear(d, d), nn.LayerNorm(d, eps=eps)
        self.act = act_of(c, "hidden_act", "gelu")
        self.decoder = nn.Linear(d, c["vocab_size"])
        if c.get("tie_word_embeddings", True):  # HF's default (and GPTSpec.tied's); false: its own
            self.decoder.weight = self.word_embeddings.weight
        else:  # HF 5 ties cls.predictions.bias to the decoder's bias only with the embedding:
            # untied, BertLMPredictionHead keeps both (the forward reads the decoder's alone)
            self.predictions_bias = nn.Parameter(torch.empty(c["vocab_size"]))
        self.seq_relationship = nn.Linear(d, 2)

    def forward(self, input_ids):
        b, s = input_ids.shape
        tt = torch.zeros(b, s, dtype=torch.long, device=input_ids.device)
        pos = torch.arange(s, device=input_ids.device).unsqueeze(0)
        h = self.word_embeddings(input_ids) + self.token_type_embeddings(tt)
        h = self.emb_dropout(self.emb_ln(h + self.position_embeddings(pos)))
        attn = torch.ones(b, s, device=input_ids.device)
        mask = (1.0 - attn[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        for layer in self.layer:
            h = layer(h, mask)
        pooled = torch.tanh(self.pooler(h[:, 0]))
        scores = self.decoder(self.transform_ln(self.act(self.transform(h))))
        return scores, self.seq_relationship(pooled)

    def example_inputs(self, batch, seq):
        return (_ids(batch, seq),)


# -- OPT ----------------------------------------------------------------------------------------
def _affine(c) -> bool:
    return bool(c.get("layer_norm_elementwise_affine", True))


class OPTLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["hidden_size"]
        self.heads, self.head_dim = c["num_attention_heads"], d // c["num_attention_heads"]
        self.scaling = self.head_dim ** -0.5
        # HF's OPTConfig: enable_bias (the six projections' biases) and
        # layer_norm_elementwise_affine (the norms' weight and bias), both true by default
        bias, affine = bool(c.get("enable_bias", True)), _affine(c)
        self.self_attn_layer_norm = nn.LayerNorm(d, elementwise_affine=affine)
        self.final_layer_norm = nn.LayerNorm(d, elementwise_affine=affine)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d, bias=bias)
                                                                for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, c["ffn_dim"], bias=bias), nn.Linear(c["ffn_dim"], d, bias=bias)
        self.act = act_of(c, "activation_function", "relu")
        self.dropout, self.attn_dropout = c.get("dropout", 0.1), c.get("attention_dropout", 0.0)
        self.pre_norm = c.get("do_layer_norm_before", True)  # False: OPT-350m's post-norm layers

    def _shape(self, t, s, b):
        return t.view(b, s, self.heads, self.head_dim).transpose(1, 2).contiguous()

    def forward(self, h, mask, cache=None):
        b, s, d = h.shape
        x = self.self_attn_layer_norm(h) if self.pre_norm else h
        if cache is not None:  # a decode step or generate's prefill, as HF 5.25 runs it (modeling_opt.py:146-181)
            q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2)
                       for t in (self.q_proj(x) * self.scaling, self.k_proj(x), self.v_proj(x)))
            a = hf_decode_attention(q, *cache_update(cache, k, v), mask, 1.0)
            return self._rest(h, a, b, s, d)
        q = self._shape(self.q_proj(x) * self.scaling, s, b).view(b * self.heads, -1, self.head_dim)
        k, v = self._shape(self.k_proj(x), s, b), self._shape(self.v_proj(x), s, b)
        t = k.size(-2)  # keys attended: s
        k, v = k.view(b * self.heads, -1, self.head_dim), v.view(b * self.heads, -1, self.head_dim)
        w = torch.bmm(q, k.transpose(1, 2)).view(b, self.heads, s, t) + mask
        w = torch.max(w, torch.tensor(torch.finfo(w.dtype).min, device=w.device))
        w = F.softmax(w.view(b * self.heads, s, t), dim=-1)
        w = F.dropout(w, p=self.attn_dropout, training=self.training)
        a = torch.bmm(w, v).view(b, self.heads, s, self.head_dim).transpose(1, 2).reshape(b, s, d)
        return self._rest(h, a, b, s, d)

    def _rest(self, h, a, b, s, d):
        """The layer after its attention's output a: out_proj, the residual, the MLP."""
        h = h + F.dropout(self.out_proj(a), p=self.dropout, training=self.training)
        if not self.pre_norm:
            h = self.self_attn_layer_norm(h)
        x = h.reshape(-1, d)
        x = self.final_layer_norm(x) if self.pre_norm else x
        x = F.dropout(self.fc2(self.act(self.fc1(x))), p=self.dropout, training=self.training)
        h = (h.reshape(-1, d) + x).view(b, s, d)
        return h if self.pre_norm else self.final_layer_norm(h)


class OPTForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        d = c["hidden_size"]
        proj = c.get("word_embed_proj_dim") or d  # null: hidden_size, as HF's OPTConfig reads it
        self.embed_tokens = nn.Embedding(c["vocab_size"], proj)
        # embeddings narrower (or wider) than the layers, as HF's OPTDecoder has them: projected
        # in after the lookup and out before the LM head (OPT-350m: 512 against 1024; NeuSight's
        # opt.json: 2048 against 512, which had failed to capture on the mismatched add)
        self.project_in = nn.Linear(proj, d, bias=False) if proj != d else None
        self.project_out = nn.Linear(d, proj, bias=False) if proj != d else None
        self.embed_positions = nn.Embedding(c.get("max_position_embeddings", 2048) + 2, d)
        self.layers = nn.ModuleList(OPTLayer(c) for _ in range(c["num_hidden_layers"]))
        # post-norm layers (do_layer_norm_before false) end in their own norm: HF has no final one
        self.final_layer_norm = (nn.LayerNorm(d, elementwise_affine=_affine(c))
                                 if c.get("do_layer_norm_before", True) else None)
        self.lm_head = nn.Linear(proj, c["vocab_size"], bias=False)
        if c.get("tie_word_embeddings", True):  # HF's default for OPT (and GPTSpec.tied's)
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids, kv_cache=None):
        b, s = input_ids.shape
        dev = input_ids.device
        past = check_decode_step(kv_cache, s)
        if kv_cache is not None:
            return self._decode(input_ids, kv_cache, past)
        t = past + s  # keys attended: the cached ones and this step's
        h = self.embed_tokens(input_ids)
        if self.project_in is not None:
            h = self.project_in(h)
        attn = torch.ones(b, t, dtype=torch.bool, device=dev)
        lo = torch.finfo(h.dtype).min
        causal = torch.full((s, t), lo, device=dev)
        cond = torch.arange(t, device=dev)
        query = cond[past:] if past else cond  # the new tokens' positions
        causal = causal.masked_fill_(cond < (query + 1).view(s, 1), 0).to(h.dtype)
        inverted = 1.0 - attn[:, None, None, :].expand(b, 1, s, t).to(h.dtype)
        mask = inverted.masked_fill(inverted.to(torch.bool), lo) + causal[None, None]
        positions = (torch.cumsum(attn.long(), dim=1) * attn.long()).long() - 1
        if past:
            positions = positions[:, past:]
        h = h + self.embed_positions(positions + 2)
        for layer in self.layers:
            h = layer(h, mask)
        return self._head(h)

    def _decode(self, input_ids, kv_cache, past: int):
        """One decode step as HF 5.25's OPTDecoder runs it under generate (modeling_opt.py:
        340-380). position_attention_mask is the attention_mask generate hands the step: over a
        static cache the 4D mask prepare_inputs_for_generation builds (generation/utils.py:
        729-760; here kit.workload.hf_masks.decode_mask), so no torch.ones and no
        past_seen_tokens + s, whose value, a static cache's cumulative_length (a device tensor,
        cache_utils.py:502-504), would have been read on the host; over a dynamic cache None
        (generate drops an all-ones mask, generation/utils.py:2900-2910, and builds no 4D one),
        so torch.ones(b, past + s) in fp32 (past an int: no host read), which generate's
        position_ids (the arange below stands for them, as the Llama-style zoo's positions do)
        leave unread; positions embedded at + 2; one mask for every layer (create_causal_mask).
        The zoo had built HF 4's float causal mask and cumsum positions over context + 1 keys."""
        b, s = input_ids.shape
        dev = input_ids.device
        h = self.embed_tokens(input_ids)
        if kv_cache[0].prefill:  # generate's prefill: no mask (generate drops the all-ones one)
            # and an empty cache (get_seq_length 0, cache_utils.py:504): torch.ones(b, s) in fp32,
            # positions its cumsum times itself - 1 (modeling_opt.py:350-359)
            ones = torch.ones(b, s, device=dev)
            positions = (torch.cumsum(ones, dim=1) * ones - 1).long()[:, past:]
        else:
            if kv_cache[0].kind == "dynamic":
                torch.ones(b, past + s, device=dev)
            positions = torch.arange(past, past + s, device=dev).unsqueeze(0)
        pos = self.embed_positions(positions + 2)
        if self.project_in is not None:
            h = self.project_in(h)
        h = h + pos
        masks = {}
        for i, layer in enumerate(self.layers):
            h = layer(h, decode_mask(masks, kv_cache[i], 0, h), kv_cache[i])
        return self._head(h)

    def _head(self, h):
        if self.final_layer_norm is not None:
            h = self.final_layer_norm(h)
        if self.project_out is not None:
            h = self.project_out(h)
        return self.lm_head(h)

    def example_inputs(self, batch, seq):
        return (_ids(batch, seq),)

    def decode_inputs(self, batch, context, cache="static", capacity=None):
        """One new token a sequence and the cache of `context` tokens (capacity: a static
        cache's preallocated length, kit.workload.kv_cache.make_cache)."""
        c = self.config
        heads = c["num_attention_heads"]
        return (_ids(batch, 1), make_cache(cache, batch, c["num_hidden_layers"], heads, context,
                                           c["hidden_size"] // heads, capacity=capacity))
