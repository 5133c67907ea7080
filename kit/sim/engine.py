"""Discrete-event simulation of an ExecGraph: when every op starts and ends.

Every (rank, resource) is a FIFO queue with a cursor. The op under a cursor runs once the op
before it on the queue and all its deps have ended: start = max of their ends. A queue whose
head waits on an unfinished dep parks on that op and is woken when it ends. At a collective the
queue registers its arrival time and parks; the last member to arrive starts the collective for
everyone at the latest arrival (inter-rank sync) and wakes the parked queues. Queues that can
run are kept in a heap by simulated time, so a deadlock (a collective some member never
reaches, or a cycle of waits) is detected and named.

Cost: one pass over the ops, a few list operations each (about 1 µs/op in CPython).
"""
from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from kit.errors import KitError
from kit.sim.graph import ExecGraph


@dataclass
class SimResult:
    """Start/end time of every op (ms from 0), plus views: timeline, critical path, breakdown."""

    graph: ExecGraph
    start_ms: np.ndarray
    end_ms: np.ndarray
    ready_ms: dict  # collective op id -> the time its own rank was ready for it
    done_order: list | None = None  # op ids in the order the simulation finished them

    def retimed_makespan_ms(self, dur_ms) -> float:
        """The makespan of the same graph with other op durations, without a new simulation.

        Every queue is FIFO in a fixed order and every op starts at the max of its
        predecessors' ends (a collective: of its members' ready times), so the timing is a
        longest path over a fixed DAG. The order this simulation finished the ops in is a
        topological order of that DAG for any durations: one pass in it re-times the graph."""
        g = self.graph
        d = [float(x) for x in dur_ms]
        if len(d) != len(g):
            raise KitError(f"retime: {len(d)} durations for a graph of {len(g)} ops")
        # each checked, as set_duration does: min() caught a NaN only in first place
        # ([1.0, nan] retimed to 1.0 ms) and let an inf through as an inf makespan
        bad = next((x for x in d if not 0 <= x < math.inf), None)
        if bad is not None:
            raise KitError(f"retime: durations must be finite numbers >= 0 ms, got {bad!r}")
        prev, deps, group = g.prev, g.deps, g.group
        size: dict = {}
        for key in group:
            if key is not None:
                size[key] = size.get(key, 0) + 1
        end = [0.0] * len(d)
        order = self.done_order
        n, k = len(order), 0
        while k < n:
            i = order[k]
            key = group[i]
            members = [i] if key is None or size[key] == 1 else order[k:k + size[key]]
            t0 = 0.0
            for j in members:  # a collective's members finish consecutively
                p = prev[j]
                t = end[p] if p >= 0 else 0.0
                for q in deps[j]:
                    if end[q] > t:
                        t = end[q]
                if t > t0:
                    t0 = t
            for j in members:
                end[j] = t0 + d[j]
            k += len(members)
        return max(end) if end else 0.0

    def rank_end_ms(self, rank: int) -> float:
        ops = self.graph.order.get(rank)
        if ops is None:
            raise KitError(f"rank {rank} is not simulated: simulated ranks are {self.graph.ranks}")
        return float(self.end_ms[ops].max()) if ops else 0.0

    @property
    def makespan_ms(self) -> float:
        return float(self.end_ms.max()) if len(self.end_ms) else 0.0

    def slowest_rank(self) -> int:
        """The rank that ends last; a rank with ops wins a tie with one without (all ops of
        0 ms had picked an empty rank 0, and critical_path() then refused it)."""
        return max(self.graph.ranks, key=lambda r: (self.rank_end_ms(r), bool(self.graph.order[r])))

    def timeline(self):
        """DataFrame of intervals: rank, stream, name, kind, start_ms, end_ms, op, members."""
        import pandas as pd

        g = self.graph
        return pd.DataFrame({
            "rank": np.asarray(g.rank, dtype=np.int64),
            "stream": g.resource,
            "name": g.label,
            "kind": g.kind,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "op": np.arange(len(g), dtype=np.int64),
            "members": [len(g.members[r]) for r in g.rank],
        })

    def critical_path(self, rank: int | None = None, follow_ranks: bool = False):
        from kit.sim.critical import critical_path

        return critical_path(self, rank, follow_ranks)

    def breakdown(self, rank: int | None = None, follow_ranks: bool = False) -> dict:
        from kit.sim.critical import breakdown, path_segments

        return breakdown(path_segments(self, rank, follow_ranks))


