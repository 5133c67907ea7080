"""`kit predict`, `kit validate`, `kit compare` end to end, on tiny models."""
import json

import pytest

from kit.cli import main

GPU = "a100-pcie-40gb"
TINY = '''
import torch.nn as nn

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.head = nn.Linear(16, 50)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = x + layer(x).relu()
        return self.head(x)

def make():
    return Tiny()

def config():
    return {"model_type": "gpt2", "n_embd": 16, "n_head": 2, "n_layer": 1, "vocab_size": 50, "n_positions": 8}
'''


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    (tmp_path / "tinymodel.py").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _json(capsys, argv):
    rc = main(argv + ["--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def test_predict_module_callable_with_trace(tiny, capsys):
    r = _json(capsys, ["predict", "tinymodel:make", "--gpu", GPU, "--batch", "2", "--seq", "4",
                       "--trace", str(tiny / "t.json")])
    assert r["mode"] == "train" and set(r["phases_ms"]) == {"fwd", "bwd"}
    assert r["total_ms"] == pytest.approx(sum(r["phases_ms"].values()))
    assert sum(c["share"] for c in r["by_class"]) == pytest.approx(1.0)
    assert 0 < len(r["top_kernels"]) <= 10
    trace = json.loads((tiny / "t.json").read_text())
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])
    text_rc = main(["predict", "tinymodel:config", "--gpu", GPU, "--mode", "inference", "--seq", "8"])
    assert text_rc == 0 and "total" in capsys.readouterr().out


