"""The embedding collector on the CPU, with tiny sizes: rows, resume, and what it refuses."""
import csv

import numpy as np
import pytest

from kit.cli import main
from kit.embedding import Zipf
from kit.embedding.collect import COLUMNS, collect, grid, load
from kit.errors import KitError


def tiny(**kw):
    args = dict(batch=[16], rows=[500], dim=[8], pooling=[3], distributions=["uniform", "zipf:1.2"])
    args.update(kw)
    return grid(**args)


def test_rows_are_written_with_measured_unique_counts(tmp_path):
    out = tmp_path / "e.csv"
    r = collect(tiny(passes=("forward", "backward")), out, repeats=2, warmup=0)
    assert r["written"] == 4 and not r["failed"]
    df = load(out)
    assert list(df.columns) == COLUMNS and len(df) == 4
    assert set(df["pass"]) == {"forward", "backward"}
    assert (df["latency_ms"] > 0).all() and (df["lookups"] == 48).all()
    # the measured unique count is the sampled stream's own: at most the lookups, and for
    # Zipf(1.2) close to the model's expectation for 48 draws from 500 rows
    z = df[df["distribution"] == "zipf(1.2)"]["unique_rows"].iloc[0]
    assert 1 <= z <= 48
    assert z == pytest.approx(Zipf(1.2).expected_unique(48, 500), abs=8)
    assert (df[df["distribution"] == "uniform"]["unique_rows"] > z).all()


def test_resume_skips_done_rows_and_repairs_a_cut_line(tmp_path):
    out = tmp_path / "e.csv"
    collect(tiny(), out, repeats=1, warmup=0)
    with open(out, "a") as f:
        f.write("torch,cpu,cpu,forw")  # a writer killed mid-line
    with pytest.raises(KitError, match="--resume"):
        collect(tiny(), out, repeats=1, warmup=0)
    r = collect(tiny(rows=[500, 700]), out, repeats=1, warmup=0, resume=True)
    assert r["skipped"] == 2 and r["written"] == 2
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and sorted({x["rows"] for x in rows}) == ["500", "700"]


def test_refusals(tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(KitError, match="not an embedding measurement CSV"):
        collect(tiny(), other, resume=True)
    with pytest.raises(KitError, match="fbgemm"):
        collect(tiny(passes=("backward",), optimizer="rowwise_adagrad"), tmp_path / "x.csv")
    with pytest.raises(KitError, match="device"):
        collect(tiny(), tmp_path / "y.csv", device="tpu")
    try:
        import fbgemm_gpu  # noqa: F401
    except ImportError:
        with pytest.raises(KitError):
            collect(tiny(), tmp_path / "z.csv", backend="fbgemm")


def test_cli(tmp_path, capsys):
    out = tmp_path / "c.csv"
    assert main(["collect-embedding", "--out", str(out), "--rows", "300", "--dim", "4",
                 "--pooling", "2", "--batch", "8", "--dist", "uniform", "--repeats", "1"]) == 0
    assert "1 rows written" in capsys.readouterr().out
    assert main(["collect-embedding", "--out", str(out), "--rows", "x"]) == 2
    assert "whole numbers" in capsys.readouterr().err
    assert main(["collect-embedding", "--out", str(tmp_path / "d.csv"), "--dist", "bogus"]) == 2
