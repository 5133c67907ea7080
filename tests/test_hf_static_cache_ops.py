"""The static cache's writes launch what HF transformers 5.25's cache layers launch
(cache_utils.py, kit.workload.kv_cache.hf_static_update), in a decode step and in the prefill
that first fills the cache. Every expected op below is read off HF's source lines, named at
each test; the byte counts are worked by hand."""
import pytest

from kit.workload import zoo
from kit.workload.generation import generation, hf_loop, static_cache_len
from kit.workload.iteration import iteration
from kit.workload.models import graph_of

GPU = "h100-sxm"
# 2 KV heads of 16 (hidden 64 / 4 heads), 2 layers
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 128,
         "vocab_size": 100, "name": "tiny-llama"}
MISTRAL = {**LLAMA, "model_type": "mistral", "sliding_window": 8, "name": "tiny-mistral"}
B, KV, D = 2, 2, 16

# StaticLayer.update (:479-485): cache_position = arange(kv_length) + cumulative_length (an
# arange, an add: both on the device); cumulative_length.add_(kv_length); index_copy_ keys, values
STATIC_LAYER = ["aten.arange.default", "aten.add.Tensor", "aten.add_.Tensor",
                "aten.index_copy_.default", "aten.index_copy_.default"]
# StaticSlidingWindowLayer.update, not full (:603-613): the same, the add_ after the copies
SLIDING_ROOM = ["aten.arange.default", "aten.add.Tensor", "aten.index_copy_.default",
                "aten.index_copy_.default", "aten.add_.Tensor"]
# ... full, one new token (:571-584): roll keys and values, torch.tensor([-1]) (made on the host
# and copied to the device: no kernel), new_keys[:, :, index] = ... (index_put_) each, copy_ back
SLIDING_FULL = ["aten.roll.default", "aten.roll.default", "aten.index_put_.default",
                "aten.index_put_.default", "aten.copy_.default", "aten.copy_.default"]
CACHE_OPS = {"aten.arange.default", "aten.add_.Tensor", "aten.index_copy_.default",
             "aten.roll.default", "aten.index_put_.default", "aten.cat.default", "aten.copy_.default"}


def _cache_ops(g, layer: int) -> list[str]:
    """The layer's ops from its cache write to its attention: those after the rotary (its last
    add of the keys) and before the mask's conversion."""
    attn = [n for n in g.nodes if n.module == f"layers.{layer}.self_attn" and n.kernels]
    start = max(i for i, n in enumerate(attn) if n.aten == "aten.add.Tensor"
                and n.shapes == f"[{B},{KV},1,{D}]x[{B},{KV},1,{D}]") + 1
    out = []
    for n in attn[start:]:
        if n.aten not in CACHE_OPS and not (n.aten == "aten.add.Tensor" and n.shapes == "[1]x[]"):
            break
        out.append(n.aten)
    return out


def _step(cfg, context, cache_len=None):
    return zoo.graph_for(cfg, B, context, "decode", "bf16", disk=False, cache_len=cache_len)


@pytest.mark.parametrize("cache_len", [None, 40])
def test_a_static_decode_step_writes_its_cache_as_hfs_static_layer(cache_len):
    """Each layer makes its positions from its own cumulative_length and advances it, three
    kernels a layer the zoo had not launched (it wrote at one model-wide cache_position arange,
    HF 4's, which HF 5.25's LlamaModel no longer makes: generate passes position_ids)."""
    g = _step(LLAMA, 16, cache_len)
    for layer in range(LLAMA["num_hidden_layers"]):
        assert _cache_ops(g, layer) == STATIC_LAYER
    writes = [n for n in g.nodes if n.aten == "aten.index_copy_.default"]
    rows = cache_len or 16 + 1
    assert [n.shapes for n in writes] == [f"[{B},{KV},{rows},{D}]x[1]x[{B},{KV},1,{D}]"] * 4
    # the positions: a 1-element arange and add, and the length advanced, per layer
    assert [n.shapes for n in g.nodes if n.aten == "aten.add_.Tensor"] == ["[]"] * 2


def test_a_static_sliding_window_writes_and_shifts_as_hfs_sliding_layer():
    """Window 8: with room (context 5) the sliding layer writes as the static one, its length
    advanced after the copies; full (context 9) it rolls, puts the new row at -1 and copies back
    (six kernels, no cat), where the zoo had concatenated the window's last 7 rows with the new
    one (cat, cat, copy_, copy_)."""
    room, full = _step(MISTRAL, 5, 12), _step(MISTRAL, 9, 12)
    for layer in range(MISTRAL["num_hidden_layers"]):
        assert _cache_ops(room, layer) == SLIDING_ROOM
        assert _cache_ops(full, layer) == SLIDING_FULL
    window = f"[{B},{KV},8,{D}]"
    assert [n.shapes for n in full.nodes if n.aten == "aten.index_put_.default"] == [
        f"{window}x[1]x[{B},{KV},1,{D}]"] * 4
    assert [n.shapes for n in full.nodes if n.aten == "aten.roll.default"] == [window] * 4


@pytest.mark.parametrize("cfg,prompt", [(LLAMA, 20), (MISTRAL, 5), (MISTRAL, 8), (MISTRAL, 20)])
def test_the_prefill_fills_the_preallocated_cache_with_zeros_then_writes_as_hf(cfg, prompt):
    """generate preallocates max_cache_len = prompt + new - 1 rows (a sliding layer min(window,
    that)) and, calling no early_initialization (generation/utils.py:2197-2210: a chunked prefill
    only), StaticLayer.lazy_initialization (:424-466) runs at the prefill's first update: a
    torch.zeros of every preallocated row, keys and values, then the update writes the prompt
    (a window the prompt overfills, :592-595 and 608-609: its last 8 rows copied in). The
    prefill had written the prompt into a cache of prompt + 1 rows, with no fill."""
    new = 7
    cap = static_cache_len(cfg, prompt, new, "static")
    assert cap == prompt + new - 1
    window = cfg.get("sliding_window")
    rows = min(window, cap) if window else cap
    if window and prompt > rows:
        update = ["aten.copy_.default"] * 2
    else:
        update = SLIDING_ROOM if window else STATIC_LAYER
    # the writes inside each layer, before its attention (tests/test_generate_prefill_hf5.py)
    full = graph_of(cfg, B, prompt, "inference", "bf16", last_logits=True, cache_len=cap)
    own = {"aten.zeros.default", "aten.arange.default", "aten.add_.Tensor",
           "aten.index_copy_.default", "aten.copy_.default"}
    writes = [n for n in full.nodes if n.aten in own and n.layer is not None]
    per_layer = [a for a in ["aten.zeros.default"] * 2 + update if a in own]
    layers = cfg["num_hidden_layers"]
    assert [n.aten for n in writes] == per_layer * layers
    assert [n.layer for n in writes] == [i for i in range(layers) for _ in per_layer]
    for n in writes:
        if n.aten == "aten.zeros.default":  # every preallocated row written, bf16
            assert n.op.bytes == B * KV * rows * D * 2
    r = generation(cfg, GPU, batch=B, prompt=prompt, new_tokens=new, dtype="bf16")
    looped = hf_loop(cfg, B)  # HF's greedy loop ops around the pass (tests/test_hf_generate_loop.py)
    assert r["ttft_ms"] == pytest.approx(iteration(looped(full, prompt, prompt), GPU).total_ms)
    bare = graph_of(cfg, B, prompt, "inference", "bf16", last_logits=True)  # no cache
    assert r["ttft_ms"] > iteration(looped(bare, prompt, prompt), GPU).total_ms
