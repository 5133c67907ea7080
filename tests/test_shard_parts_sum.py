"""A plan's per-shard times add up to its per-rank times, and two tables of one name are one error
on every path in (CSV, Python API, plan_sharding).

The shards had been priced alone under the vectorised model while a rank was priced as one fused
kernel with its launch and backward floors: the README's rank 0 showed shards of 0.029 ms in all
against a rank time of 0.139 ms."""
import json
import re

import pytest

from kit.embedding import Table, Zipf
from kit.errors import KitError
from kit.sharding import ShardingModel, baselines, plan_sharding
from kit.sharding.planner import _fixed_shares, shards
from sharding_support import StandInComm, StandInSystem

README_CSV = "name,rows,dim,pooling,zipf_alpha\nuser,10000000,128,1,1.1\nitem,5000000,128,20,1.05\nad,1000000,64,4,\n"


def _rank_sums(entries, world):
    out = [0.0] * world
    for s in entries:
        out[s["rank"]] += s["lookup_ms"]
    return out


def _check_parts(entries, priced, world):
    assert _rank_sums(entries, world) == pytest.approx(priced["per_rank_ms"], rel=1e-12, abs=1e-15)
    for s in entries:
        assert s["lookup_ms"] == pytest.approx(s["own_ms"] + s["fixed_ms"], rel=1e-12)
        assert s["own_ms"] > 0 and s["fixed_ms"] >= 0
    fixed = [0.0] * world
    for s in entries:
        fixed[s["rank"]] += s["fixed_ms"]
    assert fixed == pytest.approx(priced["fixed_ms"], rel=1e-12, abs=1e-15)


def test_readme_plan_shards_add_up_to_each_rank_in_json_and_text(tmp_path, capsys):
    pytest.importorskip("kit.comm")
    from kit.cli import main
    from kit.cli.cmd_shard import text

    f = tmp_path / "tables.csv"
    f.write_text(README_CSV)
    assert main(["shard", "--tables", str(f), "--system", "dgx-a100", "--budget-s", "0.3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    W = r["world_size"]
    _check_parts(r["shards"], {"per_rank_ms": r["per_rank_ms"], "fixed_ms": r["parts"]["fixed_ms"]}, W)
    assert r["parts"]["fixed_ms"][0] > 0.5 * r["per_rank_ms"][0]  # the part the shards had left out
    for name, entries in r["baseline_shards"].items():  # their ranks: fixed + own, as the search's
        by_rank = _rank_sums(entries, W)
        for s in entries:
            assert s["fixed_ms"] > 0
        assert max(by_rank) > 0.1  # the item table's rank: 0.088 ms of its own + the floors
    rows = re.findall(r"rank +(\d+) +([\d.]+) ms +\(fixed ([\d.]+)\)", text(r))
    assert len(rows) == W
    sums = _rank_sums(r["shards"], W)
    for rank, ms, fixed in rows:
        assert float(ms) == pytest.approx(sums[int(rank)], abs=5e-4)
        assert float(fixed) == pytest.approx(r["parts"]["fixed_ms"][int(rank)], abs=5e-4)


def test_every_baseline_and_a_mixed_plan_add_up_with_an_idle_rank():
    tabs = [Table(rows=10**6, dim=64, pooling=8, name="a", distribution=Zipf(1.05)),
            Table(rows=500, dim=32, pooling=2, name="b"), Table(rows=2 * 10**5, dim=64, pooling=3, name="c")]
    m = ShardingModel(tabs, StandInSystem(4, 4), comm=StandInComm(), batch=128)
    kinds = [[o.kind for o in opts] for opts in m.options]
    plans = list(baselines(m).values()) + [[kinds[0].index("rw"), kinds[1].index("dp"), kinds[2].index("tw")]]
    plans.append([0, 0, 0])  # all on rank 0: ranks 1-3 idle, no shards and no time
    for choice in plans:
        priced = m.exact_cost(choice)
        _check_parts(shards(m, choice, priced), priced, m.world)
    assert m.exact_cost([0, 0, 0])["per_rank_ms"][1:] == [0.0, 0.0, 0.0]


def test_fixed_cost_split_in_proportion_to_own_time():
    assert _fixed_shares([1.0, 3.0], 2.0) == pytest.approx([0.5, 1.5])
    assert _fixed_shares([0.0, 0.0], 2.0) == pytest.approx([1.0, 1.0])  # none: equally


def _twice():
    return [Table(rows=1000, dim=16, pooling=2, name="a"), Table(rows=2000, dim=16, pooling=1, name="a")]


def test_python_api_rejects_two_tables_of_one_name_as_the_cli_does(tmp_path, capsys):
    pytest.importorskip("kit.hardware.system")
    from kit.api import shard_tables
    from kit.cli import main

    with pytest.raises(KitError, match=r"tables\[1\]: table name 'a' appears twice \(first at tables\[0\]\)"):
        shard_tables(_twice(), "dgx-a100", time_budget_s=0.1)
    with pytest.raises(KitError, match="table name 'a' appears twice"):
        plan_sharding(_twice(), StandInSystem(4, 4), comm=StandInComm(), time_budget_s=0.1)
    f = tmp_path / "t.csv"
    f.write_text("name,rows,dim,pooling\na,1000,16,2\nb,10,16,1\na,2000,16,1\n")
    with pytest.raises(KitError, match=r"line 4: table name 'a' appears twice \(first at .* line 2\)"):
        shard_tables(str(f), "dgx-a100", time_budget_s=0.1)
    assert main(["shard", "--tables", str(f), "--system", "dgx-a100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 4: table name 'a' appears twice" in err


def test_unnamed_tables_are_not_duplicates():
    tabs = [Table(rows=1000, dim=16, pooling=2), Table(rows=1000, dim=16, pooling=2)]
    r = plan_sharding(tabs, StandInSystem(4, 4), comm=StandInComm(), time_budget_s=0.1)
    assert [p["table"] for p in r["plan"]] == ["t0", "t1"]
