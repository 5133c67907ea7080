"""Index distributions for embedding lookups: how many distinct rows a batch touches, and how
many of its accesses an LRU-like cache of C rows would serve.

Four kinds, one interface (`expected_unique(n, rows)`, `expected_misses(n, rows, cache_rows)`,
`sample(n, rows, rng)`, and two labels: `spec()` the lossless text parse_distribution reads back,
e.g. "zipf:1.2000001", "reuse:0.3,0.2", and `describe()` a short one for people, e.g. "zipf(1.2)"):

* Uniform           p_i = 1/E
* Zipf(α)           p_i ∝ i^-α, i = 1..E (rank 1 the hottest)
* ReuseHistogram    fraction of accesses whose reuse time (accesses since the previous access to
                    the same row) falls in [2^k, 2^(k+1)); the rest are cold (first touches)
* Empirical         a real index tensor; its own unique count, and its row frequencies
(the last two read from index streams: kit.embedding.index_streams)

Independent draws (uniform, Zipf, empirical frequencies) use the independent-reference model:
row i, drawn n times with probability p_i, is touched with probability 1 - (1 - p_i)^n, so

    U(n) = Σ_i [1 - (1 - p_i)^n]                                   (expected unique rows)

and a cache of C rows keeps row i for its characteristic time T (Che, Tung, Wang, "Hierarchical
Web caching systems: modeling, design and experimental results", IEEE JSAC 2002):

    Σ_i [1 - e^(-p_i T)] = C,   a re-access of row i hits when it comes within T draws.

In a window of n draws, the re-accesses of row i that come within T of the previous access are
∫_0^n p_i (1 - e^(-p_i min(s, T))) ds, so the misses are

    M(n, C) = Σ_i [n p_i - (n p_i - (1 - e^(-p_i T)) - p_i (n - T) e^(-p_i T))],  T ≤ n
            = U(n) when U(n) ≤ C (every re-access hits)

For a reuse-time histogram, the working set of Denning and Schwartz gives the misses
(kit.embedding.index_streams).

Zipf over 10^9 rows is summed in groups: the first 4096 ranks exactly, then geometric bins of
ranks whose probability is the bin's mean (∫ x^-α dx over the bin / width).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from kit.errors import KitError, whole_number

EXACT_RANKS = 4096  # Zipf ranks summed one by one before switching to geometric bins
BINS_PER_OCTAVE = 32  # geometric bins per doubling of rank above EXACT_RANKS
HASH_MULT = 2654435761  # Knuth's multiplicative hash: spreads hot ranks over row ids


def _check_rows(rows) -> int:
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
        raise KitError(f"rows must be a positive whole number, got {rows!r}")
    return int(rows)


def _check_sample(n, rng) -> tuple[int, np.random.Generator]:
    """sample()'s n (a whole number >= 0) and rng (a numpy Generator; None: seeded with 0)."""
    n = whole_number(n, "n (the number of row ids to draw)", low=0)
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise KitError(f"rng must be a numpy Generator (np.random.default_rng(seed)) or None, got {rng!r}")
    return n, rng if rng is not None else np.random.default_rng(0)


