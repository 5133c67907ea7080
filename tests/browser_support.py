"""Drive JupyterLab in headless Chromium: the harness behind tests/test_browser.py.

`LabServer` starts `python -m jupyterlab` on 127.0.0.1 with a throwaway config (no token or
password: test only, xsrf off, windowing off, no news, no autosave) over a temporary copy of a
notebook folder, so the repo is never written to. `launch_browser` opens Chromium (Debian's
/usr/bin/chromium; Playwright cannot download browsers here) and records, then blocks, every
request that leaves 127.0.0.1, so a chart that needs a CDN stays blank and the test says so.
`NotebookPage` opens a notebook, runs all cells, reads errors from the notebook model, and
checks the panel DOM contract of widgets/base.py.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}

# Settings overrides, written as user settings of the temporary server.
LAB_SETTINGS = {
    # Off-screen cells are not in the DOM under the default windowing.
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    # No news, no update checks (both would leave 127.0.0.1).
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    # Outputs of the run must never be saved, even into the temporary copy.
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/extensionmanager-extension/plugin": {"enabled": False},
}
DISABLED_PLUGINS = ["@jupyterlab/apputils-extension:announcements"]


def skip_reason() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is not installed (apt-get install chromium; .ci/run does it)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        return "jupyterlab is not installed (pip install -e '.[dev]')"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def notebooks_in(folder: Path) -> list[Path]:
    """Every notebook of a folder, top level, in series order (checkpoints excluded)."""
    return sorted(p for p in Path(folder).glob("*.ipynb") if not p.name.startswith("."))


def copy_notebooks(src: Path, dst: Path) -> Path:
    """A working copy of a notebook folder, so that nothing the browser does touches the repo."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    return dst


class LabServer:
    """A JupyterLab server whose root is `root` (a temporary folder), config kept in `tmp`."""

    def __init__(self, root: Path, tmp: Path, start_timeout_s: float = 90):
        self.tmp = Path(tmp)
        self.root = Path(root)
        self.port = free_port()
        self.start_timeout_s = start_timeout_s
        self.log_path = self.tmp / "jupyterlab.log"
        self.proc: subprocess.Popen | None = None

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def _write_config(self) -> dict:
        cfg, data, runtime = (self.tmp / d for d in ("config", "data", "runtime"))
        settings, workspaces = self.tmp / "settings", self.tmp / "workspaces"
        for d in (cfg, data, runtime, settings, workspaces, cfg / "labconfig"):
            d.mkdir(parents=True, exist_ok=True)
        server_cfg = {
            "ServerApp": {"ip": "127.0.0.1", "port": self.port, "port_retries": 0,
                          "open_browser": False, "root_dir": str(self.root),
                          "disable_check_xsrf": True, "allow_root": True},
            "IdentityProvider": {"token": ""},  # test only: no auth on a loopback port
            "PasswordIdentityProvider": {"hashed_password": ""},
            "LabApp": {"user_settings_dir": str(settings), "workspaces_dir": str(workspaces),
                       "expose_app_in_browser": True,  # window.jupyterapp
                       "news_url": None, "extension_manager": "readonly"},
        }
        (cfg / "jupyter_server_config.json").write_text(json.dumps(server_cfg, indent=1))
        page_cfg = {"disabledExtensions": {p: True for p in DISABLED_PLUGINS}}
        (cfg / "labconfig" / "page_config.json").write_text(json.dumps(page_cfg))
        for plugin, values in LAB_SETTINGS.items():
            f = settings / f"{plugin}.jupyterlab-settings"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(values))
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(cfg), JUPYTER_DATA_DIR=str(data),
                   JUPYTER_RUNTIME_DIR=str(runtime), JUPYTER_PLATFORM_DIRS="1",
                   IPYTHONDIR=str(self.tmp / "ipython"), PYDEVD_DISABLE_FILE_VALIDATION="1")
        env.pop("JUPYTER_PATH", None)
        return env

    def start(self) -> "LabServer":
        env = self._write_config()
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser"],
                                     cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyterlab exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url("api/status"), timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"jupyterlab did not answer /api/status in {self.start_timeout_s} s:\n"
                           f"{self.log()}")

    def log(self, last_chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-last_chars:] if self.log_path.exists() else ""

    def shutdown_kernels(self) -> None:
        """Stop every kernel (one per opened notebook), so they do not pile up in memory."""
        try:
            with urllib.request.urlopen(self.url("api/sessions"), timeout=5) as r:
                sessions = json.load(r)
            for s in sessions:
                req = urllib.request.Request(self.url(f"api/sessions/{s['id']}"), method="DELETE")
                urllib.request.urlopen(req, timeout=10).close()
        except (urllib.error.URLError, OSError):
            pass

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.shutdown_kernels()
        self.proc.terminate()  # jupyter_server shuts its kernels down on SIGTERM
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)  # the group of the server this harness started
            self.proc.wait(timeout=10)


class OffsiteLog:
    """Every request that tried to leave 127.0.0.1 (all are aborted)."""

    def __init__(self):
        self.urls: list[str] = []

    def route(self, route) -> None:
        url = route.request.url
        if urlparse(url).hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            self.urls.append(url)
            route.abort()


def launch_browser(playwright):
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                      headless=True)


def new_context(browser, offsite: OffsiteLog):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.route("**/*", offsite.route)
    return context


# -- one notebook in the page ------------------------------------------------------------------
JS_OPEN = """async (path) => {
  const app = window.jupyterapp;
  const w = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
  await w.context.ready;
  await w.sessionContext.ready;
  app.shell.activateById(w.id);
  return w.id;
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
  await w.sessionContext.shutdown();
  w.context.model.dirty = false;
  w.dispose();
}"""

# A data mark drawn by vega's SVG renderer: an item inside a `role-mark` group.
MARKS = "svg.marks g.role-mark > *"
CHART_SVG = ".kit-panel-chart svg.marks"
INPUTS = "input, select, textarea, button, [contenteditable='true']"
# Mark groups whose every item has neither fill nor stroke: drawn, but invisible (for example a
# colour field outside a scale's domain, when concatenated charts share one colour scale).
JS_INVISIBLE = """svg => {
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
        wid = page.evaluate(JS_OPEN, path)
        try:
            page.evaluate(JS_RUN_ALL, wid)
            page.wait_for_function(JS_RUN_DONE, arg=wid, timeout=timeout_s * 1000, polling=250)
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
