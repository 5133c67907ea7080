"""The attention masks of a decode step, built as HF transformers 5.25 builds them
(masking_utils.py), for the zoo's decoders: Llama-style (kit.workload.zoo_modern), GPT-2, OPT
(kit.workload.zoo_models) and DeepSeek-V3 (kit.workload.zoo_deepseek), whose HF 5.25 models
all call create_causal_mask and run SDPA by default (_supports_sdpa; modeling_utils.py:1856:
no attn_implementation asked is "sdpa").

Whether a decode step has a mask at all (`decode_mask_size`):
* a static cache (StaticCache: every layer is_compileable, cache_utils.py:413) always has one:
  create_causal_mask and create_sliding_window_causal_mask turn the skip off for a compileable
  cache and a one-token query (masking_utils.py:976, 1224), and generate() builds the masks before
  each step (prepare_inputs_for_generation, generation/utils.py:733-744). The mask spans the
  whole preallocated cache (StaticLayer.get_mask_sizes: kv_length = max_cache_len,
  cache_utils.py:496-500), empty slots included, for the keys SDPA reads are the whole cache
  tensor (StaticLayer.update returns self.keys, cache_utils.py:494); a sliding layer's spans its
  min(window, max_cache_len) rows (StaticSlidingWindowLayer, cache_utils.py:539-541, 626-643);
* a dynamic cache's full-attention layers have none: _ignore_causal_mask_sdpa skips it for a
  one-token query without padding (masking_utils.py:292), and SDPA runs unmasked;
* a dynamic sliding layer has one once its keys reach the window (masking_utils.py:286);
* eager attention (Gemma 2, GPT-OSS) always has one: eager_mask never skips (masking_utils.py:
  598-618) and makes it additive with a where.

What building one launches (`hf_sdpa_mask`, sdpa_mask's non-vmap path, masking_utils.py:512-
548), with no 2D attention mask: generate() drops an all-ones one before the first pass
(generation/utils.py:2902-2910: no padding; SDPA, not flash attention) and never extends it
(:1288-1292 see None), so sdpa_mask gets attention_mask None and prepare_padding_mask (:222-231)
returns None: no padding mask, no padding function (:525-526). It makes the batch, head, query
and key indices (aranges, the query's and keys' shifted by their offsets, :528-531) and applies
the mask function: causal kv <= q alone (causal_mask_function, :74-78), or for a sliding layer
sliding_window_causal_mask_function's and_masks (a one-element True, then `&` each part,
:51-55, 132-136) of kv > q - window (:90-99) and the causal part. The result, (1, 1, query, keys)
boolean, is expanded over the batch (:539), a view. generate() builds a static cache's masks
itself (prepare_inputs_for_generation, generation/utils.py:733-744) and makes each contiguous
(:754-762): a copy of the expanded mask for a batch over 1 (`contiguous`). It had built the
2D mask all the same (ones, padded to the cache's length, indexed at [batch, kv] and and-ed in:
six kernels a mask that HF never launches).
"""
from __future__ import annotations

import torch


def decode_mask_size(cache, window: int, s: int, eager: bool) -> tuple[int, int] | None:
    """(keys, offset) of the mask HF gives a decode layer over `cache` (a kv_cache.LayerCache),
    or None where it builds none (module doc). keys: the mask's last dim, the keys attention
    reads; offset: the position of its first key (kv_offset)."""
    dynamic = cache.kind == "dynamic"
    keys = cache.keys.size(2) + (s if dynamic else 0)
    if not (eager or not dynamic or (window and keys >= window)):
        return None
    full = window and cache.context >= window  # the window full: its first key is context - w + 1
    return keys, (cache.context - window + s if full else 0)


def _and(device, *parts):
    """HF's and_masks (masking_utils.py:51-55): a one-element True, then `&` each part in turn,
    each made when its turn comes (parts: functions of nothing)."""
    out = torch.ones((), dtype=torch.bool, device=device)
    for part in parts:
        out = out & part()
    return out


def hf_sdpa_mask(b: int, s: int, past: int, keys: int, offset: int, window: int, device):
    """The boolean (b, 1, s, keys) mask of a step whose `past` tokens are cached: key j (at
    position offset + j) is seen from query i (at past + i) when it is not in the future and,
    with a window, within it, as sdpa_mask builds it without a 2D attention mask (module doc).
    A static cache's empty slots are future positions: the causal part masks them. Expanded over
    the batch, as sdpa_mask returns it (a view; `contiguous` gives generate()'s copy)."""
    torch.arange(b, device=device)  # the batch index: sdpa_mask makes it, no mask function reads it
    torch.arange(1, device=device)  # the head index: likewise
    q = (torch.arange(s, device=device) + past)[None, None, :, None]
    kv = (torch.arange(keys, device=device) + offset)[None, None, None, :]
    if window:  # sliding_window_causal_mask_function: the overlay, then the causal mask
        mask = _and(device, lambda: kv > q - window, lambda: kv <= q)
    else:  # causal_mask_function alone
        mask = kv <= q
    return mask.expand(b, 1, s, keys)


