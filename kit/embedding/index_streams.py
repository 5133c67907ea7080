"""Index streams as distributions (kit.embedding.distributions): a reuse-time histogram and a real
index tensor.

* ReuseHistogram    fraction of accesses whose reuse time (accesses since the previous access to
                    the same row) falls in [2^k, 2^(k+1)); the rest are cold (first touches)
* Empirical         a real index tensor; its own unique count, and its row frequencies

For a reuse-time histogram, Denning and Schwartz ("Properties of the working-set model",
CACM 1972) give the working set of a window of t accesses as s(t) = Σ_{k<t} P(R > k); an access
with reuse time R hits a cache of C rows when s(R) ≤ C, so M = n·P(R > t*) with s(t*) = C
(cold accesses count as R = ∞).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from kit.embedding.distributions import Distribution, _check_rows, _check_sample
from kit.errors import KitError

SAMPLE_TRIES = 16  # positions in an access's reuse-time bin tried for a row last accessed there


@dataclass(frozen=True)
class ReuseHistogram(Distribution):
    """bins[k] = fraction of accesses whose reuse time lies in [2^k, 2^(k+1)); 1 - Σ bins = cold.

    Reuse time counts accesses (not distinct rows) since the previous access to the same row.
    """

    bins: tuple[float, ...] = field(default=())
    kind = "reuse"

    def __post_init__(self):
        b = np.asarray(self.bins, dtype=float)
        if b.ndim != 1 or b.size == 0 or not np.all(np.isfinite(b)) or np.any(b < 0):
            raise KitError("reuse histogram: bins must be a non-empty list of fractions >= 0")
        if b.sum() > 1 + 1e-9:
            raise KitError(f"reuse histogram: bins sum to {b.sum():.4g}; they are fractions of "
                           "accesses and must sum to at most 1 (the rest are cold)")
        object.__setattr__(self, "bins", tuple(float(x) for x in b))

    @property
    def cold_fraction(self) -> float:
        return max(0.0, 1.0 - sum(self.bins))

    def _tail(self, t: np.ndarray) -> np.ndarray:
        """P(R >= t), reuse times spread log-uniformly within each power-of-two bin from its first
        one: _tail(2^k) is the mass of bins k and up (misses_beyond takes P(R > t*) as _tail(t* + 1))."""
        b = np.asarray(self.bins)
        lo = 2.0 ** np.arange(b.size)
        with np.errstate(divide="ignore"):
            within = np.clip(np.log2(np.maximum(t[:, None], 1e-300) / lo), 0.0, 1.0)
        return 1.0 - (b * within).sum(axis=1)

    def working_set(self, t: float) -> float:
        """s(t) = Σ_{k<t} P(R > k): distinct rows in a window of t accesses (Denning-Schwartz)."""
        if t <= 0:
            return 0.0
        b = np.asarray(self.bins)
        grid = 2.0 ** np.linspace(0, b.size, 16 * b.size + 1)  # 16 knots per octave
        # no knot past t (grid holds 1 = 2^0): a knot at 1 had made s(0.5) = 1, and an LRU of one
        # row hit none of a stream whose every other access re-read the row before
        knots = np.unique(np.concatenate([[0.0, t], grid[grid < t]]))
        tails = self._tail(knots)
        return float(np.sum(0.5 * (tails[1:] + tails[:-1]) * np.diff(knots)))  # trapezoid rule

    def expected_unique(self, n, rows):
        rows = _check_rows(rows)
        return float(min(rows, n, self.working_set(n)))

    def expected_misses(self, n, rows, cache_rows):
        rows = _check_rows(rows)
        unique = self.expected_unique(n, rows)
        return float(min(n, max(unique, self.misses_beyond(n, cache_rows, unique))))

    def misses_beyond(self, n: float, cache_rows: float, unique: float) -> float:
        """n·P(R > t*): accesses whose reuse time exceeds the time t* that fills the cache."""
        if n <= 0 or cache_rows >= unique:
            return unique
        lo, hi = 0.0, float(n)
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if self.working_set(mid) < cache_rows else (lo, mid)
        # reuse times are whole numbers, and _tail(t) spreads bin k's over [2^k, 2^(k+1)) from its
        # first one, 2^k: it is P(R >= t), so P(R > t*) is _tail(t* + 1). _tail(t*) had counted the
        # accesses of reuse time t* as misses: of a Zipf(1.5) stream's 10,000 accesses an LRU of 2
        # rows hits 0.314, the model had said 0.195 (0.306 now)
        return float(n * self._tail(np.array([0.5 * (lo + hi) + 1.0]))[0])

    def _sample_ranks(self, n, rows, rng):
        """A stream with these reuse times: an access of reuse time R re-uses the row accessed R
        accesses back, where that was the row's last access (no access since re-used it: its
        reuse time would be shorter), tried up to SAMPLE_TRIES times in R's bin; a cold access, one
        reaching before the stream's start (as working_set counts it) or one whose bin is taken
        and no position near it is free (_nearest_free) takes a row not used before (while the
        table has one). Taking the row R back whatever came
        since had drawn streams whose own histograms were not these: reuse:0.3,0.2,0.1,0.05 came
        back 0.394,0.161,0.066,0.029, and an LRU of 500 rows missed 10% fewer accesses of one bin
        of 0.5 at 2^10 than the histogram's model says. Random fresh ids (a table over 4x the
        accesses) had collided, re-using rows the histogram calls cold (100,000 cold accesses of
        10^6 rows had touched 95,160)."""
        b = np.asarray(self.bins)
        k = rng.choice(b.size + 1, size=n, p=np.append(b, self.cold_fraction) / max(b.sum() + self.cold_fraction, 1e-12))
        lo = 2 ** np.minimum(k, min(b.size - 1, 62))  # R's bin: [lo, 2·lo) (2^62: past any stream)
        first = (rng.random(n) * lo).astype(np.int64)  # R - lo of the first try
        stride = (lo * 0.6180339887).astype(np.int64) | 1  # the next tries: a golden-ratio walk
        small = rows <= 4 * n
        fresh = rng.permutation(rows) if small else rng.choice(rows, size=n, replace=False)
        reused = bytearray(n)  # 1: a position whose row was accessed again after it
        last = [-1] * rows if small else None  # a row's last position
        out, nxt, cold = [0] * n, 0, b.size
        for i, (ki, w, d, step) in enumerate(zip(k.tolist(), lo.tolist(), first.tolist(), stride.tolist())):
            src = -1
            # a draw reaching before the start is a first touch there, as working_set counts it
            # (retried shorter, one bin of 0.5 at 2^10 drew 1,994 unique rows in 3,000, not 2,239)
            if ki < cold and w + d <= i:
                for _ in range(SAMPLE_TRIES):
                    if w + d <= i and not reused[i - w - d]:
                        src = i - w - d
                        break
                    d = (d + step) % w
                else:
                    if i >= 2 * w - 1:  # the bin, all in the stream, is taken
                        src = _nearest_free(reused, i, w)
            if src < 0:  # a row not used before; a small table's fresh rows come round again
                out[i] = row = int(fresh[nxt % fresh.size])
                nxt += 1
                src = last[row] if small else -1
            else:
                out[i] = row = out[src]
            if src >= 0:
                reused[src] = 1
            if small:
                last[row] = i
        return np.array(out, dtype=np.int64)

    def sample(self, n, rows, rng=None):
        rows = _check_rows(rows)
        n, rng = _check_sample(n, rng)
        return self._sample_ranks(n, rows, rng)

    @classmethod
    def from_indices(cls, indices) -> "ReuseHistogram":
        """The reuse-time histogram of a real index stream (1-D, any int array or tensor)."""
        idx = _as_index_array(indices)
        order = np.argsort(idx, kind="stable")
        s = idx[order]
        same = s[1:] == s[:-1]
        reuse = (order[1:] - order[:-1])[same]
        if reuse.size == 0:
            return cls(bins=(0.0,))
        k = np.floor(np.log2(reuse)).astype(int)
        hist = np.bincount(k, minlength=k.max() + 1) / idx.size
        return cls(bins=tuple(hist))

    def describe(self):
        return f"reuse({len(self.bins)} bins, cold {self.cold_fraction:.3f})"

    def spec(self):
        return "reuse:" + ",".join(repr(b) for b in self.bins)


def _nearest_free(reused: bytearray, i: int, w: int) -> int:
    """For access i whose reuse-time bin [w, 2w) is taken: the latest position not yet re-used
    up to 8w back past the bin, else the earliest one short of it; -1 if none. A reuse kept
    near its time hits the caches it would have hit; made cold, it misses every one (R in [2, 4)
    is often taken, by R = 1 a step earlier: reuse:0.3,0.2,0.1,0.05 had drawn 0.374 cold, not
    0.35, and 7% more misses than its model at every cache size)."""
    p = reused.rfind(0, max(0, i - 8 * w), i - 2 * w + 1)
    return p if p >= 0 else reused.find(0, i - w + 1, i)


def _as_index_array(indices) -> np.ndarray:
    if hasattr(indices, "detach"):  # a torch tensor
        indices = indices.detach().cpu().numpy()
    try:
        arr = np.asarray(indices)
    except ValueError:  # ragged: lookup_cost's 3 per-table tensors for 4 tables had ended in numpy's traceback
        raise KitError("index tensor must be an array of whole numbers, got nested lists of different "
                       "lengths (per-table index tensors: give one per table)") from None
    if arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise KitError("index tensor must be a non-empty array of whole numbers")
    arr = arr.reshape(-1).astype(np.int64)
    if arr.min() < 0:
        raise KitError(f"index tensor holds a negative row id ({arr.min()})")
    return arr


class Empirical(Distribution):
    """A real index tensor: its own unique count and misses (its reuse times) up to its length;
    past it, those scaled by its row frequencies' model."""

    kind = "indices"

    def __init__(self, indices):
        self.indices = _as_index_array(indices)
        ids, counts = np.unique(self.indices, return_counts=True)
        self.unique_ids = ids
        self._freq_counts = counts
        self.reuse = ReuseHistogram.from_indices(self.indices)
        self._digest = hashlib.sha1(self.indices.tobytes()).hexdigest()[:16]
        self._own_misses: dict = {}  # cache rows -> the whole stream's misses (own_misses)

    def __eq__(self, other):  # by value, so that equal tensors share cached costs
        return isinstance(other, Empirical) and self.spec() == other.spec()

    def __hash__(self):
        return hash(self.spec())

    def groups(self, rows):
        if self.unique_ids[-1] >= rows:
            raise KitError(f"index tensor has row id {self.unique_ids[-1]} but the table has {rows} rows")
        vals, mult = np.unique(self._freq_counts, return_counts=True)
        return vals / self.indices.size, mult.astype(float)

    def expected_unique(self, n, rows):
        """Exact for the tensor's own length; other lengths scale the exact count by the
        frequency model's ratio U(n)/U(N), which removes the model's small-count bias;
        shorter windows count the stream's own prefix."""
        self.groups(rows)
        own = float(self.unique_ids.size)
        if int(n) == self.indices.size:  # the whole stream: its ids, counted once (np.unique of
            return own                     # 200,000 indices on every call had taken 28 ms)
        if int(n) <= self.indices.size:  # a prefix of the real stream, counted
            return float(np.unique(self.indices[:max(int(n), 1)]).size) if n >= 1 else 0.0
        ratio = super().expected_unique(n, rows) / super().expected_unique(self.indices.size, rows)
        return float(min(rows, n, own * ratio))

    def expected_misses(self, n, rows, cache_rows):
        if int(n) == self.indices.size:
            return self.own_misses(rows, cache_rows)
        if int(n) < self.indices.size:  # a prefix of the stream: exact unique + its own reuse times
            unique = self.expected_unique(n, rows)
            reuse = ReuseHistogram.from_indices(self.indices[:max(int(n), 1)])
            return float(min(n, max(unique, reuse.misses_beyond(n, cache_rows, unique))))
        # past its length: the stream's own misses at its length, scaled by the frequency model's
        # growth, as expected_unique scales its count. The frequency model alone forgets the
        # stream's order, and had made one more bag faster: 5,000 rows read in turn 4 times
        # (every reuse 5,000 apart: each misses a T4's 2,457-row L2 share), 177.0 us at 20,000
        # bags, 138.2 us at 20,001
        size = self.indices.size
        own = self.own_misses(rows, cache_rows)
        model_n = super().expected_misses(n, rows, cache_rows)
        model_size = super().expected_misses(size, rows, cache_rows)
        scaled = own * model_n / model_size if model_size > 0 else model_n
        return float(min(n, max(self.expected_unique(n, rows), scaled)))

    def own_misses(self, rows, cache_rows) -> float:
        """The whole stream's misses under an LRU of cache_rows rows (its unique rows at least),
        worked out once per cache size: every call past the stream's length scales it, and its
        reuse histogram took ~23 ms a call on 200,000 indices (a sharding run's pricing had gone
        1.02 -> 1.29 s)."""
        self.groups(rows)  # the table's rows must hold the stream's ids
        key = float(cache_rows)
        if key not in self._own_misses:
            n = self.indices.size
            unique = float(self.unique_ids.size)  # np.unique of the whole stream: the same count
            self._own_misses[key] = float(min(n, max(unique, self.reuse.misses_beyond(n, cache_rows, unique))))
        return self._own_misses[key]

    def _sample_ranks(self, n, rows, rng):
        return rng.choice(self.indices, size=n)

    def sample(self, n, rows, rng=None):
        rows = _check_rows(rows)
        n, rng = _check_sample(n, rng)
        # the table must hold the stream's ids, as in every other use: a stream naming row 99
        # had been sampled for a 10-row table, ids the collector then looked up out of range
        # (torch's "Expected i < index_size" on the CPU; a device-side assert on CUDA)
        self.groups(rows)
        return self._sample_ranks(n, rows, rng)

    def describe(self):
        return f"indices(n={self.indices.size}, unique={self.unique_ids.size})"

    def spec(self):
        return f"indices:n={self.indices.size},unique={self.unique_ids.size},sha1={self._digest}"
