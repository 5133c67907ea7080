"""`kit train` and `kit evaluate`: JSON shape, what a test row may show, and clear errors."""
import json

import numpy as np
import pytest

from kit.cli import main
from kit.hardware import get_gpu
from kit.ops import Gemm
from kit.predict.roofline import roofline
from kit.predict.training import train_bundle
from kit.predict.weights import save_bundle
from predict_synthetic import synthetic_frame

TINY = {"members": 1, "epochs": 1, "hidden": 8, "chooser_epochs": 1, "min_steps": 10}
HEADER = ("OPName,Latency,Device,Torch Version,CUDNN Version,Kernel Name,Warps per SM,"
          "Blocks per SM,Grid x,Grid y,Grid z,Block x,Block y,Block z,CUDA Version,Kernels,B,M,N,K")
# NeuSight bmm (B×M×N)·(B×N×K): the reduction is N
ROWS = [("bmm", 0.25, "NVIDIA L4", 192, 96, 196, 196), ("bmm", 8.7, "NVIDIA L4", 2560, 384, 384, 64),
        ("linear", 1.13, "NVIDIA L4", 1, 1024, 2560, 2560), ("bmm", 0.05, "Tesla T4", 4, 64, 64, 64)]


def write_csv(path, kernel="ampere_sgemm_128x128_nn", grid=(2, 1, 192)):
    lines = [HEADER] + [f"{op},{lat},{dev},p2.1.0,8902,{kernel},52.9,6.6,{grid[0]},{grid[1]},"
                        f"{grid[2]},256,1,1,cu121,;{kernel},{b},{m},{n},{k}"
                        for op, lat, dev, b, m, n, k in ROWS]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    b = train_bundle(synthetic_frame(("t4", "v100-pcie-32gb"), n=15), ["t4", "v100-pcie-32gb"],
                     seed=0, threads=1, settings=TINY)
    return save_bundle(b, tmp_path_factory.mktemp("weights"))


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_evaluate_json_shape_and_roofline_by_hand(tmp_path, weights, capsys):
    test = write_csv(tmp_path / "bmm.csv")
    out = run_json(capsys, "evaluate", "--test", str(test), "--predictors", "roofline,tile,li",
                   "--weights", str(weights))
    keys = {"predictor", "gpu", "op", "n", "mape", "median_ape", "p90_ape"}
    assert all(set(r) == keys for r in out if r["predictor"] != "tile")  # no band: no coverage
    assert all(set(r) == keys | {"coverage_80"} for r in out if r["predictor"] == "tile")
    # the tile-MLP's coverage by hand: its L4 bmm rows inside their p10-p90 band
    from kit.predict.evaluate import build_predictors, load_test, predict_rows

    rows = predict_rows(load_test(test), build_predictors(["tile"], weights))
    rows = rows[(rows.gpu == "l4") & (rows.op == "bmm")]
    inside = ((rows.measured_ms >= rows.p10_ms) & (rows.measured_ms <= rows.p90_ms)).mean()
    tile_l4 = next(r for r in out if r["predictor"] == "tile" and r["gpu"] == "l4" and r["op"] == "bmm")
    assert tile_l4["coverage_80"] == pytest.approx(inside, abs=1e-3)
    assert {(r["predictor"], r["gpu"], r["op"]) for r in out} >= {("tile", "l4", "bmm"),
                                                                 ("roofline", "t4", "bmm")}
    # the T4 row by hand: NeuSight (B, M, N, K) = (4, 64, 64, 64) is the kit's Gemm(m=64, k=64, n=64, b=4)
    t4 = next(r for r in out if r["predictor"] == "roofline" and r["gpu"] == "t4")
    roof = roofline(Gemm(m=64, n=64, k=64, b=4), get_gpu("t4")).time_ms
    assert t4["n"] == 1
    assert t4["mape"] == pytest.approx(abs(roof - 0.05) / 0.05 * 100, abs=0.01)
    l4 = next(r for r in out if r["predictor"] == "roofline" and r["gpu"] == "l4" and r["op"] == "bmm")
    assert l4["n"] == 2 and l4["median_ape"] <= l4["p90_ape"]


