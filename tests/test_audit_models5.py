"""Audit of the whole-model surface (kit predict / compare with a user's module): a trace never
overwrites the module it reads, a model with no kernels is one error, the user's prints stay out
of --json, trace events meet without overlapping, and rotary models note lengths past training."""
import json
import sys
import textwrap

import pytest

from test_audit_single import _cache, _kit  # noqa: F401  (_cache: autouse, a fresh KIT_CACHE)

MODULE = """
    import torch.nn as nn

    class Printer(nn.Module):
        def __init__(self):
            super().__init__()
            self.e, self.l = nn.Embedding(100, 16), nn.Linear(16, 16)

        def forward(self, x):
            h = self.l(self.e(x))
            print("hello from forward")
            return h

    class Same(nn.Module):
        def forward(self, x):
            return x

    class Flat(nn.Module):
        def forward(self, x):
            return x.view(-1)

    print("hello from import")

    def printer(): return Printer()
    def same(): return Same()
    def flat(): return Flat()
"""


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A module on the import path (not the working folder), and a working folder apart."""
    lib, work = tmp_path / "lib", tmp_path / "work"
    lib.mkdir()
    work.mkdir()
    (lib / "audit5_mod.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(lib))
    monkeypatch.chdir(work)
    yield lib / "audit5_mod.py"
    sys.modules.pop("audit5_mod", None)


def test_a_trace_never_overwrites_the_module_on_the_import_path(elsewhere, capsys):
    before = elsewhere.read_text()
    rc, out, err = _kit(capsys, "predict", "audit5_mod:printer", "--gpu", "h100-sxm", "--mode",
                        "inference", "--batch", "2", "--seq", "8", "--trace", str(elsewhere))
    assert rc == 2 and "destroy the input" in err and "Traceback" not in err
    assert elsewhere.read_text() == before


@pytest.mark.parametrize("command", [["predict", "--gpu", "h100-sxm"], ["compare", "--gpus", "h100-sxm,a100-pcie-80gb"]])
def test_the_users_prints_stay_out_of_json(elsewhere, capsys, command):
    verb, *rest = command
    rc, out, err = _kit(capsys, verb, "audit5_mod:printer", *rest, "--mode", "inference",
                        "--batch", "2", "--seq", "8", "--json")
    assert rc == 0, err
    json.loads(out)  # nothing but the JSON on stdout
    assert "hello from forward" in err and "hello from forward" not in out
    assert "hello from import" not in out


@pytest.mark.parametrize("factory", ["same", "flat"])
@pytest.mark.parametrize("verb,gpus", [("predict", ("--gpu", "h100-sxm")),
                                       ("compare", ("--gpus", "h100-sxm"))])
def test_a_model_without_kernels_is_one_error(elsewhere, capsys, factory, verb, gpus):
    rc, out, err = _kit(capsys, verb, f"audit5_mod:{factory}", *gpus, "--mode", "inference")
    assert rc == 2 and "launches no GPU kernels" in err and "Traceback" not in err
    assert "total" not in out and "step" not in out  # the import's print alone (text mode)


def _overlaps(events, tid, pid=1):
    ev = sorted((e for e in events if e.get("ph") == "X" and e["tid"] == tid and e["pid"] == pid),
                key=lambda e: e["ts"])
    return sum(a["ts"] + a["dur"] > b["ts"] + 1e-9 for a, b in zip(ev, ev[1:])), len(ev)


def test_back_to_back_kernels_meet_without_overlap(tmp_path, capsys):
    path = tmp_path / "t.json"
    rc, _, err = _kit(capsys, "predict", "gpt2", "--gpu", "a100-pcie-80gb", "--mode", "train",
                      "--batch", "8", "--seq", "1024", "--trace", str(path))
    assert rc == 0, err
    trace = json.loads(path.read_text())
    overlaps, n = _overlaps(trace["traceEvents"], tid=2)
    assert n > 500 and overlaps == 0  # 107 pairs had overlapped by 1 ns
    gpu = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["tid"] == 2]
    last = max(e["ts"] + e["dur"] for e in gpu)
    assert last == pytest.approx(trace["otherData"]["total_ms"] * 1e3, abs=2e-3)


def test_span_us_rounds_the_end_as_the_start():
    from kit.workload.timeline import span_us

    import numpy as np

    edges = np.cumsum(np.random.default_rng(0).uniform(0, 0.01, 2000))  # ms, back to back
    spans = [span_us(a, b) for a, b in zip(edges, edges[1:])]
    assert all(s["dur"] >= 0 for s in spans)
    assert all(abs(s["ts"] + s["dur"] - t["ts"]) < 1e-9 for s, t in zip(spans, spans[1:]))
    apart = [(round(a * 1e3, 3), round((b - a) * 1e3, 3)) for a, b in zip(edges, edges[1:])]
    assert sum(ts + dur > nxt + 1e-9 for (ts, dur), (nxt, _) in zip(apart, apart[1:])) > 0


@pytest.fixture
def fresh_notes(monkeypatch):
    from kit.workload import zoo_checks

    monkeypatch.setattr(zoo_checks, "_NOTED_POSITIONS", set())


def test_a_rotary_model_past_its_trained_positions_gets_a_note(capsys, fresh_notes):
    for args in (["--mode", "inference", "--seq", "8192"], ["--mode", "decode"]):  # its default
        rc, out, err = _kit(capsys, "predict", "llama3-8b", "--gpu", "h100-sxm", *args,
                            "--dtype", "bf16", "--json")
        assert rc == 0 and "positions" not in err, (args, err)
    rc, out, err = _kit(capsys, "predict", "llama3-8b", "--gpu", "h100-sxm", "--mode", "inference",
                        "--seq", "9000", "--dtype", "bf16", "--json")
    assert rc == 0 and "8192 positions" in err and json.loads(out)["total_ms"] > 0


def test_generation_past_the_trained_positions_notes_once(capsys, fresh_notes):
    rc, out, err = _kit(capsys, "predict", "llama3-8b", "--gpu", "h100-sxm", "--mode", "generate",
                        "--seq", "8100", "--new-tokens", "400", "--dtype", "bf16")
    assert rc == 0 and err.count("8192 positions") == 1, err  # its decode steps had noted 4 times


def test_multi_gpu_trace_events_meet():
    import pandas as pd

    from kit.trace.perfetto import to_perfetto

    edges = [0.0, 0.0123454, 0.0234565, 0.0345676, 0.05]
    tl = pd.DataFrame({"rank": 0, "stream": "compute", "name": "k", "kind": "compute",
                       "start_ms": edges[:-1], "end_ms": edges[1:]})
    ev = to_perfetto(tl)["traceEvents"]
    overlaps, n = _overlaps(ev, tid=next(e["tid"] for e in ev if e.get("ph") == "X"), pid=0)
    assert n == 4 and overlaps == 0


def test_no_output_goes_into_the_kit_package(capsys, tmp_path):
    from kit.predict.weights import SHIPPED_DIR, files_identity

    before = files_identity(SHIPPED_DIR)
    for target in (SHIPPED_DIR / "manifest.json", SHIPPED_DIR.parent / "t.json"):
        rc, out, err = _kit(capsys, "predict", "gpt2", "--gpu", "a10", "--mode", "inference",
                            "--batch", "1", "--seq", "128", "--trace", str(target))
        assert rc == 2 and "in the kit package" in err, err
    rc, out, err = _kit(capsys, "collect-comm", "--out", str(SHIPPED_DIR / "x.txt"))
    assert rc == 2 and "in the kit package" in err
    assert files_identity(SHIPPED_DIR) == before and not (SHIPPED_DIR.parent / "t.json").exists()


def test_empty_example_inputs_are_named(tmp_path, monkeypatch):
    import torch
    import torch.nn as nn

    from kit.errors import KitError
    from kit.workload.models import graph_of

    lin = nn.Linear(8, 8)
    with pytest.raises(KitError, match="example inputs have a batch of 0"):
        graph_of(lin, None, None, "inference", inputs=(torch.zeros(0, 8),))
    assert graph_of(lin, None, None, "inference", inputs=(torch.zeros(2, 8),)).kernels()


CONFIG_MODULE = """
    def tiny():
        return {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1, "n_positions": 64,
                "vocab_size": 128}
