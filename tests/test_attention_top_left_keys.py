"""A causal attention over more keys than queries (generate's prefill over a static cache
preallocated to P + N - 1 rows would be one, but HF 5.25's sdpa_attention_forward keeps the first
P keys first, integrations/sdpa_attention.py:164-173, kit.workload.hf_masks.causal_prefill_keys,
so that prefill runs the square flash call; another caller's op still can): torch's is_causal
aligns the mask top-left, so query i (from 0) sees keys 0..i and every key from P on is hidden
from every query; torch's memory-efficient kernel (the one it runs there: flash refuses a
non-square causal mask) clips each query block's keys at the block's last row
(mem_eff_attention/kernel_forward.h, CausalFromTopLeft). Its work is the square P x P causal
attention's: the same pairs, the same K/V rows read, the same price."""
from __future__ import annotations

import pytest

from kit.hardware import get_gpu
from kit.ops import Attention
from kit.predict import get_predictor

P, CACHE = 512, 512 + 128 - 1  # generate 512 + 128 tokens: a 639-row static cache


@pytest.fixture(scope="module")
def tile():
    return get_predictor("tile")


def test_bytes_read_stop_at_the_last_query():
    """b=8, 12 heads of 64 (GPT-2), fp16: Q and O are 8 x 12 x 512 x 64 each, and the kernel
    reads K and V for keys 0..511 only: 8 x 12 x 512 x 64 each; 2 bytes an element."""
    op = Attention(8, 12, P, CACHE, 64, "fp16", causal=True)
    per_tensor = 8 * 12 * 512 * 64
    assert op.bytes == 2 * 4 * per_tensor == 25_165_824
    # the FLOPs were the triangle already: 512 x 513 / 2 pairs, 2 x 64 FLOPs each for Q.K and P.V
    assert op.flops == 8 * 12 * (512 * 513 // 2) * 2 * (64 + 64)
    # unmasked, it reads every key
    assert Attention(8, 12, P, CACHE, 64, "fp16").bytes == 2 * (2 * per_tensor + 2 * 8 * 12 * CACHE * 64)
    # more queries than keys: every key is read
    assert Attention(8, 12, CACHE, P, 64, "fp16", causal=True).bytes == \
        Attention(8, 12, CACHE, P, 64, "fp16").bytes


@pytest.mark.parametrize("heads,kv_heads,head_dim,window", [
    (12, None, 64, 0),     # gpt2
    (32, None, 64, 0),     # opt-1.3b
    (32, 8, 128, 0),       # llama3-8b (grouped-query)
    (32, 8, 128, 256),     # a sliding window inside the prompt
])
@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-pcie-40gb"])
def test_prefill_over_the_preallocated_cache_prices_as_the_square_one(tile, gpu, heads, kv_heads,
                                                                        head_dim, window):
    """P queries over a P + N - 1 key cache, causal top-left: the kernel's work is the P x P
    causal attention's, so the tile predictor prices both the same (latency and band); it had
    priced the K/V of all 639 rows (gpt2 on the H100: 34.38 against 32.55 us)."""
    g = get_gpu(gpu)
    wide = Attention(8, heads, P, CACHE, head_dim, "fp16", causal=True, kv_heads=kv_heads,
                     window=window)
    square = Attention(8, heads, P, P, head_dim, "fp16", causal=True, kv_heads=kv_heads,
                       window=window)
    pred = tile.predict([wide, square], g)
    for col in ("latency_ms", "latency_p10_ms", "latency_p90_ms"):
        a, b = pred[col].tolist()
        assert a == pytest.approx(b, rel=1e-12), col
