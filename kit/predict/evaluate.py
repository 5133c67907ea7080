"""Scoring predictors against measured test rows: MAPE, median and p90 absolute percentage error.

    APE = |predicted − measured| / measured × 100

A test row gives the predictors only its op, shape, dtype and GPU (`visible_columns`); its
kernel name, launch dims and occupancy are what the target GPU did, so no predictor sees them.
The latency is the target.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kit.errors import KitError
from kit.predict.features import CLASSES, op_from_row

VISIBLE = ["op", "op_class", "elem_kind", "scalar", "gpu", "dtype", "b", "m", "n", "k", "rows",
           "cols"]
ALL_PREDICTORS = ("roofline", "habitat", "li", "mlp", "tile")
LEARNED = ("habitat", "li", "mlp", "tile")  # the predictors that read weights
RESULT_KEYS = ("predictor", "gpu", "op", "n", "mape", "median_ape", "p90_ape")


def load_test(path: str | Path) -> pd.DataFrame:
    """Test rows from a measurement CSV (NeuSight's format or the kit's) or a folder of them.

    Exact repeats (same op, shape, GPU and latency, as NeuSight's test/vec.csv repeats
    elem/ln/softmax) are kept once. Rows of op classes no predictor models (conv) are dropped."""
    from kit.data import load_measurements

    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.glob("*.csv"))
        if not files:
            raise KitError(f"no .csv test files in {path}")
    elif path.is_file():
        files = [path]
    else:
        raise KitError(f"test file or folder not found: {path}")
    frame = pd.concat([load_measurements(f) for f in files], ignore_index=True)
    frame = frame[frame.gpu.notna()]
    from kit.hardware import get_gpu

    for gpu in pd.unique(frame["gpu"]):  # a predictor needs the GPU: one the catalog (or a
        try:  # --gpu-file) knows
            get_gpu(gpu)
        except KitError as e:
            raise KitError(f"{path}: test rows on gpu {gpu!r}: {e}") from None
    frame = frame.drop_duplicates([*VISIBLE, "latency_ms"])
    frame = frame[frame.op_class.isin(CLASSES)].reset_index(drop=True)
    if frame.empty:
        raise KitError(f"{path}: no test rows of a modelled op class ({', '.join(CLASSES)})")
    return frame


def visible_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Only what a predictor may see of a test row."""
    return frame[VISIBLE].copy()


def predict_rows(frame: pd.DataFrame, predictors: dict) -> pd.DataFrame:
    """One row per (test row, predictor): measured, predicted, band and APE."""
    seen = visible_columns(frame)
    out = []
    for gpu, idx in seen.groupby("gpu", sort=True).groups.items():
        part = seen.loc[idx]
        ops = [op_from_row(r) for r in part.to_dict("records")]
        measured = frame.loc[idx, "latency_ms"].to_numpy(float)
        for name, model in predictors.items():
            pred = model.predict(ops, gpu)
            lat = pred.latency_ms.to_numpy(float)
            out.append(pd.DataFrame({
                "predictor": name, "gpu": gpu, "op": part.op.to_numpy(),
                "op_class": part.op_class.to_numpy(), "measured_ms": measured,
                "predicted_ms": lat, "p10_ms": pred.latency_p10_ms.to_numpy(float),
                "p90_ms": pred.latency_p90_ms.to_numpy(float),
                "tile": pred.tile.to_numpy(), "row": idx,
                "ape": np.abs(lat - measured) / measured * 100}))
    if not out:
        return pd.DataFrame(columns=["predictor", "gpu", "op", "op_class", "measured_ms",
                                     "predicted_ms", "p10_ms", "p90_ms", "tile", "row", "ape"])
    return pd.concat(out, ignore_index=True)


