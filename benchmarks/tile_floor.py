"""How low can a kernel's error go from its shape alone? The noise floor of each test set.

Prints JSON with, per GPU of NeuSight's test set (the two held-out GPUs and the five training
GPUs) and op class:
  shipped    the shipped tile-MLP on those rows (transfer on the held-out GPUs)
  own_fit    the same model family fitted on that GPU's *own* test rows, scored on shapes it did
             not see: five folds by shape (kit.predict.training.shape_blocks), each fold scored by
             a tile-MLP (one member, the shipped settings) trained on the other four. It sees the
             target GPU and even its kernel names, so no transfer predictor can be expected to do
             better; what it cannot fit is measurement noise or something the shape does not say.
and, for GEMMs, `batch_inversions`: pairs of test rows with the same (m, n, k) where the batch
grew at least 1.5x yet the kernel ran faster (more work, less time: noise in the measurement),
and `shape_spread`: over shapes measured at several batch sizes, each enough work to fill the GPU,
how far the achieved TFLOP/s ranges (max / min) within one shape.

On the training GPUs, `train_test_shift` compares the two files directly: each vector-op test row
against the training rows of the same op whose every dimension is within 10% of it, time per
element against time per element (median over the matched rows; above 1 the test file runs
faster). Elementwise ops match to within 1%, so the method itself adds no bias; a class far from
1 was measured differently in the two files, and no model of the training file can predict the
test file better than that. GEMMs are left out: within 10% a dimension can cross a tile boundary,
which changes the time per FLOP by itself.

`sustained_efficiency` asks whether a GEMM's speed depends on how long it runs: the median share
of the GPU's FP32 GEMM peak that Linear rows with every dimension at least 512 (enough tiles to
fill the GPU) reach, per band of measured duration, in the test file and, on the training GPUs,
in the training file, with the shipped model's median predicted/measured ratio per band. A GPU
that holds its clock stays level; a power- or heat-limited one falls as the kernels grow longer.
The shape features cannot tell a throttled long kernel from a slow one.

    .venv/bin/python benchmarks/tile_floor.py [--data DIR] [--gpus l4,a100-pcie-80gb] [--threads 2]

Needs the NeuSight data (KIT_DATA). Takes minutes per GPU on two cores: `--gpus l4` (3,963 test
rows) ran in 196 s; all seven GPUs (~23,800 rows) should take about 20 minutes, scaled by rows,
not timed. Not run by the tests.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import pandas as pd

from kit.predict.evaluate import load_test, predict_rows, summarise
from kit.predict.training import SETTINGS, shape_blocks

FOLDS = 5
NEIGHBOUR = 1.10  # train_test_shift: a training row within this factor in every dimension


def own_fit_rows(part: pd.DataFrame, seed: int) -> pd.DataFrame:
    """predict_rows of one GPU's rows, each fold predicted by a tile-MLP fitted on the others."""
    from kit.predict.tile_fit import fit_tile_predictor

    fold = shape_blocks(part, FOLDS)
    out = []
    for f in range(FOLDS):
        train, held = part[fold != f], part[fold == f].reset_index(drop=True)
        if train.empty or held.empty:
            continue
        model = fit_tile_predictor(train, seed=seed, members=1, epochs=SETTINGS["epochs"],
                                   hidden=SETTINGS["hidden"], min_steps=SETTINGS["min_steps"],
                                   chooser_epochs=SETTINGS["chooser_epochs"])
        out.append(predict_rows(held, {"own_fit": model}))
    return pd.concat(out, ignore_index=True)


