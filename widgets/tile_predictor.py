"""Panel: pick a GPU the tile-MLP never trained on and see predicted against measured latency.

The rows come from kit.predict.evaluate.predict_rows. Without rows given, the panel reads
NeuSight's test set from KIT_DATA when it is there; with no data, or for a GPU the test set does
not cover (H200, MI210...), it plots the prediction for a sweep of the chosen op class against the
roofline (nothing measured to compare with). The summary's statistics cover every selected row;
the chart draws at most MAX_POINTS of them. No model logic lives here.
"""
from __future__ import annotations

import html
from collections.abc import Iterable

import altair as alt
import ipywidgets as W
import numpy as np
import pandas as pd

from widgets.base import Panel, message_chart

HELD_OUT = ("a100-pcie-80gb", "l4")
CLASSES = ("all", "gemm", "elementwise", "softmax", "layernorm")
MAX_POINTS = 3000
# the legend's words for NeuSight's op names (kit/data/schema.py; a trailing "u": a scalar operand)
OP_NAMES = {"matmul": "square matmul", "bmm": "batched matmul", "linear": "linear layer", "conv": "2-D convolution",
            "add": "add", "addu": "add a scalar", "mul": "multiply", "mulu": "multiply by a scalar",
            "div": "divide", "divu": "divide by a scalar", "pow": "power (tensor exponent)",
            "powu": "power (scalar exponent)", "relu": "ReLU", "gelu": "GELU", "tanh": "tanh",
            "softmax": "softmax", "ln": "layer norm", "layernorm": "layer norm"}
ROW_COLUMNS = ("gpu", "op", "op_class", "measured_ms", "predicted_ms", "p10_ms", "p90_ms", "ape", "tile")


def measured_rows(gpus=HELD_OUT, predictor=None) -> pd.DataFrame | None:
    """predict_rows of the tile-MLP on NeuSight's test rows of gpus; None without the data (no
    NeuSight folder found). A folder whose test set cannot be read is its KitError (it had been
    None too, and the panel told a reader whose KIT_DATA was set to set KIT_DATA)."""
    from kit.data import resolve_data_dir
    from kit.errors import KitError
    from kit.predict.evaluate import load_neusight_test, predict_rows

    try:
        root = resolve_data_dir()
    except KitError:
        return None
    test = load_neusight_test(root)
    if predictor is None:
        from kit.predict import get_predictor

        predictor = get_predictor("auto")
    return predict_rows(test[test.gpu.isin(gpus)].reset_index(drop=True), {"tile": predictor})