def test_evaluate_never_reads_kernel_name_or_launch_dims(tmp_path, weights, capsys):
    a = write_csv(tmp_path / "a.csv")
    b = write_csv(tmp_path / "b.csv", kernel="volta_sgemm_32x32_sliced1x4_nn", grid=(9, 9, 9))
    args = ["--predictors", "tile,habitat,li,mlp", "--weights", str(weights)]
    assert run_json(capsys, "evaluate", "--test", str(a), *args) == \
        run_json(capsys, "evaluate", "--test", str(b), *args)


def test_evaluate_a_folder_keeps_repeated_rows_once(tmp_path, weights, capsys):
    write_csv(tmp_path / "bmm.csv")
    write_csv(tmp_path / "vec.csv")  # the same rows again, as NeuSight's vec.csv repeats elem
    out = run_json(capsys, "evaluate", "--test", str(tmp_path), "--predictors", "roofline")
    assert sum(r["n"] for r in out) == len(ROWS)


@pytest.mark.parametrize("argv, words", [
    (["evaluate", "--test", "/nonexistent/t.csv"], "not found"),
    (["evaluate", "--test", "{csv}", "--predictors", "roofline,oracle"], "unknown predictor"),
    (["evaluate", "--test", "{csv}", "--weights", "{tmp}"], "not a predictor weights folder"),
    (["train", "--data", "/nonexistent/neusight", "--train-gpus", "T4", "--out", "{tmp}/w"], "/nonexistent"),
    (["train", "--data", "/nonexistent", "--train-gpus", "T4,NoSuchGPU", "--out", "{tmp}/w"], "NoSuchGPU"),
    (["train", "--train-gpus", "T4"], "--out"),
])
def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys, argv, words):
    csv = write_csv(tmp_path / "t.csv")
    argv = [a.format(csv=csv, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kit: error:") and "\n" not in err and words in err


def test_unknown_device_in_a_test_csv_is_refused(tmp_path, capsys):
    path = write_csv(tmp_path / "t.csv")
    path.write_text(path.read_text().replace("Tesla T4", "Imaginary GPU 9000"))
    assert main(["evaluate", "--test", str(path), "--predictors", "roofline"]) == 2
    assert "Imaginary GPU 9000" in capsys.readouterr().err


def test_evaluate_a_callers_frame_renumbers_repeats_and_names_missing_columns(tmp_path):
    # two loaded frames concatenated repeat index labels: rows were paired by label with the
    # wrong answers (pandas 'All arrays must be of the same length'); a frame without the
    # measured latency was a KeyError
    import pandas as pd

    from kit.errors import KitError
    from kit.predict.evaluate import evaluate, load_test

    one = load_test(write_csv(tmp_path / "bmm.csv"))
    single = evaluate(one, ["roofline"])
    # an exact repeat is kept once, as load_test keeps it (the CSV path's rule; the frame path
    # counted it twice before tests/test_audit_data_fixes.py)
    assert evaluate(pd.concat([one, one]), ["roofline"]) == single
    # the same shapes measured again (another latency) are other rows: index labels repeat
    again = one.assign(latency_ms=one.latency_ms * 1.01)
    twice = evaluate(pd.concat([one, again]), ["roofline"])
    assert [r["n"] * 2 for r in single] == [r["n"] for r in twice]
    alone = evaluate(again, ["roofline"])
    assert [r["mape"] for r in twice] == pytest.approx(
        [(a["mape"] + b["mape"]) / 2 for a, b in zip(single, alone)], abs=0.011)
    with pytest.raises(KitError, match="lack column.*latency_ms"):
        evaluate(one.drop(columns=["latency_ms"]), ["roofline"])
    with pytest.raises(KitError, match="empty"):
        evaluate(one.head(0), ["roofline"])
