"""The series map (widgets/series.py): the plan, the table read from a folder, the route panel."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from kit.errors import KitError
from widgets.series import SERIES, SeriesPanel, mermaid, notebook_header, path_to, series_table

REPO_NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def write_nb(folder: Path, name: str, first_markdown: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(first_markdown), nbformat.v4.new_code_cell("1 + 1")]
    nbformat.write(nb, folder / name)
    return folder / name


def test_plan_builds_only_on_earlier_notebooks():
    assert list(SERIES) == sorted(SERIES)
    for num, (name, teaches, builds_on, minutes) in SERIES.items():
        assert all(b in SERIES and b < num for b in builds_on), num
        assert name and teaches and 5 <= minutes <= 60


def test_every_notebook_of_the_repo_is_on_the_map():
    for p in sorted(REPO_NOTEBOOKS.glob("*.ipynb")):
        if p.name != "00_index.ipynb":
            assert p.name[:2] in SERIES, f"{p.name}: add its number to widgets/series.py SERIES"


def test_path_to_is_the_prerequisite_closure():
    # by hand from the plan: 06 <- 03, 04; 03 <- 02 <- 01; 04 <- 01
    assert path_to("06") == ["01", "02", "03", "04", "06"]
    assert path_to("07") == ["01", "04", "05", "07"]
    assert path_to("01") == ["01"]
    with pytest.raises(KitError, match="no notebook '99'.*valid: 01"):
        path_to("99")


def test_header_reads_title_and_stated_time(tmp_path):
    p = write_nb(tmp_path, "01_x.ipynb", "# 01 · Tiles\n\n**Time:** about 12 minutes. **Needs:** x")
    assert notebook_header(p) == ("01 · Tiles", 12)
    q = write_nb(tmp_path, "02_y.ipynb", "# Two\n\nno time here")
    assert notebook_header(q) == ("Two", None)
    (tmp_path / "03_bad.ipynb").write_text("{not json")
    with pytest.raises(KitError, match="cannot read notebook .*03_bad.ipynb"):
        notebook_header(tmp_path / "03_bad.ipynb")


@pytest.mark.parametrize("text", ['[1, 2]', '{"cells": [1, "x"]}', '{"cells": 5}',
                                  '{"cells": [{"cell_type": "markdown", "source": 5}]}'])
def test_json_that_is_no_notebook_is_one_error(tmp_path, text):
    # valid JSON, but no notebook: an AttributeError or TypeError had come out of series_table
    (tmp_path / "03_odd.ipynb").write_text(text)
    with pytest.raises(KitError, match="cannot read notebook .*03_odd.ipynb.*not a notebook"):
        series_table(tmp_path)


def test_source_as_a_list_of_lines_is_read(tmp_path):
    (tmp_path / "01_x.ipynb").write_text('{"cells": [{"cell_type": "markdown", "source": '
                                         '["# One\\n", "**Time:** about 9 minutes"]}]}')
    assert notebook_header(tmp_path / "01_x.ipynb") == ("One", 9)


def test_table_mixes_found_planned_and_unknown(tmp_path):
    write_nb(tmp_path, "00_index.ipynb", "# index")
    write_nb(tmp_path, "01_gpu_architecture.ipynb", "# One\n**Time:** about 12 minutes")
    write_nb(tmp_path, "02_renamed.ipynb", "# Two, renamed")
    write_nb(tmp_path, "42_extra.ipynb", "# Extra")
    t = series_table(tmp_path).set_index("number")
    assert list(t.index) == sorted(SERIES) + ["42"]  # 00 is the index itself, not a row
    assert t.loc["01", ["notebook", "minutes", "minutes_from", "status"]].tolist() == [
        "01_gpu_architecture.ipynb", 12, "notebook", "available"]
    assert t.loc["02", ["notebook", "title", "minutes", "minutes_from"]].tolist() == [
        "02_renamed.ipynb", "Two, renamed", SERIES["02"][3], "plan"]
    assert t.loc["05", ["notebook", "status"]].tolist() == ["05_embeddings.ipynb", "planned"]
    assert t.loc["42", "status"] == "not in the map"
    assert t.loc["06", "builds_on"] == "03, 04"


def test_table_of_a_missing_folder_is_a_kit_error(tmp_path):
    with pytest.raises(KitError, match="notebook folder .*nowhere does not exist"):
        series_table(tmp_path / "nowhere")


def test_panel_route_follows_the_dropdown(tmp_path):
    write_nb(tmp_path, "01_gpu_architecture.ipynb", "# One\n**Time:** about 12 minutes")
    panel = SeriesPanel(tmp_path)
    assert panel.target.value == "07"
    roles = {r["number"]: r["role"] for r in panel.chart_data()}
    assert roles == {"01": "read first", "02": "not needed", "03": "not needed", "04": "read first",
                     "05": "read first", "06": "not needed", "07": "target"}
    # 12 (stated by 01) + planned 20 + 20 + 20 for 04, 05, 07
    assert panel.summary.value == "Read 01 → 04 → 05 → 07: about 72 minutes (3 of them still planned)."
    panel.target.value = "03"
    roles = {r["number"]: r["role"] for r in panel.chart_data()}
    assert [n for n, r in sorted(roles.items()) if r != "not needed"] == ["01", "02", "03"]
    assert panel.summary.value.startswith("Read 01 → 02 → 03: about 52 minutes")
    with pytest.raises(KitError):
        SeriesPanel(tmp_path, target="12")


def test_mermaid_draws_every_edge_of_the_plan(tmp_path):
    write_nb(tmp_path, "01_gpu_architecture.ipynb", "# One")
    text = mermaid(series_table(tmp_path))
    edges = {ln.strip() for ln in text.splitlines() if "-->" in ln}
    assert edges == {"n01 --> n02", "n02 --> n03", "n01 --> n04", "n01 --> n05", "n03 --> n06",
                     "n04 --> n06", "n04 --> n07", "n05 --> n07"}
    assert "class n02,n03,n04,n05,n06,n07 planned" in text and text.startswith("```mermaid")
