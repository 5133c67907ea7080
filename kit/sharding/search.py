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

# plans a second of time budget stands for (local_search's max_plans). A count, not the clock,
# ends the search, so that a plan does not depend on the machine's load. A busy 2-core machine
# (load 4-6) priced 240k-550k plans per wall-clock second (dgx-a100 at 1 and 4 nodes, pcie8;
# 20-60 tables), so at 150k the wall clock, a safety cap at the same time budget, binds only on
# a slower or busier machine still. 20 tables on dgx-a100 finish after 121,688 plans.
PLANS_PER_S = 150_000
# the largest world those rates were measured at (dgx-a100 x4): a plan is ~14 W features, so a
# cluster prices fewer a second on any machine, and its wall clock can bind whatever the load
# (2 tables in 2 s on the shared 2-core box: 77,491 plans on 512 GPUs, 59,398 on 1,024)
PLANS_PER_S_MAX_WORLD = 32
# the most plans one search may be given (max_plans): about 18.5 hours at PLANS_PER_S, where 20
# tables on dgx-a100 finish after 121,688; a larger count is a typo, not a search
MAX_PLANS_LIMIT = 10_000_000_000
# values (plans x features) of single-table moves priced in one batch: the wall clock is checked
# between batches, so that one round of moves cannot overrun the deadline by much. 2 tables on
# 2,048 GPUs have 12,804 moves of 28,673 features: 367 million values, one float64 array of
# 2.9 GB priced for seconds, where the clock had been read only before and after it
MOVE_CHUNK_VALUES = 2**22

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


class SearchResult(tuple):
    """(best plan, its cost, plans priced, pool), as four values to unpack, and `stopped_by`,
    why the search ended: "finished" (it ran out of restarts, or `patience` restarts in a row
    found nothing better), "plan budget" (it had priced max_plans: the same inputs stop at the
    same plan) or "time budget" (the wall clock bound first: where it stopped, and so the plan,
    depends on the machine's speed and load)."""

    def __new__(cls, best, cost, plans, pool, stopped_by):
        self = super().__new__(cls, (best, cost, plans, pool))
        self.stopped_by = stopped_by
        return self

    @property
    def finished(self) -> bool:
        return self.stopped_by == "finished"


class _Counter:
    """Prices plans, counts them, and says when the search must stop: at max_plans priced (a
    count, so that the same inputs give the same plan whatever the machine's load: a 0.1 s
    wall-clock budget had stopped 20 tables on dgx-a100 at 0.8714 ms, where the finished
    search gives 0.8545), or at the wall-clock deadline, a safety cap that is reported."""

    def __init__(self, model, max_plans: float = math.inf, deadline: float = math.inf):
        self.model, self.n = model, 0
        self.max_plans, self.deadline, self.stopped_by = max_plans, deadline, None

    def out(self) -> bool:
        if self.stopped_by is None:
            if self.n >= self.max_plans:  # checked first: a count is the same on every run
                self.stopped_by = "plan budget"
            elif time.perf_counter() >= self.deadline:
                self.stopped_by = "time budget"
        return self.stopped_by is not None

    def late(self) -> bool:
        """Whether the wall clock is past the deadline (then stopped_by says so): read within a
        round of moves, where the plan budget is not (it counts whole rounds, so that a count
        stops every run at the same plan)."""
        if self.stopped_by is None and time.perf_counter() >= self.deadline:
            self.stopped_by = "time budget"
        return self.stopped_by == "time budget"

    def cost(self, choices):
        self.n += len(choices)
        return self.model.cost(choices)

    def features_cost(self, X):
        self.n += len(X)
        return self.model.cost_from_features(X)


