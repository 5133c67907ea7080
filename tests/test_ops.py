"""Op FLOPs and bytes against hand calculations."""
import pytest

from kit.errors import KitError
from kit.ops import (Attention, Dropout, Elementwise, EmbeddingBag, Gemm, LayerNorm, Memcpy,
                     RMSNorm, Softmax, linear)


def test_gemm_flops_and_bytes_by_hand():
    g = Gemm(m=128, n=256, k=64, b=3, dtype="fp16")
    assert g.flops == 2 * 3 * 128 * 256 * 64
    # A: 3·128·64, B: 3·64·256, C: 3·128·256 elements, 2 bytes each
    assert g.bytes == 2 * (3 * 128 * 64 + 3 * 64 * 256 + 3 * 128 * 256)


def test_linear_shares_its_weight():
    g = linear(tokens=1000, in_features=512, out_features=2048, dtype="fp32")
    assert (g.m, g.k, g.n) == (1000, 512, 2048)
    assert g.flops == 2 * 1000 * 512 * 2048
    assert g.bytes == 4 * (1000 * 512 + 512 * 2048 + 1000 * 2048)


def test_elementwise_binary_unary_and_scalar_forms():
    add = Elementwise("add", 1000, "fp32")
    assert add.bytes == 4 * 1000 * 3 and add.flops == 1000
    relu = Elementwise("relu", 1000, "bf16")
    assert relu.bytes == 2 * 1000 * 2
    scalar_add = Elementwise("add", 1000, "fp32", inputs=1)  # x + 2.0
    assert scalar_add.bytes == 4 * 1000 * 2
    gelu = Elementwise("gelu", 10, "fp32")
    assert gelu.flops > relu.flops / 1000 * 10  # transcendental kinds cost more per element


def test_row_ops_by_hand():
    s = Softmax(rows=32, cols=1024, dtype="fp32")
    assert s.bytes == 4 * 2 * 32 * 1024
    ln = LayerNorm(rows=32, cols=1024, dtype="fp16")
    assert ln.bytes == 2 * (2 * 32 * 1024 + 2 * 1024)  # x in, y out, weight and bias
    rms = RMSNorm(rows=32, cols=1024, dtype="fp16")
    assert rms.bytes == 2 * (2 * 32 * 1024 + 1024)
    assert ln.flops > rms.flops > 0


def test_dropout_writes_a_byte_mask():
    d = Dropout(numel=1000, dtype="fp16", p=0.1)
    assert d.bytes == 1000 * (2 + 2 + 1)


def test_embedding_bag_by_hand():
    e = EmbeddingBag(batch=4, rows=10_000, dim=64, pooling=20, dtype="fp32")
    lookups = 4 * 20
    assert e.bytes == lookups * 64 * 4 + lookups * 8 + 4 * 64 * 4
    assert e.flops == lookups * 64


def test_attention_causal_keeps_the_masked_pairs_only():
    a = Attention(b=2, heads=8, seq_q=1024, seq_kv=1024, head_dim=64, dtype="bf16")
    c = Attention(b=2, heads=8, seq_q=1024, seq_kv=1024, head_dim=64, dtype="bf16", causal=True)
    assert a.flops == 4 * 2 * 8 * 1024 * 1024 * 64
    assert a.flops / 2 < c.flops < a.flops / 2 * 1.01  # the diagonal: a bit over half
    assert a.bytes == 2 * 4 * 2 * 8 * 1024 * 64


@pytest.mark.parametrize("seq_q,seq_kv", [(7, 7), (3, 10), (10, 3), (1, 64), (64, 1)])
def test_attention_causal_unequal_lengths_counts_torch_mask(seq_q, seq_kv):
    """is_causal in torch aligns the mask top-left: count what torch's own mask keeps."""
    import torch

    kept = float(torch.ones(seq_q, seq_kv, dtype=torch.bool).tril().sum())
    full = Attention(b=1, heads=2, seq_q=seq_q, seq_kv=seq_kv, head_dim=4)
    causal = Attention(b=1, heads=2, seq_q=seq_q, seq_kv=seq_kv, head_dim=4, causal=True)
    assert causal.flops == pytest.approx(full.flops * kept / (seq_q * seq_kv))


def test_memcpy():
    assert Memcpy(1000).bytes == 2000
    assert Memcpy(1000, "h2d").bytes == 1000 and Memcpy(1000).flops == 0


@pytest.mark.parametrize("make", [
    lambda: Gemm(m=0, n=1, k=1),
    lambda: Gemm(m=1, n=-3, k=1),
    lambda: Gemm(m=1.5, n=1, k=1),
    lambda: Gemm(m=1, n=1, k=1, dtype="int4"),
    lambda: Elementwise("frobnicate", 10),
    lambda: Softmax(rows=0, cols=4),
    lambda: Dropout(numel=10, p=1.0),
    lambda: EmbeddingBag(1, 1, 1, 1, mode="max"),
    lambda: Memcpy(10, "sideways"),
])
def test_impossible_ops_raise_kit_error(make):
    with pytest.raises(KitError):
        make()
