"""The LRU replay reference, by hand."""
import numpy as np

from kit.embedding.replay import lru_hit_rate


def test_lru_by_hand():
    # cap 2: 1 miss, 2 miss, 1 hit, 3 miss (evicts 2), 1 hit, 2 miss -> 2 hits of 6
    assert lru_hit_rate(np.array([1, 2, 1, 3, 1, 2]), 2) == 2 / 6
    # cap 3 keeps 2 as well: 1, 2, 1 hit, 3, 1 hit, 2 hit -> 3 of 6
    assert lru_hit_rate([1, 2, 1, 3, 1, 2], 3) == 3 / 6
