"""Predict a collective on a System: pick the fastest algorithm, or use a fitted curve.

    predict_collective("allreduce", 1e9, "dgx-h100")            -> CollectiveResult
    predict_collective("allgather", 2**20, sys, ranks=[0, 1, 8, 9])
    collective_table("allreduce", sizes, "dgx-a100", ranks=8)   -> DataFrame (vectorised)
    predict_alltoallv(send_bytes_matrix, "dgx-h100-x2")

A preset's time is max(floor, latency + size x cost-per-byte) of the best algorithm, which is a
BandwidthCurve with k = 1 (kit.comm.curves); a calibration (kit.comm.calibration) replaces it by
the curve fitted to measurements of the same collective on the same number of ranks spanning the
same number of nodes (a curve whose nodes the measurements did not tell answers for any). When no
curve matches, the preset answers; calibration_unused says why.
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from kit.comm.algorithms import Plan, alltoall_latency_us, alltoallv_us, plans
from kit.comm.calibration import Calibration, check_plausible, extrapolation_note, load_calibration
from kit.comm.conventions import (KINDS, ONE_RANK_NOTE, CollectiveResult, busbw_factor, canonical_kind,
                                  nccl_tests_sizes, reported_busbw_factor)
from kit.comm.curves import BandwidthCurve
from kit.comm.topology import Group, resolve_group
from kit.errors import KitError
from kit.hardware.system import System, get_system
from kit.numpy_free import is_int

if TYPE_CHECKING:  # numpy is imported where it is used: a single size (predict_collective) needs none
    import numpy as np


def _floor_us(system: System, group: Group) -> float:
    """Host-side floor: launch plus cross-rank skew. Measured (vTrain, one node) to grow by
    floor_per_rank_us per extra rank in a node; across nodes assumed to grow with log2(nodes).

    Never below the floor of as many ranks packed into as few nodes as they fill: spreading a
    group over more nodes adds hosts to wait for, it cannot take skew away. By the busiest node
    alone, 8 ranks as 4 + 4 on two DGX H100s had a floor of 64 us against 80.5 us in one node,
    so an 8-rank all-reduce over InfiniBand (69.3 us at 1 B) beat the same on NVSwitch (80.5 us),
    and up to 2.7 MB a reduce-scatter did."""
    per = system.soft("floor_per_rank_us")
    n, g = group.size, system.gpus_per_node
    spread = group.max_per_node - 1 + math.ceil(math.log2(group.n_nodes))
    packed = min(n, g) - 1 + math.ceil(math.log2(-(-n // g)))
    return system.soft("floor_us") + per * max(spread, packed)


def plan_curve(system: System, kind: str, group: Group, plan: Plan) -> BandwidthCurve:
    """An algorithm's time as a k = 1 bandwidth curve (floor, plateau, half-size)."""
    n = group.size
    f = busbw_factor(kind, n) if n > 1 else 1.0
    return BandwidthCurve(kind=kind, ranks=n, floor_us=_floor_us(system, group),
                          busbw_max_gbs=f / (plan.us_per_byte * 1e3),
                          half_bytes=max(plan.latency_us / plan.us_per_byte, 1e-9), steepness=1.0)


def _plan_curves(system: System, kind: str, group: Group,
                 senders: int = 1) -> tuple[tuple[Plan, BandwidthCurve], ...]:
    return _plan_curves_of(system, kind, group, system.gpu, senders)


@lru_cache(maxsize=8192)
def _plan_curves_of(system: System, kind: str, group: Group, gpu, senders: int = 1):
    """_plan_curves keyed also on the GPU spec, as algorithms.plans is."""
    return tuple((p, plan_curve(system, kind, group, p)) for p in plans(system, kind, group, senders))


def _group(system: System, ranks) -> Group:
    """resolve_group, with a count below 1 refused as what it is (resolve_group said that 0 GPUs
    "does not fit" the system, as if it were too many)."""
    if is_int(ranks) and not isinstance(ranks, bool) and ranks < 1:
        raise KitError(f"ranks must be at least 1 (a count of GPUs) or a list of ranks, got {ranks}")
    return resolve_group(system, ranks)


def group_size(system, ranks=None) -> int:
    """The number of ranks a collective of `ranks` (None: all, a count, or a list of global
    ranks) on `system` (a System or preset name) spans."""
    return _group(get_system(system), ranks).size


