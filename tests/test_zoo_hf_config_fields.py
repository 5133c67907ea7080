"""HF config.json fields that change a model's architecture, read as HF transformers' modeling
code reads them: Llama's mlp_bias, attention_bias only where HF's attention reads it, a null
head_dim or num_key_value_heads as the key left out, OPT's enable_bias and
layer_norm_elementwise_affine, BERT's tie_word_embeddings. Parameters are counted per weight by
hand; real config.json contents are checked against their published counts."""
import pytest

from kit.errors import KitError

from kit.workload import zoo


def _params(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _tiny(family="llama", **extra):
    return {"model_type": family, "hidden_size": 32, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 48,
            "vocab_size": 50, **extra}


def test_llama_mlp_bias_adds_a_bias_to_gate_up_and_down():
    """HF LlamaMLP: gate_proj, up_proj and down_proj all take bias=config.mlp_bias."""
    c = _tiny()
    base = _params(zoo.build(c))
    biased = zoo.build({**c, "mlp_bias": True})
    per_layer = 2 * c["intermediate_size"] + c["hidden_size"]  # gate and up: ff each; down: d
    assert _params(biased) == base + c["num_hidden_layers"] * per_layer
    g = zoo.graph_for({**c, "mlp_bias": True}, batch=2, seq=8, mode="inference", disk=False)
    mlp = [n for n in g if n.op_class == "gemm" and ".mlp." in n.module]
    assert mlp and all(n.aten.startswith("aten.addmm") for n in mlp)  # the bias folded into the GEMM
    # Mistral's and Qwen2's MLPs have no biases whatever the config says (HF hardcodes bias=False)
    for family in ("mistral", "qwen2"):
        assert _params(zoo.build(_tiny(family, mlp_bias=True))) == _params(zoo.build(_tiny(family)))


def test_attention_bias_only_where_hf_attention_reads_it():
    """Llama, Qwen3, Gemma take attention_bias on q, k, v and o; Mistral, Mixtral, Qwen2 and
    Phi-3 fix their projections' biases (Qwen2: q, k, v always) and ignore the key."""
    d, heads, kv = 32, 4, 2
    hd = d // heads
    added = heads * hd + 2 * kv * hd + d  # q, k, v and o biases, one layer
    for family in ("llama", "qwen3"):
        c = _tiny(family, head_dim=hd)
        assert _params(zoo.build({**c, "attention_bias": True})) == _params(zoo.build(c)) + 2 * added
    for family in ("mistral", "qwen2", "phi3"):
        c = _tiny(family)
        assert _params(zoo.build({**c, "attention_bias": True})) == _params(zoo.build(c)), family
    moe = _tiny("mixtral", num_local_experts=2, num_experts_per_tok=1)
    assert _params(zoo.build({**moe, "attention_bias": True})) == _params(zoo.build(moe))
    # Qwen2-MoE's q, k and v take qkv_bias (HF Qwen2MoeAttention), true when left out
    qmoe = _tiny("qwen2_moe", num_experts=2, num_experts_per_tok=1, head_dim=hd)
    assert (_params(zoo.build({**qmoe, "qkv_bias": False})) == _params(zoo.build(qmoe)) - 2 * (added - d)
            == _params(zoo.build({**qmoe, "qkv_bias": False, "attention_bias": True})))


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "phi3"])
def test_a_null_head_dim_or_kv_heads_is_the_key_left_out(family):
    """HF's configs read head_dim null as hidden_size / heads and num_key_value_heads null as one
    KV head a query head (multi-head attention); the build had failed on None * int."""
    c = _tiny(family)
    assert _params(zoo.build({**c, "head_dim": None})) == _params(zoo.build(c))
    mha = {**c, "num_key_value_heads": c["num_attention_heads"]}
    assert _params(zoo.build({**c, "num_key_value_heads": None})) == _params(zoo.build(mha))
    # the decode step's cache is sized from the same heads
    shapes = lambda cfg: [(n.aten, n.op) for n in zoo.graph_for(  # noqa: E731
        cfg, batch=1, seq=16, mode="decode", disk=False) if n.op_class == "attention"]
    assert shapes({**c, "num_key_value_heads": None, "head_dim": None}) == shapes(mha)


