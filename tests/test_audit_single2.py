"""Second audit of the single-GPU surface (kit op / predict / compare / validate, kit.api, the
panels): bad input is one KitError line, flags are never silently ignored, and outputs agree."""
import json
import sys
import textwrap

import pytest

from kit.errors import KitError
from test_audit_single import _cache, _kit  # noqa: F401  (_cache: autouse, a fresh KIT_CACHE)


# -- kit validate: the optional phase times of a label ------------------------------------------
def _label(tmp_path, content):
    d = tmp_path / "labels" / "Tesla_T4"
    d.mkdir(parents=True, exist_ok=True)
    (d / "gpt2-train-8-1.json").write_text(content)
    return str(tmp_path / "labels")


@pytest.mark.parametrize("content,word", [
    ('{"e2e_latency": 50, "fw_latency": "x", "bwall_latency": 30}', "fw_latency"),
    ('{"e2e_latency": 50, "fw_latency": 20, "bwall_latency": NaN}', "bwall_latency"),
    ('{"e2e_latency": 50, "fw_latency": -3, "bwall_latency": 30}', "fw_latency"),
    ('[50, 20, 30]', "JSON object"),
])
def test_validate_skips_a_label_with_a_bad_phase_time(tmp_path, capsys, content, word):
    # a non-numeric fw_latency or a NaN bwall_latency was a ValueError/TypeError traceback;
    # the only label unreadable: an error naming it (it was exit 0 with nothing predicted)
    rc, out, err = _kit(capsys, "validate", "--labels", _label(tmp_path, content), "--json")
    assert rc == 2 and not out and "could be read" in err and word in err
    assert "Traceback" not in err


@pytest.mark.parametrize("bwall", [', "bwall_latency": null', ""])
def test_validate_label_without_a_backward_has_no_measured_backward(tmp_path, capsys, bwall):
    # a missing bwall_latency was reported as a measured backward of 0.0 ms (null: a traceback)
    labels = _label(tmp_path, '{"e2e_latency": 50, "fw_latency": 20' + bwall + "}")
    rc, out, err = _kit(capsys, "validate", "--labels", labels, "--json")
    assert rc == 0, err
    (c,) = json.loads(out)["configs"]
    assert c["measured_fwd_ms"] == 20.0 and c["measured_bwd_ms"] is None


# -- sequence and batch flags a model cannot use -------------------------------------------------
@pytest.mark.parametrize("cmd", [["predict", "dlrm", "--gpu", "t4"], ["compare", "dlrm", "--gpus", "t4"]])
def test_dlrm_refuses_a_sequence_length(capsys, cmd):
    # --seq was ignored for DLRM (the step did not change) while predict printed "seq 1000"
    rc, out, err = _kit(capsys, *cmd, "--mode", "inference", "--seq", "1000")
    assert rc == 2 and not out and "dlrm" in err and "--seq" in err and len(err.splitlines()) == 1


def test_dlrm_panel_still_predicts_with_its_seq_control_off():
    from widgets.whole_model import WholeModelPanel

    p = WholeModelPanel(model="dlrm", gpu="t4", mode="inference", seq=128)
    assert p.seq.disabled
    p.make_chart()
    assert p.result.total_ms > 0


@pytest.fixture
def fixed_inputs(tmp_path, monkeypatch):
    (tmp_path / "audit2_fixed.py").write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        def mlp():
            return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)), (torch.zeros(4, 64),)
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("audit2_fixed", None)


@pytest.mark.parametrize("flags", [["--batch", "8"], ["--seq", "7"], ["--batch", "1"]])
def test_module_with_its_own_inputs_refuses_batch_and_seq(fixed_inputs, capsys, flags):
    # (module, inputs) fixes the shape: --batch 8 --seq 7 were ignored, yet compare multiplied
    # them into tokens/s (8 * 7 tokens for a step that ran 4 samples); --batch 1, the default's
    # value, had been taken for no --batch at all and ignored without a word
    for cmd in (["predict", "audit2_fixed:mlp", "--gpu", "t4"], ["compare", "audit2_fixed:mlp", "--gpus", "t4"]):
        rc, out, err = _kit(capsys, *cmd, *flags)
        assert rc == 2 and not out and "own example inputs" in err


