"""--overhead-trace: a trace that cannot calibrate a cost is refused or keeps that cost's default
(and says so), the text output names the calibration, and an archive is named as one."""
import io
import json
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from kit.cli import main
from kit.errors import KitError
from kit.workload.iteration import CpuOverhead
from kit.workload.overhead import calibrate

SHARED = Path(os.environ.get("KIT_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
TRACES = SHARED / "data" / "traces"
CPU_ONLY = TRACES / "HolisticTraceAnalysis/tests/data/cpu_only"
DLRM_TAR = TRACES / "param/et_replay/tests/inputs/dlrm_kineto.tar.gz"
PREDICT = ["predict", "gpt2", "--gpu", "t4", "--seq", "32"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))


def _kit(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _op(ts, name="aten::mm"):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 8}


def _launch(ts, dur):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
            "ts": ts, "dur": dur}


def _trace(tmp_path, events, name="k.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_a_trace_without_launches_is_refused_naming_the_file(tmp_path, capsys):
    # was launch_us 0.0 from 0 launches: a CPU-bound step predicted GPU-bound, without a word
    path = _trace(tmp_path, [_op(0), _op(20), _op(40)])
    with pytest.raises(KitError, match="3 top-level cpu_ops but no kernel launches"):
        calibrate(path)
    rc, out, err = _kit(capsys, *PREDICT, "--overhead-trace", path)
    assert rc == 2 and not out and len(err.splitlines()) == 1
    assert str(path) in err and "per-launch cost" in err and "ProfilerActivity.CUDA" in err


def test_an_empty_trace_says_it_lacks_both(tmp_path):
    with pytest.raises(KitError, match="no cpu_op events and no kernel launches"):
        calibrate(_trace(tmp_path, []))


@pytest.mark.skipif(not CPU_ONLY.is_dir(), reason=f"no HTA cpu_only trace under {TRACES} (set KIT_SHARED)")
def test_htas_cpu_only_trace_is_refused(capsys):
    path = next(CPU_ONLY.glob("rank-*.json.gz"))
    rc, out, err = _kit(capsys, "predict", "gpt2", "--gpu", "a100-pcie-40gb", "--batch", "1", "--seq",
                        "128", "--overhead-trace", path)
    assert rc == 2 and not out and str(path) in err and "no kernel launches" in err


def test_launches_without_an_issue_period_keep_the_default_per_op_cost(tmp_path):
    # one top-level op: no issue period to measure; was "no cpu_op events" although the launch
    # cost could be measured
    oh = calibrate(_trace(tmp_path, [_op(0), _launch(2, 4), _launch(10, 6)]))
    default = CpuOverhead()
    assert oh.launch_us == pytest.approx(5.0)
    assert oh.cpu_op_us == default.cpu_op_us and oh.free_op_us == default.free_op_us
    assert "keeps its default 10 µs" in oh.source and "1 top-level cpu_ops" in oh.source


def test_text_output_names_the_calibration_as_json_does(tmp_path, capsys):
    path = _trace(tmp_path, [_op(0), _op(40), _op(80), _launch(2, 4), _launch(42, 6)])
    rc, out, _ = _kit(capsys, *PREDICT, "--overhead-trace", path, "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["overhead_trace"] == str(path)
    assert (d["overhead"]["cpu_op_us"], d["overhead"]["launch_us"]) == pytest.approx((35.0, 5.0))
    rc, out, _ = _kit(capsys, *PREDICT, "--overhead-trace", path)
    host = [line for line in out.splitlines() if line.strip().startswith("host")]
    assert rc == 0 and len(host) == 1
    assert (f"calibrated from {path}: 35.00 µs per op, 5.00 µs per launch, 3.00 µs per view op "
            "(3 top-level cpu_ops on the main thread, 2 launches; the per-op cost from the 2 that "
            "launch kernels)") in host[0]
    rc, out, _ = _kit(capsys, *PREDICT)  # no trace, no host line
    assert rc == 0 and "calibrated" not in out


def test_compare_reports_the_calibration_too(tmp_path, capsys):
    path = _trace(tmp_path, [_op(0), _op(40), _op(80), _launch(2, 4), _launch(42, 6)])
    argv = ("compare", "gpt2", "--gpus", "a100-pcie-40gb,t4", "--mode", "inference", "--batch", "1",
            "--seq", "64", "--overhead-trace", str(path))
    rc, out, _ = _kit(capsys, *argv, "--json")
    assert rc == 0 and json.loads(out)["overhead"]["launch_us"] == pytest.approx(5.0)
    rc, out, _ = _kit(capsys, *argv)
    assert rc == 0 and f"calibrated from {path}: 35.00 µs per op, 5.00 µs per launch" in out


def test_generate_reports_the_calibration_too(tmp_path, capsys):
    path = _trace(tmp_path, [_op(0), _op(40), _launch(2, 4)])
    argv = [*PREDICT, "--mode", "generate", "--new-tokens", "2", "--overhead-trace", path]
    rc, out, _ = _kit(capsys, *argv, "--json")
    d = json.loads(out)
    assert rc == 0 and d["overhead_trace"] == str(path) and d["overhead"]["launch_us"] == 4.0
    rc, out, _ = _kit(capsys, *argv)
    assert rc == 0 and f"host      calibrated from {path}: 36.00 µs per op, 4.00 µs per launch" in out


def _tarball(tmp_path, name="k.tar.gz"):
    path = tmp_path / name
    raw = json.dumps({"traceEvents": []}).encode()
    with tarfile.open(path, "w:gz" if name.endswith("gz") else "w") as t:
        for member in ("run/rank0.json", "run/rank1.json"):
            info = tarfile.TarInfo(member)
            info.size = len(raw)
            t.addfile(info, io.BytesIO(raw))
    return path


def _zip(tmp_path):
    path = tmp_path / "k.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("run/rank0.json.gz", b"x")
    return path


@pytest.mark.parametrize("make,kind,first", [(_tarball, "tar", "run/rank0.json and 1 more"),
                                             (lambda d: _tarball(d, "k.tar"), "tar", "run/rank0.json"),
                                             (_zip, "zip", "run/rank0.json.gz")])
def test_an_archive_is_named_as_one(tmp_path, capsys, make, kind, first):
    # was "not valid JSON (Expecting value: line 1 column 1 (char 0))"
    path = make(tmp_path)
    rc, out, err = _kit(capsys, *PREDICT, "--overhead-trace", path)
    assert rc == 2 and not out and len(err.splitlines()) == 1 and "not valid JSON" not in err
    assert f"{path} is a {kind} archive, not a trace JSON (it holds {first}" in err
    assert "extract the trace JSON (.json or .json.gz) from it first" in err


@pytest.mark.skipif(not DLRM_TAR.is_file(), reason=f"no {DLRM_TAR} (set KIT_SHARED)")
def test_params_dlrm_tarball_is_named_as_an_archive(capsys):
    rc, out, err = _kit(capsys, *PREDICT, "--overhead-trace", DLRM_TAR)
    assert rc == 2 and "is a tar archive" in err and "dlrm_kineto/worker0_" in err and "7 more" in err


def test_a_gzipped_trace_is_not_taken_for_an_archive(tmp_path):
    import gzip

    path = tmp_path / "k.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": [_op(0), _op(30), _launch(1, 5)]}).encode()))
    assert calibrate(path).launch_us == 5.0