"""


@pytest.fixture
def config_factory(tmp_path, monkeypatch):
    (tmp_path / "audit5_cfg.py").write_text(textwrap.dedent(CONFIG_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield
    sys.modules.pop("audit5_cfg", None)


def test_generation_takes_a_callable_that_returns_a_config(config_factory, capsys, tmp_path):
    from test_audit_single import TINY_GPT

    (tmp_path / "tiny.json").write_text(json.dumps(TINY_GPT))
    argv = ["--gpu", "h100-sxm", "--mode", "generate", "--seq", "16", "--new-tokens", "8", "--json"]
    rc, out, err = _kit(capsys, "predict", "audit5_cfg:tiny", *argv)
    assert rc == 0, err  # "a Python module has no prefill-and-decode pair" had refused it
    via_callable = json.loads(out)
    rc, out, err = _kit(capsys, "predict", str(tmp_path / "tiny.json"), *argv)
    via_file = json.loads(out)
    assert via_callable["total_ms"] == pytest.approx(via_file["total_ms"])
    assert via_callable["model"] == "audit5_cfg:tiny"
    (tmp_path / "audit5_mod2.py").write_text("import torch\ndef lin(): return torch.nn.Linear(4, 4)\n")
    rc, out, err = _kit(capsys, "predict", "audit5_mod2:lin", *argv)
    assert rc == 2 and "zoo decoder or an HF-style config" in err  # a module is still refused
    sys.modules.pop("audit5_mod2", None)


def test_a_callables_config_keeps_the_kv_cache_asked_for(config_factory):
    from kit.workload.models import graph_of
    from test_audit_single import TINY_GPT

    for cache in ("static", "dynamic"):
        made = graph_of("audit5_cfg:tiny", 2, 16, "decode", kv_cache=cache)
        given = graph_of({"name": "audit5_cfg:tiny", **TINY_GPT}, 2, 16, "decode", kv_cache=cache)
        assert [(n.aten, n.op) for n in made.nodes] == [(n.aten, n.op) for n in given.nodes]
    static = graph_of("audit5_cfg:tiny", 2, 16, "decode", kv_cache="static")
    dynamic = graph_of("audit5_cfg:tiny", 2, 16, "decode", kv_cache="dynamic")
    assert [n.aten for n in static.nodes] != [n.aten for n in dynamic.nodes]  # it had been static
