"""--overhead-trace on traces of older PyTorch and of CUPTI's range profiler: a ProfilerStep#N
is a step's frame, not an op; PyTorch 1.8's "Operator" ops are ops; a trace whose launches
replay kernels to read counters is refused, not read as a launch cost."""
import json
import os
from pathlib import Path

import pytest

from kit.cli import main
from kit.errors import KitError
from kit.workload.overhead import calibrate

SHARED = Path(os.environ.get("KIT_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
CUPTI = SHARED / "data/traces/HolisticTraceAnalysis/tests/data/cupti_profiler"
PERIOD_US, LAUNCH_US = 40.0, 5.0  # each op: its dispatch, one launch, issued every 40 µs


def _steps(tmp_path, op_cat, step_cat, runtime_cat="cuda_runtime", steps=3, ops=30):
    """`steps` ProfilerStep#N frames (step_cat; None: no frame) around `ops` ops each."""
    ev, t = [], 0.0
    for s in range(steps):
        t0 = t
        for _ in range(ops):
            ev.append({"ph": "X", "cat": op_cat, "name": "aten::mm", "pid": 1, "tid": 1, "ts": t, "dur": 30.0})
            ev.append({"ph": "X", "cat": runtime_cat, "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": t + 20.0, "dur": LAUNCH_US})
            t += PERIOD_US
        if step_cat:
            ev.append({"ph": "X", "cat": step_cat, "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1,
                       "ts": t0, "dur": t - t0})
    path = tmp_path / f"{op_cat}_{step_cat}.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    return path


@pytest.mark.parametrize("op_cat,step_cat,runtime_cat", [
    ("cpu_op", "user_annotation", "cuda_runtime"),  # today's PyTorch: the reference
    ("cpu_op", "cpu_op", "cuda_runtime"),  # a step frame of category cpu_op: was 1,050 µs an op
    ("Operator", "Operator", "Runtime"),  # PyTorch 1.8: was the default 10 µs, no op read
    ("Operator", None, "Runtime"),
])
def test_the_per_op_cost_is_the_ops_own_whatever_the_step_frame(tmp_path, op_cat, step_cat, runtime_cat):
    oh = calibrate(_steps(tmp_path, op_cat, step_cat, runtime_cat))
    assert oh.launch_us == pytest.approx(LAUNCH_US)
    assert oh.cpu_op_us == pytest.approx(PERIOD_US - LAUNCH_US)
    assert "90 top-level cpu_ops" in oh.source


def test_a_range_profiler_trace_is_refused(tmp_path):
    path = _steps(tmp_path, "cpu_op", "user_annotation")
    doc = json.loads(path.read_text())
    doc["traceEvents"].append({"ph": "X", "cat": "cuda_profiler_range", "name": "gemm", "pid": 1,
                               "tid": 1, "ts": 0.0, "dur": 1.0})
    path.write_text(json.dumps(doc))
    with pytest.raises(KitError, match="range profiler"):
        calibrate(path)


@pytest.mark.skipif(not CUPTI.is_dir(), reason=f"no HTA cupti_profiler trace under {SHARED} (set KIT_SHARED)")
def test_htas_range_profiler_trace_is_one_error(capsys):
    # was launch_us 52,918 µs (the median launch, each replaying its kernel): 10,000 x a launch
    path = next(CUPTI.glob("*.json.gz"))
    rc = main(["predict", "gpt2", "--gpu", "t4", "--seq", "32", "--overhead-trace", str(path)])
    out, err = capsys.readouterr()
    assert rc == 2 and not out and len(err.splitlines()) == 1
    assert str(path) in err and "range profiler" in err and "52,918" in err
