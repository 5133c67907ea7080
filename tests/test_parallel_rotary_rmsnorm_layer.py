"""The analytic GPT layer (kit.parallel.gpt) on a Llama-style model runs what Megatron-core runs
for one: RMSNorm (TE's rmsnorm) where the spec has no biases, the fused RoPE kernels on this
rank's queries and keys, and no learned-position add in the embedding."""
from kit import ops
from kit.parallel import GPTSpec, Layout
from kit.parallel.costs import AnalyticSource
from kit.parallel.gpt import embedding_forward, head_backward, head_forward, layer_forward

LLAMA = GPTSpec(layers=2, hidden=1024, heads=16, kv_heads=4, seq=512, vocab=32000, ffn=2816,
                gated=True, rope=True)
GPT = GPTSpec(layers=2, hidden=1024, heads=16, seq=512, vocab=32000)


def _ops(blocks):
    return [op for blk in blocks for op in blk.ops]


def _classes(spec, tp=1, sp=False):
    fwd = layer_forward(spec, 2, tp, 1, sp, "bf16")
    head = head_forward(spec, 2, tp, "bf16", sp) + head_backward(spec, 2, tp, "bf16", sp)
    return [op.op_class for op in _ops(fwd) + _ops(head)]


def test_a_model_without_biases_runs_rmsnorm_and_one_with_them_layernorm():
    for tp, sp in ((1, False), (2, False), (2, True)):
        llama, gpt = _classes(LLAMA, tp, sp), _classes(GPT, tp, sp)
        # two per layer, the final one and its backward
        assert llama.count("rmsnorm") == 4 and "layernorm" not in llama
        assert gpt.count("layernorm") == 4 and "rmsnorm" not in gpt


def _between_qkv_and_attention(spec, tp):
    attn = _ops(layer_forward(spec, 2, tp, 1, False, "bf16"))
    qkv = next(i for i, op in enumerate(attn) if isinstance(op, ops.Gemm))
    core = next(i for i, op in enumerate(attn) if op.op_class == "attention")
    return attn[qkv + 1:core]


def test_rotary_positions_rotate_this_ranks_queries_and_keys():
    tok, hd = 2 * 512, 1024 // 16
    for tp in (1, 2, 4):
        rope = _between_qkv_and_attention(LLAMA, tp)
        # one fused kernel for q (heads/tp) and one for k (kv_heads/tp), read and written once
        assert [op.numel for op in rope] == [tok * 16 // tp * hd, tok * 4 // tp * hd]
        assert all(op.bytes == 2 * 2 * op.numel for op in rope)
        assert _between_qkv_and_attention(GPT, tp) == []
    # and their backward: the same two kernels, in reverse order (k's first)
    _, bwd = AnalyticSource(LLAMA, Layout(tp=2, micro_batch=2, dtype="bf16")).layer(0)
    rope = _between_qkv_and_attention(LLAMA, 2)
    flat = _ops(bwd)
    core = next(i for i, op in enumerate(flat) if op.op_class == "attention")
    assert flat[core + 1:core + 3] == rope[::-1]
    # each moves its forward's bytes once (the gradient read, rotated back, written), where the
    # other memory-bound kernels' backward is two passes: it had been costed twice
    factors = [f for blk in bwd for f in blk.bwd_factor]
    assert factors[core + 1:core + 3] == [1.0, 1.0]
    assert max(factors[:core]) == 2.0  # the norms' and the MLP's backward still two


def test_a_rotary_model_adds_no_position_table_in_its_embedding():
    tok_h = 2 * 512 * 1024
    for tp, sp in ((1, False), (2, False), (2, True)):
        adds = lambda spec: [op for op in _ops(embedding_forward(spec, 2, tp, "bf16", sp))
                             if isinstance(op, ops.Elementwise) and op.kind == "add"]
        assert adds(LLAMA) == []
        assert [op.numel for op in adds(GPT)] == [tok_h]


def test_qwen3s_per_head_query_and_key_norms_are_counted():
    import torch

    from kit.parallel import parse_model
    from kit.workload.zoo import build

    spec = parse_model("qwen3-8b")
    with torch.device("meta"):
        module = build("qwen3-8b")
    # its q_norm and k_norm: 2 x 128 weights in each of 36 layers had been left out
    assert spec.params == sum(p.numel() for p in module.parameters())
    tok, hd = 2 * 512, 1024 // 16
    qk = GPTSpec(layers=2, hidden=1024, heads=16, kv_heads=4, seq=512, vocab=32000, ffn=2816,
                 gated=True, rope=True, qk_norm=True)
    for tp in (1, 2):
        norms = [op for op in _between_qkv_and_attention(qk, tp) if op.op_class == "rmsnorm"]
        assert [(op.rows, op.cols) for op in norms] == [(tok * 16 // tp, hd), (tok * 4 // tp, hd)]
    assert qk.layer_params() - LLAMA.layer_params() == 2 * hd
    assert not parse_model("llama3-8b").qk_norm


def test_qk_norms_are_the_layers_norm_kind():
    """Megatron-core builds --qk-layernorm with the layer's --normalization: a spec with biases
    (LayerNorm) norms q and k with LayerNorm, weight and bias a head wide each (a Persimmon-style
    GPT), not an RMSNorm of weights alone."""
    hd = 1024 // 16
    for bias in (False, True):
        base = GPTSpec(layers=2, hidden=1024, heads=16, kv_heads=4, seq=512, vocab=32000,
                       gated=True, rope=True, bias=bias)
        qk = GPTSpec(**{**base.__dict__, "qk_norm": True})
        layer_norm = next(op for op in _ops(layer_forward(qk, 2, 1, 1, False, "bf16"))
                          if op.op_class in ("layernorm", "rmsnorm")).op_class
        extra = _between_qkv_and_attention(qk, 1)
        assert [op.op_class for op in extra[:2]] == [layer_norm] * 2
        # a norm's parameters per unit width (GPTSpec.norm_params / hidden), over two heads
        assert qk.layer_params() - base.layer_params() == 2 * hd * base.norm_params // base.hidden
