"""The op collector's CUDA paths after the audit, on fakes: nvidia-smi asked about the GPU torch
times (B10), recoverable CUDA errors as per-row failures (B12), kernel_ms as the median of several
profiled calls (M2), and SIGTERM recorded as an interruption (B11). (The sweep that goes on after an
out-of-memory row: test_collect_methodology.py.)"""
import contextlib
import json
import os
import signal
from types import SimpleNamespace

import pytest
import torch

from kit.data import collect as C
from kit.data import load_measurements
from kit.data import provenance as P
from kit.data import timing as T

H100 = "NVIDIA H100 80GB HBM3, 00000000:18:00.0, 550.54, P0, 1980, 2619, 1980, 2619, 30, 70, 700, 0, 1, 81559, Not Active"
H200 = "NVIDIA H200, 00000000:3B:00.0, 550.54, P0, 1755, 3201, 1980, 3201, 31, 75, 700, 0, 1, 143771, Not Active"
FAKE_SMI = f"""#!/bin/bash
sel=""
while [ $# -gt 0 ]; do [ "$1" = "-i" ] && sel="$2"; shift; done
case "$sel" in
  "") echo "{H100}"; echo "{H200}";;
  00000000:18:00.0) echo "{H100}";;
  00000000:3B:00.0|GPU-b2) echo "{H200}";;
  *) echo "No devices were found" >&2; exit 6;;
esac
"""


@pytest.fixture
def two_gpus(tmp_path, monkeypatch):
    """nvidia-smi of a machine whose first GPU (bus 18) is not the one torch times (bus 3B)."""
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    (fakebin / "nvidia-smi").write_text(FAKE_SMI)
    (fakebin / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fakebin}{os.pathsep}{os.environ['PATH']}")
    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0, uuid="b2")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA H200")
    return props


def test_the_snapshot_is_of_the_gpu_torch_times(two_gpus, monkeypatch):
    snap = P.gpu_snapshot()
    assert snap["name"] == "NVIDIA H200" and snap["pci.bus_id"] == "00000000:3B:00.0"
    assert snap["selected_by"] == "-i 00000000:3B:00.0" and "name_mismatch" not in snap
    assert P.run_record("cuda")["nvidia_smi_before"]["name"] == "NVIDIA H200"
    del two_gpus.pci_bus_id  # an older torch: its UUID
    assert P.gpu_snapshot()["selected_by"] == "-i GPU-b2"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA H100 80GB HBM3")
    assert "torch times 'NVIDIA H100 80GB HBM3'" in P.gpu_snapshot()["name_mismatch"]


def test_out_of_memory_and_bad_launch_configs_are_not_fatal():
    assert not C.is_fatal_cuda_error(RuntimeError("CUDA error: out of memory"))
    assert not C.is_fatal_cuda_error(torch.AcceleratorError("CUDA error: invalid configuration argument"))
    assert not C.is_fatal_cuda_error(torch.AcceleratorError("CUDA error: out of memory"))
    assert C.is_fatal_cuda_error(torch.AcceleratorError("CUDA error: an illegal memory access was encountered"))
    assert C.is_fatal_cuda_error(RuntimeError("CUDA error: unspecified launch failure"))
    assert C.is_fatal_cuda_error(RuntimeError("CUDA error: uncorrectable ECC error encountered"))


def _trace(sums_us):
    """Kineto-like events of len(sums_us) profiled calls, each after a flush kernel (outside the
    call's range): call i runs kernels "a" and "b<i>" whose durations add up to sums_us[i] us."""
    events, t = [], 0

    def kernel(name, dur, grid_x):
        events.append({"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t, "dur": 1,
                       "args": {"correlation": len(events)}})
        events.append({"cat": "kernel", "name": name, "ts": t + 5, "dur": dur,  # runs after its launch
                       "args": {"correlation": len(events) - 1, "grid": [grid_x, 1, 1], "block": [128, 1, 1]}})

    for i, total in enumerate(sums_us):
        kernel("flush", 50.0, 99)
        t += 100
        events.append({"cat": "user_annotation", "name": f"{T.CALL_MARK}_{i}", "ts": t, "dur": 900})
        t += 10
        kernel("a", total / 2, i + 1)
        t += 10
        kernel(f"b{i}", total / 2, i + 1)
        t += 1000
    return events


def test_kernel_ms_is_the_median_over_several_profiled_calls(monkeypatch):
    events = _trace([40.0, 10.0, 30.0, 200.0, 20.0])
    calls, flushes = [], []

    class FakeProfile:
        def __init__(self, activities):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def export_chrome_trace(self, path):
            with open(path, "w") as f:
                json.dump({"traceEvents": events}, f)

    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    monkeypatch.setattr(torch.profiler, "record_function", lambda name: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    k = T.profile_cuda(lambda: calls.append(1), flush=lambda: flushes.append(1))
    assert len(calls) == len(flushes) == T.PROFILED_CALLS == 5
    assert k["kernel_ms"] == pytest.approx(0.030)  # median of 40, 10, 30, 200, 20 us
    assert k["kernels"] == "a;b2" and k["n_kernels"] == 2 and k["grid_x"] == 3  # the median call's
    assert "flush" not in k["kernels"]
    assert T.median_call([e for e in events if e["cat"] == "kernel"][:3])["n_kernels"] == 3  # no marks


def test_sigterm_is_recorded_as_an_interruption(tmp_path, monkeypatch):
    got = []
    def mine(*a):
        got.append("term")

    old = signal.signal(signal.SIGTERM, mine)  # without the fix: no death
    real, built = C.build_call, []

    def build(*a, **k):
        built.append(1)
        if len(built) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)

    monkeypatch.setattr(C, "build_call", build)
    try:
        with pytest.raises(KeyboardInterrupt):
            C.collect("bmm", [(1, 2, 3, 4), (1, 3, 3, 3), (1, 4, 4, 4), (1, 5, 5, 5)], tmp_path / "m.csv",
                      device="cpu", warmup=0, repeats=1, progress=False)
        run = json.loads((tmp_path / "m.meta.json").read_text())["runs"][0]
        assert run["status"] == "interrupted: SIGTERM" and run["measured"] == 2 and not got
        assert len(load_measurements(tmp_path / "m.csv")) == 2
    finally:
        assert signal.getsignal(signal.SIGTERM) is mine
        signal.signal(signal.SIGTERM, old)
