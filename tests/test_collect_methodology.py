"""Measurement methodology of the collectors, checked on the CPU: L2 flush and warm-up outside the
timed region, signed GEMM inputs, linear without a bias, kernel_ms and the median, the metadata
and failure files, a clean stop on a sticky CUDA error (no empty_cache after it), decode_steps'
per-row safety, nvjet tile names, the embedding collector's timing, and collect-comm's rows."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from kit.cli import main
from kit.errors import KitError
from kit.data import collect as C
from kit.data import op_calls
from kit.data import timing as T
from kit.data import load_measurements, schema
from kit.data.records import HEADER

ROOT = Path(__file__).resolve().parents[1]


# ---- timing -----------------------------------------------------------------------------------

def test_time_cpu_keeps_flush_and_setup_out_of_the_timed_region():
    log = []
    times = C.time_cpu(lambda: log.append("call"), warmup=2, repeats=3,
                       flush=lambda: (log.append("flush"), time.sleep(0.02)),
                       before=lambda: (log.append("before"), time.sleep(0.02)))
    assert len(times) == 3 and max(times) < 15  # the 20 ms sleeps are not in the times
    assert log == ["before", "call"] * 2 + ["before", "flush", "call"] * 3  # flush after the setup


class _FakeEvent:
    log: list = []

    def __init__(self, enable_timing=False):
        assert enable_timing

    def record(self):
        _FakeEvent.log.append("record")

    def elapsed_time(self, other):
        return 1.0


def test_time_cuda_flushes_before_the_start_event(monkeypatch):
    _FakeEvent.log = log = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: log.append("sync"))
    times = C.time_cuda(lambda: log.append("call"), warmup=1, repeats=2, flush=lambda: log.append("flush"))
    assert times == [1.0, 1.0]
    assert log == ["call", "sync"] + ["flush", "record", "call", "record"] * 2 + ["sync"]
    # a backward timed after its forward (before): the flush comes after the forward, so the
    # backward finds the L2 cold (the embedding collector's M3)
    log.clear()
    C.time_cuda(lambda: log.append("backward"), warmup=0, repeats=2, flush=lambda: log.append("flush"),
                before=lambda: log.append("forward"))
    assert log == ["sync"] + ["forward", "flush", "record", "backward", "record"] * 2 + ["sync"]


def test_warm_for_runs_at_least_the_time_asked_in_few_syncs():
    now = [0.0]
    calls, syncs = [], []

    def call():
        calls.append(1)
        now[0] += 0.001

    n = C.warm_for(call, 0.5, sync=lambda: syncs.append(1), clock=lambda: now[0])
    assert n == len(calls) and 500 <= n <= 520 and len(syncs) < 15
    now[0] = 0.0
    slow = C.warm_for(lambda: now.__setitem__(0, now[0] + 0.3), 0.5, clock=lambda: now[0])
    assert slow == 2  # one call past the time asked, not a doubling
    assert C.warm_for(call, 0) == 0


def test_each_op_group_is_warmed_once_for_warmup_ms(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(C, "warm_for", lambda call, seconds, sync=None: seen.append(seconds) or 1)
    r = C.collect("bmm,linear", [(1, 2, 3, 4), (2, 3, 4, 5), (1, 4, 4, 4)], tmp_path / "m.csv",
                  device="cpu", warmup=0, repeats=1, warmup_ms=50, progress=False)
    assert r["measured"] == 6 and seen == [0.05, 0.05]  # per op, not per shape
    seen.clear()
    C.collect("bmm", [(1, 2, 3, 4)], tmp_path / "n.csv", device="cpu", warmup=0, repeats=1, progress=False)
    assert seen == []  # 0 ms by default on the CPU


def test_l2_size_from_torch_else_the_catalog_and_a_flush_of_twice_it(monkeypatch):
    class Props:
        L2_cache_size = 60 << 20

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    assert T.l2_bytes() == (60 << 20, "torch.cuda.get_device_properties")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: object())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA H200")
    from kit.hardware import get_gpu

    assert T.l2_bytes() == (int(get_gpu("h200").l2_cache_mib * 2**20), "kit catalog")
    made = []

    class Buf:
        def zero_(self):
            made.append("zero")

    monkeypatch.setattr(torch, "empty", lambda n, dtype=None, device=None: made.append((n, device)) or Buf())
    flush, policy = C.l2_flusher("cuda", True)
    assert policy["l2_flush"] and policy["flush_bytes"] == 2 * T.l2_bytes()[0]
    assert made == [(policy["flush_bytes"] // 4, "cuda")]
    flush()
    assert made[-1] == "zero"
    assert C.l2_flusher("cuda", False) == (None, {"l2_flush": False, "l2_policy": "off (--no-l2-flush)"})
    assert C.l2_flusher("cpu", True)[0] is None


def test_kernel_ms_is_the_sum_of_the_kernels_durations():
    events = [{"cat": "kernel", "name": "a", "ts": 1, "dur": 40.0, "args": {}},
              {"cat": "kernel", "name": "b", "ts": 50, "dur": 4.5, "args": {}},
              {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 9}]
    assert T.kernels_from_trace(events)["kernel_ms"] == pytest.approx(0.0445)


# ---- inputs and bias --------------------------------------------------------------------------

def test_gemm_inputs_are_signed_and_linear_can_drop_its_bias(monkeypatch):
    import torch.nn.functional as F

    got = {}
    monkeypatch.setattr(torch, "bmm", lambda a, b: got.update(bmm=(a, b)))
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: got.update(linear=(x, w, b)))
    C.build_call("bmm", (2, 16, 16, 16), "fp32", "cpu")()
    a, b = got["bmm"]
    assert a.min() < 0 < a.max() and b.min() < 0 and abs(float(a.std()) - 1) < 0.2
    C.build_call("linear", (1, 8, 32, 16), "fp32", "cpu")()
    x, w, bias = got["linear"]
    assert x.min() < 0 and abs(float(w.std()) - op_calls.WEIGHT_STD) < 0.01 and bias is not None
    C.build_call("linear", (1, 8, 32, 16), "fp32", "cpu", bias=False)()
    assert got["linear"][2] is None
    vec = C.build_call("add", (4, 8), "fp32", "cpu")  # vector ops keep U[0.5, 1.5)
    assert (vec() >= 1.0).all()


def test_no_bias_is_recorded_and_not_mixed_into_a_file_with_bias(tmp_path, capsys):
    out = tmp_path / "l.csv"
    argv = ["collect", "--device", "cpu", "--ops", "linear", "--shapes", "tiny-gemm:2", "--warmup", "0",
            "--repeats", "1", "--out", str(out)]
    assert main(argv + ["--no-bias"]) == 0
    meta = json.loads((tmp_path / "l.meta.json").read_text())
    assert meta["runs"][0]["settings"]["linear_bias"] is False
    capsys.readouterr()
    assert main(argv + ["--shapes", "tiny-gemm:3", "--resume"]) == 2
    assert "without a bias" in capsys.readouterr().err


# ---- files: extra columns, metadata, failures -------------------------------------------------

def test_new_csvs_carry_the_median_and_kernel_ms_and_old_ones_resume_in_their_format(tmp_path):
    new = tmp_path / "new.csv"
    C.collect("bmm", [(1, 2, 3, 4), (1, 3, 3, 3)], new, device="cpu", warmup=0, repeats=3, progress=False)
    raw = pd.read_csv(new)
    assert list(raw.columns) == HEADER and HEADER[-2:] == ["kernel_ms", "latency_median_ms"]
    assert (raw.latency_median_ms >= raw.latency_ms).all() and raw.kernel_ms.isna().all()  # CPU: no profiler
    d = load_measurements(new)
    schema.check(d)
    assert len(d) == 2 and (d.latency_median_ms >= d.latency_ms).all()  # the loader keeps them
    r = C.collect("bmm", [(1, 2, 3, 4), (1, 5, 5, 5)], new, device="cpu", warmup=0, repeats=3,
                  resume=True, progress=False)
    assert (r["measured"], r["skipped"]) == (1, 1) and len(load_measurements(new)) == 3

    old = tmp_path / "old.csv"  # a file written before the two columns: resumed in its format
    legacy = [c for c in HEADER if c not in ("kernel_ms", "latency_median_ms")]
    row = {"op": "bmm", "op_class": "gemm", "dtype": "fp32", "device_name": "cpu: x", "b": "1",
           "m": "9", "n": "9", "k": "9", "latency_ms": "0.5", "source": "collector", "split": "train"}
    old.write_text(",".join(legacy) + "\n" + ",".join(row.get(c, "") for c in legacy) + "\n")
    C.collect("bmm", [(1, 2, 3, 4)], old, device="cpu", warmup=0, repeats=1, resume=True, progress=False,
              force=True)  # no old.meta.json: how its row was measured is unknown
    lines = old.read_text().splitlines()
    assert lines[0] == ",".join(legacy) and len(lines) == 3
    assert all(len(line.split(",")) == len(legacy) for line in lines)
    schema.check(load_measurements(old))
    assert len(load_measurements(old)) == 2


def test_metadata_is_written_at_the_start_and_completed_at_the_end(tmp_path, monkeypatch):
    out = tmp_path / "m.csv"
    meta = tmp_path / "m.meta.json"
    during = []
    real = C.build_call

    def spy(*a, **k):
        during.append(json.loads(meta.read_text())["runs"][-1]["status"])
        return real(*a, **k)

    monkeypatch.setattr(C, "build_call", spy)
    C.collect("bmm", [(1, 2, 3, 4)], out, device="cpu", warmup=1, repeats=2, progress=False)
    assert during == ["running"]
    run = json.loads(meta.read_text())["runs"][0]
    assert run["status"] == "done" and run["finished"] and run["measured"] == 1
    s = run["settings"]
    assert (s["repeats"], s["warmup_calls"], s["l2_flush"], s["dtype"]) == (2, 1, False, "fp32")
    assert "fastest fifth" in s["statistic"] and run["torch_version"] == torch.__version__
    C.collect("bmm", [(1, 3, 3, 4)], out, device="cpu", warmup=0, repeats=2, resume=True, progress=False)
    assert len(json.loads(meta.read_text())["runs"]) == 2  # one entry per run


def test_failures_are_written_to_a_file(tmp_path, monkeypatch):
    real = C.build_call

    def sometimes(op, shape, *a, **k):
        if shape == (1, 3, 3, 3):
            raise ValueError("no kernel for this")
        return real(op, shape, *a, **k)

    monkeypatch.setattr(C, "build_call", sometimes)
    r = C.collect("bmm", [(1, 2, 3, 4), (1, 3, 3, 3)], tmp_path / "m.csv", device="cpu", warmup=0,
                  repeats=1, progress=False)
    assert r["measured"] == 1 and len(r["failed"]) == 1
    lines = (tmp_path / "m.failed.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["error"] == "no kernel for this"
    assert r["failures_file"] == str(tmp_path / "m.failed.jsonl")


def test_time_limit_stops_cleanly(tmp_path):
    r = C.collect("bmm", [(1, 2, 3, 4)] + [(1, i, 3, 4) for i in range(3, 40)], tmp_path / "m.csv",
                  device="cpu", warmup=0, repeats=1, progress=False, time_limit_s=1e-9)
    assert r["measured"] == 0 and "time limit" in r["stopped"]
    assert not (tmp_path / "m.csv").exists()  # a header alone would ask for --resume


def _cuda_sweep(tmp_path, monkeypatch, error: str, empty_cache):
    """A fake CUDA sweep of three bmm shapes whose second measurement raises RuntimeError(error)."""
    env = {"device_name": "NVIDIA H200", "gpu": "h200", "torch_version": "x", "cuda_version": "12",
           "cudnn_version": None}
    monkeypatch.setattr(C, "environment", lambda device: env)
    monkeypatch.setattr(C, "build_call", lambda *a, **k: (lambda: None))
    monkeypatch.setattr(C, "gpu_snapshot", lambda *a, **k: {"error": "none here"})
    monkeypatch.setattr(C, "run_record", lambda device: {"status": "running", "torch": {}})
    tries = []

    def timer(call, warmup, repeats, flush=None, before=None):
        tries.append(1)
        if len(tries) == 2:
            raise RuntimeError(error)
        return [0.01] * repeats

    monkeypatch.setattr(C, "time_cuda", timer)
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    r = C.collect("bmm", [(1, 2, 3, 4), (1, 3, 3, 3), (1, 4, 4, 4)], tmp_path / "m.csv", device="cuda",
                  warmup=0, repeats=2, profile=False, l2_flush=False, warmup_ms=0, progress=False)
    return len(tries), r


def test_a_sticky_cuda_error_stops_the_run_without_empty_cache(tmp_path, monkeypatch):
    def never():
        raise AssertionError("empty_cache after a sticky CUDA error")

    tries, r = _cuda_sweep(tmp_path, monkeypatch, "CUDA error: an illegal memory access was encountered", never)
    assert tries == 2 and r["measured"] == 1 and "CUDA error" in r["stopped"]
    assert len(load_measurements(tmp_path / "m.csv")) == 1
    assert json.loads((tmp_path / "m.meta.json").read_text())["runs"][0]["status"].startswith("stopped")
    assert "illegal memory access" in (tmp_path / "m.failed.jsonl").read_text()


def test_an_out_of_memory_row_fails_alone_and_the_sweep_goes_on(tmp_path, monkeypatch):
    emptied = []
    tries, r = _cuda_sweep(tmp_path, monkeypatch, "CUDA error: out of memory", lambda: emptied.append(1))
    assert tries == 3 and r["measured"] == 2 and r["stopped"] is None and emptied == [1]
    assert len(load_measurements(tmp_path / "m.csv")) == 2
    assert "out of memory" in (tmp_path / "m.failed.jsonl").read_text()


@pytest.mark.parametrize("status", ["CUBLAS_STATUS_NOT_SUPPORTED", "CUBLAS_STATUS_INVALID_VALUE",
                                    "CUBLAS_STATUS_ALLOC_FAILED"])
def test_a_shape_cublas_refuses_fails_alone_and_the_sweep_goes_on(tmp_path, monkeypatch, status):
    # torch's words for a cuBLAS status: "CUDA error: <status> when calling `...`"; the library
    # refused the call on the host, and the context lives on
    tries, r = _cuda_sweep(tmp_path, monkeypatch, f"CUDA error: {status} when calling "
                           "`cublasLtMatmul( ltHandle, computeDesc.descriptor(), ...)`", lambda: None)
    assert tries == 3 and r["measured"] == 2 and r["stopped"] is None
    assert status in (tmp_path / "m.failed.jsonl").read_text()
    assert C.is_fatal_cuda_error(RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`"))


def test_which_errors_are_fatal():
    assert C.is_fatal_cuda_error(RuntimeError("CUDA error: device-side assert triggered"))
    assert not C.is_fatal_cuda_error(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate"))
    assert not C.is_fatal_cuda_error(RuntimeError("expected scalar type Float but found Half"))


def test_release_never_raises(monkeypatch):
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: (_ for _ in ()).throw(RuntimeError("CUDA error")))
    C._release("cuda")


# ---- tiles ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, tile", [
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNT", (128, 256, 64)),
    ("nvjet_tst_192x192_64x3_2x1_v_bz_coopB_TNN", (192, 192, 64)),
    ("nvjet_tss_64x8_64x16_1x1_v_bz_TNT", (64, 8, 64)),
    ("nvjet_hsh_128x256", (None, None, None)),           # not the whole structure: no guess
    ("gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, float, 128, 16, 4, 4>",
     (None, None, None)),
    ("ampere_sgemm_128x64_tn", (128, 64, None)),
])
def test_nvjet_tiles(name, tile):
    assert schema.parse_tile(name) == tile


# ---- decode_steps -----------------------------------------------------------------------------

def _decode():
    sys.path.insert(0, str(ROOT / "tests"))
    from benchmark_modules import load_benchmark

    return load_benchmark("decode_steps")


TINY = {"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 2, "vocab_size": 64,
        "n_positions": 32, "name": "tiny-gpt"}


def test_decode_steps_skip_contexts_past_the_positions_and_write_rows_as_they_go(tmp_path, monkeypatch):
    bench = _decode()
    assert bench.skip_reason("gpt2", 1023) is None and "1024" in bench.skip_reason("gpt2", 2000)
    assert bench.skip_reason("llama3-8b", 4096) is None
    path = tmp_path / "rows.jsonl"
    rows = bench.Rows(str(path))
    real = bench.measure
    seen = []

    def measure(model, batch, context, *a, **k):
        seen.append(len(path.read_text().splitlines()) if path.exists() else 0)
        if batch == 2:
            raise IndexError("index out of range in self")  # not a RuntimeError: still one row
        return real(model, batch, context, *a, **k)

    monkeypatch.setattr(bench, "measure", measure)
    stopped = bench.sweep([TINY], [1, 2], [6, 40], "fp32", "cpu", 2, None, "static", rows, warmup=1)
    assert stopped is None
    got = [json.loads(x) for x in path.read_text().splitlines()]
    assert [("skipped" in r, "error" in r, "measured_ms" in r) for r in got] == [
        (False, False, True), (True, False, False), (False, True, False), (True, False, False)]
    assert seen == [0, 2]  # the first row was on disk before the next was measured
    again = bench.Rows(str(path))
    calls = []
    monkeypatch.setattr(bench, "measure", lambda *a, **k: calls.append(a) or {"model": "x"})
    bench.sweep([TINY], [1, 2], [6, 40], "fp32", "cpu", 2, None, "static", again)
    assert [a[1:3] for a in calls] == [(2, 6)]  # only the row that failed runs again


def test_decode_steps_stop_on_a_cuda_error_without_empty_cache(tmp_path, monkeypatch):
    bench = _decode()
    monkeypatch.setattr(bench, "real_model", lambda *a, **k: object())
    monkeypatch.setattr(bench, "measure", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("CUDA error: device-side assert triggered")))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: (_ for _ in ()).throw(AssertionError("no")))
    rows = bench.Rows(str(tmp_path / "r.jsonl"))
    stopped = bench.sweep(["gpt2", "llama3-8b"], [1, 8], [512], "bf16", "cuda", 2, None, "static", rows)
    assert stopped.startswith("CUDA error") and len(rows.rows) == 1 and rows.rows[0]["fatal"]


def test_decode_steps_main_prints_json_with_skips(tmp_path, capsys):
    bench = _decode()
    assert bench.main(["--device", "cpu", "--models", "gpt2", "--batches", "1", "--contexts", "2000",
                       "--jsonl", str(tmp_path / "r.jsonl")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"][0]["skipped"] and out["stopped"] is None


# ---- device_session.sh ------------------------------------------------------------------------

def test_device_session_packs_on_exit_and_keeps_to_its_deadline(tmp_path):
    fake = tmp_path / "py"  # python that hangs in every measuring step
    fake.write_text("#!/bin/bash\ncase \"$*\" in *collect*|*decode_steps*) exec sleep 100;; esac\nexit 0\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "DEVICE": "cpu", "QUICK": "1", "PY": str(fake), "BUDGET": "36",
           "MIN_STEP": "2", "PACK_RESERVE": "20"}
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(ROOT / "benchmarks/device_session.sh"), str(out)], env=env,
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert took < 30, took
    assert sorted(p.name for p in out.iterdir()) == ["device_session.tar.gz", "log.txt"]
    listing = subprocess.run(["tar", "-tzf", str(out / "device_session.tar.gz")], capture_output=True,
                             text=True).stdout
    assert "session/steps.txt" in listing and "session/log.txt" in listing
    log = (out / "log.txt").read_text()
    assert "step decode_linear_bf16 rc=124" in log and "packed into" in log
    assert "step vector_bf16 rc=skipped" in log


@pytest.mark.parametrize("hang", ["*collect*", "'- '*"])  # a measuring step; the provenance one
def test_device_session_packs_at_once_on_a_term_to_the_script_alone(tmp_path, hang):
    # bash runs a trap only once its foreground command ends: a TERM to the script (not its
    # process group) had waited out the running step's own timeout, 56 s of this 60 s step (the
    # provenance step's too: 60 s), and a kill after a shorter grace would have left no tarball
    fake, ready, marker = tmp_path / "py", tmp_path / "ready", tmp_path / "stopped"
    fake.write_text(f"#!/bin/bash\ncase \"$*\" in {hang}) trap 'echo step >> {marker}; kill $!; exit 143' TERM; "
                    f"touch {ready}; sleep 100 & wait;; esac\nexit 0\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "DEVICE": "cpu", "QUICK": "1", "PY": str(fake), "BUDGET": "120", "MIN_STEP": "2"}
    p = subprocess.Popen(["bash", str(ROOT / "benchmarks/device_session.sh"), str(out)], env=env, cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60  # a loaded machine may take seconds to start the step
        while not ready.exists() and time.monotonic() < deadline:  # its TERM trap is set
            time.sleep(0.1)
        assert ready.exists()
        t0 = time.monotonic()
        p.terminate()
        rc = p.wait(timeout=40)
    finally:
        p.kill()
    assert time.monotonic() - t0 < 20 and rc == 143
    # the step got the TERM (timeout passes it on to the step and again to its process group:
    # the fake's trap may run twice)
    assert (out / "device_session.tar.gz").is_file() and marker.read_text().startswith("step\n")
    assert "signal received" in (out / "log.txt").read_text()


@pytest.mark.parametrize("plan, first_step", [("aligned", "aligned_linear_bf16"), ("rows", "rows_gpt2_bf16")])
def test_device_session_runs_the_plan_it_is_given(tmp_path, plan, first_step):
    fake = tmp_path / "py"  # python that succeeds at once in every step
    fake.write_text("#!/bin/bash\nexit 0\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "DEVICE": "cpu", "QUICK": "1", "PY": str(fake), "BUDGET": "60", "PLAN": plan}
    r = subprocess.run(["bash", str(ROOT / "benchmarks/device_session.sh"), str(out)], env=env,
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    log = (out / "log.txt").read_text()
    assert f"step {first_step} rc=0" in log and "decode_linear_bf16" not in log


def test_device_session_refuses_an_unknown_plan(tmp_path):
    env = {**os.environ, "DEVICE": "cpu", "QUICK": "1", "PLAN": "everything"}
    r = subprocess.run(["bash", str(ROOT / "benchmarks/device_session.sh"), str(tmp_path / "out")], env=env,
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "PLAN must be decode, aligned or rows, not everything" in r.stdout + r.stderr


def test_a_conv_group_is_warmed_on_its_largest_shape_padding_0_included(tmp_path, monkeypatch):
    built, warmed = {}, []

    def fake_build(op, shape, dtype, device, bias=True):
        call = lambda: None  # noqa: E731
        built[id(call)] = shape
        return call

    monkeypatch.setattr(C, "build_call", fake_build)
    monkeypatch.setattr(C, "warm_for", lambda call, seconds, sync=None: warmed.append(built[id(call)]) or 1)
    big = (64, 256, 256, 1, 56, 1, 0)  # a 1x1 conv: padding 0, 4.9e10 multiply-adds
    small = (1, 3, 8, 3, 8, 1, 1)  # 1.4e4 multiply-adds
    C.collect("conv", [small, big], tmp_path / "c.csv", device="cpu", warmup=0, repeats=1,
              warmup_ms=1, progress=False)
    assert warmed == [big]


def test_a_mixing_refusal_suggests_no_flag_that_does_not_lift_it(tmp_path):
    out = tmp_path / "m.csv"
    C.collect("bmm", [(1, 2, 3, 4)], out, device="cpu", warmup=0, repeats=3, progress=False)
    with pytest.raises(KitError, match="--repeats"):  # --force (with --resume) does not mix methods
        C.collect("bmm", [(1, 3, 3, 4)], out, device="cpu", warmup=0, repeats=5, resume=True,
                  force=True, progress=False)
    from kit.data.provenance import mixed_settings

    then = {"settings": {"device": "cuda", "profile": True, "profiled_calls": 1, "ops": ["bmm"]}}
    now = {"settings": {"device": "cuda", "profile": True, "profiled_calls": 5, "ops": ["bmm"]},
           "torch": {"num_threads": 1}}
    said = "; ".join(mixed_settings([then], now))
    assert "kernel_ms" in said and "--force" not in said
