"""The sharding planner against hand-priced plans, brute force, and the greedy baselines.

kit.comm is stood in by a small linear all-to-all model here, so these tests check the planner,
not the collective model: a2a = 10 us + busiest rank's max(sent, received) / 100 GB/s.
"""
import itertools

import numpy as np
import pytest

from kit.embedding import Table, Uniform, Zipf, lookup_cost
from kit.errors import KitError
from kit.sharding import (ShardingModel, baselines, exhaustive, greedy, local_search, options_for,
                          plan_sharding, read_tables)
from kit.sharding.search import GREEDY_KEYS
from sharding_support import GPU, StandInComm, StandInSystem


def model_for(tables, world=4, g=4, **kw):
    return ShardingModel(tables, StandInSystem(world, g), comm=StandInComm(), **kw)


def huge(dim=64, pooling=8, name="t"):
    """10^9 uniform rows: no L2 reuse, so a shard's cost does not depend on its L2 share."""
    return Table(rows=10**9, dim=dim, pooling=pooling, name=name, distribution=Uniform())


def test_options_by_kind_and_width():
    wide, narrow = Table(rows=100, dim=64, pooling=1), Table(rows=100, dim=16, pooling=1)
    assert len(options_for(wide, 4, 4)) == 4 + 4 + 4 + 1 + 1  # tw, cw2, cw4, rw, dp
    assert len(options_for(narrow, 4, 4)) == 4 + 1 + 1  # no shard narrower than 16 columns
    two_nodes = options_for(wide, 8, 4)
    assert sum(o.kind == "twrw" for o in two_nodes) == 2
    assert [o.ranks for o in two_nodes if o.kind == "twrw"] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_a_table_wise_plan_priced_by_hand():
    b, W = 256, 4
    tabs = [huge(64, 8, "a"), huge(128, 4, "b")]
    m = model_for(tabs, batch=b, memory_cap_bytes=1e15)
    choice = np.array([0, 2])  # a on rank 0, b on rank 2
    assert m.labels(choice) == ["tw@0", "tw@2"]
    fa = lookup_cost(tabs[0], b * W, GPU).time_ms
    fb = lookup_cost(tabs[1], b * W, GPU).time_ms
    ba = lookup_cost(tabs[0], b * W, GPU, backward=True, optimizer="rowwise_adagrad").time_ms
    bb = lookup_cost(tabs[1], b * W, GPU, backward=True, optimizer="rowwise_adagrad").time_ms
    # pooled output: a's owner sends b·64·4 B to each of 3 ranks, b's owner b·128·4 B
    out = np.zeros((W, W))
    out[0, [1, 2, 3]] = b * 64 * 4
    out[2, [0, 1, 3]] = b * 128 * 4
    idx = np.zeros((W, W))
    idx[[1, 2, 3], 0] = b * (8 + 1) * 8
    idx[[0, 1, 3], 2] += b * (4 + 1) * 8
    a2a = StandInComm.predict_alltoallv
    expect = max(fa, fb) + max(ba, bb) + 2 * a2a(out, None) + a2a(idx, None)
    assert m.cost(choice[None])[0] == pytest.approx(expect, rel=1e-5)
    exact = m.exact_cost(choice)
    assert exact["cost_ms"] == pytest.approx(expect, rel=1e-6)
    assert exact["per_rank_ms"][1] == 0 and exact["per_rank_ms"][0] == pytest.approx(fa + ba)


def test_data_parallel_all_reduces_the_dense_gradient():
    tab = huge(32, 2, "small")
    m = model_for([tab], memory_cap_bytes=1e15)
    dp = next(o for o, opt in enumerate(m.options[0]) if opt.kind == "dp")
    d = m.describe([dp])
    assert d["allreduce_ms"] == pytest.approx(0.02 + 2 * (4 * 10**9 * 32) / 100e9 * 1e3, rel=1e-4)
    assert d["output_alltoall_ms"] == 0 and d["input_alltoall_ms"] == 0


