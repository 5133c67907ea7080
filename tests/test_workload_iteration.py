"""Iteration time: the CPU/GPU timeline, fusion byte counts, phase split, trace export, overhead
calibration. Graphs are built by hand so every expected number is computed independently."""
import json

import numpy as np
import pytest

from kit.errors import KitError
from kit.ops import Elementwise, Gemm
from kit.predict import get_predictor
from kit.workload.fusion import apply_fusion
from kit.workload.graph import Node, OpGraph
from kit.workload.iteration import CpuOverhead, gpu_timeline, iteration, ready_ms
from kit.workload.overhead import calibrate

N = 1 << 20  # elements
GPU = "a100-pcie-40gb"
NONE = CpuOverhead(0.0, 0.0, 0.0)


def _graph():
    g = Gemm(m=1024, n=1024, k=1024)
    e = Elementwise("mul", N, inputs=1)
    nodes = (
        Node(0, "aten.mm.default", g, "gemm", "fwd", (), "h.0", 0, N * 4),
        Node(1, "aten.view.default", None, "free", "fwd", (0,), "h.0", 0, 0, kernels=0),
        Node(2, "aten.mul.Tensor", e, "elementwise", "fwd", (1,), "h.0", 0, N * 4),
        Node(3, "aten.tanh.default", Elementwise("tanh", N), "elementwise", "fwd", (2,), "h.0", 0, N * 4),
        Node(4, "aten.add.Tensor", Elementwise("add", N, inputs=1), "elementwise", "fwd", (3,), "h.0", 0, N * 4),
        Node(5, "aten.mm.default", g, "gemm", "bwd", (4,), "h.0", 0, N * 4),
    )
    return OpGraph(nodes, "toy", {"mode": "train"})


def test_gpu_timeline_by_hand():
    start, end = gpu_timeline(np.array([1.0, 2.0, 10.0]), np.array([5.0, 1.0, 1.0]))
    # kernel 0 waits for its issue at 1; kernel 1 waits for the GPU (6); kernel 2 for the CPU (10)
    assert start.tolist() == [1.0, 6.0, 10.0] and end.tolist() == [6.0, 7.0, 11.0]


def test_a_node_of_many_kernels_starts_after_its_first_launch():
    # issue ends at 1.0 ms; 5 µs launches. One kernel: ready at its issue. Four kernels taking
    # 2 ms: the first was launched three launches (0.015 ms) earlier. Four taking 0.004 ms: the
    # GPU outruns the launches, so the last kernel (0.001 ms) starts after the last launch.
    ready = ready_ms(np.array([1.0, 1.0, 1.0]), np.array([2.0, 2.0, 0.004]),
                     np.array([1.0, 4.0, 4.0]), 5.0)
    assert ready == pytest.approx([1.0, 0.985, 1.0 + 0.001 - 0.004])
    start, end = gpu_timeline(ready, np.array([2.0, 2.0, 0.004]))
    assert end[0] == pytest.approx(3.0)


def test_gpu_bound_total_is_kernel_sum():
    it = iteration(_graph(), GPU, predictor="roofline", overhead=NONE)
    expected = get_predictor("roofline").predict([n.op for n in _graph().kernels()], GPU)["latency_ms"].sum()
    assert it.total_ms == pytest.approx(expected) and it.gpu_idle_ms == pytest.approx(0.0)
    assert sum(it.phases_ms.values()) == pytest.approx(it.total_ms)
    assert it.phases_ms["bwd"] == pytest.approx(it.timeline["latency_ms"].iloc[-1])


def test_cpu_bound_total_is_issue_time():
    slow = CpuOverhead(cpu_op_us=1000.0, launch_us=0.0, free_op_us=0.0)  # 1 ms per op
    it = iteration(_graph(), GPU, predictor="roofline", overhead=slow)
    # 5 kernels issued 1 ms apart; the last (a ~0.1 ms GEMM) finishes just after 5 ms
    assert it.cpu_ms == pytest.approx(5.0)
    assert 5.0 < it.total_ms < 5.0 + it.timeline["latency_ms"].iloc[-1] + 1e-9
    assert it.gpu_idle_ms > 4.0


