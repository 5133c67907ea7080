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

    calibrate: also fit one light tile-MLP per left-out training GPU to measure the transfer
    error σ of each class (the band's width on GPUs outside the training set)."""
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
            tile.transfer_sigma = transfer_sigma(frame, seed=seed, settings=light,
                                                 progress=bar.update)
    finally:
        bar.close()
    manifest = {
        "train_gpus": gpus, "seed": seed, "threads": threads, "settings": s,
        "rows": {c: int((frame.op_class == c).sum()) for c in classes},
        "training_seconds": round(time.perf_counter() - start, 1),
        "torch_version": torch.__version__, "transfer_sigma": tile.transfer_sigma,
        **(info or {}),
    }
    tile.manifest = manifest
    return Bundle(tile, li, mlp, manifest)


def transfer_sigma(frame: pd.DataFrame, *, seed: int, settings: dict, progress=None) -> dict:
    """Per class, the log-latency error σ of a tile-MLP on a training GPU it was not fitted on.

    Each training GPU is left out in turn; σ = 1.4826 · median |log measured − log predicted|
    (every left-out GPU weighted alike): the normal σ that this typical transfer error implies,
    robust to the one GPU that transfers worst."""
    from kit.predict.tile_mlp import combine, fit_tile_predictor, training_design

    residuals: dict[str, list] = {}
    for gpu in sorted(frame.gpu.unique()):
        rest = frame[frame.gpu != gpu]
        model = fit_tile_predictor(rest, seed=seed, members=1, epochs=settings["epochs"],
                                   hidden=settings["hidden"], min_steps=settings["min_steps"],
                                   chooser_epochs=settings["chooser_epochs"], progress=progress)
        held = frame[frame.gpu == gpu]
        for cls, cm in model.models.items():
            x, lb, ly, _ = training_design(held, cls, model.chooser)
            if len(x):
                centre = combine(cm.log_quantiles(x, lb))[0]
                residuals.setdefault(cls, []).append(np.abs(ly - centre))
    out = {}
    for cls, parts in residuals.items():
        r = np.concatenate(parts)
        w = np.concatenate([np.full(len(p), 1.0 / len(p)) for p in parts])
        order = np.argsort(r)
        cum = np.cumsum(w[order]) / w.sum()
        out[cls] = round(1.4826 * float(r[order][np.searchsorted(cum, 0.5)]), 4)
    return out


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
