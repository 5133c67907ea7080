"""Collective names, the nccl-tests size/bandwidth conventions, and the result type.

nccl-tests conventions (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md):
* `size` is the buffer size in bytes: the per-rank buffer for all-reduce, broadcast, reduce,
  all-to-all and send/recv; the *total* (n x per-rank chunk) for all-gather (output) and
  reduce-scatter (input).
* algbw = size / time;  busbw = algbw x factor, with factor
  all-reduce 2(n-1)/n; reduce-scatter, all-gather, all-to-all (n-1)/n; broadcast, reduce, send/recv 1.
  busbw is comparable across n: it is the bandwidth the busiest link actually carries.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from kit.errors import KitError

KINDS = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall", "sendrecv")

# nccl-tests binary names and other spellings -> our kind
_ALIASES = {
    "all_reduce": "allreduce", "all_reduce_perf": "allreduce", "allreduce": "allreduce", "ar": "allreduce",
    "reduce_scatter": "reducescatter", "reduce_scatter_perf": "reducescatter", "reducescatter": "reducescatter",
    "all_gather": "allgather", "all_gather_perf": "allgather", "allgather": "allgather",
    "broadcast": "broadcast", "broadcast_perf": "broadcast", "bcast": "broadcast",
    "reduce": "reduce", "reduce_perf": "reduce",
    "alltoall": "alltoall", "all_to_all": "alltoall", "alltoall_perf": "alltoall", "all2all": "alltoall",
    "alltoallv": "alltoall", "all_to_allv": "alltoall",
    "sendrecv": "sendrecv", "sendrecv_perf": "sendrecv", "send_recv": "sendrecv", "p2p": "sendrecv",
}
NCCL_TESTS_NAME = {"allreduce": "all_reduce_perf", "reducescatter": "reduce_scatter_perf",
                   "allgather": "all_gather_perf", "broadcast": "broadcast_perf", "reduce": "reduce_perf",
                   "alltoall": "alltoall_perf", "sendrecv": "sendrecv_perf"}


def canonical_kind(kind: str) -> str:
    """'all_reduce_perf', 'AllReduce', 'all-reduce' -> 'allreduce'; unknown -> KitError."""
    k = str(kind).strip().lower().replace("-", "_").replace(" ", "_")
    if k in _ALIASES:
        return _ALIASES[k]
    if k.replace("_", "") in _ALIASES:
        return _ALIASES[k.replace("_", "")]
    raise KitError(f"unknown collective {kind!r}; choose one of {', '.join(KINDS)}")


WORD_BYTES = 4  # nccl-tests' default type, float (-d float): its sizes count in these words
SPLIT_KINDS = ("allgather", "reducescatter", "alltoall")  # the size is n equal chunks of a rank's
ALLTOALL_ALIGN_BYTES = 16  # nccl-tests' all-to-all keeps a rank's part 16-byte aligned (below)


def split_unit_bytes(kind: str) -> int:
    """The bytes a rank's part of a split collective comes in, as nccl-tests sizes it: whole
    WORD_BYTES words for all-gather and reduce-scatter (their GetCollByteCount takes count / nranks
    a rank, an integer division), whole 16 bytes for all-to-all (AlltoAllGetCollByteCount in
    src/alltoall.cu takes paramcount = (count / nranks) & -(16 / eltSize): 4 floats)."""
    return ALLTOALL_ALIGN_BYTES if kind == "alltoall" else WORD_BYTES


def nccl_tests_size_bytes(kind: str, size_bytes: int, n: int) -> int:
    """The bytes nccl-tests runs (and prints) for a requested `size_bytes` of `kind` on n ranks.
    nccl-tests' setupArgs (src/common.cu) takes count = size / wordSize (an integer division),
    then the collective's GetCollByteCount: all-reduce, broadcast, reduce and send/recv run all
    of it (AllReduceGetCollByteCount: sendcount = recvcount = paramcount = count), so their size
    is whole WORD_BYTES words, rounded down; all-gather, reduce-scatter and all-to-all run n
    equal parts of whole split_unit_bytes(kind) each, rounded down (the size printed is the n
    parts). 0 when that leaves nothing (under one word, or under one unit a rank). An all-reduce
    of 1,001 B: 250 words, 1,000 B; an all-to-all of 100 B on 8 ranks: 25 words, 3 a rank, 0
    once 16-byte aligned; 1,000 B: 31 -> 28 words a rank, 896 B."""
    if kind not in SPLIT_KINDS or n < 1:
        return size_bytes // WORD_BYTES * WORD_BYTES
    unit = split_unit_bytes(kind) * n
    return size_bytes // unit * unit


def least_size_bytes(kind: str, n: int) -> int:
    """The smallest size nccl_tests_size_bytes leaves whole: one word, or for the split kinds one
    split_unit_bytes(kind) a rank."""
    return split_unit_bytes(kind) * n if kind in SPLIT_KINDS and n >= 1 else WORD_BYTES


def _shown_bytes(size) -> str:
    return f"{int(size):,}" if size == int(size) else f"{size:,}"


def nccl_tests_sizes(kind: str, sizes, n: int) -> tuple[list[int], list[str]]:
    """The sizes nccl-tests runs for the requested `sizes` of `kind` (canonical) on n ranks, by
    nccl_tests_size_bytes, sorted and each once (two that round to one size are one run), and a
    note naming each size rounded down or dropped (under least_size_bytes, nccl-tests would run
    0 B); one KitError when every size is under the least. The one rule `kit comm predict` and
    predict_collective / collective_table(nccl_tests=True) share."""
    ran = {s: nccl_tests_size_bytes(kind, int(s), n) for s in sizes}
    kept = sorted({r for r in ran.values() if r > 0})
    least = least_size_bytes(kind, n)
    if kind in SPLIT_KINDS:
        unit = split_unit_bytes(kind)
        part = "4-byte words" if unit == 4 else f"{unit} bytes (4 words: nccl-tests aligns an all-to-all's parts)"
        whole, short = f"whole {part} a rank", f"less than {unit} B a rank"
    else:
        whole, short = "whole 4-byte words (count = size / 4 B)", "less than one 4-byte word"
    if not kept:
        raise KitError(f"{kind} of {_shown_bytes(list(ran)[-1])} B on {n} ranks is {short}: nccl-tests "
                       f"runs {whole}, rounding down, and would run 0 B; give at least {least:,} B")
    changed = [(s, r) for s, r in ran.items() if r != s]
    if not changed:
        return kept, []
    shown = ", ".join(f"{_shown_bytes(s)} B -> {r:,} B" if r else f"{_shown_bytes(s)} B -> none (under {least:,} B)"
                      for s, r in changed[:4])
    return kept, [f"{kind} on {n} ranks runs {whole}, as nccl-tests rounds it down: "
                  f"{shown}{', ...' if len(changed) > 4 else ''}"]


def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor for n ranks."""
    if kind not in KINDS:
        kind = canonical_kind(kind)
    if n < 1:
        raise KitError(f"a collective needs at least 1 rank, got {n}")
    if kind == "allreduce":
        return 2.0 * (n - 1) / n
    if kind in ("reducescatter", "allgather", "alltoall"):
        return (n - 1) / n
    return 1.0


