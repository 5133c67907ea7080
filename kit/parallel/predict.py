"""One verb: predict a multi-GPU training iteration (time, why, memory) for a model and layout."""
from __future__ import annotations

import time

from kit.errors import KitError
from kit.parallel.build import DurationsOnly, HostModel, build_iteration
from kit.parallel.gpt import GPTSpec, parse_model
from kit.parallel.layout import Layout
from kit.parallel.memory import memory_per_rank
from kit.parallel.schedule import bubble_fraction
from kit.sim import simulate


def predict_parallel(model, system, layout: Layout, nodes: int | None = None, predictor="auto",
                     host: HostModel | None = None, calibration=None, keep=False,
                     graph="auto") -> dict:
    """Iteration time with its p10-p90 band (band_ms: the kernels' bands; collectives at their
    point prediction), critical-path breakdown and memory per rank.

    model: a GPTSpec, an inline shape ("gpt:layers=..,hidden=..,heads=..") or a GPT-style zoo
    name; system: a System or preset name (nodes: that many nodes of it); keep=True adds the
    SimResult under "_result" (for timelines and Perfetto export).
    graph: where the per-rank kernels come from. True: the model's op graph captured by
    kit.workload and sharded Megatron-style (kit.parallel.opgraph; MoE experts TP-sharded like
    any MLP); False: the analytic GPT layer (kit.parallel.gpt, the fast path for inline shapes);
    "auto": the captured graph for zoo models when the layout has no sequence or expert
    parallelism, else the analytic layer.
    """
    from kit.hardware.system import System, get_system

    t0 = time.perf_counter()
    if graph not in (True, False, "auto"):
        raise KitError(f"graph must be True (the captured op graph), False (the analytic layer) or "
                       f"'auto', got {graph!r}")
    if not isinstance(model, (GPTSpec, str)):
        raise KitError(f"model must be a zoo name, an inline gpt:... shape or a GPTSpec, got {model!r}")
    spec = model if isinstance(model, GPTSpec) else parse_model(model)
    if layout.sequence_parallel and spec.seq % layout.tp:
        raise KitError(f"sequence parallelism splits the sequence over --tp {layout.tp}: seq {spec.seq} "
                       "is not a multiple of it")
    if layout.ep > 1 and not spec.experts:
        raise KitError(f"--ep {layout.ep}: {spec.name} has no experts; expert parallelism needs a MoE model")
    if layout.ep > 1 and spec.experts % layout.ep:
        raise KitError(f"--ep {layout.ep} must divide the {spec.experts} experts of {spec.name}")
    if not isinstance(system, (str, System)):
        raise KitError(f"system must be a preset name (see `kit systems`) or a System, got {system!r}")
    sys_ = get_system(system, nodes=nodes) if isinstance(system, str) or nodes else system
    use_graph = graph is True or (graph == "auto" and spec.zoo is not None
                                  and not layout.sequence_parallel and layout.ep == 1)
    source = None
    if use_graph:
        from kit.parallel.opgraph import graph_source

        if spec.zoo is None:
            raise KitError(f"model {spec.name!r} is an inline shape: there is no op graph to "
                           "capture; use a zoo model name or graph=False")
        source = graph_source(spec, spec.zoo, layout)
    g, costs, coster = build_iteration(spec, layout, sys_, predictor, host, calibration, source)
    res = simulate(g)
    # the band: the same iteration with every kernel at the p10 (p90) end of its band, errors
    # taken as fully correlated as in kit.workload.iteration; collectives stay at their point
    band = [res.retimed_makespan_ms(build_iteration(spec, layout, sys_, coster.predictor, host,
                                                    calibration, source, quantile=q,
                                                    graph_class=DurationsOnly)[0].dur_ms)
            for q in ("p10", "p90")]
    slow = res.slowest_rank()
    iteration_ms = res.makespan_ms
    tokens = layout.batch * spec.seq
    # model FLOPs per iteration (no recompute), Kaplan et al.; a MoE token runs its top-k experts only
    flops = 6.0 * spec.active_params * tokens
    peak = sys_.gpu.gemm_peak_tflops(layout.dtype) or 0.0  # MFU is against the matrix peak
    out = {
        "model": spec.to_dict(),
        "system": sys_.key,
        "gpu": sys_.gpu_key,
        "layout": layout.to_dict(),
        "iteration_ms": iteration_ms,
        "band_ms": [min(band[0], iteration_ms), max(band[1], iteration_ms)],
        "tokens_per_s": tokens / (iteration_ms / 1e3) if iteration_ms > 0 else None,
        "mfu": flops / (iteration_ms / 1e3) / (peak * 1e12 * layout.world_size)
        if iteration_ms > 0 and peak else None,
        "breakdown": {"rank": slow, **res.breakdown(slow, follow_ranks=True)},
        "rank_breakdown": {"rank": slow, **res.breakdown(slow)},
        "ideal_bubble_fraction": bubble_fraction(layout.schedule, layout.pp, layout.micro_batches,
                                                 layout.virtual_stages),
        # by pipeline stage (its representative is rank stage x dp x tp: 0, 2, 4, ... when dp x tp = 2)
        "per_stage_ms": {st: res.rank_end_ms(layout.rank(st, 0, 0)) for st in range(layout.pp)},
        "per_microbatch_ms": [{"stage": i % layout.pp, "chunk": i // layout.pp,
                               "fwd_ms": c.fwd.compute_ms + c.fwd.comm_ms,
                               "bwd_ms": c.bwd.compute_ms + c.bwd.comm_ms,
                               "tp_ep_comm_ms": c.fwd.comm_ms + c.bwd.comm_ms}
                              for i, c in enumerate(costs)],
        "memory_per_rank": memory_per_rank(spec, layout, sys_.gpu),
        "simulated_ranks": len(g.ranks),
        "ops": len(g),
        "predictor": coster.predictor.name,
        "kernels_from": (f"captured op graph ({source.nodes} kernels per micro-batch)"
                         if source is not None else "analytic GPT layer"),
        "seconds": time.perf_counter() - t0,
    }
    if keep:
        out["_result"] = res
    return out
