"""Split-K: a GEMM whose output tiles cannot fill the GPU splits its reduction.

With fewer output tiles than SMs, a GEMM with a long reduction (k) leaves most SMs idle while
each tile walks the whole of k. cuBLAS then splits k S ways: S times the blocks, each reducing
k / S, and a second kernel sums the S partial outputs (NeuSight's training rows show it as the
kernel's grid z, often with a splitKreduce_kernel after it; 10-52% of each training GPU's Linear
rows are split).

The tile-MLP is fitted on every row as if unsplit, so on the training GPUs' own split rows it is
far off (29% MAPE on the A100-40GB's). The split choice here is the library's rule in kind:
only a GEMM that underfills the GPU (tiles x S <= SMs) with at least MIN_SPLIT_K of reduction
per split is a candidate, and the fastest of unsplit and each candidate S wins, each candidate
costed by the same tile-MLP (the S-way batched GEMM of k / S, plus the reduce as an elementwise
add of S inputs). On an 800-row sample of each training GPU's own Linear rows
(benchmarks/split_k.py; rows the model was fitted on) 1 of 2,634 unsplit rows is split, and the
split rows' MAPE falls on four of five GPUs (A100-40GB 29 -> 19%, P100 24 -> 14%, T4 19 -> 13%,
V100 17 -> 12%; P4 17.0 -> 17.7%). The held-out GPUs' GEMM test rows hardly ever underfill, so
their figures barely move; a convolution's weight gradient (K = batch x image) does.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from kit.ops import Elementwise

SPLITS = (2, 4, 8, 16, 32, 64)
MIN_SPLIT_K = 256  # each split reduces at least this much of k


def split_choices(ops: list, tiles: np.ndarray, sm_count: int) -> list[tuple[int, int]]:
    """(op index, S) for every candidate split: tiles x S <= sm_count, k / S >= MIN_SPLIT_K."""
    return [(i, s) for i, op in enumerate(ops) for s in SPLITS
            if tiles[i] * s <= sm_count and op.k // s >= MIN_SPLIT_K]


def split_op(op, s: int):
    """The S-way split of a GEMM: S times the batch, each reducing ceil(k / S)."""
    return replace(op, b=op.b * s, k=math.ceil(op.k / s), align=op.lead_align)  # strides kept


def reduce_op(op, s: int) -> Elementwise:
    """The kernel that sums the S partial outputs of a split GEMM."""
    return Elementwise(kind="add", numel=op.b * op.m * op.n, dtype=op.dtype, inputs=s)


def apply_split_k(predict_gemm, predict_reduce, ops: list, frame: pd.DataFrame,
                  sm_count: int) -> pd.DataFrame:
    """frame (kit.predict.base COLUMNS, the unsplit predictions of ops) with every op whose best
    split beats it replaced by that split: its latency and band (GEMM + reduce), split_k = S,
    and the tile, tiles and waves of the split GEMM. predict_gemm / predict_reduce: a predictor's GEMM and elementwise batch
    predictions (no split of their own)."""
    choices = split_choices(ops, frame.tiles.to_numpy(int), sm_count)
    out = frame.copy()
    if not choices:
        return out
    gemm = predict_gemm([split_op(ops[i], s) for i, s in choices])
    red = predict_reduce([reduce_op(ops[i], s) for i, s in choices])
    cols = ("latency_ms", "latency_p10_ms", "latency_p90_ms")
    # never below the op's own roofline (a split Linear's batch shares the weight in the
    # features, so its bytes count one k / S slice of it)
    roof = frame.roofline_ms.to_numpy(float)[[i for i, _ in choices]]
    total = {c: np.maximum(gemm[c].to_numpy(float) + red[c].to_numpy(float), roof) for c in cols}
    best = out.latency_ms.to_numpy(float).copy()
    for j, (i, s) in enumerate(choices):
        if total["latency_ms"][j] < best[i]:
            best[i] = total["latency_ms"][j]
            for c in cols:
                out.at[i, c] = float(total[c][j])
            out.at[i, "split_k"] = s
            out.at[i, "tile"] = gemm.tile.iloc[j]  # the split GEMM's own tile (shape changed)
            out.at[i, "tiles"] = int(gemm.tiles.iloc[j])
            out.at[i, "waves"] = int(gemm.waves.iloc[j])
            # the split GEMM's own bound (its waves at peak) over the whole time, reduce included
            bound = float(gemm.utilisation.iloc[j] * gemm.latency_ms.iloc[j])
            out.at[i, "utilisation"] = bound / best[i]
    return out
