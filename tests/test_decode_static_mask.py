"""A decode step's attention mask as HF transformers 5.25 builds it (kit.workload.hf_masks): a
static cache is masked at every step, over its whole preallocated length; a dynamic cache's
full-attention layers are not. Expectations from HF's source (masking_utils.py, cache_utils.py,
integrations/sdpa_attention.py), counted by hand."""
import pytest
import torch

from kit.errors import KitError
from kit.workload import zoo
from kit.workload.hf_masks import hf_sdpa_mask

# 4 query heads over 2 KV heads of 8: HF's pack_gqa folds a KV head's 2 query heads into rows
LLAMA = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 48,
         "vocab_size": 50}


def _decode(cfg, context, cache, dtype="bf16"):
    return zoo.graph_for(cfg, batch=2, seq=context, mode="decode", kv_cache=cache, dtype=dtype,
                         disk=False)


def _ops(g, aten):
    return [n.shapes for n in g if n.aten == aten]


def test_a_static_decode_step_is_masked_over_the_whole_cache_as_hf_runs_it():
    """StaticCache layers are compileable, so create_causal_mask keeps the mask of a one-token
    query (masking_utils.py:976) over the cache's max_cache_len keys (StaticLayer.get_mask_sizes),
    and SDPA, given a boolean mask, gets no flash kernel: the memory-efficient one, its query
    heads packed (pack_gqa). The zoo had run every static step unmasked on flash attention."""
    g = _decode(LLAMA, 16, "static")
    keys = 16 + 1  # the cache: the context and this step's token
    attn = [(n.aten, n.shapes) for n in g if n.op_class == "attention"]
    packed = f"[2,2,2,8]x[2,2,{keys},8]x[2,2,{keys},8]x[2,1,1,{keys}]"
    assert attn == [("aten._scaled_dot_product_efficient_attention.default", packed)] * 2
    # the mask, built once a step: key index <= query position; no 2D mask (generate drops it)
    assert _ops(g, "aten.le.Tensor") == [f"[1,1,1,{keys}]x[1,1,1,1]"]
    assert _ops(g, "aten.index.Tensor") == []
    # and in every layer torch's SDPA makes it additive in q's dtype before the kernel
    assert _ops(g, "aten.where.self") == [f"[2,1,1,{keys}]x[]x[]"] * 2


def test_a_dynamic_decode_step_is_not_masked_where_hf_skips_it():
    """Over a DynamicCache, _ignore_causal_mask_sdpa skips the mask of a one-token query without
    padding (masking_utils.py:292): flash attention over the grouped heads, no mask built."""
    g = _decode(LLAMA, 16, "dynamic")
    attn = [(n.aten, n.shapes) for n in g if n.op_class == "attention"]
    assert attn == [("aten._scaled_dot_product_flash_attention.default",
                     "[2,4,1,8]x[2,2,17,8]x[2,2,17,8]")] * 2
    for aten in ("aten.le.Tensor", "aten.index.Tensor", "aten.where.self"):
        assert _ops(g, aten) == []


def test_a_static_sliding_layer_is_masked_before_its_window_fills():
    """A StaticSlidingWindowLayer is compileable too (masking_utils.py:1224): masked at every
    step, over min(window, max_cache_len) keys, the window's overlay (kv > q - window) in the
    mask. The zoo had masked it only once the window was full."""
    mistral = {**LLAMA, "model_type": "mistral", "num_hidden_layers": 1, "sliding_window": 8}
    g = _decode(mistral, 4, "static")
    assert [n.shapes for n in g if n.op_class == "attention"] == [
        "[2,2,2,8]x[2,2,5,8]x[2,2,5,8]x[2,1,1,5]"]
    assert _ops(g, "aten.gt.Tensor") == ["[1,1,1,5]x[1,1,1,1]"]
    dynamic = _decode(mistral, 4, "dynamic")  # 5 keys, fewer than the window: skipped
    assert _ops(dynamic, "aten.gt.Tensor") == [] and _ops(dynamic, "aten.where.self") == []


@pytest.mark.parametrize("past, keys, offset, window, seen", [
    (5, 8, 0, 0, [1] * 6 + [0] * 2),  # a static cache of 8: the 6 tokens so far, 2 empty slots
    (9, 4, 6, 4, [1] * 4),  # a full window of 4: positions 6..9, all seen from position 9
    (2, 4, 0, 4, [1] * 3 + [0]),  # a window of 4 not yet full: 3 tokens, 1 empty slot
    (5, 6, 0, 0, [1] * 6),  # a dynamic cache: every key is a token
])
def test_the_mask_sees_the_tokens_so_far_and_no_empty_slot(past, keys, offset, window, seen):
    mask = hf_sdpa_mask(2, 1, past, keys, offset, window, "cpu")
    assert mask.dtype == torch.bool and tuple(mask.shape) == (2, 1, 1, keys)
    assert mask[:, 0, 0].tolist() == [[bool(x) for x in seen]] * 2


