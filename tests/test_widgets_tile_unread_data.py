"""The tile panel with a NeuSight folder whose test set cannot be read: it still draws the
roofline sweep, but its summary names the file and the problem. It had said "set KIT_DATA to
NeuSight's folder" to a reader whose KIT_DATA was set (measured_rows swallowed the KitError)."""
from kit.data import resolve_data_dir
from widgets.tile_predictor import TilePredictorPanel

BAD_LATENCY = "notatime"


def test_unreadable_test_set_is_named(tmp_path, monkeypatch):
    test = tmp_path / "data" / "dataset" / "test"
    test.mkdir(parents=True)
    (test / "bmm.csv").write_text("OPName,Latency,Device,B,M,N,K\n"
                                  "bmm,0.5,NVIDIA L4,2,64,64,64\n"
                                  f"bmm,{BAD_LATENCY},NVIDIA L4,2,64,64,128\n")
    monkeypatch.setenv("KIT_DATA", str(tmp_path))
    assert resolve_data_dir() == tmp_path
    p = TilePredictorPanel(gpus=("l4",))
    text = p.summary.value
    assert "bmm.csv:3" in text and BAD_LATENCY in text, text
    assert "set KIT_DATA" not in text
    assert [r for r in p.chart_data() if "op" in r]  # the roofline sweep is still drawn


def test_missing_folder_still_says_set_kit_data(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_DATA", str(tmp_path / "nothing-here"))
    p = TilePredictorPanel(gpus=("l4",))
    assert "set KIT_DATA" in p.summary.value
