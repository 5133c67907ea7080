"""The unfused attention's Megatron kernels against megatron-core 0.16.1's sources: the fused
softmax's availability under BERT's padding mask, the fused softmax's backward bytes, and
grouped-query attention's key/value repeat (kit.parallel.gpt)."""
import torch

from kit import ops
from kit.parallel import GPTSpec
from kit.parallel.costs import _attention_core
from kit.parallel.gpt import (FusedSoftmax, KVRepeat, backward_of, fused_softmax_available,
                              layer_backward, layer_forward)

torch.set_num_threads(1)


def _source_rule(b, np_, sq, sk, causal):
    """megatron-core 0.16.1 fusions/fused_softmax.py is_kernel_available, lines 254-269, as
    written there (fp16/bf16 input and the fusion flag assumed), with the kernel's batches per
    block as the kit takes it (4 for sk > 128, else 8)."""
    attn_batches = b * np_
    if 16 < sk <= 4096 and sq % 4 == 0 and sk % 4 == 0 and attn_batches % 4 == 0:
        batch_per_block = 4 if sk > 128 else 8
        if causal:
            return attn_batches % batch_per_block == 0
        return sq % batch_per_block == 0
    return False


def _kernels(blocks):
    return [op for blk in blocks for op in blk.ops]


def test_padding_mask_follows_megatrons_non_causal_rule():
    # shapes where the two rules disagree: 1 x 4 batches at 128 keys (4 % 8 fails the causal
    # rule, 128 % 8 passes the padding one); 1 x 8 batches at 100 keys (8 % 8 passes, 100 % 8 not)
    for b, np_, s in [(1, 4, 128), (1, 8, 100), (2, 2, 1024), (1, 2, 1024), (4, 4, 16), (3, 4, 36)]:
        for causal in (True, False):
            assert fused_softmax_available(b, np_, s, causal) == _source_rule(b, np_, s, s, causal), (b, np_, s, causal)
    assert fused_softmax_available(1, 4, 128, causal=False) and not fused_softmax_available(1, 4, 128)
    assert fused_softmax_available(1, 8, 100) and not fused_softmax_available(1, 8, 100, causal=False)


def test_bert_layer_takes_the_fused_kernel_where_the_padding_rule_allows():
    # BERT (pretraining_heads: GPTSpec.causal False), 16 heads at tp 4, micro-batch 1, seq 128
    bert = GPTSpec(layers=1, hidden=1024, heads=16, seq=128, vocab=30522, attention="unfused",
                   pretraining_heads=True)
    gpt = GPTSpec(layers=1, hidden=1024, heads=16, seq=128, vocab=30522, attention="unfused")
    soft = [op for op in _kernels(layer_forward(bert, 1, 4, 1, False, "fp16")) if isinstance(op, ops.Softmax)]
    assert [(type(op), op.dtype) for op in soft] == [(FusedSoftmax, "fp16")]
    soft = [op for op in _kernels(layer_forward(gpt, 1, 4, 1, False, "fp16")) if isinstance(op, ops.Softmax)]
    assert [op.dtype for op in soft] == ["fp32"]  # causal: 4 batches % 8, torch's fallback


def test_fused_softmax_backward_is_the_bytes_its_kernel_moves():
    """scaled_upper_triang_masked_softmax_cuda.backward(output_grads, softmax_results, scale)
    (fused_softmax.py line 53; scaled_masked_softmax_cuda.backward, line 104): reads the output
    gradient and the saved output, writes the input gradient, 3 x n x 2 bytes in fp16, against
    the forward's read of the scores and write of the output, 2 x n x 2."""
    gpt = GPTSpec(layers=1, hidden=1024, heads=16, seq=1024, vocab=50257, attention="unfused")
    fwd = layer_forward(gpt, 1, 4, 1, False, "fp16")
    (soft,) = [op for op in _kernels(fwd) if isinstance(op, ops.Softmax)]
    assert isinstance(soft, FusedSoftmax)
    n = 1 * 4 * 1024 * 1024
    assert soft.bytes == 2 * n * 2
    (blk,) = [b for b in fwd if soft in b.ops]
    bwd = backward_of(blk)
    (factor,) = [f for op, f in zip(bwd.ops, bwd.bwd_factor) if op is soft]
    assert factor * soft.bytes == 3 * n * 2


def test_gqa_unfused_prices_megatrons_key_value_repeat():
    """dot_product_attention.py lines 169-175: key and value repeat_interleave(np // ng, dim=2)
    from [sk, b, ng, hn] to [sk, b, np, hn] where np // ng > 1; one copy each, reading the input
    and writing the output (torch's counts of both tensors); its backward, a sum over the
    repeats, reads the output's gradient and writes the input's, the same bytes."""
    s, b, hd, tp = 64, 2, 32, 2
    spec = GPTSpec(layers=1, hidden=16 * hd, heads=16, kv_heads=4, seq=s, vocab=1000,
                   attention="unfused")
    np_, ng = 16 // tp, 4 // tp
    k = torch.empty(s, b, ng, hd, dtype=torch.bfloat16)
    rep = k.repeat_interleave(np_ // ng, dim=2)
    want = (k.numel() + rep.numel()) * k.element_size()
    fwd = layer_forward(spec, b, tp, 1, False, "bf16")
    reps = [op for op in _kernels(fwd) if isinstance(op, KVRepeat)]
    assert [op.bytes for op in reps] == [want, want]
    bwd = layer_backward(fwd, tp, False)
    got = [(op, f) for blk in bwd for op, f in zip(blk.ops, blk.bwd_factor) if isinstance(op, KVRepeat)]
    assert [op.bytes * f for op, f in got] == [want, want]
    # selective recompute reruns DotProductAttention.forward, the repeat its first kernels
    core = [type(op) for op, _, _ in _attention_core(fwd)]
    assert core[:3] == [KVRepeat, KVRepeat, ops.Gemm]
    mha = GPTSpec(layers=1, hidden=16 * hd, heads=16, seq=s, vocab=1000, attention="unfused")
    assert not [op for op in _kernels(layer_forward(mha, b, tp, 1, False, "bf16")) if isinstance(op, KVRepeat)]