def _inputs(kind, system, ranks, calibration):
    kind = canonical_kind(kind)
    system = get_system(system)
    group = _group(system, ranks)
    if kind == "sendrecv" and group.size == 1:
        raise KitError("sendrecv needs a group of at least 2 ranks")
    cal = _calibration(calibration)
    if cal is not None and cal.system:
        _check_same_system(cal, system)
    if cal is not None:
        check_plausible(cal, system)
    return kind, system, group, cal


def _check_same_system(cal: Calibration, system: System) -> None:
    try:
        fitted = get_system(cal.system)
    except KitError:
        fitted = None
    same = fitted is not None and (fitted.key == system.key or (
        (fitted.gpu_key, fitted.nodes, fitted.gpus_per_node, fitted.fabric, fitted.network)
        == (system.gpu_key, system.nodes, system.gpus_per_node, system.fabric, system.network)))
    if not same:
        raise KitError(f"calibration {cal.source or ''} was fitted on system {cal.system!r}, not {system.key!r}; "
                       f"predict with --system {cal.system} or fit one for {system.key}")


def _calibration(calibration) -> Calibration | None:
    if calibration is None or isinstance(calibration, Calibration):
        return calibration
    path = Path(calibration)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        stamp = 0
    return _load_cached(str(path), stamp)


@lru_cache(maxsize=32)
def _load_cached(path: str, stamp: int) -> Calibration:
    return load_calibration(path)


def calibration_unused(kind: str, system, ranks=None, calibration=None) -> str | None:
    """Why a calibration does not answer for this collective, so the preset does: it has no
    curve of the kind, none for the group's rank count, or none for the nodes the group spans.
    None when it answers or none is given. (A calibration of another system is refused
    outright, by _inputs.) The result's source says "preset" then, and nothing more."""
    if calibration is None:
        return None
    kind, system, group, cal = _inputs(kind, system, ranks, calibration)
    if cal.curve(kind, group.size, group.n_nodes) is not None:
        return None
    same_kind = [c for c in cal.curves if c.kind == kind]
    if not same_kind:
        return (f"it has no {kind} curve (only {', '.join(sorted({c.kind for c in cal.curves}))})"
                if cal.curves else "it has no curves")
    counts = sorted({c.ranks for c in same_kind})
    if group.size not in counts:
        return (f"its {kind} curves were fitted on {', '.join(map(str, counts))} ranks, and this "
                f"group has {group.size}")
    nodes = sorted({c.nodes for c in same_kind if c.ranks == group.size})
    return (f"its {kind} curve for {group.size} ranks was measured on {', '.join(map(str, nodes))} "
            f"node(s), and this group spans {group.n_nodes}")


def _sizes(nbytes) -> np.ndarray:
    import numpy as np

    if isinstance(nbytes, (int, float)) and not isinstance(nbytes, bool) and 1 <= nbytes < float("inf"):
        return np.array([float(nbytes)])
    try:
        s = np.atleast_1d(np.asarray(nbytes, dtype=float))
    except (TypeError, ValueError):
        raise KitError(f"message size must be a number of bytes, got {nbytes!r}") from None
    if s.size == 0 or not np.all(np.isfinite(s)) or np.any(s < 0):
        raise KitError(f"message size must be a non-negative finite number of bytes, got {nbytes!r}")
    if np.any(s < 1):  # as the CLI's --bytes and --sizes: 0 bytes is no collective at all
        raise KitError(f"message size must be at least 1 byte, got {nbytes!r}")
    return s


def _one_size(nbytes) -> float:
    """_sizes of one size, as a float: a plain number without numpy (kit comm predict and the
    parallel model's collectives need none, and a fresh process had spent 0.1 s importing it)."""
    if isinstance(nbytes, (int, float)) and not isinstance(nbytes, bool) and 1 <= nbytes < float("inf"):
        return float(nbytes)
    s = _sizes(nbytes)
    if s.size != 1:
        raise KitError("predict_collective takes one size; use collective_table for many")
    return float(s[0])


def _evaluate(kind, s, system, group, cal):
    """(time_us, algorithm index, pairs, fitted curve or None) for sizes s."""
    import numpy as np

    pcs = _plan_curves(system, kind, group)
    times = np.stack([c.time_us(s) for _, c in pcs])
    lat_plus = np.stack([p.latency_us + p.us_per_byte * s for p, _ in pcs])
    best = np.lexsort((lat_plus, times), axis=0)[0] if len(pcs) > 1 else np.zeros(len(s), int)
    fitted = cal.curve(kind, group.size, group.n_nodes) if cal else None
    t = fitted.time_us(s) if fitted else times[best, np.arange(len(s))]
    return t, best, pcs, fitted


