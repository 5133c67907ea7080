"""Kineto RankTraces -> one ExecGraph with the measured durations (Lumos-style reconstruction).

Per rank, within the profiled steps:
* The CPU is one issuing thread: the runtime calls of all host threads in time order, with the
  measured CPU time between them as "cpu" ops. (PyTorch's autograd thread and the main thread
  take turns; they do not issue concurrently.)
* A launch (cudaLaunchKernel, cudaMemcpyAsync, ...) becomes a "launch" op and a GPU op on its
  stream. The launch is split where the kernel was seen to start, so an idle GPU starts the
  kernel exactly as measured.
* A GPU op that started later than its launch and its stream predecessor allow waited on an
  event: it depends on the op of another stream that ended last before it started.
* A sync call (cudaStreamSynchronize, cudaDeviceSynchronize, a blocking memcpy) waits for the
  GPU op that ended last before it returned, then costs what it cost after that op ended.
* NCCL kernels are collectives. They are matched across ranks by (stream, position) and start
  together; each lasts the shortest measured duration of its group, the one of the rank that
  arrived last and so waited least (the others' extra time was waiting).
* Clock offsets between ranks are estimated from the collectives' end times, which a ring or
  all-to-all makes near-simultaneous on every rank; each rank starts at its aligned step start.
"""
from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field

from kit.sim import ExecGraph
from kit.trace.kineto import SYNC_CALLS, RankTrace

TOL_US = 1.0  # timestamps are whole µs in Kineto


def is_collective_kernel(name: str) -> bool:
    return name.lower().startswith("nccl") or name.startswith("rccl")


@dataclass
class TraceGraph:
    """The graph plus what replay needs to read it back."""

    graph: ExecGraph
    traces: list
    markers: dict = field(default_factory=dict)  # rank -> [(start op, end op)] per step
    gpu_ops: dict = field(default_factory=dict)  # rank -> [(op id, GpuEvent, step k, RuntimeCall)]
    idle_op: dict = field(default_factory=dict)  # rank -> op id of its start offset
    offsets_us: dict = field(default_factory=dict)  # rank -> estimated clock offset vs first rank
    collectives_synced: bool = False
    notes: list = field(default_factory=list)


def _step_marks(t: RankTrace, w0: float, w1: float):
    if t.steps:
        out = []
        for n, s, e in t.steps:
            out += [(s, 0, f"ProfilerStep#{n} start"), (e, 1, f"ProfilerStep#{n} end")]
        return out
    return [(w0, 0, "trace start"), (w1, 1, "trace end")]


