"""Bad input to the embedding, sharding and DLRM Python API: one KitError naming the argument
(an audit found TypeError, AttributeError, ValueError and ZeroDivisionError tracebacks)."""
import numpy as np
import pytest

from kit.embedding import Table, Uniform, Zipf, lookup_cost
from kit.embedding.index_streams import Empirical, ReuseHistogram
from kit.embedding.replay import lru_hit_rate
from kit.errors import KitError, real_number
from kit.parallel.dlrm import DLRMSpec, predict_dlrm
from kit.sharding import plan_sharding

TABLES = tuple(Table(rows=1000, dim=16, pooling=2) for _ in range(4))
SPEC = DLRMSpec(tables=TABLES, bottom=(32, 16), top=(32, 1))
SYSTEM = "a100x4-nvlink"
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("kw,word", [
    ({"launch_us": "10"}, "launch_us"), ({"launch_us": True}, "launch_us"),
    ({"memory_cap_gib": "1"}, "memory_cap_gib"), ({"memory_cap_gib": True}, "memory_cap_gib"),
    ({"memory_cap_gib": 1e6}, "memory_cap_gib"),  # more than the A100's 40 GiB: 'fits' was True
    ({"keep": "no"}, "keep"), ({"placement": 3}, "placement"), ({"predictor": 3}, "predictor"),
])
def test_predict_dlrm_names_the_bad_argument(kw, word):
    with pytest.raises(KitError, match=word):
        predict_dlrm(SPEC, SYSTEM, batch=8, **kw)


def test_predict_dlrm_wants_a_spec():
    with pytest.raises(KitError, match="DLRMSpec"):
        predict_dlrm({"tables": TABLES}, SYSTEM, batch=8)


@pytest.mark.parametrize("kw,word", [
    ({"tables": (1, 2)}, "kit.embedding.Table"), ({"tables": "ab"}, "kit.embedding.Table"),
    ({"tables": TABLES, "bottom": 16}, "bottom MLP"), ({"tables": TABLES, "top": 1}, "top MLP"),
])
def test_dlrm_spec_refuses_what_is_not_tables_or_widths(kw, word):
    with pytest.raises(KitError, match=word):
        DLRMSpec(**kw)


@pytest.mark.parametrize("kw,word", [
    ({"l2_share": "1"}, "l2_share"), ({"l2_share": True}, "l2_share"),
    ({"correction": "x"}, "correction"),
])
def test_lookup_cost_names_the_bad_argument(kw, word):
    with pytest.raises(KitError, match=word):
        lookup_cost(list(TABLES), 8, "A100", **kw)


def test_lookup_cost_refuses_tables_that_are_not_a_list():
    with pytest.raises(KitError, match="tables"):
        lookup_cost(3, 8, "A100")


def test_a_numpy_batch_is_a_whole_number():
    # 'batch must be a positive whole number, got np.int64(8)' had refused it
    assert lookup_cost(list(TABLES), np.int64(8), "A100").time_ms == \
        pytest.approx(lookup_cost(list(TABLES), 8, "A100").time_ms)


def test_a_table_of_numpy_sizes_is_the_table_of_those_numbers():
    # 'rows must be a positive whole number, got np.int64(1000)' had refused sizes read from a
    # pandas column; they are kept as Python numbers, so the two tables are one
    t = Table(rows=np.int64(1000), dim=np.int32(16), pooling=np.float32(2.0))
    assert t == TABLES[0] and type(t.rows) is int and type(t.dim) is int and type(t.pooling) is float
    assert lookup_cost(t, 8, "A100").time_ms == lookup_cost(TABLES[0], 8, "A100").time_ms
    for bad in ({"rows": np.float64(1000.0)}, {"dim": np.int64(0)}, {"pooling": np.float64("nan")}):
        with pytest.raises(KitError, match=next(iter(bad))):
            Table(**{"rows": 1000, "dim": 16, "pooling": 2, **bad})


