"""Audit fixes: MoE configs that leave their expert counts out (HF's defaults, not a dense model),
kit comm's sizes, calibrations and --ranks, kit compare's unsupported rows, kit validate with a
--models filter nothing matches, help texts, and the multi-GPU layer's 'not GPT-style' error."""
import json

import numpy as np
import pytest

from kit.cli import main
from kit.errors import KitError
from cli_support import one_error_line


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


# -- 1. MoE configs without their expert counts ---------------------------------------------------

TINY = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 128}


def _params(cfg) -> int:
    from kit.workload import zoo

    model = zoo.build(cfg)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _moe(cfg):
    from kit.workload import zoo

    return zoo.build(cfg).layers[0].mlp


# HF transformers' config defaults (MixtralConfig, GptOssConfig, Qwen2MoeConfig, Qwen3MoeConfig)
@pytest.mark.parametrize("family, hf_defaults", [
    ("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 2}),
    ("gpt_oss", {"num_local_experts": 128, "num_experts_per_tok": 4}),
    ("qwen2_moe", {"num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                   "shared_expert_intermediate_size": 5632}),
    ("qwen3_moe", {"num_experts_per_tok": 8, "moe_intermediate_size": 768}),
])
def test_an_moe_config_without_its_expert_keys_is_built_as_hf_builds_it(family, hf_defaults):
    extra = {"head_dim": 16} if family == "gpt_oss" else {}
    if family.startswith("qwen"):
        extra["num_experts"] = 16  # required (a config without it is refused, missing key)
    left_out = {"model_type": family, **TINY, **extra}
    spelled = {**left_out, **hf_defaults}
    assert _params(left_out) == _params(spelled)
    moe, explicit = _moe(left_out), _moe(spelled)
    assert moe.experts.num_experts == explicit.experts.num_experts
    assert moe.top_k == explicit.top_k == hf_defaults["num_experts_per_tok"]
    if "num_local_experts" in hf_defaults:  # not a dense model: more parameters than Llama's
        assert _params(left_out) > _params({**left_out, "model_type": "llama"})


def test_kit_predict_on_a_mixtral_config_without_num_local_experts_is_not_llama(tmp_path, capsys):
    mixtral = {"model_type": "mixtral", **TINY}
    files = {}
    for name, cfg in (("left_out", mixtral), ("llama", {**mixtral, "model_type": "llama"}),
                      ("spelled", {**mixtral, "num_local_experts": 8, "num_experts_per_tok": 2})):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(cfg))
    r = {name: _json(capsys, ["predict", str(f), "--gpu", "h100-sxm", "--mode", "inference",
                              "--seq", "16", "--json"]) for name, f in files.items()}
    assert r["left_out"]["params"] == r["spelled"]["params"] > r["llama"]["params"]
    assert r["left_out"]["total_ms"] == pytest.approx(r["spelled"]["total_ms"])


# -- 2. kit comm's sizes -------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["comm", "predict", "allreduce", "--bytes", "1e400"],
    ["comm", "predict", "allreduce", "--sizes", "1:1e400"],
    ["collect-comm", "--sizes", "1e400", "--out", "{tmp}/x.txt"],
    ["comm", "predict", "allreduce", "--bytes", "1e30"],
    ["comm", "predict", "allreduce", "--sizes", "1K,1e30"],
])
def test_a_size_past_any_buffer_is_one_error_line(capsys, tmp_path, argv):
    from kit.comm.measure import MAX_BYTES  # what collect-comm measures up to

    line = one_error_line(capsys, [a.format(tmp=tmp_path) for a in argv])
    assert "more than any device holds" in line and f"{MAX_BYTES // 2**30} GiB" in line
    assert "Traceback" not in line and "Overflow" not in line


def test_prediction_takes_sizes_up_to_the_bound_collect_comm_measures(capsys, tmp_path):
    from kit.comm.measure import MAX_BYTES

    top = f"{MAX_BYTES // 2**30}G"
    r = _json(capsys, ["comm", "predict", "allreduce", "--bytes", top, "--json"])
    assert r["size_bytes"] == MAX_BYTES
    over = f"{2 * MAX_BYTES // 2**30}G"  # one size past it: both commands refuse it alike
    for argv in (["comm", "predict", "allreduce", "--bytes", over],
                 ["collect-comm", "--sizes", over, "--out", str(tmp_path / "c.txt")]):
        assert "more than any device holds" in one_error_line(capsys, argv)


def test_a_sweep_is_capped_in_sizes_and_the_error_names_the_count(capsys):
    line = one_error_line(capsys, ["comm", "predict", "allreduce", "--sizes", "1K:1M:1.0000001"])
    from kit.comm.sizes import MAX_SIZES, parse_sizes

    count = int(line.split("expands to ")[1].split(" ")[0].replace(",", ""))
    assert count > MAX_SIZES and f"{MAX_SIZES:,}" in line
    ok = parse_sizes("1:1G:1.01")  # a fine sweep still expands
    assert 1 < len(ok) <= MAX_SIZES and ok[0] == 1 and ok[-1] <= 2**30


# -- 3. a calibration that does not answer says so ----------------------------------------------

