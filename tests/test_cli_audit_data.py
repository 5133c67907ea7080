"""Third audit of the data surface (kit validate, kit data summary, the NeuSight CSV reader): a
bad label or measurement file is one `kit: error: ...` line naming the file (and line), or a
skipped label with its reason; never a traceback, never a number computed from garbage."""
import json

import pytest

from cli_json import cli_error
from kit.cli import main
from kit.data import load_measurements
from kit.errors import KitError

GOOD = {"num_layer": 24, "e2e_latency": 50.0, "fw_latency": 50.0, "bwall_latency": 0}
HEAD = "OPName,Latency,Device,B,M,N,K"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))


_err = cli_error  # the one `kit: error:` line of a command that must fail


def _ok(capsys, *argv) -> str:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


def _label(folder, name, content, gpu="Tesla_T4"):
    """Write one label file; content: a dict (as JSON), str or bytes."""
    d = folder / gpu
    d.mkdir(parents=True, exist_ok=True)
    f = d / name
    if isinstance(content, bytes):
        f.write_bytes(content)
    else:
        f.write_text(content if isinstance(content, str) else json.dumps(content))
    return f


# -- 1. kit validate: a label latency that is a bool or a string -------------------------------
@pytest.mark.parametrize("key,value", [("e2e_latency", True), ("e2e_latency", "694.46"),
                                       ("fw_latency", True), ("bwall_latency", "3.0")])
def test_validate_skips_a_label_whose_latency_is_a_bool_or_a_string(tmp_path, capsys, key, value):
    # {"e2e_latency": true} was scored as a measured 1.00 ms (APE 92783.9%); "694.46" was taken too
    _label(tmp_path, "gpt2-inf-8-1.json", {**GOOD, key: value})
    err = _err(capsys, "validate", "--labels", tmp_path)
    assert "none of the 1 label file(s)" in err and f"{key} must be" in err and repr(value) in err
    _label(tmp_path, "gpt2-inf-8-2.json", GOOD)  # beside a good label: skipped with the reason
    r = json.loads(_ok(capsys, "validate", "--labels", tmp_path, "--json"))
    assert [c["batch"] for c in r["configs"]] == [2]
    (s,) = r["skipped"]
    assert s["label"] == "Tesla_T4/gpt2-inf-8-1.json" and f"{key} must be" in s["reason"]


# -- 2. a label name with a batch or seq too large for any model -------------------------------
@pytest.mark.parametrize("name,word", [
    ("bert_large-inf-512-99999999999999999999.json", "batch 99999999999999999999 is too large"),
    ("bert_large-inf-512-9223372036854775807.json", "batch 9223372036854775807 is too large"),
    ("gpt2-inf-99999999999-1.json", "seq 99999999999 is too large"),
    ("gpt2-inf-2147483648-2147483648.json", "batch x seq"),
])
def test_validate_skips_a_label_with_a_huge_batch_or_seq(tmp_path, capsys, name, word):
    # the whole run died in torch ("Storage size calculation overflowed", a TypeError), even
    # with good labels beside it
    _label(tmp_path, name, GOOD)
    _label(tmp_path, "gpt2-inf-8-1.json", GOOD)
    out = _ok(capsys, "validate", "--labels", tmp_path)
    assert f"skipped Tesla_T4/{name}: unreadable label:" in out and word in out
    assert "overall:" in out and "over 1 configs" in out


def test_data_summary_refuses_a_label_with_a_huge_batch(tmp_path, capsys):
    # was OverflowError: Python int too large to convert to C long
    _label(tmp_path / "label", "bert_large-inf-512-99999999999999999999.json", GOOD)
    err = _err(capsys, "data", "summary", "--part", "labels", "--data", tmp_path)
    assert "bert_large-inf-512-99999999999999999999.json: batch" in err and "too large" in err