def batch_inversions(part: pd.DataFrame, min_ms: float = 0.05) -> dict:
    """Same (op, m, n, k), batch b2 >= 1.5 b1, and t(b2) < t(b1): how often, and the worst."""
    pairs = inverted = 0
    worst = None
    for key, grp in part[part.op_class == "gemm"].groupby(["op", "m", "n", "k"], sort=True):
        b, t = grp.b.to_numpy(float), grp.latency_ms.to_numpy(float)
        big = (b[None, :] >= 1.5 * b[:, None]) & (t[None, :] > min_ms)
        pairs += int(big.sum())
        bad = big & (t[None, :] < t[:, None])
        inverted += int(bad.sum())
        if bad.any():
            i, j = np.unravel_index(np.argmax(np.where(bad, t[:, None] / t[None, :], 0)), bad.shape)
            speed = float(t[i] / t[j])
            if worst is None or speed > worst["faster_by"]:
                worst = {"op": key[0], "m": int(key[1]), "n": int(key[2]), "k": int(key[3]),
                         "b": [int(b[i]), int(b[j])], "ms": [round(float(t[i]), 4),
                                                             round(float(t[j]), 4)],
                         "faster_by": round(speed, 3)}
    return {"pairs": pairs, "inverted": inverted,
            "share": round(inverted / pairs, 4) if pairs else None, "worst": worst}


def shape_spread(part: pd.DataFrame, min_gflop: float = 20.0, min_rows: int = 4) -> dict:
    """Per GEMM op: over the (m, n, k) measured at min_rows or more batch sizes, each doing at
    least min_gflop GFLOP (enough tiles to fill any of these GPUs, so the rate should be level),
    the spread of the achieved rate, max / min TFLOP/s: its median, 90th percentile and the
    share of shapes over 1.5x. A GPU whose clock holds stays near 1; one that switches between
    clock states in the course of a sweep shows two rates for one shape, and no model of the
    shape can fit both."""
    out = {}
    gemm = part[part.op_class == "gemm"]
    for op, rows in gemm.groupby("op", sort=True):
        flop = 2 * rows.b.fillna(1).astype(float) * rows.m * rows.n * rows.k
        big = rows[flop >= min_gflop * 1e9].assign(tflops=flop / rows.latency_ms / 1e9)
        spreads = [g.tflops.max() / g.tflops.min() for _, g in big.groupby(["m", "n", "k"])
                   if len(g) >= min_rows]
        if spreads:
            s = np.array(spreads, dtype=float)
            out[op] = {"shapes": len(s), "median": round(float(np.median(s)), 3),
                       "p90": round(float(np.quantile(s, 0.9)), 3),
                       "over_1_5x": round(float((s > 1.5).mean()), 3)}
    return out


