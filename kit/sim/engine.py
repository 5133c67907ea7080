"""Discrete-event simulation of an ExecGraph: when every op starts and ends.

Each simulated rank is a cursor over its ops in add order. Ops on a rank only depend on earlier
ops of the same rank, so a rank advances op by op, taking start = max(end of the op before it on
the same resource, end of its deps). At a collective the rank registers its arrival time and
parks; the last member to arrive starts the collective for everyone at the latest arrival time
(inter-rank sync) and wakes the parked ranks. Ranks that can run are kept in a heap ordered by
their current simulated time, so the simulation proceeds in time order and a deadlock (a
collective some member never reaches) is detected and named.

Cost: one pass over the ops, a few list operations each (about 1 µs/op in CPython).
"""
from __future__ import annotations

import heapq
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

    def rank_end_ms(self, rank: int) -> float:
        ops = self.graph.order.get(rank)
        if ops is None:
            raise KitError(f"rank {rank} is not simulated: simulated ranks are {self.graph.ranks}")
        return float(self.end_ms[ops].max()) if ops else 0.0

    @property
    def makespan_ms(self) -> float:
        return float(self.end_ms.max()) if len(self.end_ms) else 0.0

    def slowest_rank(self) -> int:
        return max(self.graph.ranks, key=self.rank_end_ms)

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
        from kit.sim.critical import breakdown

        return breakdown(self.critical_path(rank, follow_ranks))


def simulate(graph: ExecGraph) -> SimResult:
    """Run the discrete-event simulation; raises KitError on a deadlock."""
    g = graph
    n = len(g)
    prev, deps, dur, group, rank_of = g.prev, g.deps, g.dur_ms, g.group, g.rank
    end = [0.0] * n
    start = [0.0] * n
    size: dict = {}
    for key in group:
        if key is not None:
            size[key] = size.get(key, 0) + 1
    arrived: dict = {}  # key -> [op ids]
    ready_at: dict = {}  # op id -> ready time (collectives only)
    cursor = {r: 0 for r in g.order}
    clock = {r: 0.0 for r in g.order}
    heap = [(0.0, r) for r in g.order]
    heapq.heapify(heap)
    for i, d in enumerate(deps):
        for j in d:
            if rank_of[j] != rank_of[i]:
                raise KitError(f"op {g.label[i]!r} (rank {rank_of[i]}) depends on op {j} of rank "
                               f"{rank_of[j]}: cross-rank order must go through a collective")
    while heap:
        _, r = heapq.heappop(heap)
        ops = g.order[r]
        k = cursor[r]
        m = len(ops)
        t = clock[r]
        while k < m:
            i = ops[k]
            p = prev[i]
            t = end[p] if p >= 0 else 0.0
            for j in deps[i]:
                e = end[j]
                if e > t:
                    t = e
            key = group[i]
            if key is None or size[key] == 1:
                start[i] = t
                end[i] = t + dur[i]
                if key is not None:
                    ready_at[i] = t
                k += 1
                continue
            ready_at[i] = t
            members = arrived.setdefault(key, [])
            members.append(i)
            if len(members) < size[key]:
                break  # park this rank until the last member arrives
            t0 = max(ready_at[j] for j in members)
            for j in members:
                start[j] = t0
                end[j] = t0 + dur[j]
                rj = rank_of[j]
                if rj != r:
                    cursor[rj] += 1
                    clock[rj] = end[j]
                    heapq.heappush(heap, (end[j], rj))
            del arrived[key]
            k += 1
        cursor[r] = k
        clock[r] = t
    stuck = {r: g.order[r][cursor[r]] for r in g.order if cursor[r] < len(g.order[r])}
    if stuck:
        r, i = next(iter(stuck.items()))
        key = group[i]
        have = sorted(rank_of[j] for j in arrived.get(key, []))
        raise KitError(f"deadlock: collective {g.label[i]!r} (group {key!r}) on rank {r} never "
                       f"started: {len(have)} of {size.get(key)} ranks reached it ({have}); "
                       "check that every rank issues its collectives in the same order")
    return SimResult(g, np.asarray(start), np.asarray(end), ready_at)
