"""The Binder demo's files agree with the project: CPU torch inside the supported range, the
project itself installed, a Python the project supports, a postBuild that stops on errors, and
a README badge that opens the series index (which exists)."""
from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
BINDER = REPO / "binder"


def requirement_lines() -> list[str]:
    text = (BINDER / "requirements.txt").read_text()
    return [ln.split("#")[0].strip() for ln in text.splitlines() if ln.split("#")[0].strip()]


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_requirements_pin_a_cpu_torch_inside_the_project_range():
    lines = requirement_lines()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    torch = [Requirement(ln) for ln in lines if ln.startswith("torch")]
    assert len(torch) == 1
    (spec,) = torch[0].specifier
    assert spec.operator == "==" and spec.version.endswith("+cpu")
    wanted = next(Requirement(d) for d in project()["dependencies"] if d.startswith("torch"))
    assert wanted.specifier.contains(Version(spec.version)), (spec.version, str(wanted.specifier))


def test_requirements_install_the_project_itself():
    assert "." in requirement_lines() or "-e ." in requirement_lines()


def test_runtime_is_a_python_the_project_supports():
    m = re.fullmatch(r"python-(\d+\.\d+)", (BINDER / "runtime.txt").read_text().strip())
    assert m, "runtime.txt must read python-X.Y"
    assert SpecifierSet(project()["requires-python"]).contains(Version(m.group(1) + ".0"))


def test_post_build_stops_on_errors():
    post = BINDER / "postBuild"
    if not post.exists():
        return  # optional; only needed for extra steps
    lines = post.read_text().splitlines()
    assert lines[0].startswith("#!/bin/bash") or lines[0].startswith("#!/usr/bin/env bash")
    assert any(re.match(r"set -e|set -euo pipefail", ln) for ln in lines), "postBuild needs set -e"
    assert os.access(post, os.X_OK), "postBuild must be executable"


def test_readme_badge_opens_the_series_index():
    readme = (REPO / "README.md").read_text()
    urls = re.findall(r"\(https://mybinder\.org/v2/gh/([^)\s]+)\)", readme)
    assert urls, "README has no Binder badge"
    for url in urls:
        m = re.fullmatch(r"[\w.-]+/[\w.-]+/main\?urlpath=lab/tree/(\S+)", url)
        assert m, url
        assert (REPO / m.group(1)).is_file(), f"badge opens {m.group(1)}, which does not exist"
