"""Measured rows the kit leaves out of training (kit.predict.training.SUSPECT_ROWS: NeuSight's P4
train-collect Linear rows), on a hand-made NeuSight layout: they are out by default, kept with
suspect_rows / --keep-suspect-rows, and the manifest lists what was left out. The same GPU's
other ops and other GPUs' Linear rows are untouched."""
import json

import pytest
from test_training_frame import write

from kit import api
from kit.cli import main
from kit.predict.training import SUSPECT_ROWS, suspect_mask, training_frame

HEAD = ("OPName,Latency,Device,Torch Version,CUDNN Version,Kernel Name,Warps per SM,Blocks per SM,"
        "Grid x,Grid y,Grid z,Block x,Block y,Block z,CUDA Version,Kernels,B,M,N,K")


def gemm(op, latency, device, kernel, b, m, n, k):
    return (f"{op},{latency},{device},p2.1.0,8902,{kernel},8,1,40,1,1,256,1,1,cu121,"
            f";{kernel},{b},{m},{n},{k}")


@pytest.fixture
def layout(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "neusight"
    collect = root / "data" / "dataset" / "train" / "collect"
    tn, nn = "maxwell_sgemm_128x64_tn", "maxwell_sgemm_128x64_nn"
    write(collect / "linear" / "p2.1.0" / "Tesla P4.csv",
          [HEAD, gemm("linear", 9.0, "Tesla P4", tn, 1, 1024, 1024, 1024),
           gemm("linear", 30.0, "Tesla P4", tn, 1, 2048, 2048, 1024),
           gemm("linear", 60.0, "Tesla P4", tn, 1, 2048, 2048, 2048)])
    write(collect / "bmm" / "p2.1.0" / "Tesla P4.csv",
          [HEAD, gemm("bmm", 2.0, "Tesla P4", nn, 4, 512, 512, 512)])
    write(collect / "linear" / "p2.1.0" / "Tesla T4.csv",
          [HEAD, gemm("linear", 1.2, "Tesla T4", "volta_sgemm_128x64_tn", 1, 1024, 1024, 1024)])
    return root


def test_the_p4_linear_training_rows_are_out_by_default_and_kept_on_request(layout):
    assert ("p4", "linear", "neusight:train-collect") in SUSPECT_ROWS
    frame = training_frame(layout)
    assert sorted(zip(frame.gpu, frame.op)) == [("p4", "bmm"), ("t4", "linear")]
    assert frame.attrs["suspect_rows_left_out"] == [
        {"gpu": "p4", "op": "linear", "source": "neusight:train-collect", "rows": 3,
         "why": SUSPECT_ROWS[("p4", "linear", "neusight:train-collect")]}]
    kept = training_frame(layout, suspect_rows=True)
    assert sorted(zip(kept.gpu, kept.op)) == [("p4", "bmm")] + [("p4", "linear")] * 3 + [("t4", "linear")]
    assert kept.attrs["suspect_rows_left_out"] == []
    assert int(suspect_mask(kept).sum()) == 3
    # a frame of other GPUs leaves nothing out, and says so
    t4 = training_frame(layout, ["T4"])
    assert list(t4.op) == ["linear"] and t4.attrs["suspect_rows_left_out"] == []


def test_the_manifest_lists_what_was_left_out(layout, tmp_path):
    out = tmp_path / "w"
    r = api.train_predictors("P4,T4", str(out), data_dir=str(layout), quick=True, direct=False)
    m = json.loads((out / "manifest.json").read_text())
    assert r["rows"]["gemm"] == 2
    assert [(d["gpu"], d["op"], d["rows"]) for d in m["suspect_rows_left_out"]] == [("p4", "linear", 3)]
    assert "less 3 p4 linear rows of neusight:train-collect" in m["data_source"]
    assert m["suspect_rows_kept"] is False
    kept = tmp_path / "k"
    r = api.train_predictors("P4,T4", str(kept), data_dir=str(layout), quick=True, direct=False,
                             suspect_rows=True)
    m = json.loads((kept / "manifest.json").read_text())
    assert r["rows"]["gemm"] == 5 and m["suspect_rows_left_out"] == [] and m["suspect_rows_kept"] is True
    assert "less" not in m["data_source"]


def test_the_cli_flag_keeps_them_and_names_itself_in_the_manifest_command(layout, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["train", "--data", str(layout), "--train-gpus", "P4,T4", "--out", str(out),
                 "--quick", "--no-direct", "--keep-suspect-rows", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    m = json.loads((out / "manifest.json").read_text())
    assert r["rows"]["gemm"] == 5 and "--keep-suspect-rows" in m["command"]
    assert main(["train", "--data", str(layout), "--train-gpus", "P4,T4", "--out", str(out),
                 "--quick", "--no-direct", "--json"]) == 0
    capsys.readouterr()
    m = json.loads((out / "manifest.json").read_text())
    assert m["rows"]["gemm"] == 2 and "--keep-suspect-rows" not in m["command"]


def test_a_flag_that_is_no_yes_or_no_is_refused(layout, tmp_path):
    from kit.errors import KitError

    with pytest.raises(KitError, match="suspect_rows"):
        api.train_predictors("P4", str(tmp_path / "x"), data_dir=str(layout), quick=True,
                             suspect_rows="maybe")


def test_a_gpu_whose_only_rows_are_suspect_is_named_as_such(layout):
    from kit.errors import KitError

    (layout / "data" / "dataset" / "train" / "collect" / "bmm" / "p2.1.0" / "Tesla P4.csv").unlink()
    with pytest.raises(KitError, match="only training rows of p4 are left out as suspect.*--keep-suspect-rows"):
        training_frame(layout, ["P4", "T4"])
    assert list(training_frame(layout, ["P4"], suspect_rows=True).op) == ["linear"] * 3
    # every GPU: what was left out is still listed, though no P4 row remains
    frame = training_frame(layout)
    assert set(frame.gpu) == {"t4"}
    assert [(d["gpu"], d["rows"]) for d in frame.attrs["suspect_rows_left_out"]] == [("p4", 3)]


def test_yes_or_no_flags_are_checked_and_other_sources_are_never_suspect(layout):
    import pandas as pd

    from kit.errors import KitError

    for name in ("suspect_rows", "test_rows"):
        with pytest.raises(KitError, match=f"{name} must be True or False"):
            training_frame(layout, **{name: "no"})  # a string would count by its truth
    # one's own P4 Linear rows (kit collect, --extra) are not NeuSight's train-collect ones
    rows = pd.DataFrame({"gpu": ["p4", "p4", "p4", "t4"], "op": ["linear", "linear", "bmm", "linear"],
                         "source": ["neusight:train-collect", "kit:collect", "neusight:train-collect",
                                    "neusight:train-collect"]})
    assert suspect_mask(rows).tolist() == [True, False, False, False]


def test_the_shipped_weights_were_trained_without_them():
    from kit.predict.weights import SHIPPED_DIR

    m = json.loads((SHIPPED_DIR / "manifest.json").read_text())
    left = m["suspect_rows_left_out"]
    assert [(d["gpu"], d["op"], d["source"]) for d in left] == [("p4", "linear", "neusight:train-collect")]
    assert left[0]["rows"] > 6000 and m["suspect_rows_kept"] is False
    assert "--keep-suspect-rows" not in m["command"] and "--replace-shipped" in m["command"]
