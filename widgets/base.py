"""The shape every panel has, so that tests, notebooks and the browser test treat them alike.

A panel is a small class:
* `controls()` builds the ipywidgets it needs (called once, in __init__);
* `make_chart()` returns an altair chart from the current control values, by calling `kit`;
* every control's `value` is observed and redraws the chart in place (`JupyterChart.chart = ...`).

DOM contract (the browser test relies on it): the root is a VBox with the CSS class `kit-panel`,
its controls sit in a box with class `kit-panel-controls`, the chart is an `alt.JupyterChart`
rendered as SVG inside a box with class `kit-panel-chart`, and a summary line (HTML) has class
`kit-panel-summary`. Charts load their JavaScript offline, from vl-convert, never from a CDN.
No model logic lives in a panel: it only calls kit.
"""
from __future__ import annotations

import html
import numbers

import altair as alt
import ipywidgets as W


def enable_offline_charts() -> None:
    """Serve JupyterChart's JavaScript from vl-convert (offline), cached on disk.

    Bundling it takes seconds in every new kernel; the bundle depends only on the altair and
    vl-convert versions, so it is kept in $KIT_CACHE (or ~/.cache/gpu-perf-kit) after the first
    build. Any problem with the cache falls back to altair's own enable_offline().
    """
    import os
    from pathlib import Path

    cls = alt.JupyterChart
    if getattr(cls, "_is_offline", False):
        return
    try:
        import vl_convert

        cache = Path(os.environ.get("KIT_CACHE") or Path.home() / ".cache" / "gpu-perf-kit")
        path = cache / f"jupyterchart-{alt.__version__}-vlc-{vl_convert.__version__}.js"
        esm = _checked_bundle(path) if path.is_file() else None
        if esm is not None:
            cls._esm, cls._is_offline = esm, True
            return
        cls.enable_offline()
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes((cls._esm + BUNDLE_MARK + _sha256(cls._esm) + "\n").encode("utf-8"))
        tmp.replace(path)
    except (OSError, AttributeError, ImportError):
        cls.enable_offline()


# The cached bundle ends with this line and the sha256 of what precedes it: a file cut short or
# damaged in $KIT_CACHE is rebuilt. Its first check had been a size above 0: a file of invalid
# UTF-8 raised UnicodeDecodeError from every panel's constructor, and a cut one (100 kB of the
# 905 kB bundle) was served to the browser, which then drew no chart at all.
BUNDLE_MARK = "\n// gpu-perf-kit bundle sha256="


def _sha256(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _checked_bundle(path) -> str | None:
    """The cached bundle at path when whole (its closing mark and hash agree), else None."""
    try:
        # bytes, not read_text: its newline translation would turn a \r of the bundle into \n,
        # and every start would then rebuild it (about 11 s)
        text = path.read_bytes().decode("utf-8")
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    esm, mark, digest = text.rpartition(BUNDLE_MARK)
    return esm if mark and esm and digest.strip() == _sha256(esm) else None


def check_init(panel: str, name: str, value, options=None, lo=None, hi=None, whole: bool = True):
    """A constructor argument its control can show: one of `options`, or a (whole) number within
    [lo, hi] (an ipywidgets Dropdown raises a bare TraitError for anything else, a slider clamps
    it without a word). Returns value; anything else is a KitError naming it."""
    from kit.errors import KitError

    if options is not None and value not in list(options):
        raise KitError(f"{panel}: {name} {value!r} is not one of its choices "
                       f"({', '.join(map(str, options))})")
    kinds = numbers.Integral if whole else numbers.Real  # numpy scalars too: a pandas row's values
    if lo is not None and not (isinstance(value, kinds) and not isinstance(value, bool) and lo <= value <= hi):
        raise KitError(f"{panel}: {name} must be a {'whole ' if whole else ''}number from {lo:,} to "
                       f"{hi:,}, got {value!r}")
    return value


class Panel:
    title = "panel"

    def __init__(self):
        enable_offline_charts()
        self._controls = self.controls()
        self.summary = W.HTML()
        self.summary.add_class("kit-panel-summary")
        self.chart = self.make_chart()
        self.chart_widget = alt.JupyterChart(self.chart, embed_options={"renderer": "svg",
                                                                        "actions": False})
        controls = W.HBox(self._controls, layout=W.Layout(flex_flow="row wrap"))
        controls.add_class("kit-panel-controls")
        chart_box = W.Box([self.chart_widget])
        chart_box.add_class("kit-panel-chart")
        self.root = W.VBox([W.HTML(f"<b>{self.title}</b>"), controls, self.summary, chart_box])
        self.root.add_class("kit-panel")
        for c in self._controls:
            if hasattr(c, "value"):
                c.observe(self.refresh, names="value")
        self.summary.value = self.summary_text()

    # -- to override ---------------------------------------------------------------------
    def controls(self) -> list[W.Widget]:
        raise NotImplementedError

    def make_chart(self) -> alt.TopLevelMixin:
        raise NotImplementedError

    def summary_text(self) -> str:
        return ""

    # -- shared --------------------------------------------------------------------------
    def refresh(self, change=None) -> None:
        """Recompute from the controls and redraw in place. A KitError (a choice the kit cannot
        answer: no plan fits, a value out of range) replaces the chart and the summary with its
        message, so the panel never keeps showing the previous answer under the new controls;
        any other exception (a bug) says so there too, and is raised (show_failure)."""
        from kit.errors import KitError

        try:
            chart = self.make_chart()
            text = self.summary_text()
            # altair checks the chart's spec here (to_dict): a malformed chart is a bug as well,
            # and raised out of this assignment it had left the previous chart and summary
            self.chart_widget.chart = chart
        except Exception as e:
            self.show_failure(e)
            if not isinstance(e, KitError):
                raise
            return
        self.chart = chart
        self.summary.value = text

    def show_failure(self, e: Exception) -> None:
        """The chart and summary in place of an answer: a KitError's message, or any other
        exception as a bug to report (the caller raises it: ipywidgets logs an observer's
        exception to the log console, out of the reader's sight, and the panel had kept the
        previous chart and summary under the new controls)."""
        from kit.errors import KitError

        if isinstance(e, KitError):
            chart, text = message_chart(str(e)), f"cannot show this choice: {html.escape(str(e))}"
        else:
            said = f"{type(e).__name__}: {e}"
            chart = message_chart(f"the kit failed on this choice ({said})")
            text = f"the kit failed on this choice, a bug to report: {html.escape(said)}"
        self.chart = self.chart_widget.chart = chart
        self.summary.value = text

    def chart_data(self):
        """The rows the chart shows (tests assert on these, never on pixels)."""
        from widgets.chart_data import chart_rows

        return chart_rows(self.chart)

    def __repr__(self) -> str:
        return f"<{self.title} panel>"

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.root._repr_mimebundle_(**kwargs)
        if isinstance(bundle, tuple):
            data, meta = bundle
        else:
            data, meta = bundle, {}
        data = dict(data)
        data["text/plain"] = repr(self)  # stable for nbval
        return data, meta


def message_chart(text: str):
    """A chart that only says text (in place of one the choice cannot give)."""
    return alt.Chart(alt.Data(values=[{"msg": text}])).mark_text(size=14).encode(text="msg:N")
