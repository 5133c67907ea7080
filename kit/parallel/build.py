"""Build the execution graph of one training iteration of a GPT-style model on a layout.

The ranks of one pipeline stage (its DP x TP ranks) run identical work, so each stage is
simulated once by a representative (rank pp_index · dp · tp) that stands for all of them. TP and
EP collectives are inside a stage: they cost their predicted time on the compute stream, where
Megatron waits for them, except the column-parallel backward's asynchronous ones, which run on
a "tp comm" stream beside the GEMMs and cost the compute stream only their excess over them. Pipeline sends and receives are collectives of two stages: a stage that
reaches a receive before its neighbour sends waits, which is the pipeline bubble.

Per (micro-batch, chunk) pass the CPU launches the pass's kernels (HostModel.launch_us each) and
the GPU runs them. The pass is three GPU ops: a head that can start once the first kernel is
launched, the TP/EP communication, and the last kernel, which cannot start before all kernels
are launched. So a pass ends at max(first launch + GPU time, last launch + last kernel): right
both when the GPU is the bottleneck and when the host is.

Data parallelism: in the last micro-batch's backward, gradient buckets are all-reduced on the
communication stream as their layers finish (overlap), then the optimizer steps. ZeRO-1
reduce-scatters the gradients and all-gathers the updated weights; ZeRO-2, which keeps 1/dp of
the gradients, reduce-scatters them in every micro-batch's backward, not only the last, and
the next pass waits for them (DeepSpeed's gradient epilogue);
ZeRO-3 (FSDP) all-gathers each chunk's weights before its forward and backward and
reduce-scatters its gradients after. With sequence parallelism each stage's TP group then
all-reduces the gradients of the weights it keeps whole while their inputs are sequence-split
(norms, row-parallel biases: tp_norm_grad_bytes), as it does Qwen3's q/k norm weights with or
without it, and with pp > 1 and a tied LM head the first
and last stages all-reduce the word embedding's gradient (embedding_sync_bytes), before the
optimizer step.
"""
from __future__ import annotations

from dataclasses import dataclass

from kit.parallel.costs import (IN_STREAM_BY_SOURCE, ChunkCost, Coster, chunk_costs, grad_buffer_zero_ms,
                                optimizer_ms)
from kit.parallel.gpt import GPTSpec, vocab_per_rank
from kit.parallel.layout import Layout
from kit.parallel.memory import stage_layers, tp_replicated_params
from kit.parallel.schedule import schedule
from kit.sim import ExecGraph

# the parallelism a communication op serves (kit.parallel.predict.communication_by_group)
TP_EP, DP, PIPELINE, OTHER = "tensor/expert parallel", "data parallel", "pipeline", "other"
COMM_GROUPS = (TP_EP, DP, PIPELINE, OTHER)


def _serves(g: ExecGraph, group: str, op: int) -> int:
    """Record in g.meta["comm_serves"] that communication op `op` serves `group`; returns op."""
    g.meta.setdefault("comm_serves", {})[op] = group
    return op


@dataclass(frozen=True)
class HostModel:
    """What the framework adds to the kernels.

    launch_us         CPU time to issue one kernel (framework dispatch + cudaLaunchKernel)
    collective_us     CPU time to issue one collective (process-group call + NCCL launch)
    p2p_sync          the host waits for each pipeline receive (Megatron synchronises after p2p)
    step_overhead_ms  fixed host work per iteration (grad norm, loss scaling, logging)
    gemm_scale, other_scale   achieved/predicted kernel time for GEMMs and for the other kernels
                      (1 = trust the predictor; a fitted profile corrects its bias)
    microbatch_ms     host work per forward micro-batch on a stage outside the layers' kernels
                      (Megatron's forward_step: get_batch and its TP broadcast, loss bookkeeping)
    collective_rank_us  extra issue/arrival cost of a collective per additional rank in its
                      group (the ranks' hosts meet at every TP all-reduce)
    full_vocab_scale  achieved/predicted time of the LM head's GEMMs when the vocabulary is not
                      split over TP ranks (vTrain's A100 runs: about 2x slower than the same
                      GEMMs split by TP, which run at the predicted speed)
    tp_comm_scale     achieved/predicted time of the TP/EP collectives inside a pass (the
                      collective curves are timed back to back, as nccl-tests does; in a layer
                      each one starts between compute kernels and waits out its group's skew)
    predictor         the kernel predictor a fitted profile was fitted with (used for "auto")
    kernels           the kernel source a fitted profile was fitted with ("analytic GPT layer":
                      its launch_us and scales are per fused Megatron kernel, so graph="auto"
                      costs zoo models on that layer too; None: either source)
    """

    launch_us: float = 10.0
    collective_us: float = 10.0
    p2p_sync: bool = True
    step_overhead_ms: float = 0.0
    gemm_scale: float = 1.0
    other_scale: float = 1.0
    microbatch_ms: float = 0.0
    collective_rank_us: float = 0.0
    full_vocab_scale: float = 1.0
    tp_comm_scale: float = 1.0
    predictor: str | None = None
    kernels: str | None = None


