"""The zoo: configs match NeuSight's, parameter counts match the published ones, caching works."""
import json
import os
from pathlib import Path

import pytest

from kit.errors import KitError
from kit.workload import zoo

DATA = Path(os.environ.get("KIT_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data" / "neusight"))
CONFIGS = DATA / "data" / "DLmodel_configs"


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.skipif(not CONFIGS.is_dir(), reason="NeuSight configs not present (set KIT_DATA)")
def test_zoo_matches_neusight_configs():
    checked = 0
    for f in sorted(CONFIGS.glob("*.json")):
        try:
            key = zoo.resolve(f.stem)
        except KitError:
            continue  # e.g. opt.json: a 1-layer test config without a zoo entry
        ours, theirs = zoo.config(key), json.loads(f.read_text())
        shared = set(ours) & set(theirs)
        assert {"vocab_size"} <= shared, f.stem
        for k in shared - {"model_type"}:
            assert ours[k] == theirs[k], (f.stem, k, ours[k], theirs[k])
        checked += 1
    assert checked >= 10


def test_parameter_counts_match_published_numbers():
    # HF: gpt2 124,439,808; bert-base BertForPreTraining 110,106,428; Llama-3-8B 8,030,261,248
    assert _count(zoo.build("gpt2")) == 124_439_808
    assert _count(zoo.build("bert-base")) == 110_106_428
    assert _count(zoo.build("llama3-8b")) == 8_030_261_248


def test_gpt3_xl_is_neusights_config_and_gpt3_1p3b_the_papers():
    """NeuSight's gpt3_xl is 3072 wide (2.9B); Brown et al.'s XL (Table 2.1) is 2048 wide, 1.3B."""
    V, P = 50257, 2048
    for name, d in (("gpt3-xl", 3072), ("gpt3-1.3b", 2048)):
        assert _count(zoo.build(name)) == 24 * (12 * d * d + 13 * d) + V * d + P * d + 2 * d
    assert round(_count(zoo.build("gpt3-1.3b")) / 1e9, 1) == 1.3


def test_names_do_not_collide_and_a_decimal_point_counts():
    """gpt3-1.3b (1.3 billion) must not resolve to gpt3-13b, as punctuation-blind matching did."""
    from kit.workload.zoo_configs import _norm

    assert zoo.resolve("GPT3_XL_paper") == "gpt3-1.3b" == zoo.resolve("gpt3-1p3b")
    assert zoo.resolve("gpt3-13b") == "gpt3-13b" == zoo.resolve("GPT3_13")
    assert zoo.resolve("gpt3-2p7b") == "gpt3-2.7b" == zoo.resolve("gpt3_27")
    assert zoo.resolve("OPT 1.3B") == "opt-1.3b"
    seen = {}
    for key, (_, _, aliases) in zoo.ZOO.items():
        for name in (key, *aliases):
            assert seen.setdefault(_norm(name), key) == key, (name, seen[_norm(name)], key)
            assert zoo.resolve(name) == key


def test_huge_model_builds_on_meta_and_matches_formula():
    m = zoo.build("gpt3-175b")
    d, L, V, P = 12288, 96, 50257, 2048
    assert _count(m) == L * (12 * d * d + 13 * d) + V * d + P * d + 2 * d
    assert next(m.parameters()).device.type == "meta"


def test_aliases_and_errors():
    assert zoo.resolve("GPT2_Large") == "gpt2-large" and zoo.resolve("gpt3_27") == "gpt3-2.7b"
    with pytest.raises(KitError, match="unknown model"):
        zoo.resolve("gpt5")
    with pytest.raises(KitError, match="model_type"):
        zoo.build({"model_type": "rnn"})
    with pytest.raises(KitError, match="missing key"):
        zoo.build({"model_type": "gpt2", "n_embd": 64})


def test_config_dict_capture_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path))
    cfg = {"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 2, "vocab_size": 100,
           "n_positions": 16}
    g1 = zoo.graph_for(cfg, batch=1, seq=8, mode="inference")
    assert zoo.graph_for(cfg, batch=1, seq=8, mode="inference") is g1  # in-process LRU
    files = list((tmp_path / "workload").glob("*.pkl"))
    assert len(files) == 1
    zoo._LRU.clear()
    g2 = zoo.graph_for(cfg, batch=1, seq=8, mode="inference")  # from disk
    assert g2 is not g1 and [n.op for n in g2] == [n.op for n in g1]
    # two layers: the matmul-attention of each layer, four bmm in all
    assert sum(1 for n in g1 if n.name() == "bmm") == 4
    assert g1.layers() == [0, 1]
    with pytest.raises(KitError, match="batch"):
        zoo.graph_for(cfg, batch=0, seq=8)


