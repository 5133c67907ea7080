"""A plan's price does not depend on the plans priced before it.

ShardingModel caches each shard's lookup cost under its L2 shares rounded to 3 decimals, but had
priced it at the first caller's unrounded shares: a hot Zipf(1.2) table beside a table of 60 or
of 58 lookups a sample holds 0.00573 or 0.00589 of the L2 (both 0.006 rounded), so the second
plan got the first one's number, and exact_cost of one plan gave 16.0799 us for that shard
after the other plan had been priced, 16.0738 us before it."""
import pytest

from kit.embedding import Table, Zipf
from kit.sharding import ShardingModel
from sharding_support import StandInComm, StandInSystem


def _model():
    tabs = [Table(rows=10**6, dim=64, pooling=2, name="hot", distribution=Zipf(1.2)),
            Table(rows=10**8, dim=128, pooling=60, name="big1", distribution=Zipf(0.3)),
            Table(rows=10**8, dim=128, pooling=58, name="big2", distribution=Zipf(0.3))]
    return ShardingModel(tabs, StandInSystem(2, 2), batch=4096, comm=StandInComm(), memory_cap_bytes=1e15)


def _tw(m, t, r):
    return next(o for o, opt in enumerate(m.options[t]) if opt.kind == "tw" and opt.ranks[0] == r)


def test_exact_cost_is_the_same_whatever_was_priced_first():
    m = _model()
    a = [_tw(m, 0, 0), _tw(m, 1, 0), _tw(m, 2, 1)]  # hot beside big1
    b = [_tw(m, 0, 0), _tw(m, 1, 1), _tw(m, 2, 0)]  # hot beside big2
    a_first, b_after = m.exact_cost(a), m.exact_cost(b)
    m2 = _model()
    b_first, a_after = m2.exact_cost(b), m2.exact_cost(a)
    for one, other in ((a_first, a_after), (b_first, b_after)):
        assert one["shard_ms"] == other["shard_ms"]
        assert one["cost_ms"] == other["cost_ms"]


def test_a_shard_is_priced_at_the_share_it_is_cached_under():
    m = _model()
    first = m._shard_ms(m.tables[0], 10**6, 64, 2, 8192, 0.00573)
    assert m._shard_ms(m.tables[0], 10**6, 64, 2, 8192, 0.00573) == first
    fresh = _model()._shard_ms(m.tables[0], 10**6, 64, 2, 8192, 0.00589)
    again = m._shard_ms(m.tables[0], 10**6, 64, 2, 8192, 0.00589)
    assert again == fresh
    # the rounding is relative: a share a tenth the size is not lumped with one 3x as large
    assert m._shard_ms(m.tables[0], 10**6, 64, 2, 8192, 0.0006) != \
        m._shard_ms(m.tables[0], 10**6, 64, 2, 8192, 0.0014)
