"""The reference the analytic cache model is checked against: replay an index stream through an
LRU cache, access by access (slow, exact; for benchmarks and notebooks, not for prediction)."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from kit.errors import KitError, whole_number


def lru_hit_rate(stream, capacity: int) -> float:
    """Fraction of accesses in `stream` (array-like of row ids) that hit an LRU cache of
    `capacity` rows, starting empty."""
    capacity = whole_number(capacity, "capacity (rows)", low=0)
    try:
        ids = np.asarray(stream)
    except (TypeError, ValueError):  # ragged nested lists
        ids = None
    if ids is None or ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
        got = " ".join(repr(stream).split())
        raise KitError(f"stream must be a non-empty 1-D sequence of whole row ids, got "
                       f"{got if len(got) <= 80 else got[:77] + '...'}")
    cache, hits = OrderedDict(), 0
    values = ids.tolist()
    for v in values:
        if v in cache:
            hits += 1
            cache.move_to_end(v)
        else:
            cache[v] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits / len(values)
