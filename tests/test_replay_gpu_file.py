"""`kit replay --on GPU --gpu-file FILE`: a GPU of the user's own as the target (or as the GPU the
trace was recorded on), as kit op, predict, compare, evaluate and validate take one."""
import json

import pytest

from kit.cli import main
from kit.hardware import get_gpu, unregister_gpu
from kit.hardware.catalog import _builtin_entries
from kit.trace.transfer import KERNEL_FLOOR_MS
from tests.test_trace import rank_trace, write


def _kit(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def gpu_file(tmp_path):
    # an H100 with half its FP32 peak and memory bandwidth: a GPU the catalog does not hold
    h = _builtin_entries()["h100-sxm"]
    entry = {**h, "key": "replay-h100-half", "name": "Replay H100 Half", "aliases": [],
             "fp32_tflops": h["fp32_tflops"] / 2, "mem_bw_gbs": h["mem_bw_gbs"] / 2}
    p = tmp_path / "gpu.json"
    p.write_text(json.dumps(entry))
    yield p
    unregister_gpu("replay-h100-half")


def _sgemm_ms(out):
    r = json.loads(out)
    return r, r["ranks"][0]["predicted_ms"]


def test_replay_on_a_gpu_of_a_gpu_file(tmp_path, capsys, gpu_file):
    p = write(tmp_path, "r0.json", rank_trace(0, work=1000))
    rc, out, err = _kit(capsys, "replay", str(p), "--on", "replay-h100-half")
    assert rc == 2 and err.count("\n") == 1 and "--gpu-file" in err  # the error says how to add it
    rc, out, err = _kit(capsys, "replay", str(p), "--on", "replay-h100-half", "--gpu-file", str(gpu_file), "--json")
    assert rc == 0, err
    r, half = _sgemm_ms(out)
    assert r["on"] == "replay-h100-half"
    rc, out, err = _kit(capsys, "replay", str(p), "--on", "h100-sxm", "--json")
    _, full = _sgemm_ms(out)
    # the 1 ms V100 sgemm runs at half the H100's FP32 peak: it takes twice the time it takes there
    v, h = get_gpu("v100-sxm2-32gb"), get_gpu("h100-sxm")
    f = KERNEL_FLOOR_MS  # the kernel's first 2 us stay on both: kit.trace.transfer.above_floor_ms
    gemm_h = (1.0 - f) * v.fp32_tflops / h.fp32_tflops
    assert half - full == pytest.approx(gemm_h, rel=1e-6)


def test_a_trace_recorded_on_a_gpu_of_a_gpu_file(tmp_path, capsys, gpu_file):
    p = write(tmp_path, "r0.json", rank_trace(0, work=1000, gpu="Replay H100 Half"))
    rc, out, err = _kit(capsys, "replay", str(p), "--on", "h100-sxm")
    assert rc == 2 and "--gpu-file" in err
    rc, out, err = _kit(capsys, "replay", str(p), "--on", "h100-sxm", "--gpu-file", str(gpu_file), "--json")
    assert rc == 0, err
    assert json.loads(out)["ranks"][0]["predicted_ms"] < 1.0  # twice the FP32 peak: the sgemm halves


def test_gpu_file_without_on_and_bad_files_are_one_line(tmp_path, capsys, gpu_file):
    p = write(tmp_path, "r0.json", rank_trace(0))
    for argv, word in [(["--gpu-file", str(gpu_file)], "--gpu-file goes with --on"),
                       (["--on", "h100-sxm", "--gpu-file", str(tmp_path / "none.json")], "none.json"),
                       (["--on", "h100-sxm", "--gpu-file", ""], "--gpu-file"),
                       (["--on", "h100-sxm", "--gpu-file", str(gpu_file), "--trace", str(gpu_file)],
                        "input file")]:
        rc, out, err = _kit(capsys, "replay", str(p), *argv)
        assert rc == 2 and err.count("\n") == 1 and word in err, (argv, err)
    assert json.loads(gpu_file.read_text())["key"] == "replay-h100-half"  # not overwritten
