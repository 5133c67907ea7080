"""The DLRM hybrid (Naumov et al. 2019; Mudigere et al., ISCA 2022): embedding tables are
model-parallel (each table lives on one rank), the MLPs are data-parallel.

Per rank, per iteration of `batch` samples per rank (W ranks, global batch B·W):

    forward   input all-to-all: rank j sends the owner of each table the indices and offsets of
              j's samples for it, on a stream of its own (TorchRec's data-dist stream) while
              the bottom MLP runs; the lookups wait for it;
              bottom MLP on its B samples; lookups of its tables for all B·W samples;
              all-to-all: rank i sends rank j the pooled rows of i's tables for j's samples;
              feature interaction (pairwise dots) and top MLP on its B samples
    backward  top MLP and interaction; all-to-all of the pooled-row gradients (the reverse);
              embedding backward fused with its optimizer (FBGEMM TBE); bottom MLP; the MLP
              gradients are all-reduced on the communication stream as they are produced

The ranks are not symmetric (each holds different tables), so every rank is simulated; the
all-to-alls synchronise them, and a rank with heavy tables makes the others wait.

The embedding side is priced by kit.sharding's model of the same table-wise plan
(ShardingModel.exact_cost): the lookups and their backward with the optimizer, the three
all-to-alls (indices, pooled rows, their gradients) and each rank's table and optimizer-state
bytes; `fits` holds those, the MLPs' state and the step's activations against its memory
cap. The default placement is kit.sharding's greedy baseline by dim x pooling, table-wise, onto
ranks with memory left.
"""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

from kit import ops
from kit.errors import KitError, real_number, yes_no
from kit.sim import ExecGraph, simulate


def _whole(x) -> bool:
    """A whole number (int or numpy integer), not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass(frozen=True)
class DLRMSpec:
    tables: tuple  # kit.embedding.Table, one per sparse feature
    dense_features: int = 13
    bottom: tuple = (512, 256, 128)
    top: tuple = (1024, 1024, 512, 256, 1)
    dtype: str = "fp32"

    def __post_init__(self):
        from kit.embedding import Table

        if not isinstance(self.tables, (list, tuple)):
            raise KitError(f"DLRM tables must be a tuple of kit.embedding.Table, got {self.tables!r}")
        if not self.tables:
            raise KitError("DLRM needs at least one embedding table")
        bad = [x for x in self.tables if not isinstance(x, Table)]
        if bad:
            raise KitError(f"DLRM tables must be kit.embedding.Table, got {bad[0]!r}")
        for name in ("bottom", "top"):
            w = getattr(self, name)
            if not isinstance(w, (list, tuple)) or not w or any(not _whole(x) or x < 1 for x in w):
                raise KitError(f"DLRM: the {name} MLP needs one or more positive whole widths, got {w!r}")
        if not _whole(self.dense_features) or self.dense_features < 1:
            raise KitError(f"DLRM: dense_features must be a positive whole number, got {self.dense_features!r}")
        if self.dtype not in ("fp16", "bf16", "fp32"):
            raise KitError(f"DLRM: dtype must be fp16, bf16 or fp32, got {self.dtype!r}")
        dims = {t.dim for t in self.tables}
        if len(dims) != 1 or self.bottom[-1] not in dims:
            raise KitError(f"DLRM: every table dim and the bottom MLP's last width must agree, got "
                           f"tables {sorted(dims)} and bottom {self.bottom[-1]}")

    @property
    def dim(self) -> int:
        return self.tables[0].dim

    def mlp_params(self) -> int:
        n, prev = 0, self.dense_features
        for w in self.bottom:
            n, prev = n + prev * w + w, w
        t = len(self.tables) + 1
        prev = self.dim + t * (t - 1) // 2
        for w in self.top:
            n, prev = n + prev * w + w, w
        return n


def _mlp(batch, widths, first, dtype, final_act=None):
    fwd, prev = [], first
    for i, w in enumerate(widths):
        fwd.append(ops.linear(batch, prev, w, dtype))
        fwd.append(ops.Elementwise("relu" if i < len(widths) - 1 or not final_act else final_act,
                                   batch * w, dtype))
        prev = w
    bwd = []
    for op in reversed(fwd):
        if isinstance(op, ops.Gemm):
            bwd += [ops.Gemm(m=op.m, n=op.k, k=op.n, dtype=dtype, kind="linear", shared_rhs=True),
                    ops.Gemm(m=op.k, n=op.n, k=op.m, dtype=dtype, kind="linear", shared_rhs=True)]
        else:
            bwd.append(ops.Elementwise("mul", op.numel, dtype))
    return fwd, bwd


def greedy_placement(tables, world, model=None) -> list[int]:
    """kit.sharding's greedy_dim_pooling baseline, table-wise: largest dim x pooling first onto
    the least-loaded rank (load = rows read per sample) with memory left for the table and its
    optimizer state. `model`: a table-wise kit.sharding.ShardingModel of these tables (its memory
    cap). Without one (world: the number of ranks) memory is not checked, and the rule reduces to
    largest-first onto the least-loaded rank, lowest rank on a tie, as kit.sharding's greedy does."""
    if model is not None:
        from kit.sharding.search import GREEDY_KEYS, greedy

        choice = greedy(model, GREEDY_KEYS["greedy_dim_pooling"])
        return [model.options[t][o].ranks[0] for t, o in enumerate(choice)]
    load, where = [0.0] * world, [0] * len(tables)
    for i in sorted(range(len(tables)), key=lambda i: -tables[i].dim * tables[i].pooling):
        where[i] = min(range(world), key=lambda r: (load[r], r))
        load[where[i]] += tables[i].dim * tables[i].pooling
    return where


