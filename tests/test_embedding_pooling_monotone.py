"""More work is never predicted faster: an embedding-bag lookup with more rows a bag (the same
bags, table and index distribution), more bags or a wider row takes at least as long, forward
and backward (kit.embedding.cost.lookup_cost), over GPUs, table sizes and every kind of index
distribution the kit reads.

The forward had come out faster with a bag's second row: the kernel's first round, which finds
the L2 cold and so always waits the DRAM, took the whole stream's miss share, which the warmer
later rows lower (1 Zipf(1.2) bag: 6.2000 us at 1 row a bag, 6.1992 at 2).
"""
import itertools

import numpy as np
import pytest

from kit.embedding import Table, lookup_cost
from kit.embedding.distributions import Zipf
from kit.embedding.index_streams import Empirical, ReuseHistogram

GPUS = ["v100-sxm2-32gb", "a100-sxm4-80gb", "h100-sxm", "t4", "mi300x"]
BATCHES = [1, 16, 512, 4096]
ROWS = [10**3, 10**6, 10**8]
DIMS = [16, 64, 128, 256]
POOLINGS = [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64]
# ids below 1,000, so that the tensor fits every table of the sweep
_IDS = Zipf(1.1).sample(20_000, 1000, np.random.default_rng(7))
DISTRIBUTIONS = {"uniform": "uniform", "zipf0.8": "zipf:0.8", "zipf1.05": "zipf:1.05",
                 "zipf1.2": "zipf:1.2", "reuse": ReuseHistogram((0.3, 0.2, 0.1, 0.05)),
                 "indices": Empirical(_IDS)}
REL = 1e-9  # float noise, not a slope


def _times(gpu, rows, dist, backward, optimizer="sgd"):
    """{(batch, dim, pooling): time_ms} over the grid."""
    return {(b, d, p): lookup_cost(Table(rows=rows, dim=d, pooling=p), b, gpu, distribution=dist,
                                   backward=backward, optimizer=optimizer).time_ms
            for b, d, p in itertools.product(BATCHES, DIMS, POOLINGS)}


def _drops(times, axis):
    """(smaller, larger, t_smaller, t_larger) wherever growing `axis` lowered the time."""
    grids = {"batch": BATCHES, "dim": DIMS, "pooling": POOLINGS}
    pos = {"batch": 0, "dim": 1, "pooling": 2}[axis]
    out = []
    for key, t in times.items():
        ladder = grids[axis]
        i = ladder.index(key[pos])
        if i + 1 < len(ladder):
            nxt = key[:pos] + (ladder[i + 1],) + key[pos + 1:]
            if times[nxt] < t * (1 - REL):
                out.append((key, nxt, t, times[nxt]))
    return out


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("dist", list(DISTRIBUTIONS), ids=list(DISTRIBUTIONS))
@pytest.mark.parametrize("gpu", GPUS)
def test_more_rows_bags_or_width_never_faster(gpu, dist, backward):
    bad = []
    for rows in ROWS:
        times = _times(gpu, rows, DISTRIBUTIONS[dist], backward)
        for axis in ("pooling", "batch", "dim"):
            bad += [(rows, axis) + x for x in _drops(times, axis)]
    assert not bad, f"{len(bad)} drops, e.g. {bad[:5]}"


@pytest.mark.parametrize("gpu", ["v100-sxm2-32gb", "t4"])
def test_rowwise_adagrad_backward_never_faster_with_more_rows(gpu):
    bad = []
    for rows, dist in itertools.product(ROWS, ["uniform", "zipf:1.2"]):
        times = _times(gpu, rows, dist, True, "rowwise_adagrad")
        for axis in ("pooling", "batch", "dim"):
            bad += [(rows, dist, axis) + x for x in _drops(times, axis)]
    assert not bad, f"{len(bad)} drops, e.g. {bad[:5]}"


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_fused_table_with_more_rows_a_bag_never_faster(backward):
    """One table of a fused (TBE) kernel pooling more rows, beside a fixed one."""
    for gpu, batch, dist in itertools.product(["v100-sxm2-32gb", "h100-sxm"], [1, 16, 512, 4096],
                                              ["uniform", "zipf:1.05"]):
        t = [lookup_cost([Table(rows=10**6, dim=64, pooling=p), Table(rows=10**3, dim=16, pooling=4)],
                         batch, gpu, distribution=dist, backward=backward).time_ms for p in POOLINGS]
        assert all(b >= a * (1 - REL) for a, b in zip(t, t[1:])), (gpu, batch, dist, t)


def test_the_cold_first_round_always_waits():
    """One bag's first round finds the L2 cold: 2 hot rows wait as long as 1."""
    one, two = (lookup_cost(Table(rows=1000, dim=16, pooling=p), 1, "v100-sxm2-32gb",
                            distribution="zipf:1.2").time_ms for p in (1, 2))
    assert two >= one


def test_op_embedding_bag_never_faster_with_more_rows_a_bag():
    # `kit op embedding` (kit.ops.EmbeddingBag) is costed as the learned elementwise copy of its
    # bytes (kit.ops.elementwise_proxy), which had dipped after every multiple of 512 elements
    # and past one wave (on a V100, 512 elements 33.9 us, 576 29.9 us): kit.predict.small_op_bounds
    from kit import ops
    from kit.api import get_predictor
    from kit.hardware import get_gpu

    model, bad = get_predictor("auto"), []
    for gpu in GPUS:
        grid = list(itertools.product(BATCHES, ROWS, DIMS))
        lat = model.predict([ops.EmbeddingBag(b, r, d, p) for b, r, d in grid for p in POOLINGS],
                            get_gpu(gpu)).latency_ms.to_numpy(float).reshape(len(grid), len(POOLINGS))
        bad += [(gpu, key, POOLINGS[j], POOLINGS[j + 1]) for key, row in zip(grid, lat)
                for j in range(len(POOLINGS) - 1) if row[j + 1] < row[j] * (1 - REL)]
    assert not bad, f"{len(bad)} drops, e.g. {bad[:5]}"
