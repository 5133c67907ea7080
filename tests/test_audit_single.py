"""Audit of the single-GPU user surface: bad inputs give one KitError line, user models map every
op, and the CLI's outputs agree with hand computations."""
import dataclasses
import json
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

from kit.cli import main
from kit.errors import KitError
from kit.hardware import load_gpu_file, unregister_gpu
from kit.ops import Elementwise
from kit.workload.capture import capture
from kit.workload.models import graph_of

torch.set_num_threads(1)

TINY_GPT = {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1, "n_positions": 64,
            "vocab_size": 128}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))


def _kit(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# -- capture of user models --------------------------------------------------------------------
class _LSTM(nn.Module):
    def __init__(self, cls=nn.LSTM):
        super().__init__()
        self.rnn = cls(8, 16, batch_first=True)

    def forward(self, x):  # packed: the form kit.workload.rnn leaves to its decomposition
        packed = nn.utils.rnn.pack_padded_sequence(x, [x.shape[1]] * x.shape[0], batch_first=True)
        return self.rnn(packed)[0].data


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_rnn_cells_map_every_op(cls):
    # on meta a packed LSTM/GRU runs its cells op by op: unsafe_split (a view) and in-place
    # sigmoid_/tanh_ were 'unknown' kernels; the split is free and the activations are elementwise
    g = capture(_LSTM(cls), (torch.zeros(2, 3, 8),), mode="train")
    assert not [n.aten for n in g.nodes if n.op_class == "unknown"]
    assert not [n for n in g.nodes if "unsafe_split" in n.aten and n.op is not None]
    sig = [n.op for n in g.nodes if n.aten == "aten.sigmoid_.default"]
    # in place on a slice of the gates (a strided view): PyTorch's generic loop, not vectorized
    assert sig and sig[0] == Elementwise("sigmoid", 2 * 16, "fp32", inputs=1, vectorized=False)


class _Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        return torch.ops.aten.hardswish(self.a(x)).clamp_(0, 1).mean()


def test_clamp_and_hardswish_are_elementwise():
    g = capture(_Custom(), (torch.zeros(3, 4),), mode="train")
    classes = {n.aten: n.op_class for n in g.nodes}
    assert classes["aten.clamp_.default"] == "elementwise"
    assert classes["aten.hardswish.default"] == "elementwise"
    assert classes["aten.hardswish_backward.default"] == "elementwise"


class _KeyErr(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 1)

    def forward(self, batch):
        return self.a(batch["missing"])


class _Assert(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 1)

    def forward(self, x):
        assert x.shape[1] == 5, "want 5 features"
        return self.a(x)


@pytest.mark.parametrize("model,inputs,word", [(_KeyErr(), ({"x": torch.zeros(2, 4)},), "KeyError"),
                                                (_Assert(), (torch.zeros(2, 4),), "want 5 features")])
def test_forward_errors_are_one_kit_error(model, inputs, word):
    with pytest.raises(KitError, match=word):
        capture(model, inputs, mode="inference")


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "audit_um.py").write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        class M(nn.Module):
            def __init__(self):
                super().__init__(); self.a = nn.Linear(4, 1)
            def forward(self, x): return self.a(x)
            def example_inputs(self, b, s): raise ValueError("no inputs here")
        def bad_inputs(): return M()
        def raises(): raise RuntimeError("boom")
        def needs(x): return x
    """))
    (tmp_path / "audit_broken.py").write_text("raise NameError('oops')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("audit_um", "audit_broken"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("spec,word", [("audit_um:raises", "RuntimeError: boom"),
                                       ("audit_um:bad_inputs", "example_inputs.*no inputs here"),
                                       ("audit_um:needs", "must take no arguments"),
                                       ("audit_broken:x", "NameError: oops"),
                                       ("gpt:layers=2,hidden=64,heads=2", "--system")])
def test_user_code_failures_are_one_kit_error(user_module, spec, word):
    with pytest.raises(KitError, match=word):
        graph_of(spec, 2, 8, "inference")


def test_config_json_file_is_the_config_dict(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY_GPT))
    from_file = graph_of(str(path), 2, 16, "inference")
    from_dict = graph_of(TINY_GPT, 2, 16, "inference")
    assert from_file.model == "tiny"
    assert [(n.aten, n.op) for n in from_file.nodes] == [(n.aten, n.op) for n in from_dict.nodes]
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(KitError, match="JSON object"):
        graph_of(str(tmp_path / "list.json"), 2, 16)
    with pytest.raises(KitError, match="not found"):
        graph_of(str(tmp_path / "none.json"), 2, 16)


# -- user GPU files ----------------------------------------------------------------------------
def _h100_entry(**changes):
    from kit.hardware.catalog import _builtin_entries

    return {**_builtin_entries()["h100-sxm"], "key": "audit-gpu", "name": "Audit GPU",
            "aliases": [], **changes}


@pytest.mark.parametrize("content,word", [(b"\xd0\xcf\x11\xe0 binary", "not a text"),
                                          (b"[]", "no GPU entries"),
                                          (b'{"gpus": []}', "no GPU entries")])
def test_gpu_file_bad_content(tmp_path, content, word):
    path = tmp_path / "g.json"
    path.write_bytes(content)
    with pytest.raises(KitError, match=word):
        load_gpu_file(path)


def test_gpu_file_folder_is_one_error(tmp_path, capsys):
    rc, _, err = _kit(capsys, "gpus", "--add", str(tmp_path))
    assert rc == 2 and "cannot read GPU file" in err and "Traceback" not in err


def test_gpu_file_infinite_peak_is_rejected(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(_h100_entry(fp16_tflops=float("inf"))))  # json writes Infinity
    try:
        with pytest.raises(KitError, match="fp16_tflops must be a positive number"):
            load_gpu_file(path)
    finally:
        unregister_gpu("audit-gpu")


# -- kit compare -------------------------------------------------------------------------------
@pytest.mark.parametrize("price", ["nan", "inf", "-1"])
def test_compare_price_must_be_finite(price):
    from kit.cli.cmd_compare import parse_prices

    with pytest.raises(KitError, match="must be a number of dollars per GPU-hour from 0 to"):
        parse_prices(f"h100-sxm={price}")


def test_compare_one_row_per_gpu_even_by_alias():
    from kit.cli.cmd_compare import compare

    r = compare(TINY_GPT, ["a100", "a100-sxm4-40gb", "NVIDIA H100 SXM5 80GB"], mode="inference",
                batch=1, seq=16)
    assert [row["gpu"] for row in r["rows"]] == ["a100-sxm4-40gb", "h100-sxm"]


# -- kit validate ------------------------------------------------------------------------------
def test_validate_skips_a_label_it_cannot_predict(tmp_path, capsys):
    # one label past GPT-2's 1024 positions used to abort the whole run with an error naming
    # no file; now it is skipped with the reason, like every other unpredictable label
    gpu = tmp_path / "NVIDIA_A100-PCIE-40GB"
    gpu.mkdir()
    (gpu / "gpt2-train-2048-1.json").write_text('{"e2e_latency": 10.0}')
    (gpu / "gpt2-inf-0-1.json").write_text('{"e2e_latency": 10.0}')
    from kit.cli.cmd_validate import validate

    r = validate(tmp_path)
    reasons = {s["seq"]: s["reason"] for s in r["skipped"]}
    assert "1024 learned positions" in reasons[2048] and "positive" in reasons[0]
    assert r["overall"]["configs"] == 0
    rc, out, _ = _kit(capsys, "validate", "--labels", str(tmp_path))
    assert rc == 2 and "no configuration could be predicted (2 skipped" in out
    rc, _, err = _kit(capsys, "validate", "--labels", str(tmp_path), "--predictor", "nope")
    assert rc == 2 and "unknown predictor 'nope'" in err
    rc, _, err = _kit(capsys, "validate", "--labels", str(gpu / "gpt2-inf-0-1.json"))
    assert rc == 2 and "is a file, not a folder" in err


# -- measurement CSVs (kit evaluate --test, kit data summary --file) -----------------------------
NEUSIGHT_HEAD = ("OPName,Latency,Device,Torch Version,CUDNN Version,Kernel Name,Warps per SM,"
                 "Blocks per SM,Grid x,Grid y,Grid z,Block x,Block y,Block z,CUDA Version,Kernels,"
                 "B,M,N,K")


def _neusight_csv(path, latency):
    path.write_text(NEUSIGHT_HEAD + "\n" + "\n".join(
        f"bmm,{lat},NVIDIA L4,p2.1.0,8902,k,1,1,1,1,1,256,1,1,cu121,;k,8,64,64,64"
        for lat in ("0.25", latency)) + "\n")


@pytest.mark.parametrize("latency", ["inf", "0", "-1", "nan"])
def test_measured_latency_must_be_finite_and_positive(tmp_path, capsys, latency):
    # an infinite latency was read and scored: MAPE nan in every column
    path = tmp_path / "t.csv"
    _neusight_csv(path, latency)
    rc, out, err = _kit(capsys, "evaluate", "--test", str(path), "--predictors", "roofline")
    assert rc == 2 and f"{path}:3: Latency must be a positive number" in err
    assert "np.float64" not in err


def test_kit_schema_latency_must_be_finite(tmp_path):
    from kit.data import load_measurements

    src = tmp_path / "t.csv"
    _neusight_csv(src, "0.5")
    frame = load_measurements(src)
    frame.loc[1, "latency_ms"] = float("inf")
    frame.to_csv(tmp_path / "kit.csv", index=False)
    with pytest.raises(KitError, match="latency_ms must be a positive number; row 3 has 'inf'"):
        load_measurements(tmp_path / "kit.csv")


# -- kit train ---------------------------------------------------------------------------------
def test_train_checks_its_out_folder_before_training(tmp_path):
    # an --out that cannot be created was found only after the whole training (minutes)
    from kit.api import train_predictors

    (tmp_path / "data").mkdir()  # a NeuSight-shaped folder with nothing to train on
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(KitError, match="cannot write the weights folder"):
        train_predictors("T4", blocker / "weights", data_dir=tmp_path, quick=True)


# -- kit predict (one GPU) ---------------------------------------------------------------------
def test_predict_dtype_choices_are_what_capture_takes():
    from kit.cli import build_parser
    from kit.cli.cmd_predict import MODEL_DTYPES
    from kit.workload.capture import DTYPE_CHOICES, TORCH_DTYPES

    # and "model": each parameter in the dtype the module holds
    assert set(MODEL_DTYPES) == set(DTYPE_CHOICES) == {*TORCH_DTYPES, "model"}
    with pytest.raises(KitError, match="invalid choice: 'fp8'"):  # was offered, then refused
        build_parser().parse_args(["predict", "gpt2", "--gpu", "a100", "--dtype", "fp8"])


def test_predict_says_when_the_step_does_not_fit(tmp_path, capsys):
    # inference keeps 2x the largest forward output: the MLP's (1e6·64, 4·64) fp32 hidden = 65.5 GB
    # (wider than the 128-entry vocabulary's logits)
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY_GPT))
    batch, seq = 1_000_000, 64
    rc, out, _ = _kit(capsys, "predict", str(path), "--gpu", "a100-sxm4-40gb", "--mode", "inference",
                      "--batch", str(batch), "--seq", str(seq), "--json")
    m = json.loads(out)["memory"]
    assert rc == 0 and m["activations_bytes"] == 2 * batch * seq * max(4 * 64, 128) * 4
    # no grads, no state; the buffers are GPT-2's causal masks
    assert m["total_bytes"] == m["weights_bytes"] + m["activations_bytes"] + m["buffers_bytes"]
    assert m["gpu_memory_bytes"] == 40 * 2**30 and m["fits"] is False
    rc, out, _ = _kit(capsys, "predict", str(path), "--gpu", "a100-sxm4-40gb", "--mode", "inference",
                      "--batch", str(batch), "--seq", str(seq))
    assert f"needs {m['total_bytes'] / 2**30:.1f} GiB" in out and "would not fit" in out
    rc, out, _ = _kit(capsys, "predict", str(path), "--gpu", "a100-sxm4-40gb", "--mode", "inference",
                      "--batch", "1", "--seq", str(seq))
    assert rc == 0 and "would not fit" not in out


# -- configs and the Python verbs --------------------------------------------------------------
@pytest.mark.parametrize("change,word", [({"n_embd": -5}, "n_embd must be a positive whole number"),
                                         ({"n_embd": "64"}, "cannot build a model")])
def test_config_with_bad_values_is_one_kit_error(change, word):
    with pytest.raises(KitError, match=word):  # were a RuntimeError / TypeError traceback
        graph_of({**TINY_GPT, **change}, 1, 8, "inference")


def test_kv_heads_must_divide_query_heads():
    # 4 query heads over 3 KV heads repeated k/v 4 // 3 = 1 time: a shape mismatch deep in
    # autograd ("returned an invalid gradient"); now it names the heads
    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 3, "intermediate_size": 128, "vocab_size": 100}
    with pytest.raises(KitError, match="4 query heads are not a multiple of 3 key/value heads"):
        graph_of(cfg, 1, 8, "train")


def test_predict_op_needs_an_op():
    from kit.api import predict_op

    with pytest.raises(KitError, match="needs a kit.ops op"):
        predict_op("gemm", "a100")


# -- kit op ------------------------------------------------------------------------------------
def test_op_text_names_the_bound_its_utilisation_is_of(capsys):
    # a 2x2x1e7 fp16 GEMM is one tile on one SM: its bound is that wave at the SM's peak, 1,000x
    # the roofline; the text said "utilisation 100.0% of the roofline" beside a 0.044 ms roofline
    # (m or n of 1 is a GEMV now, kit.predict.gemv: a stream, no tile)
    from kit.hardware import get_gpu

    # (a 2x2 one is bounded by its one-row twins now, which the wave bound exceeds: its share is
    # then the roofline's, never over 100% of a bound above the latency; a 33x33 one in FP32 is
    # still one wave of tiles on the tile-MLP)
    argv = ["op", "gemm", "--m", "33", "--n", "33", "--k", "10000000", "--gpu", "v100-sxm2-32gb",
            "--dtype", "fp32", "--predictor", "tile"]
    _, out, _ = _kit(capsys, *argv, "--json")
    r = json.loads(out)
    tm, tn = (int(x) for x in r["tile"].split("x"))
    gpu = get_gpu("v100-sxm2-32gb")
    k = -(-10**7 // r["split_k"])  # split-K (kit.predict.split_k): each tile reduces k / S
    per_sm = -(-r["tiles"] // gpu.sm_count)  # the busiest SM's tiles (a split may run several)
    wave_ms = per_sm * 2 * tm * tn * k / (gpu.peak_tflops("fp32") * 1e12 / gpu.sm_count) * 1e3
    assert r["waves"] == 1 and r["utilisation"] * r["latency_ms"] == pytest.approx(wave_ms, rel=1e-3)
    _, text, _ = _kit(capsys, *argv)
    assert f"of its wave bound, {wave_ms:.4g} ms" in text and "of the roofline" not in text
    _, text, _ = _kit(capsys, *argv[:-1], "roofline")
    assert "utilisation 100.0% of the roofline" in text
    thin = ["op", "gemm", "--m", "2", "--n", "2", "--k", "10000000", "--gpu", "v100-sxm2-32gb", "--dtype", "fp16"]
    _, out, _ = _kit(capsys, *thin, "--json")
    r = json.loads(out)
    assert 0 < r["utilisation"] <= 1 and r["utilisation"] * r["latency_ms"] == pytest.approx(r["roofline_ms"])
    _, text, _ = _kit(capsys, *thin)
    assert "of the roofline" in text and "of its wave bound" not in text


# -- kit demo ----------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu,dtype", [("h100-sxm", "bf16"), ("t4", "fp16"), ("p4", "fp32")])
def test_demo_runs_on_a_gpu_without_bf16(monkeypatch, gpu, dtype):
    # `kit demo --gpu t4` stopped at "t4 has no bf16 support": the tour's dtype was fixed
    import argparse

    import kit.api
    from kit.cli import cmd_demo

    seen = []

    class _Step:
        def to_dict(self):
            return {}

    monkeypatch.setattr(kit.api, "predict_model", lambda *a, **kw: seen.append(kw["dtype"]) or _Step())
    monkeypatch.setattr(kit.api, "predict_op", lambda op, g: seen.append(op.dtype) or {})
    r = cmd_demo.run(argparse.Namespace(gpu=gpu, system="dgx-h100"))
    assert seen == [dtype, dtype] and r["dtype"] == dtype


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor


class _DataclassOut(nn.Module):
    def __init__(self, wrap=True):
        super().__init__()
        self.a = nn.Linear(16, 4)
        self.wrap = wrap

    def forward(self, x):
        y = self.a(x)
        return _Out(y) if self.wrap else (y,)


def test_training_through_a_dataclass_output():
    # pytree does not open a user's dataclass: training capture said the output had no tensor
    wrapped = capture(_DataclassOut(True), (torch.zeros(2, 16),), mode="train")
    plain = capture(_DataclassOut(False), (torch.zeros(2, 16),), mode="train")
    assert [n.aten for n in wrapped.nodes] == [n.aten for n in plain.nodes]
    assert any(n.phase == "bwd" for n in wrapped.nodes)


def test_fused_adamw_captures_on_meta():
    # `--optimizer adamw-fused` (in kit predict --help) failed: torch refuses fused=True on meta
    g = capture(nn.Linear(16, 4), (torch.zeros(2, 16),), mode="train", optimizer="adamw-fused")
    fused = [n for n in g.nodes if n.aten == "aten._fused_adamw_.default"]
    assert len(fused) == 1 and fused[0].op_class == "optimizer" and fused[0].phase == "opt"
    params = 16 * 4 + 4
    assert fused[0].op.bytes == pytest.approx(7 * params * 4)  # reads p, g, m, v; writes p, m, v
