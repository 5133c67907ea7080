"""The multi-GPU path's reading of HF-style config.json files into a GPTSpec: the linear biases a
Llama-family config asks for (attention_bias on q, k, v and o where HF's attention reads it,
mlp_bias on gate, up and down in Llama: transformers 5.25 models/llama/modeling_llama.py
LlamaMLP and LlamaAttention), counted as the zoo's torch module and HF count them, and the
model_types it must refuse rather than read as a GPT-2 layer (Falcon, Gemma 2 and 3, unknown
types). Expected counts come from torch (the zoo's module, torch.nn layers built by hand) or
from hand arithmetic, never from GPTSpec."""
import json

import pytest

from kit.errors import KitError
from kit.parallel.gpt_spec import parse_model
from kit.parallel.layout import Layout
from kit.parallel.memory import layer_rank_params

D, HEADS, KV, FF, LAYERS, VOCAB = 64, 4, 2, 96, 2, 100


def _params(module) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def _config_file(tmp_path, family, **extra) -> tuple[str, dict]:
    c = {"model_type": family, "hidden_size": D, "num_attention_heads": HEADS, "num_key_value_heads": KV,
         "num_hidden_layers": LAYERS, "intermediate_size": FF, "vocab_size": VOCAB, **extra}
    if family in ("qwen3", "gemma"):
        c["head_dim"] = D // HEADS
    if family == "mixtral":
        c.update(num_local_experts=2, num_experts_per_tok=1)
    path = tmp_path / f"{family}.json"
    path.write_text(json.dumps(c))
    return str(path), c


BIASES = [{}, {"attention_bias": True}, {"mlp_bias": True}, {"attention_bias": True, "mlp_bias": True}]