class Distribution:
    """Base: subclasses give group probabilities (p_g, count_g), or override the model."""

    kind = "distribution"

    def groups(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def expected_unique(self, n: float, rows: int) -> float:
        """Expected distinct rows among n draws from a table of `rows` rows."""
        rows = _check_rows(rows)
        if n <= 0:
            return 0.0
        return _unique_sum(n, rows, *self._unique_terms(rows))

    def _unique_terms(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """(count_g, log(1 - p_g)) of expected_unique's sum: what does not depend on n."""
        p, c = self.groups(rows)
        return c, np.log1p(-np.minimum(p, 1 - 1e-16))

    def unique_curve(self, rows: int):
        """n -> expected_unique(n, rows), the same numbers, with the per-group terms worked out
        once: for many n at one table. The L2 split of a fused kernel (kit.embedding.cost.
        _l2_rows_by_table) asks each of a rank's tables ~17 times in its bisection; over 256
        tables the groups' LRU caches were evicted in turn and every call rebuilt its table's
        Zipf bins (98% of the calls: 23 s for one exact plan of 300 tables on dgx-a100)."""
        if type(self).expected_unique is not Distribution.expected_unique:  # a model of its own
            return lambda n: self.expected_unique(n, rows)
        rows = _check_rows(rows)
        terms = self._unique_terms(rows)
        return lambda n: _unique_sum(n, rows, *terms) if n > 0 else 0.0

    def expected_misses(self, n: float, rows: int, cache_rows: float) -> float:
        """Expected accesses among n draws that a cache of `cache_rows` rows does not serve."""
        rows = _check_rows(rows)
        unique = self.expected_unique(n, rows)
        if n <= 0:
            return 0.0
        if cache_rows >= unique:
            return unique
        p, c = self.groups(rows)
        t = min(_characteristic_time(p, c, max(cache_rows, 0.0)), float(n))
        # re-accesses of a rate-p row in [0, n] that come within t of the previous one:
        # ∫_0^n p·(1 - e^(-p·min(s, t))) ds
        hits = n * p + np.expm1(-p * t) - p * (n - t) * np.exp(-p * t)
        misses = np.dot(c, n * p - np.maximum(hits, 0.0))
        return float(min(n, max(unique, misses)))

    def hit_rate(self, n: float, rows: int, cache_rows: float) -> float:
        """Fraction of the n accesses served by the cache (first touches always miss)."""
        return 0.0 if n <= 0 else 1.0 - self.expected_misses(n, rows, cache_rows) / n

    def sample(self, n: int, rows: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """n int64 row ids drawn from the distribution (hot ranks hashed over the row ids)."""
        rows = _check_rows(rows)
        n, rng = _check_sample(n, rng)
        ranks = self._sample_ranks(n, rows, rng)
        return (ranks.astype(np.uint64) * np.uint64(HASH_MULT) % np.uint64(rows)).astype(np.int64) \
            if math.gcd(HASH_MULT, rows) == 1 else ranks

    def _sample_ranks(self, n, rows, rng):
        raise NotImplementedError

    def describe(self) -> str:
        """A short label for people (may round: not for keys or files; see spec)."""
        return self.kind

    def spec(self) -> str:
        """The distribution as text that loses nothing: parse_distribution(d.spec()) == d (an
        index tensor's spec names it by a digest instead, and cannot be read back)."""
        raise KitError(f"{type(self).__name__} has no text spec; give it a spec() method")


def _unique_sum(n: float, rows: int, c: np.ndarray, log_keep: np.ndarray) -> float:
    """U(n) = Σ_g c_g [1 - (1 - p_g)^n], log_keep = log(1 - p_g) (clipped off -inf)."""
    touched = n * log_keep
    np.expm1(touched, out=touched)
    np.negative(touched, out=touched)
    return float(min(rows, n, np.dot(c, touched)))


def _characteristic_time(p: np.ndarray, c: np.ndarray, cache_rows: float) -> float:
    """T with Σ c·(1 - e^(-pT)) = cache_rows. The left side is concave, increasing and at most
    T, so Newton's method started at T = cache_rows climbs to the root from below."""
    if cache_rows <= 0:
        return 0.0
    if cache_rows >= c.sum():
        return math.inf
    t = float(cache_rows)
    for _ in range(200):
        e = np.exp(-p * t)
        step = (cache_rows - np.dot(c, 1.0 - e)) / np.dot(c * p, e)
        t += step
        if step <= 1e-9 * t:
            break
    return t


@lru_cache(maxsize=256)
def _zipf_bins(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, stop) rank ranges (1-based, stop exclusive): exact ranks, then geometric bins."""
    k = min(rows, EXACT_RANKS)
    starts = np.arange(1, k + 1, dtype=np.float64)
    stops = starts + 1
    if rows > k:
        edges = np.unique(np.round(np.geomspace(k + 1, rows + 1, max(2, int(
            BINS_PER_OCTAVE * math.log2((rows + 1) / (k + 1))) + 1))))
        starts = np.concatenate([starts, edges[:-1]])
        stops = np.concatenate([stops, edges[1:]])
    return starts, stops


@lru_cache(maxsize=256)
def _zipf_groups(alpha: float, rows: int) -> tuple[np.ndarray, np.ndarray]:
    starts, stops = _zipf_bins(rows)
    mass = starts ** -alpha  # a single rank's weight (ranks >= 1: underflows to 0, never overflows)
    wide = stops - starts > 1
    # a wide bin's weight Σ_{i=start}^{stop-1} i^-a ≈ ∫_{start-1/2}^{stop-1/2} x^-a dx, on the wide
    # bins only: the single ranks' (start - 1/2)^(1-a) overflows for a huge alpha (0.5^-1e30)
    lo, hi = starts[wide] - 0.5, stops[wide] - 0.5
    if abs(alpha - 1.0) < 1e-12:
        mass[wide] = np.log(hi / lo)
    else:
        mass[wide] = (hi ** (1 - alpha) - lo ** (1 - alpha)) / (1 - alpha)
    count = stops - starts
    return mass / mass.sum() / count, count


@lru_cache(maxsize=256)
def _zipf_unique_terms(alpha: float, rows: int) -> tuple[np.ndarray, np.ndarray]:
    p, c = _zipf_groups(alpha, rows)
    return c, np.log1p(-np.minimum(p, 1 - 1e-16))


@dataclass(frozen=True)
class Uniform(Distribution):
    """Every row equally likely."""

    kind = "uniform"

    def groups(self, rows):
        return np.array([1.0 / rows]), np.array([float(rows)])

    def _sample_ranks(self, n, rows, rng):
        return rng.integers(0, rows, size=n, dtype=np.int64)

    def spec(self):
        return "uniform"


@dataclass(frozen=True)
class Zipf(Distribution):
    """p_i ∝ i^-alpha over ranks 1..E; alpha = 0 is uniform, ~1 is typical of DLRM features."""

    alpha: float = 1.0
    kind = "zipf"

    def __post_init__(self):
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) \
                or not math.isfinite(self.alpha) or self.alpha < 0:
            raise KitError(f"zipf alpha must be a number >= 0, got {self.alpha!r}")

    def groups(self, rows):
        return _zipf_groups(float(self.alpha), rows)

    def _unique_terms(self, rows):
        return _zipf_unique_terms(float(self.alpha), rows)

    def _sample_ranks(self, n, rows, rng):
        p, c = self.groups(rows)
        starts, _ = _zipf_bins(rows)
        g = rng.choice(len(p), size=n, p=p * c / np.sum(p * c))
        offset = np.floor(rng.random(n) * c[g])
        return (starts[g] - 1 + offset).astype(np.int64)

    def describe(self):
        return f"zipf({self.alpha:g})"

    def spec(self):
        return f"zipf:{float(self.alpha)!r}"  # repr: the shortest text that reads back exactly


@dataclass(frozen=True)
class RowBlock(Distribution):
    """One of `blocks` equal row blocks of a table of `table_rows` rows whose lookups follow
    `base` (a row-wise shard, kit.sharding). sample() hashes the hot ranks over the row ids, so a
    block holds a random blocks-th of the ranks and takes a blocks-th of the lookups: n of its
    lookups are n·blocks of the table's, of which it holds a blocks-th of the rows touched, and
    an LRU of C rows on its stream keeps what one of C·blocks rows keeps on the table's (Che's
    characteristic time is the same). (base over the block's own rows, as each shard had been
    priced, has its own hottest rank: 8 blocks of a Zipf(1.05) table had touched 1.19x the
    table's unique rows, 64 blocks 1.44x, Zipf(1.3) 2.5x.)"""

    base: Distribution = None
    blocks: int = 1
    table_rows: int = 1
    kind = "row block"

    def expected_unique(self, n, rows):
        rows = _check_rows(rows)
        if n <= 0:
            return 0.0
        k = self.blocks
        return float(min(rows, n, self.base.expected_unique(n * k, self.table_rows) / k))

    def expected_misses(self, n, rows, cache_rows):
        unique = self.expected_unique(n, rows)
        if n <= 0:
            return 0.0
        k = self.blocks
        misses = self.base.expected_misses(n * k, self.table_rows, max(cache_rows, 0.0) * k) / k
        return float(min(n, max(unique, misses)))

    def sample(self, n, rows, rng=None):
        # which block the hottest ranks fall in depends on the hash (rank 0 is row 0: the first
        # block took 20% of a Zipf(1.05) table's lookups over 8 blocks); this is the blocks' mean
        raise KitError("a row block's distribution is the mean of a table's blocks, and has no ids "
                       "of its own: sample the table's distribution and keep a block's rows")

    def describe(self):
        return f"{self.base.describe()} 1/{self.blocks} of rows"


def parse_distribution(spec) -> Distribution:
    """A Distribution from a Distribution, None (uniform), a number (Zipf α), an index array,
    or a string: 'uniform', 'zipf:1.05', 'reuse:0.1,0.2,0.05' (what spec() writes). The
    describe() label 'zipf(1.05)' is read too (older collector CSVs hold it); the reuse and
    index-tensor labels cannot be, as they do not hold the bins or the indices."""
    from kit.embedding.index_streams import Empirical, ReuseHistogram  # they build on Distribution

    if spec is None:
        return Uniform()
    if isinstance(spec, Distribution):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return Uniform() if spec == 0 else Zipf(float(spec))
    if isinstance(spec, str):
        s = spec.strip().lower()
        if s in ("uniform", "u"):
            return Uniform()
        if s.startswith("zipf(") and s.endswith(")"):  # describe() form: zipf(1.05)
            s = f"zipf:{s[5:-1]}"
        if s.startswith("reuse("):
            raise KitError(f"distribution {spec!r} is a reuse histogram's label, not its spec: it does not "
                           "hold the bins (collector CSVs written before specs were stored have such "
                           "labels); re-measure those rows, or give 'reuse:F0,F1,...'")
        if s.startswith(("indices(", "indices:")):
            raise KitError(f"distribution {spec!r} names an index tensor but does not hold it; pass the "
                           "tensor itself, or a distribution: uniform, zipf:ALPHA or reuse:F0,F1,...")
        name, sep, arg = s.partition(":")
        if sep and not arg.strip():  # "zipf:" is a value left out, not the default
            raise KitError(f"distribution {spec!r} has nothing after ':'; give e.g. zipf:1.05 or reuse:0.3,0.2")
        try:
            if name == "zipf":
                return Zipf(float(arg or 1.0))
            if name == "reuse":
                cells = arg.split(",")
                if cells[-1].strip() == "":  # a trailing comma: nothing left out
                    cells = cells[:-1]
                # an empty bin had been dropped, moving every later bin an octave shorter:
                # 'reuse:,,,,,,,,,,0.5' read as 0.5 at reuse time 1, so an LRU of 500 rows hit
                # 50% of 3,000 accesses, not none
                if any(not x.strip() for x in cells):
                    raise KitError(f"distribution {spec!r} has an empty bin; give each bin a fraction "
                                   "(0 for none), e.g. reuse:0.3,0,0.2")
                return ReuseHistogram(tuple(float(x) for x in cells))
        except ValueError:
            pass
        raise KitError(f"unknown distribution {spec!r}: use 'uniform', 'zipf:ALPHA' or "
                       "'reuse:F0,F1,...' (fractions of accesses per power-of-two reuse-time bin)")
    if hasattr(spec, "detach") or isinstance(spec, (np.ndarray, list, tuple)):
        return Empirical(spec)
    raise KitError(f"cannot read a distribution from {type(spec).__name__}")