def _view(ts):
    return {"ph": "X", "cat": "cpu_op", "name": "aten::view", "pid": 1, "tid": 1, "ts": ts, "dur": 2}


def test_the_per_op_cost_is_read_off_the_ops_that_launch(tmp_path):
    # two mm ops, each launching one kernel 40 µs apart from the next op, and three views (4 µs
    # apart) after each: the median over every top-level op was a view's 4 µs, so the per-op
    # cost came out max(4 - 5, 0) = 0 and an op launching one kernel cost 5 µs, where the trace
    # shows 40
    events = [_op(0), _launch(2, 5), _view(40), _view(44), _view(48),
              _op(52), _launch(54, 5), _view(92), _view(96), _view(100), _op(104), _launch(106, 5)]
    oh = calibrate(_trace(tmp_path, events))
    assert oh.launch_us == pytest.approx(5.0)
    assert oh.cpu_op_us + oh.launch_us == pytest.approx(40.0)
    assert "the per-op cost from the 2 that launch kernels" in oh.source


def test_a_kernel_op_launching_k_kernels_pays_k_launches(tmp_path):
    # the kit charges an op cpu_op_us + k launch_us: ops launching 3, 1 and 2 kernels, 50, 40 and
    # 45 µs apart, each spend 35 µs besides their launches
    events = [_op(0) | {"dur": 30}, _launch(2, 5), _launch(10, 5), _launch(20, 5),
              _op(50), _launch(52, 5), _op(90) | {"dur": 20}, _launch(92, 5), _launch(100, 5),
              _op(135), _launch(137, 5)]
    oh = calibrate(_trace(tmp_path, events))
    assert (oh.cpu_op_us, oh.launch_us) == pytest.approx((35.0, 5.0))


