"""A static KV cache for autoregressive decoding, on meta tensors.

One decode step of a decoder-only model reads one new token per sequence. Each attention layer
projects that token's query, key and value, writes the key and value into the cache, and attends
over everything the cache holds:

    per layer: q, k, v = proj(x)            (GEMMs with m = batch: every weight read once)
               cache[:, :, pos] = k, v      (one index_copy_ kernel each, the new token's bytes)
               attention(q, cache)          (reads the whole cache: 2·b·kv_heads·(context+1)·d)

The cache is static: preallocated at its full length and written in place, as HF transformers'
StaticCache does (`index_copy_` at `cache_position`) and as serving engines do. HF's default
DynamicCache instead concatenates (torch.cat) and so copies the whole cache every step; that is
not modelled. Its size, 2 · layers · batch · kv_heads · length · head_dim · bytes per element,
is what `kit.workload.models.memory_bytes` adds for a decode step.
"""
from __future__ import annotations

import torch

from kit.errors import KitError


def static_cache(batch: int, layers: int, kv_heads: int, length: int, head_dim: int) -> tuple:
    """Per layer a (keys, values) pair of meta tensors of shape (batch, kv_heads, length, head_dim).
    Floating, so that capture casts them to the model's dtype with the other inputs."""
    shape = (batch, kv_heads, length, head_dim)
    return tuple((torch.zeros(shape, device="meta"), torch.zeros(shape, device="meta"))
                 for _ in range(layers))


def cache_bytes(cache, dtype: torch.dtype | None = None) -> int:
    """Bytes a cache occupies, counted in `dtype` (the model's) if given."""
    size = dtype.itemsize if dtype is not None else None
    return int(sum(t.numel() * (size or t.element_size()) for pair in cache for t in pair))


def check_decode_step(kv_cache, new_tokens: int) -> int:
    """The tokens already in the cache (0 without one). A cache step reads one new token per
    sequence: the attention that follows attends from it to every cached position, which is only
    right for one query (a causal mask over several would have to be offset by the cache)."""
    if kv_cache is None:
        return 0
    if new_tokens != 1:
        raise KitError(f"a KV-cache step reads one new token per sequence, got {new_tokens}")
    return int(kv_cache[0][0].size(-2)) - new_tokens


def cache_update(cache, k, v, cache_pos):
    """Write this step's keys and values at `cache_pos` (dim 2) and return the whole cache."""
    keys, values = cache
    keys.index_copy_(2, cache_pos, k)
    values.index_copy_(2, cache_pos, v)
    return keys, values
