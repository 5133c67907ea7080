"""Guards for rules of kit.parallel (memory, schedules, chunk costs, the iteration graph, the GPT
layer), kit.embedding's lookup cost and kit.sharding's plan model that no other test pinned.

Every expectation is derived here, from a closed form written out below (with its source), from
an invariant, or from a second public function; none is a number the code printed.
"""
import math

import numpy as np
import pytest

from kit.parallel import GPTSpec, HostModel, Layout, memory_per_rank, parse_model
from kit.parallel.schedule import bubble_fraction, in_flight, schedule
from sharding_support import StandInComm, StandInSystem

GIB = 2**30
NO_HOST = HostModel(launch_us=0.0, p2p_sync=False)


def gpt_layer_params(h: int, f: int | None = None) -> int:
    """A GPT-2 style layer: QKV (3h^2 + 3h), out projection (h^2 + h), MLP (2hf + f + h) and two
    LayerNorms with weight and bias (2 x 2h)."""
    f = f or 4 * h
    return (3 * h * h + 3 * h) + (h * h + h) + (2 * h * f + f + h) + 4 * h


def gpt_layer_rank_params(h: int, t: int) -> float:
    """One TP rank's share of gpt_layer_params: the weights and the column-parallel biases
    (QKV's 3h, the first MLP's f) split t ways; the two LayerNorms (4h) and the row-parallel
    biases (out projection's h, second MLP's h) whole on every rank, as Megatron holds them."""
    kept = 4 * h + 2 * h
    return (gpt_layer_params(h) - kept) / t + kept


def flash_layer_acts(s: int, b: int, h: int, t: int) -> float:
    """Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
    Table 2, tensor parallel only: s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes of 2-byte activations;
    flash attention never stores the a*s^2 score terms, leaving s*b*h*(10 + 24/t)."""
    return s * b * h * (10 + 24 / t)


# ---------------------------------------------------------------------------------------------
# kit.parallel.memory
# ---------------------------------------------------------------------------------------------

SPEC = GPTSpec(layers=4, hidden=1024, heads=16, seq=512, vocab=32000, name="guard")


def test_full_recompute_with_sequence_parallelism_stores_inputs_split_over_tp():
    """Full recompute keeps only each layer's input, 2*s*b*h bytes (Korthikanti et al. 2022,
    Table 2); with sequence parallelism that input is split over the t ranks: 2*s*b*h/t."""
    from kit.parallel.memory import activation_bytes_per_layer

    s, b, h, t = SPEC.seq, 2, SPEC.hidden, 4
    sp = Layout(tp=t, micro_batch=b, recompute="full", sequence_parallel=True, dtype="fp16")
    plain = Layout(tp=t, micro_batch=b, recompute="full", dtype="fp16")
    assert activation_bytes_per_layer(SPEC, sp) == pytest.approx(2 * s * b * h / t)
    assert activation_bytes_per_layer(SPEC, plain) == pytest.approx(2 * s * b * h)


def test_last_stage_activations_include_fp32_logits_and_1f1b_in_flight_counts():
    """Stage activations = layers x per-layer bytes x micro-batches in flight (1F1B: pp - s,
    Narayanan et al. 2021), and the last stage adds the fp32 logits for the loss:
    b * s * (vocab / t) elements of 4 bytes, and the final norm's and LM head's inputs, 2*s*b*h
    each (replicated over tp without SP); the first stage the embedding dropout's masks, s*b*h
    per micro-batch in flight (Korthikanti et al. 2022)."""
    b, t, pp = 2, 2, 2
    s, h, V = SPEC.seq, SPEC.hidden, SPEC.vocab
    lay = Layout(tp=t, pp=pp, micro_batch=b, global_batch=b * 4, dtype="fp16")
    rows = memory_per_rank(SPEC, lay)
    per_layer = flash_layer_acts(s, b, h, t)
    layers_per_stage = SPEC.layers // pp
    logits = b * s * (V / t) * 4
    for stage, row in enumerate(rows):
        live = pp - stage  # 1F1B: pp - s - 1 warm-up forwards, then one more before a backward
        assert row["in_flight_microbatches"] == live
        expect = (layers_per_stage * per_layer * live + (logits + 4 * s * b * h if stage == pp - 1 else 0.0)
                  + (s * b * h * live if stage == 0 else 0.0))
        assert row["activations_gib"] * GIB == pytest.approx(expect, rel=1e-9)


