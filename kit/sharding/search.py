"""Searching for a plan: greedy baselines, a model-guided local search, exhaustive enumeration.

Greedy baselines (the classic heuristics): sort tables by a key, largest first, and put each
whole table (table-wise) on the rank with the least key so far that has memory left; a table
that fits nowhere whole goes row-wise. Keys: size E·D·bytes, lookup cost D·L, and D·L·log2 E.

The local search starts from every baseline, from plans where every table takes the same kind
(all row-wise, all data-parallel, ...), and from a few random plans, then repeatedly takes the
best single-table move (any option for any one table; all T·O neighbours priced in one
vectorised step), pairs of moves when the case is small, and swaps of two tables' placements;
at a local optimum it perturbs a few tables and descends again, keeping the best plan seen.
It only ever accepts improvements over the best baseline, so it is never worse under the model.
"""
from __future__ import annotations

import itertools
import math
import time

import numpy as np

from kit.errors import KitError

GREEDY_KEYS = {
    "greedy_size": lambda t: t.bytes,
    "greedy_dim_pooling": lambda t: t.dim * t.pooling,
    "greedy_dim_pooling_log_rows": lambda t: t.dim * t.pooling * math.log2(max(t.rows, 2)),
}


def greedy(model, key) -> np.ndarray:
    """One option index per table, by the greedy-by-key rule."""
    W, T = model.world, len(model.tables)
    load, mem = np.zeros(W), np.zeros(W)
    choice = np.zeros(T, dtype=np.int64)
    for t in sorted(range(T), key=lambda t: -key(model.tables[t])):
        opts = model.options[t]
        tw = [(o, opt.ranks[0]) for o, opt in enumerate(opts) if opt.kind == "tw"]
        need = model.contrib[t, [o for o, _ in tw], 3 * W + np.array([r for _, r in tw], dtype=np.int64)]
        fits = [(load[r], r, o) for (o, r), nb in zip(tw, need) if mem[r] + nb <= model.cap]
        if fits:
            _, r, o = min(fits)
        else:  # too big for any one rank (or table-wise not allowed): spread it over every rank
            o = next((o for o, opt in enumerate(opts) if opt.kind == "rw"), tw[0][0] if tw else 0)
        choice[t] = o
        mem += model.contrib[t, o, 3 * W:4 * W]
        load += key(model.tables[t]) * (model.contrib[t, o, 2 * W:3 * W] > 0) \
            / max(1, (model.contrib[t, o, 2 * W:3 * W] > 0).sum())
    return choice


def baselines(model) -> dict[str, np.ndarray]:
    return {name: greedy(model, key) for name, key in GREEDY_KEYS.items()}


def uniform_starts(model) -> dict[str, np.ndarray]:
    """Plans where every table takes the same kind (rw, twrw on node 0, dp, the widest cw),
    far from the table-wise basin a single move cannot leave (balanced but comm-heavy)."""
    out = {}
    for kind in ("rw", "twrw", "dp", "cw"):
        choice = []
        for t, opts in enumerate(model.options):
            idx = [o for o, opt in enumerate(opts) if opt.kind == kind]
            if not idx:
                break
            if kind == "cw":  # the widest split, staggered over the ranks
                widest = max(len(opts[o].ranks) for o in idx)
                idx = [o for o in idx if len(opts[o].ranks) == widest]
            choice.append(idx[t % len(idx)])
        else:
            out[f"all_{kind}"] = np.array(choice, dtype=np.int64)
    return out


class _Counter:
    def __init__(self, model):
        self.model, self.n = model, 0

    def cost(self, choices):
        self.n += len(choices)
        return self.model.cost(choices)

    def features_cost(self, X):
        self.n += len(X)
        return self.model.cost_from_features(X)


def _best_single_move(model, counter, choice, X):
    """All single-table moves from `choice` (features X) priced at once: (cost, t, o)."""
    T = len(model.tables)
    cur = model.contrib[np.arange(T), choice]  # (T, F)
    Xn = X[None, None, :] - cur[:, None, :] + model.contrib  # (T, O, F)
    c = counter.features_cost(Xn.reshape(-1, model.F)).reshape(T, -1)
    c[~model.valid] = np.inf
    t, o = np.unravel_index(np.argmin(c), c.shape)
    return c[t, o], int(t), int(o)


