"""Index distributions against closed forms and an LRU cache simulated access by access."""
from collections import OrderedDict

import numpy as np
import pytest

from kit.embedding import Empirical, ReuseHistogram, Uniform, Zipf, parse_distribution
from kit.embedding.replay import lru_hit_rate
from kit.errors import KitError


def lru_misses(stream, capacity):
    cache, misses = OrderedDict(), 0
    for v in stream.tolist():
        if v in cache:
            cache.move_to_end(v)
        else:
            misses += 1
            cache[v] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return misses


def test_uniform_unique_is_the_closed_form():
    rows, n = 10_000, 25_000
    assert Uniform().expected_unique(n, rows) == pytest.approx(rows * (1 - (1 - 1 / rows) ** n), rel=1e-9)


def test_zipf_grouped_sum_matches_the_exact_sum_over_every_rank():
    rows, n, a = 300_000, 100_000, 1.1  # rows > 4096, so the geometric bins are used
    p = np.arange(1, rows + 1, dtype=float) ** -a
    p /= p.sum()
    exact = np.sum(1 - (1 - p) ** n)
    assert Zipf(a).expected_unique(n, rows) == pytest.approx(exact, rel=2e-3)


def test_zipf_zero_is_uniform_and_skew_lowers_unique_rows():
    rows, n = 50_000, 20_000
    assert Zipf(0.0).expected_unique(n, rows) == pytest.approx(Uniform().expected_unique(n, rows))
    u = [Zipf(a).expected_unique(n, rows) for a in (0.5, 0.9, 1.2, 1.5)]
    assert all(x > y for x, y in zip(u, u[1:]))


def test_samples_have_the_predicted_unique_count():
    rows, n = 40_000, 30_000
    for d in (Uniform(), Zipf(0.8), Zipf(1.2)):
        x = d.sample(n, rows, np.random.default_rng(3))
        assert x.min() >= 0 and x.max() < rows
        assert np.unique(x).size == pytest.approx(d.expected_unique(n, rows), rel=0.02)


@pytest.mark.parametrize("dist", [Uniform(), Zipf(0.7), Zipf(1.05)])
@pytest.mark.parametrize("capacity", [300, 3000])
def test_hit_rate_matches_a_simulated_lru_cache(dist, capacity):
    rows, n = 20_000, 20_000
    stream = dist.sample(n, rows, np.random.default_rng(7))
    truth = 1 - lru_misses(stream, capacity) / n
    assert dist.hit_rate(n, rows, capacity) == pytest.approx(truth, abs=0.02)
    assert Empirical(stream).hit_rate(n, rows, capacity) == pytest.approx(truth, abs=0.02)
    assert ReuseHistogram.from_indices(stream).hit_rate(n, rows, capacity) == pytest.approx(truth, abs=0.04)


def test_a_cache_holding_every_touched_row_misses_only_first_touches():
    d = Zipf(1.0)
    assert d.expected_misses(5000, 1000, 10_000) == pytest.approx(d.expected_unique(5000, 1000))


def test_reuse_histogram_from_indices_by_hand():
    # row 1 at 0, 2, 3 (reuse 2, 1); row 2 at 1, 5 (reuse 4); row 3 at 4: cold 3 of 6
    h = ReuseHistogram.from_indices([1, 2, 1, 1, 3, 2])
    assert h.bins == pytest.approx((1 / 6, 1 / 6, 1 / 6))
    assert h.cold_fraction == pytest.approx(0.5)


def test_reuse_histogram_of_all_cold_accesses_touches_n_rows():
    h = ReuseHistogram(bins=(0.0, 0.0))
    assert h.expected_unique(500, 10_000) == pytest.approx(500)
    assert h.expected_unique(500, 100) == pytest.approx(100)


def test_empirical_counts_its_own_unique_rows():
    x = np.array([5, 5, 7, 9, 9, 9, 2])
    e = Empirical(x)
    assert e.expected_unique(7, 10) == 4
    assert e.expected_unique(3, 10) == 2  # prefix 5, 5, 7
    with pytest.raises(KitError, match="row id 9"):
        e.expected_unique(7, 5)