DLRM_WORKER0 = "dlrm_kineto/worker0_step_12.1694128201545.pt.trace.json"


@pytest.mark.skipif(not DLRM_TAR.is_file(), reason=f"no {DLRM_TAR} (set KIT_SHARED)")
def test_params_dlrm_trace_costs_a_one_kernel_op_as_it_ran(tmp_path):
    # worker 0's main thread: 397 top-level ops, 292 of them launching nothing (4 µs apart); its
    # 94 ops that launch one kernel are 15 µs apart (median), the launches 5 µs. The per-op cost
    # had been 1 µs (a one-kernel op 6 µs, a GPT-2 step on an A100 at batch 1 GPU-bound); now 10
    with tarfile.open(DLRM_TAR) as t:
        t.extract(DLRM_WORKER0, tmp_path, filter="data")
    oh = calibrate(tmp_path / DLRM_WORKER0)
    assert oh.launch_us == pytest.approx(5.0)
    assert oh.cpu_op_us + oh.launch_us == pytest.approx(15.0)


def test_older_kinetos_runtime_category_counts_its_launches(tmp_path):
    # PyTorch's older traces name the category "Runtime": its launches had been missed, and the
    # trace refused for having "no kernel launches"
    events = [_op(0), _op(40), _launch(2, 7) | {"cat": "Runtime"}]
    assert calibrate(_trace(tmp_path, events)).launch_us == pytest.approx(7.0)


def test_a_thread_id_that_is_no_number_or_string_is_one_error(tmp_path, capsys):
    # was TypeError: unhashable type: 'list'
    path = _trace(tmp_path, [_op(0) | {"pid": [1]}, _op(40), _launch(2, 5)])
    rc, out, err = _kit(capsys, *PREDICT, "--overhead-trace", path)
    assert rc == 2 and not out and len(err.splitlines()) == 1 and "has pid [1]" in err


def test_a_per_op_cost_read_off_a_few_periods_gets_a_note(tmp_path):
    # three top-level ops, one launch each, 18 ms apart: one idle gap sets the median
    from kit.workload.overhead import FEW_PERIODS, calibrate

    ev = []
    for i, ts in enumerate((0.0, 18_000.0, 36_000.0)):
        ev.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1, "ts": ts, "dur": 20.0})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                   "ts": ts + 5, "dur": 5.0})
    p = tmp_path / "few.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    assert FEW_PERIODS > 2
    with pytest.warns(UserWarning, match="read off 2 issue period"):
        oh = calibrate(p)
    assert oh.cpu_op_us == pytest.approx(18_000 - 5)


def test_driver_launches_of_triton_kernels_count(tmp_path):
    """cuLaunchKernelEx (the driver call newer Triton launchers make: a torch.compile trace's
    kernels) is a launch, as cuLaunchKernel is; such a trace had been refused as launching none."""
    events = [_op(20 * i) for i in range(30)] + [
        {**_launch(20 * i + 2, 3), "cat": "cuda_driver", "name": "cuLaunchKernelEx"} for i in range(30)]
    cal = calibrate(_trace(tmp_path, events))
    assert cal.launch_us == 3 and cal.cpu_op_us == pytest.approx(17)