def test_module_with_its_own_inputs_counts_its_samples(fixed_inputs, capsys):
    rc, out, err = _kit(capsys, "compare", "audit2_fixed:mlp", "--gpus", "t4", "--json")
    assert rc == 0, err
    r = json.loads(out)
    (row,) = r["rows"]
    # four samples (the inputs' leading dim), no sequence: samples/s = 4 / step
    assert r["unit"] == "samples" and r["batch"] == 4 and r["seq"] is None
    assert row["samples_per_s"] == pytest.approx(4 / (row["step_ms"] / 1e3))
    rc, out, err = _kit(capsys, "predict", "audit2_fixed:mlp", "--gpu", "t4")
    assert rc == 0 and "batch 4," in out.splitlines()[0] and "seq" not in out.splitlines()[0]


def test_predict_model_with_inputs_and_a_batch_is_a_kit_error():
    import torch
    import torch.nn as nn

    from kit.api import predict_model

    with pytest.raises(KitError, match="own example inputs"):
        predict_model(nn.Linear(8, 4), "t4", batch=16, inputs=(torch.zeros(2, 8),))
    with pytest.raises(KitError, match="own example inputs"):  # 1 is asked for too, not "none given"
        predict_model(nn.Linear(8, 4), "t4", batch=1, inputs=(torch.zeros(2, 8),))
    it = predict_model(nn.Linear(8, 4), "t4", inputs=(torch.zeros(2, 8),))
    assert it.meta["batch"] == 2


# -- ops ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kv_heads,word", [(0, "positive"), (-4, "positive"), (3, "divide"), (16, "divide")])
def test_attention_kv_heads_must_divide_heads(kv_heads, word):
    # kv_heads -4 gave a smaller byte count than MHA; 0 was taken as "no GQA"; 3 of 8 heads ran
    from kit.ops import Attention

    with pytest.raises(KitError, match=word):
        Attention(1, 8, 128, 128, 64, kv_heads=kv_heads)
    gqa = Attention(1, 8, 128, 128, 64, kv_heads=2)
    mha = Attention(1, 8, 128, 128, 64)
    # Q and O: 8 heads each; K and V: 2 heads each (4 bytes per fp32 element)
    assert gqa.bytes == 4 * 128 * 64 * (2 * 8 + 2 * 2) and gqa.bytes < mha.bytes


def test_embedding_table_larger_than_the_gpu_is_an_error(capsys):
    # the table (1e9 x 128 fp32 = 476.8 GiB) cannot sit in an 80 GiB GPU; only the rows read were
    # checked, so the lookup was predicted at 28 ns
    rc, out, err = _kit(capsys, "op", "embedding", "--batch", "10", "--rows", "1e9", "--dim", "128",
                        "--pooling", "10", "--gpu", "a100-sxm4-80gb")
    assert rc == 2 and not out and "table" in err and "476.8 GiB" in err
    rc, out, err = _kit(capsys, "op", "embedding", "--batch", "10", "--rows", "1e7", "--dim", "128",
                        "--pooling", "10", "--gpu", "a100-sxm4-80gb")
    assert rc == 0, err


# -- panels ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,word", [({"m": 3_000_000}, "m must be a whole number from 1 to 1,048,576"),
                                     ({"n": 0}, "n must be"), ({"k": 2.5}, "k must be"),
                                     ({"dtype": "int8"}, "unknown dtype")])
def test_gemm_panel_refuses_a_shape_its_boxes_would_clamp(kw, word):
    # the BoundedIntText boxes clamped m=3e6 to 1,048,576 and n=0 to 1 without a word, and the
    # panel predicted that other GEMM; dtype int8 was an ipywidgets TraitError
    from widgets.gemm import MAX_DIM, GemmPanel

    with pytest.raises(KitError, match=word):
        GemmPanel(**kw)
    p = GemmPanel(m=MAX_DIM, n=64, k=64)
    assert (p.m.value, p.n.value, p.k.value) == (MAX_DIM, 64, 64)


