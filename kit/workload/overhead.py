"""CPU launch overhead, calibrated from a Kineto (PyTorch profiler) trace.

On the thread that issues the most top-level `cpu_op` events (the main Python thread), the
issue period of an op is the time from one top-level op's start to the next one's: dispatch,
the launch inside it, and the Python between ops. Its median is robust to the few ops that
synchronise or allocate. The launch alone is the median `cudaLaunchKernel` (runtime) duration:

    launch_us = median(launch durations),  cpu_op_us = median(issue periods) - launch_us
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from kit.errors import KitError
from kit.workload.iteration import CpuOverhead

LAUNCH_NAMES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "hipLaunchKernel", "cuLaunchKernel",
                "hipExtModuleLaunchKernel")


def _load(path: Path) -> list[dict]:
    from kit.trace.kineto import load_json_file  # kit replay's reader: gzip, truncation, binary

    data = load_json_file(path, "Kineto trace")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise KitError(f"Kineto trace {path}: no 'traceEvents' list")
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]
    for e in spans:  # a span without a time is a corrupt trace: say which, not a traceback
        for key in ("ts", "dur"):
            value = e.get(key)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)
            if not ok or (key == "dur" and value < 0):
                raise KitError(f"Kineto trace {path}: event {e.get('name')!r} has {key} {value!r}; "
                               f"expected a finite number of µs{' >= 0' if key == 'dur' else ''}")
    return spans


def _top_level(ops: list[dict]) -> list[dict]:
    """cpu_op events not nested inside another cpu_op on the same thread."""
    out = []
    by_thread: dict = {}
    for e in ops:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        end = -1.0
        for e in evs:
            ts, dur = float(e["ts"]), float(e["dur"])
            if ts >= end:
                out.append(e)
                end = ts + dur
    return out


def calibrate(path: str | Path) -> CpuOverhead:
    path = Path(path)
    events = _load(path)
    ops = _top_level([e for e in events if e.get("cat") == "cpu_op"])
    if len(ops) < 2:
        raise KitError(f"Kineto trace {path}: no cpu_op events to calibrate from (need 2 or more)")
    by_thread: dict = {}
    for e in ops:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(float(e["ts"]))
    main = max(by_thread.values(), key=len)
    if len(main) < 2:
        raise KitError(f"Kineto trace {path}: no thread issues two or more cpu_ops")
    period_us = float(np.median(np.diff(np.sort(main))))
    launches = [float(e["dur"]) for e in events
                if e.get("cat") in ("cuda_runtime", "runtime", "cuda_driver") and e.get("name") in LAUNCH_NAMES]
    launch_us = float(np.median(launches)) if launches else 0.0
    op_us = max(period_us - launch_us, 0.0)
    return CpuOverhead(cpu_op_us=op_us, launch_us=launch_us,
                       free_op_us=min(CpuOverhead().free_op_us, op_us),
                       source=f"{path.name}: {len(main)} top-level cpu_ops on the main thread, "
                              f"{len(launches)} launches")