@pytest.mark.parametrize("dists", [["zipf:1.05"] * 3, [1.05, 1.2], [Zipf(1.1), None, Uniform()]])
def test_a_per_table_distribution_list_of_the_wrong_length_says_so(dists):
    # it had been read as one index tensor: "index tensor must be a non-empty array of whole numbers"
    with pytest.raises(KitError, match=f"{len(dists)} distributions for 4 tables"):
        lookup_cost(list(TABLES), 8, "A100", distribution=dists)
    assert lookup_cost(list(TABLES), 8, "A100", distribution=[0, 1, 2]).time_ms > 0  # an index tensor


@pytest.mark.parametrize("kw,word", [
    ({"seed": "x"}, "seed"), ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"),
    ({"memory_cap_gib": "3"}, "memory_cap_gib"), ({"memory_cap_gib": True}, "memory_cap_gib"),
    ({"time_budget_s": True}, "time_budget_s"),
    ({"kinds": None}, "kinds"), ({"kinds": 3}, "kinds"), ({"comm": "nccl"}, "comm"),
])
def test_plan_sharding_names_the_bad_argument(kw, word):
    with pytest.raises(KitError, match=word):
        plan_sharding(list(TABLES), SYSTEM, batch=8, **{"time_budget_s": 0.05, **kw})


def test_plan_sharding_refuses_what_is_not_a_system():
    with pytest.raises(KitError, match="system"):
        plan_sharding(list(TABLES), 3, batch=8)


def test_plan_sharding_takes_a_kinds_string_and_a_numpy_batch():
    r = plan_sharding(list(TABLES), SYSTEM, batch=np.int64(8), kinds="tw", time_budget_s=0.05)
    assert {p["kind"] for p in r["plan"]} == {"tw"} and r["batch_per_rank"] == 8


@pytest.mark.parametrize("stream,capacity,word", [
    ([], 10, "stream"), (5, 3, "stream"), (np.zeros((2, 2), dtype=int), 3, "stream"),
    ([1, 2], "10", "capacity"), ([1, 2, 1], -1, "capacity"),
])
def test_lru_hit_rate_names_the_bad_argument(stream, capacity, word):
    with pytest.raises(KitError, match=word) as e:
        lru_hit_rate(stream, capacity)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("dist", [Zipf(1.0), Uniform(), Empirical(np.arange(10)),
                                  ReuseHistogram.from_indices(np.array([1, 2, 1, 3, 1]))])
@pytest.mark.parametrize("n", [-1, "5", 1.5, True])
def test_sample_refuses_a_count_that_is_not_a_whole_number(dist, n):
    with pytest.raises(KitError, match="n "):
        dist.sample(n, 10)


def test_sample_wants_a_numpy_generator():
    with pytest.raises(KitError, match="rng"):
        Zipf(1.0).sample(5, 10, rng=3)
    assert Zipf(1.0).sample(0, 10).size == 0


@pytest.mark.parametrize("value", ["1", True, NAN, INF, -1, 10**400, None])
def test_real_number_refuses_what_is_not_a_finite_number(value):
    with pytest.raises(KitError, match="x must be a finite number >= 0"):
        real_number(value, "x")


def test_real_number_bounds():
    assert real_number(np.float32(0.5), "x", strict=True, high=1.0) == 0.5
    with pytest.raises(KitError, match="> 0 and <= 1"):
        real_number(0, "x", strict=True, high=1.0)


def test_per_table_index_tensors_of_different_lengths_are_one_kit_error():
    # 3 per-table tensors of 100, 10 and 100 ids for 4 tables were read as one index tensor, and
    # numpy's ValueError ('inhomogeneous shape') came out as a traceback
    a = np.arange(100) % 50
    with pytest.raises(KitError, match="one per table"):
        lookup_cost(list(TABLES), 8, "A100", distribution=[a, a[:10], a])
    with pytest.raises(KitError, match="one per table"):
        Empirical([[0, 1], [2]])
    assert lookup_cost(list(TABLES), 8, "A100", distribution=[a, a[:10], a, a]).time_ms > 0  # one each
