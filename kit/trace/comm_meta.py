"""The process-group fields newer PyTorch Kineto traces carry on a collective, read into CommMeta.

PyTorch's profiler writes them on the record_param_comms cpu_op (and newer Kineto on the NCCL
kernel's own event); the keys are torch 2.13's (torch/include/torch/csrc/profiler/util.h:190-206,
kCommsName ... kP2pDst). How the values are written (torch 2.13's own readers of them):
* "Collective name", "dtype", "Process Group Name", "Process Group Description": strings; dtype is
  c10's ScalarType name ("Float", "BFloat16": torch/testing/_internal/distributed/distributed_test.py:7107).
* "In msg nelems", "Out msg nelems", "Group size", "Global rank start", "Global rank stride",
  "Rank", "Src Rank", "Dst Rank": numbers (distributed_test.py:708-712 compares them with ints;
  torch/autograd/profiler_util.py:626-638 converts them with int).
* "Process Group Ranks": a string of a JSON list, "[0, 1]" (torch/_inductor/fx_passes/
  profile_guided_estimation.py:208,226-231 json.loads it), which libtorch_cpu.so's format
  "[{}, ..., {}]" shortens past a length; then the ranks are start + i * stride for i below the
  group size (ParamCommsUtils.hpp's ParamCommsDebugInfo takes globalRankStart, globalRankStride
  and worldSize, and getGroupRanks). A list of ints is read too.
* "Src Rank" (recv) and "Dst Rank" (send) are the peer's global rank: groupRanks[rank], where a
  send's or recv's "Rank" is the peer's rank in its group. That is torch's profiler/util.cpp
  (saveNcclMeta), which the wheel does not ship: the wheel confirms the keys and that they are
  ints (profiler_util.py:637-638), not which rank they name. So a peer is used only where it and
  the rank are both in the group's ranks (trace_group); one given as a group rank mostly is not.
* "Seq" (kSeqNum, util.h:205): a number (profiler_util.py:639 converts it with int), the op's
  sequence number in its process group: the NCCL backend passes (count, is_p2p) and
  ParamCommsUtils.hpp:97-126 keeps the count (-1 for a backend that passes none), where
  ProcessGroupNCCL.hpp:1470-1476 has two counts per group: seqCollective_ (kernels launched, so
  ops coalesced into one kernel share one) and seqP2P_ (every send and recv of the group, to any
  peer). kit.trace.group_sync matches a collective across its group's ranks by it where a
  group's are distinct on every rank; not a send or recv, whose count is the rank's over all its
  peers, not its pair's: a pair's sends and recvs are matched by their order between the two.

* Coalesced sends and recvs (dist.batch_isend_irecv, or sends and recvs inside
  _coalescing_manager: torch 2.13's distributed_c10d.py, batch_isend_irecv runs them under
  _coalescing_manager(group, device), which calls group._start_coalescing(device) before and
  group._end_coalescing(device) after them) are one NCCL kernel for all of them. Each send and
  recv still writes its record_param_comms ("send"/"recv", its peer), but no kernel is launched
  inside it: ProcessGroupNCCL's endCoalescing launches the one kernel at ncclGroupEnd under its
  own profiling title "nccl:coalesced" (libtorch_cuda.so of the torch 2.13.0 CUDA wheel holds the
  strings "endCoalescing", "nccl:", "nccl:coalesced" side by side), which carries no
  process-group fields. ProcessGroupNCCL.cpp itself is not in the wheel, so which fields that
  title's op gets is read off the strings, not the source. Such a kernel had no fields: priced
  over all the job's ranks, as its kernel name's all-to-all, and its group unknown to
  kit.trace.group_sync. It now takes them from the sends and recvs its thread recorded since its
  previous collective's launch (coalesced_meta).

Which comm op has which fields (op_comm_metas), and the ranks a collective runs on (trace_group),
are read here for kit.trace.build (which ranks wait for each other) and kit.trace.transfer (which
ranks --on prices it on).
"""
from __future__ import annotations

import bisect
import json
from dataclasses import dataclass