def test_parse_distribution_and_errors():
    assert isinstance(parse_distribution(None), Uniform)
    assert parse_distribution("zipf:1.2").alpha == 1.2
    assert parse_distribution(1.1).alpha == 1.1
    assert parse_distribution("reuse:0.2,0.1").bins == (0.2, 0.1)
    for bad in ("zipf:x", "pareto", "reuse:0.9,0.5"):
        with pytest.raises(KitError):
            parse_distribution(bad)
    with pytest.raises(KitError):
        Zipf(-1)
    with pytest.raises(KitError):
        Empirical(np.array([1.5, 2.0]))


def test_spec_reads_back_exactly_and_keeps_distinct_distributions_apart():
    dists = [Uniform(), Zipf(1.2), Zipf(1.2000001), Zipf(1e-05), ReuseHistogram((0.3, 0.2)),
             ReuseHistogram((0.05, 0.45)), ReuseHistogram((0.1, 0.0, 1 / 3))]
    specs = [d.spec() for d in dists]
    assert specs[:2] == ["uniform", "zipf:1.2"] and specs[4] == "reuse:0.3,0.2"
    assert len(set(specs)) == len(dists)  # describe() gave zipf(1.2) twice and reuse(2 bins, ...) twice
    assert [parse_distribution(s) for s in specs] == dists
    # an older collector's labels: zipf and uniform still read, a reuse label is refused clearly
    assert parse_distribution("zipf(1.2)") == Zipf(1.2)
    with pytest.raises(KitError, match="label, not its spec"):
        parse_distribution(ReuseHistogram((0.3, 0.2)).describe())


def test_index_tensors_compare_by_value():
    a, b = Empirical(np.arange(50) % 7), Empirical(np.arange(50) % 7)
    assert a == b and hash(a) == hash(b) and a.spec() == b.spec()
    assert a != Empirical(np.arange(50) % 8)
    with pytest.raises(KitError, match="index tensor"):
        parse_distribution(a.spec())


def test_a_reuse_spec_with_an_empty_bin_is_refused():
    # 'reuse:,0.3' had been read as (0.3,): the empty bin dropped, 0.3 moved from reuse times
    # [2, 4) to [1, 2); ',,,,,,,,,,0.5' put 0.5 at reuse time 1 instead of 2^10
    for bad in ("reuse:,0.3", "reuse:0.3,,0.2", "reuse:0.3, ,0.2", "reuse:,"):
        with pytest.raises(KitError, match="empty bin"):
            parse_distribution(bad)
    assert parse_distribution("reuse:0.3,0,0.2").bins == (0.3, 0.0, 0.2)
    assert parse_distribution("reuse:0.3,0.2,").bins == (0.3, 0.2)  # a trailing comma leaves none out


def test_an_index_tensor_samples_only_a_table_that_holds_its_rows():
    e = Empirical(np.array([0, 5, 99, 99]))
    with pytest.raises(KitError, match="row id 99 but the table has 10 rows"):
        e.sample(5, 10)  # it had returned ids 99 and 5 for a 10-row table
    assert set(e.sample(50, 100).tolist()) <= {0, 5, 99}


@pytest.mark.parametrize("capacity", [1, 2, 4, 16])
def test_a_reuse_histogram_hits_a_small_lru_as_its_stream_does(capacity):
    # reuse times are whole numbers: an access of reuse time R hits when R <= t*, s(t*) = C, so
    # the misses are P(R > t*), not P(R >= t*) (the tail at t*, which counts an access of reuse
    # time t* as a miss); and a window shorter than one access holds less than one row. Zipf(1.5),
    # 10,000 draws: an LRU of 1 row hit 0.178 of them, the model had said 0.000; of 2 rows 0.314
    # against 0.195, of 4 rows 0.467 against 0.431
    s = Zipf(1.5).sample(10_000, 10**6, np.random.default_rng(3))
    e = Empirical(s)
    assert e.hit_rate(s.size, 10**6, capacity) == pytest.approx(lru_hit_rate(s, capacity), abs=0.015)
    assert ReuseHistogram((0.5,)).working_set(0.5) == pytest.approx(0.5)  # it had been 1.0
