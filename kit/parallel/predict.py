"""One verb: predict a multi-GPU training iteration (time, why, memory) for a model and layout."""
from __future__ import annotations

import time

from kit.errors import KitError
from kit.parallel.build import COMM_GROUPS, OTHER, DurationsOnly, HostModel, build_iteration
from kit.parallel.gpt import GPTSpec, parse_model
from kit.parallel.layout import Layout
from kit.parallel.memory import memory_per_rank, state_bytes
from kit.parallel.schedule import bubble_fraction
from kit.sim import simulate


def communication_by_group(res, rank: int) -> dict:
    """ms of communication on the critical path (followed across ranks, as the breakdown is)
    by the parallelism it serves: TP/EP collectives inside the passes, DP gradient and ZeRO
    collectives, pipeline sends and receives and the tied embedding's all-reduce between the
    first and last stages (pipeline). Each op's group is the one its builder recorded
    (kit.parallel.build: g.meta["comm_serves"]), never read from its label."""
    from kit.sim.critical import path_segments

    serves = res.graph.meta.get("comm_serves", {})
    out = {k: 0.0 for k in COMM_GROUPS}
    for seg in path_segments(res, rank, follow_ranks=True):
        if seg[3] == "communication":
            out[serves.get(seg[6], OTHER)] += float(seg[5] - seg[4])
    return out


def _note_idle_settings(spec, layout: Layout) -> None:
    """Notes for what a layout leaves uneven or idle, which the prediction prices as given:
    layers that pp stages cannot split evenly (Megatron asks for it by default), and ZeRO or
    gradient-overlap settings that dp 1 (or ZeRO-3's per-pass reduce-scatter) gives nothing to
    act on. (A layout on part of a node is a job on some of its GPUs; one that leaves whole
    nodes idle is refused by the caller.)"""
    import warnings

    stages = layout.pp * layout.virtual_stages
    base = spec.layers // stages
    if stages > 1 and base and spec.layers % stages:  # (none at all: refused by stage_layers)
        over = (f"pp {layout.pp} x {layout.virtual_stages} virtual stages = {stages} model chunks"
                if layout.virtual_stages > 1 else f"{stages} pipeline stages")
        warnings.warn(f"{spec.layers} layers do not split evenly over {over}: "
                      f"{spec.layers % stages} get {base + 1} layers, the others {base} (Megatron "
                      "needs an even split unless told otherwise)")
    if layout.dp == 1 and layout.zero:
        warnings.warn(f"ZeRO stage {layout.zero} (--zero) shards over the data-parallel ranks: "
                      "with dp 1 it changes nothing")
    if layout.dp == 1 and not layout.overlap_grad_reduce:
        warnings.warn("no gradient-reduction overlap (--no-overlap, overlap_grad_reduce=False): "
                      "with dp 1 there is no gradient reduction to overlap")
    elif layout.zero == 3 and not layout.overlap_grad_reduce:  # it had changed nothing, unsaid
        warnings.warn("no gradient-reduction overlap (--no-overlap, overlap_grad_reduce=False): "
                      "ZeRO stage 3 (FSDP) reduce-scatters each backward pass's gradients as the "
                      "pass ends, and this is priced so either way; it changes nothing")


