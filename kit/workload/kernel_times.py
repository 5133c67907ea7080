"""Each node's kernel time on a GPU, as a model runs it: every way to run a node (its leaves and
options: kit.workload.kernels), the fastest in the stream (each way the slowest of its
options: a Slowest's, or a strided dgrad's one launch and its slowest phase), the
in-stream rule that sheds the dispatch floor a kernel timed on its own carries, and the floor
PyTorch's generic elementwise loop keeps. kit.workload.iteration lays them on a timeline."""
from __future__ import annotations

import sys
import weakref
from contextlib import contextmanager

import numpy as np

from kit.ops import Elementwise
from kit.predict.sibling_bound import bounding_gpus
from kit.workload.kernels import Cheapest, Derived, leaf_options, option_ways


def _leaves(nodes):
    """Every leaf op of every way to run each node (kit.workload.kernels.leaf_options): the
    leaves, and per leaf its node, scale and option."""
    leaves, owner, scale, option = [], [], [], []
    for i, n in enumerate(nodes):
        for k, ways in enumerate(leaf_options(n.op)):
            for op, sc in ways:
                leaves.append(op)
                owner.append(i)
                scale.append(sc)
                option.append(k)
    return (leaves, np.asarray(owner, dtype=int), np.asarray(scale, dtype=float),
            np.asarray(option, dtype=int))


def _per_option(vals, owner, option, n_nodes: int, scale=None):
    """Per node and option, the sums of its leaves' (latency, p10, p90, roofline) (n, k, 4),
    which options a node has (n, k), and the sums of its leaves' scales (n, k)."""
    per = np.zeros((n_nodes, int(option.max()) + 1 if len(option) else 1, vals.shape[1]))
    np.add.at(per, (owner, option), vals)
    seen = np.zeros(per.shape[:2], dtype=bool)
    seen[owner, option] = True
    sums = np.zeros(per.shape[:2])
    np.add.at(sums, (owner, option), np.ones(len(owner)) if scale is None else scale)
    return per, seen, sums


def _pick(per, seen, shared=()) -> np.ndarray:
    """Per node, its option's index: the fastest (by latency), or where options share a way of
    running the node (shared: [(node, kit.workload.kernels.option_ways)], _shared_ways) the
    slowest option of the fastest way (a kernels.Slowest node: its one way's slowest)."""
    lat = np.where(seen, per[:, :, 0], np.inf)
    best = lat.argmin(axis=1)
    for i, ways in shared:
        ways = np.asarray(ways)
        t = np.where(seen[i, :len(ways)], lat[i, :len(ways)], -np.inf)
        way_ms = {w: t[ways == w].max() for w in dict.fromkeys(ways.tolist())}
        way_ms = {w: (ms if ms > -np.inf else np.inf) for w, ms in way_ms.items()}  # a way of no leaves
        way = min(way_ms, key=way_ms.get)
        best[i] = np.flatnonzero(ways == way)[np.argmax(t[ways == way])]
    return best


def _shared_ways(ops) -> list:
    """[(node, its options' ways)] for the nodes some of whose options share a way (a Slowest,
    or a Slowest among a Derived's parts): the rest take their fastest option."""
    out = []
    for i, op in enumerate(ops):
        if isinstance(op, (Cheapest, Derived)):
            ways = option_ways(op)
            if len(set(ways)) < len(ways):
                out.append((i, ways))
    return out


def _fastest_option(vals, owner, option, n_nodes: int, scale=None, shared=()):
    """Per node, the (latency, p10, p90, roofline) sums of the option _pick takes (shared: as
    _pick's). With `scale` (each leaf's), also the sum of its leaves' scales in that option."""
    per, seen, sums = _per_option(vals, owner, option, n_nodes, scale)
    best = _pick(per, seen, shared)
    out = per[np.arange(n_nodes), best]
    if scale is None:
        return out
    return out, sums[np.arange(n_nodes), best]


def isolated_latencies(ops, gpu, predictor="auto") -> np.ndarray:
    """(n, 3) latency, p10, p90 of each op (kit op, Derived or Cheapest) timed on its own, as a
    microbenchmark measures it: a Cheapest at its fastest option, no in-stream correction."""
    from types import SimpleNamespace

    from kit.predict import get_predictor

    model = get_predictor(predictor) if isinstance(predictor, str) else predictor
    leaves, owner, scale, option = _leaves([SimpleNamespace(op=op) for op in ops])
    cols = ["latency_ms", "latency_p10_ms", "latency_p90_ms", "roofline_ms"]
    vals = model.predict(leaves, gpu)[cols].to_numpy(dtype=float)
    return _fastest_option(vals * scale[:, None], owner, option, len(ops), shared=_shared_ways(ops))[:, :3]


