"""Megatron-specific kernels of the analytic GPT layer (kit.parallel.gpt): the fused softmax's
availability rule, the vocab-parallel cross entropy's passes, vocabulary padding, and the
embedding's identity backward, against hand counts."""
import pytest
import torch

from kit import ops
from kit.parallel import GPTSpec, Layout
from kit.parallel.costs import AnalyticSource
from kit.parallel.gpt import (fused_softmax_available, head_backward, head_forward, layer_forward,
                              padded_vocab)
from kit.parallel.vocab_kernels import TokenKernel

torch.set_num_threads(1)
SPEC = GPTSpec(layers=2, hidden=1024, heads=16, seq=1024, vocab=50257, attention="unfused")


def test_fused_softmax_needs_attention_batches_a_multiple_of_its_block():
    # Megatron's FusedScaleMaskSoftmax.is_kernel_available: b * heads/tp % batch_per_block == 0,
    # batch_per_block = 4 for seq > 128 (8 at or below), 16 < seq <= 4096, seq % 4 == 0
    assert not fused_softmax_available(1, 2, 1024)  # TP 8 of 16 heads, micro-batch 1
    assert fused_softmax_available(2, 2, 1024)
    assert fused_softmax_available(1, 4, 1024)
    assert not fused_softmax_available(1, 4, 128)  # 4 % 8
    assert fused_softmax_available(2, 4, 128)
    assert not fused_softmax_available(4, 4, 16) and not fused_softmax_available(4, 4, 1022)


def test_fused_softmax_stops_at_megatron_cores_4096_keys():
    """megatron-core 0.16.1 fusions/fused_softmax.py line 256 (and 0.5.0's line 156):
    16 < sk <= 4096. Past it, at any batch, the torch fallback runs (the legacy Megatron-LM limit
    of 16384 had kept the fused kernel up to 16k tokens)."""
    assert fused_softmax_available(1, 4, 4096)
    assert not fused_softmax_available(1, 4, 4100) and not fused_softmax_available(8, 8, 8192)
    spec = GPTSpec(layers=1, hidden=1024, heads=16, seq=8192, vocab=50257, attention="unfused")
    soft = [op for op in _kernels(layer_forward(spec, 1, 4, 1, False, "bf16")) if isinstance(op, ops.Softmax)]
    assert [op.dtype for op in soft] == ["fp32"]  # 1 x 4 attention batches: only the seq rule fails


def _kernels(blocks):
    return [op for blk in blocks for op in blk.ops]


def test_unfused_softmax_fallback_runs_torchs_kernels_where_the_fused_one_does_not_apply():
    """TP 8 at micro-batch 1 (2 attention batches): megatron-core 0.16.1's forward_torch_softmax
    with its defaults (scale None: apply_query_key_layer_scaling False) casts to fp32, masks in
    place and softmaxes, then casts back, over b·(a/t)·s·s elements (the data loader's causal
    mask: none built in the layer); micro-batch 2 keeps the fused kernel (tests/test_parallel_unfused_attention_tail.py
    checks the kernels against the source and torch's profile)."""
    k1 = _kernels(layer_forward(SPEC, 1, 8, 1, False, "fp16"))
    k2 = _kernels(layer_forward(SPEC, 2, 8, 1, False, "fp16"))
    n = 1 * 2 * 1024 * 1024
    extra = [op for op in k1 if isinstance(op, ops.Elementwise) and op.numel == n]
    assert [op.kind for op in extra] == ["cast", "where", "cast"]
    # bytes: fp16 -> fp32 cast 6n, the mask 8n, cast back 6n
    assert sum(op.bytes for op in extra) == 20 * n
    assert [op for op in k1 if isinstance(op, ops.Softmax)][0].dtype == "fp32"
    assert [op for op in k2 if isinstance(op, ops.Softmax)][0].dtype == "fp16"


