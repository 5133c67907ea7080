"""Each built notebook is what its builder writes (notebooks/build_*.py): an edit made in the
.ipynb alone is lost at the next rebuild, so it fails here first. 00 and 01 have no builder."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
BUILDERS = sorted(NOTEBOOKS.glob("build_*.py"))


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory):
    out = tmp_path_factory.mktemp("nb")
    for b in BUILDERS:
        shutil.copy(b, out / b.name)
    for b in BUILDERS:
        subprocess.run([sys.executable, b.name], cwd=out, check=True, capture_output=True)
    return out


def test_every_numbered_notebook_but_two_has_a_builder(rebuilt):
    built = {p.name for p in rebuilt.glob("*.ipynb")}
    shipped = {p.name for p in NOTEBOOKS.glob("[0-9]*.ipynb")}
    assert built <= shipped and shipped - built == {"00_index.ipynb", "01_gpu_architecture.ipynb"}


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("[0-9]*.ipynb")
                                        if p.name[:2] not in ("00", "01")))
def test_the_notebook_is_its_builders_output(rebuilt, name):
    shipped = json.loads((NOTEBOOKS / name).read_text())
    built = json.loads((rebuilt / name).read_text())
    for i, (a, b) in enumerate(zip(shipped["cells"], built["cells"])):
        assert a == b, f"{name} cell {i} differs from its builder's; edit the builder and rebuild"
    assert len(shipped["cells"]) == len(built["cells"]) and shipped == built


# an L2 size in prose or a printed line: "48 MiB of L2", "48 MB L2", "L2: 48 MB"
L2_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s?(MB|MiB|KB|KiB)\b(?:\s+of)?\s+L2"
                     r"|L2:?\s+(?:of\s+)?(\d+(?:\.\d+)?)\s?(MB|MiB|KB|KiB)\b")


def test_every_l2_size_a_notebook_names_is_a_catalog_size_in_its_binary_unit(rebuilt):
    # the catalog's l2_cache_mib is binary (L4: 48 MiB, 50.3 MB); notebook 02 had called the
    # L4's L2 "48 MB" twice beside "48 MiB" once
    from kit.hardware import list_gpus

    sizes_mib = {g.l2_cache_mib for g in list_gpus()}
    found = []
    for nb in sorted([*rebuilt.glob("*.ipynb"), NOTEBOOKS / "01_gpu_architecture.ipynb"]):
        for cell in json.loads(nb.read_text())["cells"]:
            for m in L2_SIZE.finditer("".join(cell["source"])):
                value, unit = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
                found.append((nb.name, m.group(0)))
                assert unit in ("MiB", "KiB"), f"{nb.name}: {m.group(0)!r}: the catalog's L2 is in MiB"
                assert float(value) / (1024 if unit == "KiB" else 1) in sizes_mib, (nb.name, m.group(0))
    assert found  # the notebooks do name L2 sizes: the pattern still finds them