def predict_latencies(nodes, gpu, predictor: str = "auto", leaves=None, with_option: bool = False):
    """Per-node (latency, p10, p90) arrays, the predictor's name, and {op type: reason} for ops
    the chosen predictor could not cost (those fall back to the wave model, never dropped);
    with_option, also each node's option taken (the index into kit.workload.kernels.leaf_options)."""
    from kit.predict import get_predictor

    model = get_predictor(predictor)
    with one_thread():
        out = _predict_leaves(model, nodes, gpu, leaves or _leaves(nodes))
    return out if with_option else out[:5]


@contextmanager
def one_thread():
    """Run a learned predictor's tiny networks (tens of rows) on one thread, torch's and numpy's
    OpenBLAS (the shipped networks run in numpy: kit.predict.array_mlp): on a small, shared CPU a
    thread pool only adds spin-wait (5x slower warm calls measured on 2 busy cores with torch's;
    with OpenBLAS's two threads a warm new GPU took 0.09-0.11 s against 0.036 s on one, while
    another job ran). The caller's settings come back afterwards; without torch, or where numpy's
    OpenBLAS is not found (another BLAS), that part does nothing."""
    torch = sys.modules.get("torch")
    blas = openblas_threads()
    before = torch.get_num_threads() if torch is not None else None
    blas_before = blas[0]() if blas else None
    if torch is not None:
        torch.set_num_threads(1)
    if blas:
        blas[1](1)
    try:
        yield
    finally:
        if torch is not None:
            torch.set_num_threads(before)
        if blas:
            blas[1](blas_before)


_OPENBLAS: list = []  # [(get, set)] or [None], found once


def openblas_threads():
    """(get, set) of the thread count of the OpenBLAS numpy was built with (the wheels' scipy_openblas,
    64- or 32-bit interface, or a system libopenblas), or None where none is found."""
    if not _OPENBLAS:
        _OPENBLAS.append(_find_openblas())
    return _OPENBLAS[0]


def _find_openblas():
    import ctypes
    import glob
    import os

    import numpy

    here = os.path.dirname(numpy.__file__)
    paths = (glob.glob(os.path.join(here, os.pardir, "numpy.libs", "*openblas*"))
             + glob.glob(os.path.join(here, ".dylibs", "*openblas*")))
    names = [(f"{p}openblas_get_num_threads{s}", f"{p}openblas_set_num_threads{s}")
             for p in ("scipy_", "") for s in ("64_", "")]
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get, put in names:
            if hasattr(lib, get) and hasattr(lib, put):
                getter, setter = getattr(lib, get), getattr(lib, put)
                getter.restype, setter.argtypes = ctypes.c_int, [ctypes.c_int]
                return getter, setter
    return None


def _predict_leaves(model, nodes, gpu, prepared):
    from kit.predict import get_predictor

    leaves, owner, scale, option = prepared
    cols = ["latency_ms", "latency_p10_ms", "latency_p90_ms"]
    fallbacks: dict = {}
    if not leaves:
        z = np.zeros(len(nodes))
        return z, z, z, model.name, fallbacks, np.zeros(len(nodes), dtype=int)
    cols = cols + ["roofline_ms"]
    from kit.predict import DtypeNotLearned

    try:
        vals = model.predict(leaves, gpu)[cols].to_numpy(dtype=float)
    except DtypeNotLearned:  # bad input (an FP32-only baseline asked for bf16): said, not routed
        raise
    except Exception:  # the predictor cannot cost some op type: cost type by type
        vals = np.zeros((len(leaves), 4))
        fallback = get_predictor("wave")
        by_type: dict = {}
        for j, op in enumerate(leaves):
            by_type.setdefault(type(op).__name__, []).append(j)
        for tname, idx in by_type.items():
            ops = [leaves[j] for j in idx]
            try:
                vals[idx] = model.predict(ops, gpu)[cols].to_numpy(dtype=float)
            except DtypeNotLearned:
                raise
            except Exception as e:  # noqa: BLE001 - reported, never silent
                fallbacks[tname] = f"{model.name} failed ({type(e).__name__}: {e}); used wave"
                vals[idx] = fallback.predict(ops, gpu)[cols].to_numpy(dtype=float)
    per, seen, carried = _per_option(vals * scale[:, None], owner, option, len(nodes), scale)
    floor = isolation_floor_ms(model, gpu)
    if floor > 0:  # in the stream, not one kernel at a time (see LEARNED_FROM_ISOLATED)
        # each leaf's isolated time carries one floor, scaled with it: an option carries the
        # sum of its leaves' scales, and in_stream_ms sheds those, whatever the node's kernels
        # (they set only its least time). The fastest option is chosen in the stream: chosen
        # on isolated times, a 3x3 conv's Winograd (four kernels, four floors) had lost to the
        # implicit GEMM (one) at batch 8 on an A100, 91 us against 29 us in the stream, and won
        # at batch 16 (42 us)
        kernels = np.array([max(n.kernels, 1) for n in nodes], dtype=float)[:, None]
        for c in range(3):
            per[:, :, c] = in_stream_ms(per[:, :, c], per[:, :, 3], floor, kernels, carried)
    if getattr(model, "name", None) != "roofline":  # the roofline stays a bound on the bytes
        # each way to run a node keeps its own generic-loop floor before the choice, so the way
        # taken is the one whose time is reported (the nominal way's floor, applied after the
        # choice, had given a Cheapest whose second way won the first way's time)
        per[:, :, :3] = np.maximum(per[:, :, :3], generic_loop_per_option(prepared, gpu, per.shape[:2])[:, :, None])
    best = _pick(per, seen, _shared_ways([n.op for n in nodes]))
    out = per[np.arange(len(nodes)), best]
    return out[:, 0], out[:, 1], out[:, 2], model.name, fallbacks, best


