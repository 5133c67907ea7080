"""A table with a real index tensor (Empirical) sharded row-wise: each block takes the indices in
its own rows, re-based, and their share of the lookups (every shard had been given the whole
tensor, whose ids past a shard's rows made every plan with a row-wise option an error)."""
import numpy as np
import pytest

from kit.embedding import Empirical, Table, Zipf
from kit.hardware import get_system
from kit.sharding import plan_sharding
from kit.sharding.model import ShardingModel


def _table(ids, rows=1000, name="e"):
    return Table(rows=rows, dim=64, pooling=10, name=name, distribution=Empirical(ids))


def test_a_plan_with_row_wise_options_prices_a_real_index_tensor():
    ids = np.random.default_rng(0).integers(0, 1000, 20000)
    plan = plan_sharding([_table(ids), _table(ids[::-1].copy(), name="f")], "dgx-a100", time_budget_s=0.3)
    assert np.isfinite(plan["cost_ms"]) and plan["cost_ms"] > 0
    m = ShardingModel([_table(ids)], get_system("dgx-a100"), kinds=("rw",))
    cost = m.exact_cost([0])
    assert np.isfinite(cost["cost_ms"]) and len(cost["per_rank_ms"]) == 8


def test_row_wise_blocks_split_the_lookups_where_the_indices_fall():
    rng = np.random.default_rng(1)
    hot = rng.integers(0, 100, 20000)  # every lookup in the first eighth of the rows
    m = ShardingModel([_table(hot)], get_system("dgx-a100"), kinds=("rw",))
    blocks = m._row_blocks(0, 8)
    assert sum(p for p, _ in blocks) == pytest.approx(10, rel=1e-5)  # the table's pooling, shared
    assert blocks[0][0] == pytest.approx(10) and all(p < 1e-4 for p, _ in blocks[1:])
    per_rank = m.exact_cost([0])["per_rank_ms"]
    assert per_rank[0] > max(per_rank[1:])  # the rank holding the hot rows does the lookups
    even = ShardingModel([_table(np.arange(20000) % 1000)], get_system("dgx-a100"), kinds=("rw",))
    assert [p for p, _ in even._row_blocks(0, 8)] == pytest.approx([10 / 8] * 8)
    assert max(even.exact_cost([0])["per_rank_ms"]) < per_rank[0]


def test_a_distribution_of_ranks_keeps_its_even_blocks():
    t = Table(rows=1000, dim=64, pooling=10, distribution=Zipf(1.1))
    m = ShardingModel([t], get_system("dgx-a100"), kinds=("rw",))
    assert [p for p, _ in m._row_blocks(0, 8)] == [10 / 8] * 8
    # each block a k-th of the table's ranks (kit.embedding.distributions.RowBlock)
    assert all(d.base is t.distribution and d.blocks == 8 for _, d in m._row_blocks(0, 8))
