"""What one micro-batch costs in one pipeline chunk on one rank: compute, TP/EP communication,
kernel launches, and the parameters whose gradients it produces.

Every distinct kernel shape is predicted once (the predictor dedupes), so a 96-layer model
costs as much as one layer of each kind.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from kit.errors import KitError

from kit.parallel.gpt import (Block, ContextCopy, GPTSpec, KVRepeat, embedding_backward, embedding_forward, head_backward,
                             head_forward, layer_backward, layer_forward)
from kit.parallel import op_cache
from kit.parallel.layout import Layout
from kit.parallel.memory import edge_params, layer_rank_params, stage_layers, zero_kept
from kit.predict.sibling_bound import bounding_gpus

# predictions are pure functions of (predictor, GPU, op) and (system, collective): cache them
# across calls so sweeps over layouts pay for each distinct shape once
_OP_CACHE: dict = {}
_COMM_CACHE: dict = {}
_OP_DISK: dict = {}  # _OP_CACHE's key -> (its file under $KIT_CACHE, what that held): read once


def _disk_key(op) -> str | None:
    """An op's name in the disk cache (kit.parallel.op_cache): its class and repr, for a
    dataclass whose every field is in its repr and whose classes' code the cache's key holds
    (op_cache.stamped_class); None: not cached on disk."""
    fs = getattr(op, "__dataclass_fields__", None)
    if not fs or not all(f.repr for f in fs.values()) or not op_cache.stamped_class(type(op)):
        return None
    return f"{type(op).__module__}.{op!r}"


def _or(band, mid):
    """A band end where the predictor gave one, else the latency itself."""
    return np.where(np.isfinite(band), band, mid).tolist()


@dataclass
class Phase:
    compute_ms: float = 0.0
    comm_ms: float = 0.0  # TP/EP communication the compute stream waits for (exposed)
    # asynchronous TP collectives (Block.overlap) on the TP communicator's stream, whole; the
    # part of each that outlasts the kernel beside it is in comm_ms as well
    async_comm_ms: float = 0.0
    kernels: int = 0
    collectives: int = 0
    last_ms: float = 0.0  # the last kernel's time (the GPU cannot finish before it is launched)
    seq_ms: list = field(default_factory=list)  # every kernel's time, in launch order
    seq_host_ms: list = field(default_factory=list)  # host time to issue each of them

    @property
    def host_total_ms(self) -> float:
        """Host time to issue every kernel of the phase."""
        return sum(self.seq_host_ms)

    def paced_ms(self) -> float:
        """Time from the first launch to the last kernel's end when the GPU starts idle and the
        host issues kernel i after h_i: end_i = max(end_(i-1), h_0 + ... + h_i) + k_i."""
        memo = getattr(self, "_paced", None)
        if memo and memo[0] == len(self.seq_ms):
            return memo[1]
        end, t = 0.0, 0.0
        for k, h in zip(self.seq_ms, self.seq_host_ms):
            t += h
            end = (end if end > t else t) + k
        self._paced = (len(self.seq_ms), end)
        return end


@dataclass
class ChunkCost:
    fwd: Phase = field(default_factory=Phase)
    bwd: Phase = field(default_factory=Phase)
    layer_bwd_ms: list = field(default_factory=list)  # per layer, backward order
    layer_grad_bytes: list = field(default_factory=list)  # per layer, backward order; dense part
    layer_expert_grad_bytes: list = field(default_factory=list)  # per layer: this rank's experts
    layer_bwd_comm_ms: list = field(default_factory=list)  # per layer's TP/EP comm, backward order
    layer_bwd_async_comm_ms: list = field(default_factory=list)  # per layer: Phase.async_comm_ms
    head_bwd_ms: float = 0.0  # the LM head's backward compute (the last chunk's; it runs first)
    head_bwd_comm_ms: float = 0.0
    head_bwd_async_comm_ms: float = 0.0
    emb_bwd_comm_ms: float = 0.0  # the embedding's backward's (the first chunk's; it runs last)
    emb_bwd_async_comm_ms: float = 0.0
    params: float = 0.0  # this rank's parameters in the chunk, its expert shard included
    expert_params: float = 0.0  # of which expert weights (reduced over the expert-DP group)


def _attention_core(fwd: list[Block]) -> list[tuple]:
    """(op, backward factor, kernels) of a layer's core attention, what Megatron's selective
    recompute (checkpoint_core_attention; Korthikanti et al. 2022, section 4.2) reruns: a fused
    attention kernel, or the span from the scores' batched GEMM (QK^T) to the one that applies
    them to V, the softmax and its fallback kernels, the mask and the attention dropout in
    between, and the context's permute copy after it (kit.parallel.gpt.ContextCopy: megatron-core
    0.16.1's checkpointed core attention is all of DotProductAttention.forward, that copy its
    last kernel, grouped-query attention's key/value repeat, kit.parallel.gpt.KVRepeat, its
    first). The layer's hidden-state dropouts (after the attention and MLP projections) are
    not part of it and stay saved: picking every dropout of the layer had rerun those two as
    well, each as long as the flash kernel itself (GPT-3 175B at tp 8 on an A100: 0.107 ms each
    against the attention's 0.113, the recompute 0.327 ms a layer where it is 0.113)."""
    flat = [(op, f, n) for blk in fwd if blk.comm is None
            for op, f, n in zip(blk.ops, blk.bwd_factor or [1.0] * len(blk.ops), blk.kernel_counts())]
    fused = [item for item in flat if item[0].op_class == "attention"]
    if fused:
        return fused
    bmm = [i for i, (op, _, _) in enumerate(flat) if op.op_class == "gemm" and getattr(op, "kind", None) == "bmm"]
    if len(bmm) < 2:
        return []
    start, end = bmm[0], bmm[1] + 1
    while start > 0 and isinstance(flat[start - 1][0], KVRepeat):  # GQA's repeat, the forward's first
        start -= 1
    if end < len(flat) and isinstance(flat[end][0], ContextCopy):
        end += 1
    return flat[start:end]


def _recompute_blocks(fwd: list[Block], how: str) -> list[Block]:
    if how == "full":
        return fwd
    if how == "selective":
        core = _attention_core(fwd)
        return [Block("recompute attention", [op for op, _, _ in core], [f for _, f, _ in core],
                      kernels=[n for _, _, n in core])]
    return []


QUANTILES = {"mid": 0, "p10": 1, "p90": 2}  # which of a kernel's predictions op_ms returns

# In-stream or isolated kernel times, by where the kernels come from (measured, not assumed):
# * the captured op graph is every aten op the model runs, the kernels `kit predict --gpu`
#   costs. In the stream (the isolated-kernel floor out, as that path does) a one-GPU layout
#   agrees with it, and NeuSight's 4-GPU gpt2_large labels (4x A100-SXM4) come out dp4 -0.9%,
#   tp4 -0.1%, pp4_1 +6.8%, against +13.8%, +14.6%, +11.5% with isolated times.
# * the analytic GPT layer is Megatron's fused layer: on HF GPT-2 it has half the kernels
#   (gelu as one kernel, not eight; no mask or view arithmetic) and ~10% less isolated time.
#   Isolated, it is what is validated: those labels 0.6%, 2.2%, 0.2% (in the stream 6.6%, 4.5%,
#   1.9%), and vTrain's Megatron runs 5.0% on the held-out half with the megatron-a100 profile
#   fitted so (in the stream: 8.1%, 5.8% after refitting it, measured before the host ran ahead
#   of the GPU in kit.parallel.build._pass). The floor its kernels keep stands
#   in for work the layer does not list; that is a calibration, and it is why the two differ.
IN_STREAM_BY_SOURCE = {"captured op graph": True, "analytic GPT layer": False}


class Coster:
    """Predicts blocks on a GPU and collectives on a system, caching both.

    quantile: which kernel time op_ms gives, the predictor's latency ("mid") or either end of
    its p10-p90 band ("p10", "p90"; the latency itself for predictors without a band).
    Collectives have no band: they keep their point prediction.

    in_stream: a learned predictor's kernels, timed one at a time, carry a dispatch floor; in the
    stream each kernel runs without it (kit.workload.kernel_times.in_stream_ms, the rule of the
    single-GPU path). True: take it out; False: keep the isolated times. build_iteration picks
    by the kernels' source (see IN_STREAM_BY_SOURCE)."""

    def __init__(self, layout: Layout, system, predictor="auto", calibration=None, host=None,
                 quantile: str = "mid", in_stream: bool = True):
        from kit.predict import get_predictor

        if quantile not in QUANTILES:
            raise KitError(f"unknown quantile {quantile!r}; one of {', '.join(QUANTILES)}")
        self.quantile = QUANTILES[quantile]
        self.layout, self.system = layout, system
        self.gpu = system.gpu
        self.predictor = get_predictor(predictor) if isinstance(predictor, str) else predictor
        if not (hasattr(self.predictor, "predict") and hasattr(self.predictor, "name")):
            raise KitError(f"predictor must be a name (auto, wave, roofline, ...) or a kit predictor, "
                           f"got {predictor!r}")
        if not isinstance(in_stream, bool):
            raise KitError(f"in_stream must be True or False, got {in_stream!r}")
        from kit.workload.kernel_times import isolation_floor_ms

        self.in_stream = in_stream
        self.floor_ms = isolation_floor_ms(self.predictor, self.gpu) if in_stream else 0.0
        self._stream_floor_ms = None  # the floor an op priced in the stream sheds in either mode
        from kit.workload.kernel_times import generic_loop_rate

        # PyTorch's generic elementwise loop (a broadcast or strided input), as the single-GPU
        # path costs it; the roofline stays a bound on the bytes
        self.generic_rate = generic_loop_rate(self.gpu) if self.predictor.name != "roofline" else 0.0
        self.calibration = calibration
        self.gemm_scale = getattr(host, "gemm_scale", 1.0)
        self.other_scale = getattr(host, "other_scale", 1.0)
        self.launch_ms = getattr(host, "launch_us", 0.0) / 1e3
        # an op priced in the stream (priced_in_stream) is an eager aten op whose host time a
        # fitted launch_us, per kernel the analytic layer lists, already holds: it is issued at
        # an eager op's cost (kit.workload.iteration.CpuOverhead: dispatch + cudaLaunchKernel,
        # 15 us), or the profile's launch where that is less
        from kit.workload.iteration import CpuOverhead

        eager = CpuOverhead()
        self.stream_op_host_ms = min(self.launch_ms, (eager.cpu_op_us + eager.launch_us) / 1e3)
        self.collective_ms = getattr(host, "collective_us", 0.0) / 1e3
        self.collective_rank_ms = getattr(host, "collective_rank_us", 0.0) / 1e3
        self.tp_comm_scale = getattr(host, "tp_comm_scale", 1.0)
        # the LM head's GEMMs over the whole vocabulary (TP = 1): see HostModel.full_vocab_scale
        self.head_factor = getattr(host, "full_vocab_scale", 1.0) if layout.tp == 1 else 1.0
        # a learned predictor's name carries the weights it reads when they are not the shipped
        # ones (kit.predict.predictor_name), so one folder's kernel times are never another's
        from kit.predict import predictor_name

        # (a predictor object is its own key: an object of other weights shares its name)
        cache_name = predictor_name(predictor) if isinstance(predictor, str) else self.predictor
        # keyed by the GPU's spec, not its key: register_gpu (a --gpu-file) may replace the spec
        # behind a key, and a stale entry had kept the old spec's times in the same process. And
        # by the specs of the training GPUs that bound its predictions (kit.predict.sibling_bound),
        # as kit.workload.latency_cache keys them: a --gpu-file that replaced the A100-PCIe-40GB
        # had left an A100-SXM4-40GB system's kernel times those of the old spec
        op_key = (cache_name, self.gpu, bounding_gpus(self.predictor, self.gpu))
        self._op_ms = _OP_CACHE.setdefault(op_key, {})
        if op_key not in _OP_DISK:  # and the times earlier processes predicted, on disk
            path = op_cache.cache_path(cache_name, self.gpu)
            _OP_DISK[op_key] = (path, op_cache.load(path))
        self._op_disk_path, self._op_disk = _OP_DISK[op_key]
        self._comm_ms = _COMM_CACHE.setdefault((system, self.gpu, str(calibration)), {})
        self._groups: dict = {}  # (group name, stage) -> RankGroup

    def predict_ops(self, ops) -> None:
        new = [op for op in dict.fromkeys(ops) if op not in self._op_ms]
        if new and self._op_disk:  # as predicted below: the latency a numpy float, the rest floats
            for op in new:
                v = self._op_disk.get(_disk_key(op))
                if v is not None:
                    self._op_ms[op] = (np.float64(v[0]), *v[1:])
            new = [op for op in new if op not in self._op_ms]
        if new:
            from kit.workload.kernel_times import one_thread

            with one_thread():  # the networks are tiny: a thread pool only spins on a busy CPU
                frame = self.predictor.predict(new, self.gpu)
            mid = frame.latency_ms.to_numpy(float)
            lo = frame.latency_p10_ms.to_numpy(float) if "latency_p10_ms" in frame else mid
            hi = frame.latency_p90_ms.to_numpy(float) if "latency_p90_ms" in frame else mid
            roof = frame.roofline_ms.to_numpy(float) if "roofline_ms" in frame else mid
            self._op_ms.update(zip(new, zip(mid, _or(lo, mid), _or(hi, mid), _or(roof, mid))))
            keys = {op: _disk_key(op) for op in new}
            op_cache.append(self._op_disk_path, {k: self._op_ms[op] for op, k in keys.items() if k})

    def op_ms(self, op, scale: float = 1.0, kernels: float = 1.0) -> float:
        """The op's time x scale (a backward factor), in the stream when in_stream (less
        scale x the predictor's floor, the floors its isolated time holds, never below the
        roofline plus kernels x a kernel's start: kit.workload.kernel_times.in_stream_ms), then
        calibrated."""
        t = self._op_ms[op][self.quantile] * scale
        if getattr(op, "priced_in_stream", False):
            return self._stream_op_ms(op, t, scale, kernels)
        if self.floor_ms > 0:
            from kit.workload.kernel_times import in_stream_ms

            # a backward factor multiplies the isolated time, floor included: it carries `scale`
            t = float(in_stream_ms(t, self._op_ms[op][3] * scale, self.floor_ms, kernels, carried=scale))
        if self.generic_rate and not getattr(op, "vectorized", True):
            t = max(t, op.numel / self.generic_rate * 1e3)
        return t * (self.gemm_scale if op.op_class == "gemm" else self.other_scale)

    def _stream_op_ms(self, op, t: float, scale: float, kernels: float) -> float:
        """An op that is priced in the stream whatever the mode (priced_in_stream: the per-token
        kernels of kit.parallel.vocab_kernels, which the analytic layer's isolated calibration
        never held): its isolated time less the predictor's floor, never below its roofline plus
        each kernel's start (kit.workload.kernel_times.in_stream_ms, the single-GPU path's rule),
        and not scaled by other_scale, a bias fitted on isolated times; that had taken a 26.9 us
        isolated kernel of a few kB on an A100-SXM4-40GB to 14.4 us, where the stream gives 2.0."""
        from kit.workload.kernel_times import in_stream_ms, isolation_floor_ms

        if self._stream_floor_ms is None:
            self._stream_floor_ms = isolation_floor_ms(self.predictor, self.gpu)
        return float(in_stream_ms(t, self._op_ms[op][3] * scale, self._stream_floor_ms, kernels,
                                  carried=scale))

    def comm_ms(self, kind: str, nbytes: float, ranks) -> float:
        """The collective's time on `ranks`; a RankGroup's: the slowest of it and its peers (the
        groups of other ranks that run the same collective at the same time)."""
        if len(ranks) < 2 or nbytes <= 0:
            return 0.0
        # the groups of a node crossing nodes at once (RankGroup.senders, or per node
        # RankGroup.crossing), the EP groups' MoE all-to-alls too: at tp 8 x dp 2 x ep 2 on two
        # pcie8 nodes the 8 EP groups, one GPU of each a node, had each been priced on a whole
        # NIC of the node's 2 (1 GiB: 51.1 ms a group where their 2/8 share takes 202.7)
        crossing, senders = getattr(ranks, "crossing", None), getattr(ranks, "senders", 1)
        gpn = self.system.gpus_per_node
        return max(self._one_comm_ms(kind, nbytes, g, _node_counts(g, crossing, gpn)
                                     if crossing is not None else senders)
                   for g in (ranks, *getattr(ranks, "peers", ())))

    def _one_comm_ms(self, kind: str, nbytes: float, ranks, senders: int = 1) -> float:
        key = (kind, float(nbytes), tuple(ranks), senders)
        if key not in self._comm_ms:
            from kit.comm import predict_collective

            self._comm_ms[key] = predict_collective(kind, nbytes, self.system, ranks=list(ranks),
                                                    calibration=self.calibration, senders=senders).time_ms
        return self._comm_ms[key]

    def group(self, name: str, stage: int) -> "RankGroup":
        """The `name` group ("tp", "ep", "dp", "edp") of the stage's representative rank, with
        its peers: the stage's other groups of that kind that sit differently on the nodes."""
        key = (name, stage)
        if key not in self._groups:
            lay = self.layout
            if name == "tp":
                every = [lay.tp_group(stage, d) for d in range(lay.dp)]
            elif name == "ep":
                every = [lay.ep_group(stage, t, e) for t in range(lay.tp) for e in range(0, lay.dp, lay.ep)]
            elif name == "dp":
                every = [lay.dp_group(stage, t) for t in range(lay.tp)]
            else:  # "edp"
                every = [lay.edp_group(stage, t, d) for t in range(lay.tp) for d in range(lay.ep)]
            gpn = self.system.gpus_per_node
            # the stage's groups of a kind run the same collective at once: those crossing nodes
            # share each node's NICs (kit.comm.topology.node_net_gbs). At tp 8 on two pcie8 nodes
            # (2 NICs for 8 GPUs) the 8 DP groups' gradient all-reduces had each been priced on
            # a whole NIC, 4x its 2/8 share. Counted node by node: the busiest node's count
            # applied to all had halved the NICs of the TP group of ranks 6-11 at tp 6 (pcie8) on
            # node 0, where it alone crosses
            crossing = crossing_by_node(every, gpn)
            self._groups[key] = RankGroup(every[0], every[1:], gpn, crossing)
        return self._groups[key]

    def pp_pair(self, a: int, b: int, both_ways: bool = False) -> "RankGroup":
        """Stage a's rank sending to stage b's, with the other dp x tp pairs of the two stages.
        both_ways: the pairs exchange (the tied embedding's all-reduce between the first and the
        last stage), so each pair crossing nodes loads the NICs of both its nodes each way."""
        lay = self.layout
        pairs = [(lay.rank(a, d, t), lay.rank(b, d, t)) for d in range(lay.dp) for t in range(lay.tp)]
        gpn, first = self.system.gpus_per_node, [lay.rank(a, 0, 0), lay.rank(b, 0, 0)]
        if both_ways:
            return RankGroup(first, pairs, gpn, crossing_by_node(pairs, gpn))
        # every pair sends at once, so a node's cross-node sends share its NICs: the busiest node's
        # count, out of it (one direction) or into it (the other)
        crossing = Counter()
        for x, y in pairs:
            if x // gpn != y // gpn:
                crossing[("out", x // gpn)] += 1
                crossing[("in", y // gpn)] += 1
        return RankGroup(first, pairs, gpn, senders=max(crossing.values(), default=1))

    def add(self, phase: Phase, blocks: list[Block], stage: int, factors: bool = False,
            gemm_factor: float = 1.0) -> float:
        """Add blocks to a phase (their GEMMs' times x gemm_factor); returns their compute ms."""
        total = 0.0
        # an asynchronous collective's time, the kernels it still runs beside, their time so far
        beside, left, ran = 0.0, 0, 0.0

        def wait(ms: float) -> None:  # the compute stream waits for ms of communication
            phase.comm_ms += ms
            phase.seq_ms.append(ms)
            phase.seq_host_ms.append(0.0)

        for blk in blocks:
            if blk.comm is not None:
                kind, nbytes, group = blk.comm
                ranks = self.group(group, stage)
                ms = self.comm_ms(kind, nbytes, ranks) * self.tp_comm_scale
                if ms > 0:
                    if beside:  # two in a row: the first hid only behind the kernels it met
                        wait(max(beside - ran, 0.0))
                        beside = 0.0
                    phase.kernels += 1
                    phase.collectives += 1
                    host_ms = self.collective_ms + self.collective_rank_ms * (len(ranks) - 1)
                    if blk.overlap:
                        phase.async_comm_ms += ms
                        beside, left, ran = ms, int(blk.overlap), 0.0
                        phase.seq_ms.append(0.0)  # issued; it runs beside the next kernel
                        phase.seq_host_ms.append(host_ms)
                    else:
                        phase.comm_ms += ms
                        phase.seq_ms.append(ms)
                        phase.seq_host_ms.append(host_ms)
                continue
            f = blk.bwd_factor if blk.bwd_factor else [1.0] * len(blk.ops)
            counts = blk.kernel_counts()
            for op, k, n in zip(blk.ops, f, counts):
                t = self.op_ms(op, k, n) * (gemm_factor if op.op_class == "gemm" else 1.0)
                total += t
                phase.last_ms = t
                phase.seq_ms.append(t)
                stream_op = getattr(op, "priced_in_stream", False)
                phase.seq_host_ms.append((self.stream_op_host_ms if stream_op else self.launch_ms) * n)
                if beside:
                    # the kernels and the collective run side by side; what comes next needs
                    # both (the wgrad GEMM's output and the reduced input gradient, or the
                    # dgrad's and the re-gathered input): the collective's excess is exposed
                    ran += t
                    left -= 1
                    if left <= 0:
                        wait(max(beside - ran, 0.0))
                        beside = 0.0
            phase.kernels += int(round(sum(counts)))
        if beside:
            wait(max(beside - ran, 0.0))
        phase.compute_ms += total
        return total


def crossing_by_node(groups, gpus_per_node: int) -> dict[int, tuple]:
    """Node -> the local GPUs there of each group spanning more than one node that has ranks on
    it (sorted): the groups that, running the same collective at once, share that node's NICs,
    and where they sit on them (kit.comm.topology.shared_nics)."""
    out: dict = {}
    for g in groups:
        local: dict = {}
        for r in g:
            local.setdefault(r // gpus_per_node, []).append(r % gpus_per_node)
        if len(local) > 1:
            for node, gpus in local.items():
                out.setdefault(node, set()).add(tuple(sorted(gpus)))
    return {node: tuple(sorted(placed)) for node, placed in out.items()}


def _node_counts(ranks, crossing: dict, gpus_per_node: int) -> tuple:
    """The concurrent crossing groups' local GPUs on each node of `ranks`, in node order
    (predict_collective's per-node senders); 1 on a node no group crosses from."""
    return tuple(crossing.get(node, 1) for node in sorted({r // gpus_per_node for r in ranks}))


class RankGroup(list):
    """A group of ranks (the list) and its peers: groups of other ranks of the same stage that
    run the same collective at the same time but sit differently on the nodes (one per such
    placement). The stage's representative stands for all of them, so its collectives take the
    slowest one's time: at tp 3 on 8-GPU nodes, the TP group of ranks 6, 7, 8 spans two nodes
    while rank 0's (0, 1, 2) does not, and its all-reduces had been priced as rank 0's (gpt2 at
    tp 3 x dp 3 on dgx-h100: 61 us on NVSwitch where the slowest group takes 138 us)."""

    def __init__(self, ranks, others=(), gpus_per_node: int = 1, crossing: dict | None = None,
                 senders: int = 1):
        super().__init__(ranks)
        # crossing (node -> the local GPUs of the concurrent crossing groups on it,
        # crossing_by_node): groups placed alike but crossed by other groups, or by groups
        # sitting otherwise on the NICs, on their nodes are priced apart. senders: one count for
        # every node, where crossing is not given (a pipeline send's pairs)
        self.crossing, self.senders = crossing, senders

        def key_of(g):
            counts = _node_counts(g, crossing, gpus_per_node) if crossing is not None else ()
            return self._placement(g, gpus_per_node), counts

        seen = {key_of(ranks)}
        self.peers = []
        for g in others:
            key = key_of(g)
            if key not in seen:
                seen.add(key)
                self.peers.append(list(g))

    @staticmethod
    def _placement(ranks, gpn: int) -> tuple:
        """The GPUs a group uses in each node it spans, the nodes' own numbers left out (the
        nodes of a system are alike); the order of the ranks kept (a send has a direction)."""
        first: dict = {}  # node -> its place among the group's nodes
        return tuple((first.setdefault(r // gpn, len(first)), r % gpn) for r in ranks)


def _accumulate(into: Phase, part: Phase) -> None:
    into.compute_ms += part.compute_ms
    into.comm_ms += part.comm_ms
    into.async_comm_ms += part.async_comm_ms
    into.kernels += part.kernels
    into.collectives += part.collectives
    into.seq_ms += part.seq_ms
    into.seq_host_ms += part.seq_host_ms
    if part.kernels:
        into.last_ms = part.last_ms


class AnalyticSource:
    """The analytic GPT layer (kit.parallel.gpt) as chunk_costs' source of blocks."""

    def __init__(self, spec: GPTSpec, layout: Layout):
        lay = layout
        b, dt = lay.micro_batch, lay.dtype
        self.spec, self.layer_blocks = spec, {}
        for layer in range(spec.layers):
            key = self.layer_key(layer)
            if key not in self.layer_blocks:
                fwd = layer_forward(spec, b, lay.tp, lay.ep, lay.sequence_parallel, dt, layer)
                self.layer_blocks[key] = (fwd, layer_backward(fwd, lay.tp, lay.sequence_parallel))
        sp = lay.sequence_parallel
        emb = embedding_forward(spec, b, lay.tp, dt, sp)
        # the embedding's TP all-reduce has an identity backward (Megatron's
        # reduce_from_tensor_model_parallel_region); with sequence parallelism its reduce-scatter
        # (reduce_scatter_to_sequence_parallel_region) has an all-gather, which had been dropped
        # with it. In backward order: the dropout's, the all-gather, the tables' weight gradients.
        # tied at pp 1: the head and the lookup share the weight on this rank (tied_head_wgrad)
        shared = bool(spec.tied) and lay.pp == 1
        self.embedding = (emb, embedding_backward(spec, b, lay.tp, dt, lay.grad_dtype, emb, shared))
        self.head = (head_forward(spec, b, lay.tp, dt, sp),
                     head_backward(spec, b, lay.tp, dt, sp, shared_embedding=shared))

    def layer_key(self, layer: int) -> tuple:
        """The layers that run alike: dense or MoE, and their sliding window (0: none; Qwen2's
        layers below max_window_layers attend in full, those from it on in the window)."""
        return self.spec.is_moe(layer), self.spec.window_of(layer)

    def layer(self, layer: int) -> tuple:
        return self.layer_blocks[self.layer_key(layer)]


def chunk_costs(spec: GPTSpec, layout: Layout, coster: Coster, source=None) -> list[ChunkCost]:
    """One ChunkCost per virtual stage (chunk-major: index = chunk · pp + stage). source: where
    the per-rank kernels come from (AnalyticSource by default, or an opgraph.GraphSource)."""
    lay = layout
    grad_bytes = lay.grad_bytes
    src = source or AnalyticSource(spec, lay)
    kinds = {key: (fwd, bwd, _recompute_blocks(fwd, lay.recompute))
             for key, (fwd, bwd) in src.layer_blocks.items()}
    emb, head = src.embedding, src.head
    extra = [emb[0], emb[1], head[0], head[1]]
    coster.predict_ops(op for group in list(kinds.values()) + [extra] for blocks in group
                       for blk in blocks for op in blk.ops)

    out = []
    n_virtual = lay.pp * lay.virtual_stages
    per_layer: dict = {}  # (layer kind, stage) -> (fwd Phase, bwd Phase, bwd compute ms)

    def layer_cost(k, stage: int):
        key = (k, stage)
        if key not in per_layer:
            fwd, bwd, rec = kinds[k]
            f, b = Phase(), Phase()
            coster.add(f, fwd, stage)
            t = coster.add(b, rec, stage) + coster.add(b, bwd, stage)
            per_layer[key] = (f, b, t)
        return per_layer[key]

    for vi, layers in enumerate(stage_layers(spec, lay)):
        stage = vi % lay.pp
        c = ChunkCost()
        if vi == 0:
            coster.add(c.fwd, emb[0], stage)
        for layer in layers:
            _accumulate(c.fwd, layer_cost(src.layer_key(layer), stage)[0])
        if vi == n_virtual - 1:
            coster.add(c.fwd, head[0], stage, gemm_factor=coster.head_factor)
            c.head_bwd_ms = coster.add(c.bwd, head[1], stage, gemm_factor=coster.head_factor)
            c.head_bwd_comm_ms = c.bwd.comm_ms
            c.head_bwd_async_comm_ms = c.bwd.async_comm_ms
        for layer in reversed(layers):
            _, b, t = layer_cost(src.layer_key(layer), stage)
            _accumulate(c.bwd, b)
            c.layer_bwd_ms.append(t)
            c.layer_bwd_comm_ms.append(b.comm_ms)
            c.layer_bwd_async_comm_ms.append(b.async_comm_ms)
            # expert weights are sharded over the EP group and reduced over the expert-DP group
            # (kit.parallel.build); the rest of the layer over the whole DP group
            dense, experts = layer_rank_params(spec, lay, layer)
            c.layer_grad_bytes.append(dense * grad_bytes)
            c.layer_expert_grad_bytes.append(experts * grad_bytes)
        if vi == 0:  # its own Phase: what _bucketed_backward's last bucket runs after the layers
            e = Phase()
            coster.add(e, emb[1], stage)
            _accumulate(c.bwd, e)
            c.emb_bwd_comm_ms, c.emb_bwd_async_comm_ms = e.comm_ms, e.async_comm_ms
        out.append(c)
    for stage in range(lay.pp):
        chunks = [out[c * lay.pp + stage] for c in range(lay.virtual_stages)]
        for ch in chunks:
            ch.expert_params = sum(ch.layer_expert_grad_bytes) / grad_bytes
            ch.params = sum(ch.layer_grad_bytes) / grad_bytes + ch.expert_params
        # the embedding sits on the stage's first chunk, the output layer and final norm on its
        # last (the one that runs them: with interleaving, virtual stage v * pp - 1, not chunk 0)
        first, last = edge_params(spec, lay, stage)
        chunks[0].params += first
        chunks[-1].params += last
    return out


def optimizer_ms(params: float, layout: Layout, coster: Coster, expert_params: float = 0.0) -> float:
    """Megatron-LM's mixed-precision optimizer step over the local (ZeRO-sharded) parameters, its
    passes in order (MixedPrecisionOptimizer.step; the distributed optimizer runs them on its
    shard), bytes a parameter:

        16-bit gradients   main_param.grad = main_grad.float(): read 2, write 4; none when they
                           are fp32 (Layout.grad_dtype; a bf16 model's main_grad by default),
                           where .float() is the tensor itself
        fp16               the loss scaler's unscale and inf check, in place: read 4, write 4
        clip-grad norm     the fp32 gradients' L2 norm (clip_grad 1.0 by default): read 4; the
                           rescale when it exceeds the limit is not counted
        Adam               read param, grad, m, v; write param, m, v (fp32): 28
        16-bit weights     the fp32 master weights copied to the model's: read 4, write 2

    Adam's 28 B had been the whole step: an fp16 model's is 52 B, a bf16 one's (fp32 gradients)
    38, an fp32 one's 32. params: the rank's parameters, expert_params of them its expert shard,
    which ZeRO shards over the expert-DP group (dp / ep ranks), the rest over the DP group."""
    from kit import ops

    n = int(zero_kept(params, expert_params, layout, 1))
    if n < 1:
        return 0.0
    steps = []
    if layout.grad_dtype != "fp32":  # 2-byte elements, 3 of them moved: 6 bytes
        steps.append(ops.Elementwise("cast", n, layout.grad_dtype, inputs=2))
    if layout.dtype == "fp16":
        steps.append(ops.Elementwise("mul", n, "fp32", inputs=1))
    steps += [ops.copy_of(4 * n), ops.Elementwise("add", n, "fp32", inputs=6)]
    if layout.dtype != "fp32":
        steps.append(ops.Elementwise("cast", n, layout.dtype, inputs=2))
    coster.predict_ops(steps)
    return sum(coster.op_ms(op) for op in steps)


def grad_buffer_zero_ms(params: float, layout: Layout, coster: Coster) -> float:
    """Megatron's DDP zero_grad_buffer() at the start of every iteration (train_step, before the
    first forward): one zero_() of each contiguous main_grad buffer (megatron-core 0.16.1
    distributed/distributed_data_parallel.py line 542 -> _ParamAndGradBuffer.reset,
    param_and_grad_buffer.py line 962, grad_data.zero_()), which holds a gradient for every
    parameter of the rank (its params / tp / pp share), in grad_dtype, with the distributed
    optimizer (zero 1) too, which reduce-scatters that buffer but keeps it whole. A fill: it
    writes params x grad bytes and reads nothing. ZeRO 2 and 3 (DeepSpeed, FSDP) keep no such
    buffer: 0 for them. The iteration had started with the first forward: GPT-3 175B at tp 8,
    pp 16 (bf16, fp32 gradients) zeroes 1.46 G gradients, 5.9 GB, a stage. 0 too for a layout
    without the optimizer step (Layout.optimizer_step False: forward, backward and the gradient
    sync only, what NeuSight's 4-GPU labels time, kit.parallel.neusight):
    the reset belongs to the step around them, and charging it there had moved the dp4 label's
    analytic error -4.47 -> -3.96% (captured graph -6.65 -> -6.14%) for a kernel it does not time."""
    from kit.workload.kernels import fill, leaf_ops

    n = int(params)
    if layout.zero >= 2 or not layout.optimizer_step or n < 1:
        return 0.0
    leaves = leaf_ops(fill(n, layout.grad_dtype, "zero grad buffer"))
    coster.predict_ops(leaf for leaf, _ in leaves)
    return sum(coster.op_ms(leaf, scale) for leaf, scale in leaves)