def test_a_preallocated_static_cache_is_read_and_masked_whole():
    """HF's generate sizes a StaticCache for the whole answer (max_cache_len = prompt + new
    tokens - 1, generation/utils.py:2039, 2966); every step's SDPA reads all of it, the slots
    not yet written masked: the 2D mask of the 17 tokens so far padded with False to 24."""
    g = zoo.graph_for(LLAMA, batch=2, seq=16, mode="decode", dtype="bf16", cache_len=24,
                      disk=False)
    assert [n.shapes for n in g if n.op_class == "attention"] == [
        "[2,2,2,8]x[2,2,24,8]x[2,2,24,8]x[2,1,1,24]"] * 2
    assert _ops(g, "aten.constant_pad_nd.default") == []  # no 2D mask to pad (generate drops it)
    # 2 layers x K and V x batch 2 x 2 KV heads x 24 rows x head 8 x bf16
    assert g.meta["kv_cache_bytes"] == 2 * 2 * 2 * 2 * 24 * 8 * 2
    with pytest.raises(KitError, match=r"at least the context and the step's token \(17\); got room for 16$"):
        zoo.graph_for(LLAMA, batch=2, seq=16, mode="decode", cache_len=16, disk=False)
    with pytest.raises(KitError, match="got a dynamic cache$"):
        zoo.graph_for(LLAMA, batch=2, seq=16, mode="decode", kv_cache="dynamic", cache_len=24,
                      disk=False)


def test_generation_steps_read_the_cache_generate_preallocates():
    """A 16-token prompt and 9 new tokens: HF's static cache holds 24; each decode step is the
    step over that cache, not over its own context + 1."""
    from kit.workload.generation import generation, hf_loop
    from kit.workload.iteration import iteration
    from kit.workload.models import graph_of

    cfg = {**LLAMA, "name": "tiny-llama-mask"}
    # eager, as asked (disable_compile: HF's default compiles them, test_generate_hf_auto_compile)
    gen = generation(cfg, "h100-sxm", batch=2, prompt=16, new_tokens=9, dtype="bf16",
                     disable_compile=True)
    first = gen["decode_steps"][0]
    assert first["context"] == 16

    def step(**kw):  # with HF's greedy loop ops around it (tests/test_hf_generate_loop.py)
        return iteration(hf_loop(cfg, 2)(graph_of(cfg, 2, 16, "decode", "bf16", **kw), 17, 1),
                         "h100-sxm")

    whole, own = step(cache_len=24), step()
    # the same kernels (a tiny host-bound step: the same total); the larger cache's GPU work
    assert whole.kernel_ms > own.kernel_ms
    assert first["ms"] == pytest.approx(whole.total_ms, rel=1e-12)
    assert first["kernel_ms"] == pytest.approx(whole.kernel_ms, rel=1e-12)
    dynamic = generation(cfg, "h100-sxm", batch=2, prompt=16, new_tokens=9, dtype="bf16",
                         kv_cache="dynamic")
    grown = step(kv_cache="dynamic")
    assert dynamic["decode_steps"][0]["ms"] == pytest.approx(grown.total_ms, rel=1e-12)


@pytest.mark.parametrize("model, mode, match", [
    ("bert-base", "inference", "goes with mode decode, not inference"),
    (LLAMA, "train", "goes with mode decode, not train"),
])
def test_a_preallocated_cache_is_refused_where_it_is_not_modelled(model, mode, match):
    """A training step has no decode cache (cache_len had been dropped), nor a prefill but
    generate's of a decoder (every zoo decoder's prefill is HF 5.25's:
    tests/test_generate_prefill_hf5.py; an encoder has none). Every zoo decoder takes one in decode
    (tests/test_decode_hf5_gpt2_opt_deepseek.py)."""
    from kit.workload.models import graph_of

    with pytest.raises(KitError, match=match):
        graph_of(model, 2, 16, mode, cache_len=24)


