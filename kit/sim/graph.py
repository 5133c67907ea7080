"""Per-rank execution graphs: what each rank's CPU thread issues and what its GPU streams run.

One ExecGraph holds every rank that is simulated. A rank has resources: CPU threads ("cpu") and
GPU streams ("compute", "comm", or any name). Each resource runs its ops in the order they are
added (FIFO, like a CUDA stream or a host thread). An op starts when

* the op before it on the same resource has ended,
* every op in its `deps` has ended (a GPU op's launch on the CPU; an event wait on another
  stream; a host sync on GPU work),
* and, for a collective, when every member of its group has reached that point: all members
  start together (inter-rank sync) and each then occupies its stream for its own duration.

Symmetric ranks (the TP or DP peers that run identical work) are simulated once: a rank added
with `members=(0, 1, 2, 3)` stands for all four. A collective's group is the set of
*simulated* ranks holding an op with the same group key.

The graph is stored as flat columns (lists), not objects, so 100k+ ops per rank stay cheap.
"""
from __future__ import annotations

import math
import numbers

from kit.errors import KitError

GPU_KINDS = ("compute", "comm", "memcpy")
CPU_KINDS = ("cpu", "launch", "sync", "idle")
KINDS = GPU_KINDS + CPU_KINDS


class ExecGraph:
    """Flat columns of ops over all simulated ranks; build with cpu(), gpu(), collective(), sync()."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.rank: list[int] = []
        self.resource: list[str] = []
        self.kind: list[str] = []
        self.label: list[str] = []
        self.dur_ms: list[float] = []
        self.prev: list[int] = []  # previous op on the same resource, -1 for the first
        self.deps: list[tuple[int, ...]] = []
        self.group: list[object] = []  # collective key or None
        self.tag: list[object] = []  # free-form per-op annotation (layer, micro-batch, trace id)
        self.members: dict[int, tuple[int, ...]] = {}  # simulated rank -> ranks it stands for
        self.order: dict[int, list[int]] = {}  # simulated rank -> its op ids in add order
        self._tail: dict[tuple[int, str], int] = {}
        self.meta: dict = {}
        self.group_ranks: dict = {}  # collective key -> the simulated ranks declared to take part

    def __len__(self) -> int:
        return len(self.dur_ms)

    # -- ranks ---------------------------------------------------------------------------
    def add_rank(self, rank: int, members=None) -> int:
        """Declare a simulated rank and the physical ranks it stands for (default: itself)."""
        rank = int(rank)
        members = tuple(int(m) for m in members) if members is not None else (rank,)
        if rank not in members:
            members = (rank,) + members
        self.members[rank] = members
        self.order.setdefault(rank, [])
        return rank

    @property
    def ranks(self) -> list[int]:
        return sorted(self.members)

    @property
    def world_size(self) -> int:
        return sum(len(m) for m in self.members.values())

    # -- ops -----------------------------------------------------------------------------
    def _checked(self, rank, label, dur_ms, deps, first: int) -> tuple[float, tuple[int, ...]]:
        """(dur_ms, deps) of an op about to take id `first` (or later), or a KitError: checked
        before anything is added, so a refused op leaves no trace (gpu() had added its launch,
        and _add a rank, before refusing a dependency: the graph kept an orphan launch)."""
        dur = dur_ms
        if type(dur) is not float:
            try:
                dur = float(dur_ms)
            except (TypeError, ValueError):
                dur = math.nan
        if not 0 <= dur < math.inf:  # also catches NaN
            raise KitError(f"op {label!r} on rank {rank}: duration must be a finite number >= 0 ms, "
                           f"got {dur_ms!r}")
        if type(deps) is not tuple:
            try:
                deps = tuple(deps)
            except TypeError:
                raise KitError(f"op {label!r} on rank {rank}: deps must be a sequence of op ids, "
                               f"got {deps!r}") from None
        cast = False  # a numpy integer among them: stored as int
        for d in deps:
            if type(d) is not int:  # an op id: a float 1.0 had passed, then failed as a list index
                # each one checked: once a numpy id had been seen, the rest were int()ed unchecked
                # ((np.int64(0), 1.5) stood for ops 0 and 1)
                if isinstance(d, bool) or not isinstance(d, numbers.Integral):
                    raise KitError(f"op {label!r} on rank {rank}: dependency {d!r} is not an op id")
                cast = True
            if not 0 <= d < first:
                raise KitError(f"op {label!r} on rank {rank}: dependency {d} is not an earlier op")
        return dur, (tuple(int(x) for x in deps) if cast else deps)

    def _add(self, rank, resource, kind, label, dur_ms, deps=(), group=None, tag=None,
             checked: bool = False) -> int:
        i = len(self.dur_ms)
        if not checked:
            dur_ms, deps = self._checked(rank, label, dur_ms, deps, i)
        if rank not in self.members:
            self.add_rank(rank)
        key = (rank, resource)
        self.rank.append(rank)
        self.resource.append(resource)
        self.kind.append(kind)
        self.label.append(label)
        self.dur_ms.append(dur_ms)
        self.prev.append(self._tail.get(key, -1))
        self.deps.append(deps)
        self.group.append(group)
        self.tag.append(tag)
        self._tail[key] = i
        self.order[rank].append(i)
        return i

    def cpu(self, rank: int, dur_ms: float, label: str = "cpu", thread: str = "cpu", deps=(),
            kind: str = "cpu", tag=None) -> int:
        """CPU work on a host thread. With deps on GPU ops it is a host sync that then costs dur_ms."""
        if kind not in CPU_KINDS:
            raise KitError(f"CPU op kind {kind!r}: choose one of {', '.join(CPU_KINDS)}")
        return self._add(rank, thread, kind, label, dur_ms, deps, None, tag)

    def gpu(self, rank: int, stream: str, dur_ms: float, label: str, kind: str = "compute",
            launch_ms: float | None = None, deps=(), thread: str = "cpu", group=None,
            tag=None) -> int:
        """A GPU op on `stream`. With launch_ms (not None) the CPU thread first spends launch_ms
        issuing it and the op cannot start before that. deps: other GPU ops it waits for (events)."""
        if kind not in GPU_KINDS:
            raise KitError(f"GPU op kind {kind!r}: choose one of {', '.join(GPU_KINDS)}")
        if launch_ms is not None:
            launch_ms, _ = self._checked(rank, label, launch_ms, (), len(self))
            dur_ms, deps = self._checked(rank, label, dur_ms, deps, len(self))  # before the launch
            launch = self._add(rank, thread, "launch", label, launch_ms, (), None, tag, checked=True)
            return self._add(rank, stream, kind, label, dur_ms, (launch,) + deps, group, tag,
                             checked=True)
        return self._add(rank, stream, kind, label, dur_ms, deps, group, tag)

    def collective(self, rank: int, stream: str, dur_ms: float, label: str, group, ranks=None,
                   **kw) -> int:
        """A collective: starts when every simulated rank holding `group` is ready.

        ranks: the simulated ranks that take part (None: whichever hold `group`). Given, a rank
        of them that never issues the collective is an error of simulate(): without it the
        group is just the ranks that issued it, and a rank left out by mistake was not waited
        for (the others ran it among themselves)."""
        if group is None:
            raise KitError(f"collective {label!r}: needs a group key")
        if ranks is not None:
            want = tuple(sorted({int(x) for x in ranks}))
            if rank not in want:
                raise KitError(f"collective {label!r} (group {group!r}) on rank {rank}: the rank "
                               f"is not among its ranks {list(want)}")
            had = self.group_ranks.get(group, want)
            if had != want:
                raise KitError(f"collective {label!r} (group {group!r}): ranks {list(want)} on rank "
                               f"{rank}, but {list(had)} where another rank issued it")
        i = self.gpu(rank, stream, dur_ms, label, kind="comm", group=group, **kw)
        if ranks is not None:  # once gpu() took the op: a refused one had left its ranks declared
            # (simulate() then a KeyError, and the same collective retried "issued" elsewhere)
            self.group_ranks.setdefault(group, want)
        return i

    def sync(self, rank: int, on, dur_ms: float = 0.0, label: str = "sync", thread: str = "cpu",
             tag=None) -> int:
        """Host sync: the CPU thread blocks until the ops in `on` end, then spends dur_ms."""
        try:  # None and negative ids (tail() of an empty resource) drop out; _checked refuses
            # the rest that are not op ids: int() had read 1.5 and True as op 1
            on = tuple(o for o in on if o is not None and not (
                isinstance(o, numbers.Integral) and not isinstance(o, bool) and o < 0))
        except TypeError:
            raise KitError(f"sync {label!r} on rank {rank}: `on` must be a sequence of op ids, "
                           f"got {on!r}") from None
        return self._add(rank, thread, "sync", label, dur_ms, on, None, tag)

    def tail(self, rank: int, resource: str) -> int:
        """The last op on a resource (-1 when none)."""
        return self._tail.get((rank, resource), -1)

    def device_sync(self, rank: int, dur_ms: float = 0.0, label: str = "cudaDeviceSynchronize",
                    thread: str = "cpu") -> int:
        """Host sync on every stream of the rank (cudaDeviceSynchronize)."""
        tails = [i for (r, res), i in self._tail.items() if r == rank and self.kind[i] in GPU_KINDS]
        return self.sync(rank, tails, dur_ms, label, thread)

    def set_duration(self, op: int, dur_ms: float) -> None:
        # an op id of this graph: -1 had set the last op's, 99 of 4 an IndexError
        if isinstance(op, bool) or not isinstance(op, numbers.Integral) or not 0 <= op < len(self):
            raise KitError(f"set_duration: {op!r} is not an op of this graph ({len(self)} ops)")
        self.dur_ms[op], _ = self._checked(self.rank[op], self.label[op], dur_ms, (), 0)

    def copy(self) -> "ExecGraph":
        g = ExecGraph(self.name)
        for attr in ("rank", "resource", "kind", "label", "dur_ms", "prev", "deps", "group", "tag"):
            setattr(g, attr, list(getattr(self, attr)))
        g.members = dict(self.members)
        g.order = {r: list(v) for r, v in self.order.items()}
        g._tail = dict(self._tail)
        g.meta = dict(self.meta)
        g.group_ranks = dict(self.group_ranks)
        return g