def _best_pair_move(model, counter, choice, X):
    T, best = len(model.tables), (np.inf, None)
    cur = model.contrib[np.arange(T), choice]
    for a, b in itertools.combinations(range(T), 2):
        oa, ob = model.n_options[a], model.n_options[b]
        Xn = (X - cur[a] - cur[b])[None, None, :] + model.contrib[a, :oa, None, :] + model.contrib[b, None, :ob, :]
        c = counter.features_cost(Xn.reshape(-1, model.F)).reshape(oa, ob)
        i, j = np.unravel_index(np.argmin(c), c.shape)
        if c[i, j] < best[0]:
            best = (c[i, j], (a, int(i), b, int(j)))
    return best


def _descend(model, counter, choice, pairs: bool, deadline: float):
    choice = choice.copy()
    X = model.contrib[np.arange(len(choice)), choice].sum(0)
    cost = float(model.cost_from_features(X[None])[0])
    while time.perf_counter() < deadline:
        c, t, o = _best_single_move(model, counter, choice, X)
        if c < cost - 1e-9:
            X += model.contrib[t, o] - model.contrib[t, choice[t]]
            choice[t], cost = o, float(c)
            continue
        if pairs:
            c, mv = _best_pair_move(model, counter, choice, X)
            if mv is not None and c < cost - 1e-9:
                a, i, b, j = mv
                X += model.contrib[a, i] - model.contrib[a, choice[a]] + model.contrib[b, j] - model.contrib[b, choice[b]]
                choice[a], choice[b], cost = i, j, float(c)
                continue
        break
    return choice, cost


def local_search(model, starts: dict[str, np.ndarray] | None = None, time_budget_s: float = 2.0,
                 restarts: int = 200, patience: int = 40, seed: int = 0, pairs: bool | None = None):
    """(best plan, its cost, plans priced, pool): pool is [(cost, plan)] of every descent's end,
    best first. Deterministic for a given seed when the time budget does not cut it short."""
    rng = np.random.default_rng(seed)
    T = len(model.tables)
    deadline = time.perf_counter() + time_budget_s
    counter = _Counter(model)
    starts = dict(starts or baselines(model))
    starts.update(uniform_starts(model))
    for k in range(3):
        starts[f"random{k}"] = np.array([rng.integers(0, n) for n in model.n_options])
    if pairs is None:
        pairs = T * int(model.n_options.max()) <= 120
    best_c, pool = np.inf, []
    best = next(iter(starts.values())).copy()  # kept when every plan is over the memory cap
    base_c = counter.cost(np.stack(list(starts.values())))
    for s, c0 in zip(starts.values(), base_c):
        if c0 < best_c:
            best_c, best = float(c0), s.copy()
    for s in starts.values():
        ch, c = _descend(model, counter, s, pairs, deadline)
        pool.append((c, ch))
        if c < best_c:
            best_c, best = c, ch
    stale = 0
    for _ in range(restarts):  # iterated local search: kick a few tables, descend again
        if time.perf_counter() >= deadline or stale >= patience:
            break
        kick = best.copy()
        for t in rng.choice(T, size=min(T, max(2, T // 10)), replace=False):
            kick[t] = rng.integers(0, model.n_options[t])
        ch, c = _descend(model, counter, kick, pairs, deadline)
        pool.append((c, ch))
        stale += 1
        if c < best_c - 1e-12:
            best_c, best, stale = c, ch, 0
    pool.sort(key=lambda x: x[0])
    return best, best_c, counter.n, pool


def exhaustive(model, max_plans: int = 2_000_000):
    """The optimum by enumerating every plan (small cases only): (choice, cost, plans)."""
    total = int(np.prod(model.n_options.astype(float)))
    if total > max_plans:
        raise KitError(f"exhaustive search would price {total:,} plans (limit {max_plans:,}); "
                       "use fewer tables or GPUs")
    grids = np.stack(np.meshgrid(*[np.arange(n) for n in model.n_options], indexing="ij"), -1)
    allp = grids.reshape(-1, len(model.tables))
    costs = model.cost(allp)
    i = int(np.argmin(costs))
    return allp[i], float(costs[i]), total