def _pass(g: ExecGraph, r: int, ph, label: str, host: HostModel, deps=(), tag=None):
    """Launch + run one pass; returns (first GPU op, last GPU op).

    The host thread spends the pass's own issue time (host_total_ms) and is then free for what
    comes next, as a real host runs ahead of the GPU. The kernel-by-kernel race between launches
    and kernels (Phase.paced_ms) is a separate op on the rank's "launch race" lane, from the
    first launch on: from an idle GPU the pass ends exactly when that race ends; from a busy GPU
    it ends after the GPU's own work. The structure never depends on the kernels' times."""
    lu = host.launch_us / 1e3
    last = min(ph.last_ms, ph.compute_ms)
    launch = g.cpu(r, lu, label, kind="launch", tag=tag)
    prev = g.tail(r, "compute")
    head = g.gpu(r, "compute", ph.compute_ms - last, label, deps=(launch,) + tuple(deps), tag=tag)
    rest = g.cpu(r, max(ph.host_total_ms - lu, 0.0), label, kind="launch", tag=tag)
    race = max(ph.paced_ms() - lu - last, 0.0) if ph.seq_ms else 0.0
    pace = g.cpu(r, race, label + " launch race", thread="launch race", deps=(launch,), kind="launch",
                 tag=tag)
    # the race overlaps the GPU's work; kit.sim.critical counts as cpu only its part past it
    g.meta.setdefault("paced", set()).add(pace)
    side = _async_tp_comm(g, r, ph.async_comm_ms, label, (launch, prev, *deps), tag)
    if ph.comm_ms > 0 or ph.async_comm_ms > 0:  # (by structure: kernel times may hide it all)
        _serves(g, TP_EP, g.gpu(r, "compute", ph.comm_ms, label + " tp/ep comm", kind="comm", tag=tag))
    tail = g.gpu(r, "compute", last, label, deps=(rest, pace, *side), tag=tag)
    return head, tail


def _async_tp_comm(g, r, ms: float, label: str, deps, tag) -> tuple:
    """The pass's asynchronous TP collectives (Megatron's column-parallel backward: the input
    gradient's all-reduce or reduce-scatter beside the wgrad GEMM, sequence parallelism's
    re-gather beside the dgrad GEMM; kit.parallel.gpt._column_backward) on the TP communicator's
    own stream, from the pass's start, lumped as the pass's kernels are. Each collective's excess
    over the GEMM beside it is already on the compute stream (Phase.comm_ms), so this op ends
    before the pass's last kernel, which waits for it: returns (op,), or () when there is none."""
    if ms <= 0:
        return ()
    return (_serves(g, TP_EP, g.gpu(r, "tp comm", ms, label + " async tp comm",
                                    kind="comm", deps=tuple(d for d in deps if d >= 0), tag=tag)),)