def sharding_model(tables, system, batch: int, optimizer: str = "rowwise_adagrad",
                   distribution=None, memory_cap_gib: float | None = None):
    """kit.sharding's model of `tables` placed table-wise on `system` at `batch` samples per rank;
    `distribution` is given to the tables without one of their own (as lookup_cost does)."""
    from kit.embedding.distributions import parse_distribution
    from kit.sharding import ShardingModel

    if distribution is not None:
        d = parse_distribution(distribution)
        tables = [t if t.distribution is not None else dataclasses.replace(t, distribution=d)
                  for t in tables]
    if memory_cap_gib is not None:
        memory_cap_gib = real_number(memory_cap_gib, "memory_cap_gib (GiB per GPU)", strict=True)
        if memory_cap_gib * 2**30 > system.gpu.usable_memory_bytes:  # as kit.sharding.plan_sharding
            raise KitError(f"memory_cap_gib {memory_cap_gib:g} GiB per GPU is more than "
                           f"{system.gpu.key}'s {system.gpu.memory_text()}; give at most that")
    return ShardingModel(list(tables), system, batch=int(batch), optimizer=optimizer, kinds=("tw",),
                         memory_cap_bytes=memory_cap_gib * 2**30 if memory_cap_gib else None)


def activation_bytes(spec: DLRMSpec, batch: int, world: int, local_tables) -> int:
    """The peak of the tensors one rank holds in a training step, in bytes. Held from the
    forward to the backward: the dense features and each bottom MLP layer's ReLU output at
    spec.dtype for its `batch` samples (a Linear saves its input, which is the previous layer's
    ReLU output, the same tensor: counted once), and the int64 indices and offsets of its own
    tables for all world x batch samples (the embedding backward reads them). On top of those,
    the larger of two phases that are never live together: the top side (the interaction's
    stacked features, which its bmm saves, the concatenated output the first top Linear saves,
    and each top layer's activation output), held from the interaction to its backward; and the
    pooled rows in flight, fp32 (kit.sharding's OUT_BYTES), those of its own tables for all
    world x batch samples and those it receives for its samples, one per table, or their
    gradients on the way back: they live from the lookup to the interaction and from the
    interaction's backward to the embedding backward, and no autograd node keeps them.
    Workspaces and the allocator's slack are not counted. Without this count a step fitted at
    any batch: 16 tables of 500,000 x 128 (pooling 20) on a DGX A100 at two million samples a
    rank, whose activations are 51 GiB a rank, fitted in 0.5 GiB of a 40 GB card."""
    from kit.sharding.model import INDEX_BYTES, OUT_BYTES

    b = ops.DTYPE_BYTES[spec.dtype]
    t = len(spec.tables) + 1
    top_in = spec.dim + t * (t - 1) // 2
    held = (batch * b * (spec.dense_features + sum(spec.bottom))
            + world * batch * sum(INDEX_BYTES * (x.pooling + 1) for x in local_tables))
    top_side = batch * b * (t * spec.dim + top_in + sum(spec.top))
    in_flight = OUT_BYTES * spec.dim * batch * (world * len(local_tables) + len(spec.tables))
    return int(held + max(top_side, in_flight))


