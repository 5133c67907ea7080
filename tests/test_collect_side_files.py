"""`kit collect --out FILE` and `--out FILE.csv` keep the same side files (FILE.meta.json,
FILE.failed.jsonl, FILE.measuring.json: kit.data.records.side_path). Their locks had not been
the same (FILE.lock and FILE.csv.lock), so two runs could write one meta at once, and a fresh run
into one wrote over the meta of the other, which was still there."""
import json

from kit.cli import main
from kit.data.provenance import side_path
from kit.data.records import Lock

ARGV = ["collect", "--device", "cpu", "--ops", "bmm", "--warmup", "0", "--repeats", "1",
        "--shapes", "tiny-gemm:1"]


def _run(capsys, out, *extra):
    rc = main([*ARGV, "--out", str(out), *extra])
    return rc, capsys.readouterr().err


def test_file_and_file_csv_take_one_lock(tmp_path, capsys):
    with Lock(tmp_path / "a.csv"):  # a run measuring into a.csv, its rows not yet written
        rc, err = _run(capsys, tmp_path / "a")
    assert rc == 2 and "being written by another run" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.meta.json").exists()


def test_a_fresh_run_does_not_take_over_the_side_files_of_its_twin(tmp_path, capsys):
    assert _run(capsys, tmp_path / "a.csv")[0] == 0
    meta = tmp_path / "a.meta.json"
    before = meta.read_text()
    assert json.loads(before)["csv"] == "a.csv"
    for twin in ("a", "a.CSV"):
        rc, err = _run(capsys, tmp_path / twin)
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert "would share a.meta.json, a.failed.jsonl, a.measuring.json with" in err
        assert not (tmp_path / twin).exists() and not side_path(tmp_path / twin, ".lock").exists()
    assert meta.read_text() == before  # a.csv's provenance kept
    assert _run(capsys, tmp_path / "a.csv", "--resume")[0] == 0  # its own file resumes as before


def test_an_embedding_collect_names_only_the_side_file_it_keeps(tmp_path):
    # kit collect-embedding keeps FILE.meta.json beside its CSV, no failure log or marker: the
    # refusal had named a.failed.jsonl and a.measuring.json, which it never writes
    import pytest

    from kit.embedding.measured_rows import RowAppender
    from kit.errors import KitError

    (tmp_path / "a.csv").write_text("x\n")
    with pytest.raises(KitError) as e:
        RowAppender(tmp_path / "a")
    assert "would share a.meta.json with" in str(e.value) and "failed" not in str(e.value)
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.lock").exists()
