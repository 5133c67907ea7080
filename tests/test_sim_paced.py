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
    fwd_ms = sum(c["fwd_ms"] for c in r["per_microbatch_ms"])  # the forward passes' GPU time
    assert b["compute"] > 0.9 * r["iteration_ms"]
    assert b["cpu"] < 0.02 * fwd_ms  # the host ran alongside, not in the way


def test_cpu_share_does_not_follow_the_dtype():
    fp32, bf16 = run(BIG, "fp32"), run(BIG, "bf16")
    assert fp32["iteration_ms"] > 1.5 * bf16["iteration_ms"]  # the kernels do differ
    assert fp32["breakdown"]["cpu"] == pytest.approx(bf16["breakdown"]["cpu"], abs=0.05)


def test_launch_bound_pass_is_cpu_on_the_path():
    r = run(TINY, "bf16", launch_us=200.0)
    b = r["breakdown"]
    assert b["cpu"] > 0.9 * r["iteration_ms"] and b["total_ms"] == pytest.approx(r["iteration_ms"])


def test_the_host_runs_ahead_into_the_backward():
    """The host issues the backward while the GPU still runs the forward (it used to wait for
    the forward's kernels, so the first backward launches were exposed)."""
    r = predict_parallel("gpt2", "dgx-a100", Layout(dp=1, micro_batch=8, dtype="fp32"), keep=True)
    tl = r["_result"].timeline()
    cpu = tl[tl.stream == "cpu"]
    gpu = tl[tl.stream == "compute"]
    fwd_gpu_end = gpu[gpu.name == "F0"].end_ms.max()
    first_bwd_launch_end = cpu[cpu.name.str.startswith("B0")].end_ms.min()
    assert first_bwd_launch_end < 0.5 * fwd_gpu_end
    # the launch race is its own lane, never on the host thread
    assert (tl.stream == "launch race").any() and not cpu.name.str.endswith("launch race").any()


def test_a_profile_fitted_on_the_analytic_layer_costs_zoo_models_there():
    from kit.parallel.profiles import get_profile, profiles

    fitted = [n for n, p in profiles().items() if p.get("kernels") == "analytic GPT layer"]
    assert fitted  # the shipped megatron profiles say what they were fitted on
    lay = Layout(dp=1, micro_batch=1, dtype="fp16")
    on_profile = predict_parallel("gpt2", "dgx-a100", lay, host=get_profile(fitted[0]))
    assert on_profile["kernels_from"].startswith("analytic GPT layer (the host profile")
    default = predict_parallel("gpt2", "dgx-a100", lay)
    assert default["kernels_from"].startswith("captured op graph")
    forced = predict_parallel("gpt2", "dgx-a100", lay, host=get_profile(fitted[0]), graph=True)
    assert forced["kernels_from"].startswith("captured op graph")


def test_a_profile_with_an_unknown_kernel_source_is_one_error():
    from kit.errors import KitError

    with pytest.raises(KitError, match="host profile kernels must be"):
        predict_parallel("gpt2", "dgx-a100", Layout(), host=HostModel(kernels="mine"))
