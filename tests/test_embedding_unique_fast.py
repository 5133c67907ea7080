"""expected_unique's fast path (per-group terms worked out once per table) gives the numbers of
the formula it replaced, bit for bit, and the fused L2 split no longer rebuilds each table's
Zipf groups on every step of its bisection."""
import numpy as np
import pytest

from kit.embedding import Empirical, Table, Uniform, Zipf, lookup_cost
from kit.embedding import distributions as D
from kit.embedding.cost import fused_l2_shares


def old_unique(dist, n, rows):
    """The formula as it was: U(n) = Σ_g c_g [1 - (1 - p_g)^n], from the groups each call."""
    if n <= 0:
        return 0.0
    p, c = dist.groups(rows)
    touched = -np.expm1(n * np.log1p(-np.minimum(p, 1 - 1e-16)))
    return float(min(rows, n, np.dot(c, touched)))


def _cases(k, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(k):
        rows = int(10 ** rng.uniform(0, 9.5))
        n = float(10 ** rng.uniform(-1, 10)) if rng.random() < 0.7 else int(10 ** rng.uniform(0, 8))
        kind = rng.integers(4)
        dist = (Uniform() if kind == 0 else Zipf(0.0) if kind == 1
                else Zipf(float(rng.choice([1.0, rng.uniform(0, 3), rng.uniform(0, 60)]))))
        yield dist, n, rows


def test_fast_unique_is_the_old_formula_bit_for_bit():
    for dist, n, rows in _cases(400):
        want = old_unique(dist, n, rows)
        assert dist.expected_unique(n, rows) == want, (dist, n, rows)
        assert dist.unique_curve(rows)(n) == want, (dist, n, rows)
    assert Zipf(1.1).unique_curve(1000)(0) == 0.0 == Zipf(1.1).unique_curve(1000)(-3)


def test_an_index_tensor_keeps_its_own_model():
    ids = np.random.default_rng(1).zipf(1.3, 5000) % 20_000
    d = Empirical(ids)
    for n in (0, 1, 17, 5000, 5001, 1e5, 3.3e7):
        assert d.unique_curve(20_000)(n) == d.expected_unique(n, 20_000)


def test_fused_lookups_price_as_with_the_old_formula(monkeypatch):
    rng = np.random.default_rng(3)
    tabs = [Table(rows=int(10 ** rng.uniform(3, 8)), dim=int(rng.choice([16, 64, 256])),
                  pooling=float(rng.integers(1, 80)), distribution=Zipf(float(rng.uniform(0.3, 1.3))))
            for _ in range(40)]
    new = lookup_cost(tabs, 4096, "a100-sxm4-80gb").to_dict()
    monkeypatch.setattr(D.Distribution, "expected_unique", old_unique)
    monkeypatch.setattr(D.Distribution, "unique_curve", lambda self, rows: lambda n: old_unique(self, n, rows))
    assert lookup_cost(tabs, 4096, "a100-sxm4-80gb").to_dict() == new


def test_the_l2_split_builds_each_tables_groups_once():
    # 300 tables fused on one rank: past the groups' 256-entry LRU caches, the bisection's ~20
    # passes over the tables had rebuilt every table's Zipf groups on each pass (48,919 of
    # 50,848 calls for one exact plan of 300 tables on dgx-a100: 23 s of its 23.3)
    rng = np.random.default_rng(4)
    tabs = [Table(rows=int(10 ** rng.uniform(5, 8)), dim=64, pooling=20.0,
                distribution=Zipf(float(rng.uniform(0.3, 1.3)))) for _ in range(300)]
    D._zipf_groups.cache_clear()
    D._zipf_unique_terms.cache_clear()
    shares = fused_l2_shares(tabs, [t.distribution for t in tabs], [4096] * 300, 30e6, backward=False)
    assert sum(shares) == pytest.approx(30e6, rel=1e-3)  # the bisection ran: the L2 is full
    assert D._zipf_groups.cache_info().misses <= len(tabs)