def test_vocabulary_is_padded_to_128_times_tp():
    assert [padded_vocab(50257, t) // t for t in (1, 2, 4, 8)] == [50304, 25216, 12672, 6400]
    for tp in (1, 4):
        gemm = [op for op in _kernels(head_forward(SPEC, 1, tp, "fp16")) if isinstance(op, ops.Gemm)]
        assert [g.n for g in gemm] == [padded_vocab(50257, tp) // tp]


def test_cross_entropy_passes_and_all_reduces():
    """megatron-core 0.16.1 VocabParallelCrossEntropy (tensor_parallel/cross_entropy.py) over
    n = tokens x vocab/tp: the fp16 logits cast to fp32 (.float(), line 28: read 2, write 4
    bytes an element), torch.max(dim=-1) (line 30: read 4 n, write a value and an int64 index a
    token, 12), subtract in place (line 45: 8 n), exp in place (line 65: 8 n),
    sum(dim=-1) (line 66: read 4 n, write 4 a token), divide in place (line 80: 8 n). The two
    reductions had been priced as elementwise passes writing n elements (46 n bytes in all).
    Backward: scale in place (line 117: 8) and cast back (6). Three all-reduces of tokens x 4
    bytes at TP > 1 (max, target logit, sum of exps), none at TP = 1."""
    b, tp = 2, 4
    tok, v = b * 1024, padded_vocab(50257, tp) // tp
    n = tok * v
    fwd = head_forward(SPEC, b, tp, "fp16")
    ce = [op for op in _kernels(fwd) if isinstance(op, ops.Elementwise) and not isinstance(op, TokenKernel)]
    assert len(ce) == 6
    cast, max_, sub, exp, sum_, div = 6 * n, 4 * n + 12 * tok, 8 * n, 8 * n, 4 * n + 4 * tok, 8 * n
    assert sum(op.bytes for op in ce) == cast + max_ + sub + exp + sum_ + div
    comms = [blk.comm for blk in fwd if blk.comm is not None]
    assert comms == [("allreduce", tok * 4, "tp")] * 3
    assert all(blk.comm is None for blk in head_forward(SPEC, b, 1, "fp16"))
    bwd = head_backward(SPEC, b, tp, "fp16")
    ce_b = [op for op in _kernels(bwd) if isinstance(op, ops.Elementwise) and not isinstance(op, TokenKernel)]
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



@pytest.mark.parametrize("dtype, grad_bytes", [("fp16", 2), ("bf16", 4)])
def test_embedding_backward_zero_fills_the_tables_and_accumulates_main_grad(dtype, grad_bytes):
    """The word table's F.embedding (megatron-core 0.16.1 tensor_parallel/layers.py line 287) and
    the learned position table have torch's embedding_dense_backward: a zero-fill of the
    [rows, hidden] gradient (rows x hidden x d bytes written) and a scatter-add of the tokens'
    gradient rows (2 x tokens x hidden x d), two kernels; then Megatron's DDP hook
    param.main_grad.add_(param.grad) (distributed/distributed_data_parallel.py line 440) reads
    the gradient (d) and main_grad (grad bytes g) and writes main_grad (g), one kernel. The add
    of the two lookups has no backward kernel. Only the dropout's backward (twice its forward)
    is left of the old mirror, which had priced each table's backward as twice its lookup."""
    b, tp, d = 2, 4, 2
    tok, h = b * SPEC.seq, SPEC.hidden
    src = AnalyticSource(SPEC, Layout(tp=tp, micro_batch=b, dtype=dtype))
    bwd = src.embedding[1]
    items = [(op, f, k) for blk in bwd if blk.comm is None
             for op, f, k in zip(blk.ops, blk.bwd_factor, blk.kernel_counts())]
    drop = [(op, f) for op, f, _ in items if isinstance(op, ops.Dropout)]
    assert [f for _, f in drop] == [2.0]
    rest = [(op, f, k) for op, f, k in items if not isinstance(op, ops.Dropout)]
    words, positions = padded_vocab(50257, tp) // tp, SPEC.positions
    expect = sum(rows * h * d + 2 * tok * h * d + rows * h * (d + 2 * grad_bytes)
                 for rows in (words, positions))
    # at tp > 1 the backward of output_parallel[input_mask, :] = 0.0 (layers.py line 290): a
    # clone of the [tokens, hidden] gradient and a masked_fill_ of it (and the mask, a byte a token)
    expect += 2 * tok * h * d + 2 * tok * h * d + tok
    # SPEC is tied and pp 1: autograd sums the word table's gradient with the LM head's zeroed
    # dummy (megatron-core 0.16.1 language_module.py lines 197-202, layers.py lines 586-600): one
    # add over [words, hidden], reading two and writing one
    expect += 3 * words * h * d
    # micro-batch 2: each table's embedding_dense_backward first copies the transposed gradient
    # view to contiguous rows (language_model_embedding.py line 120's transpose), tokens x hidden
    expect += 2 * (2 * tok * h * d)
    assert sum(op.bytes * f for op, f, _ in rest) == pytest.approx(expect, rel=1e-12)
    assert sum(k for _, _, k in rest) == 2 * (2 + 1) + 2 + 1 + 2
