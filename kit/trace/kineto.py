"""Read Kineto (PyTorch profiler) traces: one JSON per rank, plain or .gz, a folder of them, or a
tarball of them. Each rank becomes a RankTrace holding only what replay needs, in µs as recorded.

Robust to what real traces do: missing fields (skipped event, not a crash), string pids/tids,
several ProfilerStep#N annotations, CPU-only ranks (no kernels), and ranks whose rank id is not
in distributedInfo (taken from the file name, else the file order). Anything that is not a
trace raises KitError naming the file.
"""
from __future__ import annotations

import bisect
import gzip
import json
import math
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from kit.errors import KitError, need_path, refuse_device

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "cuda_profiler_range"}
CPU_OP_CATS = {"cpu_op", "Operator", "user_annotation"}
KNOWN_CATS = GPU_CATS | RUNTIME_CATS | CPU_OP_CATS | {"cuda_sync"}
# categories a PyTorch profile carries besides those, with nothing for the replay: skipped unsaid
SILENT_CATS = {"Trace", "python_function", "gpu_user_annotation", "overhead", "Overhead",
               "fwdbwd", "cpu_instant_event", "gpu_annotation", "ac2g"}
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cudaMemcpy",
              "cudaMemcpy2D", "cudaMemset", "cudaStreamQuery_blocking")


def is_sync_call(name: str) -> bool:
    """A runtime call that blocks the host on GPU work (SYNC_CALLS and their variants, _v2 ...).
    cudaMemsetAsync and its 2D/3D forms are not, though they start with "cudaMemset": the CUDA
    Runtime API's "API synchronization behavior" has the Async memsets always asynchronous with
    respect to the host. Without a GPU event of their own (a 0-byte memset; PARAM's ResNet trace
    has 210 of its 572) they had been host syncs on the last GPU op to end, the host held back
    on a slower GPU (that trace on a T4: 17,821 ms, 17,766 without those waits)."""
    return name.startswith(SYNC_CALLS) and not (name.startswith("cudaMemset") and "Async" in name)


MAX_UNSTEPPED_SPAN_US = 86_400e6  # a day: PyTorch's profiler captures a few steps, seconds long
_STEP = re.compile(r"ProfilerStep#(\d+)")
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.I)


@dataclass
class GpuEvent:
    ts_us: float
    dur_us: float
    name: str
    stream: str
    cat: str  # "kernel" | "memcpy" | "memset"
    correlation: int | None
    bytes: int | None = None
    comm: object = None  # kit.trace.comm_meta.CommMeta: newer Kineto's process-group fields
    # a peer-to-peer copy's (source, destination) CUDA device ordinals: Kineto writes a PtoP
    # memcpy's "fromDevice", "inDevice", "toDevice" (torch 2.13.0's libkineto, in libtorch_cpu.so
    # of the CUDA wheel: GpuActivity<CUpti_ActivityMemcpyPtoP4>::metadataJson); None elsewhere
    peer: tuple[int, int] | None = None


@dataclass
class RuntimeCall:
    ts_us: float
    dur_us: float
    name: str
    tid: str
    correlation: int | None
    ext_id: int | None = None  # the enclosing op's External id (newer Kineto; older: = correlation)


@dataclass
class CpuOp:
    ts_us: float
    dur_us: float
    name: str
    tid: str
    dims: list | None
    types: list | None
    ext_id: int | None = None  # Kineto "External id"
    rf_id: int | None = None  # "Record function id" (the ET's rf_id), when the trace has it
    comm: object = None  # kit.trace.comm_meta.CommMeta (record_param_comms' process-group fields)


@dataclass
class SyncEvent:
    """A Kineto cuda_sync event, keyed by the correlation of the runtime call that made it.

    kind: "Stream Sync" | "Event Sync" | "Context Sync" | "Stream Wait Event"; stream: the stream
    synchronised (or, for Stream Wait Event, the stream that waits); wait_stream and record_corr:
    the stream an awaited event was recorded on and the correlation of its cudaEventRecord
    (-1/None when Kineto does not know)."""

    kind: str
    stream: str | None
    wait_stream: str | None
    record_corr: int | None


