"""The KV cache of autoregressive decoding, on meta tensors.

One decode step of a decoder-only model reads one new token per sequence. Each attention layer
projects that token's query, key and value, writes the key and value into the cache, and attends
over everything the cache holds:

    per layer: q, k, v = proj(x)            (GEMMs with m = batch: every weight read once)
               cache[:, :, pos] = k, v      (one index_copy_ kernel each, the new token's bytes)
               attention(q, cache)          (reads the whole cache: 2·b·kv_heads·length·d)

A static cache (the default) is preallocated at its full length and written in place, as HF
transformers' StaticCache does (`index_copy_` at `cache_position`) and as serving engines do:
context + 1 rows for one step, or a generation's whole length (`capacity`, as HF's generate sizes
it), attention reading every row, the empty ones masked (kit.workload.hf_masks).
Its size, 2 · layers · batch · kv_heads · length · head_dim · bytes per element, is what
`kit.workload.models.memory_bytes` adds for a decode step.

A dynamic cache (`kind="dynamic"`, HF's DynamicCache, the default of HF's eager generate())
holds only the tokens so far and grows by concatenation: every step and layer, torch.cat reads
the whole cache and writes it again one token longer, for keys and for values. At long contexts
and large batches those copies cost as much as the weights.

A sliding-window layer (Mistral's sliding_window, Gemma 2's every other layer, Gemma 3's five in
six) keeps only the last `window` tokens, as HF's sliding cache layers do: while the context is
shorter the layer is like any other; once it is full, each step shifts the window by one
(static: rolled, the new token put at its end, copied back in place; dynamic: concatenated, then
the oldest dropped), and attention reads `window` tokens.

Every zoo decoder's static writes launch what HF 5.25's cache layers launch
(`hf_static_update`): a position tensor made per layer and step from the layer's own
cumulative_length, which is then advanced in place, around the two index_copy_. GPT-2, OPT and
DeepSeek had written at the model-wide cache_position of HF 4.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import NamedTuple

import torch

from kit.errors import KitError
from kit.workload import host_wait
from kit.workload.modes import KV_CACHES


KINDS = KV_CACHES  # kit.workload.modes keeps the names, so that checking one needs no torch


class LayerCache(NamedTuple):
    """One layer's keys and values, (batch, kv_heads, length, head_dim), and how they grow. A
    NamedTuple, so capture's tree_map reaches (and casts) the tensors and keeps the rest.
    context: the tokens before this step; window: a sliding layer's full length (0: none)."""

    keys: torch.Tensor
    values: torch.Tensor
    kind: str = "static"
    context: int = 0
    window: int = 0
    length: torch.Tensor | None = None  # a static layer's cumulative_length (HF 5.25), int64
    prefill: bool = False  # generate's prefill: a layer not yet initialised (prefill_cache)

    @property
    def sliding(self) -> bool:
        """Whether the window is full, so that this step shifts it."""
        return 0 < self.window <= self.context


def make_cache(kind: str, batch: int, layers: int, kv_heads: int, context: int, head_dim: int,
               windows=None, value_dim: int | None = None, capacity: int | None = None) -> tuple:
    """Per layer a LayerCache of meta tensors holding `context` tokens: static caches have room
    for the step's new token too (capacity: preallocated for that many tokens, as HF's generate
    sizes a StaticCache for the whole answer, max_cache_len = prompt + new tokens - 1; None: just
    the step's context + 1), dynamic ones grow to it. windows: per layer a sliding window
    (0 or None: none); a layer whose window is full holds window tokens (static) or window - 1
    (dynamic, one more after the step); a static one not yet full min(window, capacity), as HF's
    StaticSlidingWindowLayer. value_dim: the values' head size where it is not the keys' (DeepSeek's
    MLA). Floating, so that capture casts them to the model's dtype with the other inputs."""
    if kind not in KINDS:
        raise KitError(f"unknown KV cache {kind!r}: choose {', '.join(KINDS)}")
    if capacity is not None and (kind != "static" or capacity < context + 1):
        # the kind or the size named as the one at fault (a static cache too short had been
        # told "got a static cache")
        got = f"a {kind} cache" if kind != "static" else f"room for {capacity}"
        raise KitError(f"a KV cache preallocated for {capacity} tokens is a static one of at least "
                       f"the context and the step's token ({context + 1}); got {got}")
    rows = context + 1 if capacity is None else capacity
    out = []
    for w in (windows or [0] * layers):
        w = int(w or 0)
        if 0 < w <= context:
            length = w if kind == "static" else w - 1
        elif kind == "static":
            length = min(w, rows) if w else rows
        else:
            length = context
        shape = (batch, kv_heads, length, head_dim)
        vshape = (batch, kv_heads, length, value_dim or head_dim)
        written = torch.zeros((), dtype=torch.long, device="meta") if kind == "static" else None
        out.append(LayerCache(torch.zeros(shape, device="meta"), torch.zeros(vshape, device="meta"),
                              kind, context, w, written))
    return tuple(out)