# -- predictors -----------------------------------------------------------------------------------
def test_habitat_scales_a_bf16_kernel_from_a_training_gpu_that_runs_bf16(capsys):
    # L4's nearest training GPU is the T4, which has no bf16: `--gpu l4 --dtype bf16` failed with
    # "t4 has no bf16 support", naming a GPU the user never asked about
    from kit.hardware import get_gpu
    from kit.ops import Gemm
    from kit.predict import get_predictor
    from kit.predict.habitat import nearest_gpu

    hab = get_predictor("habitat")
    assert nearest_gpu(get_gpu("l4"), hab.train_gpus).key == "t4"  # fp32 still scales from T4
    rc, out, err = _kit(capsys, "op", "gemm", "--m", "4096", "--n", "4096", "--k", "4096", "--gpu", "l4",
                        "--dtype", "bf16", "--predictor", "habitat", "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["predictor"] == "habitat" and r["latency_ms"] >= r["roofline_ms"]
    able = [g for g in hab.train_gpus if get_gpu(g).peak_tflops("bf16")]
    origin = nearest_gpu(get_gpu("l4"), able).key
    assert origin != "t4" and hab.predict([Gemm(4096, 4096, 4096, dtype="bf16")], "l4").latency_ms[0] \
        == pytest.approx(r["latency_ms"])
    # a GPU without the dtype is named as itself; a dtype no training GPU runs names the predictor
    rc, out, err = _kit(capsys, "op", "gemm", "--m", "64", "--n", "64", "--k", "64", "--gpu", "t4",
                        "--dtype", "bf16", "--predictor", "habitat")
    assert rc == 2 and "t4 has no bf16" in err
    rc, out, err = _kit(capsys, "op", "gemm", "--m", "64", "--n", "64", "--k", "64", "--gpu", "h100-sxm",
                        "--dtype", "fp8", "--predictor", "habitat")
    assert rc == 2 and "habitat" in err and "fp8" in err and "another predictor" in err


# -- evaluate and the CPU overhead --------------------------------------------------------------
@pytest.mark.parametrize("names", ["", " , ", []])
def test_evaluate_empty_predictor_list_is_an_error_not_all_of_them(names):
    # `--predictors ""` (or predictors=[]) ran all five predictors; `--predictors ,` was an error
    import pandas as pd

    from kit.api import evaluate_predictors
    from kit.predict.evaluate import ALL_PREDICTORS, parse_predictors

    assert parse_predictors(None) == list(ALL_PREDICTORS)
    with pytest.raises(KitError, match="none given"):
        evaluate_predictors(pd.DataFrame(), names)


@pytest.mark.parametrize("kw", [{"cpu_op_us": float("nan")}, {"launch_us": -100.0},
                                {"free_op_us": float("inf")}, {"cpu_op_us": "10"}])
def test_cpu_overhead_must_be_finite_and_non_negative(kw):
    # NaN gave a NaN step; launch_us -100 gave cpu_ms -7.5 and gpu_idle_ms < 0
    from kit.workload.iteration import CpuOverhead

    with pytest.raises(KitError, match="CpuOverhead"):
        CpuOverhead(**kw)


@pytest.mark.parametrize("overhead", ["x", 5, {"cpu_op_us": 1.0}])
def test_predict_model_overhead_of_the_wrong_type_is_a_kit_error(overhead):
    # was AttributeError: 'str' object has no attribute 'cpu_op_us'
    from kit.api import predict_model

    cfg = {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1, "n_positions": 64, "vocab_size": 128}
    with pytest.raises(KitError, match="CpuOverhead"):
        predict_model(cfg, "t4", seq=32, overhead=overhead)


@pytest.mark.parametrize("event,word", [({"name": "b", "dur": 5}, "ts None"),
                                        ({"name": "b", "ts": "x", "dur": 5}, "ts 'x'"),
                                        ({"name": "k", "ts": 1, "dur": None}, "dur None"),
                                        ({"name": "k", "ts": 1, "dur": -40}, "dur -40")])
def test_overhead_trace_with_a_corrupt_span_is_one_line(tmp_path, capsys, event, word):
    # a span without ts, or with a string ts / null dur, was a KeyError/ValueError/TypeError
    # traceback; a negative launch duration gave a negative launch_us
    good = [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 0, "dur": 5, "pid": 1, "tid": 1},
            {"ph": "X", "cat": "cpu_op", "name": "c", "ts": 20, "dur": 5, "pid": 1, "tid": 1}]
    bad = {"ph": "X", "cat": "cuda_runtime" if event["name"] == "k" else "cpu_op", "pid": 1, "tid": 1,
           **event, "name": "cudaLaunchKernel" if event["name"] == "k" else "b"}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": good + [bad]}))
    rc, out, err = _kit(capsys, "predict", "gpt2", "--gpu", "t4", "--seq", "32", "--overhead-trace", str(path))
    assert rc == 2 and not out and word in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("kw,word", [({"batch": 100}, "from 1 to 64"), ({"batch": 0}, "from 1 to 64"),
                                     ({"batch": 2.0}, "whole number"), ({"mode": "eval"}, "mode 'eval'"),
                                     ({"fusion": "x"}, "fusion 'x'"), ({"gpu": "nosuch"}, "unknown GPU")])
