"""`kit data summary` and `kit data fetch` through the CLI: JSON shape, counts, one-line errors."""
import json
import os
from pathlib import Path

import pytest

from kit.cli import main

REPO = Path(__file__).resolve().parents[1]
NEUSIGHT = Path(os.environ.get("KIT_DATA", REPO.parent / "shared" / "data" / "neusight"))

HEAD = "OPName,Latency,Device,Kernel Name,B,H"


@pytest.fixture
def layout(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "neusight"
    for op, device, n in (("relu", "Tesla T4", 3), ("relu", "Tesla P4", 2), ("ln", "Tesla T4", 1)):
        f = root / "data/dataset/train/collect" / op / "p2.1.0" / f"{device}.csv"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("\n".join([HEAD] + [f"{op},0.01,{device},k,{i + 1},8" for i in range(n)]) + "\n")
    return root


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_summary_json(layout, capsys):
    code, out, _ = run(capsys, "data", "summary", "--data", str(layout), "--json")
    assert code == 0
    r = json.loads(out)
    assert r["total"] == 6
    assert sorted((x["op"], x["gpu"], x["n"]) for x in r["rows"]) == [
        ("ln", "t4", 1), ("relu", "p4", 2), ("relu", "t4", 3)]


def test_summary_text_and_file(layout, capsys):
    code, out, _ = run(capsys, "data", "summary", "--data", str(layout))
    assert code == 0 and "6 rows" in out and "relu" in out
    f = layout / "data/dataset/train/collect/relu/p2.1.0/Tesla T4.csv"
    code, out, _ = run(capsys, "data", "summary", "--file", str(f), "--json")
    assert code == 0 and json.loads(out)["total"] == 3


def test_summary_errors_are_one_line(tmp_path, capsys):
    code, _, err = run(capsys, "data", "summary", "--data", str(tmp_path / "nope"))
    assert code == 2 and err.count("\n") == 1 and "NeuSight data not found" in err
    code, _, err = run(capsys, "data", "summary", "--part", "bogus")
    assert code == 2 and "invalid choice" in err
    code, _, err = run(capsys, "data")
    assert code == 2 and "choose an action" in err


def test_fetch_reports_a_network_failure_cleanly(tmp_path, capsys, monkeypatch):
    from kit.data import fetch

    def offline(url):
        raise OSError("network is unreachable")

    monkeypatch.setattr(fetch, "_urlopen", offline)
    code, _, err = run(capsys, "data", "fetch", "neusight", "--dest", str(tmp_path / "d"))
    assert code == 2 and "could not download" in err and "KIT_DATA" in err


@pytest.mark.skipif(not (NEUSIGHT / "data" / "dataset").is_dir(), reason="NeuSight shared data not present")
def test_summary_of_the_shared_data(capsys):
    code, out, _ = run(capsys, "data", "summary", "--data", str(NEUSIGHT), "--part", "train-collect", "--json")
    r = json.loads(out)
    assert code == 0 and r["total"] == 256509 == sum(x["n"] for x in r["rows"])
    conv = sum(x["n"] for x in r["rows"] if x["op"] == "conv")
    assert conv > 0  # conv rows count in the total
    code, out, _ = run(capsys, "data", "summary", "--data", str(NEUSIGHT), "--part", "labels", "--json")
    assert code == 0 and json.loads(out)["total"] == len(list((NEUSIGHT / "label").glob("*/*.json")))