@pytest.mark.parametrize("family", ["llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "phi3"])
@pytest.mark.parametrize("biases", BIASES, ids=lambda b: "+".join(b) or "none")
def test_a_config_files_params_equal_the_zoo_modules(tmp_path, family, biases):
    """The zoo's module (kit.workload.zoo_modern, as HF builds each family) counted by torch. A
    Llama config with attention_bias had lost o_proj's bias (h a layer), with mlp_bias its 2f + h;
    Qwen3's and Gemma's attention_bias lost o_proj's too."""
    from kit.workload import zoo

    path, c = _config_file(tmp_path, family, **biases)
    assert parse_model(path).params == _params(zoo.build(c))


def test_llama_biases_by_hand(tmp_path):
    """HF LlamaAttention: q, k, v and o take bias=config.attention_bias (q: h, k and v: kv heads x
    head_dim each, o: h); LlamaMLP: gate, up (f each) and down (h) take bias=config.mlp_bias."""
    kv = KV * D // HEADS
    plain = parse_model(_config_file(tmp_path, "llama")[0]).params
    attn = parse_model(_config_file(tmp_path, "llama", attention_bias=True)[0]).params
    mlp = parse_model(_config_file(tmp_path, "llama", mlp_bias=True)[0]).params
    both = parse_model(_config_file(tmp_path, "llama", attention_bias=True, mlp_bias=True)[0]).params
    assert attn - plain == LAYERS * (D + 2 * kv + D) == 2 * (64 + 64 + 64)
    assert mlp - plain == LAYERS * (2 * FF + D) == 2 * (192 + 64)
    assert both - plain == (attn - plain) + (mlp - plain)


def test_biases_reach_each_ranks_weights(tmp_path):
    """What a TP rank holds (weights, gradients, optimizer state: kit.parallel.memory): q, k, v
    and gate/up biases split over tp (column-parallel), o's and down's whole on every rank
    (added after the row-parallel reduction). At tp 2 a layer's biases are
    (h + 2kv + 2f) / 2 + h + h per rank."""
    kv = KV * D // HEADS
    plain = parse_model(_config_file(tmp_path, "llama")[0])
    both = parse_model(_config_file(tmp_path, "llama", attention_bias=True, mlp_bias=True)[0])
    lay = Layout(tp=2)
    dense_plain, _ = layer_rank_params(plain, lay, 0)
    dense_both, _ = layer_rank_params(both, lay, 0)
    assert dense_both - dense_plain == (D + 2 * kv + 2 * FF) / 2 + D + D


# each bias set alone, as (family, config keys, split over tp: column-parallel q, k, v and gate,
# up; whole on every rank: row-parallel o and down). Megatron-core 0.16
# tensor_parallel/layers.py: RowParallelLinear's bias alone is marked sequence_parallel, and
# finalize_model_grads all-reduces those over TP under SP; ColumnParallelLinear's bias is split.
ONE_BIAS_SET = [("llama", {"attention_bias": True}, D + 2 * (KV * D // HEADS), D),
                ("llama", {"mlp_bias": True}, 2 * FF, D),
                ("qwen2", {}, D + 2 * (KV * D // HEADS), 0)]  # Qwen2: q, k, v alone, o has none


@pytest.mark.parametrize("family, biases, split, whole", ONE_BIAS_SET,
                         ids=["attention_bias", "mlp_bias", "qwen2_qkv"])
def test_each_bias_set_alone_is_split_or_replicated_by_its_linear(tmp_path, family, biases, split, whole):
    """With the flags apart (not all four true at once, which one wrong flag read for another
    passes): a TP rank holds split / tp + whole of a layer's biases, and under sequence
    parallelism its TP group all-reduces the whole ones' gradients with the norms' (fp32 main
    grads, 4 bytes each). Qwen2's o_proj has no bias; counting one (its q, k, v flag read for o)
    had passed the other tests."""
    from kit.parallel.build import tp_norm_grad_bytes

    plain = parse_model(_config_file(tmp_path, "llama")[0])
    spec = parse_model(_config_file(tmp_path, family, **biases)[0])
    lay = Layout(tp=2, sequence_parallel=True, dtype="bf16")  # fp32 main grads
    assert layer_rank_params(spec, lay, 0)[0] - layer_rank_params(plain, lay, 0)[0] == split / 2 + whole
    # per layer its two RMSNorms' weights (2h) and the replicated biases; the final norm once
    assert tp_norm_grad_bytes(spec, lay, 0) == (LAYERS * (2 * D + whole) + D) * 4


def test_inline_shapes_take_out_and_mlp_bias():
    """An inline shape with RMSNorm (bias=false) and biased linears counts as torch's layers."""
    torch = pytest.importorskip("torch")
    h, heads, f = 64, 4, 96
    spec = parse_model(f"llama:layers=1,hidden={h},heads={heads},ffn={f},qkv_bias=true,out_bias=true,"
                       "mlp_bias=true")
    layer = torch.nn.ModuleList([torch.nn.Linear(h, 3 * h), torch.nn.Linear(h, h),
                                 torch.nn.Linear(h, 2 * f), torch.nn.Linear(f, h),
                                 torch.nn.RMSNorm(h), torch.nn.RMSNorm(h)])
    assert spec.layer_params(0) == _params(layer)


def test_dense_gpt_specs_do_not_move():
    """GPT-2 small: HF's 124,439,808 parameters; its spec's bias flags all on."""
    spec = parse_model("gpt2")
    assert spec.params == 124_439_808
    assert spec.qkv_bias and spec.out_bias and spec.mlp_bias and spec.bias


def test_opt_enable_bias_false_drops_the_linear_biases(tmp_path):
    """HF OPTConfig's enable_bias: the six projections' biases (q, k, v, out, fc1, fc2); the
    LayerNorms keep theirs. It had been read past: 3h + h + f + h a layer counted too."""
    c = {"model_type": "opt", "hidden_size": D, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
         "ffn_dim": FF, "vocab_size": VOCAB, "max_position_embeddings": 128, "word_embed_proj_dim": D}
    on, off = tmp_path / "on.json", tmp_path / "off.json"
    on.write_text(json.dumps(c))
    off.write_text(json.dumps({**c, "enable_bias": False}))
    assert parse_model(str(on)).params - parse_model(str(off)).params == LAYERS * (3 * D + D + FF + D)


# Falcon-7B's and Falcon-40B's config.json (tiiuae/falcon-7b, tiiuae/falcon-40b on the HF Hub)
FALCON_7B = {"alibi": False, "apply_residual_connection_post_layernorm": False, "attention_dropout": 0.0,
             "bias": False, "hidden_dropout": 0.0, "hidden_size": 4544, "layer_norm_epsilon": 1e-05,
             "model_type": "falcon", "multi_query": True, "new_decoder_architecture": False,
             "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": True, "vocab_size": 65024}
FALCON_40B = {"alibi": False, "apply_residual_connection_post_layernorm": False, "attention_dropout": 0.0,
              "bias": False, "hidden_dropout": 0.0, "hidden_size": 8192, "layer_norm_epsilon": 1e-05,
              "model_type": "falcon", "new_decoder_architecture": True, "num_attention_heads": 128,
              "num_hidden_layers": 60, "num_kv_heads": 8, "parallel_attn": True, "vocab_size": 65024}
# the first release's keys (model_type RefinedWebModel: n_head, n_layer)
RW_7B = {"model_type": "RefinedWebModel", "alibi": False, "bias": False, "hidden_size": 4544,
         "multi_query": True, "n_head": 71, "n_layer": 32, "parallel_attn": True, "vocab_size": 65024}


@pytest.mark.parametrize("config", [FALCON_7B, FALCON_40B, RW_7B], ids=["7b", "40b", "refinedweb"])
def test_falcon_is_refused_naming_what_it_would_misread(tmp_path, config):
    """Read as a GPT-2 layer, Falcon-7B had been 8,228,502,400 parameters (71 KV heads, a learned
    position table, biases) where HF's FalconForCausalLM has 6,921,720,704 (transformers 5.25,
    counted on the meta device): one clear error naming model_type and its layer's keys."""
    path = tmp_path / "falcon.json"
    path.write_text(json.dumps(config))
    with pytest.raises(KitError) as e:
        parse_model(str(path))
    msg = str(e.value)
    assert repr(config["model_type"]) in msg and "parallel_attn" in msg and "alibi" in msg
    assert ("num_kv_heads" if "num_kv_heads" in config else "multi_query") in msg.split("config sets")[1]


def test_falcon_is_refused_on_one_gpu_too():
    from kit.workload import zoo

    with pytest.raises(KitError, match="model_type 'falcon' is not supported"):
        zoo.build(FALCON_7B)


@pytest.mark.parametrize("family", ["gpt_neox", "bloom", "gpt_bigcode", "gptj", "gemma2", "gemma3_text", None])
def test_model_types_the_layer_would_misread_are_refused(tmp_path, family):
    """GPT-NeoX and GPT-J (attention beside the MLP, partial rotary), BLOOM (ALiBi),
    StarCoder's gpt_bigcode (multi-query), Gemma 2 and 3 (four norms a layer, soft-capped or
    sliding-window attention) and a config naming no model_type had all been read as GPT-2 (or
    Llama) layers of their widths."""
    c = {"hidden_size": D, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
         "intermediate_size": FF, "vocab_size": VOCAB, "head_dim": D // HEADS}
    if family:
        c["model_type"] = family
    path = tmp_path / "m.json"
    path.write_text(json.dumps(c))
    with pytest.raises(KitError, match=repr(family) if family else "without model_type"):
        parse_model(str(path))


@pytest.mark.parametrize("setting", ["do_layer_norm_before", "layer_norm_elementwise_affine"])
def test_opt_norm_settings_the_layer_does_not_model_are_refused(tmp_path, setting):
    c = {"model_type": "opt", "hidden_size": D, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
         "ffn_dim": FF, "vocab_size": VOCAB, "max_position_embeddings": 128, setting: False}
    path = tmp_path / "opt.json"
    path.write_text(json.dumps(c))
    with pytest.raises(KitError, match=setting):
        parse_model(str(path))


def test_a_model_type_that_is_no_string_is_named(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"model_type": ["llama"], "hidden_size": D, "num_attention_heads": HEADS,
                                "num_hidden_layers": LAYERS, "vocab_size": VOCAB}))
    with pytest.raises(KitError, match="model_type must be a string"):
        parse_model(str(path))


def test_an_empty_model_type_is_refused_as_on_one_gpu(tmp_path):
    """A GPT-2 config (n_embd, n_layer, n_head) with model_type "" is refused by one GPU's
    zoo.build (no family ''); the multi-GPU path had read it as GPT-2 (an empty string taken as
    no model_type). Without model_type it is GPT-2, on both paths."""
    from kit.workload import zoo

    c = {"n_embd": D, "n_layer": LAYERS, "n_head": HEADS, "n_positions": 128, "vocab_size": VOCAB}
    path = tmp_path / "m.json"
    path.write_text(json.dumps({**c, "model_type": ""}))
    with pytest.raises(KitError, match="model_type ''"):
        zoo.build({**c, "model_type": ""})
    with pytest.raises(KitError, match="model_type ''"):
        parse_model(str(path))
    path.write_text(json.dumps(c))
    assert parse_model(str(path)).params == _params(zoo.build(c))


def test_a_config_without_model_type_is_asked_for_one(tmp_path):
    """Width, layers and heads under HF's names but no model_type: nothing says GPT-2, OPT or
    Llama, so the error asks for the key (the multi-GPU families named), not to use one GPU,
    which refuses it too."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"hidden_size": D, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
                                "vocab_size": VOCAB}))
    with pytest.raises(KitError, match="add its model_type, one of .*gpt2.*llama") as e:
        parse_model(str(path))
    assert "--gpu" not in str(e.value)


def test_vit_is_refused_not_read_as_one_token_under_gpt2s_head(tmp_path):
    """ViT-B/16 reads (224 / 16)^2 + 1 = 197 tokens a sample and has no vocabulary: its module
    counts 86,567,656 parameters (HF ViTForImageClassification's). Read as a GPT layer stack it
    had taken GPT-2's 50,257-word embedding and head and 1 token a sample (123,654,144 parameters,
    731 tokens/s at dp 2 on a DGX-A100 with --kernels analytic), a wrong number without a word."""
    with pytest.raises(KitError, match=r"'vit'.*patch.*--gpu"):
        parse_model("vit-b16")
    from kit.workload.zoo import config

    path = tmp_path / "vit.json"
    path.write_text(json.dumps(config("vit-b16")))
    with pytest.raises(KitError, match=r"'vit'.*--gpu"):
        parse_model(str(path))


@pytest.mark.parametrize("enable_bias", [True, False])
def test_an_opt_position_table_has_hfs_two_extra_rows(tmp_path, enable_bias):
    """HF OPTLearnedPositionalEmbedding (transformers 5.25 models/opt/modeling_opt.py) is
    max_position_embeddings + 2 rows (offset 2), as the zoo's module builds it: the multi-GPU
    count had been 2h short (opt-1.3b 1,315,753,984 against its module's 1,315,758,080)."""
    from kit.workload import zoo

    c = {"model_type": "opt", "hidden_size": D, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
         "ffn_dim": FF, "vocab_size": VOCAB, "max_position_embeddings": 128, "enable_bias": enable_bias}
    path = tmp_path / "opt.json"
    path.write_text(json.dumps(c))
    spec = parse_model(str(path))
    assert spec.positions == 128 + 2
    assert spec.params == _params(zoo.build(c))
    assert parse_model("opt-1.3b").params == _params(zoo.build("opt-1.3b"))
