"""The embedding panel: an index distribution's skew drives unique rows, L2 hit rate and time.

With "backward" ticked the panel shows TBE's backward kernel alone (kit.embedding.lookup_cost
with backward=True): it sorts the indices and reads and updates each unique row once, so it has
no lookup hit rate; the charts and the summary say so instead of plotting a hit rate of 0."""
from __future__ import annotations

import altair as alt
import ipywidgets as W
import pandas as pd

from kit.embedding import Table, Zipf, lookup_cost
from kit.errors import KitError
from kit.hardware import get_gpu, gpu_keys
from widgets.base import Panel, check_init

ALPHAS = [round(0.1 * i, 1) for i in range(17)]  # 0.0 .. 1.6
ROWS = tuple(10**k for k in range(3, 10))
DIMS = (8, 16, 32, 64, 128, 256, 512)
BATCHES = tuple(2**k for k in range(6, 17))
SERIES = {"hit_rate": "L2 hit rate (fraction of lookups)",  # the legend's words for sweep() columns
          "unique_fraction": "unique rows (fraction of lookups)",
          "time_ms": "kernel time (ms)", "dram_ms": "DRAM traffic time (ms)", "l2_ms": "L2 traffic time (ms)"}


def nvidia_gpus() -> list[str]:
    """The GPUs offered (a user's registered ones too): NVIDIA's."""
    return [g for g in gpu_keys() if get_gpu(g).vendor == "nvidia"]


class EmbeddingPanel(Panel):
    title = "Embedding lookups: skew, L2 hits and time"

    def __init__(self, gpu="a100-sxm4-40gb", rows=10_000_000, dim=128, pooling=30, batch=4096,
                 alpha=1.0, tables=1, backward=False):
        name = "EmbeddingPanel"
        if get_gpu(gpu).vendor != "nvidia":  # the lookup model's L2 and launch figures are NVIDIA's
            raise KitError(f"{name}: gpu {get_gpu(gpu).key!r} is not offered; the panel offers the "
                           f"NVIDIA GPUs: {', '.join(nvidia_gpus())}")
        self._init = dict(gpu=get_gpu(gpu).key, rows=check_init(name, "rows", rows, ROWS),
                          dim=check_init(name, "dim", dim, DIMS),
                          pooling=check_init(name, "pooling", pooling, lo=1, hi=200),
                          batch=check_init(name, "batch", batch, BATCHES),
                          alpha=check_init(name, "alpha", alpha, lo=0.0, hi=1.6, whole=False),
                          tables=check_init(name, "tables", tables, lo=1, hi=32), backward=bool(check_init(name, "backward", backward, (False, True))))
        super().__init__()

    def controls(self):
        i, s = self._init, {"description_width": "initial"}
        self.gpu = W.Dropdown(options=nvidia_gpus(),
                              value=i["gpu"], description="GPU")
        self.alpha = W.FloatSlider(value=i["alpha"], min=0.0, max=1.6, step=0.1, description="Zipf α",
                                   continuous_update=False, style=s)
        self.rows = W.Dropdown(options=list(ROWS), value=i["rows"], description="rows E")
        self.dim = W.Dropdown(options=list(DIMS), value=i["dim"], description="dim D")
        self.pooling = W.IntSlider(value=i["pooling"], min=1, max=200, description="pooling L",
                                   continuous_update=False, style=s)
        self.batch = W.Dropdown(options=list(BATCHES), value=i["batch"], description="batch")
        self.tables = W.IntSlider(value=i["tables"], min=1, max=32, description="tables at once",
                                  continuous_update=False, style=s)
        self.backward = W.Checkbox(value=i["backward"], description="backward kernel (row-wise Adagrad)")
        return [self.gpu, self.alpha, self.rows, self.dim, self.pooling, self.batch, self.tables, self.backward]

    def table(self, alpha: float) -> Table:
        return Table(rows=self.rows.value, dim=self.dim.value, pooling=self.pooling.value,
                     distribution=Zipf(alpha))

    def cost(self, alpha: float):
        t = self.table(alpha)
        return lookup_cost([t] * self.tables.value, self.batch.value, self.gpu.value,
                           backward=self.backward.value, optimizer="rowwise_adagrad")

    def sweep(self) -> pd.DataFrame:
        rows = []
        for a in ALPHAS:
            r = self.cost(a)
            p = r.parts
            rows.append({"alpha": a, "hit_rate": p["hit_rate"], "time_ms": r.time_ms,
                         "unique_fraction": p["unique_rows"] / p["lookups"],
                         "dram_ms": p["dram_ms"], "l2_ms": p["l2_ms"]})
        return pd.DataFrame(rows)

    def make_chart(self):
        df = self.sweep()
        now = pd.DataFrame([{"alpha": self.alpha.value}])
        rule = alt.Chart(now).mark_rule(color="black", strokeDash=[4, 3]).encode(x="alpha:Q")
        backward = self.backward.value
        rates = df.melt(id_vars="alpha", value_vars=["unique_fraction"] if backward else
                        ["hit_rate", "unique_fraction"], var_name="what")
        rates["series"] = rates["what"].map(SERIES)
        left = (alt.Chart(rates).mark_line(point=True).encode(
            x=alt.X("alpha:Q", title="Zipf α"), y=alt.Y("value:Q", title="fraction of lookups"),
            color=alt.Color("series:N", title=None, sort=list(SERIES.values()))) + rule).properties(
            width=300, height=220, title="unique rows (backward: each read and updated once)"
            if backward else "L2 hit rate and unique rows")
        parts = df.melt(id_vars="alpha", value_vars=["time_ms", "dram_ms", "l2_ms"], var_name="part")
        parts["series"] = parts["part"].map(SERIES)
        right = (alt.Chart(parts).mark_line(point=True).encode(
            x=alt.X("alpha:Q", title="Zipf α"), y=alt.Y("value:Q", title="ms"),
            color=alt.Color("series:N", title=None, sort=list(SERIES.values()))) + rule).properties(
            width=300, height=220,
            title=f"{'backward' if backward else 'forward'} kernel time: DRAM vs L2")
        return alt.hconcat(left, right).resolve_scale(color="independent")

    def summary_text(self) -> str:
        r = self.cost(self.alpha.value)
        p = r.parts
        reuse = ("backward kernel: sorts them, reads and updates each unique row once"
                 if self.backward.value else f"L2 hit rate {100 * p['hit_rate']:.1f}%")
        held = self.table(self.alpha.value).bytes * self.tables.value
        gpu = get_gpu(self.gpu.value)
        fit = ("" if held <= gpu.usable_memory_bytes else
               f" · the tables hold {held / 2**30:,.0f} GiB, more than {gpu.key}'s {gpu.memory_text()}: "
               "shard them over GPUs (notebook 07)")
        return (f"{p['lookups']:,.0f} lookups touch {p['unique_rows']:,.0f} unique rows; {reuse} · "
                f"DRAM {p['dram_bytes'] / 1e6:.1f} MB in {p['dram_ms']:.4f} ms, "
                f"L2 {p['l2_bytes'] / 1e6:.1f} MB in {p['l2_ms']:.4f} ms · {p['bound']}-bound · "
                f"{r.time_ms:.4f} ms{fit}")
