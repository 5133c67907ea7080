"""benchmarks/model_steps.py: whole-model training steps and inference passes of zoo models run
for real (here on the CPU, with gpt2 at batch 1 and a few tokens, or a tiny config), beside the
kit's prediction; bad arguments are one message, a config that cannot run is a row, a rerun
with the same JSON-lines file measures nothing twice."""
import contextlib
import io
import json

import pytest
import torch
from benchmark_modules import load_benchmark

from kit.errors import KitError

TINY = {"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 2, "vocab_size": 64,
        "n_positions": 32, "name": "tiny-gpt"}


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("model_steps")


@pytest.fixture(autouse=True)
def _tf32_kept():
    """The sweep sets torch's TF32 switches per row; put them back after each test."""
    kept = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = kept


def _fake_measure(calls, **extra):
    """A stand-in for measure(): records (model, dtype, batch, seq, mode) and returns a row."""
    def measure(m, model, dtype, batch, seq, mode, device, warmup, repeats, gpu):
        calls.append((model, dtype, batch, seq, mode))
        return {"model": model, "dtype": dtype, "batch": batch, "seq": seq, "mode": mode,
                "measured_ms": 1.0, **extra}
    return measure


def _no_build(monkeypatch, bench, built):
    """real_model builds a one-weight stand-in instead (appended to `built`)."""
    def build(model, dtype, device):
        built.append(model)
        return torch.nn.Linear(1, 1)
    monkeypatch.setattr(bench, "real_model", build)


# -- parse_configs -------------------------------------------------------------------------------
def test_parse_configs_reads_each_config(bench):
    got = bench.parse_configs(" gpt2:fp32:8:1024, bert-large:bf16:2:512 ,,llama3-8b:tf32:1:2048,")
    assert got == [("gpt2", "fp32", 8, 1024), ("bert-large", "bf16", 2, 512), ("llama3-8b", "tf32", 1, 2048)]


@pytest.mark.parametrize("text, bad, words", [
    ("gpt2:fp32:8", "gpt2:fp32:8", "MODEL:DTYPE:BATCH:SEQ"),
    ("gpt2:fp32:8:1024:1", "gpt2:fp32:8:1024:1", "MODEL:DTYPE:BATCH:SEQ"),
    ("gpt2:fp32:1:16,gpt2", "gpt2", "MODEL:DTYPE:BATCH:SEQ"),  # the bad one among good ones
    ("gpt2:fp8:1:16", "gpt2:fp8:1:16", "unknown dtype 'fp8'"),
    ("gpt2:fp32:x:16", "gpt2:fp32:x:16", "integers"),
    ("gpt2:fp32:1:1.5", "gpt2:fp32:1:1.5", "integers"),
    ("gpt2:fp32:0:16", "gpt2:fp32:0:16", "at least 1"),
    ("gpt2:fp32:1:0", "gpt2:fp32:1:0", "at least 1"),
    ("gpt2:fp32:-2:16", "gpt2:fp32:-2:16", "at least 1"),
    (":fp32:1:16", ":fp32:1:16", "no model name"),
])
def test_parse_configs_names_the_bad_item(bench, text, bad, words):
    with pytest.raises(KitError) as err:
        bench.parse_configs(text)
    assert repr(bad) in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("text", ["", " ", ",", " , ,"])
def test_parse_configs_wants_at_least_one(bench, text):
    with pytest.raises(KitError, match="no configs given"):
        bench.parse_configs(text)