# PyTorch's generic elementwise kernel (elementwise_kernel<128, 4>: a broadcast or strided input,
# Elementwise.vectorized False) computes every element's offsets, dimension by dimension, and
# is limited by that work rather than by the bytes it moves: on an H200
# (measurements/h200-2026-12-04, kernels of whole-model steps) a div by a 0-dim device tensor,
# a where over a broadcast mask, a broadcast mask add and a clamp ran at 285-414 G elements/s
# in bf16 and 298-349 in fp32, whatever the dtype, where the vectorized kernels stream at the
# memory's speed (a bf16 mul: 1,040 G elements/s). 350 G elements/s over 132 SMs at 1,980 MHz
# is 1.34 elements per SM per clock; other NVIDIA GPUs get it at their SMs and clock (an
# A100: 204 G elements/s). Measured on that one GPU; not applied to AMD's.
GENERIC_LOOP_ELEMS_PER_SM_CLOCK = 1.34


def generic_loop_rate(gpu) -> float:
    """Elements a second PyTorch's generic elementwise loop runs at on gpu (0: not known)."""
    from kit.predict.element_rates import elements_per_s

    return float(elements_per_s(gpu, GENERIC_LOOP_ELEMS_PER_SM_CLOCK))


def generic_loop_ms(nodes, gpu, prepared=None) -> np.ndarray:
    """Per node, the time its generic-loop elementwise kernels take at the rate above (0 for
    nodes without any, and on GPUs it is not known for). prepared: the nodes' _leaves, when
    the caller has them; a Cheapest counts its nominal (first) option, as leaf_ops does."""
    prepared = prepared if prepared is not None else _leaves(nodes)
    options = int(prepared[3].max()) + 1 if len(prepared[3]) else 1
    return generic_loop_per_option(prepared, gpu, (len(nodes), options))[:, 0]


def generic_loop_per_option(prepared, gpu, shape) -> np.ndarray:
    """generic_loop_ms per node and way to run it (shape: (nodes, options)), each way's own
    generic-loop leaves."""
    out = np.zeros(shape)
    rate = generic_loop_rate(gpu)
    if not rate:
        return out
    leaves, owner, _, option = prepared
    for op, i, k in zip(leaves, owner, option):
        if isinstance(op, Elementwise) and not op.vectorized:
            out[i, k] += op.numel / rate * 1e3
    return out