def test_whole_model_panel_refuses_what_its_controls_would_clamp(kw, word):
    # batch 100 was clamped to the slider's 64 (batch 0 to 1) and predicted without a word;
    # an unknown mode/fusion/GPU was an ipywidgets TraitError
    from widgets.whole_model import WholeModelPanel

    with pytest.raises(KitError, match=word):
        WholeModelPanel(**{"model": "gpt2", "gpu": "t4", "seq": 32, **kw})


def test_whole_model_panel_takes_a_gpu_alias_as_the_cli_does():
    # 'H100' is an alias `kit predict --gpu` takes; the panel's dropdown refused it (TraitError)
    from kit.hardware import get_gpu
    from widgets.whole_model import WholeModelPanel

    p = WholeModelPanel(model="gpt2", gpu="H100", seq=32, mode="inference")
    assert p.gpu.value == get_gpu("H100").key == p.result.gpu


@pytest.mark.parametrize("gpu", ["t4", "a100-sxm4-80gb"])
def test_predict_op_tile_dims_are_the_tile_it_names(gpu):
    # a 1x1 GEMM is one tile whichever tile is chosen: the tile-MLP named 128x32 while tile_dims,
    # blocks/SM and the last wave's fill came from kit.tiling's own 32x32 tile
    from kit.api import predict_op
    from kit.ops import Gemm

    r = predict_op(Gemm(2, 2, 10**7), gpu)  # 1x1 is a GEMV now (kit.predict.gemv): no tile
    a, b = (int(x) for x in r["tile"].split("x"))
    # one output tile, split S ways along k (kit.predict.split_k): S tiles of the named tile
    assert r["tiles"] == r["split_k"] and sorted(r["tile_dims"][:2]) == sorted([a, b])
    assert r["last_wave_fill"] == pytest.approx(r["split_k"] / r["slots"])


def _rows(**change):
    import pandas as pd

    rows = {"gpu": ["t4"] * 2, "op": ["bmm"] * 2, "op_class": ["gemm"] * 2, "measured_ms": [1.0, 2.0],
            "predicted_ms": [1.1, 2.2], "p10_ms": [1.0, 2.0], "p90_ms": [1.2, 2.4], "ape": [10.0, 10.0],
            "tile": ["128x64"] * 2}
    rows.update(change)
    return pd.DataFrame({k: v for k, v in rows.items() if v is not None})


@pytest.mark.parametrize("rows,word", [(_rows(ape=None), "lack column"), (_rows(gpu=None), "gpu"),
                                       (_rows(measured_ms=[1.0, 0.0]), "measured_ms"),
                                       (_rows(measured_ms=[1.0, float("nan")]), "measured_ms"),
                                       ([1, 2], "DataFrame")])
def test_tile_predictor_panel_checks_the_rows_it_is_given(rows, word):
    # rows without an ape (or gpu) column were a KeyError/AttributeError; a measured 0 ms gave
    # "MAPE inf%" and a log axis from 0; a list was reported as "empty"
    from widgets.tile_predictor import TilePredictorPanel

    with pytest.raises(KitError, match=word):
        TilePredictorPanel(rows=rows)
    p = TilePredictorPanel(rows=_rows())
    assert "2 kernels" in p.summary.value and "MAPE 10.0%" in p.summary.value


