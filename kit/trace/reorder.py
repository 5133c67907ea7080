"""Ops added to a built trace graph, moved to where their dependants can depend on them.

ExecGraph's ids are its dependency order: an op's deps are earlier ops (ExecGraph._checked refuses
any other as it is added). kit.trace.group_sync.wait_pairwise adds a coalesced batch's pair waits
after the whole job is built, when the batches are matched across ranks, and the batch, an
earlier op, then depends on them. insert_before rebuilds the graph with each such op just before
the op that waits on it, through ExecGraph's own checks, and maps the op ids the TraceGraph holds.
"""
from __future__ import annotations

from kit.sim.graph import ExecGraph


def insert_before(tg, before: dict) -> dict:
    """Move the ops before[op] (ids of ops already in tg.graph) to just before op, in their order
    there; returns old id -> new id. Every other op keeps its order, so each stream and host
    thread runs what it ran in the order it did; the moved ops must depend only on ops before
    their new place (KitError from ExecGraph otherwise)."""
    g = tg.graph
    moved = {w for ws in before.values() for w in ws}
    order: list = []
    for i in range(len(g)):
        if i not in moved:
            order += before.get(i, ())
            order.append(i)
    new_of = {old: k for k, old in enumerate(order)}
    h = ExecGraph(g.name)
    for r, members in g.members.items():
        h.add_rank(r, members)
    for old in order:
        h._add(g.rank[old], g.resource[old], g.kind[old], g.label[old], g.dur_ms[old],
               tuple(new_of[d] for d in g.deps[old]), g.group[old], g.tag[old])
    h.meta, h.group_ranks = g.meta, g.group_ranks
    vars(g).update(vars(h))  # in place: the builder and tg hold this graph
    tg.markers = {r: [(new_of[a], new_of[b]) for a, b in v] for r, v in tg.markers.items()}
    tg.gpu_ops = {r: [(new_of[op], *rest) for op, *rest in v] for r, v in tg.gpu_ops.items()}
    tg.idle_op = {r: new_of[op] for r, op in tg.idle_op.items()}
    tg.sync_ops = {r: [(new_of[op], *rest) for op, *rest in v] for r, v in tg.sync_ops.items()}
    return new_of


__all__ = ["insert_before"]
