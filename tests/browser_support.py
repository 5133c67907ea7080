"""Drive JupyterLab in headless Chromium: the harness behind tests/test_browser.py.

`LabServer` starts `python -m jupyterlab` on 127.0.0.1 with a throwaway config (no token or
password: test only, xsrf off, windowing off, no news, no autosave) over a temporary copy of a
notebook folder, so the repo is never written to. `launch_browser` opens Chromium (Debian's
/usr/bin/chromium; Playwright cannot download browsers here) and records, then blocks, every
request that leaves 127.0.0.1, so a chart that needs a CDN stays blank and the test says so.
browser_notebook.py runs the notebooks in the page.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
SCREENSHOTS = pytest.StashKey[list]()  # (notebook, png) pairs, listed at the end (conftest.py)

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
