"""Megatron's column-parallel backward (tensor_parallel/layers.py,
LinearWithGradAccumulationAndAsyncCommunication.backward): the input gradient's all-reduce (with
sequence parallelism its reduce-scatter) runs asynchronously beside the weight-gradient GEMM, and
with sequence parallelism the layer input is all-gathered again beside the data-gradient GEMM.
The kit had every backward TP collective serialised on the compute stream and no re-gather."""
import pandas as pd
import pytest

from kit import ops
from kit.hardware import get_system
from kit.parallel import GPTSpec, HostModel, Layout
from kit.parallel.build import build_iteration
from kit.parallel.costs import AnalyticSource, Coster, Phase
from kit.sim import simulate

SPEC = GPTSpec(layers=4, hidden=1024, heads=16, seq=512, vocab=32000, name="t")
NO_HOST = HostModel(launch_us=0.0, collective_us=0.0, p2p_sync=False)


class GemmMs:
    """Every GEMM `ms`, everything else 0."""

    name = "gemm-ms"

    def __init__(self, ms):
        self.ms = ms

    def predict(self, op_list, gpu):
        return pd.DataFrame({"latency_ms": [self.ms if op.op_class == "gemm" else 0.0 for op in op_list]})


def _column_linears(fwd):
    """The forward's column-parallel linears: the GEMMs whose output width is split over TP."""
    return [op for blk in fwd if blk.comm is None for i, op in enumerate(blk.ops) if i in blk.column]


@pytest.mark.parametrize("sp", [False, True])
def test_the_input_gradient_reduction_runs_beside_the_wgrad_gemm(sp):
    tp, b = 4, 2
    src = AnalyticSource(SPEC, Layout(tp=tp, micro_batch=b, dtype="fp16", sequence_parallel=sp))
    fwd, bwd = src.layer(0)
    cols = _column_linears(fwd)
    assert len(cols) == 2  # QKV and the first MLP GEMM
    act = b * SPEC.seq * SPEC.hidden * 2
    reduce_kind = "reducescatter" if sp else "allreduce"
    seen = []
    for i, blk in enumerate(bwd):
        if blk.comm is None or blk.comm[0] != reduce_kind or not blk.overlap:
            continue
        dgrad, wgrad = bwd[i - 1].ops[-1], bwd[i + 1].ops[0]  # issued after the dgrad, beside the wgrad
        assert isinstance(dgrad, ops.Gemm) and isinstance(wgrad, ops.Gemm)
        assert (dgrad.n, wgrad.k) == (SPEC.hidden, b * SPEC.seq)  # [tok, h] grad input; wgrad over tokens
        assert blk.comm == (reduce_kind, act, "tp")
        seen.append((wgrad.m, wgrad.n))
    # one per column-parallel linear, in backward order, beside that linear's weight gradient
    assert seen == [(op.k, op.n) for op in reversed(cols)]


def test_sequence_parallel_backward_re_gathers_the_layer_input_beside_the_dgrad_gemm():
    tp, b = 4, 2
    act = b * SPEC.seq * SPEC.hidden * 2
    src = AnalyticSource(SPEC, Layout(tp=tp, micro_batch=b, dtype="fp16", sequence_parallel=True))
    fwd, bwd = src.layer(0)
    regather = [i for i, blk in enumerate(bwd) if blk.comm and blk.comm[0] == "allgather" and blk.overlap]
    assert len(regather) == 2
    for i in regather:  # the whole input, gathered beside the dgrad GEMM that does not need it
        assert bwd[i].comm == ("allgather", act, "tp")
        dgrad = bwd[i + 1].ops[0]
        assert isinstance(dgrad, ops.Gemm) and (dgrad.m, dgrad.n) == (b * SPEC.seq, SPEC.hidden)
        assert bwd[i + 2].comm[0] == "reducescatter"
    # the backward moves the forward's TP bytes plus the re-gathers
    fwd_bytes = sum(blk.comm[1] for blk in fwd if blk.comm)
    bwd_bytes = sum(blk.comm[1] for blk in bwd if blk.comm)
    assert bwd_bytes == fwd_bytes + 2 * act
    # and so does the LM head's (parallel_lm_logits runs the same linear)
    head_bwd = [blk.comm for blk in src.head[1] if blk.comm]
    assert head_bwd == [("allgather", act, "tp"), ("reducescatter", act, "tp")]
    plain = AnalyticSource(SPEC, Layout(tp=tp, micro_batch=b, dtype="fp16"))
    assert not any(blk.comm[0] == "allgather" for blk in plain.layer(0)[1] + plain.head[1] if blk.comm)