def cache_bytes(cache, dtype: torch.dtype | None = None) -> int:
    """Bytes a cache occupies after the step (a dynamic one a token longer), counted in `dtype`
    (the model's) if given."""
    size = dtype.itemsize if dtype is not None else None
    total = 0
    for layer in cache:
        for t in (layer.keys, layer.values):
            # a dynamic cache is one token longer after the step; a full dynamic window is a view
            # of the concatenated keys, whose storage holds the whole window
            grown = (t.shape[2] + 1) / t.shape[2] if layer.kind == "dynamic" else 1
            total += t.numel() * grown * (size or t.element_size())
    return int(total)


def check_decode_step(kv_cache, new_tokens: int) -> int:
    """The tokens already in the cache (0 without one). A cache step reads one new token per
    sequence: the attention that follows attends from it to every cached position, which is only
    right for one query (a causal mask over several would have to be offset by the cache)."""
    if kv_cache is None:
        return 0
    if kv_cache[0].prefill:  # generate's prefill: the prompt into an empty cache (prefill_cache)
        return 0
    if new_tokens != 1:
        raise KitError(f"a KV-cache step reads one new token per sequence, got {new_tokens}")
    return kv_cache[0].context


_KEPT: list[list] = []  # kept_tensors' collectors, innermost last


@contextmanager
def kept_tensors():
    """A list that collects the tensors the step's dynamic caches keep past it (each layer's
    grown keys and values, which the next step reads), for capture to count as the step's
    outputs: the model returns only its logits, so a compiled chain that reads the grown cache
    inside itself (llama's rotary, cat and repeat_kv clone) had never written it out."""
    got: list = []
    _KEPT.append(got)
    try:
        yield got
    finally:
        _KEPT.pop()


def cache_update(cache: LayerCache, k, v):
    """This step's keys and values in the cache, and the whole cache to attend over: written
    in place as HF 5.25's cache layers write it (hf_static_update; a full window shifts as
    theirs), or concatenated onto a dynamic cache."""
    if cache.kind == "dynamic":  # a full window drops its oldest token after: a view, no kernel
        past = hf_dynamic_init(k, v, cache.window) if cache.prefill else (cache.keys, cache.values)
        keys, values = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        if _KEPT:  # the next step's cache: written out, however the step reads it
            _KEPT[-1].extend((keys, values))
        return keys, values
    if cache.prefill:
        return hf_prefill_update(cache.keys.shape, cache.values.shape, k, v, cache.window)
    return hf_static_update(cache.keys, cache.values, cache.length, k, v, cache.window,
                            cache.context)


def prefill_cache(cache) -> tuple:
    """A cache of context 0 (make_cache's) as generate's prefill meets it: its layers not yet
    initialised, so that each layer's first update initialises it inside the layer, before its
    attention: a static one preallocated (hf_prefill_update), whose whole length the attention
    reads; a dynamic one empty (hf_dynamic_init, then the concatenation), its attention reading
    the prompt's rows."""
    return tuple(layer._replace(prefill=True) for layer in cache)


