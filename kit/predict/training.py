"""Training the learned predictors (tile chooser, tile-MLP, Li regression, direct MLP) together.

    frame = training_frame(data_dir, gpus)        NeuSight train-collect (+ the large vector
                                                  subsets of part "train", + the softmax and
                                                  layer-norm test rows of the GPUs trained on),
                                                  deduplicated
    bundle = train_bundle(frame, gpus, seed=0)    reproducible for a seed (torch seeded, fixed
                                                  thread count, fixed data order)
    save_bundle(bundle, out_dir)                  kit.predict.weights

The same seed, data and thread count give the same weights bit for bit.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from kit.errors import KitError, comma_names, yes_no
from kit.hardware import keys_of

DEFAULT_TRAIN_GPUS = ("p4", "p100-pcie-16gb", "t4", "v100-pcie-32gb", "a100-pcie-40gb")
MODELLED = ("gemm", "elementwise", "softmax", "layernorm")
SHAPE_KEY = ["op", "gpu", "dtype", "b", "m", "n", "k", "rows", "cols"]
# NeuSight's large-shape vector subsets of part "train", read after train-collect
VECTOR_FILES = ("data/dataset/train/elem.csv", "data/dataset/train/ln.csv",
                "data/dataset/train/softmax.csv")
# the softmax and layer-norm rows of part "test", for the GPUs trained on (test_rows)
TEST_ROW_FILES = ("data/dataset/test/ln.csv", "data/dataset/test/softmax.csv")
# measured rows left out of training (training_frame's suspect_rows): (gpu, op, source) -> why.
# benchmarks/p4_linear_rows.py trains with them kept and scores both recipes.
SUSPECT_ROWS = {
    ("p4", "linear", "neusight:train-collect"):
        "NeuSight's P4 train-collect Linear rows run 3-5x slower than the P4's own Linear test rows "
        "of the same sizes (median 0.8-2.1 against 2.6-4.6 TFLOP/s by size bin; its bmm training "
        "rows agree with its test rows) and ran other kernels (maxwell_sgemm_*_tn against "
        "sgemm_128x128x8_NT_vec); the P4's whole-model labels side with the test rows. Weights "
        "trained on them priced the P4's Linear test rows 3.4x slow (243% MAPE) and its inference "
        "labels 50% slow",
}


def training_frame(data_dir=None, gpus=None, test_rows: bool = True, extra=(),
                   suspect_rows: bool = False) -> pd.DataFrame:
    """The modelled rows of NeuSight's training data (kit.data), one row per (op, shape, GPU):
    part "train-collect", then the large-shape vector subsets of part "train" (VECTOR_FILES).

    test_rows: also the softmax and layer-norm rows of NeuSight's test files (TEST_ROW_FILES:
    model shapes, up to 16,384 columns; the training rows stop at 4,100, where wider rows spill
    the caches, kit.predict.row_reread). Leave-one-training-GPU-out, one member, seeds 0-2, the
    softmax median error falls from 14.5/12.4/10.8% to 11.5/9.8/8.9% with them; layer norm stays
    level. Their column split is "test".

    Rows of the extra files join only for GPUs with train-collect rows of a modelled op class.
    NeuSight's held-out A100 80GB and L4 have none (the A100 80GB has conv rows only), so their
    rows never enter a training frame. Most of a held-out GPU's test shapes were measured on the
    training GPUs too (A100 80GB: all but 2 of 81), so with test_rows its softmax and layer-norm
    shapes were met, on other GPUs. A missing extra file is skipped; a malformed one is a KitError.
    The train-collect row is kept where a shape repeats.

    extra: paths of one's own measurements (kit.predict.own_measurements: their FP32 rows of the
    modelled classes), after NeuSight's rows; every GPU they hold must be among gpus.

    suspect_rows: keep the measured rows SUSPECT_ROWS names, which are left out otherwise
    (suspect_mask tells them)."""
    from kit.data import load_measurements, load_neusight, resolve_data_dir

    test_rows, suspect_rows = yes_no(test_rows, "test_rows"), yes_no(suspect_rows, "suspect_rows")
    root = resolve_data_dir(data_dir)
    collect = load_neusight("train-collect", root)
    trained = set(collect.gpu[collect.op_class.isin(MODELLED)].dropna().unique())
    parts = [collect]
    for name in VECTOR_FILES + (TEST_ROW_FILES if test_rows else ()):
        if (root / name).exists() and not (root / name).is_file():
            raise KitError(f"{root / name} is a folder, not a measurement CSV")
        if (root / name).is_file():
            rows = load_measurements(root / name)
            split = "test" if name in TEST_ROW_FILES else "train"  # not from the folder's name
            parts.append(rows[rows.gpu.isin(trained)].assign(split=split))
    if extra:
        from kit.predict.own_measurements import own_rows

        own, _ = own_rows(extra, MODELLED)
        if gpus is not None:
            unnamed = sorted(set(own.gpu) - set(keys_of(gpus)))
            if unnamed:
                raise KitError(f"--extra holds rows of {', '.join(unnamed)}, which --train-gpus does "
                               "not name: add it to train on them")
        parts.append(own)
    frame = pd.concat(parts, ignore_index=True)
    frame = frame[frame.op_class.isin(MODELLED) & frame.gpu.notna()
                  & (frame.latency_ms > 0)]
    left_out = frame[suspect_mask(frame)] if not suspect_rows else frame.iloc[:0]
    frame = frame.drop(left_out.index).drop_duplicates(SHAPE_KEY).reset_index(drop=True)
    if "_extra_file" in frame:  # the own rows that survived: a shape NeuSight has keeps its row
        kept = frame[frame.gpu.isin(keys_of(gpus)) if gpus is not None else frame.gpu.notna()]
        frame.attrs["extra_rows_kept"] = {k: int(n) for k, n in kept.groupby("_extra_file").size().items()}
        frame = frame.drop(columns="_extra_file")
    left_out = left_out.drop_duplicates(SHAPE_KEY)  # counted as they would have been trained on
    if gpus is not None:
        left_out = left_out[left_out.gpu.isin(keys_of(gpus))]
        only_suspect = sorted(set(left_out.gpu) - set(frame.gpu))
        if only_suspect:
            raise KitError(f"the only training rows of {', '.join(only_suspect)} are left out as "
                           "suspect (kit.predict.training.SUSPECT_ROWS); --keep-suspect-rows "
                           "(suspect_rows=True) trains on them")
    attrs = dict(frame.attrs)
    frame = select_gpus(frame, gpus)
    frame.attrs.update({k: v for k, v in attrs.items() if k not in frame.attrs})
    # what was left out, for a manifest: [{gpu, op, source, rows, why}]
    frame.attrs["suspect_rows_left_out"] = [
        {"gpu": g, "op": o, "source": src, "rows": int(n), "why": SUSPECT_ROWS[(g, o, src)]}
        for (g, o, src), n in left_out.groupby(["gpu", "op", "source"]).size().items()]
    return frame


def suspect_mask(frame: pd.DataFrame) -> pd.Series:
    """True for the rows of frame that SUSPECT_ROWS names (by GPU, op and source)."""
    mask = pd.Series(False, index=frame.index)
    for gpu, op, source in SUSPECT_ROWS:
        mask |= (frame.gpu == gpu) & (frame.op == op) & (frame.source == source)
    return mask


def select_gpus(frame: pd.DataFrame, gpus) -> pd.DataFrame:
    """Rows of the given GPUs (names resolved through the catalog); KitError for a GPU the
    data has no rows of."""
    if gpus is None:
        return frame
    keys = keys_of(gpus)
    present = set(frame.gpu.dropna().unique())
    absent = [k for k in keys if k not in present]
    if absent:
        raise KitError(f"no training rows for GPU(s) {', '.join(absent)}; the data has "
                       f"{', '.join(sorted(present))}")
    return frame[frame.gpu.isin(keys)].reset_index(drop=True)


def parse_gpu_list(text: str) -> list[str]:
    """'P4,T4,...' -> catalog keys (KitError names an unknown one)."""
    names = comma_names(text, "--train-gpus")
    if not names:
        raise KitError("--train-gpus: give at least one GPU, e.g. P4,T4,V100-PCIe-32GB")
    return list(dict.fromkeys(keys_of(names)))


def default_threads() -> int:
    """Torch threads for training when none are given: two, or the cores if fewer (a one-core
    Binder)."""
    import os

    return min(2, os.cpu_count() or 1)


SETTINGS = {"members": 3, "epochs": 16, "hidden": 64, "chooser_epochs": 8, "min_steps": 300}
QUICK = {"members": 2, "epochs": 2, "hidden": 16, "chooser_epochs": 1, "min_steps": 60}


def train_bundle(frame: pd.DataFrame, train_gpus=None, *, seed: int = 0, threads: int = 2,
                 settings: dict | None = None, direct: bool = True, calibrate: bool = False,
                 progress: bool = False, info: dict | None = None):
    """Fit every learned predictor on frame's rows of train_gpus; returns a weights Bundle.

    calibrate: also fit one tile-MLP (the shipped kind: the same settings) per left-out
    training GPU and one on four in five shapes, and calibrate each class's transfer σ(d) on
    their held-out rows (transfer_sigma: the band's width on GPUs outside the training set);
    without it the band is the heads' and members' alone."""
    import torch

    from kit.predict.features import GPU_FEATURES, SUSTAINED_TFLOPS_PER_W
    from kit.predict.linear_li import LiPredictor
    from kit.predict.mlp_direct import DirectMLP
    from kit.predict.nets import set_threads
    from kit.predict.tile_choice import TileChooser
    from kit.predict.tile_fit import fit_tile_predictor
    from kit.predict.weights import Bundle

    s = {**SETTINGS, **(settings or {})}
    frame = select_gpus(frame, train_gpus)
    if frame.empty:
        raise KitError("no training rows to fit on")
    set_threads(threads)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # for this fit only: restored below
    classes = [c for c in MODELLED if (frame.op_class == c).any()]
    gpus = sorted(frame.gpu.unique())
    total = s["chooser_epochs"] + len(classes) * s["members"] * s["epochs"] * (2 if direct else 1)
    if calibrate and len(gpus) > 1:  # one fold per GPU and the in-distribution one
        total += (len(gpus) + 1) * (s["chooser_epochs"] + len(classes) * s["members"] * s["epochs"])
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
            tile.transfer_sigma, tile.band = transfer_sigma(frame, seed=seed, settings=s,
                                                            progress=bar.update)
    finally:
        bar.close()
        torch.use_deterministic_algorithms(was_deterministic)
    manifest = {
        "train_gpus": gpus, "seed": seed, "threads": threads, "settings": s,
        "rows": {c: int((frame.op_class == c).sum()) for c in classes},
        "training_seconds": round(time.perf_counter() - start, 1),
        "torch_version": torch.__version__, "transfer_sigma": tile.transfer_sigma,
        "gpu_features": list(GPU_FEATURES), "sustained_tflops_per_w": SUSTAINED_TFLOPS_PER_W,
        "band_calibration": tile.band,
        **(info or {}),
    }
    tile.manifest = manifest
    return Bundle(tile, li, mlp, manifest)


def transfer_sigma(frame: pd.DataFrame, *, seed: int, settings: dict, progress=None) -> tuple:
    """Calibrate the band on the training GPUs alone: (σ per class, band settings).

    Two anchors of the transfer error σ(d) as a function of d, the distance
    (kit.predict.features.gpu_distance) from a GPU to the nearest training GPU:

      d = 0         in distribution: one tile-MLP fitted on four in five shapes of every
                    training GPU (shape_blocks) predicts the fifth; σ_0 per class is the
                    split-conformal σ of those rows (0 when the heads alone hold 80%)
      d ≥ d_near    leave one training GPU out: each is left out in turn, a tile-MLP fitted on
                    the others predicts its rows; σ per class is the split-conformal σ of the
                    left-out rows, every left-out GPU weighted alike. d_near is the smallest
                    distance of a left-out GPU to the others (the closest measured transfer).

    Between them σ(d) is linear (tile_ensemble.sigma_at_distance). Every fold is fitted with the
    given settings, the same kind of ensemble the predictor ships (members, epochs), so the
    members' spread that the band already carries is the one calibrated against. No row of a
    GPU outside the training set is used.

    The band settings also record, per class, the heads' own in-distribution coverage, each
    left-out GPU's distance and σ, and the nested leave-one-GPU-out coverage (nested_coverage):
    each training GPU's rows under the band calibrated without it, with its distance to the
    others, the honest estimate of the band's coverage on a new GPU."""
    from kit.predict.features import gpu_distance
    from kit.predict.tile_fit import fit_tile_predictor, training_design

    gpus = sorted(frame.gpu.unique())
    fit = lambda rows: fit_tile_predictor(  # noqa: E731
        rows, seed=seed, members=settings["members"], epochs=settings["epochs"],
        hidden=settings["hidden"], min_steps=settings["min_steps"],
        chooser_epochs=settings["chooser_epochs"], progress=progress)

    def design(model, held) -> dict:
        out: dict[str, dict] = {}
        for gpu in sorted(held.gpu.unique()):
            for cls, cm in model.models.items():
                x, lb, ly, _ = training_design(held[held.gpu == gpu], cls, model.chooser)
                if len(x):
                    out.setdefault(cls, {})[gpu] = (cm.log_quantiles(x, lb), lb, ly)
        return out

    logo: dict[str, dict] = {}
    for gpu in gpus:
        for cls, parts in design(fit(frame[frame.gpu != gpu]), frame[frame.gpu == gpu]).items():
            logo.setdefault(cls, {}).update(parts)
    block = shape_blocks(frame) == 0
    inside = design(fit(frame[~block]), frame[block])
    distance = {g: gpu_distance(g, [o for o in gpus if o != g]) for g in gpus}
    sigma = {cls: round(conformal_sigma(list(p.values())), 4) for cls, p in logo.items()}
    sigma_0 = {cls: round(min(conformal_sigma(list(inside[cls].values())), sigma[cls]), 4)
               for cls in sigma if cls in inside}
    band = {"method": "σ(d) linear from the in-distribution split-conformal σ_0 (d = 0) to the "
                      "leave-one-training-GPU-out split-conformal σ (d ≥ near_distance), 80% band",
            "near_distance": round(min(distance.values()), 4), "train_gpus": gpus,
            "sigma_at_0": sigma_0,
            "heads_coverage_at_0": {cls: round(float(np.mean([band_coverage(*p, 0.0).mean()
                                                              for p in inside[cls].values()])), 3)
                                    for cls in inside},
            "in_distribution_split": "1 in 5 shapes held out on every training GPU (shape_blocks)",
            "fold_settings": {k: settings[k] for k in ("members", "epochs", "hidden")},
            "logo": {g: {"distance": round(distance[g], 4),
                         "sigma": {cls: round(conformal_sigma([p[g]]), 4)
                                   for cls, p in logo.items() if g in p}} for g in gpus},
            "nested_coverage": nested_coverage(logo, inside)}
    return sigma, band


def nested_coverage(logo: dict, inside: dict) -> dict:
    """Per class and training GPU g: the coverage of g's left-out rows under the band
    calibrated from the other GPUs' folds alone (σ_0 from their in-distribution rows, σ and
    near_distance from their left-out rows) at g's distance to them."""
    from kit.predict.features import gpu_distance
    from kit.predict.tile_ensemble import sigma_at_distance

    out = {}
    for cls, parts in logo.items():
        gpus = sorted(parts)
        if len(gpus) < 3:
            continue
        res = {}
        for g in gpus:
            rest = [o for o in gpus if o != g]
            s_far = conformal_sigma([parts[o] for o in rest])
            s_0 = min(conformal_sigma([inside[cls][o] for o in rest if o in inside.get(cls, {})]),
                      s_far)
            near = min(gpu_distance(o, [r for r in rest if r != o]) for o in rest)
            s = sigma_at_distance(s_0, s_far, gpu_distance(g, rest), near)
            res[g] = round(float(band_coverage(*parts[g], s).mean()), 3)
        out[cls] = res
    return out


def shape_blocks(frame: pd.DataFrame, n: int = 5) -> np.ndarray:
    """Each row's block 0..n-1 by a hash of its shape (SHAPE_KEY without the GPU): a shape
    falls in the same block on every GPU, so a held-out block holds shapes no GPU trained on."""
    cols = [c for c in SHAPE_KEY if c != "gpu"]
    return (pd.util.hash_pandas_object(frame[cols], index=False).to_numpy() % n).astype(int)


def band_coverage(logq: np.ndarray, log_base: np.ndarray, log_y: np.ndarray,
                  sigma: float) -> np.ndarray:
    """Per row, whether the measured log latency lies inside the predictor's p10–p90 band
    (the same clipping as TilePredictor: p10 never below the base, never above the median)."""
    from kit.predict.tile_ensemble import combine

    centre, lo, hi = combine(logq, sigma)
    lo = np.minimum(np.maximum(lo, log_base), centre)
    return (log_y >= lo) & (log_y <= np.maximum(hi, centre))


def conformal_sigma(parts: list, target: float = 0.8) -> float:
    """The smallest σ ≥ 0 whose band covers `target` of the rows of parts [(logq, log_base,
    log_y) per left-out GPU], each GPU weighted alike (bisection; coverage grows with σ)."""
    parts = [p for p in parts if len(p[2])]
    if not parts:
        return 0.0

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