@dataclass
class RankTrace:
    """One rank's events. steps: [(step number, start_us, end_us)] from ProfilerStep annotations."""

    rank: int
    source: str
    gpu_name: str | None = None
    world_size: int | None = None
    steps: list = field(default_factory=list)
    runtime: list = field(default_factory=list)  # RuntimeCall, sorted by ts
    gpu: list = field(default_factory=list)  # GpuEvent, sorted by ts
    cpu_ops: list = field(default_factory=list)  # CpuOp (cpu_op, user_annotation), sorted by ts
    syncs: dict = field(default_factory=dict)  # runtime correlation -> SyncEvent
    pid: object = None  # the host process id (pairs the rank with its execution trace)
    rank_from: str = "distributedInfo"  # or "its file name", "its position among the files"
    notes: list = field(default_factory=list)

    @property
    def measured_steps_ms(self) -> list[float]:
        """ProfilerStep durations; without any, the span of the whole trace."""
        if not self.steps:
            w0, w1 = self.window_us()
            return [(w1 - w0) / 1e3]
        return [(e - s) / 1e3 for _, s, e in self.steps]

    def window_us(self) -> tuple[float, float]:
        if self.steps:
            return self.steps[0][1], self.steps[-1][2]
        times = [(e.ts_us, e.ts_us + e.dur_us) for e in self.runtime + self.gpu + self.cpu_ops]
        if not times:
            raise KitError(f"{self.source}: the trace has no CPU or GPU events to replay")
        return min(t[0] for t in times), max(t[1] for t in times)


# No profiler clock reads past 1e17 µs (3,170 years; Kineto's epoch-based ts is ~1.7e15 µs in
# 2024): a ts or dur beyond it is malformed, and at that size a float has no µs left (a kernel at
# ts 1e300 lasting 5 µs ends at 1e300), so it is skipped as a NaN one is
MAX_TIME_US = 1e17
# the largest training jobs run ~100k GPUs; a world_size past 2**20 is no job's
MAX_WORLD_SIZE = 1 << 20


def _num(v):
    """v as a finite float of at most MAX_TIME_US in size, else None (a NaN, infinite or
    out-of-range ts/dur is as good as a missing one; so is a bool: JSON's true is no 1 µs)."""
    if isinstance(v, bool):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and abs(x) <= MAX_TIME_US else None


def _peer_devices(args) -> tuple[int, int] | None:
    """(fromDevice, toDevice) of a PtoP copy's args: two distinct device ordinals, else None."""
    a, b = _whole(args.get("fromDevice")), _whole(args.get("toDevice"))
    if a is None or b is None or a < 0 or b < 0 or a == b:
        return None
    return a, b


