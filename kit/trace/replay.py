"""Replay a Kineto trace: simulate its execution graph and compare each rank's step time.

A rank's predicted step runs from its ProfilerStep start marker (or the end of the step before,
where that ran past it) to the later of its end marker and the end of the GPU work launched within
it, less what that work ran past the marker when measured (on a slower GPU the kernels may outlast
the host's step). measured_ms is the mean ProfilerStep duration.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kit.errors import KitError
from kit.sim import SimResult, simulate
from kit.trace.build import TraceGraph, build_graph
from kit.trace.kineto import RankTrace, is_execution_trace, load_kineto, read_docs


@dataclass
class Replay:
    tg: TraceGraph
    result: SimResult
    ranks: list = field(default_factory=list)  # dicts: rank, measured_ms, predicted_ms, ...
    on: str | None = None

    def timeline(self):
        return self.result.timeline()

    def critical_path(self, rank: int | None = None):
        return self.result.critical_path(rank if rank is not None else self.slowest_rank())

    def slowest_rank(self) -> int:
        return max(self.ranks, key=lambda d: d["predicted_ms"])["rank"]

    def to_dict(self) -> dict:
        slow = self.slowest_rank()
        errs = [abs(d["error_pct"]) for d in self.ranks if d["error_pct"] is not None]
        return {
            "trace": self.tg.traces[0].source.split(":")[0] if self.tg.traces else None,
            "gpu": self.tg.traces[0].gpu_name if self.tg.traces else None,
            "on": self.on,
            "ranks": self.ranks,
            "mean_abs_error_pct": sum(errs) / len(errs) if errs else None,
            "max_abs_error_pct": max(errs) if errs else None,
            "critical_path": {"rank": slow, **self.result.breakdown(slow)},
            "collectives_synced": self.tg.collectives_synced,
            "missing_ranks": list(self.tg.missing_ranks),
            "source_system": self.tg.source_system,
            "execution_traces": [lk.stats(t) for t in self.tg.traces
                                 if (lk := self.tg.links.get(t.rank)) is not None],
            "host_syncs": dict(self.tg.syncs),
            "gpu_waits": dict(self.tg.gpu_waits),
            "clock_offsets_us": self.tg.offsets_us,
            "notes": self.tg.notes + [n for t in self.tg.traces for n in t.notes],
        }


def step_times_ms(tg: TraceGraph, res: SimResult, rank: int) -> list[float]:
    """Each step from when the one before it was through to when it is: the later of its end
    marker and the end of the GPU work launched in it, less what that work ran past the
    ProfilerStep's end when measured. That measured tail overlapped the host's next step (no
    sync closed the step): counting it whole had put a trace replayed on its own GPU off its
    measurement (a 100 us step whose kernel ended 50 us after it: +25% over two steps); a tail
    that grows on a slower GPU counts, once: a step whose GPU work is still running when the next
    ends hands that time on, not again (a GPU-bound loop on a P4, 213 us of kernels a step, had
    read 0.233, 0.292, 0.409, 0.645 ms over 1, 2, 4, 8 steps as each step counted all the lag
    before it; now 0.233, 0.225, 0.222, 0.220)."""
    trace = next((t for t in tg.traces if t.rank == rank), None)
    windows = [(s, e) for _, s, e in trace.steps] if trace is not None and trace.steps else \
        [trace.window_us()] if trace is not None else []
    gpu_end: dict[int, float] = {}
    measured_end: dict[int, float] = {}
    for op, ge, k, _ in tg.gpu_ops.get(rank, []):
        gpu_end[k] = max(gpu_end.get(k, 0.0), float(res.end_ms[op]))
        measured_end[k] = max(measured_end.get(k, -float("inf")), ge.ts_us + ge.dur_us)
    out = []
    done = -float("inf")  # when the steps before were through, host and GPU
    for k, (a, b) in enumerate(tg.markers.get(rank, [])):
        start = float(res.end_ms[a])
        was = 0.0
        if k in measured_end and k < len(windows):
            was = max(measured_end[k] - windows[k][1], 0.0) / 1e3
        end = max(float(res.end_ms[b]), gpu_end.get(k, 0.0) - was, done)
        out.append(end - max(start, done))
        done = end
    return out


def load_with_et(trace, et=None) -> tuple[list[RankTrace], dict, list[str]]:
    """(rank traces, rank -> EtLink, notes). et: None finds execution traces next to the Kineto
    files (by their schema); a path reads them from there too; False ignores them."""
    from kit.trace.et import load_et, parse_et
    from kit.trace.link import link, pair

    if isinstance(trace, list) and all(isinstance(t, RankTrace) for t in trace):
        traces, docs = trace, []
    else:
        docs = read_docs(trace)
        traces = load_kineto(trace, docs)
    found = [] if et is False else [parse_et(d, src) for src, d in docs if is_execution_trace(d)]
    given = load_et(et) if et not in (None, False) else []
    ets = found + given
    if not ets:
        return traces, {}, []
    pairs, notes = pair(ets, traces)
    if not pairs and given:
        raise KitError(f"execution traces ({len(ets)}) match none of the {len(traces)} Kineto "
                       "ranks by process id or file-name rank; pass the ones recorded with it")
    by_rank = {t.rank: t for t in traces}
    links = {}
    for r, x in sorted(pairs.items()):
        try:
            links[r] = link(x, by_rank[r])
        except KitError as e:
            if any(x is y for y in given):
                raise
            notes.append(f"execution trace found with the trace not used: {e}")
    return traces, links, notes


def replay(trace, on=None, sync_collectives: bool = True, et=None, source=None) -> Replay:
    """Replay a trace (path, or RankTraces) at measured durations, or transferred `on` a GPU/system.
    et: execution traces to link (None: those found with the trace; False: none). source: the
    system the trace ran on (a preset; by default the first single-node one of its GPU that fits)."""
    if source is not None and on is None:
        from kit.trace.transfer import FROM, ON

        raise KitError(f"{FROM} {source!r} goes with {ON} SYSTEM: without it the measured times "
                       "are kept and no source system is used")
    traces, links, notes = load_with_et(trace, et)
    tg = build_graph(traces, sync_collectives, links)
    tg.notes += notes
    label = None
    if on is not None:
        from kit.trace.transfer import transfer

        label = transfer(tg, on, source)
    res = simulate(tg.graph)
    rows = []
    for t in traces:
        pred = step_times_ms(tg, res, t.rank)
        meas = t.measured_steps_ms
        m = sum(meas) / len(meas) if meas else None
        p = sum(pred) / len(pred) if pred else 0.0
        rows.append({"rank": t.rank, "measured_ms": m, "predicted_ms": p,
                     "error_pct": 100 * (p - m) / m if m and on is None else None,
                     "steps": len(pred), "gpu": t.gpu_name})
    return Replay(tg, res, rows, label)