from kit.trace.build import rank_list
from kit.trace.kineto import MAX_WORLD_SIZE, _whole  # int_or_none, None for a fraction

KEYS = ("Collective name", "Process Group Ranks", "Group size", "In msg nelems", "Src Rank",
        "Dst Rank")
# c10::ScalarType names (c10/core/ScalarType.h) -> bytes an element; checked against torch's
# itemsize in tests/test_replay_process_groups.py
DTYPE_BYTES = {"Byte": 1, "Char": 1, "Short": 2, "Int": 4, "Long": 8, "Half": 2, "Float": 4,
               "Double": 8, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16, "Bool": 1,
               "BFloat16": 2, "Float8_e5m2": 1, "Float8_e4m3fn": 1, "Float8_e5m2fnuz": 1,
               "Float8_e4m3fnuz": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8}


@dataclass(frozen=True)
class CommMeta:
    collective: str | None = None  # "Collective name": allreduce, _allgather_base, send, ...
    group_ranks: tuple | None = None  # the group's global ranks, sorted; None when unreadable
    group_size: int | None = None
    in_nelems: int | None = None
    out_nelems: int | None = None
    dtype: str | None = None
    src: int | None = None  # a recv's peer (global rank)
    dst: int | None = None  # a send's peer (global rank)
    problem: str | None = None  # why group_ranks is None though the trace gives some
    group_name: str | None = None  # "Process Group Name": the group's id, one per group on every rank
    seq: int | None = None  # "Seq": the collective's sequence number within its group
    members: tuple = ()  # a coalesced kernel's sends and recvs (CommMeta each): coalesced_meta

    @property
    def is_p2p(self) -> bool:
        return self.collective in ("send", "recv") or bool(self.members)

    @property
    def peer(self) -> int | None:
        """A send's or recv's peer (global rank), else None."""
        return self.dst if self.collective == "send" else self.src if self.collective == "recv" else None

    @property
    def coalesced_kind(self) -> str:
        """The kit.comm kind of a coalesced batch: a send to one peer (and a recv) is a ring
        shift, sendrecv; sends to several peers are an all-to-all."""
        return "alltoall" if len({m.dst for m in self.members if m.collective == "send"}) > 1 else "sendrecv"

    def nbytes(self, kind: str) -> int | None:
        """The nccl-tests size (kit.comm.conventions) from the fields: an all-gather's is what it
        gathers ("Out msg nelems"), the others' their input ("In msg nelems": a reduce-scatter's
        whole input); None without a count or a known dtype."""
        n = self.out_nelems if kind == "allgather" else self.in_nelems
        size = DTYPE_BYTES.get(self.dtype) if isinstance(self.dtype, str) else None
        return n * size if n and n > 0 and size else None


def _ranks(args, size):
    """(sorted global ranks or None, why not)."""
    raw = args.get("Process Group Ranks")
    if raw is None:
        return None, None
    if isinstance(raw, str) and "..." in raw:  # shortened: rebuilt from start and stride
        start, stride = _whole(args.get("Global rank start")), _whole(args.get("Global rank stride"))
        if start is None or start < 0 or stride is None or stride <= 0 or not size:
            return None, (f"its 'Process Group Ranks' {raw[:40]!r} is shortened and no positive "
                          "'Global rank stride' and 'Group size' rebuild it")
        if size > MAX_WORLD_SIZE:  # a Group size of 10**9 had built a tuple of 10**9 ranks (a hang)
            return None, f"its 'Group size' {size} is past any job's ({MAX_WORLD_SIZE} ranks)"
        ranks = tuple(start + i * stride for i in range(size))
        # the ranks it does show (the first ones, then the last) must be the rebuilt ones
        head, _, tail = raw.strip().strip("[]").partition("...")
        shown = [p.strip() for p in head.split(",") if p.strip()]
        last = [p.strip() for p in tail.split(",") if p.strip()]
        if (len(shown) >= size or len(last) > 1 or any(_whole(p) != r for p, r in zip(shown, ranks))
                or any(_whole(p) != ranks[-1] for p in last)):
            return None, (f"its shortened 'Process Group Ranks' {raw[:40]!r} are not "
                          f"'Global rank start' {start} + i x 'Global rank stride' {stride}")
        return ranks, None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raw = None
    if raw == []:  # ParamCommsDebugInfo lists none where it cannot rebuild them from start and stride
        return None, "its 'Process Group Ranks' is empty"
    ranks = [_whole(r) for r in raw] if isinstance(raw, list) else [None]
    if not ranks or any(r is None or r < 0 for r in ranks) or len(set(ranks)) != len(ranks):
        return None, f"its 'Process Group Ranks' {str(args.get('Process Group Ranks'))[:40]!r} is no list of distinct ranks"
    if size is not None and size != len(ranks):
        return None, f"its 'Process Group Ranks' lists {len(ranks)} ranks and its 'Group size' is {size}"
    return tuple(sorted(ranks)), None


