"""The DLRM hybrid (Naumov et al. 2019; Mudigere et al., ISCA 2022): embedding tables are
model-parallel (each table lives on one rank), the MLPs are data-parallel.

Per rank, per iteration of `batch` samples per rank (W ranks, global batch B·W):

    forward   bottom MLP on its B samples; lookups of its tables for all B·W samples;
              all-to-all: rank i sends rank j the pooled rows of i's tables for j's samples;
              feature interaction (pairwise dots) and top MLP on its B samples
    backward  top MLP and interaction; all-to-all of the pooled-row gradients (the reverse);
              embedding backward fused with its optimizer (FBGEMM TBE); bottom MLP; the MLP
              gradients are all-reduced on the communication stream as they are produced

The ranks are not symmetric (each holds different tables), so every rank is simulated; the
all-to-alls synchronise them, and a rank with heavy tables makes the others wait.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

from kit import ops
from kit.errors import KitError
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
        if not self.tables:
            raise KitError("DLRM needs at least one embedding table")
        for name in ("bottom", "top"):
            w = getattr(self, name)
            if not w or any(not _whole(x) or x < 1 for x in w):
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


def greedy_placement(tables, world: int) -> list[int]:
    """Largest-first onto the least-loaded rank, load = rows read per sample (pooling x dim)."""
    load = [0.0] * world
    where = [0] * len(tables)
    for i in sorted(range(len(tables)), key=lambda i: -tables[i].pooling * tables[i].dim):
        r = min(range(world), key=lambda k: load[k])
        where[i] = r
        load[r] += tables[i].pooling * tables[i].dim
    return where


def _rank(g: ExecGraph, r: int, run, cost: dict, local_r: list, emb_f_r: float, emb_b_r: float,
          a2a_ms: float, ar_ms: float) -> None:
    """One rank's DLRM iteration: MLPs on the compute stream, lookups, two all-to-alls and the
    MLP gradient all-reduce."""
    g.add_rank(r)
    bot = run(r, "bottom mlp", cost["bottom"])
    emb = run(r, "embedding lookup", (emb_f_r, 1)) if local_r else None
    a2a = run(r, "all-to-all pooled embeddings", (a2a_ms, 1), deps=(emb,) if local_r else (),
              stream="comm", kind="comm", group="a2a fwd")
    run(r, "interaction", cost["interaction"], deps=(a2a, bot))
    run(r, "top mlp", cost["top"])
    topb = run(r, "top mlp bwd", cost["top bwd"])
    ib = run(r, "interaction bwd", cost["interaction bwd"])
    a2ab = run(r, "all-to-all embedding grads", (a2a_ms, 1), deps=(ib,), stream="comm",
               kind="comm", group="a2a bwd")
    embb = run(r, "embedding bwd + update", (emb_b_r, 1), deps=(a2ab,)) if local_r else a2ab
    botb = run(r, "bottom mlp bwd", cost["bottom bwd"])
    ar = run(r, "all-reduce MLP grads", (ar_ms, 1), deps=(botb, topb), stream="comm", kind="comm")
    g.sync(r, [ar, embb, g.tail(r, "compute")], 0.0, "end of iteration")


def predict_dlrm(spec: DLRMSpec, system, batch: int, placement=None, predictor="auto",
                 launch_us: float = 10.0, optimizer: str = "rowwise_adagrad",
                 distribution=None, keep: bool = False) -> dict:
    """Iteration time per rank, critical path and memory of the DLRM hybrid on a System."""
    from kit.comm import predict_alltoallv, predict_collective
    from kit.embedding import lookup_cost
    from kit.hardware.system import get_system
    from kit.predict import get_predictor

    if not _whole(batch) or batch < 1:
        raise KitError(f"DLRM batch must be a positive whole number (samples per rank), got {batch!r}")
    batch = int(batch)
    if not 0 <= launch_us < float("inf"):
        raise KitError(f"launch_us must be a finite number >= 0, got {launch_us!r}")
    sys_ = get_system(system)
    W = sys_.world_size
    placement = list(placement) if placement is not None else greedy_placement(spec.tables, W)
    if len(placement) != len(spec.tables) or any(not _whole(p) or not 0 <= p < W
                                                                       for p in placement):
        raise KitError(f"placement must give a rank in 0..{W - 1} for each of the "
                       f"{len(spec.tables)} tables")
    placement = [int(p) for p in placement]
    gpu, dt = sys_.gpu, spec.dtype
    b = ops.dtype_bytes(dt)
    t = len(spec.tables) + 1
    bot_f, bot_b = _mlp(batch, spec.bottom, spec.dense_features, dt)
    top_f, top_b = _mlp(batch, spec.top, spec.dim + t * (t - 1) // 2, dt, final_act="sigmoid")
    inter_f = [ops.Gemm(m=t, n=t, k=spec.dim, b=batch, dtype=dt)]
    inter_b = [ops.Gemm(m=t, n=spec.dim, k=t, b=batch, dtype=dt)] * 2
    pred = get_predictor(predictor) if isinstance(predictor, str) else predictor
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
    emb_f = [lookup_cost(tb, batch * W, gpu, distribution).time_ms if tb else 0.0 for tb in local]
    emb_b = [lookup_cost(tb, batch * W, gpu, distribution, backward=True, optimizer=optimizer).time_ms
             if tb else 0.0 for tb in local]
    send = [[batch * sum(x.dim for x in local[i]) * b if i != j else 0.0 for j in range(W)]
            for i in range(W)]
    a2a_ms = predict_alltoallv(send, sys_).time_ms if W > 1 else 0.0
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
            _rank(g, r, run, cost, local[r], emb_f[r], emb_b[r], a2a_ms, ar_ms)
        return g

    res = simulate(iteration(bands["mid"]))
    band = [simulate(iteration(bands[q])).makespan_ms for q in ("p10", "p90")]
    slow = res.slowest_rank()
    emb_bytes = [sum(x.rows * x.dim * ops.dtype_bytes(x.dtype) for x in tb) for tb in local]
    opt_bytes = [sum(x.rows * 4 for x in tb) if optimizer == "rowwise_adagrad" else 0 for tb in local]
    mlp = spec.mlp_params() * b
    out = {"model": "dlrm", "system": sys_.key, "world_size": W, "batch_per_rank": batch,
           "iteration_ms": res.makespan_ms,
           "band_ms": [min(band[0], res.makespan_ms), max(band[1], res.makespan_ms)],
           "ranks": [{"rank": r, "ms": res.rank_end_ms(r), "tables": len(local[r]),
                      "embedding_fwd_ms": emb_f[r], "embedding_bwd_ms": emb_b[r],
                      "wait_ms": res.breakdown(r)["wait"]} for r in range(W)],
           "all_to_all_ms": a2a_ms, "allreduce_ms": ar_ms,
           "breakdown": {"rank": slow, **res.breakdown(slow)},
           "memory_per_rank": [{"rank": r, "embedding_gib": emb_bytes[r] / 2**30,
                                "embedding_optimizer_gib": opt_bytes[r] / 2**30,
                                "mlp_gib": 3 * mlp / 2**30, "total_gib":
                                (emb_bytes[r] + opt_bytes[r] + 3 * mlp) / 2**30} for r in range(W)],
           "placement": placement}
    if keep:
        out["_result"] = res
    return out
