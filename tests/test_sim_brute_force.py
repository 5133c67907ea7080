"""kit.sim against a brute force: on small random graphs (ranks, streams, host threads, events,
host syncs, collectives, ops of 0 ms) every op starts at the fixed point of "after the op
before it on its queue, after its deps, and with its whole collective group", the critical path
tiles [0, the slowest rank's end] and is a chain of predecessors, and a retime equals a new
simulation. Plus the edge inputs that had given a wrong answer or a wrong error."""
import math
import random

import numpy as np
import pytest

from kit.errors import KitError
from kit.sim import ExecGraph, simulate

GPU = ("compute", "comm", "memcpy")


def _graph(seed: int) -> ExecGraph:
    rnd = random.Random(seed)
    g = ExecGraph()
    ranks = range(rnd.randint(1, 3))
    for r in ranks:
        g.add_rank(r)
    mine = {r: [] for r in ranks}

    def ms(top):
        return rnd.choice([0.0, rnd.uniform(0, top)])

    def some_gpu(r, most):
        ops = [i for i in mine[r] if g.kind[i] in GPU]
        return tuple(rnd.sample(ops, min(len(ops), rnd.randint(0, most))))

    for step in range(rnd.randint(1, 12)):
        if len(ranks) > 1 and rnd.random() < 0.25:
            for r in ranks:
                mine[r].append(g.collective(r, rnd.choice(["comm", "compute"]), ms(3), "ar",
                                            ("ar", step), launch_ms=rnd.choice([None, ms(0.5)]),
                                            deps=some_gpu(r, 2)))
            continue
        for r in ranks:
            x = rnd.random()
            if x < 0.3:
                continue
            if x < 0.7:
                i = g.gpu(r, rnd.choice(["compute", "comm", "s2"]), ms(3), "k",
                          launch_ms=rnd.choice([None, ms(0.5)]), deps=some_gpu(r, 2))
            elif x < 0.85:
                i = g.cpu(r, ms(2), thread=rnd.choice(["cpu", "cpu2"]))
            else:
                i = g.sync(r, some_gpu(r, 1), ms(0.3))
            mine[r].append(i)
    return g


def _brute_start_ms(g: ExecGraph) -> np.ndarray:
    """Iterate start = max(ends of the queue's previous op and the deps), a collective's members
    all at their latest such time, until nothing moves (at most one pass per op)."""
    n = len(g)
    groups: dict = {}
    for i, key in enumerate(g.group):
        if key is not None:
            groups.setdefault(key, []).append(i)
    start = [0.0] * n
    for _ in range(n + 1):
        end = [start[i] + g.dur_ms[i] for i in range(n)]
        new = [max([end[g.prev[i]]] * (g.prev[i] >= 0) + [end[d] for d in g.deps[i]] + [0.0])
               for i in range(n)]
        for members in groups.values():
            t0 = max(new[j] for j in members)
            for j in members:
                new[j] = t0
        if new == start:
            break
        start = new
    return np.asarray(start)


def _predecessors(g: ExecGraph, i: int) -> set:
    members = [j for j, k in enumerate(g.group) if k == g.group[i]] if g.group[i] is not None else [i]
    return {p for j in members for p in (g.prev[j], *g.deps[j]) if p >= 0}


def _reaches(g: ExecGraph, a: int, b: int) -> bool:
    """a is a predecessor of b, or of a 0 ms op that leads to b (the path drops 0 ms segments)."""
    todo, seen = [b], set()
    while todo:
        for p in _predecessors(g, todo.pop()):
            if p == a:
                return True
            if g.dur_ms[p] == 0 and p not in seen:
                seen.add(p)
                todo.append(p)
    return False


@pytest.mark.parametrize("seed", range(200))
def test_simulation_and_critical_path_match_a_brute_force(seed):
    g = _graph(seed)
    if not len(g):
        return
    res = simulate(g)
    start = _brute_start_ms(g)
    assert res.start_ms == pytest.approx(start, abs=1e-9)
    assert res.end_ms == pytest.approx(start + np.asarray(g.dur_ms), abs=1e-9)
    rank = res.slowest_rank()
    assert res.rank_end_ms(rank) == pytest.approx(res.makespan_ms, abs=1e-12)
    for follow in (False, True):
        path = res.critical_path(follow_ranks=follow)
        assert res.breakdown(follow_ranks=follow)["total_ms"] == pytest.approx(res.makespan_ms, abs=1e-9)
        if not len(path):  # every op of 0 ms: nothing to tile
            assert res.makespan_ms == 0
            continue
        s, e = path.start_ms.to_numpy(), path.end_ms.to_numpy()
        assert s[0] == pytest.approx(0, abs=1e-9) and e[-1] == pytest.approx(res.makespan_ms, abs=1e-9)
        assert s[1:] == pytest.approx(e[:-1], abs=1e-9)  # segments meet: no gap, no overlap
        if follow:
            assert not (path.cause == "wait").any()  # the path jumps to the last arriver instead
        ops = [o for o, c in zip(path.op, path.cause) if c not in ("wait", "idle")]
        for a, b in zip(ops, ops[1:]):
            assert a == b or _reaches(g, a, b), (a, b)
    other = [random.Random(seed).uniform(0, 3) for _ in g.dur_ms]
    again = g.copy()
    again.dur_ms = other
    assert res.retimed_makespan_ms(other) == pytest.approx(simulate(again).makespan_ms, rel=1e-12)


