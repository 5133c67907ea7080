"""`kit evaluate --test DIR` (and `kit train --extra DIR`) skip a CSV with only some of NeuSight's
columns (NeuSight's own fp16mm.csv: B, M, N, K, Latency, pred, err) as they skip other tables
that hold no measurements, with a note naming it; alone, it is one error naming it."""
import pytest

from kit.cli import main
from kit.data.loading import NotMeasurementCSV, load_measurements
from kit.errors import KitError
from kit.predict.evaluate import load_test

FP16MM = ",B,M,N,K,Latency,pred,err\n0,128,256,256,256,0.0364,0.0435,0.1957\n"
LN = ("OPName,B,H,Latency,Device\nln,64,1024,0.05,Tesla T4\nln,128,1024,0.09,Tesla T4\n")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))


def _folder(tmp_path, files):
    d = tmp_path / "test"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def test_a_csv_of_some_of_neusights_columns_is_no_measurement_csv(tmp_path):
    p = _folder(tmp_path, {"fp16mm.csv": FP16MM}) / "fp16mm.csv"
    with pytest.raises(NotMeasurementCSV, match="fp16mm.csv: not a measurement CSV: missing "
                                                "column\\(s\\) OPName, Device of NeuSight's"):
        load_measurements(p)


def test_evaluate_skips_it_beside_measurements_with_a_note_naming_it(tmp_path, capsys):
    d = _folder(tmp_path, {"fp16mm.csv": FP16MM, "ln.csv": LN})
    with pytest.warns(UserWarning, match="skipped 1 CSV file\\(s\\) that are no measurement table: fp16mm.csv"):
        rows = load_test(d)
    assert len(rows) == 2  # the ln rows, all of them; the whole run had stopped on fp16mm.csv
    rc = main(["evaluate", "--test", str(d), "--predictors", "roofline"])
    out, err = capsys.readouterr()
    assert rc == 0 and "roofline" in out and "t4" in out and "fp16mm.csv" in err


def test_alone_it_is_one_error_naming_it(tmp_path, capsys):
    d = _folder(tmp_path, {"fp16mm.csv": FP16MM})
    for test in (d, d / "fp16mm.csv"):
        rc = main(["evaluate", "--test", str(test), "--predictors", "roofline"])
        out, err = capsys.readouterr()
        assert rc == 2 and not out and "fp16mm.csv" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(KitError, match="no measurement CSV in"):
        load_test(d)
