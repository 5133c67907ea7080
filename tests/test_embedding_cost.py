"""Embedding-bag cost against hand computations of the bytes it must move."""
import math

import pytest

from kit.embedding import Table, Zipf, l2_bw_gbs, lookup_cost
from kit.embedding import cost as C
from kit.errors import KitError
from kit.hardware import get_gpu

GPU = "a100-sxm4-40gb"


def test_no_reuse_forward_moves_every_row_from_dram():
    # 10^9 rows, uniform: essentially every lookup is a distinct row, nothing hits L2
    t = Table(rows=10**9, dim=64, pooling=10)
    b = 8192
    r = lookup_cost(t, b, GPU, "uniform")
    n = b * 10
    row = 64 * 4
    assert r.parts["unique_rows"] == pytest.approx(n, rel=1e-3)
    assert r.parts["hit_rate"] < 1e-3
    expect_bytes = n * row + n * 8 + b * 64 * 4 + (b + 1) * 8
    assert r.parts["dram_bytes"] == pytest.approx(expect_bytes, rel=1e-3)
    gpu = get_gpu(GPU)
    expect_ms = C.LAUNCH_MS + expect_bytes / (C.DRAM_GATHER_EFF * gpu.mem_bw_gbs * 1e9) * 1e3
    assert r.time_ms == pytest.approx(expect_ms, rel=1e-3)


def test_rows_are_moved_in_whole_sectors():
    small = Table(rows=10**9, dim=2, pooling=4)  # 8-byte rows cost a 32-byte sector each
    r = lookup_cost(small, 4096, GPU)
    n = 4096 * 4
    assert r.parts["dram_bytes"] == pytest.approx(n * 32 + n * 8 + 4096 * 8 + 4097 * 8, rel=1e-3)


def test_skew_raises_hit_rate_and_lowers_time():
    t = Table(rows=10**7, dim=128, pooling=30)
    res = [lookup_cost(t, 4096, GPU, Zipf(a)) for a in (0.0, 0.8, 1.1, 1.4)]
    hits = [r.parts["hit_rate"] for r in res]
    times = [r.time_ms for r in res]
    assert all(a < b for a, b in zip(hits, hits[1:]))
    assert all(a > b for a, b in zip(times, times[1:]))


def test_tables_in_one_fused_kernel_share_l2():
    hot = Table(rows=10**7, dim=128, pooling=30, distribution=Zipf(1.1))
    alone = lookup_cost(hot, 4096, GPU)
    crowd = lookup_cost([hot] + [Table(rows=10**7, dim=128, pooling=30, distribution=Zipf(1.1))] * 3,
                        4096, GPU)
    assert crowd.per_table[0]["hit_rate"] < alone.parts["hit_rate"]
    # unfused: each table has the whole L2 to itself, and a kernel launch of its own
    apart = lookup_cost([hot] * 4, 4096, GPU, fused=False)
    assert apart.per_table[0]["hit_rate"] == pytest.approx(alone.parts["hit_rate"])
    assert apart.parts["launch_ms"] == pytest.approx(4 * C.LAUNCH_MS)


def test_backward_bytes_by_hand_and_adagrad_adds_its_state():
    t = Table(rows=2**24, dim=32, pooling=5)  # 24-bit ids: 3 radix passes of 8 bits
    b = 1024
    sgd = lookup_cost(t, b, GPU, "uniform", backward=True)
    ada = lookup_cost(t, b, GPU, "uniform", backward=True, optimizer="rowwise_adagrad")
    n, u, row = b * 5, sgd.parts["unique_rows"], 32 * 4
    sort = n * (8 + 4) * 2 * 3
    grad_out = b * 32 * 4  # fits L2: read once from DRAM
    assert sgd.parts["dram_bytes"] == pytest.approx(sort + grad_out + 2 * u * row, rel=1e-6)
    assert ada.parts["dram_bytes"] - sgd.parts["dram_bytes"] == pytest.approx(2 * u * 32, rel=1e-6)
    assert ada.time_ms > sgd.time_ms


def test_small_batches_are_latency_bound():
    t = Table(rows=10**8, dim=64, pooling=1)
    tiny, big = lookup_cost(t, 8, GPU), lookup_cost(t, 2**16, GPU)
    per_row_tiny = (tiny.time_ms - C.LAUNCH_MS) / 8
    per_row_big = (big.time_ms - C.LAUNCH_MS) / 2**16
    assert per_row_tiny > 10 * per_row_big


def test_l2_bandwidth_is_derived_per_architecture():
    v100 = get_gpu("v100-sxm2-32gb")
    assert l2_bw_gbs(v100) == pytest.approx(19.5 * 80 * 1.53, rel=1e-9)
    a100 = get_gpu(GPU)
    assert l2_bw_gbs(a100) > a100.mem_bw_gbs  # L2 is faster than DRAM