def predict_parallel(model, system, layout: Layout, nodes: int | None = None, predictor="auto",
                     host: HostModel | None = None, calibration=None, keep=False,
                     graph="auto", in_stream: bool | None = None) -> dict:
    """Iteration time with its p10-p90 band (band_ms: the kernels' bands; collectives at their
    point prediction), critical-path breakdown and memory per rank.

    model: a GPTSpec, an inline shape ("gpt:layers=..,hidden=..,heads=..") or a GPT-style zoo
    name; system: a System or preset name (nodes: that many nodes of it); keep=True adds the
    SimResult under "_result" (for timelines and Perfetto export).
    graph: where the per-rank kernels come from. True: the model's op graph captured by
    kit.workload and sharded Megatron-style (kit.parallel.opgraph; MoE experts TP-sharded like
    any MLP); False: the analytic GPT layer (kit.parallel.gpt, the fast path for inline shapes);
    "auto": the captured graph for zoo models when the layout has no sequence or expert
    parallelism and the host profile was not fitted on the analytic layer (HostModel.kernels),
    else the analytic layer.
    in_stream: kernels without the learned predictor's isolated-kernel floor, as `kit predict
    --gpu` costs them. None: for the captured graph yes, for the analytic layer no (what each is
    validated with: kit.parallel.costs.IN_STREAM_BY_SOURCE); True/False force it.
    """
    from kit.hardware.system import System, get_system

    t0 = time.perf_counter()
    if not (graph is True or graph is False or graph == "auto"):  # 1 == True: not a choice
        raise KitError(f"graph must be True (the captured op graph), False (the analytic layer) or "
                       f"'auto', got {graph!r}")
    if in_stream is not None and not isinstance(in_stream, bool):
        raise KitError(f"in_stream must be True, False or None (by the kernels' source), got {in_stream!r}")
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
    sys_ = get_system(system, nodes=nodes)  # a System kept as given unless nodes are named
    need = -(-layout.world_size // sys_.gpus_per_node)
    if nodes is not None and nodes > need:  # the layout sits on the first nodes: the rest idle
        raise KitError(f"--nodes {nodes} gives {nodes * sys_.gpus_per_node} GPUs, but dp {layout.dp} "
                       f"x tp {layout.tp} x pp {layout.pp} = {layout.world_size} GPUs fill "
                       f"{need} node{'s' * (need > 1)}; raise dp, tp or pp to span the nodes, "
                       f"or give --nodes {need}")
    if sys_.nodes > need:  # a multi-node preset (-xN): said, as --nodes is refused above
        import re
        import warnings

        named = system if isinstance(system, str) else sys_.name
        one = re.sub(r"-x\d+$", "", named) if isinstance(system, str) else None
        warnings.warn(f"dp {layout.dp} x tp {layout.tp} x pp {layout.pp} = {layout.world_size} GPUs "
                      f"fill {need} of {named}'s {sys_.nodes} nodes; the other "
                      f"{sys_.nodes - need} idle and take no part"
                      + (f" (give {one} with --nodes {need} for just those)" if one and one != named else ""))
    _note_idle_settings(spec, layout)
    profile_kernels = getattr(host, "kernels", None)
    if profile_kernels not in (None, "analytic GPT layer"):
        raise KitError(f"host profile kernels must be 'analytic GPT layer' or None, got {profile_kernels!r}")
    # a profile fitted on the analytic layer's kernels (per-kernel host cost, scales) holds there
    # a capacity factor is the analytic layer's (GPTSpec.routed_rows): the captured graph routes dropless
    use_graph = graph is True or (graph == "auto" and spec.zoo is not None
                                  and not layout.sequence_parallel and layout.ep == 1
                                  and spec.capacity_factor is None and profile_kernels is None)
    if use_graph and spec.capacity_factor is not None:
        raise KitError(f"model {spec.name}: capacity_factor {spec.capacity_factor} is costed on the "
                       "analytic layer (graph=False / --kernels analytic); the captured op graph "
                       "runs its experts dropless")
    source = None
    if use_graph:
        from kit.parallel.opgraph import graph_source

        if spec.zoo is None:
            raise KitError(f"model {spec.name!r} is an inline shape: there is no op graph to "
                           "capture; use a zoo model name or graph=False")
        source = graph_source(spec, spec.zoo, layout)
    g, costs, coster = build_iteration(spec, layout, sys_, predictor, host, calibration, source,
                                       in_stream=in_stream)
    res = simulate(g)
    # the band: the same iteration with every kernel at the p10 (p90) end of its band, errors
    # taken as fully correlated as in kit.workload.iteration; collectives stay at their point.
    # A predictor asked for by name is passed by name again: the kernel-time cache is keyed by
    # the name (kit.parallel.costs), and the predictor object, its own key, had had every kernel
    # predicted a second time (0.12 s of a fresh process's 1.2 s for GPT-3 175B on 1,024 GPUs)
    again = predictor if isinstance(predictor, str) else coster.predictor
    band = [res.retimed_makespan_ms(build_iteration(spec, layout, sys_, again, host,
                                                    calibration, source, quantile=q,
                                                    graph_class=DurationsOnly,
                                                    in_stream=coster.in_stream)[0].dur_ms)
            for q in ("p10", "p90")]
    slow = res.slowest_rank()
    iteration_ms = res.makespan_ms
    # auto moved a zoo model off its captured graph (sequence or expert parallelism need the
    # analytic layer): the same layout without them costs other kernels
    switched = bool(graph == "auto" and spec.zoo is not None and not profile_kernels
                    and (layout.sequence_parallel or layout.ep > 1 or spec.capacity_factor is not None))
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
        "communication_by_group": communication_by_group(res, slow),
        "rank_breakdown": {"rank": slow, **res.breakdown(slow)},
        "ideal_bubble_fraction": bubble_fraction(layout.schedule, layout.pp, layout.micro_batches,
                                                 layout.virtual_stages),
        # by pipeline stage (its representative is rank stage x dp x tp: 0, 2, 4, ... when dp x tp = 2)
        "per_stage_ms": {st: res.rank_end_ms(layout.rank(st, 0, 0)) for st in range(layout.pp)},
        "per_microbatch_ms": [{"stage": i % layout.pp, "chunk": i // layout.pp,
                               "fwd_ms": c.fwd.compute_ms + c.fwd.comm_ms,
                               "bwd_ms": c.bwd.compute_ms + c.bwd.comm_ms,
                               "tp_ep_comm_ms": c.fwd.comm_ms + c.bwd.comm_ms,
                               # beside the backward's GEMMs on their own stream, whole (their
                               # excess over the GEMMs is in tp_ep_comm_ms and bwd_ms)
                               "tp_async_comm_ms": c.bwd.async_comm_ms}
                              for i, c in enumerate(costs)],
        "memory_per_rank": memory_per_rank(spec, layout, sys_.gpu),
        "state_bytes_per_param": dict(zip(("weights", "grads", "optimizer"), state_bytes(layout))),
        "simulated_ranks": len(g.ranks),
        "ops": len(g),
        "predictor": coster.predictor.name,
        "kernels_from": (f"captured op graph ({source.nodes} kernels per micro-batch)"
                         if source is not None else "analytic GPT layer"
                         + (" (the host profile was fitted on it)"
                            if graph == "auto" and spec.zoo is not None and profile_kernels else "")
                         + (" (sequence and expert parallelism and a MoE capacity factor are "
                            "costed on it alone; the same layout without them costs this zoo model's captured graph, other "
                            "kernels: compare runs with the same source, graph=False / --kernels "
                            "analytic)" if switched else "")),
        "kernels_switched": switched,
        "kernel_costing": {"in_stream": coster.in_stream, "isolation_floor_ms": coster.floor_ms,
                           "note": _costing_note(coster, layout, source is not None)},
        "seconds": time.perf_counter() - t0,
    }
    if keep:
        out["_result"] = res
    return out