class DurationsOnly(ExecGraph):
    """An ExecGraph that records only each op's duration (and the resource tails a builder asks
    for). The iteration's structure does not depend on the kernels' times, so re-costing a
    built graph at another quantile needs only these (SimResult.retimed_makespan_ms)."""

    def _add(self, rank, resource, kind, label, dur_ms, deps=(), group=None, tag=None) -> int:
        self.dur_ms.append(dur_ms)
        self._tail[(rank, resource)] = i = len(self.dur_ms) - 1
        return i

    def gpu(self, rank, stream, dur_ms, label, kind="compute", launch_ms=None, deps=(),
            thread="cpu", group=None, tag=None) -> int:
        if launch_ms is not None:
            self._add(rank, thread, "launch", label, launch_ms)
        return self._add(rank, stream, kind, label, dur_ms)

    def cpu(self, rank, dur_ms, label="cpu", thread="cpu", deps=(), kind="cpu", tag=None) -> int:
        return self._add(rank, thread, kind, label, dur_ms)

    def sync(self, rank, on, dur_ms=0.0, label="sync", thread="cpu", tag=None) -> int:
        return self._add(rank, thread, "sync", label, dur_ms)


def build_iteration(spec: GPTSpec, layout: Layout, system, predictor="auto",
                    host: HostModel | None = None, calibration=None, source=None,
                    quantile: str = "mid", graph_class=ExecGraph, in_stream: bool | None = None):
    """(ExecGraph, chunk costs, Coster) for one iteration. source: the per-rank kernels (None:
    the analytic GPT layer; a kit.parallel.opgraph.GraphSource: a captured, TP-sharded graph).
    quantile: every kernel at its predicted latency ("mid") or at one end of its band
    ("p10", "p90"; kit.parallel.costs.Coster). graph_class=DurationsOnly builds only the
    durations. in_stream: kernels in the stream, without the learned predictor's isolated-kernel
    floor (None: for a captured op graph, not for the analytic layer; see Coster)."""
    host = host or HostModel()
    lay = layout
    lay.check_system(system)
    if predictor == "auto" and host.predictor:
        predictor = host.predictor
    if in_stream is None:  # by source: kit.parallel.costs.IN_STREAM_BY_SOURCE
        in_stream = IN_STREAM_BY_SOURCE["analytic GPT layer" if source is None else "captured op graph"]
    elif not isinstance(in_stream, bool):
        from kit.errors import KitError

        raise KitError(f"in_stream must be True, False or None (by the kernels' source), got {in_stream!r}")
    coster = Coster(lay, system, predictor, calibration, host, quantile, in_stream)
    costs: list[ChunkCost] = chunk_costs(spec, lay, coster, source)
    pp, v, m = lay.pp, lay.virtual_stages, lay.micro_batches
    n_virtual = pp * v
    act_bytes = pipeline_message_bytes(spec, lay)
    wbytes, gbytes = lay.weight_bytes, lay.grad_bytes
    g = graph_class(f"{spec.name} {lay.dp}x{lay.tp}x{lay.pp}")
    g.meta.update(model=spec.to_dict(), layout=lay.to_dict(), system=system.key)

    # the tied embedding's gradient all-reduce between the first and the last stage
    # (embedding_sync_bytes): one pair of ranks per (dp, tp) index, the slowest placement priced,
    # all of them at once: those crossing nodes share the NICs (a pcie8 pair at tp 8 gets 2/8 of a
    # NIC; it had been priced on a whole one)
    emb_bytes = embedding_sync_bytes(spec, lay)
    embedding_sync_ms = coster.comm_ms("allreduce", emb_bytes, coster.pp_pair(0, pp - 1, both_ways=True)) \
        if emb_bytes else 0.0

    links: dict = {}

    def link_ms(vi: int) -> float:
        """Point-to-point time between virtual stages vi and vi + 1."""
        if vi not in links:
            a, b = vi % pp, (vi + 1) % pp
            links[vi] = coster.comm_ms("sendrecv", act_bytes, coster.pp_pair(a, b))
        return links[vi]

    for stage in range(pp):
        r = g.add_rank(lay.rank(stage, 0, 0), members=lay.stage_ranks(stage))
        dp_group = coster.group("dp", stage)
        order = schedule(lay.schedule, stage, pp, m, v)
        last_b = {c: max(i for i, (ph, _, cc) in enumerate(order) if ph == "B" and cc == c)
                  for c in range(v)}
        grad_ops = []
        # zero_grad_buffer() before the first forward (grad_buffer_zero_ms)
        zero_ms = grad_buffer_zero_ms(sum(costs[c * pp + stage].params for c in range(v)), lay, coster)
        if zero_ms > 0:
            g.gpu(r, "compute", zero_ms, "zero grad buffer", launch_ms=host.launch_us / 1e3)
        for idx, (phase, mb, c) in enumerate(order):
            vi = c * pp + stage
            cost = costs[vi]
            deps = []
            fwd = phase == "F"
            src = vi - 1 if fwd else vi + 1
            if 0 <= src < n_virtual:
                key = ("act", mb, vi - 1) if fwd else ("grad", mb, vi)
                prev = g.tail(r, "compute")  # posted in program order, after the last pass
                rv = _serves(g, PIPELINE, g.collective(
                    r, "recv-fwd" if fwd else "recv-bwd", link_ms(min(src, vi)),
                    "recv " + ("activation" if fwd else "gradient"), group=key,
                    deps=(prev,) if prev >= 0 else (), tag=(phase, mb, c)))
                deps.append(rv)
                if host.p2p_sync:
                    g.sync(r, [rv], 0.0, "sync after p2p", tag=(phase, mb, c))
            if lay.zero == 3 and lay.dp > 1:
                ag = _serves(g, DP, g.gpu(r, "comm", _sharded_comm_ms(
                    coster, "allgather", cost.params, cost.expert_params, wbytes, stage),
                    "fsdp all-gather weights", kind="comm", tag=(phase, mb, c)))
                deps.append(ag)
            label = f"{phase}{mb}" + (f".{c}" if v > 1 else "")
            if fwd and host.microbatch_ms > 0:
                g.cpu(r, host.microbatch_ms, label + " host", kind="cpu", tag=(phase, mb, c))
            ph = cost.fwd if fwd else cost.bwd
            # gradients are reduced after the last backward of a chunk; a rank that keeps only its
            # 1/dp of them (ZeRO-2, ZeRO-3) cannot accumulate the others, so it reduce-scatters
            # after every backward (DeepSpeed's engine: "ZeRO stage >= 2 communicates during non
            # gradient accumulation boundaries as well"; FSDP without no_sync)
            every_pass = lay.zero >= 2
            issued = len(grad_ops)
            if not fwd and (idx == last_b[c] or every_pass) and lay.dp > 1 and lay.overlap_grad_reduce \
                    and lay.zero < 3:
                tail = _bucketed_backward(g, r, cost, label, host, deps, lay, coster, dp_group,
                                          grad_ops, (phase, mb, c))
            else:
                _, tail = _pass(g, r, ph, label, host, deps, (phase, mb, c))
                if not fwd and every_pass and lay.dp > 1:
                    grad_ops.append(_serves(g, DP, g.gpu(r, "comm", _sharded_comm_ms(
                        coster, "reducescatter", cost.params, cost.expert_params, gbytes, stage),
                        "fsdp reduce-scatter grads" if lay.zero == 3 else "zero-2 reduce-scatter grads",
                        kind="comm", deps=(tail,), tag=(phase, mb, c))))
            if lay.zero == 2 and len(grad_ops) > issued:
                # DeepSpeed ends every ZeRO-2 backward in its gradient epilogue, which reduces the
                # last bucket and, with overlap_comm, synchronises the device before the partition
                # is accumulated (stage_1_and_2.py, independent_gradient_partition_epilogue); without
                # overlap_comm the reductions run on the compute stream. Either way the next pass
                # starts after them: left to the comm stream, the next micro-batch's forward had
                # hidden them (6.7B GPT, seq 1024, dp 16 on two DGX A100s, 8 micro-batches, bf16:
                # 1875.6 ms, the same as ZeRO-1's single reduction; 2045.4 ms with the wait)
                g.sync(r, grad_ops[issued:], 0.0, "zero-2 gradient epilogue", tag=(phase, mb, c))
            dst = vi + 1 if fwd else vi - 1
            if 0 <= dst < n_virtual:
                key = ("act", mb, vi) if fwd else ("grad", mb, vi - 1)
                _serves(g, PIPELINE, g.collective(
                    r, "send-fwd" if fwd else "send-bwd", link_ms(min(dst, vi)),
                    "send " + ("activation" if fwd else "gradient"), group=key,
                    deps=(tail,), tag=(phase, mb, c)))
        sp_bytes = tp_norm_grad_bytes(spec, lay, stage)
        sp_ms = coster.comm_ms("allreduce", sp_bytes, coster.group("tp", stage)) if sp_bytes else 0.0
        _finish(g, r, stage, lay, costs, coster, dp_group, grad_ops, host, embedding_sync_ms, sp_ms)
    return g, costs, coster


