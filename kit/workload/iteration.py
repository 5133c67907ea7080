"""Iteration time of a captured graph on one GPU: kernels predicted, CPU issue simulated.

The CPU issues ops one after another; each costs `cpu_op_us` (framework dispatch) and, if it
launches kernels, `launch_us` per kernel. The GPU runs kernels in issue order, one at a time
(one stream):

    issue_i   = Σ_{j≤i} cpu_j                       (CPU timeline, ms)
    end_i     = max(end_{i-1}, issue_i) + d_i        (GPU timeline: idles when the CPU is behind)
    total     = max(end_last, issue_last)

which is a max-plus scan, computed in closed form: end_i = C_i + max_{j≤i}(issue_j - C_{j-1})
with C the cumulative kernel time. A host wait inside the pass (kit.workload.host_wait: a value
read on the host, a blocking copy from it) holds the CPU until the GPU has run every kernel before
it: the scan restarts there from max(issue, end) (waited_timeline). The overheads are
calibratable from a Kineto trace (kit.workload.overhead.calibrate).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from kit.errors import KitError
from kit.hardware import get_gpu
from kit.workload.fusion import apply_fusion
from kit.workload.graph import OpGraph
from kit.workload.host_wait import HOST_WAITS
from kit.workload.kernels import for_build, mta_build
# the names tests and notebooks reach through this module (kit's own code imports kernel_times)
from kit.workload.kernel_times import (GENERIC_LOOP_ELEMS_PER_SM_CLOCK, KERNEL_MIN_US,  # noqa: F401
                                      _leaves, generic_loop_ms, in_stream_ms, isolated_latencies,
                                      isolation_floor_ms, predict_latencies)


@dataclass(frozen=True)
class CpuOverhead:
    """Host cost per op. Defaults: PyTorch eager on a server CPU, ~10 µs of Python + dispatcher
    per aten op and ~5 µs per cudaLaunchKernel (Kineto traces of eager models typically show
    cpu_op spans of 5-20 µs and cudaLaunchKernel of 3-7 µs)."""

    cpu_op_us: float = 10.0
    launch_us: float = 5.0
    free_op_us: float = 3.0  # a view/reshape: dispatch only
    source: str = "default"

    def __post_init__(self):
        import math

        for name in ("cpu_op_us", "launch_us", "free_op_us"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not (math.isfinite(value) and value >= 0)):
                raise KitError(f"CpuOverhead: {name} must be a finite number of µs >= 0, got {value!r}")

    def to_dict(self) -> dict:
        return {"cpu_op_us": self.cpu_op_us, "launch_us": self.launch_us,
                "free_op_us": self.free_op_us, "source": self.source}


# A step captured into a CUDA graph (torch.compile(mode="reduce-overhead"), torch.cuda.graphs) is
# replayed by one host call: no per-op dispatch and no per-kernel launch, so the GPU runs the
# kernels back to back and only their own times (each at least its roofline + KERNEL_MIN_US) remain.
CUDA_GRAPH = CpuOverhead(0.0, 0.0, 0.0, source="cuda graph: one replay, no per-op host cost")
# HF generate's own loop ops (kit.workload.hf_generate, op class "generate") run eagerly around
# the captured forward, never inside the graph: under CUDA_GRAPH they keep eager host costs
OUTSIDE_GRAPH_CLASS = "generate"


def _host_costs(overhead: CpuOverhead, op_class) -> tuple:
    """(cpu_op_us, launch_us, free_op_us), each a number or per node an array: the graph's
    nodes at `overhead`, HF's loop ops at eager PyTorch's defaults when overhead is CUDA_GRAPH."""
    costs = (overhead.cpu_op_us, overhead.launch_us, overhead.free_op_us)
    outside = np.array([c == OUTSIDE_GRAPH_CLASS for c in op_class], dtype=bool)
    if overhead != CUDA_GRAPH or not outside.any():
        return costs
    eager = CpuOverhead()
    return tuple(np.where(outside, e, c) for c, e in
                 zip(costs, (eager.cpu_op_us, eager.launch_us, eager.free_op_us)))


@dataclass
class Iteration:
    """A predicted iteration: totals, parts and the per-kernel timeline (a DataFrame)."""

    model: str
    gpu: str
    mode: str
    fusion: str
    predictor: str
    total_ms: float
    total_p10_ms: float
    total_p90_ms: float
    kernel_ms: float
    cpu_ms: float
    gpu_idle_ms: float
    phases_ms: dict
    timeline: pd.DataFrame
    overhead: CpuOverhead
    meta: dict = field(default_factory=dict)
    fallbacks: dict = field(default_factory=dict)

    def by_class(self) -> pd.DataFrame:
        g = self.timeline.groupby("op_class", sort=False)
        f = pd.DataFrame({"kernels": g["kernels"].sum(), "ms": g["latency_ms"].sum()})
        f["share"] = f["ms"] / max(self.kernel_ms, 1e-12)
        return f.sort_values("ms", ascending=False).reset_index()

    def top_kernels(self, n: int = 10) -> pd.DataFrame:
        t = self.timeline
        g = t.groupby(["where", "aten", "op_class", "phase"], sort=False)
        # the shapes shown are the costliest member's: a decode step's KV-cache cats (32 GiB a
        # step) share a group with the rotary embedding's small cats, and had shown those
        heaviest = t.loc[g["latency_ms"].idxmax().to_numpy(), "shapes"].to_numpy()
        # count: the kernels (kit predict prints it as "Nx" under top kernels), ops: the nodes,
        # mean_ms: per node (ms / ops, not ms / count); a group's count had been its nodes, so
        # llama3-8b's 2 AdamW _foreach_mul_ nodes (291 tensors, 3 launches a node at ~110 tensors
        # a launch) showed "2x" for 6 launches, and a layer norm's backward (2 kernels a node)
        # half its kernels
        f = pd.DataFrame({"count": g["kernels"].sum(), "ops": g.size(), "ms": g["latency_ms"].sum(),
                          "mean_ms": g["latency_ms"].mean(), "shapes": heaviest})
        return f.sort_values("ms", ascending=False).head(n).reset_index()

    def to_dict(self) -> dict:
        return {"model": self.model, "gpu": self.gpu, "mode": self.mode, "fusion": self.fusion,
                "predictor": self.predictor, "total_ms": self.total_ms,
                "band_ms": [self.total_p10_ms, self.total_p90_ms], "kernel_ms": self.kernel_ms,
                "cpu_ms": self.cpu_ms, "gpu_idle_ms": self.gpu_idle_ms, "phases_ms": self.phases_ms,
                "kernels": int(self.timeline["kernels"].sum()), "ops": int(self.meta.get("ops", 0)),
                "by_class": self.by_class().to_dict("records"),
                "top_kernels": self.top_kernels().to_dict("records"),
                "overhead": self.overhead.to_dict(), "fallbacks": self.fallbacks,
                "unknown_ops": self.meta.get("unknown_ops", {}),
                **{k: self.meta[k] for k in ("batch", "seq", "dtype", "model_dtypes", "params",
                                             "param_bytes", "carried_ms", "activation_bytes",
                                             "optimizer", "context", "kv_cache", "kv_cache_bytes", "fast_path", "loss")
                   if k in self.meta},
                **({"memory": self.meta["memory"]} if "memory" in self.meta else {}),
                **self._image(),
                **({"tokens_per_s": self.tokens_per_s, "expert_gather_ms": self.expert_gather_ms}
                   if self.mode == "decode" else {})}

    @property
    def expert_gather_ms(self) -> float:
        """The kernel time spent gathering expert weights: HF's batched_mm, which its generate
        runs for a MoE decode step, copies each (token, expert) pair's expert matrices with an
        index op in the experts module (kit.workload.zoo_experts) whose source is the stacked
        (experts, rows, cols) weight; the eager loop's index ops pick token rows (2-D) instead."""
        t = self.timeline
        first = t["shapes"].astype(str).str.split("x").str[0]
        hit = ((t["aten"] == "index") & t["where"].astype(str).str.endswith("experts")
               & (first.str.count(",") == 2))
        return float(t.loc[hit, "latency_ms"].sum())

    @property
    def carried_share(self) -> float | None:
        """The share of the kernel time on a curve carried from where it was measured
        (meta["carried_ms"], kit.workload.carried); None where the predictor has no curves."""
        carried = self.meta.get("carried_ms")
        if carried is None:
            return None
        return sum(carried.values()) / self.kernel_ms if self.kernel_ms > 0 else 0.0

    @property
    def fits(self) -> bool | None:
        """Whether the step fits in the GPU's memory (kit.workload.models.memory_fit; set by
        kit.api.predict_model), None where it was not checked."""
        return self.meta.get("memory", {}).get("fits")

    @property
    def tokens_per_s(self) -> float:
        """A decode step's throughput: one new token per sequence (kit.workload.kv_cache)."""
        return self.meta.get("batch", 1) / max(self.total_ms, 1e-12) * 1e3

    def _image(self) -> dict:
        """A vision model's image side, where the graph has no seq (see _prepare's meta)."""
        return {"image_size": self.meta["image_size"]} if self.meta.get("image_size") else {}

    def to_trace(self) -> dict:
        """Chrome/Perfetto trace-event JSON (open in ui.perfetto.dev): a CPU track of op issue
        and a GPU track of kernels, in µs."""
        from kit.workload.timeline import trace_events

        return trace_events(self)


