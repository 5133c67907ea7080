"""An index tensor as the distribution: past the tensor's own length, the misses grow from its
own (its reuse times), never below them: one more bag is never faster."""
import numpy as np
import pytest

from kit.embedding import Table, Zipf
from kit.embedding.cost import lookup_cost
from kit.embedding.index_streams import Empirical


def _streams():
    rng = np.random.default_rng(3)
    return {
        "cyclic": np.tile(np.arange(5000), 4),  # every reuse 5,000 accesses apart
        "sorted": np.sort(rng.integers(0, 3000, 20000)),  # every reuse 1 apart
        "bursty": np.repeat(rng.integers(0, 300, 2001), 10)[:20000],
        "zipf": Zipf(1.1).sample(20000, 5000, rng),
    }


@pytest.mark.parametrize("name", list(_streams()))
@pytest.mark.parametrize("cache_rows", [1, 10, 500, 2457])
def test_misses_never_fall_past_the_tensors_length(name, cache_rows):
    d = Empirical(_streams()[name])
    rows = 10**5
    # from the tensor's length on (within it, a prefix's own reuse histogram: its misses can
    # move by ~1e-6 of them as one access is added, which is left alone)
    ns = [20_000, 20_001, 20_100, 30_000, 40_000, 10**6]
    m = [d.expected_misses(n, rows, cache_rows) for n in ns]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(m, m[1:])), m
    assert all(d.expected_unique(n, rows) <= x <= n for n, x in zip(ns, m))


def test_one_more_bag_is_not_faster():
    # 5,000 rows read in turn 4 times miss a T4's L2 share (2,457 rows of 1 KiB) every time:
    # 177.0 us at 20,000 bags; at 20,001 the frequency model alone (the order forgotten) had
    # given 138.2 us
    t = Table(rows=100_000, dim=256, pooling=1, distribution=Empirical(_streams()["cyclic"]))
    at = [lookup_cost([t], b, "t4").time_ms for b in (19_999, 20_000, 20_001, 20_100)]
    assert all(b >= a for a, b in zip(at, at[1:])), at
    assert at[2] == pytest.approx(at[1], rel=1e-3)  # no jump either way past the tensor's end


def test_the_whole_streams_misses_are_worked_out_once(monkeypatch):
    # every call past the tensor's length scales its own misses at its length: its reuse
    # histogram and the unique count of the whole stream are worked out once per cache size
    # (each call had redone both: 62-79 ms on 200,000 indices, now ~3 ms)
    from kit.embedding import index_streams

    stream = _streams()["zipf"]
    d = Empirical(stream)
    rows = 10**5
    fresh = Empirical(stream)
    want = [fresh.expected_misses(n, rows, 500) for n in (20_000, 30_000, 40_000)]
    calls = {"reuse": 0, "unique": 0}
    real_beyond, real_unique = index_streams.ReuseHistogram.misses_beyond, np.unique

    def beyond(self, *a):
        calls["reuse"] += 1
        return real_beyond(self, *a)

    def unique(a, *args, **kw):
        calls["unique"] += np.size(a) >= stream.size
        return real_unique(a, *args, **kw)

    monkeypatch.setattr(index_streams.ReuseHistogram, "misses_beyond", beyond)
    monkeypatch.setattr(index_streams.np, "unique", unique)
    got = [d.expected_misses(n, rows, 500) for n in (20_000, 30_000, 40_000, 50_000)]
    assert got[:3] == want  # the same numbers, bit for bit
    assert calls == {"reuse": 1, "unique": 0}
    d.expected_misses(30_000, rows, 700)  # another cache size: worked out for it
    assert calls["reuse"] == 2
