"""The map of the notebook series, and a panel that plans a route through it.

SERIES is the plan, keyed by the two-digit number of each notebook (so a notebook may be renamed
without breaking the map): its planned name, what it teaches, which earlier notebooks it builds
on, and a planned reading time. `series_table(folder)` reads the notebooks that exist at run time:
their title and the time they state on their first cell ("**Time:** about 15 minutes"), falling
back to the plan. Notebooks not yet written show as planned; a notebook missing from the map is
listed as such, so the index never silently drops one.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import altair as alt
import ipywidgets as W
import pandas as pd

from kit.errors import KitError
from widgets.base import Panel

# number: (planned name, what it teaches, builds on, planned minutes)
SERIES: dict[str, tuple[str, str, tuple[str, ...], int]] = {
    "01": ("gpu_architecture", "SMs, tiles, waves and the roofline", (), 15),
    "02": ("tile_predictor", "a learned per-tile model that carries over to unseen GPUs", ("01",), 20),
    "03": ("whole_models", "whole torch models as op graphs, predicted op by op", ("02",), 20),
    "04": ("collectives", "all-reduce, all-gather and all-to-all on real topologies", ("01",), 20),
    "05": ("embeddings", "embedding lookups priced from their index distribution", ("01",), 20),
    "06": ("multi_gpu", "data, tensor and pipeline parallel training, rank by rank", ("03", "04"), 25),
    "07": ("sharding", "placing embedding tables on GPUs", ("04", "05"), 20),
}
COLUMNS = ["number", "notebook", "title", "teaches", "builds_on", "minutes", "minutes_from", "status"]
TIME_RE = re.compile(r"\*\*Time:?\*\*:?\s*(?:about|~|approx\.?|around)?\s*(\d+)\s*min", re.I)
NOTEBOOK_RE = re.compile(r"^(\d\d)_([A-Za-z0-9_]+)\.ipynb$")


def notebook_header(path: Path) -> tuple[str, int | None]:
    """The first heading of a notebook and the minutes its first markdown cells state, if any."""
    try:
        notebook = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise KitError(f"cannot read notebook {path}: {e}") from None
    # valid JSON but no notebook ([1, 2], cells of numbers, a source of 5) had raised an
    # AttributeError or TypeError from the index's constructor
    cells = notebook.get("cells", []) if isinstance(notebook, dict) else None
    if not isinstance(cells, list) or not all(
            isinstance(c, dict) and isinstance(c.get("source", ""), (str, list)) for c in cells[:3]):
        raise KitError(f"cannot read notebook {path}: it is JSON, but not a notebook's "
                       "(a 'cells' list of cells with text sources)")
    text = "\n".join("".join(map(str, c.get("source", ""))) for c in cells[:3]
                      if c.get("cell_type") == "markdown")
    title = next((ln.lstrip("#").strip() for ln in text.splitlines() if ln.startswith("# ")), Path(path).stem)
    m = TIME_RE.search(text)
    return title, int(m.group(1)) if m else None


def series_table(folder: str | Path) -> pd.DataFrame:
    """One row per notebook of the series (found in `folder`, or still planned), in order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise KitError(f"notebook folder {folder} does not exist")
    found = {}
    for p in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        m = NOTEBOOK_RE.match(p.name)
        if m and m.group(1) != "00":
            found.setdefault(m.group(1), p)
    rows = []
    for num in sorted(set(SERIES) | set(found)):
        name, teaches, builds_on, planned_min = SERIES.get(num, ("", "", (), None))
        row = {"number": num, "teaches": teaches, "builds_on": ", ".join(builds_on)}
        if num in found:
            title, stated = notebook_header(found[num])
            row.update(notebook=found[num].name, title=title,
                       minutes=stated if stated is not None else planned_min,
                       minutes_from="notebook" if stated is not None else "plan",
                       status="available" if num in SERIES else "not in the map")
        else:
            row.update(notebook=f"{num}_{name}.ipynb", title=teaches, minutes=planned_min,
                       minutes_from="plan", status="planned")
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def path_to(target: str) -> list[str]:
    """The notebooks to read, in order, to reach `target` (its number): it and all it builds on."""
    if target not in SERIES:
        raise KitError(f"no notebook {target!r} in the series; valid: {', '.join(SERIES)}")
    need, todo = set(), [target]
    while todo:
        num = todo.pop()
        if num not in need:
            need.add(num)
            todo.extend(SERIES[num][2])
    return sorted(need)


class SeriesPanel(Panel):
    title = "Plan a route through the series"

    def __init__(self, folder: str | Path = ".", target: str | None = None):
        self.table = series_table(folder)
        self._target = target or max(SERIES)
        path_to(self._target)  # validates
        super().__init__()

    def controls(self):
        options = [(f"{num} · {SERIES[num][0]}", num) for num in SERIES]
        self.target = W.Dropdown(options=options, value=self._target, description="I want to reach",
                                 style={"description_width": "initial"})
        return [self.target]

    def route(self) -> pd.DataFrame:
        """The series table with each notebook's role for the chosen target."""
        path = path_to(self.target.value)
        t = self.table[self.table.number.isin(SERIES)].copy()
        t["role"] = ["target" if n == self.target.value else "read first" if n in path else "not needed"
                     for n in t.number]
        t["label"] = t.number + " " + [SERIES[n][0] for n in t.number]
        return t

    def make_chart(self):
        t = self.route()
        return alt.Chart(t).mark_bar().encode(
            y=alt.Y("label:N", sort=list(t.label), title=None),
            x=alt.X("minutes:Q", title="minutes to read and run"),
            color=alt.Color("role:N", scale=alt.Scale(domain=["target", "read first", "not needed"],
                                                      range=["#d62728", "#1f77b4", "#d9d9d9"])),
            opacity=alt.Opacity("status:N", scale=alt.Scale(domain=["available", "planned"],
                                                            range=[1.0, 0.45])),
            tooltip=["notebook", "title", "teaches", "builds_on", "minutes", "status"],
        ).properties(width=360, height=alt.Step(22))

    def summary_text(self) -> str:
        t = self.route()
        on = t[t.role != "not needed"]
        planned = int((on.status == "planned").sum())
        steps = " → ".join(on.number)
        note = f" ({planned} of them still planned)" if planned else ""
        return f"Read {steps}: about {int(on.minutes.sum())} minutes{note}."


def mermaid(table: pd.DataFrame) -> str:
    """The series as a Mermaid graph in a Markdown fence (JupyterLab draws it); planned = dashed."""
    lines = ["```mermaid", "graph LR"]
    for num, (name, _, _, _) in SERIES.items():
        lines.append(f'  n{num}["{num} {name.replace("_", " ")}"]')
    lines += [f"  n{b} --> n{num}" for num, (_, _, builds_on, _) in SERIES.items() for b in builds_on]
    planned = [f"n{n}" for n in table.number[table.status == "planned"] if n in SERIES]
    if planned:
        lines += ["  classDef planned stroke-dasharray: 5 5", f"  class {','.join(planned)} planned"]
    return "\n".join(lines + ["```"])
