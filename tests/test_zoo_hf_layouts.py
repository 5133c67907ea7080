"""Config options of HF's OPT and Switch Transformer that the zoo builds as HF does: OPT's
projected embeddings and post-norm layers (OPT-350m, NeuSight's opt.json), the Switch head tied
to the shared embedding, and Switch's every-block experts (sparse step 1)."""
import json
import os
from pathlib import Path

import pytest

from kit.errors import KitError
from kit.workload import zoo

DATA = Path(os.environ.get("KIT_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data" / "neusight"))
OPT_JSON = DATA / "data" / "DLmodel_configs" / "opt.json"


def _count(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


OPT_350M = {"model_type": "opt", "hidden_size": 1024, "ffn_dim": 4096, "num_hidden_layers": 24,
            "num_attention_heads": 16, "vocab_size": 50272, "max_position_embeddings": 2048,
            "word_embed_proj_dim": 512, "do_layer_norm_before": False}


def test_opt_350m_has_hfs_parameters():
    """facebook/opt-350m: embeddings of 512 projected in and out of 1024-wide post-norm layers,
    no final norm; counted by hand: 50272*512 + 2050*1024 + 2*512*1024 + 24*(4*(1024^2+1024)
    + 2*1024*4096 + 4096 + 1024 + 4*1024) = 331,196,416 (the head tied to the embedding)."""
    d, p, ff, v, layers = 1024, 512, 4096, 50272, 24
    per_layer = 4 * (d * d + d) + 2 * d * ff + ff + d + 4 * d
    assert _count(zoo.build(OPT_350M)) == v * p + 2050 * d + 2 * p * d + layers * per_layer == 331_196_416


def test_projected_opt_captures_with_its_projections_and_no_final_norm():
    tiny = {**OPT_350M, "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 100, "word_embed_proj_dim": 32}
    g = zoo.graph_for(tiny, 2, 16, "train", disk=False)
    gemms = {n.module for n in g if n.op_class == "gemm" and n.phase == "fwd"}
    assert {"project_in", "project_out", "lm_head"} <= gemms
    norms = [n.module for n in g if n.op_class == "layernorm" and n.phase == "fwd"]
    assert len(norms) == 2 * 2 and "final_layer_norm" not in norms  # two a layer, none after
    # the pre-norm layout keeps its final norm
    pre = zoo.graph_for({**tiny, "do_layer_norm_before": True}, 2, 16, "inference", disk=False)
    assert "final_layer_norm" in {n.module for n in pre if n.op_class == "layernorm"}
    # a decode step over a KV cache runs through the projections too
    dec = zoo.graph_for(tiny, 2, 16, "decode", disk=False)
    assert {"project_in", "project_out"} <= {n.module for n in dec if n.op_class == "gemm"}


@pytest.mark.skipif(not OPT_JSON.is_file(), reason="NeuSight configs not present (set KIT_DATA)")
def test_neusights_opt_json_captures():
    """Its word_embed_proj_dim 2048 against hidden_size 512 had failed on the add of the 2048-wide
    token embeddings to the 512-wide positions."""
    cfg = json.loads(OPT_JSON.read_text())
    g = zoo.graph_for(cfg, 1, 32, "inference", disk=False)
    assert g.meta["params"] == _count(zoo.build(cfg))
    head = [n for n in g if n.module == "lm_head" and n.op_class == "gemm"]
    assert head and head[0].op.k == cfg["word_embed_proj_dim"]


def test_switch_head_is_tied_to_the_shared_embedding():
    """HF ties it (tie_word_embeddings defaults to true) and scales the decoder output then only:
    switch-base-8 is 619,339,008 parameters, not 644M with a head of its own."""
    base8 = {**zoo.config("switch-base-4"), "num_experts": 8}
    model = zoo.build(base8)
    assert model.lm_head.weight is model.shared.weight
    assert _count(model) == 619_339_008
    untied = zoo.build({**base8, "tie_word_embeddings": False})
    assert untied.lm_head.weight is not untied.shared.weight and not untied.scaled
    assert _count(untied) == 619_339_008 + 768 * 32128


def test_switch_sparse_step_one_puts_experts_in_every_block():
    """HF's SwitchTransformersStack: sparse step 1 (Switch-C, Switch-XXL) makes every block
    sparse; i % 1 == 1 had made none."""
    tiny = {"model_type": "switch_transformers", "d_model": 32, "d_ff": 64, "d_kv": 8, "num_heads": 4,
            "num_layers": 4, "vocab_size": 50, "num_experts": 2}
    sparse = lambda m: [hasattr(b.mlp, "experts") for b in (*m.encoder, *m.decoder)]  # noqa: E731
    assert sparse(zoo.build({**tiny, "encoder_sparse_step": 1, "decoder_sparse_step": 1})) == [True] * 8
    assert sparse(zoo.build({**tiny, "encoder_sparse_step": 2, "decoder_sparse_step": 2})) == \
        [False, True, False, True] * 2
    assert sparse(zoo.build({**tiny, "encoder_sparse_step": 0, "decoder_sparse_step": 3})) == \
        [False] * 4 + [False, True, False, False]


def test_switch_sparse_steps_follow_the_sparse_layer_counts():
    """HF's SwitchTransformersConfig sets a stack's step to its layers // num_sparse_*_layers
    (default 3) when no step is given; the kit had used step 2 whatever the counts said."""
    tiny = {"model_type": "switch_transformers", "d_model": 32, "d_ff": 64, "d_kv": 8, "num_heads": 4,
            "num_layers": 8, "vocab_size": 50, "num_experts": 2}
    enc = lambda m: [hasattr(b.mlp, "experts") for b in m.encoder]  # noqa: E731
    dec = lambda m: [hasattr(b.mlp, "experts") for b in m.decoder]  # noqa: E731
    every = zoo.build({**tiny, "num_sparse_encoder_layers": 8, "num_sparse_decoder_layers": 2})
    assert enc(every) == [True] * 8  # step 8 // 8 = 1
    assert dec(every) == [i % 4 == 1 for i in range(8)]  # step 8 // 2 = 4
    assert enc(zoo.build(tiny)) == [i % 2 == 1 for i in range(8)]  # HF's default 3: step 8 // 3 = 2
    assert not any(enc(zoo.build({**tiny, "num_sparse_encoder_layers": 0})))
    # a step given outright wins over the count, as HF sets the config's kwargs after
    assert enc(zoo.build({**tiny, "num_sparse_encoder_layers": 8, "encoder_sparse_step": 4})) == \
        [i % 4 == 1 for i in range(8)]


@pytest.mark.parametrize("field,value", [("encoder_sparse_step", -1), ("encoder_sparse_step", 2.5),
                                         ("decoder_sparse_step", "2"), ("num_sparse_encoder_layers", True),
                                         ("num_sparse_decoder_layers", -3)])
def test_a_switch_sparse_field_that_is_no_count_is_named(field, value):
    """-1 and 2.5 had built other sparse blocks silently; "2" had been named by Python's "'>' not
    supported"."""
    tiny = {"model_type": "switch_transformers", "d_model": 32, "d_ff": 64, "d_kv": 8, "num_heads": 4,
            "num_layers": 4, "vocab_size": 50, "num_experts": 2}
    with pytest.raises(KitError, match=rf"{field} must be a whole number of at least 0"):
        zoo.build({**tiny, field: value})


@pytest.mark.parametrize("extra,named", [({"decoder_sparse_step": 0}, "decoder_sparse_step"),
                                         ({"decoder_sparse_step": "1"}, "decoder_sparse_step"),
                                         ({"mlp_only_layers": 3}, "mlp_only_layers"),
                                         ({"mlp_only_layers": [0, -1]}, "mlp_only_layers")])
def test_a_qwen_moe_sparse_field_that_is_no_layout_is_named(extra, named):
    """A step of 0 had been named "integer modulo by zero", an mlp_only_layers of 3 "'int' is
    not iterable"."""
    with pytest.raises(KitError, match=rf"{named} must be"):
        zoo.build({**zoo.config("qwen3-30b-a3b"), **extra})


@pytest.mark.parametrize("width", [0, -5, 2.5, "512", True])
def test_a_projected_embedding_width_that_is_no_size_is_named(width):
    """0 had been blamed on an 'embedding_bag: dim', the others on torch.empty's arguments."""
    tiny = {**OPT_350M, "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 100}
    with pytest.raises(KitError, match=r"word_embed_proj_dim must be a positive whole number, got"):
        zoo.graph_for({**tiny, "word_embed_proj_dim": width}, 1, 16, "inference", disk=False)


def test_a_null_projected_embedding_width_is_the_hidden_size():
    """HF's OPTConfig reads word_embed_proj_dim null as hidden_size: no projections."""
    tiny = {"model_type": "opt", "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 100}
    model = zoo.build({**tiny, "word_embed_proj_dim": None})
    assert model.project_in is None and _count(model) == _count(zoo.build(tiny))


def test_a_null_decoder_layer_count_is_the_encoders():
    """HF's T5 and Switch configs read num_decoder_layers null as num_layers; the kit had
    refused it with Python's "unsupported operand type(s) for //: 'NoneType' and 'int'"."""
    tiny = {"model_type": "switch_transformers", "d_model": 32, "d_ff": 64, "d_kv": 8, "num_heads": 4,
            "num_layers": 6, "vocab_size": 50, "num_experts": 2, "num_sparse_decoder_layers": 3}
    m = zoo.build({**tiny, "num_decoder_layers": None})
    assert len(m.decoder) == 6
    assert [hasattr(b.mlp, "experts") for b in m.decoder] == [i % 2 == 1 for i in range(6)]  # 6 // 3