@pytest.mark.parametrize("gemm_ms", [1e-4, 0.2, 50.0])
def test_an_async_collective_costs_the_compute_stream_only_its_excess_over_the_gemm(gemm_ms):
    lay = Layout(tp=4, micro_batch=2, dtype="fp16")
    system = get_system("dgx-a100")
    coster = Coster(lay, system, GemmMs(gemm_ms), host=NO_HOST, in_stream=False)
    src = AnalyticSource(SPEC, lay)
    _, bwd = src.layer(0)
    coster.predict_ops(op for blk in bwd for op in blk.ops)
    ph = Phase()
    compute = coster.add(ph, bwd, 0)
    c = coster.comm_ms("allreduce", 2 * SPEC.seq * SPEC.hidden * 2, coster.group("tp", 0))
    assert c > 0
    # two all-reduces, each beside a wgrad GEMM of gemm_ms; nothing else is exposed
    assert ph.async_comm_ms == pytest.approx(2 * c)
    assert ph.comm_ms == pytest.approx(2 * max(c - gemm_ms, 0.0))
    # the span of the kernels as the GPU runs them (no host cost): compute + exposed comm
    assert ph.paced_ms() == pytest.approx(compute + ph.comm_ms)


def test_the_async_collective_overlaps_the_backward_gemms_in_the_rank_timeline():
    lay = Layout(tp=4, micro_batch=2, global_batch=4, dtype="fp16", optimizer_step=False)
    g, costs, _ = build_iteration(SPEC, lay, get_system("dgx-a100"), GemmMs(0.5), NO_HOST)
    tl = simulate(g).timeline()
    for mb in (0, 1):
        side = tl[tl.name == f"B{mb} async tp comm"]
        assert len(side) == 1 and side.stream.iloc[0] == "tp comm"
        s = side.iloc[0]
        assert s.end_ms - s.start_ms == pytest.approx(costs[0].bwd.async_comm_ms)
        compute = tl[(tl.name == f"B{mb}") & (tl.stream == "compute")]
        head, tail = compute.iloc[0], compute.iloc[-1]
        # it starts with the pass's kernels and runs beside them (its excess over the GEMMs is
        # the compute stream's wait), ending before the pass's last kernel, which needs it
        assert s.start_ms == pytest.approx(head.start_ms)
        assert s.end_ms <= head.end_ms + 1e-9 and s.end_ms <= tail.start_ms + 1e-9
    # GEMMs of 0.5 ms hide the all-reduces of this shape: the backward has no exposed TP comm
    # (the forward's row-parallel all-reduces stay exposed)
    assert costs[0].bwd.comm_ms == 0 and costs[0].fwd.comm_ms > 0


@pytest.mark.parametrize("sp", [False, True])
def test_the_head_backward_counts_its_exposed_collective_once_when_it_outlasts_the_gemms(sp):
    # dp 2 with overlap: the last micro-batch's backward is bucketed and the LM head's backward
    # is its own op. GEMMs of 1e-4 ms hide nothing of the all-reduce (or SP's re-gather and
    # reduce-scatter), so the head's compute stream runs its kernels and then the whole excess
    lay = Layout(tp=2, dp=2, micro_batch=2, global_batch=4, dtype="fp16", optimizer_step=False,
                 sequence_parallel=sp)
    g, costs, _ = build_iteration(SPEC, lay, get_system("dgx-a100"), GemmMs(1e-4), NO_HOST)
    tl = simulate(g).timeline()
    c, last = costs[0], f"B{lay.micro_batches - 1} head"
    assert c.head_bwd_async_comm_ms > c.head_bwd_ms  # the case: collectives outlast the kernels
    head = tl[(tl.name == last) & (tl.stream == "compute")].iloc[0]
    exposed = tl[(tl.name == last + " tp comm") & (tl.stream == "compute")].iloc[0]
    side = tl[tl.name == last + " async tp comm"].iloc[0]
    assert exposed.end_ms - head.start_ms == pytest.approx(c.head_bwd_ms + c.head_bwd_comm_ms)
    # and what follows on the compute stream still waits for the async collectives
    after = tl[(tl.stream == "compute") & (tl.start_ms >= exposed.end_ms - 1e-12) & (tl.op > exposed.op)]
    assert len(after) and after.start_ms.min() >= side.end_ms - 1e-9
