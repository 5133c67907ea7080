"""Chrome / Perfetto trace-event export of a predicted iteration (opens in ui.perfetto.dev).

Two tracks: "CPU issue" (each op's host time) and "GPU stream" (each kernel). Times in µs.
Format: the Trace Event Format ("X" complete events, "M" metadata), as documented by the
Chromium project and read by Perfetto.
"""
from __future__ import annotations


def span_us(start_ms: float, end_ms: float) -> dict:
    """{"ts", "dur"} in µs to the ns, the end rounded as the start is: back-to-back events then
    meet exactly (rounding ts and dur apart had let them overlap by 1 ns)."""
    ts, end = round(start_ms * 1e3, 3), round(end_ms * 1e3, 3)
    return {"ts": ts, "dur": round(end - ts, 3)}


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
                       **span_us(row.cpu_start_ms, row.cpu_end_ms), "args": args})
        events.append({"ph": "X", "pid": 1, "tid": 2, "name": row.aten, "cat": "kernel",
                       **span_us(row.gpu_start_ms, row.gpu_end_ms), "args": args})
    trailing = it.meta.get("trailing_free") or {}
    if trailing.get("ms", 0) > 0 and len(t):  # the views after the last kernel: the CPU's last work
        end = float(t["cpu_end_ms"].iloc[-1])
        events.append({"ph": "X", "pid": 1, "tid": 1, "name": f"{trailing['ops']} view op(s) after the last kernel",
                       "cat": "cpu_op", **span_us(end, end + trailing["ms"]),
                       "args": {"op_class": "free", "phase": str(t["phase"].iloc[-1]), "kernels": 0}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"model": it.model, "gpu": it.gpu, "total_ms": it.total_ms,
                          "predictor": it.predictor, "fusion": it.fusion}}
