"""Split-K: a GEMM whose output tiles cannot fill the GPU splits its reduction.

With fewer output tiles than SMs, a GEMM with a long reduction (k) leaves most SMs idle while
each tile walks the whole of k. cuBLAS then splits k S ways: S times the blocks, each reducing
k / S, and a second kernel sums the S partial outputs (NeuSight's training rows show it as the
kernel's grid z, often with a splitKreduce_kernel after it; 10-52% of each training GPU's Linear
rows are split).

The tile-MLP is fitted on every row as if unsplit, so on the training GPUs' own split rows it is
far off (29% MAPE on the A100-40GB's). The split choice here is the library's rule in kind: only
an unbatched GEMM whose split launches at most BLOCKS_PER_SM_SPLIT blocks a SM (tiles x S) with
at least MIN_SPLIT_K of reduction per split is a candidate, and the fastest of unsplit and each
candidate S wins, each candidate costed by the same tile-MLP (the S-way batched GEMM of k / S,
plus the reduce as an elementwise add of S inputs). On an 800-row sample of each training
GPU's own Linear rows (benchmarks/split_k.py; rows the model was fitted on) the split rows' MAPE
goes A100-40GB 29 -> 12.7%, V100 17 -> 7.9%, P100 24 -> 14.8%, T4 19 -> 13.0% (P4 17.0 -> 17.8%)
and the unsplit rows' stays within 0.2 point (1.8% of them split); on the test rows, the
held-out GPUs' Linear rows go A100-80GB 7.9 -> 7.7%, L4 12.4 -> 12.0%, and a convolution's
weight gradient (K = batch x image) comes out split.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from kit.ops import Elementwise

SPLITS = (2, 4, 8, 16, 32, 64, 128)
MIN_SPLIT_K = 128  # each split reduces at least this much of k
# a split may launch up to this many blocks a SM (tiles x S <= BLOCKS_PER_SM_SPLIT x SMs). The
# library does not stop at one block a SM: on the training GPUs' split Linear rows (grid z > 1)
# the blocks per SM reach 7.9 (A100-40GB), 10.8 (P100) and 12.9 (P4) at the 90th percentile,
# with k per split down to ~66 (1st percentile; 10th: 135-242) and S up to 162. With the cap at
# one block a SM (and 256 of k a split), the split rows of benchmarks/split_k.py's training
# sample scored A100-40GB 19.0%, V100 11.6%, P100 14.0%, T4 12.8%, P4 17.7%; at 8: 12.7, 7.9,
# 14.8, 13.0, 17.8, the unsplit rows within 0.1 point but the A100-40GB's 4.90 -> 4.99%. At 16
# the A100-40GB's unsplit rows fell to 5.26% and the P100's split ones to 15.9%: 8 it is.
BLOCKS_PER_SM_SPLIT = 8
# what the rule was before that evidence, kept for GPUs whose library it does not describe
# (rocBLAS on AMD: NeuSight's AMD rows record no grid; its labels moved 2-5 points the wrong way
# under the cuBLAS limits)
OTHER_VENDOR = {"blocks_per_sm": 1, "min_split_k": 256, "max_split": 64}


def split_limits(vendor: str) -> dict:
    """The split rule's limits for a GPU vendor: cuBLAS's as measured (nvidia), else the old."""
    if vendor == "nvidia":
        return {"blocks_per_sm": BLOCKS_PER_SM_SPLIT, "min_split_k": MIN_SPLIT_K, "max_split": max(SPLITS)}
    return dict(OTHER_VENDOR)


def split_choices(ops: list, tiles: np.ndarray, sm_count: int,
                  limits: dict | None = None) -> list[tuple[int, int]]:
    """(op index, S) for every candidate split of a GEMM that is not a batched matmul (b = 1, or
    a convolution's per-group GEMMs, kind "linear": of NeuSight's 87,623 bmm rows cuBLAS split
    11, all of batch 1): tiles x S <= blocks_per_sm x sm_count and k / S >= min_split_k
    (limits: split_limits; default NVIDIA's)."""
    lim = limits or split_limits("nvidia")
    return [(i, s) for i, op in enumerate(ops) for s in SPLITS
            if s <= lim["max_split"] and (op.b == 1 or op.kind == "linear")
            and tiles[i] * s <= lim["blocks_per_sm"] * sm_count and op.k // s >= lim["min_split_k"]]


def split_op(op, s: int):
    """The S-way split of a GEMM: S times the batch, each reducing ceil(k / S)."""
    return replace(op, b=op.b * s, k=math.ceil(op.k / s), align=op.lead_align)  # strides kept


def reduce_op(op, s: int) -> Elementwise:
    """The kernel that sums the S partial outputs of a split GEMM."""
    return Elementwise(kind="add", numel=op.b * op.m * op.n, dtype=op.dtype, inputs=s)


def apply_split_k(predict_gemm, predict_reduce, ops: list, frame: pd.DataFrame,
                  sm_count: int, limits: dict | None = None) -> pd.DataFrame:
    """frame (kit.predict.base COLUMNS, the unsplit predictions of ops) with every op whose best
    split beats it replaced by that split: its latency and band (GEMM + reduce), split_k = S,
    and the tile, tiles and waves of the split GEMM. predict_gemm(split GEMMs, their S) /
    predict_reduce(reduce ops): a predictor's GEMM and elementwise batch predictions (no split
    of their own).

    A GEMM whose prediction mixes tiles (frame's optional column tile_options: per op, the
    weights and tile counts of the tiles it mixes, the likeliest first; kit.predict.tile_mlp)
    takes, per tile, the best of unsplit and the splits that tile's count lets in, and the
    weighted geometric mean of those: a split let in by a tile the chooser only half prefers
    comes in by half, not all at once where the choice flips. What is shown (tile, S) is the
    likeliest tile's choice."""
    lim = limits or split_limits("nvidia")
    tiles = frame.tiles.to_numpy(int)
    options = (frame.tile_options.tolist() if "tile_options" in frame.columns
               else [None] * len(ops))
    options = [o if o is not None else (np.ones(1), np.array([tiles[i]])) for i, o in enumerate(options)]
    least = np.array([min(int(t.min()), tiles[i]) for i, (_, t) in enumerate(options)])
    choices = split_choices(ops, least, sm_count, lim)
    out = frame.copy()
    if not choices:
        return out
    gemm = predict_gemm([split_op(ops[i], s) for i, s in choices], [s for _, s in choices])
    red = predict_reduce([reduce_op(ops[i], s) for i, s in choices])
    cols = ("latency_ms", "latency_p10_ms", "latency_p90_ms")
    # never below the op's own roofline (a split Linear's batch shares the weight in the
    # features, so its bytes count one k / S slice of it)
    roof = frame.roofline_ms.to_numpy(float)[[i for i, _ in choices]]
    total = {c: np.maximum(gemm[c].to_numpy(float) + red[c].to_numpy(float), roof) for c in cols}
    by_op: dict[int, list[tuple[int, int]]] = {}
    for j, (i, s) in enumerate(choices):
        by_op.setdefault(i, []).append((j, s))
    room = lim["blocks_per_sm"] * sm_count
    unsplit = {c: frame[c].to_numpy(float) for c in cols}  # read once, not a pandas lookup per op
    for i, cands in by_op.items():
        own = {c: float(unsplit[c][i]) for c in cols}
        weights, picks = options[i]
        best = []
        for t in picks:  # per tile: unsplit (-1), or its fastest split
            allowed = [j for j, s in cands if t * s <= room and total["latency_ms"][j] < own["latency_ms"]]
            best.append(min(allowed, key=lambda j: total["latency_ms"][j]) if allowed else -1)
        if all(b < 0 for b in best):
            continue
        w = np.asarray(weights, dtype=float) / float(np.sum(weights))
        new = {c: float(np.exp(sum(wv * np.log(own[c] if b < 0 else total[c][b]) for wv, b in zip(w, best))))
               for c in cols}
        for c in cols:
            out.at[i, c] = new[c]
        j = best[0]
        if j < 0:  # the likeliest tile runs unsplit: its bound, over the new time
            out.at[i, "utilisation"] = float(frame.utilisation.iloc[i]) * own["latency_ms"] / new["latency_ms"]
            continue
        out.at[i, "split_k"] = choices[j][1]
        out.at[i, "tile"] = gemm.tile.iloc[j]  # the split GEMM's own tile (shape changed)
        out.at[i, "tiles"] = int(gemm.tiles.iloc[j])
        out.at[i, "waves"] = int(gemm.waves.iloc[j])
        # the split GEMM's own bound (its waves at peak) over the whole time, reduce included
        bound = float(gemm.utilisation.iloc[j] * gemm.latency_ms.iloc[j])
        out.at[i, "utilisation"] = bound / new["latency_ms"]
    return out
