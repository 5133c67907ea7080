"""The one small protocol every predictor follows.

A predictor takes a batch of ops on one GPU and returns a DataFrame with one row per op, in order:

    latency_ms      the prediction (never below roofline_ms)
    roofline_ms     max(FLOPs / peak, bytes / bandwidth)
    bound           "compute" | "memory"
    tile            tile name ("128x64"), "" where an op has no tiling
    tiles, waves    thread blocks and waves (0 where not applicable)
    utilisation     roofline_ms-per-wave / achieved-per-wave, in (0, 1]
    latency_p10_ms, latency_p90_ms   an uncertainty band (equal to latency_ms when the
                    predictor has none)
    split_k         for a GEMM, the ways its reduction is split (kit.predict.split_k; 1: not
                    split, and for every op that is not a GEMM)

Repeated ops are predicted once (dedupe), so whole models with thousands of identical layers cost
only as much as their distinct shapes.
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol, Sequence

import pandas as pd

from kit.errors import KitError
from kit.hardware import GPU, get_gpu
from kit.predict.roofline import roofline
from kit.tiling import tiling

ROW_COLUMNS = ["latency_ms", "roofline_ms", "bound", "tile", "tiles", "waves", "utilisation",
               "latency_p10_ms", "latency_p90_ms"]
COLUMNS = [*ROW_COLUMNS, "split_k"]


def frame_of(rows: list[tuple]) -> pd.DataFrame:
    """A prediction frame from rows of ROW_COLUMNS, none of them split (split_k 1)."""
    return pd.DataFrame(rows, columns=ROW_COLUMNS).assign(split_k=1)[COLUMNS]


class Predictor(Protocol):
    name: str

    def predict(self, ops: Sequence, gpu: GPU | str) -> pd.DataFrame: ...


_OP_TYPES: set = set()  # the classes whose instances have passed is_op


def is_op(op) -> bool:
    """Whether op is a kit op (flops, bytes, an op_class, hashable); a kit class is remembered
    (op_list then checks its other instances by type alone)."""
    ok = (not isinstance(op, type) and isinstance(op, Hashable) and hasattr(op, "flops")
          and hasattr(op, "bytes") and hasattr(op, "op_class"))
    if ok and type(op).__module__.startswith("kit."):  # a user's class is checked every time
        _OP_TYPES.add(type(op))
    return ok


def op_list(ops) -> list:
    """ops as a list, once every one is a kit op: a KitError names a single op or a name given in
    place of a list, and anything among them that is not a kit op (None, a string, a list)."""
    if isinstance(ops, (str, bytes)) or is_op(ops):  # one op, or a name, where a list goes
        raise KitError(f"a predictor takes a list of kit.ops ops, got {ops!r} alone: give [op]")
    try:
        ops = list(ops)
    except TypeError:
        raise KitError(f"a predictor takes a list of kit.ops ops, got {ops!r}") from None
    bad = [op for op in ops if type(op) not in _OP_TYPES and not is_op(op)]
    if bad:
        raise KitError("a predictor takes kit.ops ops (Gemm, Elementwise, Softmax, ...), got "
                       f"{bad[0]!r}")
    return ops


def dedupe(ops: Sequence) -> tuple[list, list[int]]:
    """(unique ops, index of each op's unique) — ops are frozen dataclasses, so hashable. A
    KitError names anything among ops that is not a kit op (op_list)."""
    ops = op_list(ops)
    unique: dict = {}
    where = [unique.setdefault(op, len(unique)) for op in ops]
    return list(unique), where


def expand(frame: pd.DataFrame, where: list[int]) -> pd.DataFrame:
    return frame.iloc[where].reset_index(drop=True)


class _AnalyticPredictor:
    """Shared loop of the two analytic predictors: roofline and tiling per distinct op."""

    name = "analytic"

    def latency_ms(self, roof, t) -> float:
        raise NotImplementedError

    def predict(self, ops: Sequence, gpu: GPU | str) -> pd.DataFrame:
        gpu = get_gpu(gpu)
        unique, where = dedupe(ops)
        rows = []
        for op in unique:
            r = roofline(op, gpu)
            t = tiling(op, gpu)
            latency = max(self.latency_ms(r, t), r.time_ms)
            util = r.time_ms / latency if latency > 0 else 1.0
            rows.append((latency, r.time_ms, r.bound, t.tile if t else "", t.tiles if t else 0,
                         t.waves if t else 0, util, latency, latency))
        return expand(frame_of(rows), where)


class RooflinePredictor(_AnalyticPredictor):
    """Latency = the roofline bound itself: the optimistic floor."""

    name = "roofline"

    def latency_ms(self, roof, t) -> float:
        return roof.time_ms


class WavePredictor(_AnalyticPredictor):
    """The tile/wave model with utilisation 1: waves × (one full wave at peak).

    Padding in partial tiles and the empty slots of the last wave make it slower than the
    roofline; it is never faster (it is clamped to the roofline).
    """

    name = "wave"

    def latency_ms(self, roof, t) -> float:
        return roof.time_ms if t is None else t.wave_model_ms