# -- GPUs the catalog lacks ---------------------------------------------------------------------
def test_evaluate_and_validate_take_a_gpu_file(tmp_path, capsys):
    # the error for test rows of an unknown GPU says to add it, but kit evaluate (and validate)
    # had no --gpu-file: `kit gpus --add` lasts one process, so the rows could not be scored
    from kit.hardware import unregister_gpu
    from kit.hardware.catalog import _builtin_entries

    entry = {**_builtin_entries()["l4"], "key": "audit2-l4", "name": "Audit2 L4", "aliases": []}
    (tmp_path / "gpu.json").write_text(json.dumps(entry))
    head = "OPName,Latency,Device,B,M,N,K\n"
    (tmp_path / "t.csv").write_text(head + "bmm,0.5,Audit2 L4,8,256,256,256\n")
    (tmp_path / "labels" / "Audit2 L4").mkdir(parents=True)
    (tmp_path / "labels" / "Audit2 L4" / "gpt2-inf-8-1.json").write_text('{"e2e_latency": 5.0}')
    try:
        rc, out, err = _kit(capsys, "evaluate", "--test", str(tmp_path / "t.csv"), "--predictors", "roofline")
        assert rc == 2 and "not in the GPU catalog" in err
        rc, out, err = _kit(capsys, "evaluate", "--test", str(tmp_path / "t.csv"), "--predictors",
                            "roofline", "--gpu-file", str(tmp_path / "gpu.json"), "--json")
        assert rc == 0, err
        (row,) = json.loads(out)
        assert (row["gpu"], row["n"]) == ("audit2-l4", 1)
        unregister_gpu("audit2-l4")
        rc, out, err = _kit(capsys, "validate", "--labels", str(tmp_path / "labels"), "--gpu-file",
                            str(tmp_path / "gpu.json"), "--json")
        assert rc == 0, err
        (c,) = json.loads(out)["configs"]
        assert c["gpu"] == "audit2-l4" and c["measured_ms"] == 5.0
    finally:
        unregister_gpu("audit2-l4")


# -- configs ------------------------------------------------------------------------------------
TINY = {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1, "n_positions": 64, "vocab_size": 128}
TINY_DLRM = {"model_type": "dlrm", "dense_features": 13, "bottom_mlp": [64, 16], "embedding_dim": 16,
             "table_rows": [100, 100], "top_mlp": [8], "pooling": 1}


@pytest.mark.parametrize("cfg,field", [({**TINY, "n_layer": 0}, "n_layer"), ({**TINY, "vocab_size": 0}, "vocab_size"),
                                       ({**TINY, "n_layer": False}, "n_layer"),
                                       ({**TINY_DLRM, "table_rows": []}, "table_rows"),
                                       ({**TINY_DLRM, "bottom_mlp": [64, 0]}, "bottom_mlp")])
def test_config_with_a_zero_size_is_one_kit_error(cfg, field):
    # n_layer 0 built a GPT with no layers and predicted it (0.14 ms on a T4); vocab_size 0 printed
    # torch's zero-element warning and predicted too
    from kit.workload.models import graph_of

    with pytest.raises(KitError, match=f"{field} must be"):
        graph_of(cfg, 1, None if cfg["model_type"] == "dlrm" else 8, "inference")
    assert graph_of({**TINY, "n_inner": None}, 1, 8, "inference").nodes  # null: the default


def test_config_without_seq_defaults_within_its_position_table(tmp_path, capsys):
    # a config with n_positions 64 and no --seq failed with "seq 512 is longer than 64 learned
    # positions", a 512 the user never asked for
    path = tmp_path / "short.json"
    path.write_text(json.dumps(TINY))
    rc, out, err = _kit(capsys, "predict", str(path), "--gpu", "t4", "--json")
    assert rc == 0, err
    assert json.loads(out)["seq"] == TINY["n_positions"]
    rc, out, err = _kit(capsys, "predict", str(path), "--gpu", "t4", "--seq", "65")
    assert rc == 2 and "64 learned positions" in err


@pytest.mark.parametrize("verb", ["op_tiling", "memory_problem", "predict_op"])
def test_api_op_verbs_refuse_what_is_not_an_op(verb):
    # op_tiling("x", ...) and memory_problem("x", ...) were AttributeErrors ('str' has no 'flops')
    import kit.api

    with pytest.raises(KitError, match=f"{verb} needs a kit.ops op"):
        getattr(kit.api, verb)("gemm 64x64x64", "t4")


@pytest.mark.parametrize("flag,word", [("--weights", "weights are for the learned"),
                                       ("--data", "habitat's measured reference")])
def test_evaluate_refuses_a_flag_its_predictors_would_ignore(tmp_path, capsys, flag, word):
    # --weights with only roofline, or --data without habitat, were read by nothing: a user
    # comparing weights saw the same table and took the weights for equal
    (tmp_path / "t.csv").write_text("OPName,Latency,Device,B,M,N,K\nbmm,0.5,NVIDIA L4,8,256,256,256\n")
    value = str(tmp_path / "weights")  # never read: the flag is refused first
    if flag == "--data":  # cmd_evaluate resolves --data before scoring: a real folder
        from kit.data import resolve_data_dir

        try:
            value = str(resolve_data_dir(None))
        except KitError:
            pytest.skip("no NeuSight data here")
    rc, out, err = _kit(capsys, "evaluate", "--test", str(tmp_path / "t.csv"), "--predictors", "roofline",
                        flag, value)
    assert rc == 2 and word in err and len(err.splitlines()) == 1