def summarise(rows: pd.DataFrame, by=("predictor", "gpu", "op")) -> list[dict]:
    """[{predictor, gpu, op, n, mape, median_ape, p90_ape}] (percent, rounded to 0.01)."""
    out = []
    for key, grp in rows.groupby(list(by), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        ape = grp.ape.to_numpy(float)
        out.append({**dict(zip(by, key)), "n": int(len(ape)),
                    "mape": round(float(ape.mean()), 2),
                    "median_ape": round(float(np.median(ape)), 2),
                    "p90_ape": round(float(np.percentile(ape, 90)), 2)})
    return out


def coverage(rows: pd.DataFrame) -> float:
    """Share of measured latencies inside their predicted p10–p90 band."""
    inside = (rows.measured_ms >= rows.p10_ms) & (rows.measured_ms <= rows.p90_ms)
    return float(inside.mean()) if len(rows) else float("nan")


def parse_predictors(text: str | None) -> list[str]:
    # None: every predictor; an empty list ("", ",") is a mistake, not a request for all of them
    names = ALL_PREDICTORS if text is None else [s.strip() for s in text.split(",") if s.strip()]
    from kit.predict import PREDICTORS

    valid = sorted(set(PREDICTORS) | set(ALL_PREDICTORS))
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise KitError(f"unknown predictor(s) {', '.join(bad) or '(none given)'}: "
                       f"choose from {', '.join(valid)}")
    return list(dict.fromkeys(names))


def build_predictors(names, weights_dir=None, measurements: pd.DataFrame | None = None) -> dict:
    """Predictor objects by name, the learned ones from weights_dir (default: shipped)."""
    from kit.predict import PREDICTORS
    from kit.predict.habitat import HabitatPredictor
    from kit.predict.weights import load_bundle, shipped_bundle

    learned = set(LEARNED)
    bundle = None
    if learned & set(names):
        bundle = load_bundle(weights_dir) if weights_dir is not None else shipped_bundle()
    out = {}
    for name in names:
        if name == "tile":
            out[name] = bundle.tile
        elif name == "li":
            out[name] = bundle.li
        elif name == "mlp":
            if bundle.mlp is None:
                raise KitError("these weights have no direct MLP (trained with --no-direct?)")
            out[name] = bundle.mlp
        elif name == "habitat":
            out[name] = HabitatPredictor(bundle.tile, bundle.train_gpus, measurements)
        else:
            out[name] = PREDICTORS[name]()
    return out


def evaluate(test: str | Path | pd.DataFrame, predictors=None, weights_dir=None,
             data_dir=None) -> list[dict]:
    """Score predictors (names, default all) on test rows: summarise()'s list, plus coverage_80
    (the share of rows inside the p10-p90 band) for predictors that give a band."""
    frame = test if isinstance(test, pd.DataFrame) else load_test(test)
    names = parse_predictors(predictors if isinstance(predictors, str) or predictors is None
                             else ",".join(predictors))
    if weights_dir is not None and not set(LEARNED) & set(names):  # else silently unused
        raise KitError(f"weights are for the learned predictors ({', '.join(LEARNED)}); "
                       f"{', '.join(names)} read none")
    if data_dir is not None and "habitat" not in names:
        raise KitError(f"the NeuSight data (--data) is habitat's measured reference; "
                       f"{', '.join(names)} do not read it: add habitat or drop --data")
    measurements = None
    if "habitat" in names and data_dir is not None:
        from kit.predict.training import training_frame

        # habitat scales the kernels of the training parts (test_rows=False): with the test rows
        # it would look up, on a training GPU, the very row it is scored on
        measurements = training_frame(data_dir, test_rows=False)
    rows = predict_rows(frame, build_predictors(names, weights_dir, measurements))
    out = summarise(rows)
    for r in out:  # banded predictors: the share of measured latencies inside the p10-p90 band
        part = rows[(rows.predictor == r["predictor"]) & (rows.gpu == r["gpu"]) & (rows.op == r["op"])]
        if (part.p90_ms > part.p10_ms).any():
            r["coverage_80"] = round(coverage(part), 3)
    return out
