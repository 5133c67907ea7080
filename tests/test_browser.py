"""Every notebook of the series in a real browser: JupyterLab in headless Chromium.

For each notebook in notebooks/ (globbed, so new ones are covered as they land): open it, run all
cells, and check that no cell has an error output, that every displayed panel renders (controls
with an input, a chart SVG with marks), that changing one control redraws the chart, and that no
request left 127.0.0.1 (the vega JavaScript comes from vl-convert, not a CDN). A screenshot of
each notebook and of each panel is saved under pytest's tmp dir; the path is printed.

`test_harness_*` run the same harness over two throwaway notebooks, one good and one broken, to
show that it passes what works and catches what does not.

Run alone: `pytest -m browser -s tests/test_browser.py`. Skips when /usr/bin/chromium or
playwright is missing. KIT_BROWSER_BUDGET_S (default 480) bounds the whole module's run.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
import pytest

from browser_notebook import NotebookPage
from browser_support import (SCREENSHOTS, LabServer, OffsiteLog, copy_notebooks, launch_browser,
                             new_context, notebooks_in, skip_reason)

pytestmark = pytest.mark.browser

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
SERIES = notebooks_in(NOTEBOOK_DIR)
BUDGET_S = float(os.environ.get("KIT_BROWSER_BUDGET_S", "480"))
NOTEBOOK_TIMEOUT_S = 180  # one notebook's run; each should take < 60 s under nbval


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "root"
    root.mkdir()
    copy_notebooks(NOTEBOOK_DIR, root / "series")
    write_harness_notebooks(root / "harness")
    started = time.monotonic()
    server = LabServer(root, tmp).start()
    offsite = OffsiteLog()
    try:
        with sync_playwright() as pw:
            browser = launch_browser(pw)
            page = new_context(browser, offsite).new_page()
            lab = NotebookPage(page, server)
            lab.offsite, lab.started = offsite, started
            lab.offsite_at_load = list(offsite.urls)
            yield lab
            browser.close()
    finally:
        server.stop()


def run_in_browser(lab, path: str, shot_dir: Path, config, change_timeout_s: float = 30):
    left_s = BUDGET_S - (time.monotonic() - lab.started)
    if left_s < 20:
        pytest.fail(f"the browser test's budget of {BUDGET_S:.0f} s is spent; {path} not run "
                    "(a notebook got slower, each must run in < 60 s, or the machine is busy; "
                    "KIT_BROWSER_BUDGET_S raises the bound)")
    before = len(lab.offsite.urls)
    report = lab.check(path, shot_dir, timeout_s=min(NOTEBOOK_TIMEOUT_S, left_s),
                       change_timeout_s=change_timeout_s)
    offsite = lab.offsite.urls[before:]
    if report.screenshot:
        config.stash.setdefault(SCREENSHOTS, []).append((path, report.screenshot))
    print(f"\n{path}: ran in {report.run_s:.1f} s, {len(report.panels)} panel(s); "
          f"screenshot {report.screenshot}")
    for p in report.panels:
        print(f"  panel {p.index}: {p.inputs} inputs, {p.marks} marks, changed by {p.control!r}; "
              f"{p.screenshot}")
    return report, offsite


@pytest.mark.parametrize("notebook", SERIES, ids=[p.stem for p in SERIES])
def test_notebook_in_browser(lab, notebook, tmp_path, pytestconfig):
    report, offsite = run_in_browser(lab, f"series/{notebook.name}", tmp_path, pytestconfig)
    problems = report.problems()
    assert not problems, (f"{notebook.name} in JupyterLab (screenshot {report.screenshot or 'none'}):\n"
                          + "\n".join(problems))
    assert not offsite, f"{notebook.name} asked for files off 127.0.0.1 (blocked): {offsite}"
    assert Path(report.screenshot).stat().st_size > 10_000


def test_jupyterlab_loads_offline(lab):
    assert lab.offsite_at_load == [], "JupyterLab asked for files off 127.0.0.1 while loading"


def test_series_is_not_empty():
    assert SERIES, f"no notebooks in {NOTEBOOK_DIR}"


# -- the harness, on notebooks it knows the answer for ------------------------------------------
TINY_PANELS = '''
import altair as alt
import ipywidgets as W
import pandas as pd
from widgets.base import Panel


class Bars(Panel):
    title = "bars"

    def controls(self):
        self.n = W.Dropdown(options=[3, 5, 8], value=3, description="n")
        return [W.HTML("no input here"), self.n]

    def make_chart(self):
        df = pd.DataFrame({"x": range(self.n.value), "y": range(1, self.n.value + 1)})
        return alt.Chart(df).mark_bar().encode(x="x:O", y="y:Q")


class Line(Panel):
    title = "line"
    frozen = False  # True: the chart ignores its control (a broken panel)

    def controls(self):
        self.k = W.IntSlider(value=2, min=1, max=5, description="k", continuous_update=False)
        return [self.k]

    def make_chart(self):
        k = 2 if self.frozen else self.k.value
        df = pd.DataFrame({"x": range(10), "y": [k * i * i for i in range(10)]})
        return alt.Chart(df).mark_line().encode(x="x:Q", y="y:Q")


class Ghost(Line):
    """Two charts sharing one colour scale whose domain misses the line's field: lines vanish."""
    title = "ghost"

    def make_chart(self):
        bars = pd.DataFrame({"x": ["a", "b"], "y": [1, self.k.value], "kind": ["p", "q"]})
        line = pd.DataFrame({"x": range(5), "y": [self.k.value * i for i in range(5)], "g": "z"})
        return alt.hconcat(
            alt.Chart(bars).mark_bar().encode(
                x="x:N", y="y:Q", color=alt.Color("kind:N", scale=alt.Scale(domain=["p", "q"],
                                                                            range=["red", "blue"]))),
            alt.Chart(line).mark_line().encode(x="x:Q", y="y:Q", color="g:N"))
