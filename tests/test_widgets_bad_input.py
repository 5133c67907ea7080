"""Panels answer a choice the kit cannot give with its message, in place of the old answer
(an audit drove ~18,000 panel states; these are what it found)."""
import math

import pandas as pd
import pytest

from kit.embedding import Table
from kit.errors import KitError
from widgets.embeddings import EmbeddingPanel
from widgets.gemm import GemmPanel
from widgets.sharding import ShardingPanel
from widgets.tile_predictor import TilePredictorPanel
from widgets.whole_model import WholeModelPanel

HUGE = [Table(rows=10**9, dim=128, pooling=10), Table(rows=10**4, dim=64, pooling=5)]


def test_a_system_without_a_plan_shows_why_not_the_old_plan():
    p = ShardingPanel(tables=HUGE, system="hgx-h200")
    before = p.chart_data()
    assert p.n_tables.value == 2 and "2 tables on hgx-h200" in p.summary.value
    p.system.value = "dgx1-v100"  # 477 GiB table, 32 GiB GPUs: no plan fits
    assert "cannot show this choice" in p.summary.value and "no plan fits" in p.summary.value
    assert p.chart_data() != before and "no plan fits" in p.chart_data()[0]["msg"]
    p.system.value = "hgx-h200"  # and it recovers
    assert "2 tables on hgx-h200" in p.summary.value and p.chart_data() == before


def test_message_in_the_summary_is_escaped():
    p = ShardingPanel(tables=HUGE, system="hgx-h200")

    def fail():
        raise KitError("a < b & c")
    p.make_chart = fail
    p.refresh()
    assert "a &lt; b &amp; c" in p.summary.value


@pytest.mark.parametrize("make, match", [
    (lambda: ShardingPanel(tables=[]), "non-empty list"),
    (lambda: ShardingPanel(tables=[{"rows": 10}]), "non-empty list"),
    (lambda: ShardingPanel(seed="x"), "seed must be a whole number"),
    (lambda: EmbeddingPanel(gpu="mi250"), "offers the NVIDIA GPUs"),
    (lambda: WholeModelPanel(model="gpt2", seq="128"), "seq must be a whole number"),
])
def test_bad_constructor_arguments_are_one_kit_error(make, match):
    with pytest.raises(KitError, match=match):
        make()


def test_sharding_reads_a_tables_csv(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("name,rows,dim,pooling\na,100000,64,10\nb,2000000,128,20\nc,500,32,1\n")
    p = ShardingPanel(tables=str(f), system="dgx-a100")
    assert p.n_tables.value == 3 and "3 tables on dgx-a100" in p.summary.value


def test_a_model_without_a_sequence_takes_seq_none():
    p = WholeModelPanel(model="dlrm", seq=None)
    assert "per step" in p.summary.value


def test_one_gpu_name_where_a_list_is_expected():
    assert GemmPanel(compare="h100-sxm").compare == ("h100-sxm",)
    rows = pd.DataFrame({"gpu": ["l4"] * 2, "op": ["linear"] * 2, "op_class": ["gemm"] * 2,
                         "measured_ms": [1.0, 2.0], "predicted_ms": [1.1, 1.9],
                         "p10_ms": [0.9, 1.7], "p90_ms": [1.2, 2.2], "ape": [10.0, 5.0],
                         "tile": ["128x128"] * 2})
    p = TilePredictorPanel(rows=rows)
    p.op_class.value = "softmax"  # no rows of it: a message, not a log scale over NaN
    assert p.summary.value == "no rows for this choice"
    spec = p.chart.to_dict()
    assert "no softmax rows of l4" in str(spec) and "nan" not in str(spec).lower()
    assert not any(isinstance(v, float) and math.isnan(v) for v in pd.json_normalize(spec).iloc[0])


def test_an_unexpected_error_replaces_the_old_answer_and_is_raised(monkeypatch):
    """A bug in the kit (any exception but a KitError) had left the previous chart and summary
    under the new controls, its traceback only in JupyterLab's log console: the panel now says
    the choice failed, and the exception still propagates (to the log, and to the tests)."""
    p = GemmPanel()
    assert p.chart_data()
    monkeypatch.setattr(p, "make_chart", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        p.refresh()
    assert "failed on this choice" in p.summary.value and "ZeroDivisionError" in p.summary.value
    assert [r["msg"] for r in p.chart_data()] == [
        "the kit failed on this choice (ZeroDivisionError: division by zero)"]


def test_a_chart_altair_refuses_replaces_the_old_answer_and_is_raised(monkeypatch):
    """altair checks a chart's spec when the chart widget takes it (to_dict), after make_chart:
    a malformed chart had raised there, outside the guard, and left the previous chart and
    summary in place."""
    import altair as alt

    p = GemmPanel()
    before = p.summary.value
    bad = alt.Chart(pd.DataFrame({"a": [1.0]})).mark_bar().encode(x=alt.X("a:Q", bin="yes"))
    monkeypatch.setattr(p, "make_chart", lambda: bad)
    with pytest.raises(Exception) as raised:
        p.refresh()
    assert not isinstance(raised.value, KitError)
    assert p.summary.value != before and "failed on this choice" in p.summary.value
    assert "failed on this choice" in str(p.chart_widget.spec) and p.chart is not bad


def test_a_bug_in_the_whole_model_panels_narrowing_replaces_the_old_answer(monkeypatch):
    """WholeModelPanel.refresh narrows the modes, seqs and dtypes before Panel.refresh's guard:
    an exception there had left the previous answer under the new GPU. A setter sees it raised."""
    p = WholeModelPanel(model="gpt2", gpu="a100-pcie-40gb", mode="inference", batch=1, seq=32)
    assert "failed" not in p.summary.value

    def broken(gpu):
        raise RuntimeError(f"no dtypes for {gpu}")

    monkeypatch.setattr(p, "_dtypes", broken)
    with pytest.raises(RuntimeError):
        p.gpu.value = "t4"
    assert "a bug to report: RuntimeError: no dtypes for t4" in p.summary.value
    assert [r["msg"] for r in p.chart_data()] == ["the kit failed on this choice (RuntimeError: no dtypes for t4)"]