def pipeline_message_bytes(spec: GPTSpec, lay: Layout) -> float:
    """Bytes each rank of a stage sends the next stage (an activation) or the previous one (its
    gradient) per micro-batch: [s, b, h] in the model's dtype, s / tp of the tokens with sequence
    parallelism. Megatron-core's schedules.get_tensor_shapes divides the sequence by the TP size
    only under sequence_parallel, and its p2p_communication sends that tensor whole; the older
    Megatron-LM's scatter_gather_tensors_in_pipeline (send 1/tp of it, all-gather it over TP on
    arrival) is gone from Megatron-core. The kit had divided by tp without sequence parallelism
    too, and priced no all-gather: GPT-3 175B's message at tp 8, micro-batch 1, fp16 is 48 MiB a
    rank, not 6."""
    nbytes = lay.micro_batch * spec.seq * spec.hidden * (4 if lay.dtype == "fp32" else 2)
    return nbytes / lay.tp if lay.sequence_parallel else nbytes


def tp_norm_grad_bytes(spec: GPTSpec, lay: Layout, stage: int) -> float:
    """Bytes of the gradients a stage's TP group all-reduces after backward: under sequence
    parallelism those of every weight it keeps whole (below), and with or without it those of
    Qwen3's q/k norms (GPTSpec.qk_norm_params); 0 at tp 1.

    Megatron-core 0.16.1's _allreduce_non_tensor_model_parallel_grads
    (distributed/finalize_model_grads.py lines 353-356) sums over the TP group a parameter that
    is `sequence_parallel` under config.sequence_parallel, or, under config.qk_layernorm, one
    named q_layernorm or k_layernorm: each rank's q/k norm weight, whole on every rank
    (memory.tp_replicated_params), has seen its own heads only. The kit had all-reduced neither
    without sequence parallelism, and not the q/k norms with it (Qwen3-8B at tp 8 without SP:
    36 layers x 2 x 128 fp32 gradients, 36,864 bytes a step, now all-reduced).

    With SP a rank runs the norms and the row-parallel linears' bias adds on its 1/tp of the
    tokens, so its gradients of those replicated weights are partial sums over the sequence.
    Megatron marks them `sequence_parallel` and, after the DP sync and before the embedding
    group's, all-reduces them over the TP group, flattened into one buffer (finalize_model_grads
    -> _allreduce_layernorm_grads; Korthikanti et al. 2022, section 4.2.2). Per layer: its two
    norms' weights and biases and the attention output projection's bias, and a dense layer's
    second MLP bias, as GPTSpec.layer_params counts them; a MoE layer's router weight (experts x
    hidden) in its place: Megatron-core's Router marks it `sequence_parallel` too (it routes the
    rank's 1/tp of the tokens before the dispatcher gathers them), left out it had been 8 x
    4,096 of Mixtral's weights a MoE layer. The last stage adds the final norm and BERT's LM-head
    transform (GPTSpec.pretraining_heads): its dense h x h weight and bias and its LayerNorm's
    weight and bias, h^2 + 3h, run on the rank's 1/tp of the tokens and marked
    `sequence_parallel` (megatron-core 0.16.1 models/bert/bert_lm_head.py lines 36-37 for the
    dense; the FusedLayerNorm it builds, fusions/fused_layer_norm.py lines 116-120), which the
    kit had left out (bert-large: 1,051,648 weights, 4.2 MB at fp32). The pooler and the binary
    head are not marked: the pooler all-gathers the sequence first (pooler.py lines 43-46) and
    both then see every token on every rank. In the gradient dtype (main_grad). GPT-3 175B at
    tp 8, pp 8: 12 layers x 6 x 12,288 x 4 bytes = 3.5 MB a stage."""
    if lay.tp == 1 or not (lay.sequence_parallel or spec.qk_norm):
        return 0.0
    virtual = stage_layers(spec, lay)
    layers = [i for c in range(lay.virtual_stages) for i in virtual[c * lay.pp + stage]]
    if not lay.sequence_parallel:
        return len(layers) * spec.qk_norm_params * lay.grad_bytes
    params = sum(tp_replicated_params(spec, i) for i in layers)
    if stage == lay.pp - 1:
        h = spec.hidden
        params += spec.norm_params + (h * h + 3 * h if spec.pretraining_heads else 0)
    return params * lay.grad_bytes