def _notes(s, group: Group, fitted: BandwidthCurve | None) -> tuple[str, ...]:
    """What a reader of a prediction at sizes s should know: a group of one rank (busbw 0), and
    sizes outside those the calibration's curve was fitted to."""
    outside = extrapolation_note(fitted, s) if fitted is not None else None
    return tuple(n for n in (ONE_RANK_NOTE if group.size == 1 else None, outside) if n)


def _nccl_tests_sized(kind, s, group: Group, nccl_tests: bool) -> tuple[np.ndarray, list[str]]:
    """Sizes s as given (a tensor's bytes, which NCCL runs whole in its own datatype), or with
    nccl_tests as nccl-tests runs them, and the note saying which were rounded
    (conventions.nccl_tests_sizes: `kit comm predict`'s rule)."""
    import numpy as np

    if not nccl_tests:
        return s, []
    kept, notes = nccl_tests_sizes(kind, s.tolist(), group.size)
    return np.array(kept, dtype=float), notes


def collective_table(kind: str, nbytes, system, ranks=None, calibration=None, *, nccl_tests: bool = False):
    """Vectorised prediction over sizes: a DataFrame with one row per size; its attrs["notes"]
    are the notes a CollectiveResult would carry (one rank, sizes outside the calibration).
    nccl_tests=True sizes them as `kit comm predict --sizes` does (see predict_collective): the
    rows are then the sizes nccl-tests runs, sorted, each once, without those it runs as 0 B."""
    import numpy as np
    import pandas as pd

    kind, system, group, cal = _inputs(kind, system, ranks, calibration)
    s, rounded = _nccl_tests_sized(kind, _sizes(nbytes), group, nccl_tests)
    t, best, pcs, fitted = _evaluate(kind, s, system, group, cal)
    n = group.size
    algbw = np.where(t > 0, s / np.maximum(t, 1e-30) / 1e3, 0.0)
    names = np.array([p.algorithm for p, _ in pcs])[best]
    busbw = algbw * reported_busbw_factor(kind, n)
    table = pd.DataFrame({"kind": kind, "size_bytes": s, "ranks": n, "time_ms": t / 1e3,
                          "algorithm": names, "algbw_gbs": algbw, "busbw_gbs": busbw,
                          "source": "calibration" if fitted else "preset", "system": system.key,
                          "nodes_spanned": group.n_nodes})  # as predict_collective's result has
    table.attrs["notes"] = [*rounded, *_notes(s, group, fitted)]
    return table


def predict_collective(kind: str, nbytes: float, system, ranks=None, calibration=None,
                       senders=1, *, nccl_tests: bool = False) -> CollectiveResult:
    """Time, algorithm, algbw and busbw (nccl-tests conventions) of one collective.

    kind: one of KINDS; nbytes: nccl-tests size (per-rank buffer; total for all-gather and
    reduce-scatter); system: a System or preset name; ranks: None (all), a count, or a list of
    global ranks; calibration: a Calibration or the path of a `kit comm fit` file; senders:
    the groups of a node that cross nodes at the same time, this one included, sharing its NICs:
    for sendrecv its concurrent sends (a pipeline stage's tp x dp ranks, algorithms.nic_share),
    for the other kinds the concurrent groups placed as this one (a stage's tp DP groups,
    topology.node_net_gbs; its EP groups' all-to-alls, algorithms.uniform_alltoall_us), one
    count for every node or a tuple of one a node of the group, in node order (where the nodes
    are crossed by different numbers of groups); a node's may also be the local GPUs of each
    group crossing from it at once, this one's included (topology.shared_nics), where the
    groups sit unevenly on its NICs.

    nbytes is priced as given by default: a tensor's bytes, which NCCL runs whole in the
    tensor's datatype (a bf16 bucket of 1,001 elements is 2,002 B; kit.parallel prices such).
    nccl_tests=True takes nbytes as an nccl-tests size and runs it as nccl-tests (-d float) does,
    as `kit comm predict --bytes` does: rounded down to whole 4-byte words (an all-gather's or
    reduce-scatter's to whole words a rank, an all-to-all's to whole 16 bytes a rank), with a
    note when it moved, and one KitError under one word (or one part a rank).
    """
    kind, system, group, cal = _inputs(kind, system, ranks, calibration)
    per_node = isinstance(senders, tuple)  # one for each node of the group (node_net_gbs)
    counts = senders if per_node else (senders,)
    if not counts or any(not _sharing_ok(c, system.gpus_per_node, per_node) for c in counts):
        raise KitError(f"senders must be a whole number of concurrent sends, at least 1, or for each node "
                       f"the local GPUs of each concurrent group, got {senders!r}")
    if per_node and (kind == "sendrecv" or len(counts) != group.n_nodes):
        raise KitError(f"senders as a tuple gives each of the group's {group.n_nodes} node(s) its count of "
                       f"concurrent groups (not for sendrecv), got {senders!r} for {kind}")
    senders = tuple(_sharing_key(c) for c in counts) if per_node else int(senders)
    shared = max(c if isinstance(c, int) else len(c) for c in (senders if per_node else (senders,))) > 1
    size, rounded = _one_size(nbytes), []
    if nccl_tests:  # _nccl_tests_sized's rule, on one size
        kept, rounded = nccl_tests_sizes(kind, [size], group.size)
        size = float(kept[0])
    pcs = _plan_curves(system, kind, group, senders)
    plan, curve = min(pcs, key=lambda pc: (pc[1].time_us(size), pc[0].latency_us + pc[0].us_per_byte * size))
    fitted = cal.curve(kind, group.size, group.n_nodes) if cal else None
    t = float(fitted.time_us(size)) if fitted else curve.time_us(size)
    scale = 1.0  # how much slower a fitted lone group's bytes go when it shares the NICs
    if fitted and shared:
        scale = _shared_scale(system, kind, group, plan)
        lat_us, bw_us = fitted.parts_us(size)
        t = max(fitted.regime(size).floor_us, lat_us + scale * bw_us)
    return _result(kind, size, t, plan, fitted or curve, system, group,
                   f"calibration:{cal.source}" if fitted else "preset", (*rounded, *_notes([size], group, fitted)), scale)


