"""dtype "model" (--dtype model): each parameter and buffer keeps the dtype the module holds, the
floating inputs take its main dtype, and every op is priced in the dtype it runs in. A bf16 body
with an fp32 MoE router fed h.float() (common MoE code) could only be priced cast to one dtype:
at bf16 it failed on operands of two dtypes, at fp32 its bf16 body was priced as fp32."""
import json
import warnings

import pytest
import torch
import torch.nn as nn

from kit.api import predict_model
from kit.cli import main
from kit.cli.cmd_compare import compare
from kit.errors import KitError
from kit.workload.capture import capture, main_dtype, param_dtypes
from kit.workload.models import graph_of, memory_bytes

GPU = "h100-sxm"
TINY_GPT = {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1, "n_positions": 64,
            "vocab_size": 128}
MOE = '''
import torch
import torch.nn as nn


class Moe(nn.Module):
    """A bf16 body with an fp32 router fed h.float(), as DeepSeek's and Mixtral's code runs it."""

    def __init__(self, d=256, experts=8, router_dtype=torch.float32):
        super().__init__()
        self.emb = nn.Embedding(1000, d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        self.router = nn.Linear(d, experts, bias=False)
        self.to(torch.bfloat16)
        self.router.to(router_dtype)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.down(torch.relu(self.up(h)))
        gate = torch.softmax(self.router(h.to(self.router.weight.dtype)), -1)
        return h, gate


class MoeFloat(Moe):
    """The router fed h.float() whatever its own dtype."""

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.down(torch.relu(self.up(h)))
        return h, torch.softmax(self.router(h.float()), -1)


def make():
    return MoeFloat()


def make_fp32():
    return Moe().float()
'''


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def moe(tmp_path, monkeypatch):
    (tmp_path / "moemodel.py").write_text(MOE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    import moemodel
    return importlib.reload(moemodel)


def _gemms(graph):
    return [(n.phase, n.module, n.op.dtype) for n in graph.nodes
            if n.op is not None and n.op_class == "gemm"]


def test_model_keeps_each_parameter_in_its_dtype(moe):
    m = moe.MoeFloat()
    assert main_dtype(m) == torch.bfloat16 and list(param_dtypes(m)) == ["bf16", "fp32"]
    ids = torch.zeros(4, 128, dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the module is priced as it is held: nothing to note
        g = capture(m, (ids,), mode="train", dtype="model", optimizer="adamw")
    gemms = _gemms(g)
    assert {d for _, mod, d in gemms if mod.startswith("router")} == {"fp32"}
    assert {d for _, mod, d in gemms if mod.startswith(("up", "down"))} == {"bf16"}
    assert {p for p, mod, _ in gemms if mod.startswith("router")} == {"fwd", "bwd"}
    # the optimizer step runs a kernel group per dtype, each priced at its dtype
    assert {n.op.dtype for n in g.nodes if n.phase == "opt" and n.op is not None} == {"bf16", "fp32"}
    # reported: the main dtype, and the parameters in each
    assert g.meta["dtype"] == "bf16"
    held = g.meta["model_dtypes"]
    assert held == {"bf16": sum(p.numel() for p in m.parameters()) - 256 * 8, "fp32": 256 * 8}
    # memory: each parameter (its gradient, AdamW's two states) at its own dtype
    nbytes = 2 * held["bf16"] + 4 * held["fp32"]
    mem = memory_bytes(g)
    assert g.meta["param_bytes"] == nbytes
    assert (mem["weights_bytes"], mem["grads_bytes"], mem["optimizer_bytes"]) == (nbytes, nbytes, 2 * nbytes)
    # the module itself is left as it was
    assert m.router.weight.dtype == torch.float32 and m.up.weight.dtype == torch.bfloat16
    assert m.up.weight.device.type == "cpu"


def test_mixed_time_lies_between_all_fp32_and_all_bf16(moe):
    def step(dtype, router=torch.float32):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fp32: the "mostly bf16" note
            return predict_model(moe.Moe(d=1024, router_dtype=router), GPU, batch=8, seq=512,
                                 dtype=dtype, optimizer="adamw")

    mixed, fp32, bf16 = step("model"), step("fp32"), step("bf16", torch.bfloat16)
    assert bf16.total_ms < mixed.total_ms < fp32.total_ms
    assert bf16.kernel_ms < mixed.kernel_ms < fp32.kernel_ms
    # the all-bf16 module under "model" is the same as cast to bf16
    assert step("model", torch.bfloat16).total_ms == bf16.total_ms


def test_bf16_cast_of_a_mixed_module_points_to_model(moe):
    with pytest.raises(KitError, match="operands of different dtypes") as e:
        graph_of(moe.MoeFloat(), 2, 64, "train", "bf16")
    assert "--dtype model" in str(e.value) and "(bf16, fp32)" in str(e.value)


def test_bf16_module_priced_in_fp32_points_to_model(moe):
    with pytest.warns(UserWarning, match="mostly bf16, priced in fp32 as asked") as notes:
        graph_of(moe.Moe(), 2, 64, "inference", "fp32")
    assert any("--dtype model" in str(n.message) for n in notes)


def test_fp32_module_under_model_is_fp32_exactly(moe):
    for mode in ("train", "inference"):
        a = predict_model("moemodel:make_fp32", GPU, mode=mode, batch=2, seq=64, dtype="model")
        b = predict_model("moemodel:make_fp32", GPU, mode=mode, batch=2, seq=64, dtype="fp32")
        assert a.total_ms == b.total_ms and a.to_dict()["dtype"] == "fp32"
        assert a.meta["memory"] == b.meta["memory"]
        assert a.to_dict()["model_dtypes"] == {"fp32": a.to_dict()["params"]}
        assert "model_dtypes" not in b.to_dict()


def test_zoo_and_configs_under_model_are_fp32(moe):
    a = predict_model(TINY_GPT, GPU, mode="inference", batch=2, seq=16, dtype="model")
    b = predict_model(TINY_GPT, GPU, mode="inference", batch=2, seq=16, dtype="fp32")
    assert a.total_ms == b.total_ms
    d = a.to_dict()
    assert d["dtype"] == "fp32" and d["model_dtypes"] == {"fp32": d["params"]}
    assert "model_dtypes" not in b.to_dict()  # the zoo's cached graph kept its own meta


def test_floating_inputs_take_the_main_dtype(moe):
    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(64, 64).to(torch.bfloat16)

        def forward(self, x):
            return self.lin(x)

    g = capture(Body(), (torch.randn(4, 64),), mode="inference", dtype="model")  # an fp32 input
    assert _gemms(g) == [("fwd", "lin", "bf16")]


def test_cli_predict_and_compare_accept_model(moe, capsys):
    for mode in ("train", "inference"):
        rc = main(["predict", "moemodel:make", "--gpu", GPU, "--dtype", "model", "--mode", mode,
                   "--batch", "2", "--seq", "64", "--json"])
        out = capsys.readouterr()
        assert rc == 0, out.err
        r = json.loads(out.out)
        assert r["dtype"] == "bf16" and list(r["model_dtypes"]) == ["bf16", "fp32"]
    rc = main(["predict", "moemodel:make", "--gpu", GPU, "--dtype", "model", "--batch", "2",
               "--seq", "64"])
    out = capsys.readouterr().out
    assert rc == 0 and "model (bf16; fp32 " in out.splitlines()[0]
    # compare: a GPU must run every dtype the module holds (a T4 has no bf16)
    r = compare("moemodel:make", [GPU, "t4"], mode="train", batch=2, seq=64, dtype="model")
    rows = {row["gpu"]: row for row in r["rows"]}
    assert r["dtype"] == "bf16" and "model_dtypes" in r
    assert rows[GPU]["step_ms"] > 0 and "no bf16 support" in rows["t4"]["unsupported"]
    rc = main(["compare", "moemodel:make", "--gpus", f"{GPU},t4", "--dtype", "model", "--batch",
               "2", "--seq", "64"])
    out = capsys.readouterr().out
    assert rc == 0 and "model (bf16; fp32" in out.splitlines()[0]
    # generate: a zoo decoder is fp32
    r = compare(TINY_GPT, [GPU], mode="generate", batch=1, seq=8, new_tokens=4, dtype="model")
    assert r["dtype"] == "fp32" and r["model_dtypes"] == {"fp32": r["model_dtypes"]["fp32"]}


def test_bad_dtype_names_are_one_clear_error(moe, capsys):
    for bad in ("fp8", "bfloat16", "Model"):
        with pytest.raises(KitError, match=f"unknown dtype '{bad}': choose one of fp32, tf32, fp16, "
                                           "bf16, model"):
            graph_of("moemodel:make", 2, 64, "train", bad)
        with pytest.raises(KitError, match=f"unknown dtype '{bad}'"):
            capture(nn.Linear(4, 4), (torch.randn(2, 4),), dtype=bad)
        with pytest.raises(KitError, match=f"unknown dtype '{bad}'"):
            predict_model(TINY_GPT, GPU, seq=16, dtype=bad)
    rc = main(["predict", "moemodel:make", "--gpu", GPU, "--dtype", "fp8"])
    err = capsys.readouterr().err
    assert rc == 2 and "invalid choice: 'fp8'" in err and "'model'" in err