def _build_rank(g: ExecGraph, tg: TraceGraph, t: RankTrace) -> None:
    r = g.add_rank(t.rank)
    w0, w1 = t.window_us()
    tg.idle_op[r] = g.cpu(r, 0.0, "start offset", kind="idle")
    by_corr = {e.correlation: e for e in t.gpu if e.correlation is not None}
    marks = _step_marks(t, w0, w1)
    calls = [c for c in t.runtime if w0 <= c.ts_us < w1]
    events = sorted([(m[0], m[1], m) for m in marks] + [(c.ts_us, 2, c) for c in calls],
                    key=lambda x: (x[0], x[1]))
    stream_ends: dict[str, list[float]] = {}
    stream_ops: dict[str, list[int]] = {}
    measured_end: dict[int, float] = {}
    ops = tg.gpu_ops.setdefault(r, [])
    step_marks: list[int] = []
    cursor = w0
    step_k = 0

    def gap_to(ts):
        nonlocal cursor
        if ts > cursor:
            g.cpu(r, (ts - cursor) / 1e3, "cpu")
            cursor = ts

    for ts, order, ev in events:
        if order < 2:
            gap_to(ts)
            step_marks.append(g.cpu(r, 0.0, ev[2]))
            if order == 1:
                step_k += 1
            continue
        c = ev
        s = max(c.ts_us, cursor)
        e = max(c.ts_us + c.dur_us, s)
        gap_to(s)
        ge = by_corr.get(c.correlation) if c.correlation is not None else None
        if ge is not None:
            first = min(max(ge.ts_us - s, 0.0), e - s)
            launch = g.cpu(r, first / 1e3, c.name, kind="launch")
            deps = [launch]
            prev_end = stream_ends.get(ge.stream, [])[-1:] or [w0]
            ready = max(s + first, prev_end[0])
            if ge.ts_us > ready + TOL_US:  # it waited on an event of another stream
                best, best_end = -1, -1.0
                for st, ends in stream_ends.items():
                    if st == ge.stream:
                        continue
                    k = bisect.bisect_right(ends, ge.ts_us + TOL_US) - 1
                    if k >= 0 and ends[k] > best_end:
                        best, best_end = stream_ops[st][k], ends[k]
                if best >= 0:
                    deps.append(best)
            kind = ("comm" if is_collective_kernel(ge.name) else
                    "compute" if ge.cat == "kernel" else "memcpy")
            op = g.gpu(r, f"stream {ge.stream}", ge.dur_us / 1e3, ge.name, kind=kind, deps=deps,
                       tag=c.name)
            gend = ge.ts_us + ge.dur_us
            stream_ends.setdefault(ge.stream, []).append(gend)
            stream_ops.setdefault(ge.stream, []).append(op)
            measured_end[op] = gend
            ops.append((op, ge, step_k, c))
            rest = (e - s) - first
            if e >= gend - TOL_US and ge.ts_us >= s - TOL_US and ge.cat != "kernel":
                g.sync(r, [op], max(e - max(gend, s + first), 0.0) / 1e3, c.name + " (blocking)")
            elif rest > 0:
                g.cpu(r, rest / 1e3, c.name, kind="launch")
        elif c.name.startswith(SYNC_CALLS):
            if c.name in ("cudaDeviceSynchronize", "cuCtxSynchronize"):
                on = [so[-1] for so in stream_ops.values()]
            else:
                best, best_end = -1, -1.0
                for st, ends in stream_ends.items():
                    k = bisect.bisect_right(ends, e + TOL_US) - 1
                    if k >= 0 and ends[k] > best_end:
                        best, best_end = stream_ops[st][k], ends[k]
                on = [best] if best >= 0 else []
            after = max([measured_end[o] for o in on] + [s])
            g.sync(r, on, max(e - after, 0.0) / 1e3, c.name)
        else:
            g.cpu(r, (e - s) / 1e3, c.name)
        cursor = e
    tg.markers[r] = [(step_marks[2 * i], step_marks[2 * i + 1]) for i in range(len(step_marks) // 2)]
    if not t.gpu:
        tg.notes.append(f"rank {r}: CPU-only (no GPU events); replayed on its host thread alone")


def _match_collectives(g: ExecGraph, tg: TraceGraph) -> None:
    """Group NCCL kernels across ranks by (stream in order of first use, position on it)."""
    per_rank: dict[int, dict] = {}
    for r, ops in tg.gpu_ops.items():
        streams: dict[str, list] = {}
        for op, ge, _, _ in ops:
            if g.kind[op] == "comm":
                streams.setdefault(ge.stream, []).append((op, ge))
        per_rank[r] = {i: v for i, v in enumerate(streams.values())}
    gpu_ranks = [r for r, s in per_rank.items() if s]
    if len(gpu_ranks) < 2:
        if gpu_ranks and len(tg.traces) == 1:
            tg.notes.append("one rank of a larger job: collectives keep their measured durations")
        return
    shape = {r: [len(v) for v in per_rank[r].values()] for r in gpu_ranks}
    ref = shape[gpu_ranks[0]]
    if any(s != ref for s in shape.values()):
        tg.notes.append(f"collective counts per stream differ across ranks ({shape}); "
                        "collectives replayed at measured durations without inter-rank sync")
        return
    ends: dict[int, list[float]] = {r: [] for r in gpu_ranks}
    for si, n in enumerate(ref):
        for k in range(n):
            members = [per_rank[r][si][k] for r in gpu_ranks]
            d = min(ge.dur_us for _, ge in members) / 1e3
            for r, (op, ge) in zip(gpu_ranks, members):
                g.group[op] = ("nccl", si, k)
                g.dur_ms[op] = d
                ends[r].append(ge.ts_us + ge.dur_us)
    r0 = gpu_ranks[0]
    for r in gpu_ranks:
        tg.offsets_us[r] = statistics.median(a - b for a, b in zip(ends[r], ends[r0]))
    tg.collectives_synced = True


def build_graph(traces: list[RankTrace], sync_collectives: bool = True) -> TraceGraph:
    """One ExecGraph over all ranks, durations as measured (ms), ranks aligned in time."""
    g = ExecGraph("trace")
    tg = TraceGraph(g, list(traces))
    for t in traces:
        _build_rank(g, tg, t)
    if sync_collectives:
        _match_collectives(g, tg)
    starts = {t.rank: t.window_us()[0] - tg.offsets_us.get(t.rank, 0.0) for t in traces}
    if tg.collectives_synced:
        t0 = min(starts[r] for r in tg.offsets_us)
        for r, op in tg.idle_op.items():
            if r in tg.offsets_us:
                g.dur_ms[op] = max(starts[r] - t0, 0.0) / 1e3
    return tg
