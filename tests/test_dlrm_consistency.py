"""kit.parallel.dlrm prices a DLRM's embedding side as kit.sharding does for the same table-wise
plan: the lookups, the three all-to-alls (indices, pooled rows, their gradients) and each rank's
memory, and its default placement is kit.sharding's greedy baseline, which respects memory."""
import dataclasses

import pytest

from kit.embedding import Table
from kit.hardware.system import get_system
from kit.parallel.dlrm import DLRMSpec, greedy_placement, predict_dlrm
from kit.sharding import Option, ShardingModel
from kit.sharding.search import GREEDY_KEYS, greedy

# tables of one dim (DLRM's interaction needs it), different rows and pooling
MIXED = tuple(Table(rows=r, dim=64, pooling=p, name=f"t{i}")
              for i, (r, p) in enumerate([(2_000_000, 40), (50_000, 5), (800_000, 12), (3_000, 1),
                                          (400_000, 25), (120_000, 8), (10_000_000, 3), (60_000, 60)]))


def _spec(tables):
    return DLRMSpec(tables=tuple(tables), bottom=(128, 64), top=(128, 1))


def _sharding(tables, system, batch, placement, **kw):
    """kit.sharding's exact price of the table-wise plan `placement`, through its public API."""
    model = ShardingModel(list(tables), get_system(system), batch=batch, kinds=("tw",), **kw)
    return model, model.exact_cost([opts.index(Option("tw", (p,)))
                                    for opts, p in zip(model.options, placement)])


@pytest.mark.parametrize("system, placement", [("a100x4-nvlink", [0, 1, 2, 3, 0, 1, 2, 3]),
                                               ("a100x4-nvlink", [0, 0, 0, 0, 0, 1, 2, 3]),
                                               ("dgx-a100", [0, 1, 2, 3, 4, 5, 6, 7]),
                                               ("dgx-a100", [5, 5, 1, 1, 1, 2, 7, 7])])
def test_embedding_comm_and_lookups_are_kit_shardings_for_the_same_plan(system, placement):
    r = predict_dlrm(_spec(MIXED), system, batch=512, placement=placement, keep=True)
    _, ex = _sharding(MIXED, system, 512, placement)
    assert ex["input_alltoall_ms"] > 0
    assert r["input_all_to_all_ms"] == pytest.approx(ex["input_alltoall_ms"])
    assert r["all_to_all_ms"] == pytest.approx(ex["output_alltoall_ms"])
    assert r["grad_all_to_all_ms"] == pytest.approx(ex["grad_alltoall_ms"])
    assert r["embedding_comm_ms"] == pytest.approx(
        ex["output_alltoall_ms"] + ex["grad_alltoall_ms"] + ex["input_alltoall_ms"])
    # lookups and their backward with the optimizer, rank by rank
    assert [x["embedding_fwd_ms"] for x in r["ranks"]] == pytest.approx(ex["fwd_ms"])
    assert [x["embedding_bwd_ms"] for x in r["ranks"]] == pytest.approx(ex["bwd_ms"])
    # the index all-to-all is in the simulated iteration, before every lookup
    tl = r["_result"].timeline()
    idx = tl[(tl.name == "all-to-all indices") & (tl.kind == "comm")]
    assert len(idx) == r["world_size"]
    assert list(idx.end_ms - idx.start_ms) == pytest.approx([ex["input_alltoall_ms"]] * r["world_size"])
    look = tl[(tl.name == "embedding lookup") & (tl.kind == "compute")]
    assert (look.start_ms.to_numpy() >= idx.end_ms.min() - 1e-9).all()