# Predictors learned from kernels timed one at a time (NeuSight's microbenchmarks: CUDA events
# around one Python call, mean of the 5 fastest of 25). A short kernel's label there is the
# dispatch floor, not the kernel: the smallest V100 add in that data is 0.032 ms, the smallest
# sgemm 0.063 ms, for kernels that move a few kB. In a model the kernels queue back to back and
# the host's cost is the CPU-issue timeline below, so a kernel's time in the stream is its
# isolated prediction less that floor, never below its roofline plus each kernel's start:
#
#     d_stream = max(d_isolated - carried · floor_gpu, min(roofline + kernels · start, d_isolated))
#
# carried: the floors d_isolated holds, one a prediction it sums, scaled as it is (in_stream_ms).
# floor_gpu is read off the predictor itself: its latency for a small in-range elementwise add
# (128 Ki fp32 elements, ~1.5 MB) less that add's roofline, on the GPU at hand (so it carries
# over to GPUs without labels).
LEARNED_FROM_ISOLATED = ("tile", "mlp", "habitat", "li")
# The shortest kernels of real Kineto traces run 2-3 us on the GPU, back to back in the stream:
# fill/elementwise kernels on a few hundred elements take 2-3 us (PARAM's 8-rank DLRM trace,
# V100-SXM2: median 2-3 us per elementwise kind; HTA's A100 fixtures; PARAM's RTX 2080 Ti resnet
# trace: cuDNN's offset kernels 2 us). Launching and draining a grid has that cost however
# little the kernel does, and a kernel that moves bytes pays it on top of them (start = this):
# where the floor swallows a kernel's isolated time, its bytes alone at the peak bandwidth had
# put it at its bare roofline, and the H200's vectorised elementwise kernels of 3-20 us
# (measurements/h200-2026-12-04 and -b, kernel time) ran 1.8x that (bf16; fp32 1.5x): the start
# plus the roofline gives 0.82x and 0.95x of them. Its decode attention kernels (one query) ran
# 5-12 us over their roofline. So no kernel is taken as shorter than this plus its roofline.
KERNEL_MIN_US = 2.0
FLOOR_PROBE_NUMEL = 1 << 17
_FLOORS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def stream_least_ms(roofline_ms, kernels=1.0):
    """The least time the stream gives a kernel (or node of `kernels` kernels): its roofline plus
    each kernel's start (KERNEL_MIN_US). A bound that exceeds it sets the time in the stream."""
    return roofline_ms + KERNEL_MIN_US / 1e3 * np.asarray(kernels, dtype=float)


def in_stream_ms(isolated_ms, roofline_ms, floor_ms: float, kernels=1.0, carried=1.0):
    """A kernel's (or node's) time in the stream from its isolated prediction (the rule above);
    numpy arrays or floats. kit.parallel.costs.Coster uses the same rule. A kernel in the stream
    takes at least KERNEL_MIN_US more than its roofline (never more than its isolated prediction).

    carried: the floors the isolated time holds, and sheds: one a prediction, scaled with it
    (attention backward = 2.8 x (forward + floor) holds 2.8; a dropout backward, 0.83 x a
    multiply's pass, 0.83; a foreach op's 55 launches, each its own prediction, 55). kernels:
    the kernels the node stands for, each keeping its start (KERNEL_MIN_US) in the least time;
    not floors: a node of k kernels priced as one op (a layer norm's backward, 2 kernels, one
    copy of its bytes) holds one floor, and shedding k had taken (k - 1) floors it never held
    (12.7 us a node on an H100: resnet50's 106 batch norms, 2 kernels each, bf16 batch 64,
    4.00 -> 4.23 ms; a scaled one had shed a whole floor from 0.83 of one)."""
    kernels = np.asarray(kernels, dtype=float)
    low = stream_least_ms(roofline_ms, kernels)
    shed = floor_ms * np.asarray(carried, dtype=float)
    return np.maximum(isolated_ms - shed, np.minimum(low, isolated_ms))


def isolation_floor_ms(model, gpu) -> float:
    """The per-kernel dispatch floor a learned predictor carries on a GPU (0 for the analytic
    roofline and wave models, which have none)."""
    if getattr(model, "name", None) not in LEARNED_FROM_ISOLATED:
        return 0.0
    # by the model object itself, held weakly: an id had been reused by a predictor of other
    # weights built after the first was freed (habitat is built afresh on every call)
    floors_of = _FLOORS.setdefault(model, {})
    # and by the GPU's spec, not its key: register_gpu (a --gpu-file) may replace the spec behind
    # a key, and the old spec's floor had stayed in the process (as kit.parallel.costs keys its caches)
    siblings = list(bounding_gpus(model, gpu))
    key = (gpu, *siblings)
    if key not in floors_of:
        from kit.ops import Elementwise

        probe = [Elementwise("add", FLOOR_PROBE_NUMEL, "fp32", inputs=2)]
        # a GPU whose predictions the training GPUs it dominates bound (kit.predict.sibling_bound)
        # sheds their floor (the largest, if several): its kernels, each no slower than there in
        # isolation, are then no slower there in the stream either. Its own learned floor moves
        # with the power features as its kernels do (an A100-SXM4-40GB's 30.5 us against the
        # A100-PCIe-40GB's 25.3), and a probe read off the bounded predictions had shed less than
        # its kernels carry (llama3-8b's decode elementwise on an A100-SXM4-80GB 2.24 -> 2.32 ms)
        unbounded = getattr(model, "predict_unbounded", model.predict)
        floors = []
        for g in siblings or [gpu]:
            row = unbounded(probe, g).iloc[0]
            floors.append(max(float(row.latency_ms) - float(row.roofline_ms), 0.0))
        floors_of[key] = max(floors)
    return floors_of[key]