def test_every_family_captures_small():
    tiny = {
        "bert": {"model_type": "bert", "hidden_size": 32, "num_attention_heads": 2,
                 "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": 50},
        "opt": {"model_type": "opt", "hidden_size": 32, "num_attention_heads": 2,
                "num_hidden_layers": 1, "ffn_dim": 64, "vocab_size": 50},
        "llama": {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "num_hidden_layers": 1, "intermediate_size": 64,
                  "vocab_size": 50},
        "mixtral": {"model_type": "mixtral", "hidden_size": 32, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "num_hidden_layers": 1, "intermediate_size": 64,
                    "vocab_size": 50, "num_local_experts": 4, "num_experts_per_tok": 2},
        "switch": {"model_type": "switch_transformers", "d_model": 32, "d_ff": 64, "d_kv": 8,
                   "num_heads": 4, "num_layers": 2, "num_experts": 2, "expert_capacity": 4,
                   "vocab_size": 50},
        "dlrm": {"model_type": "dlrm", "dense_features": 4, "bottom_mlp": [8], "embedding_dim": 8,
                 "table_rows": [100, 100], "top_mlp": [8]},
    }
    for name, cfg in tiny.items():
        g = zoo.graph_for(cfg, batch=2, seq=8, mode="train" if name in ("llama", "mixtral") else "inference")
        classes = g.op_classes()
        assert classes["gemm"] > 0 and not g.unknown_ops(), name
        if name in ("llama", "mixtral"):
            assert classes["attention"] == 2  # one forward, one backward SDPA kernel
        if name == "mixtral":  # HF 5's grouped_mm experts: one grouped GEMM up, one down
            assert [n.aten for n in g.by_phase("fwd") if n.module.endswith(".experts")
                    and n.op_class == "gemm"] == ["aten._grouped_mm.default"] * 2
        if name == "dlrm":
            assert classes["embedding"] >= 2


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_replicated_capture_equals_full_capture(family):
    from kit.workload.capture import capture

    cfg = ({"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 5, "vocab_size": 100,
            "n_positions": 16} if family == "gpt2" else
           {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 5, "intermediate_size": 64, "vocab_size": 50})
    fast = zoo.graph_for(cfg, batch=2, seq=8, mode="train", disk=False)
    assert fast.meta.get("replicated_from") == 3
    model = zoo.build(cfg)
    full = capture(model, model.example_inputs(2, 8), mode="train", loss=zoo.lm_loss(cfg["vocab_size"]))
    key = lambda g: [(n.aten, n.phase, n.module, n.layer, n.deps, n.op) for n in g]  # noqa: E731
    assert key(fast) == key(full)
    for k in ("params", "param_bytes", "activation_bytes"):
        assert fast.meta[k] == full.meta[k], k


def test_replicated_capture_with_optimizer_matches_full():
    from kit.workload.capture import capture

    cfg = {"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 5, "vocab_size": 100,
           "n_positions": 16}
    fast = zoo.graph_for(cfg, batch=2, seq=8, mode="train", optimizer="adamw", disk=False)
    model = zoo.build(cfg)
    full = capture(model, model.example_inputs(2, 8), mode="train", optimizer="adamw",
                   loss=zoo.lm_loss(cfg["vocab_size"]))
    key = lambda g: [(n.aten, n.phase, n.op) for n in g]  # noqa: E731
    assert key(fast) == key(full) and fast.meta["optimizer"] == "adamw"
    opt = fast.by_phase("opt")
    assert opt and opt[0].deps == (opt[0].id - 1,)  # waits for the end of the backward pass


SWITCH4_CSV = DATA / "label" / "NVIDIA_L4" / "switch4-inf-512-1.csv"