def _rank(g: ExecGraph, r: int, run, cost: dict, local_r: list, emb_f_r: float, emb_b_r: float,
          comm: dict, ar_ms: float) -> None:
    """One rank's DLRM iteration: MLPs on the compute stream, lookups, three all-to-alls and the
    MLP gradient all-reduce."""
    g.add_rank(r)
    idx = run(r, "all-to-all indices", (comm["input"], 1), stream="input dist", kind="comm",
              group="a2a idx")
    bot = run(r, "bottom mlp", cost["bottom"])
    emb = run(r, "embedding lookup", (emb_f_r, 1), deps=(idx,)) if local_r else None
    a2a = run(r, "all-to-all pooled embeddings", (comm["output"], 1), deps=(emb,) if local_r else (),
              stream="comm", kind="comm", group="a2a fwd")
    run(r, "interaction", cost["interaction"], deps=(a2a, bot))
    run(r, "top mlp", cost["top"])
    topb = run(r, "top mlp bwd", cost["top bwd"])
    ib = run(r, "interaction bwd", cost["interaction bwd"])
    a2ab = run(r, "all-to-all embedding grads", (comm["grad"], 1), deps=(ib,), stream="comm",
               kind="comm", group="a2a bwd")
    embb = run(r, "embedding bwd + update", (emb_b_r, 1), deps=(a2ab,)) if local_r else a2ab
    botb = run(r, "bottom mlp bwd", cost["bottom bwd"])
    ar = run(r, "all-reduce MLP grads", (ar_ms, 1), deps=(botb, topb), stream="comm", kind="comm",
             group="mlp allreduce")
    g.sync(r, [ar, embb, g.tail(r, "compute")], 0.0, "end of iteration")