def test_data_parallel_gradient_is_in_the_tables_dtype():
    # the all-reduce was priced at 4 bytes per element whatever the table's dtype
    def allreduce_ms(dtype):
        tab = Table(rows=10**9, dim=32, pooling=2, name="small", dtype=dtype)
        m = model_for([tab], memory_cap_bytes=1e15)
        dp = next(o for o, opt in enumerate(m.options[0]) if opt.kind == "dp")
        return m.describe([dp])["allreduce_ms"]

    for dtype, nbytes in (("fp32", 4), ("fp16", 2), ("bf16", 2)):
        assert allreduce_ms(dtype) == pytest.approx(0.02 + 2 * (nbytes * 10**9 * 32) / 100e9 * 1e3, rel=1e-4)


def test_a_data_parallel_replica_counts_its_dense_gradient_against_the_cap():
    """Every rank holds the replica's rows and the dense gradient the step writes and
    all-reduces; the cap had counted the rows alone, so a table fitting only once was placed
    data-parallel on a GPU that cannot hold it twice."""
    tab = Table(rows=10**7, dim=64, pooling=4, name="t")  # 2.56 GB of fp32 rows
    weights = tab.rows * tab.dim * 4
    roomy = model_for([tab], memory_cap_bytes=1e15, optimizer="sgd")
    dp = next(o for o, opt in enumerate(roomy.options[0]) if opt.kind == "dp")
    tw = next(o for o, opt in enumerate(roomy.options[0]) if opt.kind == "tw")
    assert roomy.describe([dp])["memory_bytes"] == [2 * weights] * 4
    assert max(roomy.describe([tw])["memory_bytes"]) == weights  # a shard's rows have no dense gradient
    tight = model_for([tab], memory_cap_bytes=1.5 * weights, optimizer="sgd")
    assert np.isinf(tight.cost(np.array([[dp]]))[0]) and np.isfinite(tight.cost(np.array([[tw]]))[0])


def test_memory_cap_forces_big_tables_off_one_rank():
    big = Table(rows=10**8, dim=64, pooling=4, name="big")  # 25.6 GB of weights
    m = model_for([big], memory_cap_bytes=10e9)
    tw = [o for o, opt in enumerate(m.options[0]) if opt.kind == "tw"]
    assert np.all(np.isinf(m.cost(np.array(tw)[:, None])))
    g = greedy(m, GREEDY_KEYS["greedy_size"])
    assert m.options[0][g[0]].kind == "rw" and np.isfinite(m.cost(g[None])[0])
    with pytest.raises(KitError, match="memory cap"):
        plan_sharding([big], StandInSystem(), memory_cap_gib=1.0, comm=StandInComm())


def test_greedy_by_size_by_hand():
    tabs = [Table(rows=r, dim=64, pooling=1, name=str(r)) for r in (800, 400, 200, 100)]
    m = model_for(tabs, world=2, g=2)
    ranks = [m.options[t][o].ranks[0] for t, o in enumerate(greedy(m, GREEDY_KEYS["greedy_size"]))]
    assert ranks == [0, 1, 1, 1]  # 800 | 400, then 200 and 100 join the lighter rank


def small_case(seed):
    rng = np.random.default_rng(seed)
    tabs = [Table(rows=int(10 ** rng.uniform(4, 8)), dim=int(rng.choice([16, 32, 64])),
                  pooling=float(rng.integers(1, 60)), name=f"t{i}",
                  distribution=Zipf(float(rng.uniform(0.3, 1.3)))) for i in range(4)]
    return model_for(tabs, world=2, g=2, batch=int(rng.choice([128, 512, 2048])))