_NUM = re.compile(r"\.\d+(?=\.|$)")


def _generic_path(path: str) -> str:
    return _NUM.sub(".*", path) if path else "(top)"


def ready_ms(issue_ms: np.ndarray, dur_ms: np.ndarray, launches: np.ndarray,
             launch_us: float) -> np.ndarray:
    """When each node's GPU work may start, for gpu_timeline. A node of k kernels (a cuDNN RNN,
    a conv backward, a foreach optimizer step) is launched kernel by kernel: its first kernel
    can run once the first launch is done, k - 1 launches before the node's issue ends, and its
    last (dur / k, the kernels taken as equal) only after the last launch. A one-kernel node is
    ready at its issue time."""
    k = np.maximum(launches, 1.0)
    first = issue_ms - (k - 1) * launch_us / 1e3
    return np.maximum(first, issue_ms + dur_ms / k - dur_ms)


def gpu_timeline(issue_ms: np.ndarray, dur_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of kernels run in order, each no earlier than its issue time."""
    if len(dur_ms) == 0:
        return dur_ms.copy(), dur_ms.copy()
    c = np.cumsum(dur_ms)
    end = c + np.maximum.accumulate(issue_ms - (c - dur_ms))
    return end - dur_ms, end


def waited_timeline(cpu_us: np.ndarray, dur_ms: np.ndarray, launches: np.ndarray,
                    launch_us: float, waits: np.ndarray) -> tuple:
    """(issue, start, end), ms, of kernels issued after cpu_us each, where before a node whose
    `waits` is set the host waits for the GPU to drain (kit.workload.host_wait): the pass is
    split there, each part starting at max(the CPU's last issue, the GPU's last end) with the
    GPU idle, as generate's steps follow one another after the stop check."""
    issue, start, end = (np.empty(len(dur_ms)) for _ in range(3))
    cuts = [0, *np.flatnonzero(waits[1:]) + 1, len(dur_ms)]
    t = 0.0
    for lo, hi in zip(cuts, cuts[1:]):
        issue[lo:hi] = t + np.cumsum(cpu_us[lo:hi]) / 1e3
        d = dur_ms[lo:hi]
        start[lo:hi], end[lo:hi] = gpu_timeline(ready_ms(issue[lo:hi], d, launches[lo:hi], launch_us), d)
        t = max(issue[hi - 1], end[hi - 1])
    return issue, start, end


def _prepared(graph: OpGraph, fusion: str) -> dict:
    """Everything about a graph that does not depend on the GPU, memoised on the (immutable)
    graph: the fused kernel graph, the ops to predict, the free ops before each kernel, and the
    timeline's static columns. Predicting one captured model on many GPUs reuses it."""
    memo = graph.__dict__.setdefault("_prepared", {})
    if fusion in memo:
        return memo[fusion]
    kernels = apply_fusion(graph, fusion)
    nodes = kernels.nodes
    free_before = np.zeros(len(nodes))
    waits = np.zeros(len(nodes), dtype=bool)  # a host wait before the node (kit.workload.host_wait)
    trailing, waited = 0, False
    if fusion == "eager":  # free ops are dispatched by the CPU; compiled code has none
        pos = {n.id: i for i, n in enumerate(graph.kernels())}
        for n in graph.nodes:
            if n.free:
                trailing += 1
                waited = waited or n.aten in HOST_WAITS
            elif n.id in pos:
                free_before[pos[n.id]] = trailing
                waits[pos[n.id]] = waited
                trailing, waited = 0, False
    columns = {"id": [n.id for n in nodes], "aten": [n.name() for n in nodes],
               "op_class": [n.op_class for n in nodes], "phase": np.array([n.phase for n in nodes]),
               "module": [n.module for n in nodes], "layer": [n.layer for n in nodes],
               "shapes": [n.shapes for n in nodes],
               "where": [_generic_path(n.module) for n in nodes],
               "kernels": np.array([max(n.kernels, 1) for n in nodes], dtype=int)}
    meta = {k: v for k, v in graph.meta.items() if k != "config"}
    cfg = graph.meta.get("config")
    if isinstance(cfg, dict) and cfg.get("image_size") and graph.meta.get("seq") is None:
        meta["image_size"] = int(cfg["image_size"])  # a vision model's images, in place of a seq
    meta.update(ops=len(graph), unknown_ops=dict(graph.unknown_ops()))
    memo[fusion] = {"kernels": kernels, "leaves": _leaves(nodes), "free_before": free_before,
                    "waits": waits,
                    "trailing_free": trailing, "columns": columns, "meta": meta,
                    "static": pd.DataFrame(columns)}  # built once: string columns are slow to build
    return memo[fusion]


def _for_build(prep: dict, build: str) -> dict:
    """prep with each foreach node as the GPU's torch build launches it (kernels.PerBuild: a CUDA
    12 or ROCm build's multi_tensor_apply table, kernels.mta_build): its op and
    kernels; prep itself where no node differs. Memoised in prep."""
    memo = prep.setdefault("builds", {})
    if build not in memo:
        nodes = prep["kernels"].nodes
        swapped = [replace(n, op=op, kernels=k) if op is not n.op else n
                   for n in nodes for op, k in [for_build(n.op, n.kernels, build)]]
        if all(a is b for a, b in zip(swapped, nodes)):
            memo[build] = prep
        else:
            columns = dict(prep["columns"], kernels=np.array([max(n.kernels, 1) for n in swapped], dtype=int))
            memo[build] = dict(prep, kernels=prep["kernels"].with_nodes(swapped), leaves=_leaves(swapped),
                               columns=columns, static=pd.DataFrame(columns), latencies={}, builds={})
    return memo[build]


def _latencies(graph: OpGraph, prep: dict, fusion: str, gpu, predictor):
    """predict_latencies, memoised in-process and on disk for cached captures
    (kit.workload.latency_cache): a repeated configuration needs no predictor."""
    from kit.predict import predictor_name
    from kit.workload import latency_cache

    key = (latency_cache.key_for(graph, fusion, gpu, predictor_name(predictor))
           if isinstance(predictor, str) else None)
    memo = prep.setdefault("latencies", {})
    if key is not None and key in memo:
        return memo[key]
    nodes = prep["kernels"].nodes
    hit = latency_cache.load(key, len(nodes))
    if hit is None:
        hit = predict_latencies(nodes, gpu, predictor, prep["leaves"], with_option=True)
        latency_cache.save(key, *hit)
    if key is not None:
        memo[key] = hit
    return hit


def iteration(graph: OpGraph, gpu, predictor: str = "auto", fusion: str = "eager",
              overhead: CpuOverhead | None = None) -> Iteration:
    """Predict one iteration (the graph's phases) of a captured graph on one GPU."""
    gpu = get_gpu(gpu)
    overhead = CpuOverhead() if overhead is None else overhead
    if not isinstance(overhead, CpuOverhead):
        raise KitError(f"overhead must be a kit.workload.iteration.CpuOverhead (or None), got "
                       f"{type(overhead).__name__} {overhead!r}")
    if not isinstance(graph, OpGraph):
        raise KitError(f"iteration needs an OpGraph (from kit.workload.capture), got {type(graph).__name__}")
    prep = _for_build(_prepared(graph, fusion), mta_build(gpu))
    lat, p10, p90, pname, fallbacks, taken = _latencies(graph, prep, fusion, gpu, predictor)
    cols = prep["columns"]
    launches = cols["kernels"].astype(float)
    cpu_op_us, launch_us, free_op_us = _host_costs(overhead, cols["op_class"])
    cpu_us = cpu_op_us + launch_us * launches + free_op_us * prep["free_before"]
    issue = np.cumsum(cpu_us) / 1e3
    waits = prep["waits"]
    trailing_free = prep["trailing_free"]
    # views after the last kernel (HF's stop check after its loop ops: at their host cost)
    last_free_us = free_op_us[-1] if np.ndim(free_op_us) else free_op_us
    trailing_ms = trailing_free * float(last_free_us) / 1e3
    timelines = {}
    for key, d in (("mid", lat), ("p10", p10), ("p90", p90)):
        # host waits inside the pass: the CPU's issue waits on the GPU there (a CUDA graph's
        # replay has none: the copy and the read are the capture's, not the replay's)
        if waits.any() and overhead != CUDA_GRAPH:
            issued, start, end = waited_timeline(cpu_us, d, launches, launch_us, waits)
        else:
            issued = issue
            start, end = gpu_timeline(ready_ms(issue, d, launches, launch_us), d)
        cpu_end = (issued[-1] if len(issued) else 0.0) + trailing_ms
        timelines[key] = (start, end, max(end[-1] if len(end) else 0.0, cpu_end), issued)
    start, end, total, issue = timelines["mid"]
    phase = cols["phase"]
    phases_ms, prev = {}, 0.0
    for ph in ("fwd", "bwd", "opt"):
        mask = phase == ph
        if mask.any():
            last = float(end[mask].max())
            phases_ms[ph] = float(last - prev)
            prev = last
    if phases_ms:
        phases_ms[list(phases_ms)[-1]] += float(total - prev)  # trailing CPU time belongs to the last phase
    frame = prep["static"].copy()
    for name, values in (("cpu_start_ms", issue - cpu_us / 1e3), ("cpu_end_ms", issue),
                         ("gpu_start_ms", start), ("gpu_end_ms", end), ("latency_ms", lat),
                         ("latency_p10_ms", p10), ("latency_p90_ms", p90)):
        frame[name] = values
    kernel_ms = float(lat.sum())
    meta = dict(prep["meta"])
    if trailing_free:  # view ops after the last kernel: CPU time in the total, in no timeline row
        meta["trailing_free"] = {"ops": int(trailing_free), "ms": trailing_ms}
    if pname == "tile":  # the curves are the tile predictor's (kit.workload.carried)
        from kit.workload.carried import carried_ms, carried_nodes

        by_gpu = prep.setdefault("carried_nodes", {})
        key = (gpu, tuple(sorted(fallbacks)))  # the GPU itself: a GPU file may reuse a catalog key
        if key not in by_gpu:
            by_gpu[key] = carried_nodes(prep["leaves"], gpu, fallbacks)
        meta["carried_ms"] = carried_ms(by_gpu[key], lat, taken)
    return Iteration(graph.model, gpu.key, graph.meta.get("mode", "train"), fusion, pname,
                     float(total), float(timelines["p10"][2]), float(timelines["p90"][2]),
                     kernel_ms, float(issue[-1]) if len(issue) else 0.0,
                     # idle: never under 0 (CUDA graphs' replay can round it to -1e-9)
                     max(float(total - kernel_ms), 0.0), phases_ms, frame, overhead, meta, fallbacks)
