"""The collectives panel: controls drive kit's predictions; the chart marks the crossover."""
import pytest

from kit.comm import predict_collective
from widgets.collectives import CollectivesPanel


def test_panel_shows_time_and_busbw_curves_with_the_crossover():
    p = CollectivesPanel(system="dgx-a100", collective="allreduce", ranks=8, size_bytes=2**30)
    rows = p.chart_data()
    curve = [r for r in rows if "algorithm" in r]
    assert 50 < len(curve) < 5000
    assert curve[0]["size_bytes"] == 1024 and curve[-1]["size_bytes"] == pytest.approx(2**33)
    ref = predict_collective("allreduce", 2**30, "dgx-a100", ranks=8)
    cross = [r for r in rows if "label" in r]
    assert cross and cross[0]["size_bytes"] == pytest.approx(ref.crossover_bytes)
    here = [r for r in rows if "algorithm" not in r and "label" not in r]
    assert here[0]["time_us"] == pytest.approx(ref.time_ms * 1e3, rel=1e-6)
    assert "ring" in p.summary.value and "bandwidth-bound" in p.summary.value


def test_controls_redraw_and_follow_the_system():
    p = CollectivesPanel(system="a100x4-nvlink", ranks=4)
    assert p.ranks.max == 4
    p.system.value = "dgx-h100-ib-ndr-x4"
    assert p.ranks.max == 32
    p.ranks.value = 16
    p.collective.value = "alltoall"
    ref = predict_collective("alltoall", float(p.size.value), "dgx-h100-ib-ndr-x4", ranks=16)
    assert f"{ref.time_ms * 1e3:.1f} us" in p.summary.value and "2 node(s)" in p.summary.value
    assert p.chart_widget.chart is p.chart
    assert repr(p) == "<collectives panel: alltoall on dgx-h100-ib-ndr-x4, 16 ranks>"
    p.size.value = 2**10
    assert "latency-bound" in p.summary.value
