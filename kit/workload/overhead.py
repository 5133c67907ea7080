"""CPU launch overhead, calibrated from a Kineto (PyTorch profiler) trace.

On the thread that issues the most top-level `cpu_op` events (the main Python thread; PyTorch
1.8 calls them "Operator"; a ProfilerStep#N frames a step, it is no op), the issue period of
an op is the time from one top-level op's start to the next one's: dispatch, the launches
inside it, and the Python between ops. Its median is robust to the few ops that
synchronise or allocate. The launch alone is the median `cudaLaunchKernel` (runtime) duration.
The per-op cost is what the kit charges an op that launches kernels (cpu_op_us + k launch_us),
so it is read off the top-level ops that launch k >= 1 kernels on that thread; ops that launch
none (views, host-side ops: often most of a trace's top-level ops) would pull it down:

    launch_us = median(launch durations),  cpu_op_us = median(issue period - k launch_us)

A trace whose main thread launches nothing itself takes every top-level op's period, less one
launch.
"""
from __future__ import annotations

import re
import tarfile
import zipfile
import zlib
from pathlib import Path

import numpy as np

from kit.errors import KitError, refuse_device
from kit.workload.iteration import CpuOverhead

# the categories of a framework op: "Operator" is PyTorch 1.8's name for it (its traces also call
# the runtime "Runtime", read below); ProfilerStep#N in them frames a whole step, not an op
OP_CATS = ("cpu_op", "Operator")
_STEP = re.compile(r"ProfilerStep#\d+")
LAUNCH_NAMES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "hipLaunchKernel", "cuLaunchKernel",
                "cuLaunchKernelEx",  # the driver call newer Triton launchers (torch.compile) make
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
        for key in ("pid", "tid"):  # a thread is named by them (a list cannot be)
            value = e.get(key)
            if not (value is None or isinstance(value, (int, float, str))):
                raise KitError(f"Kineto trace {path}: event {e.get('name')!r} has {key} {value!r}; "
                               "expected a number or a string")
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


def _main_thread(ops: list[dict]) -> tuple[object, list[dict]]:
    """The (pid, tid) that issues the most top-level cpu_ops, and those ops by start time."""
    by_thread: dict = {}
    for e in ops:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    if not by_thread:
        return None, []
    key = max(by_thread, key=lambda k: len(by_thread[k]))
    return key, sorted(by_thread[key], key=lambda e: float(e["ts"]))


def _launch_events(events: list[dict]) -> list[dict]:
    """The kernel-launch runtime calls (LAUNCH_NAMES)."""
    return [e for e in events  # "Runtime": older Kineto traces' category
            if str(e.get("cat")).lower() in ("cuda_runtime", "runtime", "cuda_driver")
            and e.get("name") in LAUNCH_NAMES]


def _launches_per_op(main: list[dict], thread, launches: list[dict]) -> np.ndarray:
    """How many of the launches each of the main thread's top-level ops (sorted) holds: those
    on the same thread that start within the op."""
    import bisect

    starts = [float(e["ts"]) for e in main]
    count = np.zeros(len(main), dtype=int)
    for e in launches:
        if (e.get("pid"), e.get("tid")) != thread:
            continue
        ts = float(e["ts"])
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts <= starts[i] + float(main[i]["dur"]):
            count[i] += 1
    return count


def _no_launches(path: Path, n_ops: int) -> KitError:
    """The refusal for a trace without kernel launches: it cannot calibrate the launch cost,
    the per-kernel cost the kit adds to every launch."""
    has = f"{n_ops} top-level cpu_ops but no" if n_ops else "no cpu_op events and no"
    return KitError(f"Kineto trace {path} has {has} kernel launches ({', '.join(LAUNCH_NAMES[:2])}, ...), "
                    "so it cannot calibrate the per-launch cost: profile a GPU run with "
                    "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")


def _refuse_range_profiling(path: Path, events: list[dict], launches: list[dict]) -> None:
    """A KitError for a trace recorded under CUPTI's range profiler (cuda_profiler_range events,
    torch.profiler's experimental_config profiler_metrics): each launch there replays its
    kernel to read counters, so its time is no launch cost. HTA's cupti_profiler test trace:
    cudaLaunchKernel median 52,918 µs (1,513 to 1,220,457), taken as the cost of a launch."""
    ranges = sum(1 for e in events if e.get("cat") == "cuda_profiler_range")
    if ranges:
        median = float(np.median([float(e["dur"]) for e in launches]))
        raise KitError(f"Kineto trace {path} was recorded under CUPTI's range profiler ({ranges} "
                       f"cuda_profiler_range events): its kernel launches replay the kernels to read "
                       f"counters (median {median:,.0f} µs a launch), so it cannot calibrate host costs; "
                       "profile without profiler_metrics")


FEW_PERIODS = 20  # fewer issue periods than this behind the per-op cost get a note


def calibrate(path: str | Path) -> CpuOverhead:
    """The host cost per op and per launch, measured from a Kineto trace (see the module doc).
    A trace without kernel launches is refused; one with launches but fewer than two top-level
    cpu_ops on a thread keeps the default per-op cost, and its source says so."""
    path = Path(path)
    refuse_device(path, "Kineto trace")  # before the archive sniff: zipfile.is_zipfile read
    # /dev/zero whole (a MemoryError traceback)
    _refuse_archive(path)
    events = _load(path)
    # a ProfilerStep#N of category cpu_op (as PyTorch's before user_annotation existed) framed
    # every op of its step: a 3-step trace of 40 µs ops read as 2 periods of 1,050 µs an op
    ops = _top_level([e for e in events if e.get("cat") in OP_CATS
                      and not (isinstance(e.get("name"), str) and _STEP.fullmatch(e["name"]))])
    launch_events = _launch_events(events)
    if not launch_events:
        raise _no_launches(path, len(ops))
    _refuse_range_profiling(path, events, launch_events)
    launch_us = float(np.median([float(e["dur"]) for e in launch_events]))
    thread, main = _main_thread(ops)
    source = f"{path.name}: {len(main)} top-level cpu_ops on the main thread, {len(launch_events)} launches"
    if len(main) >= 2:
        periods = np.diff([float(e["ts"]) for e in main])
        k = _launches_per_op(main, thread, launch_events)[:-1]  # the last op has no period
        if (k > 0).any():  # the ops that launch: what the kit's per-op cost stands for
            read = int((k > 0).sum())
            op_us = max(float(np.median(periods[k > 0] - k[k > 0] * launch_us)), 0.0)
            source += f"; the per-op cost from the {read} that launch kernels"
        else:  # the main thread launches nothing itself
            read = len(periods)
            op_us = max(float(np.median(periods)) - launch_us, 0.0)
        if read < FEW_PERIODS:  # one idle gap among a handful sets the median (an HTA sync test:
            # 3 ops, 9,736 us an op): used as read, but said
            import warnings

            warnings.warn(f"--overhead-trace {path.name}: the per-op cost ({op_us:,.1f} µs) is read "
                          f"off {read} issue period(s) only, so one idle gap can set it; a trace of a "
                          f"whole training or inference step gives a steadier figure")
    else:
        op_us = CpuOverhead().cpu_op_us
        source += (f"; the per-op cost keeps its default {op_us:g} µs (an issue period needs 2 or "
                   "more top-level cpu_ops on one thread)")
    return CpuOverhead(cpu_op_us=op_us, launch_us=launch_us,
                       free_op_us=min(CpuOverhead().free_op_us, op_us), source=source)
