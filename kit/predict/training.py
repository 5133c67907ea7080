"""Training the learned predictors (tile chooser, tile-MLP, Li regression, direct MLP) together.

    frame = training_frame(data_dir, gpus)        NeuSight train-collect (+ the large vector
                                                  subsets of part "train"), deduplicated
    bundle = train_bundle(frame, gpus, seed=0)    reproducible for a seed (torch seeded, fixed
                                                  thread count, fixed data order)
    save_bundle(bundle, out_dir)                  kit.predict.weights

The same seed, data and thread count give the same weights bit for bit.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from kit.errors import KitError
from kit.hardware import get_gpu

DEFAULT_TRAIN_GPUS = ("p4", "p100-pcie-16gb", "t4", "v100-pcie-32gb", "a100-pcie-40gb")
MODELLED = ("gemm", "elementwise", "softmax", "layernorm")
SHAPE_KEY = ["op", "gpu", "dtype", "b", "m", "n", "k", "rows", "cols"]


def training_frame(data_dir=None, gpus=None) -> pd.DataFrame:
    """The modelled rows of NeuSight's training data (kit.data), one row per (op, shape, GPU)."""
    from kit.data import load_neusight

    parts = [load_neusight("train-collect", data_dir)]
    try:
        large = load_neusight("train", data_dir)
        parts.append(large[large.op_class.isin(["elementwise", "softmax", "layernorm"])])
    except KitError:
        pass  # the large-shape subsets are optional
    frame = pd.concat(parts, ignore_index=True)
    frame = frame[frame.op_class.isin(MODELLED) & frame.gpu.notna()
                  & (frame.latency_ms > 0)]
    frame = frame.drop_duplicates(SHAPE_KEY).reset_index(drop=True)
    return select_gpus(frame, gpus)


def select_gpus(frame: pd.DataFrame, gpus) -> pd.DataFrame:
    """Rows of the given GPUs (names resolved through the catalog); KitError for a GPU the
    data has no rows of."""
    if gpus is None:
        return frame
    keys = [get_gpu(g).key for g in ([gpus] if isinstance(gpus, str) else gpus)]
    present = set(frame.gpu.dropna().unique())
    absent = [k for k in keys if k not in present]
    if absent:
        raise KitError(f"no training rows for GPU(s) {', '.join(absent)}; the data has "
                       f"{', '.join(sorted(present))}")
    return frame[frame.gpu.isin(keys)].reset_index(drop=True)


def parse_gpu_list(text: str) -> list[str]:
    """'P4,T4,...' -> catalog keys (KitError names an unknown one)."""
    names = [s.strip() for s in str(text).split(",") if s.strip()]
    if not names:
        raise KitError("--train-gpus: give at least one GPU, e.g. P4,T4,V100-PCIe-32GB")
    return list(dict.fromkeys(get_gpu(n).key for n in names))


SETTINGS = {"members": 3, "epochs": 16, "hidden": 64, "chooser_epochs": 8, "min_steps": 300}
QUICK = {"members": 2, "epochs": 2, "hidden": 16, "chooser_epochs": 1, "min_steps": 60}


