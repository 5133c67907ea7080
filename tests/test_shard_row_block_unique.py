"""A row-wise shard of a skewed table touches its share of the table's rows, no more.

A distribution of row ranks hashes its hot ranks over the row ids (Distribution.sample), so a
block of E/k rows holds a random k-th of the ranks and sees a k-th of the lookups. Each block
had been priced as the table's distribution over E/k rows of its own (Zipf(1.05) over E/k
ranks, its own hottest rank among them), whose unique rows over the k blocks came to 1.19x the
whole table's at k = 8 and 1.44x at k = 64 (Zipf(1.3): 2.5x), though sharding by rows changes
no row a batch touches: row-wise plans of skewed tables were priced with misses and row updates
that do not exist."""
import numpy as np
import pytest

from kit.embedding import ReuseHistogram, Table, Uniform, Zipf
from kit.hardware import get_system
from kit.sharding.model import ShardingModel


def _rw_shards(table, kinds=("rw",), system="dgx-a100", batch=512):
    m = ShardingModel([table], get_system(system), batch=batch, kinds=kinds)
    opt = next(o for o in m.options[0] if o.kind == kinds[0])
    return m.shards(0, opt)


@pytest.mark.parametrize("dist", [Zipf(0.6), Zipf(1.05), Zipf(1.3), Uniform(),
                                  ReuseHistogram((0.3, 0.2, 0.1, 0.05, 0.05))])
@pytest.mark.parametrize("rows", [10**4, 10**6])
def test_the_blocks_together_touch_the_tables_unique_rows(dist, rows):
    t = Table(rows=rows, dim=64, pooling=20, name="t", distribution=dist)
    shards = _rw_shards(t)
    assert len(shards) == 8
    split = sum((d or Uniform()).expected_unique(b * p, r) for _, r, _, p, b, d in shards)
    whole = dist.expected_unique(512 * 8 * 20, rows)
    assert split == pytest.approx(whole, rel=0.01)


def test_each_block_matches_a_monte_carlo_draw_of_hashed_ids():
    rows, k, n = 200_000, 8, 160_000  # n lookups of the whole table a batch
    dist = Zipf(1.05)
    t = Table(rows=rows, dim=64, pooling=n / (512 * k), name="t", distribution=dist)
    shards = _rw_shards(t)
    block = -(-rows // k)
    rng = np.random.default_rng(0)
    draws = [dist.sample(n, rows, rng) for _ in range(8)]
    measured = np.mean([[np.unique(ids[ids // block == j]).size for j in range(k)] for ids in draws], 0)
    model = [d.expected_unique(b * p, r) for _, r, _, p, b, d in shards]
    # blocks differ by where the hottest ranks fall; their mean is what a block is priced at
    assert np.mean(model) == pytest.approx(measured.mean(), rel=0.02)
    assert sum(model) == pytest.approx(measured.sum(), rel=0.02)


def test_a_blocks_misses_are_its_share_of_the_tables_under_a_k_times_larger_cache():
    t = Table(rows=10**6, dim=64, pooling=20, name="t", distribution=Zipf(1.05))
    (_, r, _, p, b, d), *_ = _rw_shards(t)
    n = b * p
    for cache in (100, 10_000):
        assert d.expected_misses(n, r, cache) == pytest.approx(
            Zipf(1.05).expected_misses(n * 8, 10**6, cache * 8) / 8, rel=1e-9)
    assert d.expected_misses(n, r, 10) >= d.expected_unique(n, r)


def test_table_row_wise_blocks_too():
    t = Table(rows=10**6, dim=64, pooling=20, name="t", distribution=Zipf(1.3))
    shards = _rw_shards(t, kinds=("twrw",), system=get_system("dgx-a100", nodes=2))
    assert len(shards) == 8
    split = sum(d.expected_unique(b * p, r) for _, r, _, p, b, d in shards)
    assert split == pytest.approx(Zipf(1.3).expected_unique(512 * 16 * 20, 10**6), rel=0.01)
