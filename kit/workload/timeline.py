"""Chrome / Perfetto trace-event export of a predicted iteration (opens in ui.perfetto.dev).

Two tracks: "CPU issue" (each op's host time) and "GPU stream" (each kernel). Times in µs.
Format: the Trace Event Format ("X" complete events, "M" metadata), as documented by the
Chromium project and read by Perfetto.
"""
from __future__ import annotations


def trace_events(it) -> dict:
    t = it.timeline
    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": f"{it.model} on {it.gpu}"}},
        {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "CPU issue"}},
        {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "GPU stream"}},
    ]
    for row in t.itertuples(index=False):
        args = {"op_class": row.op_class, "phase": row.phase, "module": row.module,
                "shapes": row.shapes, "kernels": int(row.kernels)}
        events.append({"ph": "X", "pid": 1, "tid": 1, "name": row.aten, "cat": "cpu_op",
                       "ts": round(row.cpu_start_ms * 1e3, 3),
                       "dur": round((row.cpu_end_ms - row.cpu_start_ms) * 1e3, 3), "args": args})
        events.append({"ph": "X", "pid": 1, "tid": 2, "name": row.aten, "cat": "kernel",
                       "ts": round(row.gpu_start_ms * 1e3, 3),
                       "dur": round(row.latency_ms * 1e3, 3), "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"model": it.model, "gpu": it.gpu, "total_ms": it.total_ms,
                          "predictor": it.predictor, "fusion": it.fusion}}
