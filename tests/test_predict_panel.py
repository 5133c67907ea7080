"""widgets.tile_predictor: the scatter follows the GPU and op pickers; works with no data."""
import numpy as np
import pandas as pd

from widgets.tile_predictor import TilePredictorPanel


def fake_rows():
    rng = np.random.default_rng(0)
    rows = []
    for gpu, bias in (("a100-pcie-80gb", 1.05), ("l4", 1.5)):
        for op, cls in (("bmm", "gemm"), ("add", "elementwise"), ("ln", "layernorm")):
            measured = 10 ** rng.uniform(-2, 1, 20)
            pred = measured * bias
            rows.append(pd.DataFrame({"predictor": "tile", "gpu": gpu, "op": op, "op_class": cls,
                                      "measured_ms": measured, "predicted_ms": pred,
                                      "p10_ms": pred / 1.2, "p90_ms": pred * 1.2, "tile": "128x64",
                                      "ape": np.abs(pred - measured) / measured * 100}))
    return pd.concat(rows, ignore_index=True)


def test_scatter_follows_gpu_and_op_class():
    p = TilePredictorPanel(rows=fake_rows())
    assert p.gpu.options == ("a100-pcie-80gb", "l4")
    points = [r for r in p.chart_data() if "op" in r]
    assert len(points) == 60 and {r["op"] for r in points} == {"bmm", "add", "ln"}
    assert "MAPE 5.0%" in p.summary.value
    p.gpu.value = "l4"
    assert "MAPE 50.0%" in p.summary.value
    # L4 predictions sit 1.5x above the diagonal in the plotted rows
    pts = [r for r in p.chart_data() if "op" in r]
    assert all(abs(r["predicted_ms"] / r["measured_ms"] - 1.5) < 1e-3 for r in pts)
    p.op_class.value = "layernorm"
    assert {r["op"] for r in p.chart_data() if "op" in r} == {"ln"}
    # the band is 1/1.2 .. 1.2 around the prediction; measured = pred / 1.5 lies outside it
    assert "band 0%" in p.summary.value


def test_panel_without_data_plots_against_the_roofline(monkeypatch):
    import widgets.tile_predictor as tp

    monkeypatch.setattr(tp, "measured_rows", lambda *a, **k: None)
    p = TilePredictorPanel()
    pts = [r for r in p.chart_data() if "op" in r]
    assert len(pts) == 7 and all(r["predicted_ms"] >= r["measured_ms"] for r in pts)
    assert "no measurements" in p.summary.value