def test_full_recompute_rematerialises_one_whole_layer_on_top_of_the_checkpoints():
    """Under full recompute a stage stores 2*s*b*h per layer and in-flight micro-batch
    (Korthikanti et al. 2022) and, during a backward, one layer's full activations
    s*b*h*(10 + 24/t) (flash attention) rematerialised once; the last stage adds its output
    layer's, the first its embedding dropout's."""
    b, t, pp = 2, 2, 2
    s, h, V = SPEC.seq, SPEC.hidden, SPEC.vocab
    lay = Layout(tp=t, pp=pp, micro_batch=b, global_batch=b * 4, recompute="full", dtype="fp16")
    rows = memory_per_rank(SPEC, lay)
    layers_per_stage = SPEC.layers // pp
    for stage, row in enumerate(rows):
        live = pp - stage
        expect = layers_per_stage * 2 * s * b * h * live + flash_layer_acts(s, b, h, t)
        if stage == pp - 1:  # the output layer is not checkpointed: logits, norm and head inputs
            expect += b * s * (V / t) * 4 + 4 * s * b * h
        if stage == 0:  # the embedding dropout's masks
            expect += s * b * h * live
        assert row["activations_gib"] * GIB == pytest.approx(expect, rel=1e-9)


def test_untied_rope_model_on_one_stage_holds_its_output_layer():
    """A Llama-like (rope, untied) model on pp = 1 holds every parameter, the separate output
    projection (vocab x hidden) included: memory_per_rank's params equal the spec's count, and its
    weights are 2 bytes each in fp16. A tied GPT on pp = 1 holds its one embedding once (also the
    spec's count), and on pp = 2 the last stage adds the tied copy (vocab x hidden).
    The final norm's parameters (LayerNorm 2h, RMSNorm h) sit on the last stage (the table had left them out).
    Each embedding copy is [padded vocab, h] (Megatron pads 1,000 to 1,024 at tp 1), the spec's
    V rows plus the padding."""
    from kit.parallel.gpt import padded_vocab

    h, V = 512, 1000
    pad = (padded_vocab(V, 1) - V) * h  # one copy's padding rows
    assert pad > 0
    llama = parse_model(f"llama:layers=2,hidden={h},heads=8,kv_heads=2,seq=256,vocab={V},ffn=1408")
    assert llama.rope
    # the spec counts the output layer separately from the input embedding
    # (its final norm is an RMSNorm, h weights and no bias)
    assert llama.params - sum(llama.layer_params(i) for i in range(2)) - h == 2 * V * h
    one = Layout(dtype="fp16")
    row = memory_per_rank(llama, one)[0]
    assert row["params"] == pytest.approx(llama.params + 2 * pad, abs=1e-6)
    assert row["weights_gib"] * GIB == pytest.approx(2 * (llama.params + 2 * pad))

    gpt = GPTSpec(layers=2, hidden=h, heads=8, seq=256, vocab=V, name="g")
    assert memory_per_rank(gpt, one)[0]["params"] == pytest.approx(gpt.params + pad, abs=1e-6)
    two = Layout(pp=2, dtype="fp16")
    assert sum(r["params"] for r in memory_per_rank(gpt, two)) == pytest.approx(gpt.params + pad + V * h + pad,
                                                                                 abs=1e-6)


# ---------------------------------------------------------------------------------------------
# kit.parallel.schedule
# ---------------------------------------------------------------------------------------------