def _best_single_move(model, counter, choice, X):
    """All single-table moves from `choice` (features X) priced, MOVE_CHUNK_VALUES at a time:
    (cost, t, o), or None where the wall clock ran out between two batches."""
    T, O = model.valid.shape
    less = X[None, :] - model.contrib[np.arange(T), choice]  # (T, F): X without each table's option
    step = max(1, MOVE_CHUNK_VALUES // model.F)  # moves a batch: whole tables, or a table's options
    tables, options = max(1, step // O), min(O, step)
    c = np.empty((T, O))
    for t0 in range(0, T, tables):
        t1 = min(T, t0 + tables)
        for o0 in range(0, O, options):
            if (t0 or o0) and counter.late():
                return None
            o1 = min(O, o0 + options)
            Xn = less[t0:t1, None, :] + model.contrib[t0:t1, o0:o1]
            c[t0:t1, o0:o1] = counter.features_cost(Xn.reshape(-1, model.F)).reshape(t1 - t0, o1 - o0)
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


def _descend(model, counter, choice, pairs: bool):
    choice = choice.copy()
    X = model.contrib[np.arange(len(choice)), choice].sum(0)
    cost = float(model.cost_from_features(X[None])[0])
    while not counter.out():
        move = _best_single_move(model, counter, choice, X)
        if move is None:  # out of time part way through the round
            break
        c, t, o = move
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


def plans_for_budget(time_budget_s: float) -> int:
    """The plan budget a time budget stands for, at PLANS_PER_S."""
    return max(1, int(PLANS_PER_S * time_budget_s))


def local_search(model, starts: dict[str, np.ndarray] | None = None, time_budget_s: float = 2.0,
                 restarts: int = 200, patience: int = 40, seed: int = 0, pairs: bool | None = None,
                 max_plans: int | None = None) -> SearchResult:
    """(best plan, its cost, plans priced, pool), with .stopped_by (SearchResult): pool is
    [(cost, plan)] of every descent's end, best first.

    The search stops when it finishes, or at the first check (one before each move) after it
    has priced max_plans plans (None: plans_for_budget(time_budget_s)), or after time_budget_s
    of wall clock, whichever comes first. Short of the last, the same inputs and seed give the
    same plan, bit for bit, however loaded the machine."""
    rng = np.random.default_rng(seed)
    T = len(model.tables)
    if max_plans is None:
        max_plans = plans_for_budget(time_budget_s)
    counter = _Counter(model, max_plans, time.perf_counter() + time_budget_s)
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
        ch, c = _descend(model, counter, s, pairs)
        pool.append((c, ch))
        if c < best_c:
            best_c, best = c, ch
    stale = 0
    for _ in range(restarts):  # iterated local search: kick a few tables, descend again
        if counter.out() or stale >= patience:
            break
        kick = best.copy()
        for t in rng.choice(T, size=min(T, max(2, T // 10)), replace=False):
            kick[t] = rng.integers(0, model.n_options[t])
        ch, c = _descend(model, counter, kick, pairs)
        pool.append((c, ch))
        stale += 1
        if c < best_c - 1e-12:
            best_c, best, stale = c, ch, 0
    pool.sort(key=lambda x: x[0])
    return SearchResult(best, best_c, counter.n, pool, counter.stopped_by or "finished")


def exhaustive(model, max_plans: int = 2_000_000):
    """The optimum by enumerating every plan (small cases only): (choice, cost, plans)."""
    # a whole number: the float product overflows (300 tables of 40 placements: 40^300 is inf,
    # and int(inf) had ended in an OverflowError, not this message)
    total = math.prod(int(n) for n in model.n_options)
    if total > max_plans:
        # the power of ten by log10, which takes any int: str() of one past 4,300 digits is a
        # ValueError (Python's int_max_str_digits; 4,800 tables of 8 placements: 8^4800)
        count = f"{total:,}" if total < 10**15 else f"about 10^{math.floor(math.log10(total))}"
        raise KitError(f"exhaustive search would price {count} plans (limit {max_plans:,}); "
                       "use fewer tables or GPUs")
    grids = np.stack(np.meshgrid(*[np.arange(n) for n in model.n_options], indexing="ij"), -1)
    allp = grids.reshape(-1, len(model.tables))
    costs = model.cost(allp)
    i = int(np.argmin(costs))
    return allp[i], float(costs[i]), total