def predict_dlrm(spec: DLRMSpec, system, batch: int, placement=None, predictor="auto",
                 launch_us: float = 10.0, optimizer: str = "rowwise_adagrad",
                 distribution=None, keep: bool = False, memory_cap_gib: float | None = None) -> dict:
    """Iteration time per rank, critical path and memory of the DLRM hybrid on a System.

    The embedding side is kit.sharding's ShardingModel.exact_cost of the table-wise plan (see
    the module docstring); `fits` says whether every rank's total (its tables, their optimizer
    state, the MLPs' weights, gradients and optimizer state, and the step's activations:
    activation_bytes) fits its memory cap
    (kit.sharding's: 0.9 of the GPU's memory, or memory_cap_gib). The greedy placement packs the
    tables against the cap as kit.sharding does, without the MLPs. The pooled rows and their
    gradients travel in fp32 whatever spec.dtype (kit.sharding's OUT_BYTES: TorchRec's default
    output dtype), and the indices as int64."""
    from kit.comm import predict_collective
    from kit.hardware.system import get_system
    from kit.predict import get_predictor
    from kit.sharding import Option

    if not isinstance(spec, DLRMSpec):
        raise KitError(f"spec must be a DLRMSpec, got {spec!r}")
    if not _whole(batch) or batch < 1:
        raise KitError(f"DLRM batch must be a positive whole number (samples per rank), got {batch!r}")
    batch = int(batch)
    launch_us, keep = real_number(launch_us, "launch_us"), yes_no(keep, "keep")
    pred = get_predictor(predictor) if isinstance(predictor, str) else predictor
    if not hasattr(pred, "predict"):
        raise KitError(f"predictor must be a name (auto, wave, roofline, ...) or a kit predictor, "
                       f"got {predictor!r}")
    sys_ = get_system(system)
    W = sys_.world_size
    model = sharding_model(spec.tables, sys_, batch, optimizer, distribution, memory_cap_gib)
    if placement is None:
        placement = greedy_placement(spec.tables, W, model)
    else:
        try:
            placement = list(placement)
        except TypeError:
            raise KitError(f"placement must be a list of ranks, one per table, got {placement!r}") from None
    if len(placement) != len(spec.tables) or any(not _whole(p) or not 0 <= p < W
                                                                       for p in placement):
        raise KitError(f"placement must give a rank in 0..{W - 1} for each of the "
                       f"{len(spec.tables)} tables")
    placement = [int(p) for p in placement]
    plan = model.exact_cost([opts.index(Option("tw", (p,))) for opts, p in zip(model.options, placement)])
    gpu, dt = sys_.gpu, spec.dtype
    b = ops.dtype_bytes(dt)
    t = len(spec.tables) + 1
    bot_f, bot_b = _mlp(batch, spec.bottom, spec.dense_features, dt)
    top_f, top_b = _mlp(batch, spec.top, spec.dim + t * (t - 1) // 2, dt, final_act="sigmoid")
    inter_f = [ops.Gemm(m=t, n=t, k=spec.dim, b=batch, dtype=dt)]
    inter_b = [ops.Gemm(m=t, n=spec.dim, k=t, b=batch, dtype=dt)] * 2
    groups = {"bottom": bot_f, "bottom bwd": bot_b, "top": top_f, "top bwd": top_b,
              "interaction": inter_f, "interaction bwd": inter_b}
    allops = [op for v in groups.values() for op in v]
    frame = pred.predict(allops, gpu)
    # the MLPs' kernels at their latency and at either end of their band (p10, p90; the latency
    # for a predictor without one); lookups and collectives keep their point prediction
    bands = {q: dict(zip(allops, frame[col].astype(float) if col in frame else frame.latency_ms))
             for q, col in (("mid", "latency_ms"), ("p10", "latency_p10_ms"),
                            ("p90", "latency_p90_ms"))}
    local = [[spec.tables[i] for i in range(len(spec.tables)) if placement[i] == r] for r in range(W)]
    emb_f, emb_b = plan["fwd_ms"], plan["bwd_ms"]
    comm = {"input": plan["input_alltoall_ms"], "output": plan["output_alltoall_ms"],
            "grad": plan["grad_alltoall_ms"]}
    ar_ms = predict_collective("allreduce", spec.mlp_params() * b, sys_).time_ms if W > 1 else 0.0
    lu = launch_us / 1e3

    def iteration(ms) -> ExecGraph:
        cost = {k: (sum(ms[o] for o in v), len(v)) for k, v in groups.items()}
        g = ExecGraph("dlrm")

        def run(r, name, ms_k, deps=(), stream="compute", kind="compute", group=None):
            k = max(ms_k[1], 1)
            return g.gpu(r, stream, ms_k[0], name, kind=kind, launch_ms=k * lu, deps=deps,
                         group=group)

        for r in range(W):
            _rank(g, r, run, cost, local[r], emb_f[r], emb_b[r], comm, ar_ms)
        return g

    res = simulate(iteration(bands["mid"]))
    band = [simulate(iteration(bands[q])).makespan_ms for q in ("p10", "p90")]
    slow = res.slowest_rank()
    emb_bytes = [sum(x.bytes for x in tb) for tb in local]
    opt_bytes = [m - e for m, e in zip(plan["memory_bytes"], emb_bytes)]  # kit.sharding's count
    mlp = spec.mlp_params() * b
    act_bytes = [activation_bytes(spec, batch, W, local[r]) for r in range(W)]
    total = [emb_bytes[r] + opt_bytes[r] + 3 * mlp + act_bytes[r] for r in range(W)]
    out = {"model": "dlrm", "system": sys_.key, "world_size": W, "batch_per_rank": batch,
           "iteration_ms": res.makespan_ms,
           "band_ms": [min(band[0], res.makespan_ms), max(band[1], res.makespan_ms)],
           "ranks": [{"rank": r, "ms": res.rank_end_ms(r), "tables": len(local[r]),
                      "embedding_fwd_ms": emb_f[r], "embedding_bwd_ms": emb_b[r],
                      "wait_ms": res.breakdown(r)["wait"]} for r in range(W)],
           "all_to_all_ms": comm["output"], "grad_all_to_all_ms": comm["grad"],
           "input_all_to_all_ms": comm["input"], "embedding_comm_ms": sum(comm.values()),
           "allreduce_ms": ar_ms,
           "breakdown": {"rank": slow, **res.breakdown(slow)},
           "memory_per_rank": [{"rank": r, "embedding_gib": emb_bytes[r] / 2**30,
                                "embedding_optimizer_gib": opt_bytes[r] / 2**30,
                                "mlp_gib": 3 * mlp / 2**30, "activation_gib": act_bytes[r] / 2**30,
                                "total_gib": total[r] / 2**30,
                                "fits": total[r] <= model.cap} for r in range(W)],
           "memory_cap_gib": model.cap / 2**30, "fits": max(total) <= model.cap,
           "placement": placement}
    if keep:
        out["_result"] = res
    return out
