"""One notebook at a time in a JupyterLab page: run all cells, read errors, check the panels.

`NotebookPage.check(path)` opens a notebook, runs all cells with a fresh kernel, reads error
outputs from the notebook model, and checks the panel DOM contract of widgets/base.py: every
`.kit-panel` has `.kit-panel-controls` with an input and a `.kit-panel-chart` SVG whose marks are
visible, and changing one control redraws the chart. It saves screenshots and returns a
`NotebookReport`, whose `problems()` say in words what is wrong.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from browser_support import LabServer

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # skip_reason() says so; keep this module importable
    PlaywrightTimeout = TimeoutError

# page.evaluate has no timeout of its own: every wait in the page is raced against one.
JS_OPEN = """async ([path, ms]) => {
  const app = window.jupyterapp;
  const race = (p, what) => { let t; return Promise.race([p, new Promise((_, no) => {
    t = setTimeout(() => no(new Error(what)), ms); })]).finally(() => clearTimeout(t)); };
  const w = await race(app.commands.execute('docmanager:open', {path, factory: 'Notebook'}), 'open');
  try {
    await race(w.context.ready.then(() => w.sessionContext.ready), 'kernel start');
  } catch (e) { return {id: w.id, error: String(e)}; }
  app.shell.activateById(w.id);
  return {id: w.id, error: null};
}"""

JS_RUN_ALL = """async (id) => {
  const app = window.jupyterapp;
  app.shell.activateById(id);
  await app.commands.execute('notebook:clear-all-cell-outputs');
  window.__kitRun = null;
  app.commands.execute('notebook:run-all-cells').then(
    ok => { window.__kitRun = {ok: Boolean(ok)}; },
    err => { window.__kitRun = {error: String(err)}; });
}"""

# Done: run-all settled, no prompt shows [*], and the kernel is idle.
JS_RUN_DONE = """(id) => {
  const node = document.getElementById(id);
  if (!window.__kitRun || !node) return false;
  const busy = [...node.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('*'));
  const w = window.jupyterapp.shell.currentWidget;
  const kernel = w && w.sessionContext.session && w.sessionContext.session.kernel;
  return !busy && (!kernel || kernel.status === 'idle');
}"""

JS_BUSY = """(id) => [...document.getElementById(id).querySelectorAll('.jp-Cell')]
  .map((c, i) => [i, c.querySelector('.jp-InputPrompt')])
  .filter(([i, p]) => p && p.textContent.includes('*')).map(([i]) => i)"""

# Errors are read from the notebook model: JupyterLab 4 renders an error output with
# data-mime-type application/vnd.jupyter.stderr, exactly like a warning, so the DOM cannot
# tell them apart. Widgets that fail in the browser leave text instead of a view.
JS_REPORT = """(id) => {
  const w = window.jupyterapp.shell.currentWidget;
  const errors = [], unexecuted = [];
  let panels = 0;
  w.content.widgets.forEach((cell, i) => {
    if (cell.model.type !== 'code') return;
    const source = cell.model.sharedModel.getSource().trim();
    if (source && cell.model.executionCount === null) unexecuted.push(i);
    for (const o of cell.model.outputs.toJSON()) {
      if (o.output_type === 'error')
        errors.push({cell: i, ename: o.ename, evalue: o.evalue,
                     traceback: (o.traceback || []).join('\\n')});
      const data = o.data || {};
      if (data['application/vnd.jupyter.widget-view+json'] &&
          /^<.+ panel>$/.test(String(data['text/plain'] || '')))
        panels += 1;
    }
  });
  document.getElementById(id).querySelectorAll('.jp-OutputArea-output').forEach(e => {
    if (/Error displaying widget|Failed to load model class|Error rendering/.test(e.textContent))
      errors.push({cell: -1, ename: 'WidgetRenderError', evalue: e.textContent.slice(0, 300),
                   traceback: ''});
  });
  return {errors, unexecuted, panels};
}"""

JS_CLOSE = """async (id) => {
  const w = window.jupyterapp.shell.currentWidget;
  if (!w || w.id !== id) return;
  await Promise.race([w.sessionContext.shutdown(), new Promise(ok => setTimeout(ok, 20000))]);
  w.context.model.dirty = false;
  w.dispose();
}"""

# A data mark drawn by vega's SVG renderer: an item inside a `role-mark` group.
MARKS = "svg.marks g.role-mark > *"
CHART_SVG = ".kit-panel-chart svg.marks"
INPUTS = "input, select, textarea, button, [contenteditable='true']"
# Mark groups whose every item has neither fill nor stroke: drawn, but invisible (for example a
# colour field outside a scale's domain, when concatenated charts share one colour scale).
JS_INVISIBLE = r"""svg => {
  const paint = (e, a) => { const v = e.getAttribute(a); return v && v !== 'none' && v !== 'transparent'; };
  const seen = e => e.tagName === 'image' || ((paint(e, 'fill') || paint(e, 'stroke')) && e.getAttribute('opacity') !== '0');
  return [...svg.querySelectorAll('g.role-mark')]
    .filter(g => !/_brush/.test(g.getAttribute('class')) && g.children.length && ![...g.children].some(seen))
    .map(g => g.getAttribute('class').split(/\s+/).filter(c => c && c !== 'role-mark').join(' '));
}"""


@dataclass
class PanelReport:
    index: int
    inputs: int = 0
    marks: int = 0
    invisible: list[str] = field(default_factory=list)  # mark groups that draw nothing visible
    changed: bool = False
    control: str = ""  # which control was changed, and how
    tried: list[str] = field(default_factory=list)
    screenshot: str = ""


@dataclass
class NotebookReport:
    name: str
    run_ok: bool = False
    run_s: float = 0.0
    errors: list[dict] = field(default_factory=list)
    unexecuted: list[int] = field(default_factory=list)
    expected_panels: int = 0
    panels: list[PanelReport] = field(default_factory=list)
    screenshot: str = ""

    def problems(self) -> list[str]:
        """Everything that makes this notebook fail in the browser, in words."""
        out = [f"cell {e['cell']}: {e['ename']}: {e['evalue']}\n{strip_ansi(e['traceback'])[-1500:]}"
               for e in self.errors]
        if not self.run_ok and not self.errors:
            out.append("run-all did not report success")
        if self.unexecuted:
            out.append(f"code cells never ran: {self.unexecuted}")
        if not self.panels:
            out.append("no .kit-panel rendered (every notebook displays its panel)")
        if len(self.panels) < self.expected_panels:
            out.append(f"{self.expected_panels} panels displayed, only {len(self.panels)} rendered")
        for p in self.panels:
            if p.inputs < 1:
                out.append(f"panel {p.index}: .kit-panel-controls has no input")
            if p.marks < 1:
                out.append(f"panel {p.index}: .kit-panel-chart has no SVG with marks")
            elif p.invisible:
                out.append(f"panel {p.index}: marks with no fill or stroke: {p.invisible}")
            if p.marks and not p.changed:
                out.append(f"panel {p.index}: chart did not change after {p.tried or 'no control'}")
        return out


def strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


class NotebookPage:
    """A JupyterLab page that runs notebooks one after another, each with a fresh kernel."""

    def __init__(self, page, server: LabServer, load_timeout_s: float = 120):
        self.page = page
        self.server = server
        page.goto(server.url("lab?reset"))
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell"
                               " && document.querySelector('.jp-LabShell')",
                               timeout=load_timeout_s * 1000)
        page.evaluate("() => window.jupyterapp.started")
        page.evaluate("() => window.jupyterapp.shell.collapseLeft()")

    def check(self, path: str, shot_dir: Path, timeout_s: float = 180,
              change_timeout_s: float = 30) -> NotebookReport:
        page, report = self.page, NotebookReport(name=path)
        t0 = time.monotonic()
        kernel = kernel_name(self.server.root / path)
        if kernel != "python3":
            report.errors.append({"cell": -1, "ename": "Kernelspec", "traceback": "",
                                  "evalue": f"kernelspec.name is {kernel!r}; store 'python3'"})
            return report
        opened = page.evaluate(JS_OPEN, [path, 120_000])
        wid = opened["id"]
        try:
            if opened["error"]:
                report.errors.append({"cell": -1, "ename": "Open", "traceback": "",
                                      "evalue": f"{opened['error']} did not finish in 120 s"})
                return report
            page.evaluate(JS_RUN_ALL, wid)
            try:
                page.wait_for_function(JS_RUN_DONE, arg=wid, timeout=timeout_s * 1000, polling=250)
            except PlaywrightTimeout:
                busy = page.evaluate(JS_BUSY, wid)
                report.errors.append({"cell": busy[0] if busy else -1, "ename": "Timeout",
                                      "evalue": f"not done after {timeout_s:.0f} s; running or "
                                                f"queued cells: {busy}", "traceback": ""})
                return report
            report.run_s = time.monotonic() - t0
            report.run_ok = bool(page.evaluate("() => window.__kitRun").get("ok"))
            state = page.evaluate(JS_REPORT, wid)
            report.errors, report.unexecuted = state["errors"], state["unexecuted"]
            report.expected_panels = state["panels"]
            root = page.locator(f'[id="{wid}"]')
            self._wait_for_panels(root, report.expected_panels, timeout_s=60)
            stem = Path(path).stem
            for i, panel in enumerate(root.locator(".kit-panel").all()):
                report.panels.append(self._check_panel(panel, i, shot_dir / f"{stem}-panel{i}.png",
                                                       change_timeout_s))
            report.screenshot = self._screenshot_notebook(root, shot_dir / f"{stem}.png")
        finally:
            page.evaluate(JS_CLOSE, wid)
        return report

    def _wait_for_panels(self, root, expected: int, timeout_s: float) -> None:
        """Until every displayed panel has a chart with marks (or the time is up)."""
        want = max(expected, 1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            panels = root.locator(".kit-panel")
            if panels.count() >= want and all(p.locator(f".kit-panel-chart {MARKS}").count() > 0
                                              for p in panels.all()):
                return
            time.sleep(0.25)

    def _check_panel(self, panel, index: int, shot: Path, change_timeout_s: float) -> PanelReport:
        rep = PanelReport(index=index)
        controls = panel.locator(".kit-panel-controls")
        rep.inputs = controls.locator(INPUTS).count() if controls.count() else 0
        rep.marks = panel.locator(f".kit-panel-chart {MARKS}").count()
        panel.scroll_into_view_if_needed()
        if rep.inputs and rep.marks:
            svg = panel.locator(CHART_SVG).first
            rep.invisible = svg.evaluate(JS_INVISIBLE)
            for control in controls.first.locator(":scope > *").all():
                before = svg.evaluate("e => e.innerHTML")
                how = change_control(control)
                if how is None:
                    continue
                rep.tried.append(how)
                if wait_for_change(panel, before, change_timeout_s):
                    rep.changed, rep.control = True, how
                    break
        panel.screenshot(path=str(shot))
        rep.screenshot = str(shot)
        return rep

    def _screenshot_notebook(self, root, shot: Path) -> str:
        """The whole notebook in one image: grow the viewport to the notebook's height."""
        page = self.page
        size = page.viewport_size
        height = root.evaluate("""n => Math.max(...[...n.querySelectorAll(
            '.jp-WindowedPanel-outer, .jp-WindowedPanel-inner, .jp-Notebook')].map(e => e.scrollHeight))""")
        page.set_viewport_size({"width": size["width"], "height": min(max(height + 200, 900), 12000)})
        try:
            root.evaluate("""n => n.querySelectorAll('.jp-WindowedPanel-outer, .jp-Notebook')
                             .forEach(e => { e.scrollTop = 0; })""")
            page.wait_for_timeout(500)
            page.screenshot(path=str(shot))
        finally:
            page.set_viewport_size(size)
        return str(shot)