def _sharing_ok(c, gpus_per_node: int, per_node: bool) -> bool:
    """A node's sharing: a whole count >= 1, or (node by node only) a non-empty tuple of the
    concurrent groups' local GPUs, each a non-empty tuple of whole numbers in 0..gpus_per_node-1."""
    if is_int(c) and not isinstance(c, bool):
        return c >= 1
    if not (per_node and isinstance(c, tuple) and c):
        return False
    return all(isinstance(g, tuple) and g and all(
        is_int(i) and not isinstance(i, bool) and 0 <= i < gpus_per_node for i in g)
        for g in c)


def _sharing_key(c):
    """A node's sharing as plans caches it: an int, or the groups' local GPUs, sorted."""
    if isinstance(c, tuple):
        return tuple(sorted({tuple(sorted(int(i) for i in g)) for g in c}))
    return int(c)


def _shared_scale(system: System, kind: str, group: Group, plan: Plan) -> float:
    """How many times its cost per byte a group's algorithm pays when it shares the NICs
    (plan: priced with the sharing) over alone: the factor a fitted curve's bandwidth part takes.
    A calibration measures the group alone (nccl-tests), so its per-byte cost holds the NIC rate
    it achieved; split among s groups each gets 1/s of that rate, not of the preset's. Adding the
    preset's extra wire time instead (as the kit did) priced four sends of a pcie8 node fitted at
    6 GB/s at 0.449 ns/B for 0.662 (32% under), fitted at 12 GB/s at 0.366 for 0.331. The plan's
    local HBM term scales with it: about 1% of a cross-node byte's cost (pcie8: 0.9%)."""
    alone = next(p for p, _ in _plan_curves(system, kind, group) if p.algorithm == plan.algorithm)
    return max(1.0, plan.us_per_byte / alone.us_per_byte)


def _result(kind, size, t_us, plan, curve, system, group, source, notes=(),
            bw_scale: float = 1.0) -> CollectiveResult:
    """The result of one size on `curve` (a preset's algorithm or the fitted curve): its parts
    from the regime that answers (a fitted curve may switch algorithm with the size), adding up
    to the time above the floor as BandwidthCurve.parts_us defines them. bw_scale: the factor
    t_us holds on the curve's per-byte cost (a fitted lone group's NIC share, _shared_scale), in
    the bandwidth part, the plateau and the crossover too (they had kept the lone group's)."""
    n = group.size
    bus = reported_busbw_factor(kind, n)  # 0 on one rank, for the plateau as for busbw
    algbw = size / t_us / 1e3 if t_us > 0 else 0.0
    piece = curve.regime(size)
    lat_us, bw_us = curve.parts_us(size)
    bw_us *= bw_scale
    crossover, plateau = curve.crossover_bytes(), curve.plateau_gbs()
    if bw_scale > 1.0:  # the per-byte cost f / B of each regime grows by the factor
        crossover /= bw_scale
        plateau /= bw_scale
    return CollectiveResult(
        kind=kind, nbytes=size, ranks=n, time_ms=t_us / 1e3, algorithm=plan.algorithm,
        algbw_gbs=algbw, busbw_gbs=algbw * bus, latency_ms=lat_us / 1e3, bandwidth_ms=bw_us / 1e3,
        floor_ms=piece.floor_us / 1e3, bound="bandwidth" if bw_us > max(lat_us, piece.floor_us) else "latency",
        crossover_bytes=crossover, plateau_busbw_gbs=plateau * bus / curve.factor,
        source=source, system=system.key, nodes_spanned=group.n_nodes, notes=tuple(notes))