def train_bundle(frame: pd.DataFrame, train_gpus=None, *, seed: int = 0, threads: int = 2,
                 settings: dict | None = None, direct: bool = True, calibrate: bool = False,
                 progress: bool = False, info: dict | None = None):
    """Fit every learned predictor on frame's rows of train_gpus; returns a weights Bundle.

    calibrate: also fit one light tile-MLP per left-out training GPU and calibrate each class's
    transfer σ on those left-out rows (transfer_sigma: the band's width on GPUs outside the
    training set); without it the band is the heads' and members' alone."""
    import torch

    from kit.predict.linear_li import LiPredictor
    from kit.predict.mlp_direct import DirectMLP
    from kit.predict.nets import set_threads
    from kit.predict.tile_choice import TileChooser
    from kit.predict.tile_mlp import fit_tile_predictor
    from kit.predict.weights import Bundle

    s = {**SETTINGS, **(settings or {})}
    frame = select_gpus(frame, train_gpus)
    if frame.empty:
        raise KitError("no training rows to fit on")
    set_threads(threads)
    torch.use_deterministic_algorithms(True)
    classes = [c for c in MODELLED if (frame.op_class == c).any()]
    gpus = sorted(frame.gpu.unique())
    light = {**s, "members": 1, "epochs": max(2, s["epochs"] // 3)}
    total = s["chooser_epochs"] + len(classes) * s["members"] * s["epochs"] * (2 if direct else 1)
    if calibrate and len(gpus) > 1:
        total += len(gpus) * (light["chooser_epochs"] + len(classes) * light["epochs"])
    bar = _bar(total, progress)
    start = time.perf_counter()
    try:
        chooser = TileChooser.fit(frame, seed=seed, epochs=s["chooser_epochs"],
                                  min_steps=s["min_steps"], progress=bar.update)
        tile = fit_tile_predictor(frame, seed=seed, members=s["members"], epochs=s["epochs"],
                                  hidden=s["hidden"], chooser=chooser, min_steps=s["min_steps"],
                                  progress=bar.update)
        li = LiPredictor.fit(frame)
        mlp = (DirectMLP.fit(frame, seed=seed, members=s["members"], epochs=s["epochs"],
                             hidden=s["hidden"], min_steps=s["min_steps"], progress=bar.update)
               if direct else None)
        if calibrate and len(gpus) > 1:
            tile.transfer_sigma, tile.band = transfer_sigma(frame, seed=seed, settings=light,
                                                            progress=bar.update)
    finally:
        bar.close()
    manifest = {
        "train_gpus": gpus, "seed": seed, "threads": threads, "settings": s,
        "rows": {c: int((frame.op_class == c).sum()) for c in classes},
        "training_seconds": round(time.perf_counter() - start, 1),
        "torch_version": torch.__version__, "transfer_sigma": tile.transfer_sigma,
        "band_calibration": tile.band,
        **(info or {}),
    }
    tile.manifest = manifest
    return Bundle(tile, li, mlp, manifest)


def transfer_sigma(frame: pd.DataFrame, *, seed: int, settings: dict, progress=None) -> tuple:
    """Calibrate the band on the training GPUs alone: (σ per class, band settings).

    Each training GPU is left out in turn and a light tile-MLP fitted on the others predicts
    its training rows. Per class, σ is then the split-conformal choice: the smallest σ whose
    band (kit.predict.tile_mlp.combine, heads in quadrature with Z80·σ) holds 80% of those
    left-out rows, every left-out GPU weighted alike. No row of a GPU outside the training set
    is used.

    The band settings say how the predictor scales σ for a GPU: by min(1, d / near_distance),
    d = kit.predict.features.gpu_distance to the nearest training GPU and near_distance the
    smallest such distance among the left-out GPUs (the closest transfer that was measured).
    On a training GPU (d = 0) only the in-distribution heads remain; nearer than any measured
    transfer the error is taken to shrink linearly towards that."""
    from kit.predict.features import gpu_distance
    from kit.predict.tile_mlp import fit_tile_predictor, training_design

    gpus = sorted(frame.gpu.unique())
    rows: dict[str, list] = {}
    for gpu in gpus:
        rest = frame[frame.gpu != gpu]
        model = fit_tile_predictor(rest, seed=seed, members=1, epochs=settings["epochs"],
                                   hidden=settings["hidden"], min_steps=settings["min_steps"],
                                   chooser_epochs=settings["chooser_epochs"], progress=progress)
        held = frame[frame.gpu == gpu]
        for cls, cm in model.models.items():
            x, lb, ly, _ = training_design(held, cls, model.chooser)
            if len(x):
                rows.setdefault(cls, []).append((cm.log_quantiles(x, lb), lb, ly))
    sigma = {cls: round(conformal_sigma(parts), 4) for cls, parts in rows.items()}
    near = min(gpu_distance(g, [o for o in gpus if o != g]) for g in gpus)
    band = {"method": "split-conformal over leave-one-training-GPU-out residuals, 80% band",
            "near_distance": round(near, 4), "train_gpus": gpus}
    return sigma, band


def band_coverage(logq: np.ndarray, log_base: np.ndarray, log_y: np.ndarray,
                  sigma: float) -> np.ndarray:
    """Per row, whether the measured log latency lies inside the predictor's p10–p90 band
    (the same clipping as TilePredictor: p10 never below the base, never above the median)."""
    from kit.predict.tile_mlp import combine

    centre, lo, hi = combine(logq, sigma)
    lo = np.minimum(np.maximum(lo, log_base), centre)
    return (log_y >= lo) & (log_y <= np.maximum(hi, centre))


def conformal_sigma(parts: list, target: float = 0.8) -> float:
    """The smallest σ ≥ 0 whose band covers `target` of the rows of parts [(logq, log_base,
    log_y) per left-out GPU], each GPU weighted alike (bisection; coverage grows with σ)."""
    def cov(s):
        return float(np.mean([band_coverage(q, lb, ly, s).mean() for q, lb, ly in parts]))

    lo, hi = 0.0, 4.0
    if cov(lo) >= target:
        return 0.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cov(mid) < target else (lo, mid)
    return hi


class _NoBar:
    def update(self, n=1):
        pass

    def close(self):
        pass


def _bar(total: int, show: bool):
    if not show:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc="training", unit="epoch", leave=False)


def fingerprint(bundle) -> str:
    """A short hash of every weight, to check two trainings gave the same model."""
    import hashlib

    h = hashlib.sha256()
    nets = [*bundle.tile.chooser.model.state_dict().items()]
    for cls in sorted(bundle.tile.models):
        for m in bundle.tile.models[cls].members:
            nets += list(m.state_dict().items())
    for k, v in nets:
        h.update(k.encode())
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()[:16]