def embedding_sync_bytes(spec: GPTSpec, lay: Layout) -> float:
    """Bytes of the tied word embedding's gradient that the first and last pipeline stages
    all-reduce each iteration (0 when there is nothing to sync: untied, or pp 1).

    With pp > 1 and tied input/output embeddings Megatron-LM keeps a copy of the word embedding
    on the last stage too and, after the data-parallel gradient sync and before the optimizer
    step, all-reduces the two copies' gradients over the "embedding group", rank (0, d, t) with
    rank (pp - 1, d, t) (Narayanan et al. SC'21; Megatron's finalize_model_grads ->
    _allreduce_embedding_grads / _allreduce_word_embedding_grads). It moves this rank's shard of
    the padded vocabulary, [padded vocab / tp, hidden], in the gradient dtype (main_grad)."""
    if lay.pp == 1 or not spec.tied:
        return 0.0
    return vocab_per_rank(spec.vocab, lay.tp) * spec.hidden * lay.grad_bytes


def _sharded_comm_ms(coster, kind: str, params: float, experts: float, nbytes_each: float,
                     stage: int) -> float:
    """A collective over a rank's parameters (ZeRO's, or the gradients' in one pass): the dense
    ones over the DP group, its expert shard over the expert-DP group (the ranks that hold the
    same experts), one after the other."""
    ms = coster.comm_ms(kind, (params - experts) * nbytes_each, coster.group("dp", stage))
    edp = coster.group("edp", stage)
    return ms + (coster.comm_ms(kind, experts * nbytes_each, edp) if experts > 0 and len(edp) > 1 else 0.0)


