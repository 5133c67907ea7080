"""The zoo's MoE experts as HF transformers 5 runs them: grouped_mm, batched_mm and eager."""
import pytest

from kit.errors import KitError
from kit.ops import Gemm
from kit.workload import zoo

MIXTRAL = {"model_type": "mixtral", "hidden_size": 32, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 1, "intermediate_size": 24,
           "vocab_size": 50, "num_local_experts": 4, "num_experts_per_tok": 2}


def _experts(how, mode="inference", batch=2, seq=8):
    g = zoo.graph_for({**MIXTRAL, "experts_implementation": how}, batch=batch, seq=seq, mode=mode,
                      disk=False)
    return [n for n in g if ".mlp.experts" in n.module]


def test_three_implementations_do_the_same_expert_flops_in_different_kernels():
    pairs = 2 * 8 * 2  # 16 tokens, top-2
    per_pair = 2 * 32 * (2 * 24) + 2 * 24 * 32  # up (gate and up) and down, per row
    flops = {}
    for how in ("grouped_mm", "batched_mm", "eager"):
        gemms = [n for n in _experts(how) if n.op_class == "gemm"]
        flops[how] = sum(n.op.flops for n in gemms)
        if how == "grouped_mm":
            assert [n.aten for n in gemms] == ["aten._grouped_mm.default"] * 2
            assert gemms[0].op == Gemm(m=8, n=48, k=32, b=4, dtype="fp32", kind="bmm")
        elif how == "batched_mm":  # a row per pair through its own gathered copy of the weights
            assert [n.op for n in gemms] == [Gemm(m=48, n=1, k=32, b=pairs, kind="bmm", align=8),
                                             Gemm(m=32, n=1, k=24, b=pairs, kind="bmm", align=8)]
        else:  # the loop: each of the 4 experts two GEMMs on its 8 pairs
            assert len(gemms) == 4 * 2 and {n.op.m for n in gemms} == {8}
            assert {n.module for n in gemms} == {"layers.0.mlp.experts"}
    assert flops["grouped_mm"] == pytest.approx(pairs * per_pair)
    assert flops["batched_mm"] == pytest.approx(flops["grouped_mm"])
    assert flops["eager"] == pytest.approx(flops["grouped_mm"])


def test_eager_runs_only_the_experts_a_decode_step_reaches():
    steps = _experts("eager", mode="decode", batch=1, seq=8)
    gemms = [n.op for n in steps if n.op_class == "gemm"]
    assert len(gemms) == 2 * 2 and {op.m for op in gemms} == {1}  # 2 pairs: 2 experts, a row each


def test_a_decode_step_switches_grouped_mm_to_batched_mm_but_keeps_eager():
    step = [n.op for n in _experts("grouped_mm", mode="decode", batch=3) if n.op_class == "gemm"]
    assert [op.b for op in step] == [3 * 2, 3 * 2] and {op.n for op in step} == {1}
    loop = [n for n in _experts("eager", mode="decode", batch=3) if n.op_class == "gemm"]
    assert len(loop) == 4 * 2  # 6 pairs reach all four experts


def test_training_through_grouped_experts_has_a_backward_of_twice_the_gemm_work():
    nodes = [n for n in _experts("grouped_mm", mode="train") if n.op_class == "gemm"]
    fwd = sum(n.op.flops for n in nodes if n.phase == "fwd")
    bwd = sum(n.op.flops for n in nodes if n.phase == "bwd")
    assert bwd == pytest.approx(2 * fwd)
    assert all(n.aten == "aten._grouped_mm.default" for n in nodes)


def test_an_unknown_experts_implementation_is_one_clear_error():
    with pytest.raises(KitError, match="experts_implementation 'deepgemm' is not one of grouped_mm, "
                                       "batched_mm, eager"):
        zoo.build({**MIXTRAL, "experts_implementation": "deepgemm"})


def test_parameters_match_hf_5s_stacked_experts():
    model = zoo.build(MIXTRAL)
    experts = model.layers[0].mlp.experts
    assert tuple(experts.gate_up_proj.shape) == (4, 2 * 24, 32)
    assert tuple(experts.down_proj.shape) == (4, 32, 24)
    assert tuple(model.layers[0].mlp.gate.weight.shape) == (4, 32)


def test_kit_predict_says_a_moe_decode_step_gathers_expert_weights(tmp_path, capsys):
    """HF's generate runs a decode step's experts as batched_mm, a copy of its expert's matrices
    per (token, expert) pair: batching then gains little, which the output now says."""
    import json

    from kit.cli import main

    for how, noted in (("grouped_mm", True), ("eager", False)):
        path = tmp_path / f"{how}.json"
        path.write_text(json.dumps({**MIXTRAL, "experts_implementation": how}))
        g = zoo.graph_for({**MIXTRAL, "experts_implementation": how}, batch=8, seq=64, mode="decode",
                          disk=False)
        gathers = [n for n in g if n.aten.startswith("aten.index") and n.module.endswith("experts")
                   and n.shapes.split("x")[0].count(",") == 2]  # the stacked (E, rows, cols) weight
        assert bool(gathers) == noted
        assert main(["predict", str(path), "--gpu", "h200", "--mode", "decode", "--batch", "8",
                     "--seq", "64", "--json"]) == 0
        r = json.loads(capsys.readouterr().out)
        assert (r["expert_gather_ms"] > 0) == noted
        assert main(["predict", str(path), "--gpu", "h200", "--mode", "decode", "--batch", "8",
                     "--seq", "64"]) == 0
        assert ("gathers expert weights" in capsys.readouterr().out) == noted
