"""kit.parallel.dlrm: model-parallel tables with all-to-all, data-parallel MLPs with all-reduce."""
import pytest

from kit.embedding import Table
from kit.errors import KitError
from kit.parallel.dlrm import DLRMSpec, greedy_placement, predict_dlrm

TABLES = tuple(Table(rows=100_000, dim=64, pooling=10) for _ in range(8))
SPEC = DLRMSpec(tables=TABLES, bottom=(256, 64), top=(256, 1))


def test_a_rank_holding_every_table_makes_the_others_wait_at_the_all_to_all():
    r = predict_dlrm(SPEC, "a100x4-nvlink", batch=1024, placement=[0] * 8, launch_us=0.0, keep=True)
    by = {x["rank"]: x for x in r["ranks"]}
    assert by[0]["tables"] == 8 and by[1]["tables"] == 0
    tl = r["_result"].timeline()
    bottom = tl[(tl["rank"] == 0) & (tl.name == "bottom mlp") & (tl.kind == "compute")].end_ms.iloc[0]
    a2a = tl[(tl.name == "all-to-all pooled embeddings") & (tl.kind == "comm")]
    # the all-to-all starts on every rank when rank 0 has run its bottom MLP and its lookups
    assert list(a2a.start_ms) == pytest.approx([bottom + by[0]["embedding_fwd_ms"]] * 4)
    # rank 1 has nothing to look up, so its forward all-to-all waits all of that (and its
    # gradient all-reduce waits again for rank 0's embedding backward)
    assert by[1]["wait_ms"] >= bottom + by[0]["embedding_fwd_ms"] - 1e-9
    assert by[0]["wait_ms"] == pytest.approx(0.0, abs=1e-9)
    balanced = predict_dlrm(SPEC, "a100x4-nvlink", batch=1024, launch_us=0.0)
    assert balanced["iteration_ms"] < r["iteration_ms"]
    assert [x["tables"] for x in balanced["ranks"]] == [2, 2, 2, 2]


def test_memory_counts_the_local_tables_and_their_optimizer_rows():
    r = predict_dlrm(SPEC, "a100x4-nvlink", batch=256, placement=[0, 0, 0, 1, 1, 2, 3, 3])
    m = {x["rank"]: x for x in r["memory_per_rank"]}
    assert m[0]["embedding_gib"] * 2**30 == pytest.approx(3 * 100_000 * 64 * 4)
    assert m[2]["embedding_optimizer_gib"] * 2**30 == pytest.approx(100_000 * 4)  # rowwise adagrad


def test_greedy_placement_balances_load_and_bad_placements_fail():
    tables = [Table(rows=10, dim=8, pooling=p) for p in (8, 1, 1, 1, 1, 1, 1, 1, 1)]
    where = greedy_placement(tables, 2)
    assert where.count(where[0]) == 1  # the heavy table (load 8 = the other eight) sits alone
    with pytest.raises(KitError, match="placement"):
        predict_dlrm(SPEC, "a100x4-nvlink", batch=8, placement=[9] * 8)
    with pytest.raises(KitError, match="dim"):
        DLRMSpec(tables=TABLES, bottom=(256, 32))


def test_the_mlp_gradient_all_reduce_waits_for_every_rank():
    # a data-parallel all-reduce starts when the last rank has its gradients: rank 0, holding
    # every table, runs its embedding backward before its bottom MLP's, and the other ranks had
    # run the all-reduce alone and finished the step before rank 0 started it
    r = predict_dlrm(SPEC, "a100x4-nvlink", batch=1024, placement=[0] * 8, launch_us=0.0, keep=True)
    tl = r["_result"].timeline()
    ar = tl[(tl.name == "all-reduce MLP grads") & (tl.kind == "comm")].sort_values("rank")
    assert len(ar) == 4
    last_bottom_bwd = tl[tl.name == "bottom mlp bwd"].end_ms.max()
    assert list(ar.start_ms) == pytest.approx([last_bottom_bwd] * 4)
    assert list(ar.end_ms) == pytest.approx([ar.end_ms.iloc[0]] * 4)
    # so every rank ends its step with the all-reduce, together
    assert [x["ms"] for x in r["ranks"]] == pytest.approx([r["iteration_ms"]] * 4)