def simulate(graph: ExecGraph) -> SimResult:
    """Run the discrete-event simulation; raises KitError on a deadlock."""
    g = graph
    n = len(g)
    prev, deps, dur, group, rank_of = g.prev, g.deps, g.dur_ms, g.group, g.rank
    end = [0.0] * n
    start = [0.0] * n
    done = [False] * n
    size: dict = {}
    for key in group:
        if key is not None:
            size[key] = size.get(key, 0) + 1
    # one FIFO queue per (rank, resource); ops wait for their deps, collectives for their group
    qid: dict = {}
    queues: list[list[int]] = []
    res_of = [0] * n
    for i, (r, name) in enumerate(zip(rank_of, g.resource)):
        q = qid.get((r, name))
        if q is None:
            q = qid[(r, name)] = len(queues)
            queues.append([])
        queues[q].append(i)
        res_of[i] = q
    ptr = [0] * len(queues)
    waiters: dict = {}  # op id -> queues blocked on it
    arrived: dict = {}  # key -> [op ids]
    ready_at: dict = {}  # op id -> ready time (collectives only)
    finished: list = []  # op ids in the order they were finished
    if g.group_ranks:
        _check_declared_ranks(g)
    for i, d in enumerate(deps):
        for j in d:
            if rank_of[j] != rank_of[i]:
                raise KitError(f"op {g.label[i]!r} (rank {rank_of[i]}) depends on op {j} of rank "
                               f"{rank_of[j]}: cross-rank order must go through a collective")
    # the dep a held queue's op waits on: woken, the queue skips the deps before it and, while
    # the op still waits, moves on to the next undone one. Rescanned from the first on every
    # wake, a host sync on 8,000 ops that end one by one took 3.5 s (D^2 / 2 checks)
    held = [0] * len(queues)
    heap = [(0.0, q) for q in range(len(queues))]
    while heap:
        _, q = heapq.heappop(heap)
        ops = queues[q]
        k = ptr[q]
        m = len(ops)
        x = held[q]
        if x:
            ds = deps[ops[k]]
            n_ds = len(ds)
            while x < n_ds and done[ds[x]]:
                x += 1
            if x < n_ds:  # still held: the ends are read in the one full scan below
                held[q] = x
                waiters.setdefault(ds[x], []).append(q)
                continue
            held[q] = 0
        while k < m:
            i = ops[k]
            p = prev[i]
            t = end[p] if p >= 0 else 0.0
            blocked = False
            for j in deps[i]:
                if not done[j]:
                    waiters.setdefault(j, []).append(q)
                    held[q] = deps[i].index(j)  # the first undone one
                    blocked = True
                    break
                e = end[j]
                if e > t:
                    t = e
            if blocked:
                break
            key = group[i]
            if key is not None and size[key] > 1:
                if i in ready_at:  # already arrived; parked until the group completes
                    break
                ready_at[i] = t
                members = arrived.setdefault(key, [])
                members.append(i)
                if len(members) < size[key]:
                    break
                t0 = max(ready_at[j] for j in members)
                for j in members:
                    start[j] = t0
                    end[j] = t0 + dur[j]
                    done[j] = True
                    finished.append(j)
                    if j != i:
                        qj = res_of[j]
                        ptr[qj] += 1
                        heapq.heappush(heap, (end[j], qj))
                    for w in waiters.pop(j, ()):
                        heapq.heappush(heap, (end[j], w))
                del arrived[key]
                k += 1
                continue
            start[i] = t
            end[i] = t + dur[i]
            done[i] = True
            finished.append(i)
            if key is not None:
                ready_at[i] = t
            ws = waiters.pop(i, None)
            if ws:
                for w in ws:
                    heapq.heappush(heap, (end[i], w))
            k += 1
        ptr[q] = k
    if not all(done):
        raise KitError(_deadlock(g, done, arrived, ready_at))
    return SimResult(g, np.asarray(start), np.asarray(end), ready_at, finished)