@pytest.mark.parametrize("args, words", [
    (["--configs", "gpt2:fp32:1"], "'gpt2:fp32:1': expected MODEL:DTYPE:BATCH:SEQ"),
    (["--configs", "gpt2:int4:1:16"], "unknown dtype 'int4'"),
    (["--configs", ""], "no configs given"),
    (["--modes", "train,decode"], "--modes: choose from train, inference (got 'train,decode')"),
    (["--modes", " , "], "--modes: choose from train, inference"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--warmup", "-1"], "--warmup at least 0"),
])
def test_main_rejects_bad_arguments_in_one_line(bench, capsys, monkeypatch, args, words):
    monkeypatch.setattr(bench, "sweep", lambda *a, **k: pytest.fail("swept despite bad arguments"))
    assert bench.main(["--device", "cpu", "--configs", "gpt2:fp32:1:16", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("model_steps: ") and words in lines[0]
    assert "Traceback" not in err


# -- the measured step ---------------------------------------------------------------------------
def test_real_inputs_are_seeded_random_token_ids(bench):
    m = bench.real_model(TINY, "fp32", "cpu")
    (ids,) = bench.real_inputs(m, 2, 12, "cpu")
    assert ids.shape == (2, 12) and ids.dtype == torch.long and ids.device.type == "cpu"
    assert 0 <= int(ids.min()) and int(ids.max()) < 64
    assert ids.unique().numel() > 1  # not one token everywhere (all positions alike)
    assert torch.equal(ids, bench.real_inputs(m, 2, 12, "cpu")[0])  # the same every time


def test_train_step_runs_the_loss_and_backward_with_fresh_grads(bench, monkeypatch):
    m = bench.real_model(TINY, "fp32", "cpu")
    inputs = bench.real_inputs(m, 2, 8, "cpu")
    seen, losses = [], []
    m.register_forward_hook(lambda mod, a, out: seen.append((torch.is_grad_enabled(), mod.training)))
    real_ce = bench.F.cross_entropy

    def spy(logits, labels, *a, **k):
        losses.append((logits.dtype, tuple(logits.shape), labels))
        return real_ce(logits, labels, *a, **k)

    monkeypatch.setattr(bench.F, "cross_entropy", spy)
    params = [p for p in m.parameters() if p.requires_grad]
    assert params and all(p.grad is None for p in params)
    step = bench.step_fn(m, inputs, "train")
    torch.manual_seed(0)  # the same dropout masks in both steps
    step()
    assert seen == [(True, True)]  # forward with autograd, in train mode (dropout on)
    assert len(losses) == 1
    dtype, shape, labels = losses[0]
    assert dtype == torch.float32 and shape == (2 * 8, 64)
    assert labels.dtype == torch.long and labels.shape == (16,)
    assert 0 <= int(labels.min()) and int(labels.max()) < 64  # valid labels (lm_loss's are empty)
    assert labels.unique().numel() > 1  # random, as a batch's next tokens are
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)
    assert all(p.grad.abs().sum() > 0 for p in params)  # backward reached every parameter
    first = {id(p): p.grad for p in params}
    torch.manual_seed(0)
    step()
    for p in params:  # set to None before the step: a new tensor, not the old one plus more
        assert p.grad is not first[id(p)]
        assert torch.allclose(p.grad, first[id(p)], rtol=1e-5, atol=1e-7)
    assert losses[1][2] is labels  # the labels are made once, not in every timed step


def test_train_step_of_a_bf16_model_takes_the_loss_in_fp32(bench, monkeypatch):
    m = bench.real_model(TINY, "bf16", "cpu")
    got = []
    real_ce = bench.F.cross_entropy
    monkeypatch.setattr(bench.F, "cross_entropy",
                        lambda x, y, *a, **k: got.append(x.dtype) or real_ce(x, y, *a, **k))
    bench.step_fn(m, bench.real_inputs(m, 1, 4, "cpu"), "train")()
    assert got == [torch.float32]
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in m.parameters())


def test_train_step_of_an_output_not_over_the_vocabulary_backpropagates_it(bench, monkeypatch):
    class Head(torch.nn.Module):  # a classifier: 3 outputs, not the 64-token vocabulary
        config = {"vocab_size": 64}

        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x)

    m = Head()
    monkeypatch.setattr(bench.F, "cross_entropy", lambda *a, **k: pytest.fail("made up a loss"))
    bench.step_fn(m, (torch.ones(2, 4),), "train")()
    assert torch.allclose(m.fc.bias.grad, torch.full((3,), 2.0))  # d(sum of outputs)/d(bias)
    assert torch.allclose(m.fc.weight.grad, torch.full((3, 4), 2.0))


def test_inference_step_runs_without_grad_in_eval_mode(bench):
    m = bench.real_model(TINY, "fp32", "cpu").train()
    seen = []
    m.register_forward_hook(lambda mod, a, out: seen.append((torch.is_grad_enabled(), mod.training,
                                                             out.requires_grad, tuple(out.shape))))
    m.transformer.h[0].attn.register_forward_hook(lambda mod, a, out: seen.append(mod.training))
    bench.step_fn(m, bench.real_inputs(m, 2, 8, "cpu"), "inference")()
    assert seen == [False, (False, False, False, (2, 8, 64))]
    assert all(p.grad is None for p in m.parameters())


