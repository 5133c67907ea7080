"""`kit shard` on tables past what any system holds, and on plans no greedy baseline fits:
one line and exit 2, or valid JSON (no Infinity) with the infeasible baselines as null."""
import json

import pytest

pytest.importorskip("kit.comm")

from kit.cli import main  # noqa: E402
from kit.embedding.cost import MAX_POOLING, Table  # noqa: E402
from kit.errors import KitError  # noqa: E402


def _strict_loads(text):
    def refuse(name):
        raise ValueError(f"non-JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("row, words", [
    ("user,1e18,8,1", "PiB, more than any GPU system holds"),   # int64 overflow: a traceback
    ("user,10,1e19,1", "PiB, more than any GPU system holds"),
    ("user,1000,8,1e300", "pooling 1e+300 lookups per sample is implausible"),  # a 300-digit time
])
def test_tables_past_any_system_are_one_line(tmp_path, capsys, row, words):
    f = tmp_path / "t.csv"
    f.write_text(f"name,rows,dim,pooling\n{row}\n")
    assert main(["shard", "--tables", str(f), "--system", "dgx-a100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 2" in err and words in err


def test_table_bounds_in_the_api():
    with pytest.raises(KitError, match="PiB"):
        Table(rows=2**48, dim=64, pooling=1.0)
    with pytest.raises(KitError, match="implausible"):
        Table(rows=10, dim=8, pooling=MAX_POOLING * 2.0)
    assert Table(rows=10, dim=8, pooling=float(MAX_POOLING)).pooling == MAX_POOLING


# a bin-packing case: 4 big and 6 small tables on 4 GPUs at 1.5 GiB; the greedy baselines
# place the big ones first, one a GPU, and then cannot fit the small ones; a plan exists
PACK = "name,rows,dim,pooling\n" + "".join(f"big{i},3145728,64,1\n" for i in range(4)) \
    + "".join(f"small{i},2097152,64,1\n" for i in range(6))
# the plans of a 0.5 s budget, counted (the search finds the plan after 10,000-20,000): at
# --budget-s 0.5 a busy machine's wall clock had stopped it before, and it found no plan
ARGS = ["--system", "a100x4-nvlink", "--kinds", "tw", "--optimizer", "sgd", "--memory-gib", "1.5",
        "--max-plans", "75000", "--budget-s", "60"]


def test_infeasible_baselines_are_null_in_valid_json(tmp_path, capsys):
    f = tmp_path / "pack.csv"
    f.write_text(PACK)
    assert main(["shard", "--tables", str(f), *ARGS, "--json"]) == 0
    r = _strict_loads(capsys.readouterr().out)
    assert r["baselines"] and all(v is None for v in r["baselines"].values())
    assert r["best_baseline"] is None and r["improvement_vs_best_baseline"] is None
    assert r["cost_ms"] > 0 and max(r["parts"]["memory_bytes"]) <= 1.5 * 2**30
    assert main(["shard", "--tables", str(f), *ARGS]) == 0
    out = capsys.readouterr().out
    assert "no baseline found a plan that fits" in out and "faster than" not in out


@pytest.mark.parametrize("budget, why", [(["--max-plans", "500", "--budget-s", "60"], "at its budget of 500 plans"),
                                         (["--budget-s", "1e-6"], "at its budget of 1 plan;")])
def test_a_search_cut_short_does_not_say_no_plan_fits(tmp_path, capsys, budget, why):
    # a plan fits (the test above finds it); a search stopped before it found one had said
    # "no plan fits the memory cap of 1.5 GiB per GPU ...; raise the cap or use more GPUs"
    f = tmp_path / "pack.csv"
    f.write_text(PACK)
    args = [a for a in ARGS if a not in ("--max-plans", "75000", "--budget-s", "60")]
    assert main(["shard", "--tables", str(f), *args, *budget]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no plan fits" not in err
    assert "found no plan under the memory cap of 1.5 GiB per GPU before it stopped" in err
    assert why in err


def test_no_fit_names_the_total_when_the_total_binds(tmp_path, capsys):
    f = tmp_path / "many.csv"
    f.write_text("name,rows,dim,pooling\n" + "".join(f"t{i},1000000,128,4\n" for i in range(40)))
    assert main(["shard", "--tables", str(f), "--system", "dgx-a100", "--memory-gib", "2"]) == 2
    err = capsys.readouterr().err
    assert "tables hold 19.1 GiB" in err and "8 GPUs x 2 GiB hold 16 GiB" in err
    assert "largest table" not in err


def test_every_json_output_is_strict(capsys):
    # the CLI writes null for any non-finite number, never Infinity or NaN
    import numpy as np

    from kit.cli import json_text
    assert json.loads(json_text({"a": [float("inf"), 1.0, {"b": float("nan")}], "c": "x",
                                 "d": np.float32("nan"), "e": np.array([np.inf, 2.0])})) == \
        {"a": [None, 1.0, {"b": None}], "c": "x", "d": None, "e": [None, 2.0]}
