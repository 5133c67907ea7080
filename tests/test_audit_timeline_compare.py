"""An audit of the composed iteration (kit compare's cost column)."""
import math

import pytest

from kit.cli.cmd_compare import parse_prices


def test_a_price_of_minus_zero_is_zero():
    # "h100-sxm=-0" passed the 0..1000 check and gave a cost per million tokens of -0.000
    price = parse_prices("h100-sxm=-0")["h100-sxm"]
    assert price == 0 and math.copysign(1.0, price) == 1.0


def _ends_in_views(views: int):
    """mm -> mm, then `views` views of the last output (an inference pass)."""
    from kit.ops import Gemm
    from kit.workload.graph import Node, OpGraph

    g = Gemm(m=256, n=256, k=256)
    nodes = [Node(0, "aten.mm.default", g, "gemm", "fwd", (), "h.0", 0, 256 * 256 * 4),
             Node(1, "aten.mm.default", g, "gemm", "fwd", (0,), "h.0", 0, 256 * 256 * 4)]
    for i in range(views):
        nodes.append(Node(2 + i, "aten.view.default", None, "free", "fwd", (1 + i,), "h.0", 0, 0, kernels=0))
    return OpGraph(tuple(nodes), "toy-views", {"mode": "inference"})


def test_the_trace_spans_the_total_when_view_ops_end_the_pass():
    # the views after the last kernel are CPU time in total_ms (2 x 1 ms + 3 x 0.5 ms), but the
    # trace had no event for them: its span was 2 ms plus the last kernel against a 3.5 ms total
    from kit.workload.iteration import CpuOverhead, iteration

    oh = CpuOverhead(cpu_op_us=1000.0, launch_us=0.0, free_op_us=500.0)
    it = iteration(_ends_in_views(3), "a100-pcie-40gb", predictor="roofline", overhead=oh)
    assert it.total_ms == pytest.approx(3.5)
    spans = [e for e in it.to_trace()["traceEvents"] if e["ph"] == "X"]
    assert max(e["ts"] + e["dur"] for e in spans) / 1e3 == pytest.approx(it.total_ms, abs=1e-6)
    cpu = sorted((e for e in spans if e["tid"] == 1), key=lambda e: e["ts"])
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-9 for a, b in zip(cpu, cpu[1:]))  # no overlap
    assert cpu[-1]["name"] == "3 view op(s) after the last kernel" and cpu[-1]["dur"] == pytest.approx(1500.0)
    plain = iteration(_ends_in_views(0), "a100-pcie-40gb", predictor="roofline", overhead=oh)
    assert len([e for e in plain.to_trace()["traceEvents"] if e["ph"] == "X"]) == 4
