"""Row-wise shards of a table whose rows the ranks do not divide, as TorchRec cuts them: blocks
of ceil(E / k) rows from rank 0, the rest in a shorter block, none past it. Every block had been
given ceil(E / k) rows and a k-th of the lookups: 10 rows over 8 ranks held 16 rows (charged to
the cap on ranks 5-7, which hold none) and a 3-row table had 8 ranks each doing an eighth of
its lookups, where 3 ranks do a third each."""
import numpy as np
import pytest

from kit.embedding import Table, Uniform, Zipf
from kit.hardware import get_system
from kit.sharding.model import ShardingModel, block_rows


@pytest.mark.parametrize("rows, k", [(10, 8), (3, 8), (9, 8), (8, 8), (1001, 8), (7, 16), (10**6 + 1, 64)])
def test_block_rows_add_up_to_the_table(rows, k):
    blocks = block_rows(rows, k)
    assert len(blocks) == k and sum(blocks) == rows and min(blocks) >= 0
    assert max(blocks) == -(-rows // k)  # the first blocks hold ceil(rows / k)
    assert blocks == sorted(blocks, reverse=True)


@pytest.mark.parametrize("system, kind", [("dgx-a100", "rw"), ("dgx-a100-x2", "twrw")])
@pytest.mark.parametrize("dist", [None, Zipf(1.05)])
@pytest.mark.parametrize("rows", [3, 10, 1001])
def test_row_wise_shards_hold_the_tables_rows_and_lookups_once(system, kind, dist, rows):
    t = Table(rows=rows, dim=64, pooling=12, name="t", distribution=dist)
    m = ShardingModel([t], get_system(system), kinds=(kind,))
    o = next(i for i, opt in enumerate(m.options[0]) if opt.kind == kind)
    shards = m.shards(0, m.options[0][o])
    assert sum(s[1] for s in shards) == rows
    # lookups: the table's pooling, shared by the ranks in proportion to the rows they hold
    assert sum(s[3] for s in shards) == pytest.approx(12, rel=1e-5)
    for _, r, _, p, _, _ in shards:
        assert p == pytest.approx(12 * r / rows, abs=1e-4)
    # memory: the table's weights and optimizer state once over the ranks, in the model and exactly
    W = m.world
    held = m.contrib[0, o, 3 * W:4 * W]
    assert held.sum() == pytest.approx(rows * (64 * 4 + 4))
    assert np.asarray(m.exact_cost([o])["memory_bytes"]).sum() == pytest.approx(rows * (64 * 4 + 4))


def test_ranks_past_a_small_tables_rows_get_no_index_traffic_but_offsets():
    t = Table(rows=3, dim=64, pooling=12, name="t", distribution=Uniform())
    m = ShardingModel([t], get_system("dgx-a100"), batch=512, kinds=("rw",))
    _, idx, _ = m.traffic(0, m.options[0][0])
    to = idx.matrix().sum(0)  # bytes each rank receives
    # ranks 0-2 take a third of 12 lookups a sample from each of the 7 others, ranks 3-7 none
    assert to[:3] == pytest.approx(7 * 512 * (4 + 1) * 8)
    assert to[3:] == pytest.approx(7 * 512 * 1 * 8, rel=1e-5)


@pytest.mark.parametrize("system, rows", [("dgx-a100", 37), ("dgx-a100", 100), ("dgx-a100-x8", 37),
                                          ("dgx-a100-x8", 300), ("dgx-a100-x8", 1001)])
@pytest.mark.parametrize("alpha", [0.6, 1.3])
def test_uneven_blocks_together_touch_the_tables_unique_rows(system, rows, alpha):
    """Sharding by rows changes no row a batch touches, however the rows split. A block's
    distribution had held a k-th of the rows touched while it took its rows' share of the
    lookups: 37 rows over 64 ranks (37 blocks of 1 row, each read 1/37 of the time) touched
    0.58 of the table's unique rows together, 1001 rows 0.978, 100 rows over 8 0.965."""
    t = Table(rows=rows, dim=64, pooling=20, name="t", distribution=Zipf(alpha))
    m = ShardingModel([t], get_system(system), batch=512, kinds=("rw",))
    shards = m.shards(0, m.options[0][0])
    split = sum(d.expected_unique(b * p, r) for _, r, _, p, b, d in shards if r)
    whole = Zipf(alpha).expected_unique(512 * m.world * 20, rows)
    assert split == pytest.approx(whole, rel=1e-3)