def test_compare_price_example_in_help_is_accepted():
    # --help's example named 'a100-sxm-80gb', which is no GPU: copying it gave "unknown GPU"
    import re

    from kit.cli import build_parser
    from kit.cli.cmd_compare import parse_prices

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["compare"]
    (example,) = re.findall(r"e\.g\. (\S+=[\d.]+(?:,\S+=[\d.]+)*)", " ".join(sub.format_help().split()))
    prices = parse_prices(example)
    assert len(prices) == example.count("=") and all(p > 0 for p in prices.values())


# -- catalog ------------------------------------------------------------------------------------
def test_gh200_host_copies_run_over_its_c2c_link_not_pcie(capsys):
    # the GH200's host link is NVLink-C2C (450 GB/s each way, its notes say 900 GB/s in all); a
    # 1 GB h2d copy was priced at PCIe gen5 x16's 63 GB/s, 15.9 ms instead of 2.2 ms
    from kit.hardware import get_gpu
    from kit.ops import Memcpy
    from kit.predict.roofline import PCIE_X16_GBS, roofline

    gh = get_gpu("gh200")
    assert gh.host_link_gbs == 450 and "NVLink-C2C" in gh.notes
    assert roofline(Memcpy(10**9, "h2d"), gh).time_ms == pytest.approx(1e9 / 450e9 * 1e3)
    h100 = get_gpu("h100-sxm")  # no host_link_gbs: PCIe of its generation
    assert h100.host_link_gbs is None
    assert roofline(Memcpy(10**9, "d2h"), h100).time_ms == pytest.approx(1e9 / (PCIE_X16_GBS[h100.pcie_gen] * 1e9) * 1e3)
    rc, out, err = _kit(capsys, "op", "memcpy", "--bytes", "1e9", "--direction", "h2d", "--gpu", "gh200", "--json")
    # its bytes at the C2C link's rate (no PCIe overhead share), plus half a dispatch floor (~15 us)
    assert rc == 0 and json.loads(out)["latency_ms"] == pytest.approx(1e9 / 450e9 * 1e3, rel=0.02)
    assert json.loads(out)["latency_ms"] > 1e9 / 450e9 * 1e3


@pytest.mark.parametrize("bad", [0, -5, "450", float("inf"), True])
def test_user_gpu_host_link_must_be_a_bandwidth(tmp_path, bad):
    from kit.hardware import load_gpu_file, unregister_gpu
    from kit.hardware.catalog import _builtin_entries

    path = tmp_path / "g.json"
    path.write_text(json.dumps({**_builtin_entries()["h100-sxm"], "key": "audit2-gpu", "name": "Audit2 GPU",
                                "aliases": [], "host_link_gbs": bad}))
    try:
        with pytest.raises(KitError, match="host_link_gbs"):
            load_gpu_file(path)
    finally:
        unregister_gpu("audit2-gpu")


def test_dlrm_prediction_reports_no_sequence_as_compare_does(capsys):
    # kit predict dlrm printed "batch 1, seq 1" (the zoo's placeholder) where kit compare
    # rightly shows no sequence
    rc, out, err = _kit(capsys, "predict", "dlrm", "--gpu", "t4", "--mode", "inference", "--json")
    assert rc == 0, err
    assert json.loads(out)["seq"] is None
    rc, out, err = _kit(capsys, "predict", "dlrm", "--gpu", "t4", "--mode", "inference")
    assert rc == 0 and "seq" not in out.splitlines()[0]


def test_habitat_vector_ops_in_a_dtype_without_a_peak_still_predict():
    # vector ops run on the fp32 lanes whatever their dtype: a bf16 layernorm on a T4 is priced by
    # every predictor, and habitat must not refuse it for the T4's missing bf16 tensor peak
    from kit.api import predict_op
    from kit.ops import LayerNorm

    for predictor in ("roofline", "tile", "habitat"):
        r = predict_op(LayerNorm(4096, 1024, "bf16"), "t4", predictor)
        assert r["latency_ms"] >= r["roofline_ms"] > 0