def _costing_note(coster, layout: Layout, captured: bool) -> str:
    """How the kernels were costed, in words (and, for one GPU, how it compares with --gpu)."""
    ms = coster.floor_ms
    if coster.in_stream:
        text = (f"in the stream (the predictor's isolated-kernel floor ({1e3 * ms:.1f} us) taken out "
                "of each kernel, as `kit predict --gpu` does)" if ms > 0
                else "in the stream (this predictor has no isolated-kernel floor)")
    else:
        from kit.workload.kernel_times import isolation_floor_ms

        floor = isolation_floor_ms(coster.predictor, coster.gpu)
        text = ("isolated-kernel times, as the analytic layer is validated and fitted"
                + (f" (each keeps the predictor's {1e3 * floor:.1f} us floor)" if floor > 0 else ""))
    if layout.world_size == 1 and captured and coster.in_stream:
        text += ("; one GPU: `kit predict --gpu` costs the same kernels and differs only by "
                 "the loss (Megatron's vocab-parallel cross entropy here, torch's log-softmax and "
                 "NLL there)"
                 + (" and fused Adam step, with the zeroing of Megatron's gradient buffer before "
                    "the forward," if layout.optimizer_step else "")
                 + " here and its host costs (CpuOverhead there, --profile here)")
    elif layout.world_size == 1 and not captured:
        text += ("; one GPU: these are Megatron's fused layer's kernels, not the captured ones "
                 "`kit predict --gpu` costs in the stream")
    return text
