"""Qwen2, Qwen3, Gemma 1-3 and Phi-3 through the zoo's Llama-style decoder: what each family
changes (biases, q/k norms, GeGLU, embedding scale, tied head, fused projections, Gemma 2's
soft-capped eager attention and four norms a layer) is in the captured graph, and the zoo's models
have the parameters of the published ones."""
import pytest

from kit.errors import KitError
from kit.workload import zoo


def _tiny(family, **extra):
    return {"model_type": family, "hidden_size": 32, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 1, "intermediate_size": 48,
            "vocab_size": 50, **extra}


def _unique_params(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _by_hand(c) -> int:
    """Parameters of a Llama-style decoder from its config, counted per weight."""
    family, d, ff, V = c["model_type"], c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    heads = c["num_attention_heads"]
    hd = c.get("head_dim", d // heads)
    q, kv = heads * hd, c.get("num_key_value_heads", heads) * hd
    attn = d * q + 2 * d * kv + q * d + (q + 2 * kv if family in ("qwen2", "qwen2_moe") else 0)
    attn += 2 * hd if family in ("qwen3", "qwen3_moe", "gemma3_text") else 0  # q_norm, k_norm
    norms = 4 if family in ("gemma2", "gemma3_text") else 2
    mlp = 3 * d * ff  # gate, up, down
    if family.endswith("_moe"):  # routed experts and their router; a shared expert and its gate
        experts = c["num_experts"]
        mlp = experts * 3 * d * c["moe_intermediate_size"] + d * experts
        if c.get("shared_expert_intermediate_size"):
            mlp += 3 * d * c["shared_expert_intermediate_size"] + d
    layer = attn + mlp + norms * d
    tied = c.get("tie_word_embeddings", family.startswith("gemma"))
    return c["num_hidden_layers"] * layer + V * d * (1 if tied else 2) + d


@pytest.mark.parametrize("name, published_billions", [
    ("qwen2.5-7b", 7.61), ("qwen3-8b", 8.19), ("gemma-7b", 8.54), ("phi3-mini", 3.82),
    ("gemma2-9b", 9.24), ("gemma3-1b", 1.00), ("qwen3-30b-a3b", 30.5)])
def test_parameters_match_the_config_and_the_model_card(name, published_billions):
    model = zoo.build(name)
    n = _unique_params(model)
    assert n == _by_hand(zoo.config(name))
    digits = len(str(published_billions).split(".")[1])  # within the card's last stated digit
    assert abs(n / 1e9 - published_billions) < 10 ** -digits


def _fwd_gemms(g, layer_part):
    return [n for n in g.by_phase("fwd") if n.op_class == "gemm" and layer_part in n.module]


def test_qwen2_biases_the_qkv_projections_only():
    g = zoo.graph_for(_tiny("qwen2"), batch=2, seq=8, mode="inference", disk=False)
    ops = {n.module.rsplit(".", 1)[-1]: n.aten for n in _fwd_gemms(g, "self_attn")}
    assert ops["q_proj"].startswith("aten.addmm") and ops["v_proj"].startswith("aten.addmm")
    assert ops["o_proj"].startswith("aten.mm")
    plain = zoo.graph_for(_tiny("llama"), batch=2, seq=8, mode="inference", disk=False)
    assert all(n.aten.startswith("aten.mm") for n in _fwd_gemms(plain, "self_attn"))


def test_qwen3_normalises_q_and_k_per_head():
    g = zoo.graph_for(_tiny("qwen3", head_dim=16), batch=2, seq=8, mode="inference", disk=False)
    normed = {n.module for n in g.by_phase("fwd") if n.module.endswith(("q_norm", "k_norm"))}
    assert normed == {"layers.0.self_attn.q_norm", "layers.0.self_attn.k_norm"}
    q = next(n for n in _fwd_gemms(g, "q_proj"))
    assert q.op.n == 4 * 16  # head_dim 16 of its own: q is 64 wide over a 32-wide model


def test_gemma_scales_the_embedding_ties_the_head_and_gates_with_gelu():
    cfg = _tiny("gemma", head_dim=16)
    model = zoo.build(cfg)
    assert model.lm_head.weight is model.embed_tokens.weight
    g = zoo.graph_for(cfg, batch=2, seq=8, mode="train", disk=False)
    assert g.meta["params"] == _by_hand(cfg)
    fwd = g.by_phase("fwd")
    assert any(n.aten.startswith("aten.gelu") and "mlp" in n.module for n in fwd)
    assert not any(n.aten.startswith("aten.silu") for n in fwd)
    first = next(i for i, n in enumerate(fwd) if n.aten.startswith("aten.embedding"))
    assert fwd[first + 1].aten.startswith("aten.mul") and fwd[first + 1].module == ""
    llama = zoo.graph_for(_tiny("llama"), batch=2, seq=8, mode="train", disk=False)
    assert llama.meta["params"] == _by_hand({**_tiny("llama")})


def test_phi3_fuses_qkv_and_gate_up_into_one_gemm_each():
    cfg = _tiny("phi3")
    g = zoo.graph_for(cfg, batch=2, seq=8, mode="inference", disk=False)
    gemms = {n.module.rsplit(".", 1)[-1]: n.op for n in _fwd_gemms(g, "layers.0")}
    assert set(gemms) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
    assert gemms["qkv_proj"].n == 32 + 2 * 16 and gemms["gate_up_proj"].n == 2 * 48
    unfused = zoo.graph_for(_tiny("llama"), batch=2, seq=8, mode="inference", disk=False)
    flops = lambda graph: sum(n.op.flops for n in _fwd_gemms(graph, "layers.0"))  # noqa: E731
    assert flops(g) == pytest.approx(flops(unfused))  # the same work in fewer kernels


def test_gemma2_softcaps_attention_eagerly_and_gemma3_norms_q_and_k_under_sdpa():
    g2 = zoo.graph_for(_tiny("gemma2", head_dim=16), batch=2, seq=8, mode="inference", disk=False)
    fwd = g2.by_phase("fwd")
    attn = [n for n in fwd if n.module == "layers.0.self_attn"]
    assert not g2.op_classes().get("attention")  # no fused SDPA kernel: the eager path
    assert any(n.aten.startswith("aten.tanh") for n in attn)  # the soft cap on the logits
    assert any(n.op_class == "softmax" for n in attn)
    assert sum(1 for n in attn if n.op_class == "gemm") == 2  # scores and the weighted sum
    assert fwd[-1].aten.startswith("aten.mul") and any(  # the logits' cap closes the pass
        n.aten.startswith("aten.tanh") and n.module == "" for n in fwd[-3:])
    norms = {n.module.rsplit(".", 1)[-1] for n in fwd if n.module.endswith("layernorm")}
    assert norms == {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"}
    g3 = zoo.graph_for(_tiny("gemma3_text", head_dim=16), batch=2, seq=8, mode="train", disk=False)
    assert g3.op_classes()["attention"] == 2  # fused SDPA forward and backward
    assert any(n.module.endswith("q_norm") for n in g3)
    assert not any(n.aten.startswith("aten.tanh") for n in g3)


def test_qwen_moe_routes_to_its_experts_and_qwen2_moe_adds_a_gated_shared_expert():
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24)
    g3 = zoo.graph_for(_tiny("qwen3_moe", head_dim=16, **moe), batch=2, seq=8, mode="inference",
                       disk=False)
    experts = [n for n in g3.by_phase("fwd") if n.module.endswith(".mlp.experts") and n.op_class == "gemm"]
    # HF 5's grouped_mm experts: one grouped GEMM up (gate and up, 2 x 24 wide), one down, a layer
    assert [n.aten for n in experts] == ["aten._grouped_mm.default"] * 2
    assert [n.op.n for n in experts[:2]] == [48, 32] and {n.op.b for n in experts} == {4}
    assert any(n.module.endswith("q_norm") for n in g3)
    cfg2 = _tiny("qwen2_moe", **moe, shared_expert_intermediate_size=40)
    g2 = zoo.graph_for(cfg2, batch=2, seq=8, mode="train", disk=False)
    shared = [n for n in g2.by_phase("fwd") if ".shared_expert." in n.module and n.op_class == "gemm"]
    assert len(shared) == 3 and any(n.module.endswith("shared_expert_gate") for n in g2)
    assert any(n.aten.startswith("aten.sigmoid") for n in g2.by_phase("fwd"))
    assert g2.meta["params"] == _by_hand(cfg2)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"])
def test_each_family_decodes_trains_and_replicates_its_layers(family):
    from kit.workload.capture import capture

    cfg = _tiny(family, num_hidden_layers=5,
                **({"head_dim": 16} if family in ("qwen3", "gemma", "gemma2", "gemma3_text") else {}))
    step = zoo.graph_for(cfg, batch=2, seq=16, mode="decode", disk=False)
    assert step.meta["mode"] == "decode" and step.meta["kv_cache_bytes"] > 0
    fast = zoo.graph_for(cfg, batch=2, seq=8, mode="train", disk=False)
    assert fast.meta.get("replicated_from") == 3
    model = zoo.build(cfg)
    full = capture(model, model.example_inputs(2, 8), mode="train", loss=zoo.lm_loss(cfg["vocab_size"]))
    key = lambda g: [(n.aten, n.phase, n.module, n.op) for n in g]  # noqa: E731
    assert key(fast) == key(full)


def test_an_activation_the_gated_mlp_does_not_build_is_one_clear_error():
    with pytest.raises(KitError, match="hidden_act 'relu2' is not a gated-MLP activation"):
        zoo.build(_tiny("qwen2", hidden_act="relu2"))


def test_multi_gpu_takes_the_families_and_refuses_a_head_size_of_its_own():
    from kit.parallel.gpt import parse_model

    spec = parse_model("qwen2.5-7b")
    assert spec.gated and spec.rope and spec.kv_heads == 4
    with pytest.raises(KitError, match="16 heads of 256 over a 3072-wide model"):
        parse_model("gemma-7b")
    with pytest.raises(KitError, match="does not model Qwen's MoE layers"):
        parse_model("qwen3-30b-a3b")


def test_a_multimodal_config_points_to_its_text_model():
    nested = {"model_type": "gemma3", "text_config": _tiny("gemma3_text", head_dim=16),
              "vision_config": {"model_type": "siglip_vision_model"}}
    with pytest.raises(KitError, match="multimodal: its language model is the text_config inside "
                                       "it \\(model_type 'gemma3_text'\\)"):
        zoo.build(nested)
    assert zoo.build(nested["text_config"]) is not None
    with pytest.raises(KitError, match="model_type 'falcon' is not supported"):
        zoo.build({"model_type": "falcon", "text_config": {"model_type": "falcon"}})


def test_qwen_moe_makes_the_layers_hf_makes_dense_dense():
    cfg = _tiny("qwen3_moe", head_dim=16, num_hidden_layers=5, num_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=24)

    def sparse(c):
        g = zoo.graph_for(c, batch=2, seq=8, mode="inference", disk=False)
        return sorted({n.layer for n in g if n.module.endswith(".mlp.experts")})

    assert sparse(cfg) == [0, 1, 2, 3, 4]
    assert sparse({**cfg, "decoder_sparse_step": 2}) == [1, 3]  # HF: (i + 1) % step == 0
    assert sparse({**cfg, "mlp_only_layers": [4]}) == [0, 1, 2, 3]  # not replicated from layer 1
    # dense layers that open the stack are kept, and one of the MoE layers after them repeated
    from kit.workload.capture import capture

    lead = {**cfg, "num_hidden_layers": 6, "mlp_only_layers": [0, 1]}
    fast = zoo.graph_for(lead, batch=2, seq=8, mode="train", disk=False)
    model = zoo.build(lead)
    full = capture(model, model.example_inputs(2, 8), mode="train", loss=zoo.lm_loss(lead["vocab_size"]))
    assert fast.meta.get("replicated_from") == 5
    assert [(n.aten, n.module, n.deps, n.op) for n in fast] == [(n.aten, n.module, n.deps, n.op) for n in full]
    with pytest.raises(KitError, match="num_experts_per_tok 8 is more than the 4 experts"):
        zoo.build({**cfg, "num_experts_per_tok": 8})
    with pytest.raises(KitError, match="missing key 'num_experts'"):
        zoo.build({k: v for k, v in cfg.items() if k != "num_experts"})


DEEPSEEK = {"model_type": "deepseek_v3", "hidden_size": 32, "intermediate_size": 64,
            "moe_intermediate_size": 16, "num_hidden_layers": 5, "num_attention_heads": 4,
            "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 4,
            "topk_group": 2, "first_k_dense_replace": 1, "q_lora_rank": 24, "kv_lora_rank": 16,
            "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "vocab_size": 50}


def test_deepseek_v3_has_latent_attention_dense_first_layers_and_shared_experts():
    from kit.workload.capture import capture

    model = zoo.build("deepseek-v3")
    n = _unique_params(model)
    assert abs(n / 1e9 - 671) < 1  # DeepSeek-V3's card: 671B (the HF model, no MTP layer)
    g = zoo.graph_for(DEEPSEEK, batch=2, seq=8, mode="inference", disk=False)
    gemms = {n.module.rsplit(".", 1)[-1]: n.op for n in g if n.op_class == "gemm"
             and n.module.startswith("layers.2.self_attn")}
    assert set(gemms) == {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}
    assert gemms["kv_a_proj_with_mqa"].n == 16 + 4 and gemms["kv_b_proj"].n == 4 * (8 + 8)
    assert gemms["q_b_proj"].n == 4 * (8 + 4)
    att = [n.op for n in g if n.op_class == "attention"]
    assert len(att) == 5 and {(a.head_dim, a.value_dim) for a in att} == {(8 + 4, 8)}
    # Q·Kᵀ over the 12-wide q/k heads, P·V over the 8-wide values
    assert att[0].flops == pytest.approx(2 * 2 * 4 * 8 * 8 * (12 + 8) * att[0].causal_fraction)
    routed = {n.layer for n in g if n.module.endswith(".mlp.experts")}
    assert routed == {1, 2, 3, 4}  # the first layer is dense
    assert any(n.module.endswith("mlp.shared_expert") or ".shared_expert." in n.module for n in g)
    assert any(n.aten.startswith("aten.sigmoid") and n.module.endswith(".mlp") for n in g)
    for mode in ("train", "inference", "decode"):  # layers 1-3 captured, 1 + 3 alike expanded
        fast = zoo.graph_for(DEEPSEEK, batch=2, seq=8, mode=mode, disk=False)
        assert fast.meta.get("replicated_from") == 4
        m = zoo.build(DEEPSEEK)
        inputs = m.decode_inputs(2, 8) if mode == "decode" else m.example_inputs(2, 8)
        full = capture(m, inputs, mode="inference" if mode == "decode" else mode,
                       loss=zoo.lm_loss(DEEPSEEK["vocab_size"]))
        key = lambda graph: [(n.aten, n.phase, n.module, n.layer, n.deps, n.op) for n in graph]  # noqa: E731
        assert key(fast) == key(full), mode
        assert fast.meta["activation_bytes"] == full.meta["activation_bytes"]
    step = zoo.graph_for(DEEPSEEK, batch=2, seq=8, mode="decode", disk=False)
    context = 8 + 1
    # HF 5's MLA cache: the 16-wide latent and the 4-wide rotary key, one head, fp32
    assert step.meta["kv_cache_bytes"] == 5 * 2 * 1 * context * (16 + 4) * 4
    # a decode step expands the latent of every cached token: kv_b_proj over the whole context
    kv_b = [n.op for n in step if n.module == "layers.1.self_attn.kv_b_proj" and n.op_class == "gemm"]
    assert len(kv_b) == 1 and kv_b[0].m == 2 * context and kv_b[0].n == 4 * (8 + 8)


def test_deepseek_stacks_short_of_the_replicated_size_and_hf_defaults():
    from kit.workload.capture import capture

    short = {**DEEPSEEK, "first_k_dense_replace": 2, "num_hidden_layers": 4}  # 2 dense + 2 MoE
    for mode in ("decode", "train"):
        g = zoo.graph_for(short, batch=2, seq=8, mode=mode, disk=False)
        m = zoo.build(short)
        full = capture(m, m.decode_inputs(2, 8) if mode == "decode" else m.example_inputs(2, 8),
                       mode="inference" if mode == "decode" else mode, loss=zoo.lm_loss(short["vocab_size"]))
        assert [(n.aten, n.module, n.op) for n in g] == [(n.aten, n.module, n.op) for n in full]
    six = {**DEEPSEEK, "num_hidden_layers": 6}
    fast = zoo.graph_for(six, batch=2, seq=8, mode="inference", disk=False)
    m = zoo.build(six)
    full = capture(m, m.example_inputs(2, 8), mode="inference")
    assert fast.meta.get("replicated_from") == 4 and fast.meta["buffer_bytes"] == full.meta["buffer_bytes"]
    # keys a config leaves out take HF's DeepseekV3Config defaults: three dense layers first
    bare = {k: v for k, v in six.items() if k not in ("first_k_dense_replace", "n_group", "topk_group")}
    g = zoo.graph_for({**bare, "n_routed_experts": 16}, batch=2, seq=8, mode="inference", disk=False)
    assert {n.layer for n in g if n.module.endswith(".mlp.experts")} == {3, 4, 5}
    with pytest.raises(KitError, match="8 experts do not split into n_group 8 groups of two or more"):
        zoo.build({**DEEPSEEK, "n_group": 8, "topk_group": 4})


def test_deepseek_is_refused_by_the_multi_gpu_layer():
    from kit.parallel.gpt import parse_model

    with pytest.raises(KitError, match="does not model DeepSeek's latent attention"):
        parse_model("deepseek-v3")


def test_half_precision_mla_takes_the_memory_efficient_kernel():
    g = zoo.graph_for(DEEPSEEK, batch=2, seq=8, mode="inference", dtype="bf16", disk=False)
    kernels = {n.aten for n in g if n.op_class == "attention"}
    assert kernels == {"aten._scaled_dot_product_efficient_attention.default"}
    llama = zoo.graph_for(_tiny("llama"), batch=2, seq=8, mode="inference", dtype="bf16", disk=False)
    assert {n.aten for n in llama if n.op_class == "attention"} == {
        "aten._scaled_dot_product_flash_attention.default"}


def test_a_prefill_past_the_window_masks_its_sliding_layers_as_hf_does():
    from kit.workload.capture import capture

    cfg = _tiny("gemma3_text", head_dim=16, num_hidden_layers=6, sliding_window=8)  # 5 slide, 1 full

    def attention(seq):
        g = zoo.graph_for(cfg, batch=2, seq=seq, mode="inference", disk=False)
        return g, [n.op for n in g if n.op_class == "attention"]

    g, att = attention(16)  # past the window: the five sliding layers get the boolean mask
    assert [a.causal for a in att] == [False] * 5 + [True]
    assert att[0].flops == pytest.approx(att[5].flops / att[5].causal_fraction)  # the full square
    assert sum(1 for n in g if n.aten == "aten.bitwise_and.Tensor") == 1  # one mask a forward
    assert "replicated_from" not in g.meta  # the layers differ: captured whole
    model = zoo.build(cfg)
    full = capture(model, model.example_inputs(2, 16), mode="inference")
    assert [(n.aten, n.op) for n in g] == [(n.aten, n.op) for n in full]
    _, short = attention(7)  # shorter than the window: is_causal everywhere, as before
    assert all(a.causal for a in short)
    mistral = zoo.graph_for(_tiny("mistral", num_hidden_layers=5, sliding_window=4), batch=1, seq=8,
                            mode="train", disk=False)
    assert mistral.meta.get("replicated_from") == 3  # every layer slides: alike, replicated
    assert not any(n.op.causal for n in mistral if n.op_class == "attention" and n.phase == "fwd")


GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "num_hidden_layers": 4, "intermediate_size": 32, "vocab_size": 100,
           "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8}


def test_gpt_oss_has_sinks_biased_clamped_experts_and_the_cards_sizes():
    """openai/gpt-oss-20b and -120b: 20,914,757,184 and 116,829,156,672 parameters, as HF's
    GptOssForCausalLM counts them from their config.json (the cards' 21B and 117B)."""
    from kit.parallel.gpt import parse_model

    assert _unique_params(zoo.build("gpt-oss-20b")) == 20_914_757_184
    assert _unique_params(zoo.build("gpt-oss-120b")) == 116_829_156_672
    model = zoo.build(GPT_OSS)
    layer = model.layers[0]
    assert tuple(layer.self_attn.sinks.shape) == (4,) and layer.self_attn.q_proj.bias is not None
    experts = layer.mlp.experts  # stored as HF does: (E, H, 2I) with biases
    assert tuple(experts.gate_up_proj.shape) == (4, 64, 64) and tuple(experts.down_proj_bias.shape) == (4, 64)
    assert layer.mlp.gate.bias is not None
    g = zoo.graph_for(GPT_OSS, batch=2, seq=16, mode="inference", dtype="bf16", disk=False)
    # eager attention with the sinks: scores, a softmax over the keys and the sink, the weighted sum
    att = [n for n in g if n.module == "layers.0.self_attn"]
    assert sum(n.op_class == "softmax" for n in att) == 1 and sum(n.op_class == "gemm" for n in att) == 2
    soft = next(n.op for n in att if n.op_class == "softmax")
    assert (soft.rows, soft.cols) == (2 * 4 * 16, 16 + 1)  # one more column: the sink
    moe = [n for n in g if n.module == "layers.0.mlp.experts" and n.op_class == "gemm"]
    assert [n.op.n for n in moe] == [2 * 32, 64] and {n.op.b for n in moe} == {4}
    # the norms stay fp32 in an fp16 model, as HF keeps them
    half = zoo.graph_for(GPT_OSS, batch=2, seq=16, mode="inference", dtype="fp16", disk=False)
    assert half.meta["param_bytes"] > zoo.graph_for(GPT_OSS, batch=2, seq=16, mode="inference",
                                                    dtype="bf16", disk=False).meta["param_bytes"]
    # decoding: even layers keep the 8-token window, odd ones every token
    step = zoo.graph_for(GPT_OSS, batch=2, seq=32, mode="decode", dtype="bf16", disk=False)
    keys = {i: [n.op.n for n in step if n.module == f"layers.{i}.self_attn" and n.op_class == "gemm"][0]
            for i in range(4)}
    assert keys == {0: 8, 1: 33, 2: 8, 3: 33}  # the scores' width: the keys each layer reads
    with pytest.raises(KitError, match="does not model GPT-OSS"):
        parse_model("gpt-oss-20b")