def test_the_critical_path_of_zero_ms_ops_starts_on_a_rank_that_has_ops():
    # rank 0 declared but empty, rank 1's op 0 ms: both end at 0 and slowest_rank() picked
    # rank 0, so critical_path() refused the graph ("rank 0 has no ops")
    g = ExecGraph()
    g.add_rank(0)
    g.gpu(1, "compute", 0.0, "k", launch_ms=0.0)
    res = simulate(g)
    assert res.slowest_rank() == 1
    assert len(res.critical_path()) == 0 and res.breakdown()["total_ms"] == 0.0


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("where", [0, 1])
def test_retime_refuses_a_nan_or_inf_duration_anywhere(bad, where):
    # [1.0, nan] had retimed to 1.0 ms (min() sees a NaN only in first place), [1.0, inf] to inf
    g = ExecGraph()
    g.gpu(0, "compute", 1.0, "a")
    g.gpu(0, "compute", 2.0, "b")
    res = simulate(g)
    d = [1.0, 1.0]
    d[where] = bad
    with pytest.raises(KitError, match="finite numbers >= 0 ms"):
        res.retimed_makespan_ms(d)


@pytest.mark.parametrize("bad", [
    {"deps": (5,)},  # not an earlier op
    {"deps": (0.0,)},  # no op id: had passed, then simulate() raised TypeError (a list index)
    {"deps": 0},  # no sequence: had raised TypeError ('int' object is not iterable)
    {"dur_ms": math.nan},
    {"dur_ms": "1 ms"},  # had raised ValueError from float()
])
def test_a_refused_gpu_op_leaves_the_graph_as_it_was(bad):
    # gpu() added the op's launch, and _add its rank, before refusing a dependency: the graph
    # kept an orphan 0.01 ms launch on a new rank 1 (makespan 1.01 ms, not 1.0)
    g = ExecGraph()
    g.gpu(0, "compute", 1.0, "a")
    kw = {"dur_ms": 1.0, "deps": (), **bad}
    with pytest.raises(KitError, match="op 'b' on rank 1"):
        g.gpu(1, "compute", kw["dur_ms"], "b", launch_ms=0.01, deps=kw["deps"])
    assert len(g) == 1 and g.ranks == [0]
    assert simulate(g).makespan_ms == 1.0


def test_numpy_op_ids_are_op_ids():
    g = ExecGraph()
    a = g.gpu(0, "compute", 1.0, "a")
    b = g.gpu(0, "comm", 1.0, "b", kind="comm", deps=np.array([a]))
    assert g.deps[b] == (0,) and type(g.deps[b][0]) is int
    assert simulate(g).makespan_ms == 2.0


def test_a_refused_collective_declares_no_ranks():
    # collective() declared its ranks before gpu() refused the op: simulate() then raised
    # KeyError 'g1', and the collective retried with ranks [0] was "[0, 1] where another rank
    # issued it", though none had
    g = ExecGraph()
    g.gpu(0, "compute", 1.0, "a")
    for bad in ({"dur_ms": math.nan}, {"deps": (7,)}):
        kw = {"dur_ms": 1.0, "deps": (), **bad}
        with pytest.raises(KitError, match="op 'ar' on rank 0"):
            g.collective(0, "comm", kw["dur_ms"], "ar", group="g1", ranks=[0, 1], deps=kw["deps"])
        assert len(g) == 1 and g.group_ranks == {}
    assert simulate(g).makespan_ms == 1.0
    g.collective(0, "comm", 2.0, "ar", group="g1", ranks=[0])
    assert simulate(g).makespan_ms == 2.0  # its own stream: alongside 'a', not after it


@pytest.mark.parametrize("deps", [(np.int64(0), 1.5), (np.int64(0), True), (0, np.int64(1), 1.0)])
def test_every_dependency_after_a_numpy_one_is_checked(deps):
    # after a numpy id the rest were int()ed unchecked: (np.int64(0), 1.5) was ops (0, 1)
    g = ExecGraph()
    g.gpu(0, "compute", 1.0, "a")
    g.gpu(0, "compute", 1.0, "b")
    with pytest.raises(KitError, match="is not an op id"):
        g.gpu(0, "comm", 1.0, "c", kind="comm", deps=deps)
    assert len(g) == 2