OPT = {"model_type": "opt", "hidden_size": 32, "ffn_dim": 64, "num_hidden_layers": 2,
       "num_attention_heads": 4, "vocab_size": 50, "max_position_embeddings": 64}


def test_opt_enable_bias_and_norm_affine():
    """HF OPT: enable_bias false drops q, k, v, out, fc1 and fc2's biases; layer_norm_elementwise_
    affine false the weight and bias of every LayerNorm (two a layer and the final one)."""
    d, ff, layers = OPT["hidden_size"], OPT["ffn_dim"], OPT["num_hidden_layers"]
    base = _params(zoo.build(OPT))
    assert _params(zoo.build({**OPT, "enable_bias": False})) == base - layers * (4 * d + ff + d)
    norms = 2 * layers + 1
    assert _params(zoo.build({**OPT, "layer_norm_elementwise_affine": False})) == base - norms * 2 * d
    g = zoo.graph_for({**OPT, "enable_bias": False, "layer_norm_elementwise_affine": False}, batch=2,
                      seq=8, mode="train", disk=False)
    proj = [n for n in g if n.op_class == "gemm" and n.phase == "fwd" and n.module.startswith("layers.")]
    assert proj and not any(n.aten.startswith("aten.addmm") for n in proj)


def test_bert_untied_head_has_its_own_weight():
    """tie_word_embeddings false (as GPTSpec.tied reads it for BERT): the MLM decoder's weight is
    a vocab x hidden matrix of its own, not the word embedding, and HF 5's BertLMPredictionHead
    keeps its bias beside the decoder's (tied to it only with the embedding): one vocab more."""
    c = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
         "intermediate_size": 64, "vocab_size": 50}
    tied, untied = zoo.build(c), zoo.build({**c, "tie_word_embeddings": False})
    assert tied.decoder.weight is tied.word_embeddings.weight
    assert untied.decoder.weight is not untied.word_embeddings.weight
    assert _params(untied) == _params(tied) + c["vocab_size"] * (c["hidden_size"] + 1)


# config.json of meta-llama/Llama-3.1-8B and Qwen/Qwen2.5-0.5B as published on the Hub (the fields
# that build the model, with the rope scaling and windows that change no weight); their model
# cards' counts: 8,030,261,248 and 494,032,768 (0.49B, the head tied to the embedding)
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "vocab_size": 128256}
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu",
    "hidden_size": 896, "intermediate_size": 4864, "max_position_embeddings": 32768,
    "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936}


@pytest.mark.parametrize("cfg, published", [(LLAMA31_8B, 8_030_261_248), (QWEN25_05B, 494_032_768)])
def test_real_config_json_builds_the_published_model(cfg, published):
    assert _params(zoo.build(cfg)) == published


