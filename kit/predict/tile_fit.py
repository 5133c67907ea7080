"""Fitting the tile-MLP (kit.predict.tile_mlp) on a measurement table: each row's design
(features, log base_ms, log latency) with the tile its kernel ran (observed_tiles, from the
kernel name; the tile chooser's for rows whose name gives none), GPU-balanced weights, and one
ensemble per op class beside a fitted tile chooser."""
from __future__ import annotations

import numpy as np
import pandas as pd

from kit.errors import KitError
from kit.hardware import get_gpu
from kit.predict.features import (CLASSES, arrays_from_frame, feature_matrix, feature_names,
                                  lib_tile, waves)
from kit.predict.tile_ensemble import ClassModel
from kit.predict.tile_mlp import TilePredictor


def observed_tiles(grp: pd.DataFrame, chooser=None) -> dict:
    """Tile arrays of measured GEMM rows: the tile their kernel name gives (with the block's
    threads); rows whose kernel names none get the chooser's tile."""
    tm = grp.tile_m.to_numpy(dtype=float, na_value=np.nan)
    tn = grp.tile_n.to_numpy(dtype=float, na_value=np.nan)
    tk = grp.tile_k.to_numpy(dtype=float, na_value=np.nan)
    threads = np.ones(len(grp))
    for c in ("block_x", "block_y", "block_z"):
        threads *= np.nan_to_num(grp[c].to_numpy(dtype=float, na_value=np.nan), nan=1.0)
    known = ~(np.isnan(tm) | np.isnan(tn)) & (threads >= 32)
    tile = lib_tile(np.where(known, tm, 128), np.where(known, tn, 128),
                    np.where(known, threads, 256), np.where(np.isnan(tk), 8, tk))
    if (~known).any():
        if chooser is None:
            raise KitError("GEMM rows without a tile in the kernel name need a tile chooser")
        chosen, _ = chooser.tile_arrays(arrays_from_frame("gemm", grp[~known]), grp.gpu.iloc[0])
        for key in tile:
            tile[key][~known] = chosen[key]
    return tile


def training_design(frame: pd.DataFrame, op_class: str, chooser=None):
    """(x, log_base, log_y, gpu) for the fp32 rows of one op class in a measurement table."""
    rows = frame[(frame.op_class == op_class) & (frame.dtype.fillna("fp32") == "fp32")]
    xs, lbs, lys, gpus = [], [], [], []
    for gpu, grp in rows.groupby("gpu", sort=True):
        a = arrays_from_frame(op_class, grp)
        if op_class == "gemm":
            a.update(observed_tiles(grp, chooser))
        w = waves(op_class, a, get_gpu(gpu))
        xs.append(feature_matrix(op_class, a, gpu, w))
        lbs.append(np.log(w["base_ms"]))
        lys.append(np.log(grp.latency_ms.to_numpy(float)))
        gpus += [gpu] * len(grp)
    if not xs:
        n = len(feature_names(op_class))
        return np.zeros((0, n)), np.zeros(0), np.zeros(0), np.array([], dtype=object)
    return np.concatenate(xs), np.concatenate(lbs), np.concatenate(lys), np.array(gpus, dtype=object)


def gpu_balanced_weights(gpus: np.ndarray) -> np.ndarray:
    """Weights that give every GPU the same total say."""
    labels, inverse, counts = np.unique(gpus, return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse]


def fit_tile_predictor(frame: pd.DataFrame, *, seed: int = 0, members: int = 3, epochs: int = 30,
                       hidden: int = 64, chooser=None, min_steps: int = 300,
                       chooser_epochs: int = 8, progress=None) -> TilePredictor:
    """Fit the tile chooser (unless given) and one ensemble per op class on a measurement table."""
    from kit.predict.tile_choice import TileChooser

    chooser = chooser or TileChooser.fit(frame, seed=seed, epochs=chooser_epochs,
                                         min_steps=min_steps, progress=progress)
    models = {}
    for cls in CLASSES:
        x, lb, ly, gpus = training_design(frame, cls, chooser)
        if len(x) == 0:
            continue
        models[cls] = ClassModel.fit(cls, x, lb, ly, gpu_balanced_weights(gpus), seed=seed,
                                     members=members, epochs=epochs, hidden=hidden,
                                     min_steps=min_steps, progress=progress)
    return TilePredictor(chooser, models)
