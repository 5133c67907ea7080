"""Megatron-specific kernels of the analytic GPT layer (kit.parallel.gpt): the fused softmax's
availability rule, the vocab-parallel cross entropy's passes, vocabulary padding, and the
embedding's identity backward, against hand counts."""
import torch

from kit import ops
from kit.parallel import GPTSpec, Layout
from kit.parallel.costs import AnalyticSource
from kit.parallel.gpt import (fused_softmax_available, head_backward, head_forward, layer_forward,
                              padded_vocab)

torch.set_num_threads(1)
SPEC = GPTSpec(layers=2, hidden=1024, heads=16, seq=1024, vocab=50257, attention="unfused")


def test_fused_softmax_needs_attention_batches_a_multiple_of_its_block():
    # Megatron's FusedScaleMaskSoftmax.is_kernel_available: b * heads/tp % batch_per_block == 0,
    # batch_per_block = 4 for seq > 128 (8 at or below), 16 < seq <= 16384, seq % 4 == 0
    assert not fused_softmax_available(1, 2, 1024)  # TP 8 of 16 heads, micro-batch 1
    assert fused_softmax_available(2, 2, 1024)
    assert fused_softmax_available(1, 4, 1024)
    assert not fused_softmax_available(1, 4, 128)  # 4 % 8
    assert fused_softmax_available(2, 4, 128)
    assert not fused_softmax_available(4, 4, 16) and not fused_softmax_available(4, 4, 1022)


def _kernels(blocks):
    return [op for blk in blocks for op in blk.ops]


def test_unfused_softmax_fallback_runs_five_kernels_where_the_fused_one_does_not_apply():
    """TP 8 at micro-batch 1 (2 attention batches): cast to fp32, scale, mask, softmax, cast back
    over b·(a/t)·s·s elements instead of one fused kernel; micro-batch 2 keeps the fused one."""
    k1 = _kernels(layer_forward(SPEC, 1, 8, 1, False, "fp16"))
    k2 = _kernels(layer_forward(SPEC, 2, 8, 1, False, "fp16"))
    assert len(k1) == len(k2) + 4
    n = 1 * 2 * 1024 * 1024
    extra = [op for op in k1 if isinstance(op, ops.Elementwise) and op.numel == n]
    assert [op.kind for op in extra] == ["cast", "mul", "where", "cast"]
    # bytes: fp16 -> fp32 cast 6n, scale and mask 8n each, cast back 6n
    assert sum(op.bytes for op in extra) == 28 * n
    assert [op for op in k1 if isinstance(op, ops.Softmax)][0].dtype == "fp32"
    assert [op for op in k2 if isinstance(op, ops.Softmax)][0].dtype == "fp16"


def test_vocabulary_is_padded_to_128_times_tp():
    assert [padded_vocab(50257, t) // t for t in (1, 2, 4, 8)] == [50304, 25216, 12672, 6400]
    for tp in (1, 4):
        gemm = [op for op in _kernels(head_forward(SPEC, 1, tp, "fp16")) if isinstance(op, ops.Gemm)]
        assert [g.n for g in gemm] == [padded_vocab(50257, tp) // tp]


def test_cross_entropy_passes_and_all_reduces():
    """Forward: the fp16 logits cast to fp32 (6 bytes an element), then max, subtract, exp, sum,
    divide (8 bytes each); backward: scale in place (8) and cast back (6). Three all-reduces of
    tokens x 4 bytes at TP > 1 (max, target logit, sum of exps), none at TP = 1."""
    b, tp = 2, 4
    tok, v = b * 1024, padded_vocab(50257, tp) // tp
    n = tok * v
    fwd = head_forward(SPEC, b, tp, "fp16")
    ce = [op for op in _kernels(fwd) if isinstance(op, ops.Elementwise)]
    assert sum(op.bytes for op in ce) == (6 + 5 * 8) * n
    comms = [blk.comm for blk in fwd if blk.comm is not None]
    assert comms == [("allreduce", tok * 4, "tp")] * 3
    assert all(blk.comm is None for blk in head_forward(SPEC, b, 1, "fp16"))
    bwd = head_backward(SPEC, b, tp, "fp16")
    ce_b = [op for op in _kernels(bwd) if isinstance(op, ops.Elementwise)]
    assert sum(op.bytes for op in ce_b) == (8 + 6) * n
    gemms = [op for op in _kernels(bwd) if isinstance(op, ops.Gemm)]
    assert sorted((g.m, g.n, g.k) for g in gemms) == sorted([(tok, 1024, v), (1024, v, tok)])


def test_embedding_all_reduce_has_no_backward():
    src = AnalyticSource(SPEC, Layout(tp=4, micro_batch=1))
    fwd, bwd = src.embedding
    assert sum(blk.comm is not None for blk in fwd) == 1
    assert all(blk.comm is None for blk in bwd)
    # each layer keeps one backward all-reduce per forward one (the column-parallel input grads)
    lf, lb = src.layer(0)
    assert sum(blk.comm is not None for blk in lb) == sum(blk.comm is not None for blk in lf) == 2

