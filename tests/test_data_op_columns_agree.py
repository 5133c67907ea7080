"""A measurement row's elem_kind and scalar follow from its op (kit.data.schema.OPS), and the
predictors read them (kit.predict.features): a kit CSV that gave op_class but no elem_kind or
scalar column had its elementwise rows refused later as 'unknown elementwise kind nan', and one
whose scalar contradicted its op (addu, scalar false) was priced as the other op. Numbers a
column cannot hold (a bool as a dimension or latency, an integer past int64) are one KitError
naming the line, never a traceback or a 1."""
import warnings

import numpy as np
import pandas as pd
import pytest

from kit.data import load_measurements
from kit.data.schema import OPS
from kit.errors import KitError

DEVICE = "Tesla V100-PCIE-32GB"


def _write(tmp_path, text, name="m.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("head", ["op,op_class,latency_ms,device_name,dtype,rows,cols",
                                  "op,op_class,elem_kind,latency_ms,device_name,dtype,rows,cols",
                                  "op,op_class,scalar,latency_ms,device_name,dtype,rows,cols"])
def test_elem_kind_and_scalar_follow_the_op(tmp_path, head):
    ops = [o for o, (cls, _, _) in OPS.items() if cls == "elementwise"]
    lines = [head]
    for op in ops:
        cells = {"op": op, "op_class": "elementwise", "elem_kind": OPS[op][1],
                 "scalar": str(OPS[op][2]).lower(), "latency_ms": "0.5", "device_name": DEVICE,
                 "dtype": "fp32", "rows": "64", "cols": "4096"}
        lines.append(",".join(cells[c] for c in head.split(",")))
    frame = load_measurements(_write(tmp_path, "\n".join(lines) + "\n"))
    assert list(frame.elem_kind) == [OPS[o][1] for o in ops]
    assert list(frame.scalar) == [OPS[o][2] for o in ops]


