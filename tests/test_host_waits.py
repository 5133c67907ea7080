"""Host waits inside a pass (kit.workload.host_wait) are priced as generate's stop check is: the
CPU issues nothing more until the GPU has run every kernel before them. Where HF 5.25 makes them
in a decode step: a full StaticSlidingWindowLayer's torch.tensor([-1], device=...) each step
(cache_utils.py:578; a blocking host-to-device copy). Not OPT's step under generate (below)."""
import numpy as np
import pytest

from kit.workload import zoo
from kit.workload.host_wait import H2D_COPY, HOST_READ
from kit.workload.iteration import CUDA_GRAPH, CpuOverhead, iteration, waited_timeline

MISTRAL = {"model_type": "mistral", "hidden_size": 32, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 48,
           "vocab_size": 50, "sliding_window": 8}
OPT = {"model_type": "opt", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
       "ffn_dim": 64, "vocab_size": 50, "max_position_embeddings": 64}


def _step(cfg, context, cache="static"):
    return zoo.graph_for(cfg, 2, context, "decode", "bf16", kv_cache=cache, disk=False)


def _waits(g):
    return [(n.aten, n.module) for n in g if n.aten in (H2D_COPY, HOST_READ)]


def test_a_wait_restarts_the_issue_when_the_gpu_drains():
    """Three kernels of 100 us, each issued 10 us after the last; a wait before the third: the
    first two run 0.01-0.21 ms, the host waits until 0.21, issues the third at 0.22, which ends
    at 0.32 (without the wait 0.31)."""
    cpu_us, d = np.full(3, 10.0), np.full(3, 0.1)
    issue, start, end = waited_timeline(cpu_us, d, np.ones(3), 0.0, np.array([False, False, True]))
    assert issue.tolist() == pytest.approx([0.01, 0.02, 0.22])
    assert end.tolist() == pytest.approx([0.11, 0.21, 0.32])
    issue, _, end = waited_timeline(cpu_us, d, np.ones(3), 0.0, np.zeros(3, dtype=bool))
    assert issue.tolist() == pytest.approx([0.01, 0.02, 0.03]) and end[-1] == pytest.approx(0.31)


def test_hf_makes_a_host_copy_in_each_full_sliding_layer_and_no_host_read_in_opts_step():
    full = _step(MISTRAL, 12)  # the window of 8 full: both layers roll
    assert _waits(full) == [(H2D_COPY, "layers.0.self_attn"), (H2D_COPY, "layers.1.self_attn")]
    assert _waits(_step(MISTRAL, 4)) == []  # not yet full: StaticLayer-like writes, no copy
    # OPT's torch.ones(b, past + s) would read a static cache's length on the host, but under
    # generate a static step gets prepare_inputs_for_generation's 4D mask (generation/utils.py:
    # 729-760) as its position mask: no ones, no read; a DynamicCache's length is an int
    assert _waits(_step(OPT, 8)) == [] and _waits(_step(OPT, 8, "dynamic")) == []


def test_the_host_waits_at_each_wait_in_a_step():
    """With a fast host the CPU runs ahead of the GPU; at each wait it must not issue the next
    kernel before every kernel before it has ended."""
    fast = CpuOverhead(cpu_op_us=0.1, launch_us=0.1, free_op_us=0.1)
    for cfg, context in ((MISTRAL, 12),):
        g = _step(cfg, context)
        it = iteration(g, "h100-sxm", overhead=fast)
        f = it.timeline  # eager: a row per kernel node, in issue order
        rows = {n.id: i for i, n in enumerate(g.kernels())}
        after, wait_seen = [], False
        for n in g.nodes:
            if n.aten in (H2D_COPY, HOST_READ):
                wait_seen = True
            elif not n.free and wait_seen:
                after.append(rows[n.id])
                wait_seen = False
        assert after
        for i in after:
            assert f["cpu_end_ms"].iloc[i] >= f["gpu_end_ms"].iloc[:i].max() - 1e-12


def test_a_cuda_graphs_replay_has_no_host_wait():
    """A replayed graph has no host work at all (CUDA_GRAPH): the copy and the host read happened
    at capture, so the issue never waits (it had waited for the GPU there)."""
    it = iteration(_step(MISTRAL, 12), "h100-sxm", overhead=CUDA_GRAPH)
    assert float(it.timeline["cpu_end_ms"].max()) == 0.0