def test_bubble_fractions_follow_megatron():
    """Narayanan et al. 2021 (Megatron-LM, SC'21): 1F1B idles (p-1) passes of t_f + t_b while m
    run, a share (p-1)/(m+p-1) of the iteration; interleaving v chunks shrinks each bubble pass
    to 1/v of a stage, bubble/work = (p-1)/(v*m), so a share ((p-1)/(v*m)) / (1 + (p-1)/(v*m))
    of the iteration."""
    p, m, v = 4, 8, 2
    over_work = (p - 1) / (v * m)
    assert bubble_fraction("interleaved", p, m, v) == pytest.approx(over_work / (1 + over_work))
    assert bubble_fraction("1f1b", p, m) == pytest.approx((p - 1) / (m + p - 1))
    assert bubble_fraction("gpipe", p, m) == pytest.approx((p - 1) / (m + p - 1))
    # one chunk per stage is plain 1F1B
    assert bubble_fraction("interleaved", p, m, 1) == pytest.approx(bubble_fraction("1f1b", p, m))


@pytest.mark.parametrize("pp,m,v", [(4, 8, 2), (4, 4, 2), (2, 4, 3)])
def test_interleaved_warmup_follows_megatron(pp, m, v):
    """Megatron's interleaved 1F1B (Narayanan et al. 2021; forward_backward_pipelining_with_
    interleaving) runs min((pp - s - 1)*2 + (v-1)*pp, m*v) warm-up forwards on stage s, then
    alternates forward and backward: the schedule starts with that many forwards, and a stage
    holds warm-up + 1 chunks at its peak (warm-up alone when it covers every chunk)."""
    total = m * v
    for s in range(pp):
        warm = min((pp - s - 1) * 2 + (v - 1) * pp, total)
        order = schedule("interleaved", s, pp, m, v)
        phases = [ph for ph, _, _ in order]
        assert phases[:warm] == ["F"] * warm
        if warm < total:
            assert phases[warm:warm + 2] == ["F", "B"]
        expect = warm + 1 if warm < total else total
        assert in_flight("interleaved", s, pp, m, v) == expect


# ---------------------------------------------------------------------------------------------
# kit.parallel.costs / build: parameters per chunk, p2p bytes, ZeRO-3 and buckets with experts
# ---------------------------------------------------------------------------------------------

def _system():
    from kit.hardware import get_system

    return get_system("dgx-a100")


def test_interleaved_embedding_and_head_parameters_sit_on_the_chunks_that_run_them():
    """With v chunks per stage, the first virtual stage (stage 0, chunk 0) runs the embedding, so
    its parameters (vocab/t x h of the vocab-parallel table, plus the replicated seq x h position
    table) are counted in that chunk's params, not in stage 0's later chunk; each stage's chunks
    sum to memory's local_params."""
    from kit.parallel.build import DurationsOnly, build_iteration
    from kit.parallel.memory import local_params

    spec = GPTSpec(layers=8, hidden=512, heads=8, seq=256, vocab=1024, name="i")
    t, pp, v = 2, 2, 2
    lay = Layout(tp=t, pp=pp, virtual_stages=v, micro_batch=1, global_batch=2, dtype="fp16")
    _, costs, _ = build_iteration(spec, lay, _system(), "roofline", NO_HOST,
                                  graph_class=DurationsOnly)
    per_layer = gpt_layer_rank_params(512, t)
    per_chunk_layers = spec.layers // (pp * v)
    embedding = 1024 * 512 / t + 256 * 512
    assert costs[0].params == pytest.approx(per_chunk_layers * per_layer + embedding)  # chunk 0
    assert costs[pp].params == pytest.approx(per_chunk_layers * per_layer)  # chunk 1 of stage 0
    # the last virtual stage (stage pp-1, chunk v-1) runs the output layer (the tied copy here)
    # and the final norm; the last stage's first chunk holds its layers alone (it had held them)
    head = 1024 * 512 / t + 2 * 512
    assert costs[pp * v - 1].params == pytest.approx(per_chunk_layers * per_layer + head)
    assert costs[pp - 1].params == pytest.approx(per_chunk_layers * per_layer)
    for stage in range(pp):
        total = sum(costs[c * pp + stage].params for c in range(v))
        assert total == pytest.approx(local_params(spec, lay, stage))


