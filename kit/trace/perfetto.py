"""Export any timeline (a kit.sim timeline DataFrame) as Perfetto / chrome://tracing JSON.

One process per rank, one thread per stream (the CPU thread first), complete ("X") events in
µs. Ops on the critical path carry args.critical = true and a distinct colour name.
"""
from __future__ import annotations

import json
from pathlib import Path

from kit.errors import KitError
from kit.whole_file import replace_file
from kit.workload.timeline import span_us

_COLOR = {"compute": "thread_state_running", "comm": "rail_response", "memcpy": "rail_load",
          "cpu": "generic_work", "launch": "thread_state_runnable", "sync": "thread_state_iowait",
          "idle": "grey"}
NEEDED = ("rank", "stream", "name", "kind", "start_ms", "end_ms")


def to_perfetto(timeline, critical_ops=None, min_dur_ms: float = 0.0) -> dict:
    """A Chrome-trace dict; critical_ops: op ids on the critical path (highlighted)."""
    missing = [c for c in NEEDED if c not in timeline.columns]
    if missing:
        raise KitError(f"timeline lacks column(s) {', '.join(missing)}; needs {', '.join(NEEDED)}")
    crit = set(int(o) for o in critical_ops) if critical_ops is not None else set()
    events = []
    tids: dict[tuple, int] = {}
    for rank in sorted(timeline["rank"].unique()):
        events.append({"ph": "M", "name": "process_name", "pid": int(rank), "tid": 0,
                       "args": {"name": f"rank {int(rank)}"}})
    streams = sorted(set(zip(timeline["rank"], timeline["stream"])),
                     key=lambda rs: (rs[0], rs[1] != "cpu", str(rs[1])))
    for rank, stream in streams:
        tid = tids.setdefault((rank, stream), len([k for k in tids if k[0] == rank]) + 1)
        events.append({"ph": "M", "name": "thread_name", "pid": int(rank), "tid": tid,
                       "args": {"name": str(stream)}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": int(rank), "tid": tid,
                       "args": {"sort_index": tid}})
    has_op = "op" in timeline.columns
    for row in timeline.itertuples(index=False):
        dur = row.end_ms - row.start_ms
        if dur < min_dur_ms:
            continue
        op = int(row.op) if has_op else None
        on_path = op in crit
        ev = {"ph": "X", "name": str(row.name), "cat": str(row.kind), "pid": int(row.rank),
              "tid": tids[(row.rank, row.stream)], **span_us(row.start_ms, row.end_ms),
              "args": {"op": op, "critical": on_path},
              "cname": "terrible" if on_path else _COLOR.get(row.kind, "generic_work")}
        events.append(ev)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "gpu-perf-kit", "time_unit_of_ts": "us"}}


def write_perfetto(timeline, path, critical_ops=None) -> str:
    """Write the Perfetto JSON to path (.json or .json.gz); returns the path."""
    return write_json(to_perfetto(timeline, critical_ops), path)


def write_json(doc, path) -> str:
    """A trace document as JSON at path, gzipped when it ends in .gz; returns the path."""
    p = Path(path)
    data = json.dumps(doc).encode()
    if p.suffix == ".gz":
        import gzip

        data = gzip.compress(data)
    try:  # whole or not at all: a failed write leaves an earlier trace there as it was
        replace_file(p, data)  # its folder made, as the collectors make their --out folders
    except OSError as e:
        raise KitError(f"cannot write the trace to {path}: {e}") from None
    return str(p)
