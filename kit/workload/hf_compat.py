"""Hugging Face transformers' value checks, answered for the inputs the capture feeds.

The capture runs on meta tensors, which hold no values. HF's masking code (transformers 5,
`transformers.masking_utils`) reads values in two checks on the way to its attention masks:

* `find_packed_sequence_indices(position_ids)` asks whether several sequences are packed into one
  row (position ids that restart). It runs when a forward gets no attention mask and no cache,
  as a forward with `use_cache=False` does, and it ends in `.all()`.
* `fast_all(padding_mask)` asks whether a given 2-D attention mask masks any token. It decides
  whether SDPA can run with `is_causal` (flash) or needs a materialised mask.

The inputs the kit feeds are token ids of one sequence per row, with no padding, so the answers
are known without the values: no packing (None, HF's own answer for that case) and no padding
(True). `answered()` puts those answers in place for the length of a capture, only where the
module is already imported (the kit never imports transformers), and restores HF's functions
after. A user's own mask with real padding is then read as no padding: the capture prices the
mask-free kernels, as HF runs them for a batch without padding.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager

MASKING = "transformers.masking_utils"


def _unpacked(position_ids):
    return None  # one sequence per row (HF returns None for that case)


def _no_padding(mask):
    return True  # every token is real


ANSWERS = {"find_packed_sequence_indices": _unpacked, "fast_all": _no_padding}


@contextmanager
def answered():
    """HF's value checks answered for unpacked, unpadded token ids while the block runs."""
    mod = sys.modules.get(MASKING)
    swapped = {name: getattr(mod, name) for name in ANSWERS if mod is not None and hasattr(mod, name)}
    try:
        for name in swapped:
            setattr(mod, name, ANSWERS[name])
        yield
    finally:
        for name, fn in swapped.items():
            setattr(mod, name, fn)