def test_compiled_fusion_moves_only_external_bytes():
    g = _graph()
    eager = apply_fusion(g, "eager")
    assert [n.op_class for n in eager] == ["gemm", "elementwise", "elementwise", "elementwise", "gemm"]
    comp = apply_fusion(g, "compiled")
    assert [n.op_class for n in comp] == ["gemm", "fused", "gemm"]
    fused = comp[1]
    # reads the mm output once (4N bytes), writes the add output once (4N): 8N,
    # against 3 × 8N in eager mode
    assert fused.op.bytes == pytest.approx(8 * N)
    assert sum(n.op.bytes for n in eager.nodes[1:4]) == pytest.approx(24 * N)
    assert fused.deps == (0,) and comp[2].deps == (1,) and fused.members == (2, 3, 4)
    fast = iteration(g, GPU, predictor="roofline", fusion="compiled", overhead=NONE)
    slow = iteration(g, GPU, predictor="roofline", fusion="eager", overhead=NONE)
    assert fast.total_ms < slow.total_ms
    with pytest.raises(KitError, match="fusion"):
        apply_fusion(g, "jit")


def test_a_top_kernel_group_shows_its_costliest_members_shapes():
    """One group (where, aten, class, phase) may hold kernels of several shapes: a decode step's
    KV-cache cats and the rotary embedding's small cats. It had shown the first member's."""
    small, big = Elementwise("add", 64, inputs=2), Elementwise("add", 2**26, inputs=2)
    nodes = (Node(0, "aten.add.Tensor", small, "elementwise", "fwd", (), "h.0.attn", 0, 256,
                  shapes="[8]x[8]"),
             Node(1, "aten.add.Tensor", big, "elementwise", "fwd", (0,), "h.0.attn", 0, 2**28,
                  shapes="[8192,8192]x[8192,8192]"))
    it = iteration(OpGraph(nodes, "toy", {"mode": "inference"}), GPU, predictor="wave", overhead=NONE)
    top = it.top_kernels()
    assert len(top) == 1 and top.iloc[0]["count"] == 2
    assert top.iloc[0]["shapes"] == "[8192,8192]x[8192,8192]"


def test_a_top_kernel_groups_count_is_its_kernels_not_its_ops():
    """kit predict prints count as "Nx" kernels: a node standing for several launches (a fused
    optimizer's multi_tensor_apply, a layer norm's backward) counts them all; ops keeps the nodes."""
    from dataclasses import replace

    op = Elementwise("add", 2**20, inputs=2)
    nodes = (Node(0, "aten._foreach_mul_.Scalar", op, "elementwise", "fwd", (), "opt", 0, 2**22),
             Node(1, "aten._foreach_mul_.Scalar", op, "elementwise", "fwd", (0,), "opt", 0, 2**22))
    nodes = (replace(nodes[0], kernels=55), replace(nodes[1], kernels=3))
    it = iteration(OpGraph(nodes, "toy", {"mode": "inference"}), GPU, predictor="wave", overhead=NONE)
    top = it.top_kernels().iloc[0]
    assert (top["count"], top["ops"]) == (58, 2) == (it.to_dict()["kernels"], len(nodes))
    # mean_ms stays per node, the mean of the nodes' times (ms / ops, not ms / count)
    assert top["mean_ms"] == pytest.approx(it.timeline["latency_ms"].mean()) == pytest.approx(top["ms"] / 2)


def test_breakdowns_and_trace():
    it = iteration(_graph(), GPU, predictor="wave", overhead=CpuOverhead())
    by = it.by_class()
    assert set(by["op_class"]) == {"gemm", "elementwise"}
    assert by["ms"].sum() == pytest.approx(it.kernel_ms)
    top = it.top_kernels()
    assert top.iloc[0]["aten"] == "mm" and top.iloc[0]["where"] == "h.*"
    trace = json.loads(json.dumps(it.to_trace()))
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kernels) == 5
    assert sum(e["dur"] for e in kernels) == pytest.approx(it.kernel_ms * 1e3, rel=1e-3)
    assert {e["tid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {1, 2}
    d = it.to_dict()
    assert d["kernels"] == 5 and d["band_ms"][0] <= d["total_ms"] <= d["band_ms"][1]


def test_calibrate_from_kineto(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 0, "dur": 30},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 5, "dur": 20},
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": 40, "dur": 10},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10, "dur": 4},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 42, "dur": 6},
    ]
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"traceEvents": events}))
    oh = calibrate(path)
    # top-level ops start at 0 and 40 (addmm is nested in linear): issue period 40 µs; the
    # launches take a median 5 µs -> 35 µs of dispatch + 5 µs of launch per op
    assert oh.launch_us == pytest.approx(5.0) and oh.cpu_op_us == pytest.approx(35.0)
    cases = {"bad.json": ("{not json", "not valid"), "empty.json": ('{"traceEvents": []}', "no cpu_op"),
             "missing.json": (None, "not found")}
    for name, (content, message) in cases.items():
        if content is not None:
            (tmp_path / name).write_text(content)
        with pytest.raises(KitError, match=message):
            calibrate(tmp_path / name)


