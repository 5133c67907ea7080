"""The reference the analytic cache model is checked against: replay an index stream through an
LRU cache, access by access (slow, exact; for benchmarks and notebooks, not for prediction)."""
from __future__ import annotations

from collections import OrderedDict


def lru_hit_rate(stream, capacity: int) -> float:
    """Fraction of accesses in `stream` (array-like of row ids) that hit an LRU cache of
    `capacity` rows, starting empty."""
    cache, hits = OrderedDict(), 0
    values = stream.tolist() if hasattr(stream, "tolist") else list(stream)
    for v in values:
        if v in cache:
            hits += 1
            cache.move_to_end(v)
        else:
            cache[v] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits / len(values)