def test_memory_is_kit_shardings_count_and_fits_is_false_over_the_gpu():
    big = tuple(Table(rows=60_000_000, dim=128, pooling=2) for _ in range(2))  # 28.6 GiB each
    spec = DLRMSpec(tables=big)
    over = predict_dlrm(spec, "a100x4-nvlink", batch=64, placement=[0, 0])  # 57 GiB on one 40 GB A100
    model, ex = _sharding(big, "a100x4-nvlink", 64, [0, 0])
    assert ex["over_memory_cap"] and over["fits"] is False
    assert [m["fits"] for m in over["memory_per_rank"]] == [False, True, True, True]
    assert over["memory_cap_gib"] == pytest.approx(model.cap / 2**30)
    got = [(m["embedding_gib"] + m["embedding_optimizer_gib"]) * 2**30 for m in over["memory_per_rank"]]
    assert got == pytest.approx(ex["memory_bytes"])
    ok = predict_dlrm(spec, "a100x4-nvlink", batch=64, placement=[0, 1])
    assert ok["fits"] is True and all(m["fits"] for m in ok["memory_per_rank"])
    # a cap of one's own, as `kit shard --memory-gib` takes
    capped = predict_dlrm(_spec(MIXED), "a100x4-nvlink", batch=64, memory_cap_gib=0.01)
    assert capped["fits"] is False and capped["memory_cap_gib"] == pytest.approx(0.01)


def test_greedy_placement_never_overfills_a_rank_when_a_fitting_one_exists():
    # one table with most of the lookups, four that each take 60% of a GPU: by load alone two big
    # ones share a rank (over its memory) while the heavy table's rank has room for one
    heavy = Table(rows=1_000, dim=128, pooling=200, name="heavy")
    rows = int(0.6 * get_system("a100x4-nvlink").gpu.memory_bytes / (128 * 4))
    tables = (heavy,) + tuple(Table(rows=rows, dim=128, pooling=1, name=f"big{i}") for i in range(4))
    blind = greedy_placement(tables, 4)  # no System, no memory to respect
    assert max(blind[1:].count(r) for r in range(4)) == 2
    r = predict_dlrm(DLRMSpec(tables=tables), "a100x4-nvlink", batch=256)
    assert r["fits"] is True and all(m["fits"] for m in r["memory_per_rank"])
    assert sorted(r["placement"][1:]) == [0, 1, 2, 3]
    model = ShardingModel(list(tables), get_system("a100x4-nvlink"), batch=256, kinds=("tw",))
    want = greedy(model, GREEDY_KEYS["greedy_dim_pooling"])  # kit.sharding's baseline
    assert r["placement"] == [model.options[t][o].ranks[0] for t, o in enumerate(want)]
    assert greedy_placement(tables, 4, model) == r["placement"]


def test_without_memory_pressure_the_greedy_is_the_same_with_or_without_a_model():
    model = ShardingModel(list(MIXED), get_system("dgx-a100"), batch=512, kinds=("tw",))
    assert greedy_placement(MIXED, 8) == greedy_placement(MIXED, 8, model)
    assert predict_dlrm(_spec(MIXED), "dgx-a100", batch=512)["placement"] == greedy_placement(MIXED, 8)


def test_one_gpu_holds_every_table_and_sends_nothing():
    """kit.sharding's all-to-all model had aborted the process on one rank (scipy's nnls on an
    empty fit: a double free), so predict_dlrm refused a one-GPU system."""
    one = dataclasses.replace(get_system("dgx-a100"), gpus_per_node=1)
    r = predict_dlrm(_spec(MIXED), one, batch=64)
    assert r["placement"] == [0] * len(MIXED) and r["embedding_comm_ms"] == 0.0 and r["allreduce_ms"] == 0.0
    assert r["iteration_ms"] > r["ranks"][0]["embedding_fwd_ms"] + r["ranks"][0]["embedding_bwd_ms"] > 0
    model = ShardingModel(list(MIXED), one, batch=64, kinds=("tw",))
    assert model.exact_cost([0] * len(MIXED))["output_alltoall_ms"] == 0.0


def test_fits_counts_the_mlps_as_the_memory_table_does():
    """fits compared the tables and their optimizer state alone with the cap while total_gib
    beside it also held the MLPs: a rank over its cap read fits True (review)."""
    rows = int(35.5 * 2**30 / 512)
    tables = tuple(Table(rows=rows, dim=128, pooling=20) for _ in range(4))
    r = predict_dlrm(DLRMSpec(tables=tables, top=(8192, 8192, 4096, 1)), "a100x4-nvlink", batch=64)
    for row in r["memory_per_rank"]:
        assert row["fits"] == (row["total_gib"] <= r["memory_cap_gib"])
    assert r["fits"] == all(row["fits"] for row in r["memory_per_rank"])
    assert not r["fits"]