def test_learned_predictor_floor_is_taken_out_in_the_stream(monkeypatch):
    """A predictor trained on one-at-a-time kernels: every latency = work + a 30 us floor. In the
    stream each kernel keeps its work (twice the roofline here), never less than its roofline."""
    import pandas as pd

    import kit.predict as kp
    from kit.predict.roofline import roofline
    from kit.workload import kernel_times as itm

    floor = 0.03

    class Isolated:
        name = "tile"

        def predict(self, ops, gpu):
            roof = [roofline(op, gpu).time_ms for op in ops]
            lat = [2 * r + floor for r in roof]
            return pd.DataFrame({"latency_ms": lat, "latency_p10_ms": lat, "latency_p90_ms": lat,
                                 "roofline_ms": roof})

    monkeypatch.setitem(kp.PREDICTORS, "tile", Isolated)
    monkeypatch.setattr(itm, "_FLOORS", {})
    g = _graph()
    it = iteration(g, GPU, predictor="tile", overhead=NONE)
    roof = [roofline(n.op, GPU).time_ms for n in g.kernels()]
    probe = roofline(Elementwise("add", itm.FLOOR_PROBE_NUMEL, inputs=2), GPU).time_ms
    measured_floor = probe + floor  # the probe's own work (2x roofline) stays in the floor estimate
    expected = [max(2 * r + floor - measured_floor, r) for r in roof]
    assert it.timeline["latency_ms"].tolist() == pytest.approx(expected)
    assert it.kernel_ms == pytest.approx(sum(expected))


def test_no_kernel_is_shorter_than_the_minimum_in_the_stream():
    from kit.workload.iteration import KERNEL_MIN_US, in_stream_ms

    start = KERNEL_MIN_US / 1e3
    tiny = in_stream_ms(np.array([0.030, 0.0305, 0.001]), np.array([1e-6, 1e-6, 1e-6]), 0.030)
    # an isolated 30 us kernel at the 30 us floor keeps the minimum; one predicted below the
    # minimum keeps its own prediction (the minimum never makes a kernel slower than isolated)
    assert tiny.tolist() == pytest.approx([start + 1e-6, start + 1e-6, 0.001])
    # a node of 4 kernels keeps 4 minimums; it sheds the floors its prediction holds: one
    # prediction of the 4 (a layer norm's backward priced as one copy), one; 4 predictions, 4
    assert in_stream_ms(0.5, 1e-6, 0.03, kernels=4) == pytest.approx(0.5 - 0.03)
    assert in_stream_ms(0.5, 1e-6, 0.03, kernels=4, carried=4) == pytest.approx(0.5 - 0.12)
    assert in_stream_ms(0.121, 1e-6, 0.03, kernels=4, carried=4) == pytest.approx(4 * start + 1e-6)
    # the start adds to the bytes' time: a 5 us roofline whose isolated time the floor swallows
    # takes 7 us, not its bare roofline (the H200's 3-20 us elementwise kernels ran 1.8x theirs)
    assert in_stream_ms(0.031, 0.005, 0.03) == pytest.approx(0.005 + start)
    assert in_stream_ms(0.031, 0.005, 0.03, kernels=2) == pytest.approx(0.005 + 2 * start)


def test_the_minimum_is_what_real_traces_show_for_the_shortest_kernels():
    """PARAM's 8-rank DLRM Kineto trace (V100-SXM2): the elementwise and fill kernels of the
    step, each on a few thousand elements, run at least KERNEL_MIN_US, back to back."""
    import os
    import tarfile
    from pathlib import Path

    from kit.workload.iteration import KERNEL_MIN_US

    shared = Path(os.environ.get("KIT_SHARED", Path(__file__).resolve().parents[2] / "shared"))
    path = shared / "data/traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz"
    if not path.exists():
        pytest.skip("PARAM's DLRM trace not present (set KIT_SHARED)")
    with tarfile.open(path) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".json"))
        events = json.load(tar.extractfile(member))["traceEvents"]
    durs = sorted(e["dur"] for e in events if e.get("cat") == "kernel"
                  and "elementwise_kernel" in e["name"])
    assert len(durs) > 50
    assert durs[0] >= KERNEL_MIN_US and np.median(durs) < 2 * KERNEL_MIN_US


def test_a_cuda_graph_step_has_no_host_cost():
    from kit.workload.iteration import CUDA_GRAPH

    it = iteration(_graph(), GPU, overhead=CUDA_GRAPH)
    assert it.cpu_ms == 0 and it.total_ms == pytest.approx(it.kernel_ms)
    eager = iteration(_graph(), GPU)
    assert eager.kernel_ms == pytest.approx(it.kernel_ms) and eager.total_ms >= it.total_ms