def _calibration(tmp_path, ranks: int = 8):
    import pandas as pd

    from kit.comm import BandwidthCurve, fit_table

    truth = BandwidthCurve("allreduce", ranks, 20.0, 200.0, 4e6, 1.0)
    s = np.logspace(12, 30, 8, base=2)
    table = pd.DataFrame({"kind": "allreduce", "ranks": ranks, "size_bytes": s,
                          "time_us": truth.time_us(s)})
    return fit_table(table, system="dgx-h100", source="synthetic").save(tmp_path / "cal.json")


def test_a_calibration_for_another_rank_count_is_said_unused(tmp_path, capsys):
    cal = str(_calibration(tmp_path, ranks=8))
    base = ["comm", "predict", "allreduce", "--system", "dgx-h100", "--calibration", cal]
    assert main([*base, "--bytes", "1M", "--ranks", "4", "--json"]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    notes = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert r["source"] == "preset"
    assert len(notes) == 1 and "not used" in notes[0] and cal in notes[0]
    assert "8 ranks" in r["calibration_unused"] and "4" in r["calibration_unused"]
    assert r["calibration_unused"] in notes[0]
    # the text output too, and a sweep
    assert main([*base, "--bytes", "1M", "--ranks", "4"]) == 0
    assert "not used" in capsys.readouterr().err
    t = _json(capsys, [*base, "--sizes", "1K:4K", "--ranks", "4", "--json"])
    assert "8 ranks" in t["calibration_unused"] and {row["source"] for row in t["table"]} == {"preset"}
    # another collective than the one fitted
    other = _json(capsys, ["comm", "predict", "allgather", "--system", "dgx-h100", "--calibration",
                           cal, "--bytes", "1M", "--json"])
    assert "allgather" in other["calibration_unused"]
    # the rank count it was fitted on: used, nothing said
    assert main([*base, "--bytes", "1M", "--ranks", "8", "--json"]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    assert r["source"].startswith("calibration") and r["calibration_unused"] is None
    assert "not used" not in captured.err


def test_calibration_unused_is_none_without_a_calibration():
    from kit.comm.predict import calibration_unused

    assert calibration_unused("allreduce", "dgx-h100", 4, None) is None


# -- 4. --ranks 0 --------------------------------------------------------------------------------

@pytest.mark.parametrize("ranks", ["0", "-2"])
def test_ranks_below_one_is_said_so(capsys, ranks):
    line = one_error_line(capsys, ["comm", "predict", "allreduce", "--bytes", "1M", "--ranks", ranks])
    assert "at least 1" in line and "does not fit" not in line


def test_ranks_below_one_through_the_api():
    from kit.comm import predict_collective

    with pytest.raises(KitError, match="at least 1"):
        predict_collective("allreduce", 1e6, "dgx-h100", ranks=0)


# -- 5. kit compare: an unsupported row does not say it fits ---------------------------------------

def test_an_unsupported_dtype_row_has_fits_null_in_json_and_dash_in_text(capsys):
    argv = ["compare", "gpt2", "--gpus", "h100,v100", "--dtype", "bf16", "--seq", "32", "--mode",
            "inference"]
    rows = _json(capsys, [*argv, "--json"])["rows"]
    v100 = next(r for r in rows if r["unsupported"])
    h100 = next(r for r in rows if not r["unsupported"])
    assert v100["fits"] is None and "bf16" in v100["unsupported"]
    assert h100["fits"] is True
    assert main(argv) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(v100["gpu"]))
    fits_column = line.split()[4]  # gpu, step ms, p10-p90, tokens/s, fits
    assert fits_column == "-"


# -- 6. kit validate with a --models filter no label matches ---------------------------------------

def test_validate_with_a_filter_nothing_matches_is_one_error_line(tmp_path, capsys):
    t4 = tmp_path / "Tesla_T4"
    t4.mkdir()
    (t4 / "gpt2-inf-8-1.json").write_text(json.dumps({"e2e_latency": 4.0}))
    for extra in ([], ["--json"]):
        assert main(["validate", "--labels", str(tmp_path), "--models", "llama3-8b", *extra]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        err = [ln for ln in captured.err.splitlines() if ln.strip()]
        assert len(err) == 1 and "llama3-8b" in err[0] and "gpt2" in err[0]
    r = _json(capsys, ["validate", "--labels", str(tmp_path), "--models", "gpt2", "--json"])
    assert [c["model"] for c in r["configs"]] == ["gpt2"]


# -- 8. help texts -------------------------------------------------------------------------------

def _help(capsys, argv) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return capsys.readouterr().out


def test_collect_help_lists_every_shape_grid(capsys):
    from kit.data.shapes import grid_names

    flat = "".join(_help(capsys, ["collect"]).split())  # argparse wraps lines, even at hyphens
    missing = [g for g in grid_names() if g not in flat]
    assert not missing


def test_shard_help_points_to_kit_systems(capsys):
    out = _help(capsys, ["shard"])
    assert "kit systems" in " ".join(out.split()) and "list_systems" not in out


# -- 9. the multi-GPU layer's error names what it takes --------------------------------------------

def test_the_not_a_layer_stack_error_names_what_is_accepted():
    from kit.parallel.gpt_spec import parse_model

    assert parse_model("bert-base").hidden > 0  # accepted: BERT must not read as refused
    with pytest.raises(KitError) as e:
        parse_model("resnet50")
    msg = str(e.value)
    assert "gpt*/opt*/llama*" not in msg and "BERT" in msg and "--gpu" in msg
