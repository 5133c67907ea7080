"""kit evaluate says what it leaves out of a score: exact repeats are counted once and rows of an
op class no scored predictor prices (conv2d) are left out, each with a note, never in silence."""
import json

import pytest

from kit.cli import main
from kit.predict.evaluate import evaluate

NS_HEAD = "OPName,Latency,Device,B,M,N,K"
BMM = "bmm,0.40,NVIDIA L4,4,512,512,512"
LINEAR = "linear,1.13,NVIDIA L4,1,1024,2560,2560"
CONV_HEAD = "OPName,Latency,Device,B,Input_Channel,Output_Channel,Kernel_Szie,Input_Size,Stride,Padding"
CONV = "conv,0.97,NVIDIA L4,8,64,64,3,56,1,1"


def _write(path, head, rows):
    path.write_text("\n".join([head, *rows]) + "\n")
    return path


def test_exact_repeats_are_counted_once_with_a_note(tmp_path, capsys):
    once = _write(tmp_path / "once.csv", NS_HEAD, [BMM, LINEAR])
    twice = _write(tmp_path / "twice.csv", NS_HEAD, [BMM, LINEAR, BMM])
    with pytest.warns(UserWarning, match=r"twice.csv: 1 test row repeats another exactly .*counted once"):
        rows = evaluate(twice, ["roofline"])
    assert rows == evaluate(once, ["roofline"])
    assert main(["evaluate", "--test", str(twice), "--predictors", "roofline", "--json"]) == 0
    out, err = capsys.readouterr()
    assert sum(r["n"] for r in json.loads(out)) == 2 and "1 test row repeats another" in err


def test_rows_of_an_unmodelled_class_are_left_out_with_a_note(tmp_path, capsys):
    folder = tmp_path / "mixed"
    folder.mkdir()
    _write(folder / "gemm.csv", NS_HEAD, [BMM, LINEAR])
    _write(folder / "conv.csv", CONV_HEAD, [CONV, CONV.replace("0.97", "1.50").replace(",8,", ",16,")])
    assert main(["evaluate", "--test", str(folder), "--predictors", "roofline", "--json"]) == 0
    out, err = capsys.readouterr()
    assert sum(r["n"] for r in json.loads(out)) == 2
    assert "2 conv row(s) left out" in err and "conv_model.py" in err
    # a folder of GEMM rows alone has nothing left out and says nothing of it
    assert main(["evaluate", "--test", str(folder / "gemm.csv"), "--predictors", "roofline"]) == 0
    assert "left out" not in capsys.readouterr().err


def test_neusight_folders_known_repeats_are_not_noted_again(tmp_path):
    """NeuSight's test/vec.csv repeats its elem, ln and softmax files row for row: the notebooks
    and panels read that folder through load_neusight_test, without a note for those repeats."""
    import warnings

    from kit.predict.evaluate import load_neusight_test, load_test

    folder = tmp_path / "data" / "dataset" / "test"
    folder.mkdir(parents=True)
    _write(folder / "bmm.csv", NS_HEAD, [BMM, LINEAR])
    _write(folder / "vec.csv", NS_HEAD, [BMM])  # a file of repeats, as vec.csv is
    with pytest.warns(UserWarning, match="1 test row repeats another exactly"):
        noted = load_test(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = load_neusight_test(tmp_path)
    assert len(quiet) == len(noted) == 2
