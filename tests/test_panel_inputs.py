"""Panel constructors and labels (an audit): predicted times that break a log axis, numpy
integers from a pandas row, a truthy string for a checkbox, None for a GPU list, and a chart
for a GPU without measurements that must say roofline, not measured."""
import json

import numpy as np
import pandas as pd
import pytest

from kit.errors import KitError


def _rows(pred):
    return pd.DataFrame({"gpu": ["l4"] * 3, "op": ["linear", "add", "softmax"],
                         "op_class": ["gemm", "elementwise", "softmax"], "measured_ms": [1.0, 2.0, 0.5],
                         "predicted_ms": pred, "p10_ms": [.9, 1.7, .3], "p90_ms": [1.2, 2.2, .6],
                         "ape": [10., 5., 20.], "tile": ["128x128"] * 3})


@pytest.mark.parametrize("pred", [[0.0, 1.9, 0.4], [np.inf, 1.9, 0.4], ["a", "b", "c"]])
def test_tile_panel_refuses_predicted_times_its_log_axis_cannot_draw(pred):
    from widgets.tile_predictor import TilePredictorPanel

    with pytest.raises(KitError, match="every predicted_ms must be a finite number > 0"):
        TilePredictorPanel(rows=_rows(pred))
    p = TilePredictorPanel(rows=_rows([1.1, 1.9, 0.4]))
    json.dumps(p.chart_widget.spec, allow_nan=False)


def test_tile_panel_without_measurements_says_roofline():
    from widgets.tile_predictor import TilePredictorPanel

    p = TilePredictorPanel(gpus=["h200"])
    spec = p.chart.to_dict()
    assert spec["title"] == "h200: predicted vs roofline"
    tips = json.dumps(spec["layer"][1]["encoding"]["tooltip"])
    assert "roofline_ms" in tips and '"ape"' not in tips
    assert {r["op_name"] for r in p.chart_data() if "op_name" in r} == {"square matmul"}


def test_panels_take_numpy_integers_and_refuse_what_is_no_choice():
    from widgets.embeddings import EmbeddingPanel
    from widgets.gemm import GemmPanel
    from widgets.tile_predictor import TilePredictorPanel

    assert GemmPanel(m=np.int64(4096)).m.value == 4096  # "whole number ..., got np.int64(4096)"
    assert GemmPanel(compare=None).compare == ()
    with pytest.raises(KitError, match="backward 'no' is not one of its choices"):
        EmbeddingPanel(backward="no")  # had switched the backward kernel on
    with pytest.raises(KitError, match="gpus must be a GPU name or a list"):
        TilePredictorPanel(gpus=None)


def test_embedding_panel_speaks_of_gib_on_both_sides():
    from widgets.embeddings import EmbeddingPanel

    text = EmbeddingPanel(gpu="b200", rows=10**9, dim=512, tables=32).summary_text()
    assert "GiB, more than b200's" in text and " GB," not in text


def test_panels_take_numpy_bools_and_any_list_of_gpus():
    from widgets.embeddings import EmbeddingPanel
    from widgets.tile_predictor import TilePredictorPanel

    assert EmbeddingPanel(backward=np.True_).backward.value is True
    assert TilePredictorPanel(gpus=np.array(["h200", "mi210"])).gpus == ["h200", "mi210"]
    assert TilePredictorPanel(gpus=pd.Series(["h200"])).gpus == ["h200"]