def test_bad_inputs_are_kit_errors():
    t = Table(rows=100, dim=8, pooling=2)
    with pytest.raises(KitError, match="optimizer"):
        lookup_cost(t, 8, GPU, backward=True, optimizer="adam")
    with pytest.raises(KitError, match="batch"):
        lookup_cost(t, 0, GPU)
    with pytest.raises(KitError, match="unknown GPU"):
        lookup_cost(t, 8, "no-such-gpu")
    with pytest.raises(KitError, match="rows"):
        Table(rows=-1, dim=8, pooling=2)
    with pytest.raises(KitError, match="pooling"):
        Table(rows=10, dim=8, pooling=math.nan)
    with pytest.raises(KitError, match="distribution"):
        lookup_cost(t, 8, GPU, "gaussian")


def test_backward_time_is_kernel_floors_plus_memory_time():
    small = Table(rows=1000, dim=16, pooling=2)  # 256 lookups: one-tile sort, floors dominate
    r = lookup_cost(small, 128, GPU, backward=True)
    floors = C.BWD_HELPER_KERNELS * C.HELPER_KERNEL_MS + C.BWD_MAIN_KERNELS * C.MAIN_KERNEL_FLOOR_MS
    assert r.parts["launch_ms"] == pytest.approx(floors)
    assert r.time_ms == pytest.approx(floors + max(r.parts["dram_ms"], r.parts["l2_ms"]))
    big = lookup_cost(Table(rows=2**20, dim=16, pooling=2), 4096, GPU, backward=True)  # 8192 keys
    # a multi-tile sort: histogram + exclusive sum + one onesweep per 8-bit pass (20 bits: 3)
    assert big.parts["launch_ms"] == pytest.approx(floors + 2 * C.HELPER_KERNEL_MS + 3 * C.SORT_PASS_MS)


def test_distributions_per_table():
    a, b = Table(rows=10**6, dim=32, pooling=10), Table(rows=10**6, dim=32, pooling=10)
    r = lookup_cost([a, b], 2048, GPU, [0.0, 1.2])
    assert r.per_table[0]["distribution"] == "uniform" and r.per_table[1]["distribution"] == "zipf(1.2)"
    assert r.per_table[1]["unique_rows"] < r.per_table[0]["unique_rows"]
    r2 = lookup_cost([a, b], 2048, GPU, ["uniform", Zipf(1.2)])
    assert r2.parts["unique_rows"] == pytest.approx(r.parts["unique_rows"])


@pytest.mark.parametrize("gpu", ["v100-sxm2-32gb", "a100-sxm4-80gb", "h100-sxm"])
def test_forward_is_bounded_by_l2_bandwidth_and_skew_never_slows_it(gpu):
    # hits were the only L2 traffic, so a skewed lookup came out faster than every row read
    # passing through the L2 allows, and more skew (more hits) could make it slower
    from kit.embedding import Zipf, lookup_cost
    from kit.embedding.cost import l2_bw_gbs

    g = get_gpu(gpu)
    times = []
    for alpha in (1.05, 1.2, 1.5, 2.0, 3.0):
        tabs = [Table(rows=100_000, dim=32, pooling=80, name=f"t{i}", distribution=Zipf(alpha))
                for i in range(4)]
        c = lookup_cost(tabs, 65536, g)
        floor_ms = c.parts["lookups"] * tabs[0].sector_row_bytes / (l2_bw_gbs(g) * 1e9) * 1e3
        assert c.time_ms - c.parts["launch_ms"] >= floor_ms * (1 - 1e-9)
        times.append(c.time_ms)
    assert all(b <= a * (1 + 1e-9) for a, b in zip(times, times[1:]))


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_backward_never_slower_for_a_smaller_table(optimizer):
    # the backward's bandwidth was capped by the unique rows in flight for every byte it moves,
    # so a 1-row table sorted and read 40,960 lookups' gradients at under 1 GB/s: 3.7 ms (3 rows:
    # 1.3) against 0.15 ms for a million rows. Only the row and state updates are few when the
    # rows are.
    times = [lookup_cost([Table(rows=rows, dim=128, pooling=10)], 4096, GPU, backward=True,
                         optimizer=optimizer).time_ms for rows in (1, 3, 100, 10**4, 10**6, 10**8)]
    assert all(a <= b * (1 + 1e-9) for a, b in zip(times, times[1:])), times
    # the grad_output stream alone (read once) at full gather bandwidth bounds it from below
    g = get_gpu(GPU)
    stream_ms = 4096 * 128 * 4 / (g.mem_bw_gbs * 1e9) * 1e3
    assert times[0] >= stream_ms
