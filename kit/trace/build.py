"""Kineto RankTraces -> one ExecGraph with the measured durations (Lumos-style reconstruction).

Per rank, within the profiled steps:
* The CPU is one issuing thread: the runtime calls of all host threads in time order, with the
  measured CPU time between them as "cpu" ops. (PyTorch's autograd thread and the main thread
  take turns; they do not issue concurrently.)
* A launch (cudaLaunchKernel, cudaMemcpyAsync, ...) becomes a "launch" op and a GPU op on its
  stream (a cudaGraphLaunch: one GPU op per kernel of the graph, all under its correlation).
  The launch is split where the kernel was seen to start, so an idle GPU starts the kernel
  exactly as measured.
* A GPU op that started later than its launch and its stream predecessor allow waited on an
  event: it depends on the op of another stream that ended last before it started.
* A host sync (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, a blocking
  memcpy) blocks the CPU until the GPU work it awaits has ended, then costs what it cost after
  that. What it awaits, in order of preference: Kineto's cuda_sync event for the call (the
  stream synchronised, or the stream and cudaEventRecord of the awaited event: everything
  launched there before the record); else, with an execution trace, the stream the syncing op's
  data is on (kit.trace.link); else the GPU op that ended last before the call returned.
* cudaStreamWaitEvent (a cuda_sync "Stream Wait Event") makes the stream's next op wait for
  the work recorded on the other stream. With an execution trace, a kernel also waits for the
  kernels on other streams that wrote its op's inputs. A kernel that still started later than
  all that allows waited on an event if an op of another stream ended meanwhile: it depends on
  the one that ended last before it started. Whatever is left of the gap is the GPU's launch
  delay: a "launch delay" op (CPU/launch cause, on its own queue per stream) between the
  launch and the kernel, so the kernel starts as measured.
* NCCL kernels are collectives. They are matched across ranks by (stream, position) and start
  together; each lasts the shortest measured duration of its group, the one of the rank that
  arrived last and so waited least (the others' extra time was waiting). Where the trace names
  each one's process group (newer PyTorch's record_param_comms 'Process Group Ranks', a
  send/recv's peer: kit.trace.comm_meta) and those groups partition the matched ranks, each
  group is one collective of its own ranks; else all the matched ranks are one. Where every
  collective names its group and the groups agree across their ranks, they are matched per group
  instead (kit.trace.group_sync): the i-th of a group on each of its ranks (by torch's 'Seq' where
  given), a send with its peer's recv, so groups that run different numbers of collectives
  (pipeline stages) are synchronised too, and clock offsets chain from group to group. A chain
  or ring shift of coalesced send/recv batches waits pairwise instead, each batch on its own
  peers (kit.trace.group_sync.wait_pairwise), and its ends set the clock offsets only where no
  other collective ties the ranks.
* Clock offsets between ranks are estimated from the collectives' end times, which a ring or
  all-to-all makes near-simultaneous on every rank; each rank starts at its aligned step start.
* The job's size is the largest distributedInfo world_size, or the number of files when that is
  more (job_world_size; kit.trace.transfer rescales the collectives for that many ranks). When
  the files hold only some of its ranks, the collectives are not synchronised: a group matched
  across the ranks present lacks its members on the missing ones (the rank that arrived last and
  the clock offsets may be among them), so, as for a single rank of a larger job, each collective
  keeps its own measured duration and each rank its own start; a note names the missing ranks.
"""
from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field

from kit.sim import ExecGraph
from kit.trace.kineto import RankTrace, RuntimeCall, int_or_none, is_sync_call

UNRECORDED = "(launch not recorded)"

TOL_US = 1.0  # timestamps are whole µs in Kineto


def is_collective_kernel(name: str) -> bool:
    return name.lower().startswith("nccl") or name.startswith("rccl")


