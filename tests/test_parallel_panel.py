"""widgets.timeline: the Gantt panel follows its controls; the chart marks the critical path."""
import pytest

from widgets.timeline import TimelinePanel, timeline_chart, timeline_rows


def test_panel_redraws_when_the_layout_changes():
    p = TimelinePanel(pp=4, tp=1, dp=1, micro_batches=4)
    rows = p.chart_data()
    lanes = {r["lane"] for r in rows}
    assert "rank 0 · compute" in lanes and "rank 3 · recv-fwd" in lanes
    assert len({r["rank"] for r in rows}) == 4  # one representative per stage
    assert any(r["critical"] for r in rows)
    t4 = p._result["iteration_ms"]
    p.m.value = 8
    t8 = p._result["iteration_ms"]
    assert t4 < t8 < 2 * t4  # more micro-batches amortise the same bubble
    p.pp.value = 1
    assert len({r["rank"] for r in p.chart_data()}) == 1
    assert "iteration" in p.summary.value
    lo, hi = p._result["band_ms"]
    assert lo < p._result["iteration_ms"] < hi
    assert f"p10–p90 {lo:.1f}–{hi:.1f}" in p.summary.value


def test_impossible_layout_shows_a_message():
    p = TimelinePanel(system="a100x4-nvlink", pp=4, tp=1)
    p.tp.value = 8
    assert "cannot run" in p.summary.value
    assert p.chart_data()[0]["msg"]


def test_timeline_rows_cap_keeps_critical_ops():
    import pandas as pd

    n = 6000
    t = pd.DataFrame({"rank": 0, "stream": "compute", "name": "k", "kind": "compute",
                      "start_ms": [float(i) for i in range(n)], "end_ms": [i + 0.5 for i in range(n)],
                      "op": range(n)})
    rows = timeline_rows(t, critical_ops=[5999, 0], max_rows=100)
    assert len(rows) == 100 and rows.critical.sum() == 2
    spec = timeline_chart(t.head(50), [0]).to_dict()
    assert spec["layer"][1]["transform"][0]["filter"] == "datum.critical"
