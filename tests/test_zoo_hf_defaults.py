"""A config that leaves out a key is built as HF transformers builds it: with the default of the
family's config class (transformers 5.25 configuration_<family>.py), not with the kit's generic
reading (hidden / heads, one KV head a query head, no window, dense). A config.json HF saves
writes these keys; a hand-written dict may not. The defaults below are HF's, quoted from its
config classes (GemmaConfig.head_dim = 256, MistralConfig.num_key_value_heads = 8, ...)."""
import json

import pytest

from kit.errors import KitError
from kit.parallel.gpt_spec import parse_model
from kit.workload import zoo
from kit.workload.zoo_modern import sliding_windows


def _params(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _tiny(family, **extra):
    # 8 heads of 8 over 64: none of HF's defaults below equals the generic reading
    return {"model_type": family, "hidden_size": 64, "num_attention_heads": 8, "num_hidden_layers": 3,
            "intermediate_size": 96, "vocab_size": 50, **extra}


# (family, key, HF 5.25's class default)
HF = [("qwen3", "head_dim", 128), ("gemma", "head_dim", 256), ("gemma2", "head_dim", 256),
      ("gemma3_text", "head_dim", 256), ("gpt_oss", "head_dim", 64),
      ("mistral", "num_key_value_heads", 8), ("qwen3", "num_key_value_heads", 32),
      ("gemma", "num_key_value_heads", 16), ("gemma2", "num_key_value_heads", 4),
      ("mixtral", "num_key_value_heads", 8), ("qwen3_moe", "num_key_value_heads", 4)]


@pytest.mark.parametrize("family,key,default", HF)
def test_a_left_out_key_builds_what_hf_builds(family, key, default):
    """Leaving the key out builds the same model as giving HF's default; a Gemma dict without
    head_dim had been 8 heads of 8 (HF: of 256), a Mistral one without num_key_value_heads 8 KV
    heads of 8 a query head... (HF: 8 KV heads whatever the query heads)."""
    moe = {"num_experts": 8, "num_experts_per_tok": 2} if family == "qwen3_moe" else {}
    given = {"head_dim": 16, "num_key_value_heads": 4 if key == "head_dim" else None, **moe}
    if key == "num_key_value_heads":  # query heads a multiple of the default's KV heads, not it
        given = {"head_dim": 8, "num_attention_heads": max(16, 2 * default), **moe}
    c = _tiny(family, **given)
    c.pop(key, None)
    attn = zoo.build(c).layers[0].self_attn
    assert (attn.head_dim if key == "head_dim" else attn.kv_heads) == default
    assert _params(zoo.build(c)) == _params(zoo.build({**c, key: default}))


def test_a_null_key_keeps_the_generic_reading():
    """HF reads a null num_key_value_heads as one a query head (LlamaConfig, Qwen2Config; 4.x's
    MistralConfig too, 5.25's refuses a null) and a null head_dim as hidden / heads (Llama,
    Mistral, Mixtral): null is not the class default."""
    attn = zoo.build(_tiny("mistral", num_key_value_heads=None, head_dim=None)).layers[0].self_attn
    assert (attn.kv_heads, attn.head_dim) == (8, 8)


def test_sliding_windows_left_out_are_hfs():
    """MistralConfig.sliding_window = 4096 on every layer, Gemma 2's on even layers, GPT-OSS's 128;
    Llama's attention reads no window at all; Qwen's slide only with use_sliding_window: Qwen2
    from max_window_layers (28) on, Qwen2-MoE on even layers below it, Qwen3-MoE everywhere."""
    assert sliding_windows(_tiny("mistral")) == [4096] * 3
    assert sliding_windows(_tiny("mistral", sliding_window=None)) == [0] * 3
    assert sliding_windows(_tiny("gemma2")) == [4096, 0, 4096]
    assert sliding_windows(_tiny("gpt_oss")) == [128, 0, 128]
    assert sliding_windows(_tiny("llama", sliding_window=16)) == [0] * 3
    assert sliding_windows(_tiny("mixtral")) == [0] * 3  # MixtralConfig.sliding_window = None
    n30 = {"num_hidden_layers": 30, "use_sliding_window": True}
    assert sliding_windows(_tiny("qwen2", **n30)) == [0] * 28 + [4096] * 2
    assert sliding_windows(_tiny("qwen2_moe", **n30)) == [4096 if i % 2 == 0 and i < 28 else 0
                                                           for i in range(30)]
    assert sliding_windows(_tiny("qwen3_moe", **n30, sliding_window=64)) == [64] * 30
    assert sliding_windows(_tiny("qwen2", num_hidden_layers=30)) == [0] * 30  # not used


def test_a_mistral_dict_without_a_window_decodes_over_hfs_window():
    """At a 64-token context past a 32-token window the sliding layers' cache holds the window."""
    c = _tiny("mistral", num_key_value_heads=4, sliding_window=32)
    implicit = {k: v for k, v in c.items() if k != "sliding_window"}
    cache = zoo.build(implicit).decode_inputs(1, 8192)[1]
    assert {layer.keys.shape[2] for layer in cache} == {4096}  # HF's window, not 8,193 keys
    assert {layer.keys.shape[2] for layer in zoo.build(c).decode_inputs(1, 64)[1]} == {32}


def _spec(tmp_path, cfg):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return parse_model(str(path), seq=64)


def test_the_multi_gpu_layer_reads_hfs_defaults_too(tmp_path):
    """gpt_spec had read a Mixtral config without num_local_experts as dense (8.0B where HF builds
    8 experts top-2, 46.7B at Mixtral-8x7B's sizes) and a Mistral one without
    num_key_value_heads as 32 KV heads (HF: 8)."""
    big = {"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
           "intermediate_size": 14336, "vocab_size": 32000}
    mixtral = _spec(tmp_path, {**big, "model_type": "mixtral"})
    assert (mixtral.experts, mixtral.topk, mixtral.kv_heads) == (8, 2, 8)
    assert mixtral.params > 5 * _spec(tmp_path, {**big, "model_type": "llama"}).params
    assert _spec(tmp_path, {**big, "model_type": "mistral"}).kv_heads == 8
    assert _spec(tmp_path, {**big, "model_type": "mistral", "num_key_value_heads": None}).kv_heads in (None, 32)
    # Gemma's heads are 256 wide when head_dim is left out: 16 x 256 is not a 3072 model's width
    with pytest.raises(KitError, match="16 heads of 256 over a 3072-wide model"):
        _spec(tmp_path, {**big, "model_type": "gemma", "hidden_size": 3072, "num_attention_heads": 16})
    # HF's intermediate_size default is its own model's (Llama 11008), not 4 x hidden: refused,
    # as the one-GPU zoo refuses it
    with pytest.raises(KitError, match="no intermediate_size"):
        _spec(tmp_path, {k: v for k, v in big.items() if k != "intermediate_size"} | {"model_type": "llama"})
    gpt = _spec(tmp_path, {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 50})
    assert gpt.f == 256 and not gpt.experts  # GPT-2's n_inner left out: 4 x n_embd, as HF


def test_qwen_layer_types_slide_only_with_use_sliding_window():
    """HF's Qwen configs null sliding_window unless use_sliding_window, whatever layer_types
    says (Qwen2Config.__post_init__); a Qwen2 dict typing its layers had slid 4096 (HF's default
    window) on them. Qwen3-MoE's attention reads no layer_types: its window is on every layer."""
    typed = {"layer_types": ["sliding_attention", "full_attention"] * 2, "num_hidden_layers": 4}
    for family in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        assert sliding_windows(_tiny(family, **typed)) == [0] * 4
        assert sliding_windows(_tiny(family, **typed, sliding_window=32)) == [0] * 4
    on = {**typed, "use_sliding_window": True, "sliding_window": 32}
    assert sliding_windows(_tiny("qwen2", **on)) == [32, 0, 32, 0]
    assert sliding_windows(_tiny("qwen3_moe", **on)) == [32] * 4


def test_the_multi_gpu_layer_refuses_zero_experts(tmp_path):
    """A MoE count of 0 is refused, as the one-GPU zoo refuses it: a Mixtral config's
    num_local_experts 0 had been read as HF's default 8 experts (before that, as a dense model)."""
    big = {"model_type": "mixtral", "hidden_size": 256, "num_attention_heads": 8, "num_hidden_layers": 2,
           "intermediate_size": 512, "vocab_size": 100}
    for key in ("num_local_experts", "num_experts_per_tok"):
        with pytest.raises(KitError, match=f"{key} must be a positive whole number, got 0"):
            _spec(tmp_path, {**big, key: 0})
        with pytest.raises(KitError, match=key):
            zoo.build({**big, key: 0})
    assert _spec(tmp_path, {**big, "num_local_experts": None}).experts == 8  # null: HF's default


def test_tensor_parallelism_over_a_captured_graph_splits_the_kv_heads_built():
    """shard_graph checks --tp against the KV heads the captured module has: a Mistral dict
    without num_key_value_heads is built with HF's 8, and --tp 16 over 32 query heads had passed
    (it had read one KV head a query head); an explicit 32 still shards 16 ways."""
    from kit.parallel.opgraph import capture_model, shard_graph
    from kit.workload.zoo_modern import kv_heads_of

    c = {"model_type": "mistral", "hidden_size": 256, "num_attention_heads": 32, "num_hidden_layers": 2,
         "intermediate_size": 512, "vocab_size": 128}
    built = kv_heads_of(c)
    assert built < 32
    with pytest.raises(KitError, match=f"key/value {built}"):
        shard_graph(capture_model(c, 1, 16, "fp16"), 2 * built)
    full = {**c, "num_key_value_heads": 32}
    assert len(shard_graph(capture_model(full, 1, 16, "fp16"), 2 * built).layer_keys) == 2