# -- 3. kit data summary --part labels: a binary or UTF-16 label -------------------------------
@pytest.mark.parametrize("content", [b"\x80\x81\xfe\xff" * 8, json.dumps(GOOD).encode("utf-16")])
def test_data_summary_refuses_a_binary_label(tmp_path, capsys, content):
    # was a UnicodeDecodeError traceback
    _label(tmp_path / "label", "gpt2-inf-8-1.json", content)
    err = _err(capsys, "data", "summary", "--part", "labels", "--data", tmp_path)
    assert "gpt2-inf-8-1.json is not JSON text (binary data, or not UTF-8)" in err


def test_data_summary_refuses_a_label_with_a_number_json_cannot_read(tmp_path, capsys):
    _label(tmp_path / "label", "gpt2-inf-8-1.json", '{"e2e_latency": ' + "1" * 5000 + "}")
    err = _err(capsys, "data", "summary", "--part", "labels", "--data", tmp_path)
    assert "gpt2-inf-8-1.json is not valid JSON" in err


# -- 4. kit data summary --part labels applies validate's rules --------------------------------
@pytest.mark.parametrize("change,message", [
    ({"e2e_latency": -5}, "e2e_latency must be a positive number of ms, got -5"),
    ({"e2e_latency": 0}, "e2e_latency must be a positive number of ms, got 0"),
    ({"e2e_latency": float("nan")}, "e2e_latency must be a positive number of ms, got nan"),
    ({"e2e_latency": float("inf")}, "e2e_latency must be a positive number of ms, got inf"),
    ({"e2e_latency": None}, "e2e_latency must be a positive number of ms, got None"),
    ({"e2e_latency": True}, "e2e_latency must be a positive number of ms, got True"),
    ({"fw_latency": -1}, "fw_latency must be a number of ms >= 0, got -1"),
    ({"bwall_latency": float("nan")}, "bwall_latency must be a number of ms >= 0, got nan"),
    # a phase longer than the step it is part of (accepted before)
    ({"e2e_latency": 10.0, "fw_latency": 20.0, "bwall_latency": 0}, "fw_latency 20 ms is longer than the whole step"),
    ({"e2e_latency": 10.0, "fw_latency": 6.0, "bwall_latency": 6.0},
     "fw_latency + bwall_latency = 12 ms is longer than the whole step"),
])
def test_data_summary_refuses_the_labels_validate_skips(tmp_path, capsys, change, message):
    # they were counted as labels (validate skips every one of them)
    _label(tmp_path / "label", "gpt2-inf-8-1.json", {**GOOD, **change})
    err = _err(capsys, "data", "summary", "--part", "labels", "--data", tmp_path)
    assert "gpt2-inf-8-1.json: " + message in err
    rc = main(["validate", "--labels", str(tmp_path / "label")])
    out, err = capsys.readouterr()
    assert rc == 2 and message in err  # the same rule, the same words


def test_data_summary_still_counts_good_labels_and_null_phase_times(tmp_path, capsys):
    _label(tmp_path / "label", "gpt2-inf-8-1.json", {**GOOD, "fw_latency": None, "num_layer": None})
    _label(tmp_path / "label", "gpt2-train-8-1.json", GOOD)
    r = json.loads(_ok(capsys, "data", "summary", "--part", "labels", "--data", tmp_path, "--json"))
    assert r["total"] == 2 and {x["op"] for x in r["rows"]} == {"gpt2-inf", "gpt2-train"}


