"""Bad-input audit of the single-GPU surface (kit validate's multi-GPU labels, configs, measured
times and CSVs, kit.api's argument types): bad input is one KitError line or a listed skip,
never a traceback, an infinite score or a label priced as something it is not."""
import json
from pathlib import Path

import numpy as np
import pytest

from cli_support import one_error_line as _err
from kit.errors import KitError
from test_audit_single import _cache, _kit  # noqa: F401  (_cache: autouse, a fresh KIT_CACHE)


def _labels(tmp_path, names, gpu="NVIDIA_A100-SXM4-40GB", e2e=400.0):
    d = tmp_path / "labels" / gpu
    d.mkdir(parents=True, exist_ok=True)
    for n in names:
        (d / f"{n}.json").write_text(json.dumps({"e2e_latency": e2e}))
    ok = tmp_path / "labels" / "Tesla_T4"  # one label the kit predicts, so the run succeeds
    ok.mkdir(exist_ok=True)
    (ok / "gpt2-inf-64-1.json").write_text('{"e2e_latency": 10}')
    return str(tmp_path / "labels")


@pytest.mark.parametrize("name, reason", [
    ("gpt2_large-train-1024-4-dp0", "N and M must be at least 1"),  # was ZeroDivisionError
    ("gpt2_large-train-1024-4-pp4_0", "N and M must be at least 1"),
    ("gpt2_large-train-1024-4-dp4_7", "_M (micro-batches) goes with ppN_M only"),  # scored as dp4
    ("gpt2_large-train-1024-4-tp4_99", "_M (micro-batches) goes with ppN_M only"),
    ("gpt2_large-inf-1024-4-dp4", "on an inference label"),  # priced as a training step
])
def test_validate_skips_multi_gpu_labels_it_cannot_read_as_asked(tmp_path, capsys, name, reason):
    rc, out, err = _kit(capsys, "validate", "--labels", _labels(tmp_path, [name]), "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert [c["model"] for c in r["configs"]] == ["gpt2"]
    (skip,) = [s for s in r["skipped"] if s.get("option")]
    assert reason in skip["reason"]


@pytest.mark.parametrize("value", [5e-324, 1e-300, 1e-7])
def test_a_measured_time_below_a_nanosecond_is_refused(tmp_path, capsys, value):
    # 5e-324 passed as positive: MAPE inf, p90 nan, "APE inf%", exit 0
    f = tmp_path / "t.csv"
    f.write_text(f"OPName,Latency,Device,B,M,N,K\nbmm,{value!r},NVIDIA L4,1,512,512,512\n")
    assert "the least taken is 1e-06 ms" in _err(capsys, ["evaluate", "--test", str(f), "--predictors", "roofline"])
    d = tmp_path / "labels" / "Tesla_T4"
    d.mkdir(parents=True)
    (d / "gpt2-inf-64-1.json").write_text(json.dumps({"e2e_latency": value}))
    assert "the least taken is 1e-06 ms" in _err(capsys, ["validate", "--labels", str(tmp_path / "labels")])


def test_a_frame_whose_latency_is_a_bool_is_refused(tmp_path):
    from kit.api import evaluate_predictors
    from kit.predict.evaluate import load_test

    f = tmp_path / "t.csv"
    f.write_text("OPName,Latency,Device,B,M,N,K\nbmm,0.5,NVIDIA L4,1,512,512,512\n")
    frame = load_test(f)
    assert evaluate_predictors(frame, ["roofline"])[0]["n"] == 1
    frame["latency_ms"] = True  # read as 1 ms
    with pytest.raises(KitError, match="latency_ms must be a positive number"):
        evaluate_predictors(frame, ["roofline"])


def test_rows_one_field_longer_than_the_header_are_an_error(tmp_path, capsys):
    # every row one field longer: pandas took OPName for the index ("unknown op '0.5'")
    f = tmp_path / "t.csv"
    f.write_text("OPName,Latency,Device,B,M,N,K\nbmm,0.5,NVIDIA L4,1,512,512,512,9\n")
    assert "more fields than its header" in _err(capsys, ["evaluate", "--test", str(f)])


def test_evaluate_skips_a_folders_other_csvs_and_says_so(tmp_path, capsys):
    (tmp_path / "provenance").mkdir()
    (tmp_path / "provenance" / "smi.csv").write_text("timestamp,power_w\n1,300\n")
    (tmp_path / "t.csv").write_text("OPName,Latency,Device,B,M,N,K\nbmm,0.5,NVIDIA L4,1,512,512,512\n")
    rc, out, err = _kit(capsys, "evaluate", "--test", str(tmp_path), "--predictors", "roofline", "--json")
    assert rc == 0 and "skipped 1 CSV file(s) that are no measurement table: provenance/smi.csv" in err
    assert [r["n"] for r in json.loads(out)] == [1]
    (tmp_path / "t.csv").unlink()
    assert "no measurement CSV in" in _err(capsys, ["evaluate", "--test", str(tmp_path)])


@pytest.mark.parametrize("cfg, needle", [
    ({"model_type": ["gpt2"]}, "model_type must be a string"),  # was "unhashable type: 'list'"
    ({"model_type": {"a": 1}}, "model_type must be a string"),
    ({"model_type": "llama", "num_hidden_layers": 200_000, "hidden_size": 256, "num_attention_heads": 4,
      "intermediate_size": 512, "vocab_size": 1000}, "more than the 4,096 layers"),  # ran for minutes
    ({"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 2, "vocab_size": 100,
      "activation_function": "bogus"}, "activation_function 'bogus' is not one the zoo builds"),
    ({"model_type": "bert", "type_vocab_size": 0}, "type_vocab_size must be a positive whole number"),
])
def test_configs_the_zoo_cannot_build_name_the_field(tmp_path, capsys, cfg, needle):
    f = tmp_path / "c.json"
    f.write_text(json.dumps(cfg))
    assert needle in _err(capsys, ["predict", str(f), "--gpu", "t4", "--mode", "inference", "--seq", "16"])


def test_predict_model_takes_paths_and_numpy_integers_and_refuses_no_dtype(tmp_path):
    from kit.api import predict_model

    f = tmp_path / "tiny.json"
    f.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 2,
                             "vocab_size": 1000, "n_positions": 64}))
    by_path = predict_model(Path(f), "h100-sxm", mode="inference", seq=16)  # was "gave a PosixPath"
    assert by_path.total_ms == pytest.approx(predict_model(str(f), "h100-sxm", mode="inference", seq=16).total_ms)
    it = predict_model(str(f), "h100-sxm", mode="inference", batch=np.int64(2), seq=np.int64(16))
    assert it.meta["batch"] == 2 and type(it.meta["batch"]) is int
    with pytest.raises(KitError, match="unknown dtype None"):  # None was priced as fp32
        predict_model(str(f), "h100-sxm", mode="inference", seq=16, dtype=None)


def test_a_family_the_zoo_lacks_is_named_before_its_sizes(tmp_path, capsys):
    # DeBERTa-v2 ships type_vocab_size 0: the error had been about that field, not the family
    f = tmp_path / "deberta.json"
    f.write_text(json.dumps({"model_type": "deberta-v2", "type_vocab_size": 0, "hidden_size": 768}))
    assert "model_type 'deberta-v2' is not supported" in _err(
        capsys, ["predict", str(f), "--gpu", "t4", "--mode", "inference", "--seq", "16"])


def test_a_float64_module_is_priced_at_the_dtype_asked_with_a_note():
    import torch

    from kit.api import predict_model

    lin = torch.nn.Linear(64, 64).double()
    with pytest.warns(UserWarning, match="2 float64 parameter.*no FP64 kernel model"):
        it = predict_model(torch.nn.Sequential(torch.nn.Linear(64, 64), lin), "h100-sxm",
                           mode="inference", inputs=(torch.zeros(8, 64),))
    assert it.total_ms > 0
