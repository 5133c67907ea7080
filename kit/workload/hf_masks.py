"""The attention masks of a decode step, built as HF transformers 5.25 builds them
(masking_utils.py), for the zoo's Llama-style decoders (kit.workload.zoo_modern).

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
548): the 2D attention mask generate() keeps (one column per token seen), as bool
(_preprocess_mask_arguments, :835), padded with False up to the cache's length
(prepare_padding_mask, :222-231); the batch, head, query and key indices (aranges, the query's and
keys' shifted by their offsets, :528-531); and the mask functions, each an and_masks (a
one-element True, then `&` each part, :51-55): causal kv <= q (:74-78), a sliding window's
kv > q - window (:90-99), and the padding mask indexed at [batch, kv] (:166-175). The result is
(batch, 1, query, keys), boolean, expanded over nothing (:539).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


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


def _and(*parts):
    """HF's and_masks: a one-element True, then `&` each part."""
    out = torch.ones((), dtype=torch.bool, device=parts[0].device)
    for part in parts:
        out = out & part
    return out


def hf_sdpa_mask(b: int, s: int, past: int, keys: int, offset: int, window: int, device):
    """The boolean (b, 1, s, keys) mask of a step whose `past` tokens are cached: key j (at
    position offset + j) is seen from query i (at past + i) when it is not in the future, within
    the window if any, and among the tokens seen so far (the padding mask), as sdpa_mask builds
    it (module doc)."""
    seen = torch.ones(b, past + s, dtype=torch.bool, device=device)  # generate's 2D mask, as bool
    if keys + offset > past + s:  # padded to the cache's length: the empty slots masked
        seen = F.pad(seen, (0, keys + offset - past - s))
    batch = torch.arange(b, device=device)[:, None, None, None]
    torch.arange(1, device=device)  # the head index: sdpa_mask makes it, no mask function reads it
    q = (torch.arange(s, device=device) + past)[None, None, :, None]
    kv = (torch.arange(keys, device=device) + offset)[None, None, None, :]
    causal = kv <= q
    if window:  # sliding_window_causal_mask_function: the overlay and the causal mask
        causal = _and(kv > q - window, causal)
    return _and(causal, seen[batch, kv]).expand(b, 1, s, keys)