# -- 5. NeuSight CSV dimensions past int64, or whose products overflow ---------------------------
@pytest.mark.parametrize("row,message", [
    ("bmm,1.0,Tesla T4,1e30,4,4,4", "x.csv:2: column 'B' must be at most 2^31"),
    ("bmm,1.0,Tesla T4,9223372036854775808,4,4,4", "x.csv:2: column 'B' must be at most 2^31"),
    ("linear,1.0,Tesla T4,64,64,99999999999999999999,64", "x.csv:2: column 'N' must be at most 2^31"),
    # m = B*M wrapped around int64 and was scored; B=M=2^32 said "m must be ... got 0"
    ("linear,1.0,Tesla T4,4294967297,4294967296,64,64", "x.csv:2: column 'B' must be at most 2^31"),
    ("linear,1.0,Tesla T4,4294967296,4294967296,64,64", "x.csv:2: column 'B' must be at most 2^31"),
    ("linear,1.0,Tesla T4,2147483648,2147483648,64,64", "x.csv:2: linear row too large to be a "
                                                        "measurement: B*M*N"),
    ("bmm,1.0,Tesla T4,1000000000,1000000000,1000000000,1000000000", "B*M*N"),
    ("bmm,1.0,Tesla T4,1,1048576,1048576,1048576", "x.csv:2: bmm row too large to be a measurement: "
                                                   "B*M*N*K"),
])
def test_neusight_csv_with_dimensions_too_large_is_one_error(tmp_path, capsys, row, message):
    # B=1e30 was "TypeError: cannot safely cast non-equivalent float64 to int64"
    f = tmp_path / "x.csv"
    f.write_text(f"{HEAD}\n{row}\n")
    err = _err(capsys, "data", "summary", "--file", f)
    assert message in err and "column" in err  # the column, or "check column(s) B, M, N"
    err = _err(capsys, "evaluate", "--test", f, "--predictors", "roofline")
    assert message in err


def test_vector_row_too_large_names_its_columns(tmp_path):
    from kit.data import load_measurements

    f = tmp_path / "v.csv"
    f.write_text("OPName,Latency,Device,B,H\nadd,1.0,Tesla T4,8,8\nsoftmax,1.0,Tesla T4,2097152,2097152\n")
    with pytest.raises(KitError, match=r"v.csv:3: softmax row too large .*B\*H .*check column\(s\) B, H"):
        load_measurements(f)


def test_a_huge_dimension_in_a_part_is_one_error(tmp_path, capsys):
    d = tmp_path / "data/dataset/test"
    d.mkdir(parents=True)
    (d / "softmax.csv").write_text("OPName,Latency,Device,B,H\nsoftmax,1.0,Tesla T4,1e30,64\n")
    err = _err(capsys, "data", "summary", "--part", "test", "--data", tmp_path)
    assert "softmax.csv:2: column 'B' must be at most 2^31" in err


def test_real_sized_rows_still_load(tmp_path):
    from kit.data import load_measurements

    # NeuSight's largest shapes: B up to 2^22, a GEMM of 2^43.6 multiply-adds
    f = tmp_path / "ok.csv"
    f.write_text(f"{HEAD}\nbmm,9.0,Tesla T4,4096,1024,1024,1024\nlinear,2.0,Tesla T4,4194304,4,64,64\n"
                 "linear,2.0,Tesla T4,2147483648,1,4,4\n")
    frame = load_measurements(f)
    assert frame.m.tolist() == [1024, 4194304 * 4, 2147483648]


# -- 6. a collect <GPU>.csv that is a folder ---------------------------------------------------
def test_collect_csv_that_is_a_folder_is_one_error(tmp_path, capsys):
    # was IsADirectoryError from pandas, in kit train and kit data summary
    (tmp_path / "data/dataset/train/collect/ln/p2.1.0/Tesla T4.csv").mkdir(parents=True)
    err = _err(capsys, "data", "summary", "--data", tmp_path)
    assert "Tesla T4.csv is a folder, not a CSV file" in err
    from kit.data.neusight import read_neusight_csv

    with pytest.raises(KitError, match="Tesla T4.csv is a folder, not a CSV file"):
        read_neusight_csv(tmp_path / "data/dataset/train/collect/ln/p2.1.0/Tesla T4.csv")