def decode_mask(masks: dict, cache, window: int, h, eager: bool = False):
    """A decode step's mask for one layer over `cache` (None: none), built once a forward for
    each kind of layer (`masks`: the forward's, by kind), as HF 5.25's create_causal_mask and
    create_sliding_window_causal_mask build it for every decoder that calls them (Llama-style,
    modeling_gpt2.py:583, modeling_opt.py:363, modeling_deepseek_v3.py:593): over a static cache
    always, over its whole preallocated length (the empty slots too), boolean, so SDPA gets no
    flash kernel; over a dynamic cache skipped except on a sliding layer whose keys reach its
    window (decode_mask_size). eager (Gemma 2, GPT-OSS): eager_mask never skips, and makes the
    mask additive, 0 / dtype min (one where a kind). h: the step's hidden states (batch, 1, d)."""
    b, s = h.shape[:2]
    if cache.prefill and not (eager or window):
        # generate's prefill over an empty static cache: sdpa_mask skips the mask (q_offset 0,
        # no padding: masking_utils.py:297-300), and SDPA runs is_causal (sdpa_attention.py:149)
        # over the first P rows of the preallocated cache (causal_prefill_keys); over an empty
        # dynamic cache kv_length is the prompt's (DynamicLayer.get_mask_sizes,
        # cache_utils.py:140-144), q_length == kv_length skips it (masking_utils.py:291-292)
        return None
    size = (prefill_window_mask_size(cache, window, s, eager) if cache.prefill and window
            else decode_mask_size(cache, window, s, eager))
    if size is None:
        return None
    kind = (bool(window), *size)
    if kind not in masks:
        mask = hf_sdpa_mask(b, s, cache.context, *size, window, h.device)
        if eager:
            mask = torch.where(mask, torch.zeros((), dtype=h.dtype, device=h.device),
                               torch.finfo(h.dtype).min)
        if cache.kind != "dynamic":  # generate() builds it, then makes it contiguous
            mask = contiguous(mask)
        masks[kind] = mask
    return masks[kind]


def prefill_window_mask_size(cache, window: int, s: int, eager: bool) -> tuple[int, int] | None:
    """(keys, offset) of a sliding layer's mask in generate's prefill (its cache empty), or None
    where it is skipped, as create_sliding_window_causal_mask sizes it (transformers 5.25) from
    the layer's get_mask_sizes before its first update: kv_offset 0, and kv_length the prompt's s
    over a dynamic layer (DynamicSlidingWindowLayer, cache_utils.py:259-268), over a static one
    its min(window, max_cache_len) rows, or s where the prompt overfills them
    (StaticSlidingWindowLayer, :626-640), the keys its update returns. Skipped while
    kv_length < window (_ignore_causal_mask_sdpa, masking_utils.py:285-300: q_offset 0, no
    padding), so SDPA runs is_causal; built from the window on (:285-286); eager (Gemma 2,
    GPT-OSS): never skipped (eager_mask)."""
    keys = max(cache.keys.size(2), s)  # a dynamic layer's cache holds none yet
    if keys < window and not eager:
        return None
    return keys, 0


def contiguous(mask):
    """prepare_inputs_for_generation's mask.contiguous() (generation/utils.py:754-762) on a
    static cache's mask, which generate() builds before the pass: a copy when the mask is
    expanded over a batch of more than one, nothing when it is contiguous already."""
    return mask.contiguous()


def causal_prefill_keys(q, k, v, causal: bool):
    """The keys and values an is_causal SDPA call reads, as sdpa_attention_forward cuts them
    (transformers 5.25 integrations/sdpa_attention.py:164-173): unmasked, causal, several queries
    and more keys than queries (generate's prefill over an empty static cache, whose update
    returns the whole preallocated tensor) keep the first q_length rows, views, so that SDPA is
    square and may take the flash kernel; the attention had read all max_cache_len rows (the
    memory-efficient kernel, flash refusing a non-square causal mask)."""
    n = q.size(-2)
    if causal and n > 1 and k.size(-2) > n:
        return k[:, :, :n], v[:, :, :n]
    return k, v