def hf_dynamic_init(k, v, window: int = 0) -> tuple:
    """A DynamicLayer's first update, in generate's prefill, as transformers 5.25 runs it inside
    the layer: lazy_initialization (cache_utils.py:113-117) makes its keys and values
    torch.tensor([]) on the device, empty 1-D tensors (no zeros, no preallocated rows: a copy of
    no elements, which launches nothing), and update (:136-137) concatenates the prompt's keys and
    values onto them, torch.cat skipping the empty 1-D tensor: one copy of the P rows each, the
    tensors the layer's attention reads (cache_update). A DynamicSlidingWindowLayer's
    (window > 0) also moves its _sliding_window_tensor, a CPU int64 (:208), to the device
    (.to(device), :218-220): a blocking copy from host memory, after which the host waits for the
    GPU to drain (kit.workload.host_wait.H2D_COPY); its update then keeps the last window - 1
    rows as a view and returns the whole concatenation (:240-249)."""
    if window:
        moved = torch.empty((), dtype=torch.long, device=k.device)  # the copy: no kernel
        host_wait.record(host_wait.H2D_COPY, moved)
    return (torch.tensor([], dtype=k.dtype, device=k.device),
            torch.tensor([], dtype=v.dtype, device=v.device))


def hf_prefill_update(key_shape, value_shape, k, v, window: int = 0):
    """A static layer's first update, in generate's prefill, as transformers 5.25 runs it inside
    the layer: StaticLayer.lazy_initialization (cache_utils.py:424-466) makes the keys and values
    of the preallocated shapes with torch.zeros (a kernel each) and moves cumulative_length, a
    CPU tensor (torch.tensor(0), :422), to the device with .to(device): a blocking copy from host
    memory, after which the host waits for the GPU to drain (kit.workload.host_wait.H2D_COPY);
    mark_static_address launches nothing. Then update writes the prompt's rows
    (hf_static_update) and returns the whole preallocated keys and values (:494), which the
    layer's attention reads."""
    keys = torch.zeros(key_shape, dtype=k.dtype, device=k.device)
    values = torch.zeros(value_shape, dtype=v.dtype, device=v.device)
    length = torch.empty((), dtype=torch.long, device=k.device)  # the copy: no kernel
    host_wait.record(host_wait.H2D_COPY, length)
    return hf_static_update(keys, values, length, k, v, window, 0)


def hf_static_update(keys, values, length, k, v, window: int = 0, cached: int = 0):
    """Write k and v (n new rows) into a preallocated static layer, launching what transformers
    5.25's cache_utils.py launches, and return what it returns. keys, values: the layer's
    preallocated tensors (a sliding layer's min(window, max_cache_len) rows); length: its
    cumulative_length, a 0-dim int64 tensor on the device; cached: the rows written before.
    * StaticLayer.update (:479-485, window 0): the positions arange(n) + length (two kernels:
      the arange and the add, on the device, as length is), length.add_(n) in place (a third),
      then one index_copy_ each for keys and values: three kernels a layer and step beyond them;
    * StaticSlidingWindowLayer.update (:566-611) with room (cached + n <= rows): the same,
      the in-place add after the copies;
    * a full window, one new row (:571-584): keys.roll(-1) and values.roll(-1), an index tensor
      [-1] made on the host (torch.tensor: a blocking copy to the device, no kernel, after which
      the host waits for the GPU to drain: kit.workload.host_wait), the new row put at
      it in each (index_put_), each copied back in place: six kernels where a concatenation of
      the window's last rows and the new one, copied back, had launched four;
    * an empty window that n rows overfill (a long prompt's prefill, :592-595, 608-609): the last
      `rows` of them copied in, the whole of them returned."""
    n, rows = k.shape[-2], keys.shape[-2]
    if window and cached >= rows:
        if n != 1:
            raise KitError(f"a full static window takes one new row a step, got {n}")
        shifted = [t.roll(-1, dims=-2) for t in (keys, values)]
        last = torch.tensor([-1], dtype=torch.long, device=keys.device)
        host_wait.record(host_wait.H2D_COPY, last)  # a blocking copy: the host waits (:578)
        for t, new in zip(shifted, (k, v)):
            t[:, :, last] = new
        keys.copy_(shifted[0])
        values.copy_(shifted[1])
        return keys, values
    if window and cached + n > rows:
        if cached:
            raise KitError(f"a static window of {rows} rows, {cached} written, cannot take "
                           f"{n} more in one step")
        keys.copy_(k[:, :, -rows:])
        values.copy_(v[:, :, -rows:])
        return k, v
    pos = torch.arange(n, device=keys.device) + length
    if not window:  # StaticLayer advances its length before the copies, a sliding layer after
        length.add_(n)
    keys.index_copy_(2, pos, k)
    values.index_copy_(2, pos, v)
    if window:
        length.add_(n)
    return keys, values
