"""How long nbval takes over the notebook series; prints JSON.

Runs `pytest --nbval-lax --nbval-current-env` once over every notebook in notebooks/ (the same
command as `make test`), reads each cell's time from pytest's JUnit XML, and reports the seconds
per notebook (kernel start included in its first cell), the whole run's wall time, and whether it
fits the budgets: the series under 600 s in CI, each notebook under 60 s.

    .venv/bin/python benchmarks/nbval_time.py [--budget-s 600] [--notebook-budget-s 60] [NB ...]

Exits 1 when a cell fails or a budget is exceeded, so it can gate a CI step.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def per_notebook(junit_xml: Path) -> dict[str, dict]:
    """Seconds, cells and failures per notebook from pytest's JUnit report (one case per cell)."""
    out: dict[str, dict] = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        name = Path(case.get("file") or case.get("classname", "").replace(".", "/")).name
        if not name.endswith(".ipynb"):
            name = case.get("classname", "").split(".")[-1] + ".ipynb"
        row = out.setdefault(name, {"seconds": 0.0, "cells": 0, "failed": 0, "skipped": 0})
        row["seconds"] += float(case.get("time", 0))
        row["cells"] += 1
        row["failed"] += sum(1 for c in case if c.tag in ("failure", "error"))
        row["skipped"] += sum(1 for c in case if c.tag == "skipped")
    return {k: {**v, "seconds": round(v["seconds"], 2)} for k, v in sorted(out.items())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", help="notebooks to time (default: notebooks/*.ipynb)")
    ap.add_argument("--budget-s", type=float, default=600, help="the whole series (CI: 10 min)")
    ap.add_argument("--notebook-budget-s", type=float, default=60, help="one notebook")
    args = ap.parse_args(argv)
    notebooks = [Path(p) for p in args.notebooks] or sorted((REPO / "notebooks").glob("*.ipynb"))
    if not notebooks:
        print(json.dumps({"error": "no notebooks found"}))
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "nbval.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
               "--nbval-current-env", f"--junitxml={junit}", "-o", "junit_family=xunit1",
               *map(str, notebooks)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall_s = time.perf_counter() - t0
        rows = per_notebook(junit) if junit.exists() else {}
    slow = [k for k, v in rows.items() if v["seconds"] > args.notebook_budget_s]
    failed = sum(v["failed"] for v in rows.values())
    result = {
        "notebooks": rows,
        "total_wall_s": round(wall_s, 1),
        "sum_of_cells_s": round(sum(v["seconds"] for v in rows.values()), 1),
        "budget_s": args.budget_s,
        "notebook_budget_s": args.notebook_budget_s,
        "within_budget": wall_s <= args.budget_s and not slow,
        "over_notebook_budget": slow,
        "failed_cells": failed,
        "pytest_exit": proc.returncode,
        "cpus": os.cpu_count(),
    }
    if proc.returncode not in (0, 1) or not rows:
        result["pytest_tail"] = (proc.stdout + proc.stderr)[-2000:]
    print(json.dumps(result, indent=1))
    return 0 if proc.returncode == 0 and result["within_budget"] else 1


if __name__ == "__main__":
    sys.exit(main())