@pytest.mark.parametrize("sp", [False, True])
def test_pipeline_sends_carry_the_whole_activation_unless_sequence_parallel(sp):
    """Megatron-core sends each TP rank's [s, b, h] whole between stages, [s/t, b, h] under
    sequence parallelism (schedules.get_tensor_shapes; the older scatter_gather_tensors_in_pipeline,
    1/t sent and all-gathered over TP on arrival, is gone): every send and receive moves
    b*s*h*dtype bytes, /t with SP, priced between stage 0 and stage 1. Without SP they had moved
    1/t of it and priced no all-gather."""
    from kit.parallel.build import build_iteration

    spec = GPTSpec(layers=4, hidden=2048, heads=16, seq=2048, vocab=32000, name="p")
    b, t = 4, 4
    lay = Layout(tp=t, pp=2, micro_batch=b, global_batch=2 * b, sequence_parallel=sp, dtype="fp16")
    g, _, coster = build_iteration(spec, lay, _system(), "roofline", NO_HOST)
    pair = [lay.rank(0, 0, 0), lay.rank(1, 0, 0)]
    shard = coster.comm_ms("sendrecv", b * spec.seq * spec.hidden * 2 / t, pair)
    whole = coster.comm_ms("sendrecv", b * spec.seq * spec.hidden * 2, pair)
    assert whole > 1.5 * shard > 0  # the test can tell the two apart
    p2p = [d for lab, d in zip(g.label, g.dur_ms)
           if lab in ("send activation", "recv activation", "send gradient", "recv gradient")]
    assert len(p2p) == 4 * lay.micro_batches  # each micro-batch: a send and a recv each way
    assert p2p == pytest.approx([shard if sp else whole] * len(p2p), rel=1e-12)


MOE = GPTSpec(layers=2, hidden=512, heads=8, seq=256, vocab=1000, experts=8, moe_every=1, topk=2,
              name="moe")


def _moe_layer_bytes(h, f, experts, ep, tp=1, nbytes=2):
    """(dense, expert) gradient bytes of one MoE layer on one rank: the experts are the E MLPs'
    2hf matrices and their f + h biases, E/ep of them on the rank (each expert's biases live with
    it); the rest is dense: attention 4h^2 + 4h, router h*E, two LayerNorms 4h."""
    dense = (4 * h * h + 4 * h) + h * experts + 4 * h
    expert = experts * (2 * h * f + f + h)
    return dense / tp * nbytes, expert / (tp * ep) * nbytes


def test_zero3_reduces_the_expert_gradients_over_the_expert_dp_group():
    """ZeRO-3 with ep > 1: after each backward a rank reduce-scatters its dense gradients over
    the DP group and its expert shard's over the expert-DP group (dp/ep ranks holding the same
    experts); its weights are all-gathered the same two ways. The graph's ops last the sum."""
    from kit.parallel.build import build_iteration
    from kit.parallel.memory import local_expert_params, local_params

    lay = Layout(dp=4, ep=2, zero=3, micro_batch=1, global_batch=4, dtype="bf16")
    g, _, coster = build_iteration(MOE, lay, _system(), "roofline", NO_HOST)
    p, e = local_params(MOE, lay, 0), local_expert_params(MOE, lay, 0)
    _, expert_bytes = _moe_layer_bytes(512, 2048, 8, 2)
    assert e * 2 == pytest.approx(MOE.layers * expert_bytes)
    dp_group = lay.dp_group(0)
    edp_group = [lay.rank(0, d, 0) for d in range(0, 4, 2)]
    assert len(edp_group) == 2
    # bf16: the weights gather in bf16 (2 B), the gradients reduce in fp32 (4 B, Megatron's default)
    for kind, label, nbytes in (("reducescatter", "fsdp reduce-scatter grads", 4),
                                ("allgather", "fsdp all-gather weights", 2)):
        expert_ms = coster.comm_ms(kind, e * nbytes, edp_group)
        assert expert_ms > 0
        expect = coster.comm_ms(kind, (p - e) * nbytes, dp_group) + expert_ms
        durs = [d for lab, d in zip(g.label, g.dur_ms) if lab == label]
        assert durs and durs == pytest.approx([expect] * len(durs), rel=1e-12)