# what an NCCL/RCCL kernel does, by its name (ncclKernel_AllReduce_RING_LL_Sum_float,
# ncclDevKernel_ReduceScatter_..., ncclAllGatherRingLLKernel_...): the more specific first, as
# "allreduce" and "reducescatter" hold "reduce"; send, recv and sendrecv pair with each other
_COLLECTIVE_FAMILIES = (("allreduce", "allreduce"), ("reducescatter", "reducescatter"),
                        ("allgather", "allgather"), ("alltoall", "p2p"), ("sendrecv", "p2p"),
                        ("send", "p2p"), ("recv", "p2p"), ("broadcast", "broadcast"),
                        ("reduce", "reduce"))


def collective_family(name: str) -> str | None:
    """allreduce, reducescatter, allgather, p2p, broadcast or reduce; None when the kernel's name
    does not say (NCCL's ncclDevKernel_Generic runs any of them)."""
    n = name.lower().replace("_", "")
    return next((fam for needle, fam in _COLLECTIVE_FAMILIES if needle in n), None)


def job_world_size(traces) -> int:
    """The job's rank count: the largest world_size the files' distributedInfo states, or the
    number of files when that is more (or none is stated). One rank's trace of an 8-GPU job is
    part of an 8-rank job, its collectives 8-rank ones."""
    said = [w for t in traces if (w := int_or_none(t.world_size)) is not None and w > 0]
    return max([len(traces), 1, *said])


def missing_ranks(traces) -> list[int]:
    """Rank ids of the job (job_world_size) that no file holds; [] when the files are the whole
    job, or a single rank (which has its own note)."""
    world = job_world_size(traces)
    if not 1 < len(traces) < world:
        return []
    present = {t.rank for t in traces}
    return [r for r in range(world) if r not in present]


def rank_list(ranks) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    out, run = [], []
    for r in sorted(ranks):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [r]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


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
    links: dict = field(default_factory=dict)  # rank -> kit.trace.link.EtLink (execution traces)
    syncs: dict = field(default_factory=dict)  # host syncs by what set their deps: cuda_sync/et/timing
    sync_ops: dict = field(default_factory=dict)  # rank -> [(op id, RuntimeCall, what set its deps)]
    gpu_waits: dict = field(default_factory=dict)  # cross-stream GPU deps by source
    missing_ranks: list = field(default_factory=list)  # the job's ranks no file holds
    source_system: list | None = None  # --on a system: [{system, ranks, chosen}] (kit.trace.transfer)
    notes: list = field(default_factory=list)


def _step_marks(t: RankTrace, w0: float, w1: float):
    if t.steps:
        out = []
        for n, s, e in t.steps:
            out += [(s, 0, f"ProfilerStep#{n} start"), (e, 1, f"ProfilerStep#{n} end")]
        return out
    return [(w0, 0, "trace start"), (w1, 1, "trace end")]


def _share_out(runtime, by_corr) -> dict:
    """id(call) -> its GPU events, for the correlations that several runtime calls carry (a
    trace whose ids fall back to the op's External id, shared by every launch of the op): each
    event goes to one call, the k-th to the k-th where they are as many, else to the last call
    that started by its start. Every call had taken all of them: an op's two launches of one
    kernel each replayed four kernels, a 0.2 ms step in 0.28 ms."""
    calls: dict = {}
    for c in runtime:
        if c.correlation in by_corr:
            calls.setdefault(c.correlation, []).append(c)
    out: dict = {}
    for corr, cs in calls.items():
        if len(cs) < 2:
            continue
        cs = sorted(cs, key=lambda c: c.ts_us)
        evs = by_corr[corr]
        for c in cs:
            out[id(c)] = []
        if len(cs) == len(evs):
            for c, e in zip(cs, evs):
                out[id(c)].append(e)
            continue
        starts = [c.ts_us for c in cs]
        for e in evs:
            k = max(bisect.bisect_right(starts, e.ts_us) - 1, 0)
            out[id(cs[k])].append(e)
    return out