def comm_meta(args) -> CommMeta | None:
    """The fields of one event's args, or None where it carries none of them (older traces)."""
    if not isinstance(args, dict) or not any(k in args for k in KEYS):
        return None
    size = _whole(args.get("Group size"))
    size = size if size is not None and size > 0 else None
    ranks, problem = _ranks(args, size)
    name = args.get("Collective name")
    dtype = args.get("dtype")

    def rank(key):
        r = _whole(args.get(key))
        return r if r is not None and r >= 0 else None

    def count(key):
        n = _whole(args.get(key))
        return n if n is not None and n >= 0 else None
    return CommMeta(collective=name if isinstance(name, str) else None, group_ranks=ranks,
                    group_size=size, in_nelems=count("In msg nelems"),
                    out_nelems=count("Out msg nelems"), dtype=dtype if isinstance(dtype, str) else None,
                    src=rank("Src Rank"), dst=rank("Dst Rank"), problem=problem,
                    group_name=pg if isinstance(pg := args.get("Process Group Name"), str) and pg else None,
                    seq=count("Seq"))


def coalesced_meta(members) -> CommMeta | None:
    """One CommMeta for a coalesced kernel's sends and recvs (members, CommMeta each), or None
    where there are none. Its size is what the rank sends (nccl-tests' sendrecv and alltoall
    count the bytes a rank sends), or what it receives where it sends nothing; its group their
    "Process Group Ranks" and "Process Group Name", which one coalescing manager shares (it
    coalesces one group's ops); a problem where they disagree."""
    if not members:
        return None
    sends = [m for m in members if m.collective == "send"] or list(members)
    counts = [m.in_nelems for m in sends]
    dtypes = {m.dtype for m in sends}
    groups = {(m.group_ranks, m.group_name) for m in members}
    first = members[0]
    problem = (None if len(groups) == 1 else "its coalesced sends and recvs name "
               f"{len(groups)} different process groups")
    return CommMeta(collective="coalesced", group_ranks=first.group_ranks if not problem else None,
                    group_size=first.group_size, in_nelems=None if None in counts else sum(counts),
                    dtype=dtypes.pop() if len(dtypes) == 1 else None, problem=problem or first.problem,
                    group_name=first.group_name if not problem else None, members=tuple(members))


def enclosing(items, starts, call):
    """The latest-starting of items (start, end, tid, ...), sorted by start, that holds the call's
    start on its thread, or None."""
    k = bisect.bisect_right(starts, call.ts_us) - 1
    while k >= 0:
        s, e, tid = items[k][:3]
        if tid == call.tid and e >= call.ts_us:
            return items[k]
        k -= 1
        if call.ts_us - s > 1e5:
            break
    return None


def _cpu_metas(trace):
    """Sorted (start, end, tid, CommMeta) of a rank's CPU ops with process-group fields
    (record_param_comms, nccl:*): kit.trace.comm_meta."""
    return [(op.ts_us, op.ts_us + op.dur_us, op.tid, op.comm) for op in trace.cpu_ops
            if op.comm is not None]