def kernel_name(path: Path) -> str | None:
    try:
        return json.loads(Path(path).read_text())["metadata"]["kernelspec"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def wait_for_change(panel, before: str, timeout_s: float) -> bool:
    """True once the panel's chart SVG differs from `before` and has marks again."""
    deadline = time.monotonic() + timeout_s
    svg = panel.locator(CHART_SVG)
    while time.monotonic() < deadline:
        if svg.count() and panel.locator(f".kit-panel-chart {MARKS}").count():
            if svg.first.evaluate("e => e.innerHTML") != before:
                return True
        time.sleep(0.25)
    return False


def change_control(control) -> str | None:
    """Change one ipywidgets control the way a user would; say how, or None if it has no input."""
    cls = control.get_attribute("class") or ""
    label = (control.locator(".widget-label").first.text_content()
             if control.locator(".widget-label").count() else "").strip()
    name = f"{label or cls.split()[-1]}"
    if control.locator("select").count():
        select = control.locator("select").first
        values = select.evaluate("s => [...s.options].map(o => o.value)")
        current = select.input_value()
        if len(values) < 2:
            return None
        target = values[(values.index(current) + 1) % len(values)] if current in values else values[0]
        select.select_option(target)
        return f"{name}: select {target!r}"
    if control.locator(".noUi-handle").count():
        handle = control.locator(".noUi-handle").first
        at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
        handle.focus()
        handle.press("ArrowLeft" if at_max else "ArrowRight")
        return f"{name}: slider {'left' if at_max else 'right'}"
    buttons = control.locator("button:not(.mod-active)")
    if "widget-toggle-buttons" in cls and buttons.count():
        buttons.first.click()
        return f"{name}: toggle {buttons.first.text_content()!r}"
    radios = control.locator("input[type=radio]:not(:checked)")
    if radios.count():
        radios.first.check()
        return f"{name}: radio"
    box = control.locator("input[type=checkbox]")
    if box.count():
        box.first.click()
        return f"{name}: checkbox"
    number = control.locator("input[type=number]")
    if number.count():
        number.first.focus()
        number.first.press("ArrowUp")
        number.first.press("Enter")
        return f"{name}: number up"
    return None
