"""The collectives panel: a system, a collective, a group size and a message size give the time
and bus-bandwidth curves, with the latency-bound / bandwidth-bound crossover marked."""
from __future__ import annotations

import math

import altair as alt
import ipywidgets as W
import numpy as np

from kit.comm import KINDS, canonical_kind, collective_table, predict_collective
from kit.hardware import get_system, list_systems
from widgets.base import Panel, check_init

SIZES_BYTES = np.logspace(10, 33, 93, base=2.0)  # 1 KiB .. 8 GiB, 4 points per doubling
# axis labels in the summary's binary units (the ticks are powers of 2: "~s" wrote 1.073741824G)
BINARY_LABEL = " : ".join(f"datum.value >= {1024 ** p} ? format(datum.value / {1024 ** p}, '~g') + ' {u}'"
                          for p, u in ((3, "GiB"), (2, "MiB"), (1, "KiB"))) + " : datum.value + ' B'"


class CollectivesPanel(Panel):
    title = "Collectives on a real topology: time and bus bandwidth against message size"

    def __init__(self, system="dgx-h100", collective="allreduce", ranks=None, size_bytes=2**27):
        world = get_system(system).world_size
        ranks = min(world, 8) if ranks is None else ranks  # default: one node's worth
        self._init = dict(system=get_system(system).key, collective=canonical_kind(collective),
                          ranks=check_init("CollectivesPanel", "ranks", ranks, lo=2, hi=world),
                          size=check_init("CollectivesPanel", "size_bytes", size_bytes, lo=2**10, hi=2**33,
                                          whole=False))
        super().__init__()

    def controls(self):
        i = self._init
        style = {"description_width": "initial"}
        names = list_systems()
        if i["system"] not in names:
            names = [i["system"], *names]
        self.system = W.Dropdown(options=names, value=i["system"], description="system", style=style)
        self.collective = W.Dropdown(options=list(KINDS), value=i["collective"], description="collective",
                                     style=style)
        world = get_system(i["system"]).world_size
        self.ranks = W.IntSlider(value=min(i["ranks"], world), min=2, max=world, description="ranks",
                                 continuous_update=False, style=style)
        self.size = W.FloatLogSlider(value=i["size"], base=2, min=10, max=33, step=0.5,
                                     description="size (B)", continuous_update=False, readout_format=".3g",
                                     style=style)
        self.system.observe(self._system_changed, names="value")
        return [self.system, self.collective, self.ranks, self.size]

    def _system_changed(self, change):
        world = get_system(change["new"]).world_size
        with self.ranks.hold_trait_notifications():
            self.ranks.max = world
            self.ranks.value = min(self.ranks.value, world)

    def table(self):
        return collective_table(self.collective.value, SIZES_BYTES, self.system.value, ranks=self.ranks.value)

    def result(self):
        return predict_collective(self.collective.value, float(self.size.value), self.system.value,
                                  ranks=self.ranks.value)

    def make_chart(self):
        t = self.table()
        r = self.result()
        t = t.assign(time_us=t.time_ms * 1e3, size_mib=t.size_bytes / 2**20)
        data = t[["size_bytes", "size_mib", "time_us", "busbw_gbs", "algorithm"]].round(6)
        x = alt.X("size_bytes:Q", scale=alt.Scale(type="log", base=2), title="message size",
                  axis=alt.Axis(labelExpr=BINARY_LABEL))
        marks = _marks(r)
        cross = alt.Chart(alt.Data(values=[marks["crossover"]])).mark_rule(strokeDash=[4, 4], color="gray").encode(
            x="size_bytes:Q", tooltip=["label:N", "size_bytes:Q"])
        label = alt.Chart(alt.Data(values=[marks["crossover"]])).mark_text(
            align="left", dx=4, dy=-6, color="gray").encode(x="size_bytes:Q", y=alt.value(8), text="label:N")

        def panel(field, title, scale_type, chart_title):
            base = alt.Chart(data).mark_line(point=False).encode(
                x=x, y=alt.Y(f"{field}:Q", scale=alt.Scale(type=scale_type), title=title),
                color=alt.Color("algorithm:N", title="algorithm"),
                tooltip=["size_bytes:Q", "time_us:Q", "busbw_gbs:Q", "algorithm:N"])
            here = alt.Chart(alt.Data(values=[marks["here"]])).mark_point(size=80, filled=True, color="black").encode(
                x="size_bytes:Q", y=f"{field}:Q")
            return (base + here + cross + label).properties(width=330, height=240, title=chart_title)

        where = f"{r.kind}, {r.ranks} ranks of {r.system}"
        return alt.hconcat(panel("time_us", "time (us)", "log", f"{where}: time"),
                           panel("busbw_gbs", "busbw (GB/s)", "linear", f"{where}: bus bandwidth"))

    def summary_text(self) -> str:
        r = self.result()
        return (f"{r.kind} of {_human(r.nbytes)} on {r.system} ({r.ranks} ranks, {r.nodes_spanned} node(s)): "
                f"<b>{r.time_ms * 1e3:.1f} us</b> via {r.algorithm}, busbw {r.busbw_gbs:.3g} GB/s "
                f"(plateau {r.plateau_busbw_gbs:.0f}); {r.bound}-bound; crossover at {_human(r.crossover_bytes)}")

    def __repr__(self) -> str:
        return f"<collectives panel: {self.collective.value} on {self.system.value}, {self.ranks.value} ranks>"


def _marks(r) -> dict:
    return {"here": {"size_bytes": r.nbytes, "time_us": round(r.time_ms * 1e3, 6),
                     "busbw_gbs": round(r.busbw_gbs, 6)},
            "crossover": {"size_bytes": r.crossover_bytes,
                          "label": f"latency | bandwidth ({_human(r.crossover_bytes)})"}}


def _human(nbytes: float) -> str:
    if nbytes <= 0:
        return "0 B"
    p = min(int(math.log(nbytes, 1024)), 3)
    return f"{nbytes / 1024 ** p:.3g} {['B', 'KiB', 'MiB', 'GiB'][p]}"
