"""The critical path counts as cpu only the host time that held the GPU up.

A pass is built as one host op standing for the whole launch-vs-kernel race, which runs
alongside the GPU's work. The path used to go through it whenever the host ended a hair after
the GPU, so a GPU-bound forward pass was reported as all cpu, and the cpu share moved with the
dtype (fp32's slower kernels: more 'cpu'). Now only the host's lead past the GPU counts."""
import pytest

from kit.parallel.build import HostModel
from kit.parallel.layout import Layout
from kit.parallel.predict import predict_parallel

BIG = "gpt2"  # the captured graph: its first kernels are short, so the host leads a little
TINY = "gpt:layers=2,hidden=256,heads=4,seq=128,vocab=1000"


def run(model, dtype, launch_us=10.0):
    return predict_parallel(model, "dgx-a100", Layout(dp=1, micro_batch=8, dtype=dtype),
                            host=HostModel(launch_us=launch_us))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gpu_bound_pass_is_compute_on_the_path(dtype):
    r = run(BIG, dtype)
    b = r["breakdown"]
    assert b["total_ms"] == pytest.approx(r["iteration_ms"])
    kernels_launch_ms = sum(c["fwd_ms"] for c in r["per_microbatch_ms"])  # GPU time of the passes
    assert b["compute"] > 0.9 * r["iteration_ms"]
    assert b["cpu"] < 0.02 * kernels_launch_ms  # the host ran alongside, not in the way


def test_cpu_share_does_not_follow_the_dtype():
    fp32, bf16 = run(BIG, "fp32"), run(BIG, "bf16")
    assert fp32["iteration_ms"] > 1.5 * bf16["iteration_ms"]  # the kernels do differ
    assert fp32["breakdown"]["cpu"] == pytest.approx(bf16["breakdown"]["cpu"], abs=0.05)


def test_launch_bound_pass_is_cpu_on_the_path():
    r = run(TINY, "bf16", launch_us=200.0)
    b = r["breakdown"]
    assert b["cpu"] > 0.9 * r["iteration_ms"] and b["total_ms"] == pytest.approx(r["iteration_ms"])