def test_gradient_buckets_fill_with_expert_bytes_too():
    """A gradient bucket closes once its layers' gradient bytes, dense and expert together, reach
    bucket_bytes (Megatron fills buckets with every parameter's gradient). With each layer's
    dense + expert bytes above the bucket size but all dense bytes below it, every layer closes its
    own bucket: layers + 1 DP all-reduces (the last one carries the embedding), layers expert-DP
    ones."""
    from kit.parallel.build import build_iteration

    dense, expert = _moe_layer_bytes(512, 2048, 8, 2)
    bucket = 10e6
    assert MOE.layers * dense < bucket <= dense + expert  # the setup the rule decides
    lay = Layout(dp=4, ep=2, micro_batch=1, global_batch=4, dtype="bf16", bucket_bytes=bucket,
                 optimizer_step=False)
    g, _, _ = build_iteration(MOE, lay, _system(), "roofline", NO_HOST)
    dp_buckets = [lab for lab in g.label if lab.startswith("dp allreduce bucket")]
    edp_buckets = [lab for lab in g.label if lab.startswith("expert-dp allreduce bucket")]
    assert len(dp_buckets) == MOE.layers + 1
    assert len(edp_buckets) == MOE.layers


# ---------------------------------------------------------------------------------------------
# kit.parallel.gpt
# ---------------------------------------------------------------------------------------------