# -- the sweep -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    """One real CPU run of gpt2 (fp32, batch 1, 16 tokens), both modes, predicted for the H200."""
    bench = load_benchmark("model_steps")
    path = tmp_path_factory.mktemp("model_steps") / "rows.jsonl"
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = bench.main(["--device", "cpu", "--configs", "gpt2:fp32:1:16", "--modes", "train,inference",
                         "--repeats", "2", "--warmup", "0", "--gpu", "h200", "--jsonl", str(path)])
    out = json.loads(buf.getvalue())
    return rc, out, path, err.getvalue()


def test_a_cpu_sweep_measures_both_modes_beside_the_prediction(gpt2_run):
    from kit.api import predict_model

    rc, out, path, err = gpt2_run
    assert rc == 0 and out["device"] == "cpu" and out["stopped"] is None
    assert out["predicted_for"] == "h200" and out["tf32"] is False
    rows = out["rows"]
    assert [r["mode"] for r in rows] == ["train", "inference"]
    for r in rows:
        assert "error" not in r and "predict_error" not in r
        assert (r["model"], r["dtype"], r["batch"], r["seq"]) == ("gpt2", "fp32", 1, 16)
        assert r["measured_ms"] > 0 and r["seconds"] > 0
        assert "measured_kernel_ms" not in r and "peak_memory_bytes" not in r  # CUDA only
        it = predict_model("gpt2", "h200", mode=r["mode"], batch=1, seq=16, dtype="fp32")
        assert r["predicted_ms"] == it.total_ms and r["predicted_kernel_ms"] == it.kernel_ms
        assert r["predicted_gpu"] == it.gpu == "h200"
    train, inference = rows
    assert train["predicted_ms"] > inference["predicted_ms"]
    on_file = [json.loads(x) for x in path.read_text().splitlines()]
    assert on_file == rows
    assert len([x for x in err.splitlines() if x.startswith('{"model": "gpt2"')]) == 2  # progress lines


