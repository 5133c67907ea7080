"""What one micro-batch costs in one pipeline chunk on one rank: compute, TP/EP communication,
kernel launches, and the parameters whose gradients it produces.

Every distinct kernel shape is predicted once (the predictor dedupes), so a 96-layer model
costs as much as one layer of each kind.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kit.parallel.gpt import Block, GPTSpec, backward_of, embedding_forward, head_forward, layer_forward
from kit.parallel.layout import Layout
from kit.parallel.memory import local_params, stage_layers

ATTENTION_CORE = ("attention", "softmax", "dropout")
# predictions are pure functions of (predictor, GPU, op) and (system, collective): cache them
# across calls so sweeps over layouts pay for each distinct shape once
_OP_CACHE: dict = {}
_COMM_CACHE: dict = {}


@dataclass
class Phase:
    compute_ms: float = 0.0
    comm_ms: float = 0.0
    kernels: int = 0
    collectives: int = 0
    last_ms: float = 0.0  # the last kernel's time (the GPU cannot finish before it is launched)
    seq_ms: list = field(default_factory=list)  # every kernel's time, in launch order
    seq_coll: list = field(default_factory=list)  # True where that kernel is a collective

    def paced_ms(self, launch_ms: float, collective_ms: float) -> float:
        """Time from the first launch to the last kernel's end when the GPU starts idle and the
        host issues kernel i after h_i (launch_ms, or collective_ms for a collective):
        end_i = max(end_(i-1), h_0 + ... + h_i) + k_i."""
        key = (launch_ms, collective_ms, len(self.seq_ms))
        memo = getattr(self, "_paced", None)
        if memo and memo[0] == key:
            return memo[1]
        end, t = 0.0, 0.0
        for k, c in zip(self.seq_ms, self.seq_coll):
            t += collective_ms if c else launch_ms
            end = (end if end > t else t) + k
        self._paced = (key, end)
        return end

    def host_ms(self, launch_ms: float, collective_ms: float) -> float:
        """Host time to issue every kernel of the phase."""
        return (self.kernels - self.collectives) * launch_ms + self.collectives * collective_ms


@dataclass
class ChunkCost:
    fwd: Phase = field(default_factory=Phase)
    bwd: Phase = field(default_factory=Phase)
    layer_bwd_ms: list = field(default_factory=list)  # per layer, backward order
    layer_grad_bytes: list = field(default_factory=list)  # per layer, backward order
    params: float = 0.0


def _recompute_blocks(fwd: list[Block], how: str) -> list[Block]:
    if how == "full":
        return fwd
    if how == "selective":  # only the attention core (scores, softmax, dropout, ·V)
        core = [op for blk in fwd for op in blk.ops
                if op.op_class in ATTENTION_CORE or (op.op_class == "gemm" and op.b > 1)]
        return [Block("recompute attention", core)]
    return []


class Coster:
    """Predicts blocks on a GPU and collectives on a system, caching both."""

    def __init__(self, layout: Layout, system, predictor="auto", calibration=None, host=None):
        from kit.predict import get_predictor

        self.layout, self.system = layout, system
        self.gpu = system.gpu
        self.predictor = get_predictor(predictor) if isinstance(predictor, str) else predictor
        self.calibration = calibration
        self.gemm_scale = getattr(host, "gemm_scale", 1.0)
        self.other_scale = getattr(host, "other_scale", 1.0)
        self._op_ms = _OP_CACHE.setdefault((self.predictor.name, self.gpu.key), {})
        self._comm_ms = _COMM_CACHE.setdefault((system, str(calibration)), {})

    def predict_ops(self, ops) -> None:
        new = [op for op in dict.fromkeys(ops) if op not in self._op_ms]
        if new:
            frame = self.predictor.predict(new, self.gpu)
            self._op_ms.update(zip(new, frame.latency_ms.astype(float)))

    def op_ms(self, op) -> float:
        return self._op_ms[op] * (self.gemm_scale if op.op_class == "gemm" else self.other_scale)

    def comm_ms(self, kind: str, nbytes: float, ranks) -> float:
        if len(ranks) < 2 or nbytes <= 0:
            return 0.0
        key = (kind, float(nbytes), tuple(ranks))
        if key not in self._comm_ms:
            from kit.comm import predict_collective

            self._comm_ms[key] = predict_collective(kind, nbytes, self.system, ranks=list(ranks),
                                                    calibration=self.calibration).time_ms
        return self._comm_ms[key]

    def group(self, name: str, stage: int) -> list[int]:
        lay = self.layout
        return {"tp": lay.tp_group(stage), "ep": lay.ep_group(stage), "dp": lay.dp_group(stage)}[name]

    def add(self, phase: Phase, blocks: list[Block], stage: int, factors: bool = False) -> float:
        """Add blocks to a phase; returns their compute ms."""
        total = 0.0
        for blk in blocks:
            if blk.comm is not None:
                kind, nbytes, group = blk.comm
                ms = self.comm_ms(kind, nbytes, self.group(group, stage))
                if ms > 0:
                    phase.comm_ms += ms
                    phase.kernels += 1
                    phase.collectives += 1
                    phase.seq_ms.append(ms)
                    phase.seq_coll.append(True)
                continue
            f = blk.bwd_factor if factors and blk.bwd_factor else [1.0] * len(blk.ops)
            for op, k in zip(blk.ops, f):
                t = self.op_ms(op) * k
                total += t
                phase.last_ms = t
                phase.seq_ms.append(t)
                phase.seq_coll.append(False)
            phase.kernels += len(blk.ops)
        phase.compute_ms += total
        return total


def _accumulate(into: Phase, part: Phase) -> None:
    into.compute_ms += part.compute_ms
    into.comm_ms += part.comm_ms
    into.kernels += part.kernels
    into.collectives += part.collectives
    into.seq_ms += part.seq_ms
    into.seq_coll += part.seq_coll
    if part.kernels:
        into.last_ms = part.last_ms


def chunk_costs(spec: GPTSpec, layout: Layout, coster: Coster) -> list[ChunkCost]:
    """One ChunkCost per virtual stage (chunk-major: index = chunk · pp + stage)."""
    lay = layout
    b, dt, sp = lay.micro_batch, lay.dtype, lay.sequence_parallel
    grad_bytes = 4 if dt == "fp32" else 2
    kinds = {}
    for layer in range(spec.layers):
        moe = spec.is_moe(layer)
        if moe not in kinds:
            fwd = layer_forward(spec, b, lay.tp, lay.ep, sp, dt, layer)
            bwd = [backward_of(blk) for blk in reversed(fwd)]
            kinds[moe] = (fwd, bwd, _recompute_blocks(fwd, lay.recompute))
    emb = embedding_forward(spec, b, lay.tp, dt)
    head = head_forward(spec, b, lay.tp, dt)
    extra = [emb, [backward_of(x) for x in emb], head, [backward_of(x) for x in reversed(head)]]
    coster.predict_ops(op for group in list(kinds.values()) + [extra] for blocks in group
                       for blk in blocks for op in blk.ops)
    out = []
    n_virtual = lay.pp * lay.virtual_stages
    per_layer: dict = {}  # (moe, stage) -> (fwd Phase, bwd Phase, bwd compute ms)

    def layer_cost(moe: bool, stage: int):
        key = (moe, stage)
        if key not in per_layer:
            fwd, bwd, rec = kinds[moe]
            f, b = Phase(), Phase()
            coster.add(f, fwd, stage)
            t = coster.add(b, rec, stage) + coster.add(b, bwd, stage, factors=True)
            per_layer[key] = (f, b, t)
        return per_layer[key]

    for vi, layers in enumerate(stage_layers(spec, lay)):
        stage = vi % lay.pp
        c = ChunkCost()
        if vi == 0:
            coster.add(c.fwd, emb, stage)
        for layer in layers:
            _accumulate(c.fwd, layer_cost(spec.is_moe(layer), stage)[0])
        if vi == n_virtual - 1:
            coster.add(c.fwd, head, stage)
            coster.add(c.bwd, extra[3], stage, factors=True)
        for layer in reversed(layers):
            _, b, t = layer_cost(spec.is_moe(layer), stage)
            _accumulate(c.bwd, b)
            c.layer_bwd_ms.append(t)
            c.layer_grad_bytes.append(spec.layer_params(layer) / lay.tp * grad_bytes)
        if vi == 0:
            coster.add(c.bwd, extra[1], stage, factors=True)
        out.append(c)
    for stage in range(lay.pp):
        total = local_params(spec, lay, stage)
        chunks = [out[c * lay.pp + stage] for c in range(lay.virtual_stages)]
        layer_sum = sum(sum(ch.layer_grad_bytes) for ch in chunks) / grad_bytes
        for ch in chunks:  # embedding/head parameters go to the chunk that owns them
            ch.params = sum(ch.layer_grad_bytes) / grad_bytes
        chunks[0].params += max(total - layer_sum, 0.0)
    return out


def optimizer_ms(params: float, layout: Layout, coster: Coster) -> float:
    """Adam over the local (ZeRO-sharded) fp32 state: read param, grad, m, v; write param, m, v."""
    from kit import ops

    n = int(params / (layout.dp if layout.zero >= 1 else 1))
    if n < 1:
        return 0.0
    op = ops.Elementwise("add", n, "fp32", inputs=6)
    coster.predict_ops([op])
    return coster.op_ms(op)