def trace_group(meta, rank: int, world: int):
    """(the global ranks a collective runs on, by the trace's process-group fields, or None;
    why the fields do not give them, or None). A send or recv with its peer ("Dst Rank", "Src
    Rank") is one transfer between rank and the peer; another collective runs on its "Process
    Group Ranks"; a send or recv without its peer on its group, as a ring shift there."""
    if meta is None:
        return None, None
    if meta.members:  # a coalesced batch: among the rank and its sends' and recvs' peers
        peers = {m.peer for m in meta.members}
        if None in peers or rank in peers or max(peers) >= world:
            return None, ("its coalesced sends and recvs name no peer, or one that is itself or "
                          f"outside the job's {world} ranks")
        ranks = sorted(peers | {rank})
        if meta.problem or (meta.group_ranks is not None and not set(ranks) <= set(meta.group_ranks)):
            return None, meta.problem or (f"its coalesced peers ({rank_list(ranks)}) are not all in its "
                                          f"'Process Group Ranks' ({rank_list(meta.group_ranks)})")
        return ranks, None
    peer = meta.peer
    if peer is not None:
        if peer == rank or peer >= world:
            return None, (f"its peer rank {peer} is {'itself' if peer == rank else 'outside'} the "
                          f"job's {world} ranks")
        # the peer is a global rank (torch writes groupRanks[peer's group rank]): one of its group's
        if meta.group_ranks is not None and (peer not in meta.group_ranks or rank not in meta.group_ranks):
            return None, (f"its peer rank {peer} and rank {rank} are not both in its 'Process Group "
                          f"Ranks' ({rank_list(meta.group_ranks)})")
        return sorted((rank, peer)), None
    if meta.group_ranks is None:
        return None, meta.problem
    ranks = list(meta.group_ranks)
    if meta.is_p2p and len(ranks) < 2:
        return None, f"its {meta.collective} names no peer and a group of {len(ranks)} rank"
    if ranks[-1] >= world or rank not in ranks:
        return None, (f"its 'Process Group Ranks' ({rank_list(ranks)}) "
                      + (f"reach past the job's {world} ranks" if ranks[-1] >= world
                         else f"leave out rank {rank}, whose collective it is"))
    return ranks, None


def op_comm_metas(tg) -> dict:
    """comm op -> its CommMeta: its NCCL kernel's own fields (newer Kineto), else those of the
    innermost record_param_comms holding its launch on the launch's thread; absent where neither
    has them."""
    g = tg.graph
    out = {}
    for t in tg.traces:
        fields = None
        comm = [(op, ge, call) for op, ge, _, call in tg.gpu_ops.get(t.rank, []) if g.kind[op] == "comm"]
        launches: dict = {}  # thread -> its comm ops' launch times, sorted
        for _, _, call in comm:
            if call is not None:
                launches.setdefault(call.tid, []).append(call.ts_us)
        for ts in launches.values():
            ts.sort()
        for op, ge, call in comm:
            if ge.comm is not None:
                out[op] = ge.comm
                continue
            if fields is None:
                fields = _cpu_metas(t)
                starts = [x[0] for x in fields]
            x = enclosing(fields, starts, call) if call is not None else None
            if x:
                out[op] = x[3]
            elif call is not None:  # a coalesced kernel: the sends and recvs recorded before it
                m = coalesced_meta(_since_last_launch(fields, call, launches[call.tid]))
                if m is not None:
                    out[op] = m
    return out


def _since_last_launch(fields, call, launches):
    """The sends and recvs (CommMeta) on the call's thread that began after the thread's previous
    comm launch and ended by this one: the ops a coalesced kernel's launch runs. A send or recv of
    its own holds its kernel's launch (enclosing), so it is never one of them."""
    k = bisect.bisect_left(launches, call.ts_us)
    after = launches[k - 1] if k else float("-inf")
    return [m for s, e, tid, m in fields if tid == call.tid and after < s and e <= call.ts_us
            and m.collective in ("send", "recv")]


__all__ = ["CommMeta", "DTYPE_BYTES", "coalesced_meta", "comm_meta", "enclosing", "op_comm_metas",
           "trace_group"]