class TilePredictorPanel(Panel):
    title = "Tile-MLP on a GPU it never saw: predicted vs measured"
    _unread = None  # why NeuSight's test set, found, could not be read

    def __init__(self, rows: pd.DataFrame | None = None, gpus=HELD_OUT):
        from kit.errors import KitError
        from kit.hardware import get_gpu

        if rows is not None:
            if not isinstance(rows, pd.DataFrame):
                raise KitError(f"TilePredictorPanel: rows must be a DataFrame (predict_rows output), "
                               f"got {type(rows).__name__}")
            if rows.empty:
                raise KitError("TilePredictorPanel: the rows given are empty; pass predict_rows "
                               "output with at least one row, or rows=None")
            missing = [c for c in ROW_COLUMNS if c not in rows.columns]
            if missing:
                raise KitError(f"TilePredictorPanel: the rows lack column(s) {', '.join(missing)}; "
                               "pass kit.predict.evaluate.predict_rows output")
            for col in ("measured_ms", "predicted_ms"):  # one log axis: an APE of inf, a domain from 0
                values = pd.to_numeric(rows[col], errors="coerce")
                if not (np.isfinite(values) & (values > 0)).all():
                    raise KitError(f"TilePredictorPanel: every {col} must be a finite number > 0")
            self.rows, self.gpus = rows, sorted(rows.gpu.unique())
        else:  # every GPU asked for is offered; one without measurements shows the roofline sweep
            if gpus is None or not isinstance(gpus, (str, Iterable)):
                raise KitError(f"TilePredictorPanel: gpus must be a GPU name or a list of them, got {gpus!r}")
            gpus = [gpus] if isinstance(gpus, str) else list(gpus)  # one name, or several (a Series too)
            self.gpus = list(dict.fromkeys(get_gpu(g).key for g in gpus))
            if not self.gpus:
                raise KitError("TilePredictorPanel: no GPU given")
            try:
                self.rows = measured_rows(self.gpus)
            except KitError as e:  # the roofline sweep still shows; the summary says why
                self.rows, self._unread = None, str(e)
        super().__init__()

    def controls(self):
        self.gpu = W.Dropdown(options=self.gpus, value=self.gpus[0], description="GPU")
        self.op_class = W.Dropdown(options=CLASSES, value="all", description="ops")
        return [self.gpu, self.op_class]

    def measured(self) -> bool:
        """Whether the chosen GPU has measured rows (else: predictions against the roofline)."""
        return self.rows is not None and bool((self.rows.gpu == self.gpu.value).any())

    def all_selected(self) -> pd.DataFrame:
        """Every row of the chosen GPU and op class (the summary's statistics use them all)."""
        if not self.measured():
            return self._unmeasured()
        rows = self.rows[self.rows.gpu == self.gpu.value]
        if self.op_class.value != "all":
            rows = rows[rows.op_class == self.op_class.value]
        return rows

    def selected(self) -> pd.DataFrame:
        """The rows drawn: all_selected(), evenly thinned to MAX_POINTS (altair's row limit)."""
        rows = self.all_selected()
        if len(rows) > MAX_POINTS:
            rows = rows.iloc[np.linspace(0, len(rows) - 1, MAX_POINTS).astype(int)]
        return rows

    def _unmeasured(self) -> pd.DataFrame:
        """No measurements of this GPU: predictions for a sweep of the chosen op class (square
        GEMMs for "all") against their roofline."""
        from kit.ops import Elementwise, Gemm, LayerNorm, Softmax
        from kit.predict import get_predictor

        sweeps = {"elementwise": ("add", [Elementwise("add", 1 << k) for k in range(12, 29, 2)]),
                  "softmax": ("softmax", [Softmax(4096, 1 << k) for k in range(5, 15)]),
                  "layernorm": ("layernorm", [LayerNorm(4096, 1 << k) for k in range(5, 15)])}
        name, ops = sweeps.get(self.op_class.value,
                               ("matmul", [Gemm(m=s, n=s, k=s) for s in (64, 128, 256, 512, 1024, 2048, 4096)]))
        pred = get_predictor("auto").predict(ops, self.gpu.value)
        return pd.DataFrame({"gpu": self.gpu.value, "op": name, "op_class": ops[0].op_class,
                             "measured_ms": pred.roofline_ms, "predicted_ms": pred.latency_ms,
                             "p10_ms": pred.latency_p10_ms, "p90_ms": pred.latency_p90_ms,
                             "ape": np.nan, "tile": pred.tile})

    def make_chart(self):
        rows = self.selected()
        if rows.empty:  # a log scale over no rows has no domain (NaN), which no browser can draw
            return message_chart(f"no {self.op_class.value} rows of {self.gpu.value}")
        data = rows[["op", "op_class", "measured_ms", "predicted_ms", "p10_ms", "p90_ms",
                     "ape", "tile"]].round(6)
        data["op_name"] = data.op.map(lambda o: OP_NAMES.get(o, o))
        measured = self.measured()
        x_title = "measured ms" if measured else "roofline ms (no measurements)"
        against = "measured_ms" if measured else alt.Tooltip("measured_ms", title="roofline_ms")
        lo = float(min(data.measured_ms.min(), data.predicted_ms.min()))
        hi = float(max(data.measured_ms.max(), data.predicted_ms.max()))
        scale = alt.Scale(type="log", domain=[lo, hi])
        points = alt.Chart(data).mark_circle(size=18, opacity=0.6).encode(
            x=alt.X("measured_ms:Q", scale=scale, title=x_title),
            y=alt.Y("predicted_ms:Q", scale=scale, title="predicted ms (tile-MLP)"),
            color=alt.Color("op_name:N", title="op"),
            tooltip=["op_name", "op", "tile", against, "predicted_ms", "p10_ms", "p90_ms",
                     *(["ape"] if measured else [])])
        diagonal = alt.Chart(pd.DataFrame({"measured_ms": [lo, hi], "predicted_ms": [lo, hi]})
                             ).mark_line(color="gray", strokeDash=[4, 4]).encode(
            x="measured_ms:Q", y="predicted_ms:Q")
        return (diagonal + points).properties(width=420, height=360,
                                               title=f"{self.gpu.value}: predicted vs "
                                                     + ("measured" if measured else "roofline"))

    def summary_text(self) -> str:
        if not self.measured():
            what = "square GEMMs" if self.op_class.value in ("all", "gemm") else self.op_class.value
            where = (f"NeuSight's test set cannot be read: {html.escape(self._unread, quote=False)}" if self._unread
                     else "set KIT_DATA to NeuSight's folder" if self.rows is None
                     else f"NeuSight's test set has none of {self.gpu.value}")
            return f"no measurements found ({where}): prediction vs roofline for a sweep of {what}"
        rows = self.all_selected()
        if rows.empty:
            return "no rows for this choice"
        from kit.predict.evaluate import coverage

        inside = coverage(rows)
        shown = f" (chart shows {MAX_POINTS} of them)" if len(rows) > MAX_POINTS else ""
        return (f"{len(rows)} kernels{shown} · MAPE {rows.ape.mean():.1f}% · median APE "
                f"{rows.ape.median():.1f}% · measured inside the p10–p90 band {100 * inside:.0f}%")