def reported_busbw_factor(kind: str, n: int) -> float:
    """The factor a prediction's busbw (and its plateau) takes on its algbw: busbw_factor for
    2+ ranks, and 0 for one rank whatever the collective. One rank moves nothing over a link (a
    local copy, or nothing), so the bus carries nothing; nccl-tests' own factor would be 1 for
    broadcast and reduce there, reporting the copy's speed as if it crossed a link."""
    return busbw_factor(kind, n) if n > 1 else 0.0


ONE_RANK_NOTE = ("one rank: a local copy, nothing crosses a link, so busbw and its plateau are 0 "
                 "(for every collective)")


@dataclass(frozen=True)
class CollectiveResult:
    """One predicted collective. time_ms = max(floor_ms, latency_ms + bandwidth_ms), from a
    preset or a calibration alike (kit.comm.curves.BandwidthCurve.parts_us)."""

    kind: str
    nbytes: float  # nccl-tests size (see module doc)
    ranks: int
    time_ms: float
    algorithm: str  # "ring", "nvls", "tree", "hier-ring", "collnet-sharp", "p2p", ...
    algbw_gbs: float
    busbw_gbs: float
    latency_ms: float  # the rest: per-step latencies, launch (a fitted curve with k != 1: size-dependent)
    bandwidth_ms: float  # the size at the plateau busbw
    floor_ms: float  # host-side floor
    bound: str  # "latency" or "bandwidth": which part dominates at this size
    crossover_bytes: float  # size where the bandwidth part equals the latency part
    plateau_busbw_gbs: float  # busbw as size -> infinity
    source: str  # "preset" or "calibration:<file>"
    system: str
    nodes_spanned: int = 1
    notes: tuple[str, ...] = ()  # what a reader should know: one rank, a size outside the calibration

    @property
    def size_bytes(self) -> float:
        """nbytes under the name collective_table's column (and --sizes JSON) gives it."""
        return self.nbytes

    def to_dict(self) -> dict:
        """The fields, plus size_bytes beside nbytes: the message size under the name a
        collective_table row (`kit comm predict --sizes --json`) uses. nbytes stays, with the same
        value, as an alias for readers of the earlier single-size JSON."""
        out = {}
        for key, value in asdict(self).items():
            out[key] = value
            if key == "nbytes":
                out["size_bytes"] = value
        return out