def int_or_none(v):
    """v as an int when it is a (non-bool) finite number or a string of a whole number ("40875",
    as some exporters write ids), else None."""
    if isinstance(v, str) and re.fullmatch(r"\s*-?[0-9]+\s*", v):  # not "--5", nor "²"
        return int(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return int(v)
    return None


def _whole(v):
    """int_or_none, but None for a fraction (a rank of 2.5 is no rank)."""
    return None if isinstance(v, float) and not v.is_integer() else int_or_none(v)


def _stream(v):
    v = int_or_none(v)
    return str(v) if v is not None and v >= 0 else None


def _sync_event(args) -> SyncEvent | None:
    kind = args.get("cuda_sync_kind")
    if not isinstance(kind, str):
        return None
    rec = int_or_none(args.get("wait_on_cuda_event_record_corr_id"))
    return SyncEvent(kind, _stream(args.get("stream")), _stream(args.get("wait_on_stream")),
                     rec if rec is not None and rec >= 0 else None)


class NotKineto(KitError):
    """A JSON document that is no Kineto trace (no traceEvents, or none a profiler records)."""


def parse_events(doc, source: str, fallback_rank: int) -> RankTrace:
    """Turn one loaded Kineto JSON document into a RankTrace."""
    from kit.trace.comm_meta import comm_meta  # it reads ids as this module does

    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise NotKineto(f"{source}: not a Kineto trace (expected a JSON object with a "
                       "'traceEvents' list)")
    dist = doc.get("distributedInfo") or {}
    # a rank written as a string ("3", as some exporters write ids) is that rank: it had been
    # taken from the file order, so a.json holding rank "1" and b.json rank "0" swapped ranks
    rank = _whole(dist.get("rank")) if isinstance(dist, dict) else None
    how = None
    if rank is None or rank < 0:
        m = _RANK_IN_NAME.search(Path(source).name)
        # a number past any job is no rank: PyTorch's tensorboard_trace_handler names a file
        # {host}_{pid}.{ms}.pt.trace.json, and a host "gpu-worker" with pid 3,000,000 (pid_max is
        # 4,194,304 under systemd) had been refused as a malformed trace of rank 3,000,000
        if m and int(m.group(1)) >= MAX_WORLD_SIZE:
            m = None
        rank = int(m.group(1)) if m else fallback_rank
        how = "its file name" if m else "its position among the files"
    if rank >= MAX_WORLD_SIZE:  # rank 2**64 (from distributedInfo) had replayed, then
        # raised numpy's OverflowError ("Python int too large") writing the timeline (--trace)
        raise KitError(f"{source}: rank {rank:,} (from {how or 'distributedInfo'}) is past any job "
                       f"({MAX_WORLD_SIZE:,} ranks at most); the trace is malformed")
    props = doc.get("deviceProperties")
    props = props if isinstance(props, list) else []  # a malformed one names no GPU
    gpu_name = props[0].get("name") if props and isinstance(props[0], dict) else None
    bad_name = None
    if gpu_name is not None and not isinstance(gpu_name, str):  # a name of 5 had been shown as
        bad_name, gpu_name = repr(gpu_name), None  # the GPU "5" and looked up as one
    world = _whole(dist.get("world_size")) if isinstance(dist, dict) else None
    if world is not None and world > MAX_WORLD_SIZE:  # a world_size of 1e9 had listed its
        # 999,999,998 missing ranks one by one (minutes, then out of memory), 2**70 at once
        raise KitError(f"{source}: distributedInfo world_size {world:,} is past any job "
                       f"({MAX_WORLD_SIZE:,} ranks at most); the trace is malformed")
    t = RankTrace(rank=rank, source=source, gpu_name=gpu_name, world_size=world)
    skipped = 0
    unreplayed: dict = {}  # complete events of a category the replay has no place for
    profiled = 0  # CUPTI range-profiler events (torch.profiler's profiler_metrics)
    pids: dict = {}
    recorded = [math.inf, -math.inf]  # first start, last end of every complete event, steps aside
    for e in doc["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur = _num(e.get("ts")), _num(e.get("dur"))
        name, cat = e.get("name"), e.get("cat")
        if not isinstance(cat, str):  # a list or object had raised TypeError (unhashable) below
            cat = None
        if ts is None or dur is None or dur < 0 or not isinstance(name, str):
            skipped += 1
            continue
        if not _STEP.fullmatch(name):  # python_function, Trace too: the host was busy
            recorded[0], recorded[1] = min(recorded[0], ts), max(recorded[1], ts + dur)
        if cat not in KNOWN_CATS:
            if cat not in SILENT_CATS:
                key = cat if isinstance(cat, str) else "(no category)"
                unreplayed[key] = unreplayed.get(key, 0) + 1
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        corr = int_or_none(args.get("correlation", args.get("External id")))
        if cat == "cuda_sync":
            sync = _sync_event(args)
            if sync is not None and corr is not None:
                t.syncs[corr] = sync
            continue
        if cat in GPU_CATS:
            kind = "kernel" if cat in ("kernel", "Kernel") else (
                "memcpy" if "emcpy" in cat else "memset")
            stream = args.get("stream", e.get("tid"))
            t.gpu.append(GpuEvent(ts, dur, name, str(stream), kind, corr, args.get("bytes"),
                                  comm_meta(args), _peer_devices(args)))
        elif cat in RUNTIME_CATS:
            profiled += cat == "cuda_profiler_range"
            t.runtime.append(RuntimeCall(ts, dur, name, str(e.get("tid")), corr,
                                         int_or_none(args.get("External id"))))
        elif cat in CPU_OP_CATS:
            m = _STEP.fullmatch(name)
            if m:
                t.steps.append((int(m.group(1)), ts, ts + dur))
            else:
                pid = e.get("pid")
                if isinstance(pid, (str, int)):  # a list or object is no process id (and unhashable)
                    pids[pid] = pids.get(pid, 0) + 1
                t.cpu_ops.append(CpuOp(ts, dur, name, str(e.get("tid")), args.get("Input Dims"),
                                       args.get("Input type"), int_or_none(args.get("External id")),
                                       int_or_none(args.get("Record function id")), comm_meta(args)))
    t.pid = max(pids, key=pids.get) if pids else None
    if how:
        t.rank_from = how
        why = "no distributedInfo" if not dist else "distributedInfo has no rank"
        t.notes.insert(0, f"{Path(source).name}: {why}; rank {rank} taken from {how}")
    if bad_name is not None:
        t.notes.append(f"rank {rank}: deviceProperties[0].name is {bad_name}, not a GPU name; "
                       "the rank names no GPU")
    if skipped:
        t.notes.append(f"skipped {skipped} events with a missing (or non-numeric, non-finite, "
                       "out-of-range, negative) ts/dur or no name")
    if profiled:  # its host times are the profiler's: replayed as recorded, not transferable
        t.notes.append(f"rank {rank}: recorded under CUPTI's range profiler ({profiled:,} "
                       "cuda_profiler_range events): each launch replays its kernel to read counters "
                       "(HTA's cupti_profiler trace: 52.9 ms a launch), so its host times are the "
                       "profiler's, not a step's")
    if unreplayed:  # another device's events (MTIA's), or kernels without a category: said, not lost
        top = sorted(unreplayed.items(), key=lambda kv: -kv[1])
        t.notes.append(f"rank {rank}: skipped {sum(unreplayed.values()):,} complete events of categories "
                       "the replay does not read (" + ", ".join(f"{k} {n:,}" for k, n in top[:4])
                       + (", ..." if len(top) > 4 else "") + "); it replays CUDA kernels, copies, runtime calls and CPU ops")
    dups = _drop_duplicates(t)
    if dups:
        t.notes.append(f"rank {rank}: dropped {sum(dups.values()):,} duplicated events ("
                       + ", ".join(f"{k} {n:,}" for k, n in dups.items()) + "): each is an exact copy "
                       "of another (same name, start, duration, stream or thread and ids), as a trace "
                       "merged twice has")
    t.steps.sort(key=lambda s: s[1])
    empty = [n for n, s, e in t.steps if e <= s]
    if empty and len(empty) == len(t.steps):
        raise KitError(f"{source}: every ProfilerStep annotation ({len(empty)}) lasts 0 µs; a step "
                       "has no length to replay (a malformed trace)")
    if empty:  # kept out of the measured steps: a 0 ms step would read as a perfect prediction
        t.steps = [st for st in t.steps if st[2] > st[1]]
        t.notes.append(f"rank {rank}: skipped {len(empty)} ProfilerStep annotation(s) of 0 µs "
                       f"(step {', '.join(str(n) for n in empty[:3])})")
    t.runtime.sort(key=lambda c: c.ts_us)
    t.gpu.sort(key=lambda g: g.ts_us)
    t.cpu_ops.sort(key=lambda c: (c.ts_us, -c.dur_us))
    host = [(e.ts_us, e.ts_us + e.dur_us) for e in t.runtime + t.cpu_ops] + [(s, e) for _, s, e in t.steps]
    if host:  # a GPU event far outlasting everything the host did while profiling
        span = max(e for _, e in host) - min(s for s, _ in host)
        long = [g for g in t.gpu if g.dur_us > 2 * span + 1e3]
        g = max(long, key=lambda g: g.dur_us) if long else None
        if g is not None and g.dur_us > 10 * span + 1e6:  # over a second past 10x the host: no kernel
            raise KitError(f"{source}: GPU event {g.name!r} lasts {g.dur_us:.6g} µs, more than ten "
                           f"times the whole host window profiled ({span:.6g} µs) and a second "
                           "more; the trace is malformed")
        if g is not None:  # a capture without the closing sync, or a stuck kernel: replayed, said
            t.notes.append(f"rank {rank}: GPU event {g.name!r} lasts {g.dur_us:.6g} µs, past the "
                           f"host window profiled ({span:.6g} µs); was the capture cut short?")
    if not t.steps and (t.gpu or host):  # the whole trace is the step measured: GPU events alone
        # have nothing of the host's to hold them against, nor host events without a step
        # (a cpu_op of 1e16 µs had measured a 1e13 ms step)
        first, last = t.window_us()
        if last - first > MAX_UNSTEPPED_SPAN_US:
            raise KitError(f"{source}: its events span {last - first:.6g} µs (from ts {first:.6g} to "
                           f"{last:.6g}) and no ProfilerStep frames a step: more than a day, which "
                           "no profiled capture is; the trace is malformed")
    if not t.steps:
        t.notes.append(f"rank {rank}: no ProfilerStep annotation; the whole trace is one step")
    if not t.runtime and not t.gpu and not t.cpu_ops and not t.steps:
        if skipped and not unreplayed:  # a profiler's events, every one broken: a malformed rank,
            # not a folder's other JSON (as NotKineto it had been skipped with a note: a 2-rank job
            # replayed as 1 rank). Beside events of other categories (another device's) they are
            # not "all" its events: that file stays one the replay cannot read
            raise KitError(f"{source}: no complete ('X') event is usable: all {skipped:,} have "
                           "a missing, non-numeric, non-finite, out-of-range or negative ts/dur or no name "
                           "(a malformed trace)")
        raise NotKineto(f"{source}: the trace has no complete ('X') CPU or GPU events of the "
                        "categories a profiler records")
    _check_steps(t, source, recorded)
    return t


def _drop_duplicates(t: RankTrace) -> dict:
    """Drop exact copies of an event (a trace whose events were written or merged twice), in
    place; returns how many per kind. A stream runs one kernel at a time and a thread one call,
    so two with one start, duration, name and correlation are one event: kept twice, a whole
    trace written twice had replayed its 0.162 ms step in 0.312 ms (each kernel queued behind its
    copy), and a doubled ProfilerStep as two steps of half the time (0.078 ms). CPU ops are
    compared only where they carry an External id (nested ops of one name may share a start)."""
    def unique(items, key):
        seen, out = set(), []
        for x in items:
            k = key(x)
            if k is not None and k in seen:
                continue
            seen.add(k)
            out.append(x)
        return out, len(items) - len(out)

    found = {}
    for kind, attr, key in (
            ("ProfilerStep", "steps", lambda st: st),
            ("GPU", "gpu", lambda e: (e.stream, e.ts_us, e.dur_us, e.name, e.correlation, e.cat)),
            ("runtime", "runtime", lambda c: (c.tid, c.ts_us, c.dur_us, c.name, c.correlation)),
            ("CPU op", "cpu_ops", lambda o: None if o.ext_id is None else
             (o.tid, o.ts_us, o.dur_us, o.name, o.ext_id, o.rf_id))):
        kept, n = unique(getattr(t, attr), key)
        if n:
            setattr(t, attr, kept)
            found[kind] = n
    return found


def _check_steps(t: RankTrace, source: str, recorded) -> None:
    """KitError when the ProfilerStep annotations cannot frame the rank's events: a step window
    that holds none of them (a step of another clock or run read as a perfect prediction), or
    one far longer than everything the profiler recorded (recorded: the first start and last end
    of every complete event but the steps, python_function and Trace ones included); a note for
    single steps that hold nothing."""
    starts = sorted(e.ts_us for e in t.runtime + t.gpu + t.cpu_ops)
    if not t.steps or not starts:
        return
    w0, w1 = t.steps[0][1], t.steps[-1][2]
    lo, hi = bisect.bisect_left(starts, w0), bisect.bisect_left(starts, w1)
    if hi == lo:
        raise KitError(f"{source}: rank {t.rank}'s ProfilerStep annotations hold none of its "
                       f"{len(starts):,} events: they start {w0 - starts[0]:+.6g} µs from its first event "
                       f"and end {w1 - starts[-1]:+.6g} µs from its last; the steps and the events are "
                       "not from one clock or run")
    span = recorded[1] - recorded[0]
    if w1 - w0 > 1e4 * span + 3.6e9:  # an hour past 10,000x what was recorded: no step of this trace
        raise KitError(f"{source}: rank {t.rank}'s ProfilerStep annotations span {w1 - w0:.6g} µs, "
                       f"{(w1 - w0) / max(span, 1):.3g} times everything else the profiler recorded "
                       f"({span:.6g} µs, its own Trace and python_function events included); the "
                       "trace is malformed")
    if w1 - w0 > 10 * span + 1e6:  # over a second past 10x: replayed, as measured, and said
        t.notes.append(f"rank {t.rank}: its ProfilerStep(s) span {(w1 - w0) / 1e3:.6g} ms, "
                       f"{(w1 - w0) / max(span, 1):.3g} times everything the profiler recorded "
                       f"({span / 1e3:.6g} ms); the unrecorded time is replayed as host idle, as "
                       "measured, so the step's error says little")
    empty = [n for n, s, e in t.steps if bisect.bisect_left(starts, s) == bisect.bisect_left(starts, e)]
    if empty:
        t.notes.append(f"rank {t.rank}: {len(empty)} ProfilerStep(s) hold no recorded event (step "
                       f"{', '.join(str(n) for n in empty[:3])}{' ...' if len(empty) > 3 else ''}); "
                       "their time is replayed as host idle")


def _load_bytes(raw: bytes, source: str):
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise KitError(f"{source}: corrupt gzip ({e})") from None
    elif str(source).lower().endswith(".gz"):
        raise KitError(f"{source}: named .gz but not gzip data")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise KitError(f"{source}: not valid JSON ({e})") from None


def load_json_file(path, what: str = "trace"):
    """One JSON file, plain or gzip, as kit replay reads it; any problem is one KitError naming
    `what` and the path (missing, a folder, unreadable, corrupt gzip, not JSON)."""
    p = Path(path)
    refuse_device(p, what)
    if not p.exists():
        raise KitError(f"{what} not found: {p}")
    if p.is_dir():
        raise KitError(f"{what} {p} is a folder; give a .json or .json.gz file")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise KitError(f"cannot read {what} {p}: {e.strerror or e}") from None
    return _load_bytes(raw, f"{what} {p}")


def _is_trace_name(name: str) -> bool:
    n = name.lower()
    return n.endswith((".json", ".json.gz")) and not n.startswith(".")


def _is_tarfile(p: Path) -> bool:
    try:
        return tarfile.is_tarfile(p)
    except (OSError, EOFError, tarfile.TarError):  # e.g. a truncated .gz: read as a file below
        return False


def is_execution_trace(doc) -> bool:
    """A PyTorch execution trace (ET) rather than a Kineto trace: {"schema": ..., "nodes": [...]}."""
    return isinstance(doc, dict) and "nodes" in doc and "schema" in doc and "traceEvents" not in doc


def read_docs(path) -> list[tuple[str, object]]:
    """(source, loaded JSON) for every *.json/*.json.gz in a file, .gz, folder or tarball."""
    p = Path(need_path(path, "the trace"))
    refuse_device(p, "trace")
    if not p.exists():
        raise KitError(f"trace {path}: no such file or folder")
    docs: list[tuple[str, object]] = []
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and _is_trace_name(f.name))
        docs = [(str(f), _load_bytes(f.read_bytes(), str(f))) for f in files]
    elif _is_tarfile(p):
        try:
            with tarfile.open(p) as tar:
                for m in sorted(tar.getmembers(), key=lambda m: m.name):
                    if m.isfile() and _is_trace_name(Path(m.name).name):
                        raw = tar.extractfile(m).read()
                        docs.append((f"{p}:{m.name}", _load_bytes(raw, f"{p}:{m.name}")))
        except (tarfile.TarError, OSError, EOFError) as e:
            raise KitError(f"trace {path}: unreadable tarball ({e})") from None
    elif p.name.lower().endswith((".tar", ".tar.gz", ".tgz")):
        raise KitError(f"trace {path}: not a tar archive (named like a tarball of per-rank Kineto files)")
    else:
        docs = [(str(p), _load_bytes(p.read_bytes(), str(p)))]
    return docs


def _gpu_key(name: str) -> str:
    """A device name as the catalog knows it (its key: 'Tesla V100-SXM2-32GB' and 'NVIDIA
    V100-SXM2-32GB ' alike), else as letters and digits alone."""
    from kit.hardware import get_gpu

    try:
        return get_gpu(name).key
    except KitError:
        return re.sub(r"[^0-9a-z]", "", name.casefold())


def load_kineto(path, docs=None) -> list[RankTrace]:
    """All ranks in a Kineto file, .gz, folder or tarball (.tar, .tar.gz, .tgz), sorted by rank.
    Execution traces found alongside are skipped here (kit.trace.et reads them)."""
    docs = read_docs(path) if docs is None else docs
    n_et = sum(1 for _, d in docs if is_execution_trace(d))
    docs = [(src, d) for src, d in docs if not is_execution_trace(d)]
    if not docs:
        extra = f" (only {n_et} PyTorch execution traces)" if n_et else ""
        raise KitError(f"trace {path}: no Kineto JSON files (*.json or *.json.gz) found{extra}")
    ranks, other = [], []
    for i, (src, doc) in enumerate(docs):
        try:
            ranks.append(parse_events(doc, src, i - len(other)))
        except NotKineto as e:  # a folder's other JSON (a label, the kit's own trace output)
            if len(docs) == 1:
                raise
            other.append(f"{Path(src).name}: {str(e).split(': ', 1)[-1]}")
    if not ranks:
        raise KitError(f"trace {path}: none of its {len(docs)} JSON files is a Kineto trace; "
                       f"e.g. {other[0]}")
    if other:
        ranks[0].notes.append(f"skipped {len(other)} JSON file(s) that are no Kineto trace: "
                              + "; ".join(other[:3]) + (" ..." if len(other) > 3 else ""))
    by_pos = [r for r in ranks if r.rank_from.endswith("position among the files")]
    named = {r.rank for r in ranks if r not in by_pos}
    free = (k for k in range(len(ranks) + len(named) + 1) if k not in named)
    for r in by_pos:  # ranks known only by position take the numbers no file claims
        old, r.rank = r.rank, next(free)
        r.notes = [re.sub(rf"\brank {old}\b", f"rank {r.rank}", n) for n in r.notes]
    named_gpu = [r for r in ranks if isinstance(r.gpu_name, str) and r.gpu_name.strip()]
    gpus = {_gpu_key(r.gpu_name): r.gpu_name.strip() for r in named_gpu}
    if len(gpus) > 1:  # one job's ranks run one GPU model: files of other runs mixed in?
        by = {shown: [r.rank for r in named_gpu if _gpu_key(r.gpu_name) == key]
              for key, shown in sorted(gpus.items())}
        ranks[0].notes.append("the files name different GPUs ("
                              + "; ".join(f"{g} on rank(s) {', '.join(map(str, rs[:4]))}"
                                          for g, rs in by.items())
                              + "): replayed as one job; check they are from the same run")
    sizes = {r.world_size for r in ranks if isinstance(r.world_size, int)}
    if len(sizes) > 1:
        ranks[0].notes.append(f"the files give different world sizes ({', '.join(map(str, sorted(sizes)))}): "
                              "replayed as one job; check they are from the same run")
    for r in ranks:  # a rank past the job's size is a file of another job, or a malformed rank
        if r.rank_from == "distributedInfo" and isinstance(r.world_size, int) \
                and not isinstance(r.world_size, bool) and r.world_size > 0 and r.rank >= r.world_size:
            raise KitError(f"{r.source}: rank {r.rank} is not below the world size its distributedInfo "
                           f"gives ({r.world_size}); a rank runs from 0 to world size - 1")
    numbers = {r.rank: [n for n, _, _ in r.steps] for r in ranks if r.steps}
    if len({tuple(v) for v in numbers.values()}) > 1:  # replayed in order, step k with step k
        shown = "; ".join(f"rank {k}: #{', #'.join(map(str, v[:3]))}{' ...' if len(v) > 3 else ''}"
                          for k, v in list(sorted(numbers.items()))[:4])
        ranks[0].notes.append(f"the ranks record different ProfilerSteps ({shown}"
                              f"{'; ...' if len(numbers) > 4 else ''}): replayed in order, each "
                              "rank's k-th step with the others'; check they are from the same run")
    seen: dict[int, str] = {}
    for r in ranks:
        if r.rank in seen:
            raise KitError(f"trace {path}: rank {r.rank} appears twice ({seen[r.rank]} and "
                           f"{r.source}); give one file per rank")
        seen[r.rank] = r.source
    return sorted(ranks, key=lambda r: r.rank)


def read_json_text(text: str, source: str = "<string>") -> RankTrace:
    """Parse one trace from a JSON string (tests, notebooks)."""
    return parse_events(_load_bytes(text.encode(), source), source, 0)


__all__ = ["CpuOp", "GpuEvent", "NotKineto", "RankTrace", "RuntimeCall", "SYNC_CALLS", "SyncEvent",
           "is_execution_trace", "is_sync_call", "load_json_file", "load_kineto", "parse_events", "read_docs", "read_json_text"]