# -- 7. validate's exit code and skip lines; an unknown op's file:line --------------------------
def test_validate_fails_when_every_label_was_skipped_but_lists_them(tmp_path, capsys):
    # exit 0 with nothing validated; the skip line named "t4/bert_large-inference-0-8", a file
    # that does not exist (it is Tesla_T4/bert_large-inf-0-8.json)
    _label(tmp_path, "bert_large-inf-0-8.json", GOOD)
    _label(tmp_path, "resnet9000-inf-8-1.json", GOOD)
    rc = main(["validate", "--labels", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 2 and err.startswith("kit: error: ") and err.count("\n") == 1
    assert "could be validated: all 2 were skipped" in err
    assert "skipped Tesla_T4/bert_large-inf-0-8.json: seq must be a positive whole number" in out
    assert "skipped Tesla_T4/resnet9000-inf-8-1.json: model 'resnet9000' is not in the zoo" in out
    rc = main(["validate", "--labels", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    assert rc == 2 and "all 2 were skipped" in err
    r = json.loads(out)
    assert sorted(s["label"] for s in r["skipped"]) == ["Tesla_T4/bert_large-inf-0-8.json",
                                                        "Tesla_T4/resnet9000-inf-8-1.json"]


def test_validate_names_the_real_file_of_an_unknown_gpu(tmp_path, capsys):
    _label(tmp_path, "gpt2-inf-8-1.json", GOOD, gpu="Tesla_Z99")
    _label(tmp_path, "gpt2-inf-8-1.json", GOOD)
    out = _ok(capsys, "validate", "--labels", tmp_path)
    assert "skipped Tesla_Z99/gpt2-inf-8-1.json: GPU 'Tesla_Z99' is not in the catalog" in out


@pytest.mark.parametrize("name", ["x.csv", "data/dataset/test/softmax.csv"])
def test_unknown_op_names_file_and_line(tmp_path, capsys, name):
    f = tmp_path / name
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("OPName,Latency,Device,B,H\nsoftmax,1.0,Tesla T4,8,8\nfrobnicate,1.0,Tesla T4,8,8\n")
    argv = ["--file", f] if name == "x.csv" else ["--part", "test", "--data", tmp_path]
    err = _err(capsys, "data", "summary", *argv)
    assert f"{name}:3: unknown op 'frobnicate'" in err


def test_unknown_op_in_a_kit_csv_names_file_and_line(tmp_path, capsys):
    from kit.data.records import HEADER

    good = {"op": "bmm", "op_class": "gemm", "scalar": "false", "gpu": "t4", "device_name": "Tesla T4",
            "dtype": "fp32", "b": "2", "m": "8", "n": "8", "k": "8", "latency_ms": "0.5",
            "source": "collector", "split": "test"}
    lines = [",".join(HEADER)] + [",".join(str(r.get(c, "")) for c in HEADER)
                                  for r in (good, {**good, "op": "frobnicate", "op_class": ""})]
    (tmp_path / "k.csv").write_text("\n".join(lines) + "\n")
    err = _err(capsys, "data", "summary", "--file", tmp_path / "k.csv")
    assert "k.csv:3: unknown op 'frobnicate'" in err


def test_a_test_path_that_is_no_file_and_an_empty_csv_say_so(capsys, tmp_path):
    assert "is not a regular file or folder" in _err(capsys, "evaluate", "--test", "/dev/null")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert "empty.csv is empty" in _err(capsys, "evaluate", "--test", empty)
    with pytest.raises(KitError, match="empty.csv is empty"):
        load_measurements(empty)


def test_validate_names_a_malformed_label_once(tmp_path, capsys):
    # the skip line named the label, then its reason repeated the absolute path
    bad = tmp_path / "Tesla_T4" / "gpt2-inf-8-2.json"
    _label(tmp_path, "gpt2-inf-8-1.json", GOOD)
    bad.write_text("{bad")
    out = _ok(capsys, "validate", "--labels", tmp_path)
    (line,) = [x for x in out.splitlines() if x.startswith("skipped")]
    assert line.startswith("skipped Tesla_T4/gpt2-inf-8-2.json: unreadable label:")
    assert "not valid JSON" in line and str(tmp_path) not in line
