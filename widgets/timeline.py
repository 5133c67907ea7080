"""The timeline panel: a parallel layout drives a Gantt chart per rank and stream of one
simulated training iteration, with the critical path highlighted.

The dtype is bf16 where the system's GPU has it, else fp16 (V100); interleaving rounds the
micro-batches to a multiple of pp; the summary states both. A layout of more GPUs than the
system has shows a message saying which controls to lower.

timeline_chart() draws any kit.sim timeline (a parallel prediction, a replayed trace).
"""
from __future__ import annotations

import html
import re
import warnings

import altair as alt
import ipywidgets as W
import pandas as pd

from kit.hardware import get_system, list_systems
from kit.parallel import GPTSpec, Layout, predict_parallel
from kit.parallel.layout import SCHEDULES
from widgets.base import Panel, check_init, message_chart

KIND_COLORS = {"compute": "#4c78a8", "comm": "#f58518", "memcpy": "#54a24b", "launch": "#b8b8b8",
               "cpu": "#9d755d", "sync": "#e45756", "idle": "#eeeeee"}
MAX_ROWS = 4000
DEGREES = (1, 2, 4, 8)  # the dp, tp and pp choices
CLI_HINT = re.compile(r" \(give [^()]*--nodes \d+ for just those\)")


def timeline_rows(timeline: pd.DataFrame, critical_ops=(), max_rows: int = MAX_ROWS) -> pd.DataFrame:
    """Intervals to draw: zero-length ops dropped; when too many, the critical ones and the longest."""
    t = timeline[timeline.end_ms > timeline.start_ms].copy()
    crit = set(int(o) for o in critical_ops)
    t["critical"] = t.op.isin(crit)
    if len(t) > max_rows:
        t = t.assign(_d=t.end_ms - t.start_ms).sort_values(["critical", "_d"], ascending=False)
        t = t.head(max_rows).drop(columns="_d")
    t["lane"] = "rank " + t["rank"].astype(str) + " · " + t["stream"].astype(str)
    t["dur_ms"] = t.end_ms - t.start_ms
    return t.sort_values(["rank", "stream", "start_ms"])[
        ["lane", "rank", "stream", "name", "kind", "start_ms", "end_ms", "dur_ms", "critical"]]


def timeline_chart(timeline: pd.DataFrame, critical_ops=(), title: str = "", width: int = 720):
    rows = timeline_rows(timeline, critical_ops)
    kinds = [k for k in KIND_COLORS if k in set(rows.kind)]
    lanes = list(dict.fromkeys(rows.lane))
    base = alt.Chart(rows, title=title).encode(
        x=alt.X("start_ms:Q", title="time (ms)"), x2="end_ms:Q",
        y=alt.Y("lane:N", sort=lanes, title=None),
        color=alt.Color("kind:N", scale=alt.Scale(domain=kinds, range=[KIND_COLORS[k] for k in kinds])),
        tooltip=["lane", "name", "kind", alt.Tooltip("start_ms:Q", format=".3f"),
                 alt.Tooltip("dur_ms:Q", format=".3f"), "critical"])
    bars = base.mark_bar(height=10).encode(opacity=alt.condition("datum.critical", alt.value(1.0),
                                                                 alt.value(0.45)))
    path = base.transform_filter("datum.critical").mark_bar(height=3, color="black", yOffset=7)
    return (bars + path).properties(width=width, height=max(60, 16 * len(lanes)))