def test_a_rerun_with_the_same_jsonl_measures_nothing_again(bench, gpt2_run, tmp_path, capsys, monkeypatch):
    _, first, path, _ = gpt2_run
    again = tmp_path / "rows.jsonl"
    again.write_text(path.read_text())
    calls, built = [], []
    monkeypatch.setattr(bench, "measure", _fake_measure(calls))
    _no_build(monkeypatch, bench, built)
    assert bench.main(["--device", "cpu", "--configs", "gpt2:fp32:1:16", "--gpu", "h200",
                       "--jsonl", str(again)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert calls == [] and built == []
    assert out["rows"] == first["rows"]
    assert again.read_text() == path.read_text()


def test_a_rerun_measures_only_what_is_missing_or_failed(bench, tmp_path, monkeypatch):
    path = tmp_path / "rows.jsonl"
    base = {"model": "gpt2", "dtype": "fp32", "batch": 1, "seq": 16}
    path.write_text(json.dumps({**base, "mode": "train", "measured_ms": 5.0}) + "\n"
                    + json.dumps({**base, "mode": "inference", "error": "OutOfMemoryError: ..."}) + "\n"
                    + '{"model": "gpt2", "dty')  # a line cut short by a kill
    calls, built = [], []
    monkeypatch.setattr(bench, "measure", _fake_measure(calls))
    _no_build(monkeypatch, bench, built)
    rows, stopped = bench.sweep([("gpt2", "fp32", 1, 16), ("gpt2", "bf16", 1, 16)], ["train", "inference"],
                                "cpu", 1, 0, None, path)
    assert stopped is None
    assert calls == [("gpt2", "fp32", 1, 16, "inference"), ("gpt2", "bf16", 1, 16, "train"),
                     ("gpt2", "bf16", 1, 16, "inference")]
    assert built == ["gpt2", "gpt2"]  # once per config that has something to measure
    assert [(r["dtype"], r["mode"]) for r in rows] == [("fp32", "train"), ("fp32", "inference"),
                                                      ("bf16", "train"), ("bf16", "inference")]
    assert rows[0]["measured_ms"] == 5.0  # kept from the file
    kept = [r for r in bench.read_jsonl(path) if "error" not in r]
    assert len(kept) == 4


def test_a_config_or_mode_listed_twice_is_measured_once(bench, capsys, monkeypatch):
    calls, built = [], []
    monkeypatch.setattr(bench, "measure", _fake_measure(calls))
    _no_build(monkeypatch, bench, built)
    assert bench.main(["--device", "cpu", "--no-predict", "--configs", "gpt2:fp32:1:16,gpt2:fp32:1:16",
                       "--modes", "train,train"]) == 0
    assert calls == [("gpt2", "fp32", 1, 16, "train")]
    assert len(json.loads(capsys.readouterr().out)["rows"]) == 1


def test_a_seq_past_the_learned_positions_is_an_error_row(bench, capsys, monkeypatch):
    built = []
    _no_build(monkeypatch, bench, built)
    assert bench.main(["--device", "cpu", "--no-predict", "--configs", "gpt2:fp32:1:1025"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert built == [] and out["stopped"] is None
    assert [r["mode"] for r in out["rows"]] == ["train", "inference"]
    for r in out["rows"]:
        assert "measured_ms" not in r and "fatal" not in r
        assert r["error"].startswith("KitError: ") and "seq 1025" in r["error"]
        assert "1024 learned positions" in r["error"]


def test_an_error_is_the_row_and_the_sweep_goes_on(bench, monkeypatch):
    calls, built = [], []
    ok = _fake_measure(calls)

    def measure(m, model, dtype, batch, seq, mode, *rest):
        if dtype == "bf16" and mode == "train":
            m.weight.grad = torch.ones(1, 1)  # a step that failed half way through its backward
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        assert m.weight.grad is None  # the failed step's gradients were dropped
        return ok(m, model, dtype, batch, seq, mode, *rest)

    monkeypatch.setattr(bench, "measure", measure)
    _no_build(monkeypatch, bench, built)
    freed = []
    monkeypatch.setattr(bench, "_free", lambda device: freed.append(device))
    rows, stopped = bench.sweep([("no-such-model", "fp32", 1, 16), ("gpt2", "bf16", 1, 16),
                                 ("gpt2", "fp32", 1, 16)], ["train", "inference"], "cpu", 1, 0, None, None)
    assert stopped is None
    assert [("error" in r, r["dtype"], r["mode"]) for r in rows] == [
        (True, "fp32", "train"), (True, "fp32", "inference"), (True, "bf16", "train"),
        (False, "bf16", "inference"), (False, "fp32", "train"), (False, "fp32", "inference")]
    assert "no-such-model" in rows[0]["error"]
    assert rows[2]["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert calls == [("gpt2", "bf16", 1, 16, "inference"), ("gpt2", "fp32", 1, 16, "train"),
                     ("gpt2", "fp32", 1, 16, "inference")]
    assert len(freed) == 3 + 3  # after each of the three errors, and after each config


def test_a_cuda_error_that_loses_the_context_stops_the_sweep(bench, monkeypatch):
    calls, built, freed = [], [], []

    def measure(*a):
        calls.append(a[1:6])
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(bench, "measure", measure)
    _no_build(monkeypatch, bench, built)
    monkeypatch.setattr(bench, "_free", lambda device: freed.append(device))
    monkeypatch.setattr(bench.torch.cuda, "reset_peak_memory_stats", lambda: None)
    rows, stopped = bench.sweep([("gpt2", "fp32", 1, 16), ("gpt2", "bf16", 1, 16)], ["train", "inference"],
                                "cuda", 1, 0, None, None)
    assert stopped.startswith("CUDA error at gpt2 fp32 b1 s16 train: ")
    assert len(calls) == 1 and len(rows) == 1 and rows[0]["fatal"] is True
    assert "illegal memory access" in rows[0]["error"]
    assert freed == []  # no CUDA call (empty_cache) after a sticky error


def test_tf32_is_on_for_a_tf32_config_only(bench, monkeypatch):
    seen = []

    def measure(m, model, dtype, *rest):
        seen.append((dtype, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        return {"model": model, "dtype": dtype, "batch": rest[0], "seq": rest[1], "mode": rest[2]}

    monkeypatch.setattr(bench, "measure", measure)
    _no_build(monkeypatch, bench, [])
    bench.sweep([("gpt2", "tf32", 1, 16), ("gpt2", "fp32", 1, 16)], ["inference"], "cpu", 1, 0, None, None)
    assert seen == [("tf32", True, True), ("fp32", False, False)]


def test_the_time_limit_starts_no_row_after_it(bench, monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "measure", _fake_measure(calls))
    _no_build(monkeypatch, bench, [])
    rows, stopped = bench.sweep([("gpt2", "fp32", 1, 16)], ["train", "inference"], "cpu", 1, 0, None,
                                None, time_limit=0)
    assert rows == [] and calls == [] and stopped.startswith("time limit (0 s) reached before gpt2")
