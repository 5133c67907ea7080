"""The critical path of a simulated iteration, with a cause for every segment.

Walking back from a rank's last op, each op's start was set by one predecessor: the op before
it on its resource, a dependency (launch, event, host sync), or, for a collective, the latest
member of its group. The walk follows that binding predecessor. Segments tile [0, end]:

    compute        a GPU compute kernel (or fused block) ran
    communication  a collective ran
    memcpy         a copy ran
    cpu            the host thread ran (CPU work, kernel launches, a host sync's own cost)
    wait           the rank was ready for a collective and waited for another rank to arrive
    idle           nothing ran before the rank's first op (e.g. a late start)

A host op that paces a whole pass (one op standing for the race between launches and kernels;
the builder lists it in graph.meta["paced"]) overlaps the GPU's own work. When a GPU op waited
for one that started while the GPU was still busy, only the gap after the GPU's previous op is
cpu, and the walk goes on along the GPU: the path counts the host time that held the GPU up,
not the time the host ran alongside it.

With follow_ranks=True the walk jumps, at each wait, to the rank that arrived last, so the path
crosses ranks and has no wait segments: it is the chain that set the makespan.
"""
from __future__ import annotations

import pandas as pd

CAUSES = ("compute", "communication", "memcpy", "cpu", "wait", "idle")
_CAUSE = {"compute": "compute", "comm": "communication", "memcpy": "memcpy", "cpu": "cpu",
          "launch": "cpu", "sync": "cpu", "idle": "idle"}
_EPS = 1e-9


def _binding(res, i):
    """The local predecessor whose end set op i's start (-1 if none), and that end."""
    g = res.graph
    best, t = -1, 0.0
    p = g.prev[i]
    if p >= 0:
        best, t = p, res.end_ms[p]
    for j in g.deps[i]:
        if res.end_ms[j] > t + _EPS or best < 0:
            best, t = j, res.end_ms[j]
    return best, float(t)


def _peer_that_arrived_last(res, i, rank: int | None = None):
    """The member of op i's group (on `rank` only, if given) that was ready last (-1: op i is no collective)."""
    g = res.graph
    key = g.group[i]
    if key is None:
        return -1
    # the index is the simulated graph's, kept on its result: kept in graph.meta it outlived
    # ops added after a first critical path (a third rank's later arrival at "ar" read as
    # "wait for rank 1", the follow_ranks path 1 ms compute + 2 ms wait instead of 3 ms compute)
    index = getattr(res, "_group_index", None)
    if index is None:
        index = {}
        for j, k in enumerate(g.group):
            if k is not None:
                index.setdefault(k, []).append(j)
        res._group_index = index
    members = index[key] if rank is None else [j for j in index[key] if g.rank[j] == rank]
    return max(members, key=lambda j: res.ready_ms.get(j, 0.0))


COLUMNS = ["rank", "stream", "name", "cause", "start_ms", "end_ms", "op"]


def critical_path(res, rank: int | None = None, follow_ranks: bool = False) -> pd.DataFrame:
    """Segments (rank, stream, name, cause, start_ms, end_ms, op) in time order."""
    segs = path_segments(res, rank, follow_ranks)
    return pd.DataFrame(segs, columns=COLUMNS)


def path_segments(res, rank: int | None = None, follow_ranks: bool = False) -> list[tuple]:
    """The critical path as a list of segment tuples (see COLUMNS), zero-length ones dropped."""
    g = res.graph
    if not len(g):
        return []
    if rank is None:
        rank = res.slowest_rank()
    ops = g.order[rank] if rank in g.order else None
    if not ops:
        from kit.errors import KitError

        raise KitError(f"rank {rank} has no ops: simulated ranks are {g.ranks}")
    cur = max(ops, key=lambda i: res.end_ms[i])
    paced = g.meta.get("paced", ())
    segs = []
    guard = len(g) + 1
    while cur >= 0 and guard:
        guard -= 1
        s, e = float(res.start_ms[cur]), float(res.end_ms[cur])
        segs.append((g.rank[cur], g.resource[cur], g.label[cur], _CAUSE[g.kind[cur]], s, e, cur))
        best, t = _binding(res, cur)
        p = g.prev[cur]
        if (best in paced and best != p and p >= 0 and res.end_ms[p] > res.start_ms[best] + _EPS
                and s > res.end_ms[p] + _EPS):  # the GPU waited on a host op that overlapped it
            segs.append((g.rank[cur], g.resource[cur], f"{g.label[best]} (host)", "cpu",
                         float(res.end_ms[p]), s, best))
            cur = p
            continue
        if g.group[cur] is not None and s > t + _EPS:
            last = _peer_that_arrived_last(res, cur)
            # a member on the rank's own other stream that arrived last held it up with the rank's
            # own work, followed either way: read as a wait, a 3 ms kernel beside a 1 ms one had
            # been 1 ms compute + 2 ms "wait for rank 0" on rank 0's path
            if last >= 0 and last != cur and (follow_ranks or g.rank[last] == g.rank[cur]):
                best, t = _binding(res, last)
                if s > t + _EPS:  # defensive: the last arriver should have been ready at s
                    segs.append((g.rank[last], g.resource[last], g.label[last], "wait", t, s, last))
            else:
                who = g.rank[last] if last >= 0 else -1
                if last >= 0:
                    # the wait starts when the rank was ready: its own member that arrived last,
                    # whose chain the walk follows (from cur's own, a 1 ms and a 2 ms stream
                    # joining a rank that came at 3 ms had been 1 ms compute + 2 ms wait, or
                    # 2 + 1 with the members issued the other way round)
                    own = _peer_that_arrived_last(res, cur, g.rank[cur])
                    if own != cur:
                        best, t = _binding(res, own)
                segs.append((g.rank[cur], g.resource[cur], f"wait for rank {who}", "wait", t, s, cur))
        elif best < 0 and s > _EPS:
            segs.append((g.rank[cur], g.resource[cur], "idle", "idle", 0.0, s, cur))
        cur = best
    segs.reverse()
    return [s for s in segs if s[5] - s[4] > _EPS]


def breakdown(path) -> dict:
    """ms on the critical path per cause (every cause present, zero where none), plus total_ms.
    path: a critical_path DataFrame or path_segments list."""
    out = {c: 0.0 for c in CAUSES}
    rows = path.itertuples(index=False) if isinstance(path, pd.DataFrame) else path
    for seg in rows:
        out[seg[3]] += float(seg[5] - seg[4])
    out["total_ms"] = float(sum(out.values()))
    return out
