"""CPU launch overhead, calibrated from a Kineto (PyTorch profiler) trace.

On the thread that issues the most top-level `cpu_op` events (the main Python thread), the
issue period of an op is the time from one top-level op's start to the next one's: dispatch,
the launch inside it, and the Python between ops. Its median is robust to the few ops that
synchronise or allocate. The launch alone is the median `cudaLaunchKernel` (runtime) duration:

    launch_us = median(launch durations),  cpu_op_us = median(issue periods) - launch_us
"""
from __future__ import annotations

import tarfile
import zipfile
import zlib
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


def _archive_kind(path: Path) -> str | None:
    """'zip' or 'tar' (a .tar.gz, .tgz too) when path is such an archive, else None (a missing
    file or a folder included: the JSON reader names those)."""
    try:
        if zipfile.is_zipfile(path):
            return "zip"
        return "tar" if tarfile.is_tarfile(path) else None
    except (OSError, EOFError, tarfile.TarError, zlib.error):  # unreadable, truncated gzip, ...
        return None


def _archive_members(path: Path, kind: str) -> list[str]:
    """The names of the trace JSON files (.json, .json.gz) inside a zip or tar archive."""
    try:
        if kind == "zip":
            with zipfile.ZipFile(path) as z:
                names = [i.filename for i in z.infolist() if not i.is_dir()]
        else:
            with tarfile.open(path) as t:
                names = [m.name for m in t.getmembers() if m.isfile()]
    except (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile, zlib.error):
        return []
    return sorted(n for n in names if n.lower().endswith((".json", ".json.gz"))
                  and not Path(n).name.startswith("."))  # not macOS's ._ resource forks


def _refuse_archive(path: Path) -> None:
    """A KitError when path is an archive (e.g. a tarball of per-rank traces), not a trace JSON."""
    kind = _archive_kind(path)
    if kind is None:
        return
    names = _archive_members(path, kind)
    more = f" and {len(names) - 1} more" if len(names) > 1 else ""
    held = f" (it holds {names[0]}{more})" if names else ""
    raise KitError(f"Kineto trace {path} is a {kind} archive, not a trace JSON{held}: extract the "
                   "trace JSON (.json or .json.gz) from it first and pass that file")


def _main_thread_starts(ops: list[dict]) -> list[float]:
    """Start times of the top-level cpu_ops on the thread that issues the most of them."""
    by_thread: dict = {}
    for e in ops:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(float(e["ts"]))
    return sorted(max(by_thread.values(), key=len)) if by_thread else []


def _launch_durations(events: list[dict]) -> list[float]:
    """Durations (µs) of the kernel-launch runtime calls (LAUNCH_NAMES)."""
    return [float(e["dur"]) for e in events
            if e.get("cat") in ("cuda_runtime", "runtime", "cuda_driver") and e.get("name") in LAUNCH_NAMES]


def _no_launches(path: Path, n_ops: int) -> KitError:
    """The refusal for a trace without kernel launches: it cannot calibrate the launch cost,
    the per-kernel cost the kit adds to every launch."""
    has = f"{n_ops} top-level cpu_ops but no" if n_ops else "no cpu_op events and no"
    return KitError(f"Kineto trace {path} has {has} kernel launches ({', '.join(LAUNCH_NAMES[:2])}, ...), "
                    "so it cannot calibrate the per-launch cost: profile a GPU run with "
                    "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")


def calibrate(path: str | Path) -> CpuOverhead:
    """The host cost per op and per launch, measured from a Kineto trace (see the module doc).
    A trace without kernel launches is refused; one with launches but fewer than two top-level
    cpu_ops on a thread keeps the default per-op cost, and its source says so."""
    path = Path(path)
    _refuse_archive(path)
    events = _load(path)
    ops = _top_level([e for e in events if e.get("cat") == "cpu_op"])
    launches = _launch_durations(events)
    if not launches:
        raise _no_launches(path, len(ops))
    launch_us = float(np.median(launches))
    main = _main_thread_starts(ops)
    source = f"{path.name}: {len(main)} top-level cpu_ops on the main thread, {len(launches)} launches"
    if len(main) >= 2:
        op_us = max(float(np.median(np.diff(main))) - launch_us, 0.0)
    else:
        op_us = CpuOverhead().cpu_op_us
        source += (f"; the per-op cost keeps its default {op_us:g} µs (an issue period needs 2 or "
                   "more top-level cpu_ops on one thread)")
    return CpuOverhead(cpu_op_us=op_us, launch_us=launch_us,
                       free_op_us=min(CpuOverhead().free_op_us, op_us), source=source)