def test_predict_errors_are_one_line(tiny, capsys):
    for argv, word in ((["predict", "tinymodel:make", "--gpu", "z9000"], "unknown GPU"),
                       (["predict", "gpt5", "--gpu", GPU], "unknown model"),
                       (["predict", "tinymodel:nothing", "--gpu", GPU], "no attribute"),
                       (["predict", "nomodule:make", "--gpu", GPU], "cannot import")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert word in err and len(err.splitlines()) == 1


def test_compare_throughput_cost_and_memory(tiny, capsys):
    r = _json(capsys, ["compare", "tinymodel:make", "--gpus", f"{GPU},t4", "--batch", "2", "--seq", "4",
                       "--price-per-hour", "t4=0.36"])
    rows = {row["gpu"]: row for row in r["rows"]}
    t4 = rows["t4"]
    assert t4["tokens_per_s"] == pytest.approx(8 / (t4["step_ms"] / 1e3))
    assert t4["cost_per_m_tokens"] == pytest.approx(0.36 / 3600 * t4["step_ms"] / 1e3 / 8 * 1e6)
    assert rows[GPU]["cost_per_m_tokens"] is None
    assert t4["energy_j_per_step"] == pytest.approx(t4["tdp_w"] * t4["step_ms"] / 1e3)
    params = 50 * 16 + 2 * (16 * 16 + 16) + 16 * 50 + 50
    mem = r["memory"]
    assert mem["weights_bytes"] == 4 * params and mem["grads_bytes"] == 4 * params
    assert mem["optimizer_bytes"] == 2 * 4 * params  # AdamW assumed when training
    assert mem["optimizer_assumed"] == "adamw"  # and said so: the step timed has no update
    assert t4["fits"] is True
    named = _json(capsys, ["compare", "tinymodel:make", "--gpus", "t4", "--batch", "2", "--seq", "4",
                           "--optimizer", "sgd"])["memory"]
    assert named["optimizer_bytes"] == 4 * params and "optimizer_assumed" not in named
    assert _json(capsys, ["compare", "tinymodel:make", "--gpus", "t4", "--batch", "2", "--seq", "4",
                          "--optimizer", "none"])["memory"]["optimizer_bytes"] == 0
    assert main(["compare", "tinymodel:make", "--gpus", "t4", "--batch", "2", "--seq", "4"]) == 0
    assert "(AdamW's state, assumed: the step timed has no optimizer" in capsys.readouterr().out
    lo, hi = t4["band_ms"]
    assert lo <= t4["step_ms"] <= hi
    assert main(["compare", "tinymodel:make", "--gpus", "t4", "--batch", "2", "--seq", "4"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("t4 "))
    assert (f"{lo:.2f}-{hi:.2f}" if hi > lo else " - ") in line
    assert main(["compare", "tinymodel:make", "--gpus", "t4", "--price-per-hour", "t4=cheap"]) == 2
    assert "GPU=DOLLARS" in capsys.readouterr().err


def test_compare_dlrm_counts_samples_and_has_no_sequence(capsys):
    r = _json(capsys, ["compare", "dlrm", "--gpus", "t4", "--batch", "64"])
    assert r["unit"] == "samples" and r["seq"] is None
    row = r["rows"][0]
    assert row["samples_per_s"] == pytest.approx(64 / (row["step_ms"] / 1e3))
    assert main(["compare", "dlrm", "--gpus", "t4", "--batch", "64"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.startswith("dlrm train, batch 64, fp32") and "seq" not in head


def test_validate_labels(tmp_path, capsys):
    t4 = tmp_path / "Tesla_T4"
    t4.mkdir()
    lab = {"num_layer": 12, "e2e_latency": 4.0, "fw_latency": 4.0, "bwall_latency": 0}
    for name in ("gpt2-inf-8-1", "gpt2-train-8-1-tp4", "resnet-inf-8-1"):
        (t4 / f"{name}.json").write_text(json.dumps(lab))
    (tmp_path / "Unknown_GPU").mkdir()
    (tmp_path / "Unknown_GPU" / "gpt2-inf-8-1.json").write_text(json.dumps(lab))
    r = _json(capsys, ["validate", "--labels", str(tmp_path)])
    assert len(r["configs"]) == 1
    c = r["configs"][0]
    assert (c["gpu"], c["model"], c["mode"], c["seq"], c["batch"]) == ("t4", "gpt2", "inference", 8, 1)
    assert c["ape"] == pytest.approx(abs(c["predicted_ms"] - 4.0) / 4.0)
    from kit.api import predict_model

    assert c["predicted_ms"] == pytest.approx(predict_model("gpt2", "t4", "inference", 1, 8).total_ms)
    skipped = {(s.get("model"), s.get("option"), s.get("gpu")): s["reason"] for s in r["skipped"]}
    assert len(skipped) == 3  # nothing dropped: every label not predicted is listed with a reason
    assert "4 x t4" in skipped[("gpt2", "tp4", "t4")]  # no 4-GPU T4 system to run tp4 on
    assert "not in the zoo" in skipped[("resnet", "", "t4")]
    assert "not in the catalog" in skipped[("gpt2", "", "Unknown_GPU")]
    it = predict_model("gpt2", "t4", "inference", 1, 8)
    assert c["band_ms"] == pytest.approx([it.total_p10_ms, it.total_p90_ms])
    assert c["in_band"] == (c["band_ms"][0] <= 4.0 <= c["band_ms"][1])
    assert r["summary"] == [{"gpu": "t4", "mode": "inference", "configs": 1, "mean_ape": c["ape"],
                             "max_ape": c["ape"], "band_coverage": float(c["in_band"])}]
    assert main(["validate", "--labels", str(tmp_path / "nope")]) == 2


def test_validate_band_coverage_counts_the_labels_inside(tmp_path, capsys):
    """Two labels: one at the predicted step (inside its band), one ten times slower than its
    prediction (outside): half the measurements lie in the band."""
    from kit.api import predict_model

    it = predict_model("gpt2", "t4", "inference", 1, 8)
    assert it.total_p10_ms <= it.total_ms <= it.total_p90_ms < 10 * it.total_ms
    two = predict_model("gpt2", "t4", "inference", 2, 8)
    assert two.total_p90_ms < 10 * two.total_ms
    # two configurations (one configuration labelled under two folders of one GPU, T4/ and
    # Tesla_T4/, is now scored once: tests/test_audit_data_fixes.py)
    (tmp_path / "Tesla_T4").mkdir()
    (tmp_path / "Tesla_T4" / "gpt2-inf-8-1.json").write_text(json.dumps({"e2e_latency": it.total_ms}))
    (tmp_path / "Tesla_T4" / "gpt2-inf-8-2.json").write_text(json.dumps({"e2e_latency": 10 * two.total_ms}))
    r = _json(capsys, ["validate", "--labels", str(tmp_path)])
    assert sorted(c["in_band"] for c in r["configs"]) == [False, True]
    assert r["overall"]["band_coverage"] == 0.5
    assert main(["validate", "--labels", str(tmp_path)]) == 0
    assert "50% of the measurements in their p10-p90 band" in capsys.readouterr().out


def test_predict_model_on_a_module_with_its_own_inputs():
    import torch
    import torch.nn as nn

    from kit.api import predict_model
    from kit.workload.iteration import CpuOverhead

    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
    oh = CpuOverhead(cpu_op_us=100.0, launch_us=0.0, free_op_us=0.0)
    it = predict_model(m, "t4", mode="inference", inputs=(torch.zeros(4, 8),), overhead=oh)
    assert list(it.timeline["aten"]) == ["addmm", "relu"]
    # two tiny kernels, each issued 0.1 ms apart: CPU-bound, ends just after 0.2 ms
    assert 0.2 <= it.total_ms < 0.2 + it.kernel_ms + 1e-9


def test_validate_refuses_impossible_latencies_and_says_when_nothing_was_predicted(tmp_path, capsys):
    t4 = tmp_path / "Tesla_T4"
    t4.mkdir()
    for name, e2e in (("gpt2-inf-8-1", -3.0), ("gpt2-inf-8-2", float("nan")), ("gpt2-inf-8-4", 0)):
        (t4 / f"{name}.json").write_text(json.dumps({"e2e_latency": e2e, "fw_latency": 1.0}))
    # every label unreadable: an error exit naming the first one (it was exit 0, nothing predicted)
    assert main(["validate", "--labels", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "none of the 3 label file(s)" in err and "e2e_latency must be a positive number" in err
    (t4 / "gpt2-inf-8-8.json").write_text(json.dumps({"e2e_latency": 5.0}))  # one good label
    r = _json(capsys, ["validate", "--labels", str(tmp_path)])
    assert len(r["configs"]) == 1 and len(r["skipped"]) == 3
    assert all("e2e_latency must be a positive number" in s["reason"] for s in r["skipped"])


def _capture_error(tmp_path, monkeypatch, capsys, module: str, source: str) -> str:
    """The one line `kit predict module:make` prints for a user's module that fails to capture
    on the token ids the kit gives it (batch 2, seq 4)."""
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["predict", f"{module}:make", "--gpu", GPU, "--mode", "inference", "--batch", "2",
                 "--seq", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    return err


def test_a_module_that_does_not_take_token_ids_is_told_how_to_give_its_inputs(tmp_path, monkeypatch,
                                                                               capsys):
    err = _capture_error(tmp_path, monkeypatch, capsys, "floatmodel",
                         "import torch.nn as nn\n"
                         "def make():\n"
                         "    return nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, "
                         "batch_first=True), 1)\n")
    assert "token ids of shape (2, 4)" in err and "example_inputs(batch, seq)" in err


def test_a_float_module_is_told_first_that_its_inputs_were_a_guess(tmp_path, monkeypatch, capsys):
    # a plain Linear fed the guessed token ids: torch's 'operands of different dtypes (float32
    # and int64)' had led the line, as if the model were at fault
    err = _capture_error(tmp_path, monkeypatch, capsys, "linearmodel",
                         "import torch.nn as nn\n"
                         "def make():\n"
                         "    return nn.Linear(16, 16)\n")
    assert err.startswith("kit: error: could not guess the inputs of model 'linearmodel:make': it "
                          "has no example_inputs(batch, seq)"), err
    assert "float32 and int64" in err and "inputs= to kit.api.predict_model" in err


def test_a_data_dependent_module_is_not_told_about_token_ids(tmp_path, monkeypatch, capsys):
    err = _capture_error(tmp_path, monkeypatch, capsys, "routedmodel",
                         "import torch, torch.nn as nn\n"
                         "class M(nn.Module):\n"
                         "    def __init__(self):\n"
                         "        super().__init__(); self.e = nn.Embedding(10, 8); "
                         "self.l = nn.Linear(8, 8)\n"
                         "    def forward(self, ids):\n"
                         "        h = self.e(ids)\n"
                         "        return self.l(h[h.sum(-1) > 0])\n"
                         "def make():\n"
                         "    return M()\n")
    assert "needs the tensor's values" in err and "token ids" not in err


def _bound(capsys, argv):
    assert main(["predict", *argv]) == 0
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  bound"))


def test_the_text_says_which_side_sets_the_time_and_what_would_move_it(capsys):
    small = ["gpt2", "--gpu", "h100-sxm", "--mode", "inference", "--batch", "1", "--seq", "32"]
    r = _json(capsys, ["predict", *small, "--json"])
    assert r["gpu_idle_ms"] > 0.1 * r["total_ms"]  # a tiny forward on a fast GPU waits on the CPU
    line = _bound(capsys, small)
    assert line.startswith("  bound     CPU: the GPU waits") and f"{r['gpu_idle_ms']:.2f} ms" in line
    assert "--fusion compiled" in line and "--cuda-graphs" in line
    from kit.cli.cmd_predict import bound_line

    compiled = bound_line({**r, "fusion": "compiled"})  # already fused: only the graph is left
    assert "--fusion compiled" not in compiled and "--cuda-graphs" in compiled
    graphed = _json(capsys, ["predict", *small, "--cuda-graphs", "--json"])
    top = max(graphed["by_class"], key=lambda c: c["ms"])
    line = _bound(capsys, [*small, "--cuda-graphs"])  # no host cost: the kernels set the time
    assert line.startswith("  bound     GPU") and f"{top['op_class']} kernels take" in line


def test_memory_follows_the_step_dtype(tiny, capsys):
    # a bf16 step holds bf16 weights, gradients and AdamW state (torch.optim's zeros_like), as
    # its optimizer kernels are timed: the state was charged at 4 bytes whatever the dtype
    params = 50 * 16 + 2 * (16 * 16 + 16) + 16 * 50 + 50
    mems = {}
    for dtype in ("fp32", "bf16"):
        r = _json(capsys, ["predict", "tinymodel:make", "--gpu", GPU, "--batch", "2", "--seq", "4",
                           "--dtype", dtype, "--optimizer", "adamw"])
        mems[dtype] = (r["memory"], r["phases_ms"])
    width = {"fp32": 4, "bf16": 2}
    for dtype, (mem, _) in mems.items():
        assert mem["weights_bytes"] == width[dtype] * params
        assert mem["optimizer_bytes"] == 2 * width[dtype] * params
    assert mems["bf16"][0]["optimizer_bytes"] * 2 == mems["fp32"][0]["optimizer_bytes"]


def test_a_config_is_not_named_as_the_zoo_model_of_its_type(tmp_path, monkeypatch, capsys):
    # a 1-layer, 64-wide gpt2 config read as "gpt2" (the zoo's 124M model) in predict and compare
    (tmp_path / "cfgmod.py").write_text(
        "def small():\n"
        "    return {'model_type': 'gpt2', 'n_embd': 64, 'n_head': 2, 'n_layer': 1,\n"
        "            'vocab_size': 128, 'n_positions': 64}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = _json(capsys, ["predict", "cfgmod:small", "--gpu", GPU, "--seq", "16"])
    assert r["model"] == "cfgmod:small"
    from kit.api import predict_model

    cfg = {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1, "vocab_size": 128,
           "n_positions": 64}
    assert predict_model(cfg, GPU, seq=16).model == "gpt2 config"
    assert predict_model({**cfg, "name": "mine"}, GPU, seq=16).model == "mine"