def test_a_preallocated_sliding_layer_holds_its_window_only():
    """HF's StaticSlidingWindowLayer preallocates min(window, max_cache_len) rows
    (cache_utils.py:539-541) and, not yet full, masks that many keys (get_mask_sizes: kv_length =
    the window, offset 0, :626-643). A window of 8 in a cache preallocated for 13: the sliding
    layer reads and masks 8 keys before its window fills, the full-attention layer all 13."""
    hybrid = {**LLAMA, "model_type": "qwen2", "sliding_window": 8, "use_sliding_window": True,
              "max_window_layers": 1, "layer_types": ["full_attention", "sliding_attention"]}
    g = zoo.graph_for(hybrid, batch=2, seq=4, mode="decode", dtype="bf16", cache_len=13,
                      disk=False)
    assert [n.shapes for n in g if n.op_class == "attention"] == [
        "[2,2,2,8]x[2,2,13,8]x[2,2,13,8]x[2,1,1,13]", "[2,2,2,8]x[2,2,8,8]x[2,2,8,8]x[2,1,1,8]"]
    # K and V x batch 2 x 2 KV heads x (13 + 8) rows x head 8 x bf16
    assert g.meta["kv_cache_bytes"] == 2 * 2 * 2 * (13 + 8) * 8 * 2


# sdpa_mask with attention_mask None (generation/utils.py:2902-2910 drops generate's all-ones 2D
# mask; masking_utils.py:222-231, 525-531, 539), then prepare_inputs_for_generation's
# .contiguous() (generation/utils.py:754-762): one (aten op, shapes) per kernel, read off the lines
MASK_FULL = [("aten.arange.default", ""), ("aten.arange.default", ""),  # batch, head indices
             ("aten.arange.default", ""), ("aten.add.Tensor", "[{s}]"),  # q + q_offset
             ("aten.arange.default", ""), ("aten.add.Tensor", "[{k}]"),  # kv + kv_offset
             ("aten.le.Tensor", "[1,1,1,{k}]x[1,1,{s},1]")]  # causal_mask_function, :74-78
# sliding_window_causal_mask_function = and_masks(overlay, causal) (:51-55, 90-99, 132-136):
# True, q - window, kv > it, kv <= q, then the two &s
MASK_WINDOW = MASK_FULL[:6] + [("aten.ones.default", ""), ("aten.sub.Tensor", "[1,1,{s},1]"),
                               ("aten.gt.Tensor", "[1,1,1,{k}]x[1,1,{s},1]"),
                               ("aten.bitwise_and.Tensor", "[]x[1,1,1,{k}]"),
                               ("aten.le.Tensor", "[1,1,1,{k}]x[1,1,{s},1]"),
                               ("aten.bitwise_and.Tensor", "[1,1,1,{k}]x[1,1,1,{k}]")]


def _mask_ops(g):
    """The kernels the step launches outside its layers after the rotary tables' last cast to
    the model's dtype, up to the first layer: the mask's."""
    top = []
    for n in g:
        if n.module:
            if top:
                break
            continue
        top.append(n)
    casts = [i for i, n in enumerate(top) if n.aten == "aten._to_copy.default"]
    return [(n.aten, n.shapes) for n in top[casts[-1] + 1:] if n.kernels]


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("window", [0, 8])
def test_a_static_step_builds_its_mask_without_generates_dropped_2d_mask(batch, window):
    """generate() drops the all-ones 2D mask (no padding), so sdpa_mask has no padding mask: the
    index aranges, their offsets, the mask function; and makes the expanded mask contiguous, a
    copy for a batch over 1. The kit had built the 2D mask too (ones, padded to the cache,
    indexed at [batch, kv], and-ed in: six kernels HF never launches)."""
    cfg = ({**LLAMA, "num_hidden_layers": 1} if not window else
           {**LLAMA, "model_type": "mistral", "num_hidden_layers": 1, "sliding_window": window})
    g = zoo.graph_for(cfg, batch=batch, seq=4, mode="decode", kv_cache="static", dtype="bf16",
                      cache_len=6, disk=False)
    keys = min(window, 6) if window else 6
    want = [(a, sh.format(s=1, k=keys)) for a, sh in (MASK_WINDOW if window else MASK_FULL)]
    if batch > 1:  # (1, 1, 1, keys) expanded over the batch, then .contiguous()
        want.append(("aten.clone.default", f"[{batch},1,1,{keys}]"))
    assert _mask_ops(g) == want


def test_a_dynamic_step_keeps_its_sliding_mask_expanded():
    """A dynamic cache's mask is built inside the forward (create_sliding_window_causal_mask),
    not by generate(): no .contiguous() copy."""
    mistral = {**LLAMA, "model_type": "mistral", "num_hidden_layers": 1, "sliding_window": 4}
    g = zoo.graph_for(mistral, batch=2, seq=8, mode="decode", kv_cache="dynamic", dtype="bf16",
                      disk=False)
    assert _ops(g, "aten.gt.Tensor") and _mask_ops(g)[-1][0] != "aten.clone.default"