def _ranks_text(ranks) -> str:
    """'rank 3', 'ranks 0-4, 6-15' (runs of consecutive ranks as ranges)."""
    ranks = sorted(ranks)
    runs: list = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return ("rank " if len(ranks) == 1 else "ranks ") + shown


def _check_declared_ranks(g: ExecGraph) -> None:
    """KitError naming a collective that some of its declared ranks never issue (they would not
    be waited for: the group is the ranks that hold its key)."""
    holders: dict = {}
    first: dict = {}
    for i, key in enumerate(g.group):
        if key is not None and key in g.group_ranks:
            holders.setdefault(key, set()).add(g.rank[i])
            first.setdefault(key, i)
    for key, want in g.group_ranks.items():
        missing = set(want) - holders.get(key, set())
        if missing:
            raise KitError(f"collective {g.label[first[key]]!r} (group {key!r}): "
                           f"{_ranks_text(missing)} never issue{'s' if len(missing) == 1 else ''} it, "
                           f"though it names {_ranks_text(want)}; {_ranks_text(holders[key])} would "
                           "wait for it forever")


def _deadlock(g: ExecGraph, done, arrived, ready_at) -> str:
    """The deadlock message: a collective some of its ranks reached, the ranks that did not and
    where each of them is held (a collective they reached first, or the op they never got to)."""
    if arrived:  # a group some of whose ranks are waiting at it
        key = min(arrived, key=lambda k: min(arrived[k]))
    else:
        key = g.group[next(j for j in range(len(g)) if not done[j] and g.group[j] is not None)]
    ops = [j for j, k in enumerate(g.group) if k == key]
    label = g.label[ops[0]]
    reached = {g.rank[j] for j in arrived.get(key, ())}
    behind = sorted({g.rank[j] for j in ops if j not in ready_at} - reached)
    msg = f"deadlock: collective {label!r} (group {key!r}) never started: "
    msg += f"{_ranks_text(reached)} reached it" if reached else "no rank reached it"
    if behind:
        msg += f", {_ranks_text(behind)} did not"
    held: dict = {}  # where a rank that did not reach it is held -> those ranks
    for r in behind:
        parked = [j for j in g.order[r] if j in ready_at and not done[j] and g.group[j] != key]
        if parked:
            j = parked[0]
            why = f"waiting at collective {g.label[j]!r} (group {g.group[j]!r})"
        else:
            j = next(j for j in g.order[r] if not done[j])
            why = f"held at {g.label[j]!r} on {g.resource[j]}"
        held.setdefault(why, []).append(r)
    if held:  # the first 4 places; the ranks held elsewhere named (a 5th had gone unsaid)
        places = list(held.items())
        shown = [f"{_ranks_text(rs)}: {why}" for why, rs in places[:4]]
        if len(places) > 4:
            shown.append(f"{_ranks_text([r for _, rs in places[4:] for r in rs])}: held elsewhere")
        msg += " (" + "; ".join(shown) + ")"
    calls = Counter(g.rank[j] for j in ops)
    twice = sorted(r for r, n in calls.items() if n > 1)
    if twice:  # its group counts each call: a second call on one queue waits behind the first
        msg += (f"; {_ranks_text(twice)} issue{'s' if len(twice) == 1 else ''} it more than once, "
                "and each call counts as a member (give each collective call its own group key)")
    return msg + "; check that every rank issues its collectives in a consistent order"