'''


def write_harness_notebooks(folder: Path) -> None:
    folder.mkdir(parents=True)

    def write(name, *cells, kernel="python3"):
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
        nb.cells = [nbformat.v4.new_markdown_cell(f"# {name}")]
        nb.cells += [nbformat.v4.new_code_cell(c) for c in cells]
        nbformat.write(nb, folder / name)

    # Good: two panels (dropdown, slider) and a warning on stderr, which is not an error.
    write("good.ipynb", TINY_PANELS, "Bars()", "Line()",
          "import warnings\nwarnings.warn('a warning is not an error')")
    # Bad: a panel whose chart ignores its control, then a cell that raises, then one never run.
    write("bad.ipynb", TINY_PANELS, "Ghost()", "Line.frozen = True\nLine()",
          "raise ValueError('boom from the harness self-test')", "print('never runs')")
    # A kernelspec other than python3 would stop CI with NoSuchKernel (and a dialog here).
    write("julia.ipynb", "1 + 1", kernel="julia-1.10")


def test_harness_passes_a_good_notebook(lab, tmp_path, pytestconfig):
    report, offsite = run_in_browser(lab, "harness/good.ipynb", tmp_path, pytestconfig)
    assert report.problems() == []
    assert [p.marks > 0 and p.changed for p in report.panels] == [True, True]
    assert report.panels[0].control.startswith("n: select")
    assert report.panels[1].control.startswith("k: slider")
    assert offsite == []


def test_harness_catches_a_broken_notebook(lab, tmp_path, pytestconfig):
    report, _ = run_in_browser(lab, "harness/bad.ipynb", tmp_path, pytestconfig, change_timeout_s=8)
    assert [(e["ename"], e["evalue"]) for e in report.errors] == [
        ("ValueError", "boom from the harness self-test")]
    assert report.unexecuted == [5]  # the cell after the error
    ghost, frozen = report.panels
    assert ghost.marks > 0 and ghost.changed and ghost.invisible == ["mark-line concat_1_marks"]
    assert frozen.marks > 0 and not frozen.invisible
    assert not frozen.changed and frozen.tried == ["k: slider right"]
    problems = "\n".join(report.problems())
    assert "ValueError: boom" in problems and "chart did not change" in problems
    assert "marks with no fill or stroke" in problems


def test_harness_refuses_a_kernelspec_other_than_python3(lab, tmp_path, pytestconfig):
    report, _ = run_in_browser(lab, "harness/julia.ipynb", tmp_path, pytestconfig)
    assert [e["ename"] for e in report.errors] == ["Kernelspec"]
    assert "'julia-1.10'; store 'python3'" in report.problems()[0]