def test_exhaustive_agrees_with_pricing_each_plan_alone():
    m = small_case(1)
    choice, cost, total = exhaustive(m)
    plans = list(itertools.product(*[range(n) for n in m.n_options]))
    assert total == len(plans)
    ref = min(float(m.cost(np.array(p)[None])[0]) for p in plans)
    assert cost == pytest.approx(ref, rel=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_search_finds_the_optimum_and_never_loses_to_greedy(seed):
    m = small_case(seed)
    best, cost, n, pool = local_search(m, time_budget_s=5.0, seed=seed, patience=10)
    _, opt, _ = exhaustive(m)
    base = min(float(m.cost(c[None])[0]) for c in baselines(m).values())
    assert cost <= base + 1e-9
    assert cost == pytest.approx(opt, rel=1e-6)
    assert cost == pytest.approx(float(m.cost(best[None])[0]), rel=1e-6)


def test_plan_sharding_result_shape_and_guarantee():
    rng = np.random.default_rng(5)
    tabs = [Table(rows=int(10 ** rng.uniform(4, 7)), dim=int(rng.choice([32, 64, 128])),
                  pooling=float(rng.integers(1, 40)), name=f"t{i}",
                  distribution=Zipf(float(rng.uniform(0.5, 1.2)))) for i in range(12)]
    r = plan_sharding(tabs, StandInSystem(8, 8), batch=512, time_budget_s=1.0, comm=StandInComm())
    assert {"plan", "cost_ms", "per_rank_ms", "baselines", "plans_evaluated", "search_s"} <= set(r)
    assert len(r["plan"]) == 12 and len(r["per_rank_ms"]) == 8
    assert r["cost_ms"] <= min(v for v in r["baselines"].values() if v is not None) + 1e-9
    assert r["imbalance"] == pytest.approx(max(r["per_rank_ms"]) / np.mean(r["per_rank_ms"]))


def test_read_tables(tmp_path):
    good = tmp_path / "t.csv"
    good.write_text("name,rows,dim,pooling,zipf_alpha\nu,1000,16,4,1.1\nv,50,8,1,\n")
    t = read_tables(good)
    assert [x.name for x in t] == ["u", "v"] and t[0].distribution.alpha == 1.1
    assert isinstance(t[1].distribution, Uniform)
    cases = {"name,rows,dim\na,1,2\n": "missing column",
             "name,rows,dim,pooling\na,10,2,0\n": "positive",
             "name,rows,dim,pooling\na,1.5,2,1\n": "whole",
             "name,rows,dim,pooling\na,1,2,1\na,3,4,1\n": "twice",
             "name,rows,dim,pooling\n": "no tables",
             "name,rows,dim,pooling\na,1,2,1,9\n": "more fields",
             "name,rows,dim,pooling,zipf_alpha\na,1,2,1,-1\n": "zipf_alpha"}
    for text, msg in cases.items():
        bad = tmp_path / "bad.csv"
        bad.write_text(text)
        with pytest.raises(KitError, match=msg):
            read_tables(bad)
    with pytest.raises(KitError, match="not found"):
        read_tables(tmp_path / "missing.csv")


def test_lookup_costs_are_cached_per_dtype_and_distribution_not_per_name():
    # unnamed tables once shared one cache entry: the first table's cost went to both
    shape = dict(rows=10**6, dim=64, pooling=20)
    for a, b in ((dict(dtype="fp16"), dict(dtype="fp32")),
                 (dict(distribution=Uniform()), dict(distribution=Zipf(0.9)))):
        for tabs in ([Table(**shape, **a), Table(**shape, **b)], [Table(**shape, **b), Table(**shape, **a)]):
            m = model_for(tabs)
            want = []
            for t, tab in enumerate(tabs):  # option 0: table-wise on rank 0, the whole batch
                r = lookup_cost(tab, m.batch * m.world, GPU, l2_share=float(m.l2_shares[t]))
                want.append(r.time_ms - r.parts["launch_ms"])
            assert m.contrib[:, 0, 0] == pytest.approx(want, rel=1e-12)
            assert want[0] != pytest.approx(want[1], rel=1e-3)
    # equal tables under different names share an entry
    m = model_for([Table(**shape, name="a"), Table(**shape, name="b")])
    assert m.contrib[0, 0, 0] == m.contrib[1, 0, 0]
    assert len(m._lookup_cache) == len(model_for([Table(**shape, name="a")])._lookup_cache)