def test_scored_alike_with_or_without_the_info_columns(tmp_path):
    from kit.predict.evaluate import evaluate

    row = f"0.5,{DEVICE},fp32,4096,4096"
    bare = _write(tmp_path, f"op,latency_ms,device_name,dtype,rows,cols\naddu,{row}\n", "bare.csv")
    given = _write(tmp_path, "op,op_class,latency_ms,device_name,dtype,rows,cols\n"
                   f"addu,elementwise,{row}\n", "given.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = evaluate(bare, predictors="roofline")
        b = evaluate(given, predictors="roofline")
    assert a[0]["mape"] == b[0]["mape"]


@pytest.mark.parametrize("col, value", [("scalar", "false"), ("elem_kind", "gelu")])
def test_info_that_contradicts_the_op_is_refused(tmp_path, col, value):
    cells = {"op": "addu", "op_class": "elementwise", "elem_kind": "add", "scalar": "true",
             "latency_ms": "0.5", "device_name": DEVICE, "dtype": "fp32", "rows": "8", "cols": "8"}
    good = ",".join(cells.values())
    cells[col] = value
    path = _write(tmp_path, ",".join(cells) + "\n" + good + "\n" + ",".join(cells.values()) + "\n")
    with pytest.raises(KitError, match=rf"{path}:3: .*{col}"):
        load_measurements(path)


def test_caller_frame_missing_info_is_filled():
    from kit.data.records import checked_table

    frame = pd.DataFrame({"op": ["mulu", "bmm"], "op_class": ["elementwise", "gemm"],
                          "elem_kind": [np.nan, np.nan], "scalar": [pd.NA, pd.NA],
                          "latency_ms": [0.5, 0.5], "device_name": [DEVICE, DEVICE],
                          "dtype": ["fp32", "fp32"], "rows": [8, pd.NA], "cols": [8, pd.NA],
                          "b": [pd.NA, 1], "m": [pd.NA, 8], "n": [pd.NA, 8], "k": [pd.NA, 8]})
    out = checked_table(frame, "the frame", lines=False)
    assert out.elem_kind.iloc[0] == "mul" and bool(out.scalar.iloc[0]) is True


KIT_HEAD = "op,latency_ms,device_name,dtype,b,m,n,k"


@pytest.mark.parametrize("m", ["99999999999999999999999", "-99999999999999999999999", "9223372036854775808"])
def test_integer_past_int64_is_one_error(tmp_path, m):
    path = _write(tmp_path, f"{KIT_HEAD}\nbmm,0.5,{DEVICE},fp32,2,3,4,5\nbmm,0.5,{DEVICE},fp32,2,{m},4,5\n")
    with pytest.raises(KitError, match=rf"{path}:3: column 'm' .*{m}"):
        load_measurements(path)


def test_bool_dimension_is_no_one(tmp_path):
    path = _write(tmp_path, f"{KIT_HEAD}\nbmm,0.5,{DEVICE},fp32,2,True,4,5\n")
    with pytest.raises(KitError, match="column 'm'"):
        load_measurements(path)


@pytest.mark.parametrize("col", ["Latency", "M"])
def test_neusight_bool_number_is_no_one(tmp_path, col):
    cells = {"OPName": "bmm", "Latency": "0.5", "Device": DEVICE, "B": "2", "M": "3", "N": "4", "K": "5"}
    cells[col] = "True"
    path = _write(tmp_path, ",".join(cells) + "\n" + ",".join(cells.values()) + "\n")
    with pytest.raises(KitError, match=rf"{path}:2: .*{col}.*True"):
        load_measurements(path)


def test_error_names_the_value_the_column_cannot_hold(tmp_path):
    # 2^63 - 1 fits int64 (a file of it alone is read, then refused as past the shape bound, not
    # as a number the column cannot hold), so the 'abc' below it is the one to name;
    # float(2^63 - 1) rounds to 2^63, which had named line 2 instead
    top = str(2 ** 63 - 1)
    alone = _write(tmp_path, f"{KIT_HEAD}\nbmm,0.5,{DEVICE},fp32,2,{top},4,5\n", "alone.csv")
    with pytest.raises(KitError, match=r"alone\.csv:2: a bmm of b\*m\*k = .* past the 2\^40"):
        load_measurements(alone)
    path = _write(tmp_path, f"{KIT_HEAD}\nbmm,0.5,{DEVICE},fp32,2,{top},4,5\n"
                  f"bmm,0.5,{DEVICE},fp32,2,abc,4,5\n")
    with pytest.raises(KitError, match=rf"{path}:3: column 'm' .*'abc'"):
        load_measurements(path)


@pytest.mark.parametrize("row, said", [
    ("bmm,0.5,%s,fp32,2,9223372036854775807,4,5" % DEVICE, r"m\.csv:3: a bmm of b\*m\*k = .* past the 2\^40"),
    ("bmm,0.5,%s,fp32,1024,1048576,4,1048576" % DEVICE, r"m\.csv:3: a bmm of b\*m\*k = .* past the 2\^40"),
])
def test_a_kit_csv_shape_past_neusights_bounds_is_named(tmp_path, row, said):
    """A kit CSV had no upper bound on an operand, as NeuSight's reader has: a bmm with
    m = 2^63 - 1 loaded, and kit evaluate scored it at a MAPE of 1.5e17% under the roofline."""
    head = "op,latency_ms,device_name,dtype,b,m,n,k"
    ok = "bmm,0.5,%s,fp32,2,%d,4,5" % (DEVICE, 2 ** 33)  # one long side is a shape
    assert len(load_measurements(_write(tmp_path, f"{head}\n{ok}\n"))) == 1
    # an add of 3e9 elements as 3e9 rows of 1 (12 GB in fp32: an H100 holds it) is a shape too
    add = "op,latency_ms,device_name,dtype,rows,cols\nadd,9.1,%s,fp32,3000000000,1\n" % DEVICE
    assert len(load_measurements(_write(tmp_path, add, "add.csv"))) == 1
    with pytest.raises(KitError, match=said):
        load_measurements(_write(tmp_path, f"{head}\n{ok}\n{row}\n"))


def test_a_linear_neusight_loads_passes_the_kit_bounds_too(tmp_path):
    """A linear's m is NeuSight's B*M, each at most 2^31 there: 65536 x 65536 tokens of width 1
    (m = 2^32, 2^32 elements per operand) loads from NeuSight's CSV, and the same row had then
    been refused as a kit CSV's and by kit evaluate's check of a caller's frame (m > 2^31)."""
    from kit.data.records import checked_table

    cells = {"OPName": "linear", "Latency": "0.5", "Device": DEVICE, "B": "65536", "M": "65536",
             "N": "1", "K": "1"}
    ns = load_measurements(_write(tmp_path, ",".join(cells) + "\n" + ",".join(cells.values()) + "\n",
                                  "ns.csv"))
    assert int(ns.m.iloc[0]) == 2 ** 32
    assert len(checked_table(ns.drop(columns=["gpu"]), "the frame", lines=False)) == 1
    kit = f"{KIT_HEAD}\nlinear,0.5,{DEVICE},fp32,1,{2 ** 32},1,1\n"
    assert int(load_measurements(_write(tmp_path, kit)).m.iloc[0]) == 2 ** 32
    past = f"{KIT_HEAD}\nlinear,0.5,{DEVICE},fp32,1,{2 ** 41},1,1\n"  # the operand bound still holds
    with pytest.raises(KitError, match=r"m\.csv:2: a linear of b\*m\*k = .* past the 2\^40"):
        load_measurements(_write(tmp_path, past))