def _enqueued_by(orphans, calls, by_corr, of_call) -> dict:
    """id(GPU op without a recorded launch) -> when it was on its stream at the latest: its start,
    or the first launch in the window of a GPU op that ran after it on that stream (a stream runs
    in launch order, so it was queued before that launch). Anchored at its start alone, the
    previous step's kernel still running at a step's start (launched before the profiler saw it)
    had been queued behind the step's first kernels, launched before it started: the stream
    replayed out of order, a 0.300 ms step in 0.350 ms."""
    if not orphans:
        return {}
    later: dict = {}  # stream -> [(GPU start, its launch's ts)]
    for c in calls:
        ges = of_call[id(c)] if id(c) in of_call else (
            by_corr.get(c.correlation) if c.correlation is not None else None)
        for ge in ges or ():
            later.setdefault(ge.stream, []).append((ge.ts_us, c.ts_us))
    first: dict = {}  # stream -> (GPU starts, earliest launch ts of the ops from each on)
    for st, xs in later.items():
        xs.sort()
        mins, m = [], float("inf")
        for _, ts in reversed(xs):
            m = min(m, ts)
            mins.append(m)
        first[st] = ([x[0] for x in xs], mins[::-1])
    out = {}
    for e in orphans:
        starts, mins = first.get(e.stream, ((), ()))
        k = bisect.bisect_right(starts, e.ts_us)
        out[id(e)] = min(e.ts_us, mins[k]) if k < len(mins) else e.ts_us
    return out


