"""A memo of the tile predictor's batch predictions, for the length of one top-level call.

The GEMM bounds (kit.predict.gemm_bounds) predict twins of a batch, and predict bounds a GPU's
batch by each training GPU it dominates, so one call predicts the same batch of twins on the same
GPU again and again: one predict of 259 varied ops on an A100-SXM4-80GB made 209 batch
predictions (predict_unbounded) of which 70 were distinct, and 151 bounded ones (predict) of
which 61 were. Each repeat is answered from the memo here instead.

A batch is memoised whole, never op by op: the networks' sums can differ in the last bits with
the batch around an op (gemm_bounds.TIE_REL), so only the same batch in the same order is
certain to give the same numbers. The key holds everything else a batch's answer depends on:

- the GPU's spec by value (a GPU dataclass compares and hashes all its fields), so a GPU
  redefined under the same name (a --gpu-file, kit.hardware.register_gpu) is another key;
- whether GEMMs may split (split_k; only its truth is read);
- the predictor's own scalar attributes where they differ from its class's: the flags the bounds
  set while they predict their twins, so that a nested bound turns itself off (GemmBounds.as_twins'
  _twin_depth, _in_two_row_twin, _probing_floor, _raw_ladder, _raw_rows, _raw_waves), and any
  setting made on the instance (_gemv_rule, soft_tile_margin). All of them, not a list of names,
  so a flag added later is keyed without anyone remembering to add it here. A flag put back to
  its class's value is the state it was never set in: keyed apart, a fresh predictor's first
  call had recomputed 47 of its 166 batches (251 varied ops on an A100-PCIe-80GB: 5.9 -> 4.8 s
  CPU); so a flag needs its default on the class (one without is keyed whenever set: a miss,
  never a wrong hit).

What the key leaves out cannot change within one call: the weights, the catalog (a dominated
training GPU's spec) and class-level settings. So the memo lives only while the outermost
predict or predict_unbounded runs, and is dropped when it returns or raises: there is no cache
to go stale between calls. A re-entry flag must stay a scalar (bool, int, ...) to be keyed; like
the flags themselves, the memo is per predictor object, not per thread.
"""
from __future__ import annotations

from contextlib import contextmanager

_SCALARS = (bool, int, float, str, type(None))
_UNSET = object()


def _is_class_value(value, default) -> bool:
    """value is the class's default, type and all (1 is no stand-in for True)."""
    return type(value) is type(default) and value == default


class CallMemo:
    """TilePredictor's per-call memo (module doc): _memoised answers a repeated batch."""

    _memo = None  # the open call's {key: frame}; None between top-level calls

    @contextmanager
    def _call_scope(self):
        """The memo of the outermost call: opened by it, dropped when it ends (returns or raises)."""
        outermost = self._memo is None
        if outermost:
            self._memo = {}
        try:
            yield self._memo
        finally:
            if outermost:
                self._memo = None

    def _state_key(self) -> tuple:
        """The instance's scalar attributes other than its class's values (the bounds' re-entry
        flags while set, any instance setting; the memo's own None is the class's)."""
        cls = type(self)
        return tuple(sorted((k, v) for k, v in vars(self).items()
                            if isinstance(v, _SCALARS) and not _is_class_value(v, getattr(cls, k, _UNSET))))

    def _memoised(self, what: str, gpu, split_k, ops: list, compute):
        """compute()'s frame for this batch, from the memo where the same call already made it.
        The caller may change the frame it gets (predict caps its own in place): the memo keeps a
        copy and gives out copies."""
        with self._call_scope() as memo:
            key = (what, gpu, bool(split_k), tuple(ops), self._state_key())
            hit = memo.get(key)
            if hit is not None:
                return hit.copy()
            frame = compute()
            memo[key] = frame.copy()
            return frame

    def memoised_value(self, what: str, key, compute):
        """compute() once per key within the open call (a plain value, given out as is), or on
        every call outside one."""
        if self._memo is None:
            return compute()
        full = (what, key)
        if full not in self._memo:
            self._memo[full] = compute()
        return self._memo[full]