def predict_alltoallv(send_bytes, system, ranks=None) -> CollectiveResult:
    """Uneven all-to-all: send_bytes[i][j] bytes from group rank i to group rank j (ranks[i] and
    ranks[j] where ranks is a list, in the order given).

    The time is set by the busiest rank (the max over ranks of bytes sent or received, on each
    link it uses) plus the all-to-all latency: time = max(floor, latency + bandwidth). The
    diagonal (a rank's bytes to itself) is a local copy and takes no bandwidth time, so a
    local-only matrix is latency-bound. nbytes is the nccl-tests size, the largest per-rank send
    including the self part; algbw = nbytes / time. The cost per byte behind the crossover and the
    plateau is per byte of nbytes (bandwidth / nbytes: scaling the matrix scales both); without
    traffic between ranks the crossover and the plateau are infinite.
    """
    import numpy as np

    system = get_system(system)
    try:
        raw = np.asarray(send_bytes)
    except (ValueError, TypeError):  # ragged rows
        raw = None
    if raw is None or raw.dtype.kind not in "iuf":  # bools, strings, None, objects
        raise KitError("send_bytes must be a square ranks x ranks matrix of byte counts (numbers, "
                       f"every row as long as the others), got {send_bytes!r:.80}")
    m = raw.astype(float)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise KitError(f"send_bytes must be a square ranks x ranks matrix, got shape {m.shape}")
    if not np.all(np.isfinite(m)) or np.any(m < 0):
        raise KitError("send_bytes must hold non-negative finite byte counts")
    group = _group(system, m.shape[0] if ranks is None else ranks)
    if group.size != m.shape[0]:
        raise KitError(f"send_bytes is {m.shape[0]}x{m.shape[0]} but the group has {group.size} ranks")
    if not isinstance(ranks, (int, np.integer)) and ranks is not None:
        # row i is ranks[i]'s as given; the group holds its ranks sorted, and a GPU's place on
        # its node's NICs (pcie8: NIC 0 = GPUs 0-3) had been read off the sorted order
        order = np.argsort(np.asarray(ranks, dtype=np.int64), kind="stable")
        m = m[np.ix_(order, order)]
    n = group.size
    lat_us = alltoall_latency_us(system, group)
    floor_us = _floor_us(system, group)
    kap = system.soft("hbm_bytes_per_byte") / 2 / (system.gpu.mem_bw_gbs * 1e3)
    off = m - np.diag(np.diag(m))
    busiest = float(max(off.sum(1).max(), off.sum(0).max()))
    bw_us = alltoallv_us(system, group, m) + kap * busiest if busiest > 0 else 0.0
    t_us = max(lat_us + bw_us, floor_us)
    size = float(m.sum(1).max())
    per_byte = bw_us / size if size > 0 else 0.0
    f = busbw_factor("alltoall", n)
    algbw = size / t_us / 1e3 if t_us > 0 else 0.0
    return CollectiveResult(
        kind="alltoall", nbytes=size, ranks=n, time_ms=t_us / 1e3, algorithm="p2p", algbw_gbs=algbw,
        busbw_gbs=algbw * f, latency_ms=lat_us / 1e3, bandwidth_ms=bw_us / 1e3, floor_ms=floor_us / 1e3,
        bound="bandwidth" if bw_us > max(lat_us, floor_us) else "latency",
        crossover_bytes=max(lat_us, floor_us) / per_byte if per_byte > 0 else math.inf,
        plateau_busbw_gbs=f / (per_byte * 1e3) if per_byte > 0 else (math.inf if f > 0 else 0.0),
        source="preset", system=system.key, nodes_spanned=group.n_nodes, notes=_notes([size], group, None))


__all__ = ["KINDS", "calibration_unused", "collective_table", "plan_curve", "predict_alltoallv",
           "predict_collective"]
