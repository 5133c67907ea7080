"""The sharding panel: a plan shown as per-rank bars, against the greedy baselines."""
from __future__ import annotations

import altair as alt
import ipywidgets as W
import pandas as pd

from kit.hardware import get_system
from kit.sharding import as_tables, plan_sharding, synthetic_tables
from kit.sharding.plans import KIND_NAMES as PLAN_KIND_NAMES
from kit.sharding.search_end import search_end
from widgets.base import Panel, check_init

SYSTEMS = ["dgx1-v100", "a100x4-nvlink", "dgx-a100", "dgx-h100", "hgx-h200", "pcie8"]
BATCHES = (64, 128, 256, 512, 1024, 2048, 4096)
KIND_NAMES = {k: f"{v} ({k})" for k, v in PLAN_KIND_NAMES.items()}  # the legend's words


class ShardingPanel(Panel):
    title = "Sharding embedding tables: per-rank load and the all-to-all"

    # budget_s: the search's time budget, which kit.sharding counts in plans (the same inputs show
    # the same plan: a 0.5 s wall-clock budget had shown 20 tables at 0.854 ms, then 0.871 ms on
    # returning to dgx-a100 while the machine was busier), and caps its wall clock at; at 2 s
    # (300,000 plans) 20 tables on dgx-a100 finish (121,688)
    def __init__(self, tables=None, system="dgx-a100", batch=512, n_tables=20, seed=0, budget_s=2.0):
        name = "ShardingPanel"
        if tables is not None:  # a tables CSV or Tables, as kit.api.shard_tables takes (None: synthetic)
            tables = as_tables(tables, f"{name}: tables")
        seed = check_init(name, "seed", seed, lo=0, hi=2**32 - 1)
        self._tables, self._seed, self._budget = tables, seed, budget_s
        self._init = dict(system=get_system(system).key,
                          batch=check_init(name, "batch", batch, BATCHES),
                          n_tables=len(tables) if tables is not None
                          else check_init(name, "n_tables", n_tables, lo=2, hi=60))
        self._result = None
        super().__init__()

    def controls(self):
        i, s = self._init, {"description_width": "initial"}
        names = SYSTEMS if i["system"] in SYSTEMS else [i["system"], *SYSTEMS]
        self.system = W.Dropdown(options=names, value=i["system"], description="system")
        self.batch = W.Dropdown(options=list(BATCHES), value=i["batch"], description="batch/rank")
        self.n_tables = W.IntSlider(value=i["n_tables"], min=min(2, i["n_tables"]),
                                    max=max(60, i["n_tables"]), description="tables",
                                    continuous_update=False, disabled=self._tables is not None, style=s)
        self.plan = W.Dropdown(options=["search", "greedy_size", "greedy_dim_pooling",
                                        "greedy_dim_pooling_log_rows"], value="search", description="show")
        return [self.system, self.batch, self.n_tables, self.plan]

    def result(self) -> dict:
        key = (self.system.value, self.batch.value, self.n_tables.value)
        if self._result is None or self._result[0] != key:
            tables = (self._tables if self._tables is not None
                      else synthetic_tables(self.n_tables.value, seed=self._seed))
            self._result = (key, plan_sharding(tables, self.system.value, batch=self.batch.value,
                                               time_budget_s=self._budget))
        return self._result[1]

    def make_chart(self):
        r = self.result()
        shown = self.plan.value
        shards = pd.DataFrame(r["shards"] if shown == "search" else r["baseline_shards"][shown])
        shards["sharding"] = shards["kind"].map(lambda k: KIND_NAMES.get(k, k))
        ranks = list(range(r["world_size"]))  # every rank, an idle one too
        bars = alt.Chart(shards).mark_bar().encode(
            x=alt.X("rank:O", title="rank", scale=alt.Scale(domain=ranks)),
            y=alt.Y("sum(lookup_ms):Q", title="lookup fwd+bwd (ms)"),
            color=alt.Color("sharding:N", title="sharding", sort=list(KIND_NAMES.values())),
            tooltip=["table", "sharding", "lookup_ms"],
            detail="table:N").properties(width=320, height=240, title=f"plan ({shown}), per rank")
        costs = pd.DataFrame([{"plan": "search", "cost_ms": r["cost_ms"]}]
                             + [{"plan": k, "cost_ms": v} for k, v in r["baselines"].items()
                                if v is not None])  # a baseline with no plan under the cap
        costs["shown"] = costs["plan"] == shown
        comp = alt.Chart(costs).mark_bar().encode(
            y=alt.Y("plan:N", sort=None, title=None), x=alt.X("cost_ms:Q", title="iteration (ms)"),
            color=alt.condition("datum.shown", alt.value("#d62728"), alt.value("#999"))).properties(
            width=260, height=120, title="embedding part of the iteration")
        return alt.hconcat(bars, comp)

    def summary_text(self) -> str:
        r = self.result()
        p = r["parts"]
        searched = (f"{len(r['plan'])} tables on {r['system']}: {r['cost_ms']:.3f} ms, imbalance "
                    f"{r['imbalance']:.3f}; all-to-all in {p['input_alltoall_ms']:.3f} + "
                    f"{p['output_alltoall_ms']:.3f} + {p['grad_alltoall_ms']:.3f} ms; "
                    + (f"{100 * r['improvement_vs_best_baseline']:.1f}% better than {r['best_baseline']}"
                       if r["best_baseline"] else "no baseline found a plan that fits"))
        searched += "; search " + search_end(r, "budget_s")
        shown = self.plan.value
        if shown == "search":
            return searched
        cost = r["baselines"].get(shown)
        what = (f"the chart shows the {shown} baseline, which finds no plan under the memory cap"
                if cost is None else f"the chart shows the {shown} baseline: {cost:.3f} ms")
        return f"{what} · searched plan: {searched}"