@pytest.mark.skipif(not SWITCH4_CSV.is_file(), reason="NeuSight L4 labels not present (set KIT_DATA)")
def test_switch_base_4_matches_the_model_neusight_measured_on_l4():
    """No DLmodel_config ships for the L4 label "switch4": its per-node CSV is the reference. Every
    linear layer it ran (in, out features), its block count and its expert count match the zoo's."""
    import csv
    import re

    import torch

    csv.field_size_limit(1 << 30)
    with SWITCH4_CSV.open() as f:
        rows = [r for r in csv.DictReader(f) if r["op"] == "call_module"]
    linear_names = {"q", "k", "v", "o", "wi", "wo", "lm_head", "classifier"}
    theirs = set()
    for r in rows:
        if r["target"].split(".")[-1] in linear_names:
            in_shape = json.loads(r["input_shapes"])[0]
            out_shape = [int(x) for x in re.findall(r"\d+", r["output_shape"])]
            theirs.add((in_shape[-1], out_shape[-1]))
    blocks = {int(m.group(1)) for r in rows if (m := re.match(r"encoder\.block\.(\d+)\.", r["target"]))}
    experts = {int(m.group(1)) for r in rows if (m := re.search(r"expert_(\d+)", r["target"]))}

    model = zoo.build("switch4")
    ours = {(m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    cfg = zoo.config("switch-base-4")
    assert theirs == ours
    assert len(blocks) == cfg["num_layers"] and len(experts) == cfg["num_experts"]


def test_sequence_longer_than_a_learned_position_table_is_one_clear_error():
    # GPT-2 and BERT read positions from a table of n_positions / max_position_embeddings rows
    for name, field in (("gpt2", "n_positions"), ("bert-large", "max_position_embeddings")):
        limit = zoo.config(name)[field]
        with pytest.raises(KitError, match=f"seq {limit + 1} is longer than .*{limit} learned positions"):
            zoo.graph_for(name, 1, limit + 1, "inference", disk=False)
    small = {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1, "n_positions": 32,
             "vocab_size": 100}
    assert zoo.graph_for(small, 1, 32, "inference", disk=False).nodes   # the limit itself is fine
    with pytest.raises(KitError, match="33 is longer"):
        zoo.graph_for(small, 1, 33, "inference", disk=False)
    # rotary models have no table: a long sequence is only a bigger graph
    llama = {**zoo.config("llama3-8b"), "num_hidden_layers": 1, "max_position_embeddings": 64}
    assert zoo.max_seq(llama) is None
    zoo.check_seq(llama, 4096)


def test_t5_is_the_switch_transformer_without_experts():
    """HF: google-t5/t5-base 222,903,552 parameters (head tied to the shared embedding),
    google/flan-t5-xl 2,849,757,184 (gated-gelu FF, head of its own)."""
    base, flan = zoo.build("t5-base"), zoo.build("flan-t5-xl")
    assert _count_unique(base) == 222_903_552 and _count_unique(flan) == 2_849_757_184
    assert base.lm_head.weight is base.shared.weight and flan.lm_head.weight is not flan.shared.weight
    tiny = {"model_type": "t5", "d_model": 32, "d_ff": 64, "d_kv": 8, "num_heads": 4,
            "num_layers": 2, "vocab_size": 50}
    g = zoo.graph_for(tiny, batch=2, seq=8, mode="train", disk=False)
    assert not any(".experts." in n.module for n in g) and not g.unknown_ops()
    # HF 5 runs T5's attention through SDPA, the position bias as a float mask (no causal skip);
    # the Switch Transformer stays eager, as NeuSight's HF 4 labels ran it
    att = [n.op for n in g if n.op_class == "attention" and n.phase == "fwd"]
    assert len(att) == 2 + 2 * 2 and not any(a.causal for a in att)  # enc self; dec self, cross
    assert not any(n.op_class == "softmax" for n in g if n.module != "loss")
    assert {n.module for n in g if n.op_class == "softmax"} == {"loss"}  # the training loss
    switch = zoo.graph_for({**tiny, "model_type": "switch_transformers", "num_experts": 2},
                           batch=2, seq=8, mode="inference", disk=False)
    assert any(n.op_class == "softmax" for n in switch) and not any(n.op_class == "attention" for n in switch)
    # in fp16, HF keeps T5's wo in fp32 and casts into it; the norms bring the stream back to fp16
    half = zoo.graph_for(tiny, batch=2, seq=8, mode="inference", dtype="fp16", disk=False)
    dtypes = {n.module.rsplit(".", 1)[-1]: n.op.dtype for n in half if n.op_class == "gemm"}
    assert dtypes["wo"] == "fp32" and dtypes["wi"] == "fp16" and dtypes["q"] == "fp16"
    assert {n.op.dtype for n in zoo.graph_for({**tiny, "model_type": "switch_transformers", "num_experts": 2},
                                              batch=2, seq=8, mode="inference", dtype="fp16", disk=False)
            if n.op_class == "gemm"} == {"fp16"}
    gated = zoo.graph_for({**tiny, "feed_forward_proj": "gated-gelu"}, batch=2, seq=8,
                          mode="inference", disk=False)
    ff = {n.module.rsplit(".", 1)[-1] for n in gated if ".mlp." in n.module and n.op_class == "gemm"}
    assert ff == {"wi_0", "wi_1", "wo"}
    # HF's T5Config runs "gated-gelu" as gelu_new (NewGELUActivation): the tanh formula written
    # out, eight kernels (pow, mul, add, mul, tanh, add, mul, mul), not one fused aten.gelu
    ff_ops = [n.aten for n in gated if ".mlp" in n.module and n.op_class != "gemm"]
    assert not any(a.startswith("aten.gelu") for a in ff_ops)
    assert sum(a.startswith("aten.tanh") for a in ff_ops) == 4  # one a FF: 2 encoder, 2 decoder
    assert sum(a.startswith("aten.pow") for a in ff_ops) == 4
    with pytest.raises(KitError, match="feed_forward_proj 'gated-relu2' is not one the zoo builds"):
        zoo.build({**tiny, "feed_forward_proj": "gated-relu2"})
    with pytest.raises(KitError, match="decoder-only"):
        zoo.graph_for("t5-base", batch=1, seq=8, mode="decode")


def _count_unique(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