PHI3 = {"model_type": "phi3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 1, "intermediate_size": 96, "vocab_size": 50}


def _attn_ops(cfg, aten):
    g = zoo.graph_for(cfg, batch=2, seq=8, mode="inference", disk=False)
    return [n.shapes for n in g if n.aten.startswith(aten) and n.module.endswith("self_attn")]


def test_phi3_turns_its_rotary_share_of_a_head_and_passes_the_rest():
    """HF's Phi-3 turns head_dim x partial_rotary_factor dimensions of q and k (Phi-4-mini: 96
    of 128) and cats the rest back on, also with the factor at 1 (an empty rest); the zoo had
    turned the whole head. Its q, k, v are three slices of the fused projection."""
    full, part = _attn_ops(PHI3, "aten.cat"), _attn_ops({**PHI3, "partial_rotary_factor": 0.75}, "aten.cat")
    # per q and k: rotate_half's cat of two halves, then the turned part joined to the rest
    assert sorted(full) == sorted(["[2,4,8,8]x[2,4,8,8]", "[2,4,8,16]x[2,4,8,0]",
                                   "[2,2,8,8]x[2,2,8,8]", "[2,2,8,16]x[2,2,8,0]"])
    assert sorted(part) == sorted(["[2,4,8,6]x[2,4,8,6]", "[2,4,8,12]x[2,4,8,4]",
                                   "[2,2,8,6]x[2,2,8,6]", "[2,2,8,12]x[2,2,8,4]"])
    turned = [s for s in _attn_ops({**PHI3, "partial_rotary_factor": 0.75}, "aten.mul") if "x[1,1,8," in s]
    assert len(turned) == 4 and all(s.endswith(",12]") for s in turned)  # q, k by cos and sin
    # HF 5 keeps the factor in rope_parameters
    assert _attn_ops({**PHI3, "rope_parameters": {"partial_rotary_factor": 0.75}}, "aten.cat") == part
    assert _attn_ops(PHI3, "aten.split") == [] and len(_attn_ops(PHI3, "aten.slice")) >= 3
    with pytest.raises(KitError, match="turns 5 of a head's 16 dimensions"):
        zoo.build({**PHI3, "partial_rotary_factor": 0.3125})


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_a_decode_step_over_a_full_sliding_window_is_masked_as_hf_runs_it(cache):
    """HF 5.25 skips the mask of a dynamic cache's sliding layer only while its keys are fewer
    than the window (a static cache's never); over a full window SDPA gets a boolean mask (so no flash kernel), the query heads of a KV head
    packed into its rows (pack_gqa). The zoo had run it unmasked at every context, over K and V
    spread to every query head."""
    mistral = {**_tiny("mistral"), "num_hidden_layers": 1, "sliding_window": 8}
    attn = lambda context: [(n.aten, n.shapes) for n in zoo.graph_for(  # noqa: E731
        mistral, batch=2, seq=context, mode="decode", kv_cache=cache, disk=False)
        if n.op_class == "attention"]
    # head 8, 4 query heads over 2 KV heads: packed as 2 rows of each KV head, 8 keys, one mask
    assert attn(16) == [("aten._scaled_dot_product_efficient_attention.default",
                         "[2,2,2,8]x[2,2,8,8]x[2,2,8,8]x[2,1,1,8]")]
    early = attn(4)  # 5 keys, fewer than the window: a dynamic cache's is skipped, unpacked; a
    # static cache's is masked all the same (kit.workload.hf_masks), over its 5 keys
    if cache == "dynamic":
        assert len(early) == 1 and early[0][1].count("x") == 2 and early[0][1].startswith("[2,4,1,8]")
    else:
        assert early == [("aten._scaled_dot_product_efficient_attention.default",
                          "[2,2,2,8]x[2,2,5,8]x[2,2,5,8]x[2,1,1,5]")]


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_an_eager_decode_step_adds_its_mask_in_every_layer(family):
    """HF's eager attention (Gemma 2's soft cap, GPT-OSS's sinks) takes masking_utils' eager_mask,
    which never skips: a decode step builds one float mask for each kind of layer (full, sliding:
    one where each) and every layer adds it to its scores. The zoo had added none."""
    c = _tiny(family, head_dim=8, sliding_window=8, **({"layer_types": [
        "sliding_attention", "full_attention"]} if family == "gpt_oss" else {}))
    g = zoo.graph_for(c, batch=2, seq=16, mode="decode", kv_cache="dynamic", disk=False)
    keys = {}  # per layer the keys its scores span (the scores GEMM's last dim): 8 sliding, 17 full
    for n in g:
        if n.aten == "aten.bmm.default" and n.module.endswith("self_attn"):
            keys.setdefault(n.module, int(n.shapes.split(",")[-1].rstrip("]")))
    assert sorted(keys.values()) == [8, 17]
    for module, k in keys.items():  # the mask, one row of keys a sequence, added to the scores
        assert [n.shapes for n in g if n.module == module and n.aten == "aten.add.Tensor"
                and n.shapes.endswith(f"x[2,1,1,{k}]")] == [f"[2,4,1,{k}]x[2,1,1,{k}]"]
    wheres = sorted(n.shapes for n in g if n.aten == "aten.where.self")
    assert wheres == ["[2,1,1,17]x[]x[]", "[2,1,1,8]x[]x[]"]  # one a kind of layer