def _bucketed_backward(g, r, cost: ChunkCost, label, host, deps, lay, coster, dp_group, grad_ops,
                       tag):
    """A backward that reduces its gradients (a chunk's last; every one under ZeRO-2), in the
    order it runs: the LM head's backward (last chunk),
    then the layers, split at gradient-bucket boundaries, each bucket its layers' compute and then
    their TP/EP collectives on the compute stream, then the embedding's backward (first chunk).
    Each bucket's all-reduce (ZeRO-1/2: reduce-scatter) starts on the comm stream when its layers,
    collectives included, are done."""
    kind = "reducescatter" if lay.zero in (1, 2) else "allreduce"
    lu = host.launch_us / 1e3
    ph = cost.bwd
    layer_comm = cost.layer_bwd_comm_ms or [0.0] * len(cost.layer_bwd_ms)
    layer_async = cost.layer_bwd_async_comm_ms or [0.0] * len(cost.layer_bwd_ms)
    # the embedding's backward: what the head and the layers leave; its comm as costed
    # (ChunkCost.emb_bwd_*), not left over too: the rounding of that subtraction (3.95e-14 ms
    # at p10, -3.46e-14 at mid for Mixtral-8x7b bf16 at dp 2, tp 8, ep 2 on two pcie8 nodes,
    # gpt3-13b at dp 2, tp 4 on pcie8 alike) had added a bucket's "tp/ep comm" op at one
    # quantile and not another, and the band's re-time refused the graph (242 durations, 241 ops)
    tail_ms = max(ph.compute_ms - sum(cost.layer_bwd_ms) - cost.head_bwd_ms, 0.0)
    tail_comm_ms, tail_async_ms = cost.emb_bwd_comm_ms, cost.emb_bwd_async_comm_ms
    # [compute ms, comm ms, gradient bytes (dense), expert gradient bytes, async comm ms]
    expert_bytes = cost.layer_expert_grad_bytes or [0.0] * len(cost.layer_bwd_ms)
    buckets, acc = [], [0.0, 0.0, 0.0, 0.0, 0.0]
    for t_ms, c_ms, nbytes, ebytes, a_ms in zip(cost.layer_bwd_ms, layer_comm, cost.layer_grad_bytes,
                                                expert_bytes, layer_async):
        acc = [acc[0] + t_ms, acc[1] + c_ms, acc[2] + nbytes, acc[3] + ebytes, acc[4] + a_ms]
        if acc[2] + acc[3] >= lay.bucket_bytes:
            buckets.append(acc)
            acc = [0.0, 0.0, 0.0, 0.0, 0.0]
    buckets.append([acc[0] + tail_ms, acc[1] + tail_comm_ms, acc[2], acc[3], acc[4] + tail_async_ms])
    rest_bytes = cost.params * lay.grad_bytes - sum(b[2] + b[3] for b in buckets)
    if rest_bytes > 0:  # embedding / head gradients travel in the last bucket
        buckets[-1][2] += rest_bytes
    kernels_per_bucket = max(ph.kernels // len(buckets), 1)
    tail = -1
    if cost.head_bwd_ms > 0 or cost.head_bwd_comm_ms > 0 or cost.head_bwd_async_comm_ms > 0:
        launch = g.cpu(r, lu, label, kind="launch", tag=tag)
        prev = g.tail(r, "compute")
        tail = g.gpu(r, "compute", cost.head_bwd_ms, f"{label} head", deps=(launch,) + tuple(deps),
                     tag=tag)
        side = _async_tp_comm(g, r, cost.head_bwd_async_comm_ms, f"{label} head", (launch, prev, *deps),
                              tag)
        # what follows the head waits for its async collectives, which end by the end of its
        # exposed part (head_bwd_comm_ms holds each one's excess over its GEMM). The exposed part
        # waiting for them had counted that excess twice once they outlast the head's kernels
        # (a TP group across nodes: tiny GEMMs beside a 0.059 ms all-reduce took 0.118 ms)
        deps = side
        if cost.head_bwd_comm_ms > 0 or cost.head_bwd_async_comm_ms > 0:
            tail = _serves(g, TP_EP, g.gpu(r, "compute", cost.head_bwd_comm_ms, f"{label} head tp comm",
                                          kind="comm", tag=tag))
    edp_group = coster.group("edp", lay.stage_of(dp_group[0]))
    for k, (t_ms, c_ms, nbytes, ebytes, a_ms) in enumerate(buckets):
        # as _pass: the bucket's kernels start once the first is launched and run while the
        # host launches the rest; its last kernel (a kernel's share of it) waits for them all.
        # Waiting for every launch first had serialised a small model's whole backward behind
        # its launches: gpt2 at dp 2, tp 2, pp 2 took 28.2 ms overlapped against 24.6 without
        # The host's issue time is the pass's (host_total_ms, as _pass spends), a bucket's share.
        # Its layers' TP/EP collectives run among its kernels, as in _pass, not after its last
        # kernel: behind the launches they had added their time to the step's (gpt2 as above:
        # 25.7 ms overlapped against 24.6 without)
        last = t_ms / kernels_per_bucket
        launch = g.cpu(r, lu, label, kind="launch", tag=tag)
        prev = g.tail(r, "compute")
        g.gpu(r, "compute", t_ms - last, f"{label} bucket {k} (as launched)", deps=(launch,) + tuple(deps),
              tag=tag)
        side = _async_tp_comm(g, r, a_ms, f"{label} bucket {k}", (launch, prev, *deps), tag)
        if c_ms > 0 or a_ms > 0:
            _serves(g, TP_EP, g.gpu(r, "compute", c_ms, f"{label} bucket {k} tp/ep comm", kind="comm", tag=tag))
        rest = g.cpu(r, max(ph.host_total_ms / len(buckets) - lu, 0.0), label, kind="launch", tag=tag)
        tail = g.gpu(r, "compute", last, f"{label} bucket {k}", deps=(rest, *side), tag=tag)
        deps = ()
        grad_ops.append(_serves(g, DP, g.gpu(r, "comm", coster.comm_ms(kind, nbytes, dp_group),
                                             f"dp {kind} bucket {k}", kind="comm", deps=(tail,), tag=tag)))
        if ebytes > 0 and len(edp_group) > 1:  # the experts' gradients, over their replicas
            grad_ops.append(_serves(g, DP, g.gpu(r, "comm", coster.comm_ms(kind, ebytes, edp_group),
                                                 f"expert-dp {kind} bucket {k}", kind="comm", deps=(tail,),
                                                 tag=tag)))
    return tail


def _finish(g, r, stage, lay, costs, coster, dp_group, grad_ops, host, embedding_sync_ms=0.0,
            sp_norm_ms=0.0):
    """Gradient sync not yet issued, the norm-gradient all-reduce over the TP group
    (tp_norm_grad_bytes; sp_norm_ms its time, 0: none), the tied embedding's all-reduce
    between the first and last stages (embedding_sync_bytes; embedding_sync_ms its time), the
    optimizer step, and ZeRO's weight all-gather."""
    chunks = [costs[c * lay.pp + stage] for c in range(lay.virtual_stages)]
    params = sum(ch.params for ch in chunks)
    experts = sum(ch.expert_params for ch in chunks)
    if lay.dp > 1 and not grad_ops:  # no overlap: one pass over all gradients after backward
        kind = "reducescatter" if lay.zero in (1, 2) else "allreduce"
        tail = g.tail(r, "compute")
        grad_ops.append(_serves(g, DP, g.gpu(r, "comm", _sharded_comm_ms(coster, kind, params, experts,
                                                                         lay.grad_bytes, stage),
                                             f"dp {kind} gradients", kind="comm",
                                             deps=(tail,) if tail >= 0 else ())))
    if sp_norm_ms > 0:
        # after the DP sync and before the embedding group's, as finalize_model_grads runs them;
        # on the compute stream, where the optimizer step waits for it
        tail = g.tail(r, "compute")
        grad_ops.append(_serves(g, TP_EP, g.gpu(
            r, "compute", sp_norm_ms, ("sequence-parallel norm grads all-reduce" if lay.sequence_parallel
                                       else "qk-norm grads all-reduce"), kind="comm",
            launch_ms=host.collective_us / 1e3, deps=tuple(grad_ops) + ((tail,) if tail >= 0 else ()))))
    if embedding_sync_ms > 0 and stage in (0, lay.pp - 1):
        # after the DP sync (finish_grad_sync), as Megatron's finalize_model_grads runs it; the
        # two stages meet here, so the last stage's optimizer step waits for the first's backward
        tail = g.tail(r, "compute")
        grad_ops.append(_serves(g, PIPELINE, g.collective(
            r, "comm", embedding_sync_ms, "tied embedding grads all-reduce (first + last stage)",
            group=("embedding grads",), ranks=(lay.rank(0, 0, 0), lay.rank(lay.pp - 1, 0, 0)),
            launch_ms=host.collective_us / 1e3,
            deps=tuple(grad_ops) + ((tail,) if tail >= 0 else ()))))
    if not lay.optimizer_step:
        if grad_ops:
            g.sync(r, grad_ops, 0.0, "wait for gradients")
        return
    opt = g.gpu(r, "compute", optimizer_ms(params, lay, coster, experts), "optimizer step",
                launch_ms=host.launch_us / 1e3, deps=tuple(grad_ops))
    if lay.zero in (1, 2) and lay.dp > 1:
        _serves(g, DP, g.gpu(r, "comm", _sharded_comm_ms(coster, "allgather", params, experts, lay.weight_bytes,
                                                         stage),
                             "zero all-gather weights", kind="comm", deps=(opt,)))
    if host.step_overhead_ms > 0:
        g.cpu(r, host.step_overhead_ms, "step overhead")
