"""`kit shard --max-plans N` and kit.api.shard_tables(max_plans=N): the plan search's budget as a
count of plans; and the search's time is told apart from the whole run's."""
import json

import pytest

pytest.importorskip("kit.comm")
pytest.importorskip("kit.hardware.system")

from kit.cli import main  # noqa: E402
from kit.cli.cmd_shard import text  # noqa: E402
from kit.errors import KitError  # noqa: E402

CSV = "name,rows,dim,pooling,zipf_alpha\nuser,10000000,128,1,1.1\nitem,5000000,128,30,0.9\n" \
      "cat,1000,32,3,\nquery,20000000,64,20,1.2\nad,2000000,64,5,\n"


@pytest.fixture
def tables(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(CSV)
    return str(f)


def _shard(capsys, *argv):
    assert main(["shard", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_max_plans_bounds_the_search_and_gives_the_same_plan(tables, capsys):
    # a budget far under the ~18,000 plans these tables finish after, and a clock cap that cannot bind
    a = _shard(capsys, "--tables", tables, "--system", "dgx-a100", "--max-plans", "500", "--budget-s", "600")
    b = _shard(capsys, "--tables", tables, "--system", "dgx-a100", "--max-plans", "500", "--budget-s", "600")
    assert a["max_plans"] == 500 and a["max_plans_given"] is True
    assert a["search_stopped_by"] == "plan budget"
    # it stops at the first check past the budget: one move's neighbours (T x options) at most over
    assert 500 <= a["plans_evaluated"] < 500 + 5 * 200
    assert a["plan"] == b["plan"] and a["cost_ms"] == b["cost_ms"]
    # the search's own wall clock is a part of the run's; search_s stays for its readers
    assert 0 <= a["search_wall_s"] <= a["total_s"] == a["search_s"]


def test_the_api_passes_max_plans_through(tables):
    from kit.api import shard_tables

    r = shard_tables(tables, "dgx-a100", time_budget_s=600, max_plans=300)
    assert r["max_plans"] == 300 and r["search_stopped_by"] == "plan budget"
    with pytest.raises(KitError, match="max_plans"):
        shard_tables(tables, "dgx-a100", max_plans=0)
    with pytest.raises(KitError, match="at most"):
        shard_tables(tables, "dgx-a100", max_plans=10**12)


@pytest.mark.parametrize("value", ["0", "-3", "1.5", "abc", "inf", "nan", "1e12"])
def test_a_bad_max_plans_is_one_line(tables, capsys, value):
    assert main(["shard", "--tables", tables, "--system", "dgx-a100", "--max-plans", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --max-plans: expected" in err


def test_the_text_gives_the_searchs_time_not_the_runs(tables, capsys):
    r = _shard(capsys, "--tables", tables, "--system", "dgx-a100", "--max-plans", "300")
    # the total (cost model, search, exact re-pricing) had been printed as the search's time:
    # "18,079 plans priced in 1.01 s", of which the search took 0.13 s
    r["search_wall_s"], r["total_s"] = 0.25, 7.5
    out = text(r)
    assert "priced in 0.25 s of wall clock" in out and "7.50 s in all" in out
    assert "stopped at the 300 plans of --max-plans" in out


def test_max_plans_past_its_time_budget_does_not_blame_the_machine(tables, capsys):
    # 100,000,000 plans take ~667 s at PLANS_PER_S: under --budget-s 1e-6 the wall clock stops
    # them on any machine, which the text had put down to "this machine is slow or busy"
    from kit.sharding.search import PLANS_PER_S

    r = _shard(capsys, "--tables", tables, "--system", "dgx-a100", "--max-plans", "100000000",
               "--budget-s", "1e-6")
    assert r["search_stopped_by"] == "time budget"
    out = text(r)
    assert "slow or busy" not in out
    assert f"about {100_000_000 / PLANS_PER_S:.3g} s" in out and "--budget-s at least that" in out
    # a count the budget covers at PLANS_PER_S, stopped by the clock all the same: the machine's doing
    r.update(max_plans=1000, time_budget_s=1.0)
    assert "slow or busy" in text(r)
