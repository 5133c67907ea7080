"""Each built notebook is what its builder writes (notebooks/build_*.py): an edit made in the
.ipynb alone is lost at the next rebuild, so it fails here first. 00 and 01 have no builder."""
import json
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