def _shape_key(cls: str, rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row: its log shape (the element count for elementwise ops, rows and cols for row
    ops) and its time per element."""
    numel = (rows.rows * rows.cols).to_numpy(float)
    dims = numel[:, None] if cls == "elementwise" else rows[["rows", "cols"]].to_numpy(float)
    return np.log(dims), rows.latency_ms.to_numpy(float) / numel


def train_test_shift(train: pd.DataFrame, part: pd.DataFrame) -> dict:
    """Per vector class: how much faster per element one GPU's test rows run than its training
    rows of the same op and nearly the same shape (NEIGHBOUR); matched rows and the median."""
    out = {}
    tol = np.log(NEIGHBOUR)
    for cls in ("elementwise", "softmax", "layernorm"):
        ratios = []
        for op, test_op in part[part.op_class == cls].groupby("op", sort=True):
            ref = train[train.op == op]
            if ref.empty:
                continue
            key_r, per_r = _shape_key(cls, ref)
            key_t, per_t = _shape_key(cls, test_op)
            for i in range(len(key_t)):
                near = np.abs(key_r - key_t[i]).max(axis=1) < tol
                if near.any():
                    ratios.append(float(np.median(per_r[near]) / per_t[i]))
        if ratios:
            out[cls] = {"matched": len(ratios), "test_faster_by": round(float(np.median(ratios)), 3)}
    return out


DURATION_EDGES_MS = (0.0, 1.0, 10.0, 100.0, float("inf"))
SATURATED_DIM = 512  # sustained_efficiency: every GEMM dimension at least this


def _duration_band(ms: float) -> str:
    for lo, hi in zip(DURATION_EDGES_MS, DURATION_EDGES_MS[1:]):
        if lo < ms <= hi:
            return f"{lo:g}-{hi:g} ms" if hi < float("inf") else f"over {lo:g} ms"
    raise ValueError(f"duration {ms} ms is not positive")


def sustained_efficiency(rows: pd.DataFrame, gpu: str, predicted_ms=None) -> dict:
    """Per duration band of the Linear rows with every dim >= SATURATED_DIM: n, the median share
    of the GPU's FP32 GEMM peak, and (given predictions aligned with `rows`) the median
    predicted/measured ratio."""
    from kit.hardware import get_gpu

    peak = get_gpu(gpu).gemm_peak_flops_per_s("fp32")
    keep = ((rows.op == "linear") & (rows[["m", "n", "k"]].min(axis=1) >= SATURATED_DIM)).to_numpy()
    part = rows[keep]
    ms = part.latency_ms.to_numpy(float)
    share = 2.0 * part.b * part.m * part.n * part.k / (ms * 1e-3) / peak
    table = pd.DataFrame({"band": [_duration_band(t) for t in ms], "share": share.to_numpy(float),
                          "ms": ms})
    if predicted_ms is not None:
        table["ratio"] = np.asarray(predicted_ms, float)[keep] / ms
    out = {}
    for lo in DURATION_EDGES_MS[:-1]:  # in order of duration
        band = _duration_band(lo + 1e-9)
        grp = table[table.band == band]
        if len(grp):
            out[band] = {"n": int(len(grp)), "peak_share": round(float(grp.share.median()), 3)}
            if "ratio" in grp:
                out[band]["predicted_over_measured"] = round(float(grp.ratio.median()), 3)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="NeuSight folder (default KIT_DATA)")
    ap.add_argument("--gpus", help="comma-separated catalog keys (default: every GPU in the test set)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import torch

    from kit.data import resolve_data_dir
    from kit.predict.nets import set_threads
    from kit.predict.training import DEFAULT_TRAIN_GPUS, training_frame
    from kit.predict.weights import shipped_tile

    set_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    root = resolve_data_dir(args.data)
    test = load_test(root / "data" / "dataset" / "test")
    # set against the test files: every measured training row, SUSPECT_ROWS too (this is their
    # evidence)
    train = training_frame(root, DEFAULT_TRAIN_GPUS, test_rows=False, suspect_rows=True)
    gpus = args.gpus.split(",") if args.gpus else sorted(test.gpu.unique())
    shipped = shipped_tile()
    result = {"folds": FOLDS, "settings": {**SETTINGS, "members": 1}, "gpus": {}}
    t0 = time.perf_counter()
    for gpu in gpus:
        part = test[test.gpu == gpu].reset_index(drop=True)
        if part.empty:
            print(f"no test rows for {gpu}", file=sys.stderr)
            continue
        rows = pd.concat([predict_rows(part, {"shipped": shipped}), own_fit_rows(part, args.seed)],
                         ignore_index=True)
        by_class = summarise(rows.assign(op=rows.op_class))
        result["gpus"][gpu] = {
            "classes": {c: {s["predictor"]: {k: s[k] for k in ("n", "mape", "median_ape")}
                            for s in by_class if s["op"] == c}
                        for c in sorted(rows.op_class.unique())},
            "batch_inversions": batch_inversions(part), "shape_spread": shape_spread(part)}
        shipped_ms = rows[rows.predictor == "shipped"].sort_values("row").predicted_ms.to_numpy()
        result["gpus"][gpu]["sustained_efficiency"] = {
            "test": sustained_efficiency(part, gpu, shipped_ms)}
        if gpu in DEFAULT_TRAIN_GPUS:
            result["gpus"][gpu]["train_test_shift"] = train_test_shift(train[train.gpu == gpu], part)
            result["gpus"][gpu]["sustained_efficiency"]["train"] = sustained_efficiency(
                train[train.gpu == gpu], gpu)
        print(f"{gpu} done", file=sys.stderr, flush=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