class TimelinePanel(Panel):
    title = "One training iteration on many GPUs: a Gantt chart per rank and stream"

    def __init__(self, model: GPTSpec | None = None, system="dgx-a100", dp=1, tp=2, pp=4,
                 micro_batches=8, schedule="1f1b"):
        self.model = model or GPTSpec(layers=16, hidden=2048, heads=16, seq=1024, vocab=50257,
                                      name="gpt-1.3b")
        name = "TimelinePanel"
        self._init = dict(system=get_system(system).key,
                          m=check_init(name, "micro_batches", micro_batches, lo=1, hi=32),
                          schedule=check_init(name, "schedule", schedule, SCHEDULES),
                          **{k: check_init(name, k, v, DEGREES) for k, v in (("dp", dp), ("tp", tp), ("pp", pp))})
        self._result, self._notes = None, []
        super().__init__()

    def controls(self):
        i = self._init
        style = {"description_width": "initial"}
        names = list_systems()
        if i["system"] not in names:  # another node count or network of a preset
            names = [i["system"], *names]
        self.system = W.Dropdown(options=names, value=i["system"], description="system")
        self.schedule = W.Dropdown(options=list(SCHEDULES), value=i["schedule"], description="schedule")
        self.pp = W.Dropdown(options=list(DEGREES), value=i["pp"], description="pp")
        self.tp = W.Dropdown(options=list(DEGREES), value=i["tp"], description="tp")
        self.dp = W.Dropdown(options=list(DEGREES), value=i["dp"], description="dp")
        self.m = W.IntSlider(value=i["m"], min=1, max=32, description="micro-batches",
                             continuous_update=False, style=style)
        for w in (self.pp, self.tp, self.dp):
            w.layout = W.Layout(width="130px")
        self._pp_changed()
        self.pp.observe(self._pp_changed, names="value")
        return [self.system, self.schedule, self.pp, self.tp, self.dp, self.m]

    def _pp_changed(self, change=None):
        """One stage (pp 1) has no pipeline schedule: the control is off and says why."""
        one = self.pp.value == 1
        self.schedule.disabled = one
        self.schedule.tooltip = "pp 1: one stage, no pipeline schedule" if one else None

    def dtype(self) -> str:
        """bf16 on a GPU that has it, else fp16 (V100 and older have no bf16)."""
        gpu = get_system(self.system.value).gpu
        return "bf16" if gpu.peak_tflops("bf16") is not None else "fp16"

    def _too_big(self) -> str | None:
        """Why the layout does not fit the system (in the panel's words, not the CLI's), or None."""
        have = get_system(self.system.value).world_size
        dp, tp, pp = self.dp.value, self.tp.value, self.pp.value
        if dp * tp * pp <= have:
            return None
        return (f"layout dp {dp} x tp {tp} x pp {pp} = {dp * tp * pp} GPUs, but {self.system.value} "
                f"has {have}: pick a smaller dp, tp or pp")

    def layout(self) -> Layout:
        pp = self.pp.value
        sched = self.schedule.value if pp > 1 else "1f1b"
        m = self.m.value
        if sched == "interleaved" and m % pp:
            m = max(pp, m - m % pp)
        return Layout(dp=self.dp.value, tp=self.tp.value, pp=pp, micro_batch=1,
                      global_batch=m * self.dp.value, schedule=sched,
                      virtual_stages=2 if sched == "interleaved" else 1, dtype=self.dtype())

    def result(self) -> dict:
        from kit.errors import KitError

        self._result, self._error = None, self._too_big()
        if self._error:
            return None
        # predict_parallel's notes are warnings (a multi-node preset's idle nodes, layers that
        # split unevenly over the stages): in a panel's callback they went to the log console,
        # or once per message to the cell's stderr, and the summary said "8 GPUs" of a 32-GPU
        # system without a word. The summary states them instead (_notes).
        self._notes = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self._result = predict_parallel(self.model, self.system.value, self.layout(), keep=True)
        except KitError as e:
            self._result, self._error = None, str(e)
        else:  # the CLI's remedy (--nodes) is no control here
            self._notes = [CLI_HINT.sub("", str(w.message)) for w in caught]
        return self._result

    def make_chart(self):
        r = self.result()
        if r is None:
            return message_chart(self._error)
        res = r["_result"]
        crit = [s[6] for s in _segments(res, r["breakdown"]["rank"])]
        return timeline_chart(res.timeline(), crit, title=f"{r['iteration_ms']:.1f} ms per iteration")

    def summary_text(self) -> str:
        r = self._result
        if r is None:
            return f"cannot run this layout: {self._error}"
        b = r["breakdown"]
        parts = ", ".join(f"{k} {b[k]:.1f} ms" for k in ("compute", "communication", "cpu") if b[k] > 0)
        lo, hi = r["band_ms"]
        band = f" (p10–p90 {lo:.1f}–{hi:.1f})" if hi > lo else ""
        lay = self.layout()
        m = lay.global_batch // lay.dp
        used = f", {m} micro-batches (interleaved needs a multiple of pp)" if m != self.m.value else ""
        return (f"{r['layout']['world_size']} GPUs, {lay.dtype}{used} · "
                f"iteration {r['iteration_ms']:.1f} ms{band} · "
                f"critical path: {parts} · stage {lay.stage_of(r['rank_breakdown']['rank'])} waits "
                f"{r['rank_breakdown']['wait']:.1f} ms "
                f"(ideal bubble {100 * r['ideal_bubble_fraction']:.0f}% of the iteration) · peak memory "
                f"{max(s['total_gib'] for s in r['memory_per_rank']):.1f} GiB/rank"
                + "".join(f" · note: {html.escape(n, quote=False)}" for n in self._notes))


def _segments(res, rank):
    from kit.sim.critical import path_segments

    return path_segments(res, rank, follow_ranks=True)