def test_sequence_parallel_layernorms_run_on_a_tp_share_of_the_tokens():
    """Sequence parallelism (Korthikanti et al. 2022) splits the LayerNorm and dropout regions
    along the sequence: each of the layer's two LayerNorms normalises b*s/t rows (b*s without it),
    and so do the final LayerNorm of the head."""
    from kit import ops
    from kit.parallel.gpt import head_forward, layer_forward

    b, t = 2, 4
    spec = GPTSpec(layers=2, hidden=1024, heads=16, seq=512, vocab=32000, name="sp")
    tok = b * spec.seq
    for sp, rows in ((True, tok // t), (False, tok)):
        lns = [op for blk in layer_forward(spec, b, t, 1, sp, "fp16") for op in blk.ops
               if isinstance(op, ops.LayerNorm)]
        assert len(lns) == 2
        assert [ln.rows for ln in lns] == [rows, rows]
        head_lns = [op for blk in head_forward(spec, b, t, "fp16", sp) for op in blk.ops
                    if isinstance(op, ops.LayerNorm)]
        assert [ln.rows for ln in head_lns] == [rows]


def test_gpt2_parameter_count_matches_the_closed_form_and_hugging_face():
    """GPT-2 small: 12 layers of 12h^2 + 13h (QKV, out, MLP weights and biases, two LayerNorms of
    2h each), token and position tables (V + P)*h, a final LayerNorm 2h; Hugging Face's
    GPT2Model has 124,439,808 parameters."""
    spec = parse_model("gpt2")
    h, L, V, P = 768, 12, 50257, 1024
    assert (spec.hidden, spec.layers, spec.vocab, spec.seq) == (h, L, V, P)
    assert spec.layer_params(0) == 12 * h * h + 13 * h == gpt_layer_params(h)
    closed = L * (12 * h * h + 13 * h) + (V + P) * h + 2 * h
    assert spec.params == closed == 124_439_808


# ---------------------------------------------------------------------------------------------
# kit.embedding.cost
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch,pooling", [(1, 1), (1, 2), (2, 3), (1, 10), (1, 40)])
def test_tiny_lookups_are_latency_bound_by_their_round_trips(batch, pooling):
    """Little's law as round trips: a bag's warp reads its indices 32 at a time, then its rows
    ROWS_IN_FLIGHT_PER_WARP at a time, a round waiting the DRAM latency if any of its rows
    misses. A tiny batch is far below the bandwidth cap, so its DRAM time is those round trips."""
    from kit.embedding import Table, lookup_cost
    from kit.embedding import cost as C
    from kit.hardware import get_gpu

    gpu = get_gpu("a100-sxm4-40gb")
    tab = Table(rows=100_000, dim=64, pooling=pooling, dtype="fp32")
    res = lookup_cost(tab, batch, gpu)
    miss = 1.0 - res.per_table[0]["hit_rate"]
    assert miss > 0.9  # a cold gather of a few rows of a big table
    # the first round of rows finds the L2 cold and waits; a later one waits with Poisson's
    # chance in the round's expected misses over the batch's bags (all at once here: one wave)
    waits = -math.expm1(-miss * min(pooling, C.ROWS_IN_FLIGHT_PER_WARP) * batch)
    trips = max(pooling / 32, 1) + 1 + (max(pooling / C.ROWS_IN_FLIGHT_PER_WARP, 1) - 1) * waits
    latency_ms = trips * C.DRAM_LATENCY_NS / 1e6
    assert res.parts["dram_bytes"] / (C.DRAM_GATHER_EFF * gpu.mem_bw_gbs * 1e6) < latency_ms
    assert res.parts["dram_ms"] == pytest.approx(latency_ms, rel=1e-9)
    assert res.time_ms >= latency_ms + C.LAUNCH_MS - 1e-12


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("rows", [100, 1000, 10**5, 10**7])
@pytest.mark.parametrize("batch", [1, 16, 2048])
def test_more_rows_a_bag_never_make_a_lookup_faster(backward, rows, batch):
    """Pooling 4 had come out 6% under pooling 1 at 16 bags (the pooled output, offsets and
    grad_output first reads were charged at a bandwidth that grew with the rows a bag keeps in
    flight). Within 0.2%: a saturated small table's rounds wait a little less often as its hits grow."""
    from kit.embedding import Table, lookup_cost

    for gpu in ("a100-sxm4-40gb", "v100-sxm2-32gb", "t4"):
        t = [lookup_cost([Table(rows=rows, dim=64, pooling=p)] * 3, batch, gpu, backward=backward).time_ms
             for p in (1, 2, 3, 4, 5, 8, 16, 32, 33, 64)]
        tol = 2e-3 if rows <= 1000 else 1e-9
        assert all(b >= a * (1 - tol) for a, b in zip(t, t[1:])), (gpu, [round(x * 1e3, 3) for x in t])


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("dist", ["uniform", "zipf:1.05", "zipf:0.6"])
def test_a_bigger_table_never_makes_a_fused_lookup_faster(backward, dist):
    """Tables of one fused kernel had shared the L2 in proportion to their distinct rows: 100 hot
    Zipf rows beside a million-row table kept 3 rows (hit rate 0.19), slower than 10^5 rows in
    their place; and the backward's grad_output share had followed the rows too."""
    from kit.embedding import Table, lookup_cost

    for gpu in ("a100-sxm4-40gb", "v100-sxm2-32gb", "t4"):
        for batch in (16, 4096, 65536):
            t = [lookup_cost([Table(rows=rows, dim=128, pooling=20), Table(rows=10**6, dim=128, pooling=20),
                              Table(rows=10**5, dim=64, pooling=5)], batch, gpu, dist,
                             backward=backward).time_ms
                 for rows in (10**2, 10**3, 10**4, 10**5, 10**6, 10**7, 10**8)]
            assert all(b >= a * (1 - 1e-9) for a, b in zip(t, t[1:])), (gpu, batch, [round(x * 1e3, 2) for x in t])


def test_a_hot_small_table_keeps_its_rows_in_a_shared_l2():
    """Che's approximation across the tables: the rows every table touches within one
    characteristic time of the combined stream fill the L2, so 100 hot rows stay cached."""
    from kit.embedding import Table, Zipf, lookup_cost

    hot = Table(rows=100, dim=128, pooling=20)
    big = Table(rows=10**6, dim=128, pooling=20)
    alone = lookup_cost(hot, 65536, "v100-sxm2-32gb", Zipf(1.05)).per_table[0]["hit_rate"]
    fused = lookup_cost([hot, big], 65536, "v100-sxm2-32gb", Zipf(1.05)).per_table
    assert fused[0]["hit_rate"] > 0.99 and alone > 0.99
    # it keeps its 100 rows and no more; the big table holds the rest of the L2
    assert fused[0]["l2_share_bytes"] == pytest.approx(100 * hot.sector_row_bytes, rel=1e-6)
    assert fused[1]["l2_share_bytes"] > 50 * fused[0]["l2_share_bytes"]


def test_big_lookups_run_at_the_gather_efficiency_of_peak_bandwidth():
    """With many bags in flight the Little's-law cap exceeds DRAM_GATHER_EFF x peak, which binds."""
    from kit.embedding import Table, lookup_cost
    from kit.embedding import cost as C
    from kit.hardware import get_gpu

    gpu = get_gpu("a100-sxm4-40gb")
    tab = Table(rows=10**8, dim=64, pooling=8, dtype="fp32")
    res = lookup_cost(tab, 65536, gpu)
    peak = C.DRAM_GATHER_EFF * gpu.mem_bw_gbs
    assert res.parts["dram_ms"] == pytest.approx(res.parts["dram_bytes"] / (peak * 1e9) * 1e3, rel=1e-9)


# ---------------------------------------------------------------------------------------------
# kit.sharding.model
# ---------------------------------------------------------------------------------------------

def _model(tables, optimizer="rowwise_adagrad"):
    from kit.sharding import ShardingModel

    return ShardingModel(tables, StandInSystem(), comm=StandInComm(), optimizer=optimizer, memory_cap_bytes=1e15)


def _option(m, t, kind, k=None):
    return next(i for i, o in enumerate(m.options[t]) if o.kind == kind and (k is None or len(o.ranks) == k))


def test_row_wise_shards_split_the_rows_and_the_pooling():
    """Row-wise (TorchRec rw): ranks 0..W-2 hold ceil(E/W) rows and the last the rest (1001 over
    4: 251, 251, 251, 248), each looking up its rows' share of every bag (pooling L x rows / E),
    so the shards together hold the E rows and do the table's L lookups a sample."""
    from kit.embedding import Table

    tab = Table(rows=1001, dim=64, pooling=12, name="rw")
    m = _model([tab])
    shards = m.shards(0, m.options[0][_option(m, 0, "rw")])
    assert len(shards) == 4
    assert [s[1] for s in shards] == [math.ceil(1001 / 4)] * 3 + [1001 - 3 * math.ceil(1001 / 4)]
    for r, rows, dim, pooling, batch, _ in shards:
        assert dim == 64
        assert pooling == pytest.approx(12 * rows / 1001)
        assert batch == m.batch * 4
    assert sum(s[3] for s in shards) == pytest.approx(tab.pooling)


def test_column_wise_shards_split_the_dim_and_the_bytes():
    """Column-wise (TorchRec cw) into k shards: each holds all E rows of D/k columns, so the plan's
    memory on each of those ranks is E x D/k x 4 bytes (+ one fp32 adagrad state a row), and the
    shards' bytes add to the table's plus k row states."""
    from kit.embedding import Table

    E, D = 5000, 128
    tab = Table(rows=E, dim=D, pooling=4, name="cw")
    m = _model([tab])
    for k in (2, 4):
        o = _option(m, 0, "cw", k)
        opt = m.options[0][o]
        shards = m.shards(0, opt)
        assert [(rows, dim) for _, rows, dim, _, _, _ in shards] == [(E, D // k)] * k
        mem = m.describe([o])["memory_bytes"]
        for r in opt.ranks:
            assert mem[r] == pytest.approx(E * (D // k) * 4 + 4 * E)
        assert sum(mem) == pytest.approx(E * D * 4 + k * 4 * E)


def test_plan_memory_includes_one_rowwise_adagrad_float_per_row():
    """Rowwise adagrad keeps one fp32 accumulator per row held: a rank's plan memory is the sum of
    its shards' rows x dim x dtype bytes + 4 x rows (SGD: the weights alone), in the vectorised
    model and in exact_cost alike."""
    from kit.embedding import Table

    tabs = [Table(rows=3000, dim=32, pooling=2, name="a"), Table(rows=700, dim=64, pooling=5, name="b")]
    for optimizer, state in (("rowwise_adagrad", 4), ("sgd", 0)):
        m = _model(tabs, optimizer)
        choice = [_option(m, 0, "tw"), _option(m, 1, "rw")]
        expect = np.zeros(4)
        for t, o in enumerate(choice):
            for r, rows, dim, _, _, _ in m.shards(t, m.options[t][o]):
                expect[r] += rows * dim * 4 + state * rows
        assert m.describe(choice)["memory_bytes"] == pytest.approx(expect.tolist())
        assert m.exact_cost(choice)["memory_bytes"] == pytest.approx(expect.tolist())


def test_the_planner_shares_a_ranks_l2_as_the_fused_lookup_does():
    """exact_cost had split a rank's L2 by the shards' footprints while kit.embedding.cost had
    moved to Che's approximation (forward) and grad_output (backward): kit shard and a fused
    lookup of the same tables disagreed on a small hot table beside a big one."""
    from kit.embedding import Table, Zipf, lookup_cost
    from kit.embedding.cost import L2_USABLE_FRACTION

    hot = Table(rows=100, dim=128, pooling=20, distribution=Zipf(1.05))
    big = Table(rows=10**6, dim=128, pooling=20, distribution=Zipf(1.05))
    m = _model([hot, big])
    batch = m.batch * m.world
    fwd, bwd = m._rank_l2_shares([(0, "tw", hot, batch), (1, "tw", big, batch)])
    fused = lookup_cost([hot, big], batch, m.gpu).per_table
    fused_b = lookup_cost([hot, big], batch, m.gpu, backward=True).per_table
    l2 = L2_USABLE_FRACTION * m.gpu.l2_cache_bytes
    assert fwd == pytest.approx([max(x["l2_share_bytes"] / l2, 1e-3) for x in fused], rel=1e-9)
    assert bwd == pytest.approx([max(x["l2_share_bytes"] / l2, 1e-3) for x in fused_b], rel=1e-9)
    assert fwd[0] * l2 == pytest.approx(100 * hot.sector_row_bytes, rel=1e-3)  # keeps its hot rows


@pytest.mark.parametrize("pooling", [1, 4, 20])
def test_more_bags_or_wider_rows_never_make_a_lookup_faster(pooling):
    """Under skewed indices a forward had come out faster for more bags (Zipf 1.05, pooling 1:
    6.200 us at 1 bag, 6.153 at 16: a wave waits for its slowest bag, not the average one), and a
    backward faster for wider rows (76.2 us at D = 8, 74.9 at D = 128: the sort had streamed at a
    gradient row's size)."""
    from kit.embedding import Table, Zipf, lookup_cost

    for gpu in ("a100-sxm4-40gb", "v100-sxm2-32gb"):
        for dist in (Zipf(1.05), Zipf(0.6), "uniform"):
            fwd = [lookup_cost(Table(rows=10**6, dim=64, pooling=pooling), b, gpu, dist).time_ms
                   for b in (1, 2, 4, 16, 64, 512, 4096)]
            # within 1e-4: the second bag of a hot Zipf table may hit the first bag's rows
            assert all(y >= x * (1 - 1e-4) for x, y in zip(fwd, fwd[1:])), (gpu, dist, fwd)
            bwd = [lookup_cost(Table(rows=10**6, dim=d, pooling=pooling), 512, gpu, dist,
                               backward=True).time_ms for d in (4, 8, 16, 32, 64, 128, 256)]
            assert all(y >= x * (1 - 1e-9) for x, y in zip(bwd, bwd[1:])), (gpu, dist, bwd)
