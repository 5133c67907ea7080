"""The activation bytes kit.parallel.memory counts for core attention and BERT's heads against
what torch's autograd really saves: a tiny layer built in plain torch on the CPU, op for op as
megatron-core 0.16.1 runs it (transformer/dot_product_attention.py lines 169-250,
fusions/fused_softmax.py lines 313-340, transformer/utils.py attention_mask_func,
models/bert/bert_lm_head.py, models/bert/pooler.py), its saved tensors' storages collected
with torch.autograd.graph.saved_tensors_hooks and each storage counted once (a saved view keeps
its whole base alive). Plus hand counts for the fused kernel's path, which has no CPU build."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from kit.parallel import Layout, parse_model
from kit.parallel.gpt import fused_softmax_available, vocab_per_rank
from kit.parallel.memory import activation_bytes_per_layer, attention_bytes_per_token, edge_activation_bytes

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def saved_bytes(run, skip=()) -> int:
    """Bytes of the distinct storages autograd saves while run() builds its graph, leaving out
    those of `skip` (weights, the shared mask: not a micro-batch's activations)."""
    skipped = {t.untyped_storage().data_ptr() for t in skip}
    kept = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skipped:
            kept[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    assert out.requires_grad
    return sum(kept.values())


def megatron_core_attention(q, k, v, mask, p, w_proj):
    """DotProductAttention.forward with the torch fallback softmax (scale None,
    attention_softmax_in_fp32 True) and the row-parallel projection after it; the dropout is
    native_dropout, what F.dropout runs on CUDA (ATen Dropout.cpp is_fused_kernel_acceptable)."""
    sq, b, np_, hn = q.shape
    ng = k.shape[2]
    if np_ // ng > 1:
        k = k.repeat_interleave(np_ // ng, dim=2)
        v = v.repeat_interleave(np_ // ng, dim=2)
    sk = k.shape[0]
    query = q.reshape(sq, b * np_, -1)
    key = k.view(sk, b * np_, -1)
    buffer = torch.empty(b * np_, sq, sk, dtype=q.dtype)
    scores = torch.baddbmm(buffer, query.transpose(0, 1), key.transpose(0, 1).transpose(1, 2),
                           beta=0.0, alpha=hn ** -0.5).view(b, np_, sq, sk)
    half = scores.dtype != torch.float32
    x = scores.float() if half else scores
    x.masked_fill_(mask, -10000.0)
    probs = torch.nn.Softmax(dim=-1)(x)
    if half:
        probs = probs.to(scores.dtype)
    if p > 0:
        probs = torch.native_dropout(probs, p, True)[0]
    value = v.view(sk, b * np_, -1)
    probs = probs.view(b * np_, sq, -1)
    ctx = torch.bmm(probs, value.transpose(0, 1)).view(b, np_, sq, hn).permute(2, 0, 1, 3).contiguous()
    ctx = ctx.view(sq, b, np_ * hn)
    return ctx if w_proj is None else F.linear(ctx, w_proj)  # None: the core's output alone


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("kv_heads", [2, 8])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_core_attention_bytes_are_what_torch_saves(dtype, kv_heads, dropout):
    # seq 16: the fused kernel needs 16 < sk, so megatron-core takes the torch fallback, as here
    s, b, a, hd, t = 16, 2, 8, 4, 2
    spec = parse_model(f"gpt:layers=1,hidden={a * hd},heads={a},seq={s},vocab=64,"
                       f"kv_heads={kv_heads},attention=unfused,dropout={dropout}")
    lay = Layout(tp=t, micro_batch=b, dtype=dtype)
    assert not fused_softmax_available(b, a // t, s, spec.causal)
    dt = DTYPES[dtype]
    torch.manual_seed(0)
    q = torch.randn(s, b, a // t, hd, dtype=dt, requires_grad=True)
    k = torch.randn(s, b, kv_heads // t, hd, dtype=dt, requires_grad=True)
    v = torch.randn(s, b, kv_heads // t, hd, dtype=dt, requires_grad=True)
    w = torch.randn(a * hd, a * hd // t, dtype=dt, requires_grad=True)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).expand(b, 1, s, s)
    measured = saved_bytes(lambda: megatron_core_attention(q, k, v, mask, dropout, w), skip=(w, mask))
    assert attention_bytes_per_token(spec, lay) * s * b == measured

    # the same by hand, per rank: Q, K, V (repeated to the a/t query heads where kv < a) and
    # the projection's input, [s, b, a/t, hd] each; the fp32 softmax output [b, a/t, s, s];
    # then either the dropout's bool mask and its output (bf16: 2 B, fp32: 4 B) or, at dropout 0,
    # the bmm's probabilities: bf16's cast (a new tensor), fp32's the softmax output itself
    e = 2 if dtype == "bf16" else 4
    act = s * b * (a // t) * hd * e
    scores = b * (a // t) * s * s
    probs = scores * (1 + e) if dropout else (scores * e if dtype == "bf16" else 0)
    assert measured == 4 * act + scores * 4 + probs


def test_gqa_unfused_layer_counts_the_repeated_key_and_value():
    # Llama-3-8B (h 4096, a 32, kv 8, f 14336, no dropout) unfused, tp 2, seq 4096, bf16: per
    # token and rank, 8h of the norms' and the QKV/MLP inputs, 6f/2 of the gated MLP, Q, K, V
    # and the projection's input at h/2 each (K and V repeated to the 16 query heads), and the
    # fused softmax's bf16 output 2·16·4096 (b·np = 16 and s 4096 take the kernel)
    spec = dataclasses.replace(parse_model("llama3-8b"), seq=4096, attention="unfused")
    lay = Layout(tp=2, micro_batch=1, dtype="bf16")
    assert fused_softmax_available(1, 16, 4096, True)
    h, f, s = 4096, 14336, 4096
    per_token = 8 * h + 6 * f // 2 + 2 * 4 * h // 2 + 2 * 16 * s
    assert activation_bytes_per_layer(spec, lay) == s * per_token  # 872 MiB; 848 had K, V at 8 heads
    # flash attention saves the kv heads' K and V: h/4 wide each, no scores
    flash = dataclasses.replace(spec, attention="flash")
    assert activation_bytes_per_layer(flash, lay) == s * (8 * h + 6 * f // 2 + 2 * (2 * h + 2 * h // 4) // 2)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_torch_fallback_softmax_keeps_fp32_probabilities(dropout):
    # Llama-3-8B-shaped (32 heads, kv 8) at seq 8192: sk > 4096, no fused kernel, so the bf16
    # scores go through forward_torch_softmax: fp32 softmax output 4 B + (mask 1 B + bf16
    # dropout output 2 B, or at dropout 0 the bf16 cast the bmm reads, 2 B) an element of
    # [b, a/t, s, s]; Korthikanti's 5 (2 without dropout) is the fused kernel's
    spec = dataclasses.replace(parse_model("llama3-8b"), seq=8192, attention="unfused", dropout=dropout)
    lay = Layout(tp=2, micro_batch=1, dtype="bf16")
    assert not fused_softmax_available(1, 16, 8192, True)
    h, s = 4096, 8192
    qkvo = 2 * 4 * h // 2
    per_elem = 4 + 1 + 2 if dropout else 4 + 2
    assert attention_bytes_per_token(spec, lay) == qkvo + per_elem * 16 * s
    # the fused kernel's path (seq 4096) saves only its bf16 output (fused_softmax.py lines 36,
    # 86), then the dropout's mask and output: 5, or 2 at dropout 0
    fused = dataclasses.replace(spec, seq=4096)
    assert attention_bytes_per_token(fused, lay) == qkvo + (5 if dropout else 2) * 16 * 4096


def bert_heads(x, ln_final, dense, ln_head, w_out, b_out, pool, binary, gather):
    """BERT's post-process as megatron-core 0.16.1 runs it on one rank: the encoder's final norm,
    BertLMHead (dense, gelu, LayerNorm), the output layer with its bias; the pooler on the
    sequence's first token (gathered first under sequence parallelism) and the binary head."""
    hidden = ln_final(x)
    logits = F.linear(ln_head(F.gelu(dense(hidden))), w_out, b_out)
    pooled = torch.tanh(pool(gather(hidden)[0]))
    return logits.sum() + binary(pooled).sum()


class _Gather(torch.autograd.Function):
    """An all-gather's stand-in: a new [t·s, b, h] tensor, nothing saved."""

    @staticmethod
    def forward(ctx, x, t):
        ctx.t = t
        return x.repeat(t, 1, 1)

    @staticmethod
    def backward(ctx, g):
        return g[: g.shape[0] // ctx.t], None


@pytest.mark.parametrize("sp", [False, True])
def test_bert_heads_bytes_are_what_torch_saves(sp):
    s, b, h, t, vocab = 16, 2, 8, 2, 64
    spec = dataclasses.replace(parse_model(f"gpt:layers=1,hidden={h},heads=2,seq={s},vocab={vocab}"),
                               pretraining_heads=True, token_types=2)  # BERT's heads
    lay = Layout(tp=t, micro_batch=b, dtype="fp32", sequence_parallel=sp)
    torch.manual_seed(0)
    rows = s // t if sp else s  # the rank's tokens: its sequence shard with sequence parallelism
    x = torch.randn(rows, b, h, requires_grad=True)
    mods = [torch.nn.LayerNorm(h), torch.nn.Linear(h, h), torch.nn.LayerNorm(h)]
    v_rank = vocab_per_rank(vocab, t)  # Megatron's padded vocabulary, this rank's columns
    w_out, b_out = torch.randn(v_rank, h, requires_grad=True), torch.randn(v_rank, requires_grad=True)
    pool, binary = torch.nn.Linear(h, h), torch.nn.Linear(h, 2)
    params = [p for m in (*mods, pool, binary) for p in m.parameters()] + [w_out, b_out]
    gather = (lambda y: _Gather.apply(y, t)) if sp else (lambda y: y)
    measured = saved_bytes(lambda: bert_heads(x, *mods, w_out, b_out, pool, binary, gather), skip=params)
    # the two LayerNorms' fp32 mean and rstd, a value a row each: statistics the kit leaves out
    # for every norm (Korthikanti et al. count none)
    measured -= 2 * 2 * rows * b * 4
    # by hand, fp32: the final norm's input, the dense's (the norm's output), the gelu's, the
    # LayerNorm's and the output layer's inputs, rows·b·h each; the pooler's [b, h] tanh output;
    # under sequence parallelism the gathered [s, b, h] its dense's input is a view of
    hand = 5 * rows * b * h * 4 + b * h * 4 + (s * b * h * 4 if sp else 0)
    assert measured == hand
    loss_softmax = b * s * v_rank * 4  # the vocab-parallel loss's fp32 softmax, not built here
    assert edge_activation_bytes(spec, lay, 0)[1] - loss_softmax == hand


class _CheckpointInputs(torch.autograd.Function):
    """megatron-core's CheckpointFunction as selective recompute runs core attention: it saves
    its inputs (tensor_parallel/random.py line 528) and runs the function without a graph."""

    @staticmethod
    def forward(ctx, q, k, v, run):
        ctx.save_for_backward(q, k, v)
        with torch.no_grad():
            return run(q, k, v)

    @staticmethod
    def backward(ctx, g):  # never run here
        raise NotImplementedError


def rotary(x, cos, sin):
    """rope_utils.py _apply_rotary_pos_emb_bshd (lines 110-126), rotary over the whole head."""
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((x * cos + torch.cat((-x2, x1), dim=-1) * sin, x[..., x.shape[-1]:]), dim=-1)


@pytest.mark.parametrize("recompute", ["none", "selective"])
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("kv_heads", [2, 4, 8])
def test_value_views_keep_the_qkv_output_whole(recompute, rope, kv_heads):
    """From the QKV GEMM on, as megatron-core 0.16.1 runs it: the GEMM's output viewed as
    [s, b, ng, (np/ng + 2)·hd] and split into Q, K, V views (attention.py lines 1424-1463), Q
    reshaped to [s, b, np, hd], rotary positions on Q and K, then core attention, unfused or
    checkpointed. A V that is saved as that view (no GQA repeat, or the checkpoint's input)
    keeps the whole GEMM output: with RoPE, or Q's reshape copy under GQA, more than Q, K, V."""
    s, b, a, hd, t = 16, 2, 8, 4, 2
    np_, ng = a // t, kv_heads // t
    spec = parse_model(f"gpt:layers=1,hidden={a * hd},heads={a},seq={s},vocab=64,kv_heads={kv_heads},"
                       f"attention=unfused,dropout=0,rope={int(rope)}")
    lay = Layout(tp=t, micro_batch=b, dtype="bf16", recompute=recompute)
    dt = torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(s, b, a * hd, dtype=dt, requires_grad=True)  # the norm's output: counted elsewhere
    w_qkv = torch.randn((np_ + 2 * ng) * hd, a * hd, dtype=dt, requires_grad=True)
    w = torch.randn(a * hd, np_ * hd, dtype=dt, requires_grad=True)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).expand(b, 1, s, s)
    freqs = torch.randn(s, 1, 1, hd)
    cos, sin = freqs.cos().to(dt), freqs.sin().to(dt)

    def layer():
        mixed = F.linear(x, w_qkv).view(s, b, ng, (np_ // ng + 2) * hd)
        q, k, v = torch.split(mixed, [np_ // ng * hd, hd, hd], dim=3)
        q = q.reshape(s, b, -1, hd)
        if rope:
            q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        if recompute == "selective":
            def core(q_, k_, v_):
                return megatron_core_attention(q_, k_, v_, mask, 0.0, None)
            ctx = _CheckpointInputs.apply(q, k, v, core)
            return F.linear(ctx, w)
        return megatron_core_attention(q, k, v, mask, 0.0, w)

    measured = saved_bytes(layer, skip=(x, w_qkv, w, mask, cos, sin))
    assert attention_bytes_per_token(spec, lay) * s * b == measured

    # by hand, per rank, tokens x bytes: the QKV output (np + 2ng)·hd wide where V's view keeps
    # it; Q (np·hd), K and V (ng·hd, or np·hd repeated) where saved as tensors of their own;
    # the projection's input (np·hd); unfused, the scores' fp32 softmax and bf16 cast, 6 B each
    e, tok = 2, s * b
    repeat = recompute == "none" and kv_heads < a
    v_view = not repeat
    q_own = rope or (kv_heads < a and ng > 1)  # [s, b, ng, np/ng, hd] -> np: a copy unless ng is 1
    k_own = rope or repeat
    kv_w = np_ * hd if repeat else ng * hd
    hand = tok * e * (np_ * hd  # projection input
                      + ((np_ + 2 * ng) * hd if v_view else 0)
                      + (np_ * hd if q_own or not v_view else 0)
                      + (kv_w if k_own or not v_view else 0)
                      + (kv_w if repeat else 0))
    if recompute == "none":
        hand += b * np_ * s * s * (4 + 2)
    assert measured == hand
