"""kit.parallel against the published formulas: Megatron's selective recompute (Korthikanti et
al. 2022), the vocab-parallel loss's saved softmax per pipeline schedule, ZeRO-2's gradient
reduction per micro-batch (DeepSpeed)."""
import pytest

from kit import ops
from kit.parallel import GPTSpec, Layout
from kit.parallel.costs import AnalyticSource, _recompute_blocks

GPT3 = GPTSpec(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200, name="gpt3-175b-like")


def _recomputed(spec, layout):
    fwd, _ = AnalyticSource(spec, layout).layer(0)
    return [op for blk in _recompute_blocks(fwd, layout.recompute) for op in blk.ops]


def test_selective_recompute_reruns_the_core_attention_not_the_hidden_dropouts():
    """Megatron's selective recompute checkpoints the core attention only (QK^T, softmax,
    attention dropout, ·V); the hidden-state dropouts (b·s·h elements) stay saved."""
    lay = Layout(tp=8, pp=8, recompute="selective")
    hidden = 1 * GPT3.seq * GPT3.hidden
    flash = _recomputed(GPT3, lay)
    assert [type(op) for op in flash] == [ops.Attention]
    unfused = _recomputed(GPTSpec(**{**GPT3.__dict__, "attention": "unfused"}), lay)
    assert not any(getattr(op, "numel", None) == hidden for op in unfused)
    scores = 1 * (GPT3.heads // 8) * GPT3.seq * GPT3.seq
    # ... and the context's permute(2, 0, 1, 3).contiguous(), the last kernel of the core
    # attention (megatron-core 0.16.1 dot_product_attention.py line 245): s x h/t elements
    assert [op.op_class for op in unfused] == ["gemm", "softmax", "dropout", "gemm", "elementwise"]
    assert unfused[2].numel == scores
    assert unfused[4].kind == "copy" and unfused[4].numel == GPT3.seq * GPT3.hidden // 8


def test_selective_recompute_keeps_the_unfused_softmax_fallback_kernels():
    """Where Megatron's fused softmax cannot run (b·heads/tp = 3 is not a multiple of 4), the
    scores pass through cast, mask, softmax, cast (megatron-core 0.16.1 forward_torch_softmax,
    scale None, handed the data loader's causal mask): all of them are core attention, and so is
    the context copy after the second bmm."""
    spec = GPTSpec(layers=2, hidden=384, heads=6, seq=256, vocab=1000, attention="unfused", name="t")
    core = _recomputed(spec, Layout(tp=2, recompute="selective"))
    assert [op.op_class for op in core] == ["gemm", "elementwise", "elementwise", "softmax",
                                            "elementwise", "dropout", "gemm", "elementwise"]


def _logits_gib(layout, spec=GPT3):
    """Last stage's activations less those of the same model with a one-word vocabulary: the
    loss's saved fp32 softmax, but for its one column."""
    from kit.parallel.memory import GIB, memory_per_rank

    with_head = memory_per_rank(spec, layout)[-1]["activations_gib"]
    no_head = memory_per_rank(GPTSpec(**{**spec.__dict__, "vocab": 1}), layout)[-1]["activations_gib"]
    return (with_head - no_head) * GIB


def test_the_last_stage_keeps_one_softmax_per_micro_batch_its_schedule_holds():
    """Megatron's vocab-parallel cross entropy saves softmax [b, s, V/t] in fp32 for backward:
    GPipe's last stage runs all m forwards before a backward, so it holds m of them; 1F1B's
    runs each backward right after its forward, so one."""
    from kit.parallel.gpt import padded_vocab

    # micro-batch 2, less the 1-wide vocab's, which Megatron pads to 128 x tp (128 a rank)
    one = 2 * GPT3.seq * ((padded_vocab(GPT3.vocab, 8) - padded_vocab(1, 8)) / 8) * 4
    for kind, held in (("1f1b", 1), ("gpipe", 16), ("interleaved", 1)):
        # interleaved: the loss is on the last stage's last chunk (virtual stage 2 x 4 - 1),
        # whose backward follows each forward at once, though the stage holds 5 chunks' passes
        lay = Layout(tp=8, pp=4, micro_batch=2, dp=2, global_batch=64, schedule=kind,
                     virtual_stages=2 if kind == "interleaved" else 1)
        assert abs(_logits_gib(lay) - held * one) < 1e-6 * one, kind


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_the_saved_softmax_is_as_wide_as_the_padded_logits(schedule):
    """The loss saves softmax over the logits the LM head computes, [b, s, padded vocab / t]
    (head_forward's cross-entropy tensor): gpt2's 50,257 and 51,200 both pad to 51,200 at tp 8,
    so every stage holds the same memory. The softmax had been counted over the spec's 50,257
    (6,282 a rank where the buffer is 6,400 wide) while the weights held the padded rows."""
    from kit.parallel.gpt import head_forward
    from kit.parallel.memory import GIB, memory_per_rank

    lay = Layout(tp=8, pp=2, micro_batch=2, global_batch=8, dtype="bf16", schedule=schedule)
    base = GPTSpec(layers=4, hidden=768, heads=16, seq=1024, vocab=51200, name="t")
    odd = GPTSpec(**{**base.__dict__, "vocab": 50257})
    assert memory_per_rank(odd, lay) == memory_per_rank(base, lay)
    # the last stage's softmax: held micro-batches x head_forward's fp32 [tokens, vocab / tp]
    ce = [op for blk in head_forward(odd, lay.micro_batch, lay.tp, lay.dtype) for op in blk.ops
          if isinstance(op, ops.Elementwise) and op.kind == "div"]
    assert len(ce) == 1
    held = memory_per_rank(odd, lay)[-1]["in_flight_microbatches"]  # 1F1B's last stage: 1; GPipe's: m
    assert held == (4 if schedule == "gpipe" else 1)
    narrow = GPTSpec(**{**base.__dict__, "vocab": 1})
    saved = (memory_per_rank(odd, lay)[-1]["activations_gib"]
             - memory_per_rank(narrow, lay)[-1]["activations_gib"]) * GIB
    narrow_ce = lay.micro_batch * base.seq * (1024 // 8) * 4  # vocab 1 pads to 1,024 at tp 8
    assert saved == pytest.approx(held * (ce[0].numel * 4 - narrow_ce), rel=1e-9)


class _Flat:
    """0.1 ms a kernel: the collectives are what the test reads."""

    name = "flat"

    def predict(self, ops_, gpu):
        import pandas as pd

        return pd.DataFrame({"latency_ms": [0.1] * len(ops_)})


def _dp_gradient_ms(zero: int, overlap: bool, m: int = 4) -> float:
    from kit.hardware.system import get_system
    from kit.parallel.build import DP, build_iteration

    spec = GPTSpec(layers=4, hidden=1024, heads=16, seq=512, vocab=32000, name="t")
    lay = Layout(dp=4, micro_batch=1, global_batch=4 * m, zero=zero, overlap_grad_reduce=overlap)
    g, _, _ = build_iteration(spec, lay, get_system("dgx-a100"), _Flat())
    serves = g.meta["comm_serves"]
    return sum(g.dur_ms[i] for i, grp in serves.items()
               if grp == DP and "all-gather" not in g.label[i] and "allgather" not in g.label[i])


def test_zero2_reduce_scatters_every_micro_batchs_gradients():
    """ZeRO-2 keeps 1/dp of the gradients, so it cannot accumulate the rest over micro-batches:
    it reduce-scatters after every backward (DeepSpeed: "ZeRO stage >= 2 communicates during
    non gradient accumulation boundaries as well"), m times ZeRO-1's once per iteration."""
    for overlap in (True, False):
        once, every = _dp_gradient_ms(1, overlap), _dp_gradient_ms(2, overlap)
        assert once > 0
        assert abs(every - 4 * once) < 1e-9 * every, overlap


def test_zero2_next_micro_batch_waits_for_the_gradient_reduce_scatters():
    """DeepSpeed's ZeRO-2 ends every micro-batch's backward in its gradient epilogue: the last
    bucket is reduced and the device synchronised (overlap_comm), or the reductions ran on the
    compute stream (no overlap_comm). No kernel of the next micro-batch's forward may start before
    the previous backward's DP reduce-scatters end."""
    from kit.hardware.system import get_system
    from kit.parallel.build import DP, build_iteration
    from kit.sim import simulate

    spec = GPTSpec(layers=4, hidden=1024, heads=16, seq=512, vocab=32000, name="t")
    for overlap in (True, False):
        lay = Layout(dp=4, micro_batch=1, global_batch=16, zero=2, overlap_grad_reduce=overlap)
        g, _, _ = build_iteration(spec, lay, get_system("dgx-a100"), _Flat())
        res = simulate(g)
        reduced = {}  # micro-batch -> when its gradients' reduce-scatters end
        for i, grp in g.meta["comm_serves"].items():
            tag = g.tag[i]
            if grp == DP and tag and tag[0] == "B":
                reduced[tag[1]] = max(reduced.get(tag[1], 0.0), res.end_ms[i])
        assert sorted(reduced) == [0, 1, 2, 3], overlap
        for i, tag in enumerate(g.tag):
            if g.kind[i] == "compute" and tag and tag[0] == "F" and tag[1] - 1 in reduced:
                assert res.start_ms[i] >= reduced[tag[1] - 1] - 1e-9, (overlap, g.label[i])


def test_the_first_and_last_stages_keep_the_embedding_and_output_layer_activations():
    """Korthikanti et al. 2022 count, with sequence parallelism, 34·s·b·h/t a layer, s·b·h·p/t
    for the embedding dropout's masks of the first stage's micro-batches in flight and
    4·s·b·h/t·(1 + v/h) for the output layer (the final norm's and the LM head's inputs, and the
    fp32 logits of the loss). GPipe holds all m micro-batches on every stage. The 4·s·b·h/t had
    been left out of the last stage (64 x 12 MiB = 0.75 GiB here)."""
    from kit.parallel.memory import memory_per_rank

    m, t, s, b, h = 64, 8, GPT3.seq, 1, GPT3.hidden  # vocab 51,200 is already padded at tp 8
    lay = Layout(tp=t, pp=8, micro_batch=b, global_batch=m, schedule="gpipe",
                 sequence_parallel=True, recompute="selective")
    rows = memory_per_rank(GPT3, lay)
    layers = 34 * s * b * h / t * GPT3.layers / 8
    assert rows[0]["activations_gib"] * 2**30 == pytest.approx(m * (layers + s * b * h / t), rel=1e-12)
    output = 4 * s * b * h / t * (1 + GPT3.vocab / h)
    assert rows[-1]["activations_gib"] * 2**30 == pytest.approx(m * (layers + output), rel=1e-12)
    assert rows[3]["activations_gib"] * 2**30 == pytest.approx(m * layers, rel=1e-12)


def test_a_stage_holds_each_chunk_in_flight_at_its_own_size():
    """9 layers over pp 3 x 2 virtual stages: every chunk 0 has 2 layers, every chunk 1 one.
    With m = 3 micro-batches the middle stage runs 5 forwards (3 of chunk 0, 2 of chunk 1) before
    its first backward, then the sixth: 3 x 2 + 3 x 1 = 9 layers at the peak, all it could ever
    hold (m x its 3 layers). max(chunk) x 6 passes in flight had made it 12 layers."""
    from kit.parallel.memory import activation_bytes_per_layer, memory_per_rank

    spec = GPTSpec(layers=9, hidden=1024, heads=16, seq=512, vocab=32000, name="t")
    lay = Layout(pp=3, virtual_stages=2, global_batch=3)
    layer = activation_bytes_per_layer(spec, lay)
    mid = memory_per_rank(spec, lay)[1]
    assert mid["in_flight_microbatches"] == 6
    assert mid["activations_gib"] * 2**30 == pytest.approx(9 * layer, rel=1e-12)


def test_the_embedding_dropout_mask_is_one_byte_an_element_in_every_dtype():
    """The first stage's edge activation is the embedding dropout's bool mask, s*b*h bytes (/t
    with SP), in fp32 as in fp16; the last stage's norm and head inputs are activations and
    double in fp32 (4 bytes), while the loss's softmax is fp32 either way."""
    from kit.parallel.memory import edge_activation_bytes

    s, b, h = GPT3.seq, 2, GPT3.hidden
    for sp in (False, True):
        split = 8 if sp else 1
        half, full = (Layout(tp=8, pp=4, micro_batch=b, global_batch=8, dtype=d, sequence_parallel=sp)
                      for d in ("fp16", "fp32"))
        assert edge_activation_bytes(GPT3, half, 0)[0] == edge_activation_bytes(GPT3, full, 0)[0] == s * b * h / split
        last_half, last_full = edge_activation_bytes(GPT3, half, 3)[1], edge_activation_bytes(GPT3, full, 3)[1]
        assert last_full - last_half == pytest.approx(4 * s * b * h / split, rel=1e-12)


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("attention", ["unfused", "flash"])
def test_a_layers_dropout_masks_are_one_byte_an_element_in_fp32_too(sp, attention):
    """Korthikanti et al.'s 34 + 5as/h bytes a token count 16-bit activations and 1-byte masks
    (2h of the 10h replicated, a·s of the 5·a·s scores): at fp32 every count but the masks
    doubles, so fp32 minus fp16 is the layer less its masks."""
    from kit.parallel.memory import activation_bytes_per_layer

    spec = GPTSpec(**{**GPT3.__dict__, "attention": attention})
    s, b, h, a, t = spec.seq, 2, spec.hidden, spec.heads, 8
    half, full = (activation_bytes_per_layer(spec, Layout(tp=t, pp=4, micro_batch=b, global_batch=8, dtype=d,
                                                          sequence_parallel=sp))
                  for d in ("fp16", "fp32"))
    masks = s * b * (2 * h / (t if sp else 1) + (a * s / t if attention == "unfused" else 0))
    assert full - half == pytest.approx(half - masks, rel=1e-12)
    if attention == "unfused" and not sp:  # Table 2's tensor-parallel count at fp16
        assert half == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