def test_the_step_s_activations_count_against_the_memory():
    """Only the tables, their optimizer state and the MLPs had been counted: 16 tables of
    500,000 x 128 on a DGX A100 fitted at two million samples a rank in 0.5 GiB a rank."""
    from kit.parallel.dlrm import activation_bytes

    tables = tuple(Table(rows=500_000, dim=128, pooling=20) for _ in range(16))
    spec = DLRMSpec(tables=tables)
    small = predict_dlrm(spec, "dgx-a100", batch=2048, predictor="roofline")
    big = predict_dlrm(spec, "dgx-a100", batch=2_000_000, predictor="roofline")
    assert small["fits"] and not big["fits"]
    for r in (small, big):
        for m in r["memory_per_rank"]:
            parts = m["embedding_gib"] + m["embedding_optimizer_gib"] + m["mlp_gib"] + m["activation_gib"]
            assert m["total_gib"] == pytest.approx(parts, rel=1e-12)
    # linear in the batch: the saved tensors are per sample
    local = [t for t, p in zip(tables, small["placement"]) if p == 0]
    one, two = activation_bytes(spec, 1000, 8, local), activation_bytes(spec, 2000, 8, local)
    assert two == pytest.approx(2 * one, rel=1e-9) and one > 0
    # the pooled rows a rank sends grow with the world, its own samples' tensors do not
    assert activation_bytes(spec, 1000, 16, local) > one
    assert activation_bytes(spec, 1000, 16, []) == activation_bytes(spec, 1000, 8, [])
    # a bf16 model's MLP tensors are half; the fp32 pooled rows are not
    half = activation_bytes(DLRMSpec(tables=tables, dtype="bf16"), 1000, 8, local)
    assert one / 2 < half < one


def test_an_mlp_tensor_counts_once_and_the_pooled_rows_in_flight_not_with_the_top_side():
    """A Linear's saved input is the previous ReLU's saved output, one tensor; the pooled rows
    (and their gradients) live between the lookup and the interaction and back, while the
    interaction's and the top MLP's tensors do not. Counting both twice had put the commit's
    own example, 16 tables of 500,000 x 128 at a million samples a rank on 8 GPUs, at 54.4 GiB a
    rank where the peak is 25.5 GiB (MLPerf's 26 tables at 2048 a rank: 0.15 GiB for 0.07)."""
    from kit.parallel.dlrm import activation_bytes

    tables = tuple(Table(rows=500_000, dim=128, pooling=20) for _ in range(16))
    spec, B, W = DLRMSpec(tables=tables), 1000, 2
    wide = DLRMSpec(tables=tables, bottom=(512 + 100, 256, 128))
    one = activation_bytes(spec, B, W, tables[:1])
    # 100 more bottom units: their ReLU output, 4 bytes a sample, once
    assert activation_bytes(wide, B, W, tables[:1]) - one == B * 4 * 100
    # here the top side (4 x (17 x 128 + 264 + 2817) = 21,028 bytes a sample) outweighs the pooled
    # rows in flight (4 x 128 x (2 + 16) = 9,216), so one more owned table adds its indices and
    # offsets alone: 21 int64 for each of the world x batch samples
    assert activation_bytes(spec, B, W, tables[:2]) - one == W * B * 8 * 21
    # and once the pooled rows in flight outweigh the top side, they set the peak
    many = activation_bytes(spec, B, 8, tables[:8])
    assert many - activation_bytes(spec, B, 8, tables[:7]) == 8 * B * (8 * 21 + 4 * 128)
