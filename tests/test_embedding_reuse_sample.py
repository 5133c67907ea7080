"""A stream drawn from a reuse-time histogram has that histogram (the collector measures
"reuse:..." rows on such streams, and the correction is fitted against the spec's model).

The sampler had re-used the row R accesses back whatever came since, so a row accessed in
between made the reuse shorter: reuse:0.3,0.2,0.1,0.05 came back 0.394,0.161,0.066,0.029, and an
LRU of 500 rows missed 10% fewer accesses than the model says of one bin of 0.5 at 2^10 (its
accesses re-used rows the bin had not, a reuse time shorter than it). Its random ids for cold
accesses collided: 100,000 cold accesses of a 10^6-row table touched 95,160 rows."""
import numpy as np
import pytest

from kit.embedding.index_streams import ReuseHistogram
from kit.embedding.replay import lru_hit_rate

HISTOGRAMS = [(0.3, 0.2, 0.1, 0.05), (0.0,) * 10 + (0.5,), (0.05,) * 12]


@pytest.mark.parametrize("bins", HISTOGRAMS)
def test_a_drawn_streams_own_histogram_is_the_one_it_was_drawn_from(bins):
    h = ReuseHistogram(bins)
    stream = h.sample(50_000, 10**8, np.random.default_rng(0))
    got = ReuseHistogram.from_indices(stream)
    want = np.zeros(max(len(got.bins), len(bins)))
    want[:len(bins)] = bins
    have = np.zeros_like(want)
    have[:len(got.bins)] = got.bins
    assert have == pytest.approx(want, abs=0.025)
    assert got.cold_fraction == pytest.approx(h.cold_fraction, abs=0.03)


@pytest.mark.parametrize("bins", HISTOGRAMS)
@pytest.mark.parametrize("cache", [50, 500, 3000])
def test_an_lru_replay_of_a_drawn_stream_misses_what_the_model_says(bins, cache):
    h = ReuseHistogram(bins)
    n = 50_000
    stream = h.sample(n, 10**8, np.random.default_rng(1))
    replayed = n * (1 - lru_hit_rate(stream, cache))
    assert replayed == pytest.approx(h.expected_misses(n, 10**8, cache), rel=0.03)


def test_cold_accesses_take_rows_not_used_before():
    stream = ReuseHistogram((0.0,)).sample(100_000, 10**6, np.random.default_rng(2))
    assert np.unique(stream).size == stream.size  # every access cold: no collisions of random ids
    small = ReuseHistogram((0.0,)).sample(1000, 100, np.random.default_rng(2))
    assert set(small) == set(range(100))  # a table smaller than the stream: its rows come round


@pytest.mark.parametrize("bins,n", [((0.0,) * 10 + (0.5,), 3000), ((0.3, 0.2) + (0.0,) * 9 + (0.3,), 2500)])
def test_a_stream_shorter_than_a_bin_touches_the_rows_the_model_says(bins, n):
    # an access whose drawn reuse time reaches before the stream's start is a first touch in
    # it (working_set counts it so); the sampler had tried shorter times in the bin instead, and
    # one bin of 0.5 at 2^10 drew 1,994 unique rows in 3,000 accesses, the model 2,239
    h = ReuseHistogram(bins)
    got = np.mean([np.unique(h.sample(n, 10**8, np.random.default_rng(s))).size for s in range(4)])
    assert got == pytest.approx(h.expected_unique(n, 10**8), rel=0.03)