def _build_rank(g: ExecGraph, tg: TraceGraph, t: RankTrace) -> None:
    r = g.add_rank(t.rank)
    w0, w1 = t.window_us()
    tg.idle_op[r] = g.cpu(r, 0.0, "start offset", kind="idle")
    # correlation -> its GPU ops in time order: a cudaGraphLaunch runs every kernel of the graph
    # under the one correlation of its call (a dict of one op each had kept the last: a 3-kernel
    # graph replayed as its last kernel, the other two's 0.08 ms turned into "launch delay")
    by_corr: dict = {}
    for e in t.gpu:
        if e.correlation is not None:
            by_corr.setdefault(e.correlation, []).append(e)
    of_call = _share_out(t.runtime, by_corr)
    marks = _step_marks(t, w0, w1)
    calls = [c for c in t.runtime if w0 <= c.ts_us < w1]
    # GPU work whose launch Kineto did not record still occupies its stream: anchor it to the
    # host timeline at its measured start with a zero-cost launch
    launched = {c.correlation for c in t.runtime if c.correlation is not None}  # None launches nothing
    orphans = [e for e in t.gpu if w0 <= e.ts_us < w1 and e.correlation not in launched]
    enqueued = _enqueued_by(orphans, calls, by_corr, of_call)
    anchored: dict = {}  # an unrecorded launch's correlation -> its GPU ops, anchored at the first
    anchor_of: dict = {}
    anchors = []
    for k, e in enumerate(orphans):
        key = e.correlation if e.correlation is not None else -1 - k
        a = anchor_of.get(key)
        if a is None:
            a = anchor_of[key] = RuntimeCall(e.ts_us, 0.0, UNRECORDED, "?", key)
            anchors.append(a)
        a.ts_us = min(a.ts_us, enqueued[id(e)])
        anchored.setdefault(key, []).append(e)
    by_corr.update(anchored)
    # first among the calls of their µs (the sort below keeps this order for equal times): the
    # launch was before the kernel started, so a sync starting that µs waits for it
    calls = anchors + calls
    if orphans:
        tg.notes.append(f"rank {r}: {len(orphans)} GPU ops without a recorded launch, placed at "
                        "their measured start")
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

    launch_ts: dict[str, list[float]] = {}
    waits_for: dict[str, list[int]] = {}  # stream -> ops its next op waits on (cudaStreamWaitEvent)
    op_of_corr: dict[int, int] = {}
    call_ts = {c.correlation: c.ts_us for c in t.runtime if c.correlation is not None}
    link = tg.links.get(r)

    def count(d, key):
        d[key] = d.get(key, 0) + 1

    def tail_at(stream, ts=None):
        ops_s = stream_ops.get(stream)
        if not ops_s:
            return -1
        if ts is None:
            return ops_s[-1]
        k = bisect.bisect_right(launch_ts[stream], ts) - 1
        return ops_s[k] if k >= 0 else -1

    def awaited(c, e, timing_only=False):
        """(GPU ops a host sync waits on, what said so)."""
        info = None if timing_only else t.syncs.get(c.correlation)
        if info is not None:
            if info.kind == "Stream Sync" and info.stream in stream_ops:
                return [tail_at(info.stream)], "cuda_sync"
            if info.kind == "Context Sync":
                return [so[-1] for so in stream_ops.values()], "cuda_sync"
            if info.kind == "Event Sync" and info.wait_stream and info.record_corr in call_ts:
                op = tail_at(info.wait_stream, call_ts[info.record_corr])
                return ([op] if op >= 0 else []), "cuda_sync"
        if c.name in ("cudaDeviceSynchronize", "cuCtxSynchronize"):
            return [so[-1] for so in stream_ops.values()], "device"
        if link is not None and not timing_only and c.correlation in link.sync_inputs:
            streams = {ops_stream[op_of_corr[x]] for x in link.sync_inputs[c.correlation]
                       if x in op_of_corr}
            on = [tail_at(st) for st in sorted(streams)]
            if on:
                return on, "et"
        best, _ = last_ended(e)
        return ([best] if best >= 0 else []), "timing"

    def last_ended(ts, skip=None):
        """(op, end) of the GPU op that ended last by ts (within TOL_US), on any stream but skip."""
        best, best_end = -1, -1.0
        for st, ends in stream_ends.items():
            if st == skip:
                continue
            k = bisect.bisect_right(ends, ts + TOL_US) - 1
            if k >= 0 and ends[k] > best_end:
                best, best_end = stream_ops[st][k], ends[k]
        return best, best_end

    ops_stream: dict[int, str] = {}

    def place(c, ge, launch, launched_at):
        """The GPU op of ge, launched by call c (its host part: op launch, done at launched_at)."""
        deps = [launch]
        prev_end = stream_ends.get(ge.stream, [])[-1:] or [w0]
        ready = max(launched_at, prev_end[0])
        for op in waits_for.pop(ge.stream, []):
            deps.append(op)
            ready = max(ready, measured_end[op])
            count(tg.gpu_waits, "cuda_sync")
        if link is not None:
            for x in link.kernel_inputs.get(c.correlation, ()):
                op = op_of_corr.get(x)
                if op is not None and ops_stream[op] != ge.stream and op not in deps:
                    deps.append(op)
                    ready = max(ready, measured_end[op])
                    count(tg.gpu_waits, "et")
        # it waited on an event of another stream; not one without a recorded launch: anchored
        # before its start (_enqueued_by), its gap is its stream's unseen past, and an op of
        # another stream that ended meanwhile had become its dependency (on a T4 the previous
        # step's kernel then started 0.061 ms into the step, not at 0.020 as measured)
        if ge.ts_us > ready + TOL_US and c.name != UNRECORDED:
            best, best_end = last_ended(ge.ts_us, skip=ge.stream)
            if best >= 0 and best_end > ready + TOL_US:  # that op ended while it waited
                deps.append(best)
                ready = best_end
                count(tg.gpu_waits, "timing")
        if ge.ts_us > ready + TOL_US:  # the rest: the GPU took that long to start it
            before = deps + stream_ops.get(ge.stream, [])[-1:]
            deps.append(g.cpu(r, (ge.ts_us - ready) / 1e3, "launch delay",
                              thread=f"launch delay {ge.stream}", kind="launch", deps=before))
            count(tg.gpu_waits, "launch delay")
        kind = ("comm" if is_collective_kernel(ge.name) else
                "compute" if ge.cat == "kernel" else "memcpy")
        op = g.gpu(r, f"stream {ge.stream}", ge.dur_us / 1e3, ge.name, kind=kind, deps=deps,
                   tag=c.name)
        gend = ge.ts_us + ge.dur_us
        stream_ends.setdefault(ge.stream, []).append(gend)
        stream_ops.setdefault(ge.stream, []).append(op)
        launch_ts.setdefault(ge.stream, []).append(c.ts_us)
        ops_stream[op] = ge.stream
        op_of_corr[c.correlation] = op
        measured_end[op] = gend
        ops.append((op, ge, step_k, c))
        return op

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
        ges = (of_call[id(c)] if id(c) in of_call else by_corr.get(c.correlation)
               if c.correlation is not None else None)
        if ges:
            first = min(max(ges[0].ts_us - s, 0.0), e - s)
            launch = g.cpu(r, first / 1e3, c.name, kind="launch")
            for ge in ges:
                op = place(c, ge, launch, s + first)
            rest = (e - s) - first
            gend = ge.ts_us + ge.dur_us
            if len(ges) == 1 and e >= gend - TOL_US and ge.ts_us >= s - TOL_US and ge.cat != "kernel":
                g.sync(r, [op], max(e - max(gend, s + first), 0.0) / 1e3, c.name + " (blocking)")
            elif rest > 0:
                g.cpu(r, rest / 1e3, c.name, kind="launch")
        elif is_sync_call(c.name):
            on, why = awaited(c, e)
            on = [o for o in on if o >= 0]
            count(tg.syncs, why)
            if why == "et":  # how often the data's stream agrees with what the timing says
                t_on, _ = awaited(c, e, timing_only=True)
                count(tg.syncs, "et_same_as_timing" if set(t_on) <= set(on) else "et_differs")
            after = max([measured_end[o] for o in on] + [s])
            op = g.sync(r, on, max(e - after, 0.0) / 1e3, c.name)
            tg.sync_ops.setdefault(r, []).append((op, c, why))
        else:
            info = t.syncs.get(c.correlation) if c.correlation is not None else None
            if info is not None and info.kind == "Stream Wait Event" and info.stream \
                    and info.wait_stream and info.record_corr in call_ts:
                op = tail_at(info.wait_stream, call_ts[info.record_corr])
                if op >= 0:
                    waits_for.setdefault(info.stream, []).append(op)
            g.cpu(r, (e - s) / 1e3, c.name)
        cursor = e
    tg.markers[r] = [(step_marks[2 * i], step_marks[2 * i + 1]) for i in range(len(step_marks) // 2)]
    if not t.gpu:
        tg.notes.append(f"rank {r}: CPU-only (no GPU events); replayed on its host thread alone")
    if len(ops) < len(t.gpu):  # launched (or, unlaunched, run) outside the steps replayed: said
        placed = {id(ge) for _, ge, _, _ in ops}
        lost = [e for e in t.gpu if id(e) not in placed]
        into = sum(1 for e in lost if e.ts_us + e.dur_us > w0 and e.ts_us < w1)
        tg.notes.append(f"rank {r}: {len(lost):,} GPU op(s) launched outside the replayed window "
                        f"({'the profiled steps' if t.steps else 'the trace'}) not replayed"
                        + (f", {into:,} of them running into it (the kernels it held up start "
                           "as measured, after a launch delay)" if into else ""))


def _process_groups(tg: TraceGraph, gpu_ranks):
    """members (rank -> (op, GpuEvent)) of one matched collective -> its rank sets that run it
    together: the process groups (or send/recv pairs) the trace names (kit.trace.comm_meta),
    where every member names one and they partition the members; else all of them, one set.
    Tied across all the job's ranks, pairs 0-1 and 2-3 had each waited for the other pair and
    taken the shortest of the 4 measured durations, another group's."""
    from kit.trace.comm_meta import op_comm_metas, trace_group

    metas = op_comm_metas(tg)
    world = job_world_size(tg.traces)
    everyone = sorted(gpu_ranks)

    def parts(members):
        if not metas:
            return [everyone]
        named = {}
        for r, (op, _) in members.items():
            ranks = trace_group(metas.get(op), r, world)[0]
            if ranks is None:
                return [everyone]
            named[r] = tuple(ranks)
        if any(r2 not in named or named[r2] != ranks for ranks in named.values() for r2 in ranks):
            return [everyone]
        return sorted(set(named.values()))
    return parts


def _sync_by_group(g: ExecGraph, tg: TraceGraph, gpu_ranks, silent=()) -> bool:
    """Synchronise each collective with its own group's ranks where every collective names its
    group and they agree (kit.trace.group_sync); False (and a note where the groups disagree)
    leaves it to the match by stream position. silent: ranks with GPU work but no collective (no
    group the others name may hold them, else the groups disagree). Ranks that no chain of
    collectives ties to gpu_ranks[0] (silent ones included) have no measured offset to it: each
    such chain is aligned so that its first step starts with gpu_ranks[0]'s chain's first, not
    at its raw clock (ranks 2-3 on a host whose clock read 1 s later had idled 1 s)."""
    from kit.trace.group_sync import clock_offsets, match_by_group, wait_pairwise

    matched, why = match_by_group(tg, collective_family)
    if matched is None:
        if why:
            tg.notes.append(f"the process groups the trace names do not agree across ranks ({why}); "
                            "collectives matched by their position on each rank's NCCL stream")
        return False
    split = 0
    chained = wait_pairwise(tg, matched)
    for key, members in matched:
        split += len(members) if len(members) < len(gpu_ranks) else 0
        if key[0] == "coalesced" and len(members) > 2:
            continue  # wait_pairwise: each batch waits on its own peers
        d = min(ge.dur_us for _, ge in members.values()) / 1e3
        for op, _ in members.values():
            g.group[op] = ("nccl",) + key
            g.dur_ms[op] = d
    # a chain's batches end as their own peers let them, not together: their ends set the clock
    # offsets only of ranks no other collective ties (clock_offsets' weak links)
    offsets, root_of = clock_offsets(matched, list(gpu_ranks) + list(silent),
                                     weak=[i for i, (k, m) in enumerate(matched)
                                           if k[0] == "coalesced" and len(m) > 2])
    apart = [r for r in gpu_ranks if root_of[r] != gpu_ranks[0]]
    window0 = {t.rank: t.window_us()[0] for t in tg.traces}
    chain_start: dict = {}
    for r, root in root_of.items():
        chain_start[root] = min(chain_start.get(root, float("inf")), window0[r] - offsets[r])
    for r, root in root_of.items():
        offsets[r] += chain_start[root] - chain_start[gpu_ranks[0]]
    tg.offsets_us.update(offsets)
    if split:
        tg.notes.append(f"{split} collective(s) synchronised within the process groups their trace "
                        "names (each group's ranks wait for each other, not for the job's others; "
                        "matched by their order in the group)")
    if chained:
        tg.notes.append(f"{chained} coalesced send/recv batch(es) of ring shifts or chains wait only for "
                        "their own peers (NCCL matches a send and its recv pairwise), not for the whole "
                        "chain")
    if apart:
        tg.notes.append(f"rank(s) {rank_list(apart)} share no collective, directly or through "
                        f"others, with rank {gpu_ranks[0]}: their clocks are aligned among their own, their "
                        f"first step with rank {gpu_ranks[0]}'s")
    if silent:
        tg.notes.append(f"rank(s) {rank_list(silent)} run no collective and are in no group the trace "
                        "names: their steps start with the others', at no measured clock offset")
    tg.collectives_synced = True
    return True


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
            tg.notes.append("one rank of a larger job: its collectives are not synchronised with the other "
                            "ranks (they take their measured durations, or those --on/on= predicts)")
    # a rank that ran kernels but no collective is one the others' collectives never met: CPU-only
    # ranks (no GPU events at all) aside, it is in the shape check (it had been left out, and the
    # rest synchronised as if they were the whole group)
    silent = [r for r, ops in tg.gpu_ops.items() if ops and not per_rank[r]] if gpu_ranks else []
    if len(gpu_ranks) + len(silent) < 2:
        return
    if _sync_by_group(g, tg, gpu_ranks, silent):
        return
    gpu_ranks += silent
    shape = {r: [len(v) for v in per_rank[r].values()] for r in sorted(gpu_ranks)}
    ref = shape[gpu_ranks[0]]
    if any(s != ref for s in shape.values()):
        tg.notes.append(f"collective counts per stream differ across ranks ({shape}); "
                        "collectives replayed at measured durations without inter-rank sync")
        return
    for si, n in enumerate(ref):  # matched by position, so the k-th of each rank must be one kind
        for k in range(n):
            fams = {r: collective_family(per_rank[r][si][k][1].name) for r in gpu_ranks}
            if len(set(fams.values()) - {None}) > 1:
                # one rank of each kind: the first four ranks alone may all run the same one
                first = {}
                for r in sorted(fams):
                    first.setdefault(fams[r], r)
                seen = "; ".join(f"rank {r}: {per_rank[r][si][k][1].name.split('(')[0]}"
                                 for r in sorted(first.values())[:4])
                tg.notes.append(f"collective {k} of NCCL stream {si} is not the same collective on every "
                                f"rank ({seen}); collectives replayed at measured durations without "
                                "inter-rank sync")
                return
    ends: dict[int, list[float]] = {r: [] for r in gpu_ranks}
    groups_of = _process_groups(tg, gpu_ranks)
    split = 0
    for si, n in enumerate(ref):
        for k in range(n):
            members = {r: per_rank[r][si][k] for r in gpu_ranks}
            parts = groups_of(members)
            split += len(members) if len(parts) > 1 else 0
            for part in parts:
                key = ("nccl", si, k) + ((tuple(part),) if len(parts) > 1 else ())
                d = min(members[r][1].dur_us for r in part) / 1e3
                for r in part:
                    op, ge = members[r]
                    g.group[op] = key
                    g.dur_ms[op] = d
                    ends[r].append(ge.ts_us + ge.dur_us)
    if split:
        tg.notes.append(f"{split} collective(s) synchronised within the process groups their trace "
                        "names (each group's ranks wait for each other, not for the job's others)")
    r0 = gpu_ranks[0]
    for r in gpu_ranks:
        tg.offsets_us[r] = statistics.median(a - b for a, b in zip(ends[r], ends[r0]))
    tg.collectives_synced = True


def build_graph(traces: list[RankTrace], sync_collectives: bool = True,
                links: dict | None = None) -> TraceGraph:
    """One ExecGraph over all ranks, durations as measured (ms), ranks aligned in time.
    links: rank -> EtLink (kit.trace.link) for the ranks that have an execution trace."""
    g = ExecGraph("trace")
    tg = TraceGraph(g, list(traces), links=dict(links or {}))
    for t in traces:
        _build_rank(g, tg, t)
    tg.missing_ranks = missing_ranks(traces)
    if tg.missing_ranks:
        world = job_world_size(traces)
        many = len(tg.missing_ranks) > 1
        note = (f"rank{'s' if many else ''} {rank_list(tg.missing_ranks)} missing: the files hold "
                f"{len(traces)} of the job's {world} ranks (distributedInfo world_size {world})")
        if any(g.kind[op] == "comm" for ops in tg.gpu_ops.values() for op, *_ in ops):
            note += ("; collectives are not synchronised across an incomplete job (each takes its "
                     f"measured duration, or the one --on/on= predicts for {world} ranks)")
        tg.notes.append(note)
    if sync_collectives and not tg.missing_ranks:
        _match_collectives(g, tg)
    starts = {t.rank: t.window_us()[0] - tg.offsets_us.get(t.rank, 0.0) for t in traces}
    if tg.collectives_synced:
        t0 = min(starts[r] for r in tg.offsets_us)
        for r, op in tg.idle_op.items():
            if r in tg.offsets_us:
                g.dur_ms[op] = max(starts[r] - t0, 0.0) / 1e3
    return tg
