"""A replayed rank's steps tile its run: on a GPU too slow for the host's pace, the GPU's lag
behind the host counts once, in the step where it arises, not again in every step after it."""
import json

import pytest

from kit.trace import replay
from tests.test_replay_audit import ev


def loop(n_steps, host_us=100, kernel_us=60):
    """n_steps of host_us, each launching one kernel_us sgemm that ends inside its step; no sync."""
    evs = []
    for i in range(n_steps):
        s = i * host_us
        evs += [ev(f"ProfilerStep#{i + 1}", s, host_us, "cpu_op"),
                ev("cudaLaunchKernel", s + 10, 5, "cuda_runtime", correlation=i + 1),
                ev("volta_sgemm_128x64_nn", s + 20, kernel_us, "kernel", tid=7, correlation=i + 1,
                   stream=7)]
    return {"deviceProperties": [{"name": "NVIDIA A100-SXM4-40GB"}], "traceEvents": evs}


def run(tmp_path, n_steps, on):
    p = tmp_path / f"loop{n_steps}.json"
    p.write_text(json.dumps(loop(n_steps)))
    return replay(p, on=on)


@pytest.mark.parametrize("n_steps", [2, 4, 8])
def test_a_gpu_bound_loops_steps_sum_to_its_run(tmp_path, n_steps):
    # on a P4 the 60 us sgemm takes 213 us, the host's step 100 us: the kernels queue up. Each
    # step had counted all the lag before it (1, 2, 4, 8 steps: 0.233, 0.292, 0.409, 0.645 ms)
    r = run(tmp_path, n_steps, "p4")
    res = r.result
    last_gpu_end = max(float(res.end_ms[op]) for op, *_ in r.tg.gpu_ops[0])
    first_start = float(res.end_ms[r.tg.markers[0][0][0]])
    assert r.ranks[0]["predicted_ms"] * n_steps == pytest.approx(last_gpu_end - first_start)
    # and a step is no shorter than the GPU's work in it, once the queue is full
    kernel_ms = [float(r.tg.graph.dur_ms[op]) for op, *_ in r.tg.gpu_ops[0]]
    assert r.ranks[0]["predicted_ms"] >= min(kernel_ms) - 1e-12


def test_the_mean_step_does_not_grow_with_the_number_of_steps(tmp_path):
    means = [run(tmp_path, n, "p4").ranks[0]["predicted_ms"] for n in (1, 2, 4, 8)]
    assert all(b <= a + 1e-12 for a, b in zip(means, means[1:])), means


@pytest.mark.parametrize("on", [None, "a100-sxm4-40gb", "h100-sxm"])
def test_a_host_bound_loop_keeps_the_hosts_step(tmp_path, on):
    # on its own GPU (measured or --on it) and on a faster one, the host sets the pace
    r = run(tmp_path, 4, on)
    assert r.ranks[0]["predicted_ms"] == pytest.approx(0.100)
