"""Shared pytest hooks. One so far: after a run, list the browser test's screenshots."""
from browser_support import SCREENSHOTS


def pytest_terminal_summary(terminalreporter, config):
    shots = config.stash.get(SCREENSHOTS, [])
    if shots:
        terminalreporter.section("browser screenshots (notebook: image)")
        for name, path in shots:
            terminalreporter.write_line(f"{name}: {path}")
