"""Scoring predictors against measured test rows: MAPE, median and p90 absolute percentage error.

    APE = |predicted − measured| / measured × 100

A test row gives the predictors only its op, shape, dtype and GPU (`visible_columns`); its
kernel name, launch dims and occupancy are what the target GPU did, so no predictor sees them.
The latency is the target.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from kit.errors import KitError, comma_names
from kit.predict.features import CLASSES, op_from_row

VISIBLE = ["op", "op_class", "elem_kind", "scalar", "gpu", "dtype", "b", "m", "n", "k", "rows",
           "cols"]
ALL_PREDICTORS = ("roofline", "habitat", "li", "mlp", "tile")
LEARNED = ("habitat", "li", "mlp", "tile")  # the predictors that read weights
RESULT_KEYS = ("predictor", "gpu", "op", "n", "mape", "median_ape", "p90_ape")


def load_test(path: str | Path, note_repeats: bool = True) -> pd.DataFrame:
    """Test rows from a measurement CSV (NeuSight's format or the kit's) or a folder of them
    (every .csv and .csv.gz under it, subfolders included).

    Exact repeats (same op, shape, GPU and latency, as NeuSight's test/vec.csv repeats
    elem/ln/softmax) are kept once, rows of op classes no predictor models (conv) and rows
    without a GPU (a CPU measurement) are left out, each with a note (scorable_rows; the
    repeats' note only where note_repeats). Linear rows of a collector file timed without a
    bias (kit.data.provenance.linear_without_bias) are left out with a note, as kit train
    --extra leaves them out: no predictor has a bias input, and the learned ones learned
    NeuSight's Linear, which has one."""
    from kit.data import load_measurements
    from kit.data.loading import NotMeasurementCSV, measurement_files
    from kit.data.provenance import linear_without_bias

    path = Path(path)
    if path.is_dir():
        # its subfolders too, as `kit train --extra` reads a folder
        files = measurement_files(path)
        if not files:
            raise KitError(f"no .csv (or .csv.gz) test files in {path} or its subfolders")
    elif path.is_file():
        files = [path]
    elif path.exists():
        raise KitError(f"{path} is not a regular file or folder (expected a CSV or a folder of them)")
    else:
        raise KitError(f"test file or folder not found: {path}")
    parts, other, no_bias = [], [], {}
    for f in files:
        try:
            rows = load_measurements(f)
        except NotMeasurementCSV:  # a folder's other CSVs (nvidia-smi samples): skipped and said, as --extra does
            if not path.is_dir():
                raise
            other.append(f.relative_to(path).as_posix())
            continue
        if linear_without_bias(f):  # as kit train --extra: the predictors learned Linear with a bias
            linear = rows.op == "linear"
            if linear.any():
                # by its path in the folder: sessions name their files alike (session/decode_...)
                no_bias[f.relative_to(path).as_posix() if path.is_dir() else f.name] = int(linear.sum())
                rows = rows[~linear]
        parts.append(rows)
    if not parts:
        raise KitError(f"no measurement CSV in {path}: {len(other)} CSV file(s), none with the "
                       f"measurement columns (e.g. {other[0]})")
    if other:
        warnings.warn(f"{path}: skipped {len(other)} CSV file(s) that are no measurement table: "
                      + ", ".join(other[:3]) + (" ..." if len(other) > 3 else ""), stacklevel=2)
    frame = pd.concat(parts, ignore_index=True)
    if no_bias:
        said = (f"the {sum(no_bias.values())} linear row(s) of {', '.join(sorted(no_bias))}, timed "
                "without a bias (FILE.meta.json: kit collect --no-bias): the predictors price "
                "Linear as NeuSight's, with one, and kit train --extra leaves such rows out too")
        if frame.empty:
            raise KitError(f"{path}: nothing to score after leaving out {said}")
        warnings.warn(f"{path}: left out {said}", stacklevel=2)
    return scorable_rows(frame, str(path), note_repeats)


def load_neusight_test(data_dir=None) -> pd.DataFrame:
    """NeuSight's kernel test rows (data/dataset/test under data_dir, or KIT_DATA), as load_test
    reads them. Its vec.csv repeats its elem, ln and softmax files row for row, which is known:
    those repeats are counted once without a note (load_test notes any other repeat)."""
    from kit.data import resolve_data_dir

    return load_test(resolve_data_dir(data_dir) / "data" / "dataset" / "test", note_repeats=False)


def scorable_rows(frame: pd.DataFrame, where: str, note_repeats: bool = True) -> pd.DataFrame:
    """The rows of a checked measurement table (kit.data.records.checked_table: what
    load_measurements returns) that the predictors can score, as load_test and evaluate() on a
    caller's frame both take them: rows without a GPU (a CPU measurement, or neither gpu nor
    device_name) are left out with a note, none on a GPU is a KitError; a GPU the catalog (or
    a --gpu-file) lacks is a KitError; exact repeats are kept once and rows of an op class no
    predictor models (conv) are left out, each with a note (the repeats' only where
    note_repeats: NeuSight's test folder repeats itself knowingly, load_neusight_test)."""
    from kit.hardware import get_gpu

    if frame.empty:  # a header and no rows: "none of the 0 rows is on a GPU" would mislead
        raise KitError(f"{where} has no rows (a header only); give a file with measurements")
    no_gpu = frame["gpu"].isna()
    if no_gpu.all():
        raise KitError(f"{where}: none of the {len(frame)} test row(s) is on a GPU (each lacks a gpu "
                       "and a device_name the catalog knows, or was measured on the CPU); the "
                       "predictors price GPU kernels")
    if no_gpu.any():
        n = int(no_gpu.sum())
        warnings.warn(f"{where}: {n} of the {len(frame)} test rows {'has' if n == 1 else 'have'} no "
                      "GPU (no gpu or device_name, or a CPU measurement): left out, as no predictor "
                      "prices them")
        frame = frame[~no_gpu]
    for gpu in pd.unique(frame["gpu"]):  # a predictor needs the GPU: one the catalog (or a
        try:  # --gpu-file) knows
            get_gpu(gpu)
        except KitError as e:
            raise KitError(f"{where}: test rows on gpu {gpu!r}: {e}") from None
    repeats = frame.duplicated([*VISIBLE, "latency_ms"])
    if repeats.any() and note_repeats:  # said: a score over n rows counts each measurement once
        n = int(repeats.sum())
        warnings.warn(f"{where}: {n} test row{'' if n == 1 else 's'} repeat{'s' if n == 1 else ''} "
                      "another exactly (op, shape, dtype, GPU and latency): counted once")
    frame = frame[~repeats]
    modelled = frame.op_class.isin(CLASSES)
    if modelled.any() and not modelled.all():
        what = ", ".join(f"{int(c)} {k}" for k, c in frame.op_class[~modelled].value_counts().items())
        warnings.warn(f"{where}: {what} row(s) left out: the predictors scored here price "
                      f"{', '.join(CLASSES)} (benchmarks/conv_model.py scores conv2d rows)")
    frame = frame[modelled].reset_index(drop=True)
    if frame.empty:
        raise KitError(f"{where}: no test rows of a modelled op class ({', '.join(CLASSES)})")
    return frame


def _test_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A caller's own frame of test rows (load_test's columns), renumbered (rows are matched to
    their predictions by index, so a repeated index label, two frames concatenated, would pair a
    row with the wrong answers), then checked as a CSV's rows are (checked_table: op classes,
    dtypes, shapes, positive finite latencies) and taken as load_test takes them (scorable_rows:
    rows without a GPU left out with a note, exact repeats once)."""
    from kit.data.records import checked_table

    missing = [c for c in (*VISIBLE, "latency_ms") if c not in frame.columns]
    if missing:
        raise KitError(f"test rows lack column(s) {', '.join(missing)} "
                       f"(load them with kit.predict.evaluate.load_test)")
    if frame.empty:
        raise KitError("no test rows to score (the frame is empty)")
    where = "the test frame"
    return scorable_rows(checked_table(frame.reset_index(drop=True), where, lines=False), where)


def visible_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Only what a predictor may see of a test row."""
    return frame[VISIBLE].copy()


def predict_rows(frame: pd.DataFrame, predictors: dict, in_stream: bool = False) -> pd.DataFrame:
    """One row per (test row, predictor): measured, predicted, band and APE. in_stream: each
    learned predictor's kernel time without the dispatch floor it learned from isolated calls
    (kit.workload.kernel_times.in_stream_ms), as a whole model costs it: what a kernel time
    (kernel_ms) is scored against."""
    from kit.hardware import get_gpu
    from kit.workload.kernel_times import in_stream_ms, isolation_floor_ms

    from kit.predict import FP32_ONLY

    seen = visible_columns(frame)
    out = []
    for gpu, idx in seen.groupby("gpu", sort=True).groups.items():
        all_ops = [op_from_row(r) for r in seen.loc[idx].to_dict("records")]
        for name, model in predictors.items():
            # the FP32-only baselines (kit.predict.FP32_ONLY) score the FP32 rows (evaluate warns)
            keep = np.array([name not in FP32_ONLY or getattr(op, "dtype", "fp32") == "fp32"
                             for op in all_ops], dtype=bool)
            if not keep.any():
                continue
            part, ops = seen.loc[idx[keep]], [op for op, k in zip(all_ops, keep) if k]
            measured = frame.loc[part.index, "latency_ms"].to_numpy(float)
            pred = model.predict(ops, gpu)
            lat = pred.latency_ms.to_numpy(float)
            p10, p90 = pred.latency_p10_ms.to_numpy(float), pred.latency_p90_ms.to_numpy(float)
            floor = isolation_floor_ms(model, get_gpu(gpu)) if in_stream else 0.0
            if floor > 0:
                roof = pred.roofline_ms.to_numpy(float)
                lat, p10, p90 = (in_stream_ms(x, roof, floor) for x in (lat, p10, p90))
            out.append(pd.DataFrame({
                "predictor": name, "gpu": gpu, "op": part.op.to_numpy(),
                "op_class": part.op_class.to_numpy(), "measured_ms": measured,
                "predicted_ms": lat, "p10_ms": p10,
                "p90_ms": p90,
                "tile": pred.tile.to_numpy(), "row": part.index,
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
        if not np.isfinite(ape).all():  # a score of inf or NaN would print, not a number to trust
            raise KitError(f"{', '.join(map(str, key))}: an APE that is no finite number (a measured "
                           "or predicted time of 0 or inf?); no score is given")
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
    names = ALL_PREDICTORS if text is None else comma_names(text, "--predictors")
    from kit.predict import PREDICTORS

    valid = sorted(set(PREDICTORS) | set(ALL_PREDICTORS))
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise KitError(f"unknown predictor(s) {', '.join(bad) or '(none given)'}: "
                       f"choose from {', '.join(valid)}")
    return list(dict.fromkeys(names))


def load_weights(names, weights_dir=None):
    """The weights bundle the learned predictors among names read (None when none is named)."""
    from kit.predict import bundle_in_use
    from kit.predict.weights import load_bundle

    if not set(LEARNED) & set(names):
        return None
    return load_bundle(weights_dir) if weights_dir is not None else bundle_in_use()  # KIT_WEIGHTS


FALLBACK = {"tile": "wave", "habitat": "wave", "li": "roofline", "mlp": "roofline"}


def learned_classes(name: str, bundle) -> set:
    """The op classes a learned predictor (LEARNED) has a model for in bundle (the others fall back to
    FALLBACK[name]: the roofline, or the wave model, which is the roofline with whole waves)."""
    if name in ("tile", "habitat"):  # habitat's reference for kernels it has not measured
        return set(bundle.tile.models)
    if name == "mlp":
        return set(bundle.mlp.models) if bundle.mlp is not None else set()
    return set(bundle.li.coefs)


def build_predictors(names, weights_dir=None, measurements: pd.DataFrame | None = None,
                     bundle=None) -> dict:
    """Predictor objects by name, the learned ones from bundle or weights_dir (default: shipped)."""
    from kit.predict import PREDICTORS
    from kit.predict.habitat import HabitatPredictor

    bundle = bundle if bundle is not None else load_weights(names, weights_dir)
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


TARGETS = ("latency", "kernel")


def with_target(frame: pd.DataFrame, target: str = "latency") -> pd.DataFrame:
    """The rows scored against `target`: "latency" (latency_ms, the timed call, as every source
    has it) or "kernel" (kernel_ms, the call's summed GPU kernel time, which only the kit's
    collector records: NeuSight's rows have none), put in latency_ms. Rows without a kernel
    time are dropped with a note; none at all, or a kernel time that is zero, negative or
    infinite, is a KitError. evaluate() scores the kernel target against the learned
    predictors' in-stream times (predict_rows), without their dispatch floor."""
    if target not in TARGETS:
        raise KitError(f"unknown target {target!r}: choose {' or '.join(TARGETS)}")
    if target == "latency":
        return frame
    from kit.data.records import check_times

    if "kernel_ms" in frame:  # zero, negative or infinite: an error, as such a latency_ms is
        check_times(frame[["kernel_ms"]], "the test rows", lines=False)
    kernel = pd.to_numeric(frame["kernel_ms"], errors="coerce") if "kernel_ms" in frame else None
    keep = kernel.notna() if kernel is not None else None
    if keep is None or not keep.any():
        raise KitError("no test row has a kernel time (kernel_ms): only the kit's collector "
                       "records one (NeuSight's rows are event latencies); use the latency target")
    if not keep.all():
        n = int((~keep).sum())
        warnings.warn(f"{n} of the {len(frame)} test rows {'has' if n == 1 else 'have'} no kernel "
                      "time (kernel_ms): left out of the kernel target")
    out = frame[keep].copy()
    out["latency_ms"] = kernel[keep]
    return out.reset_index(drop=True)


def evaluate(test: str | Path | pd.DataFrame, predictors=None, weights_dir=None,
             data_dir=None, target: str = "latency") -> list[dict]:
    """Score predictors (names, default all) on test rows: summarise()'s list, plus coverage_80
    (the share of rows inside the p10-p90 band) for predictors that give a band. target:
    "latency" scores against the measured latency_ms, "kernel" against kernel_ms (with_target)."""
    if target not in TARGETS:  # before reading any rows
        raise KitError(f"unknown target {target!r}: choose {' or '.join(TARGETS)}")
    frame = _test_frame(test) if isinstance(test, pd.DataFrame) else load_test(test)
    frame = with_target(frame, target)
    names = parse_predictors(predictors if isinstance(predictors, str) or predictors is None
                             else ",".join(predictors))
    if weights_dir is not None and not set(LEARNED) & set(names):  # else silently unused
        raise KitError(f"weights are for the learned predictors ({', '.join(LEARNED)}); "
                       f"{', '.join(names)} {'reads' if len(names) == 1 else 'read'} none")
    if data_dir is not None and "habitat" not in names:
        raise KitError(f"the NeuSight data (--data) is habitat's measured reference; "
                       f"{', '.join(names)} {'does' if len(names) == 1 else 'do'} not read it: add habitat "
                       "or drop --data")
    measurements = None
    if "habitat" in names and data_dir is not None:
        from kit.predict.training import training_frame

        # habitat scales the kernels of the training parts (test_rows=False): with the test rows
        # it would look up, on a training GPU, the very row it is scored on. The rows SUSPECT_ROWS
        # names stay out as in training (the P4's Linear training rows: scaled from, they had put
        # its own Linear test rows 3-5x slow), so those shapes scale the tile-MLP's time there
        measurements = training_frame(data_dir, test_rows=False)
    bundle = load_weights(names, weights_dir)
    if predictors is None and bundle is not None and bundle.mlp is None:  # not asked for by name
        names = [n for n in names if n != "mlp"]
        warnings.warn("these weights have no direct MLP (trained with --no-direct): mlp left out")
    from kit.predict import FP32_ONLY

    other = sorted(set(frame.dtype.fillna("fp32")) - {"fp32"}) if "dtype" in frame else []
    baselines = [n for n in names if n in FP32_ONLY]
    if other and baselines:
        if not (frame.dtype.fillna("fp32") == "fp32").any() and predictors is None:  # not named
            names = [n for n in names if n not in FP32_ONLY]
            warnings.warn(f"{', '.join(baselines)} left out: fitted on FP32 kernels only, and these "
                          f"rows are all {', '.join(other)}")
        elif not (frame.dtype.fillna("fp32") == "fp32").any():
            raise KitError(f"{', '.join(baselines)} {'was' if len(baselines) == 1 else 'were'} fitted on "
                           f"FP32 kernels only and these rows are all {', '.join(other)}: leave "
                           f"{'it' if len(baselines) == 1 else 'them'} out of --predictors")
        else:
            warnings.warn(f"{', '.join(baselines)} score the FP32 rows only (fitted on FP32 kernels, "
                          f"no dtype input); the {', '.join(other)} rows are scored by the others")
    rows = predict_rows(frame, build_predictors(names, weights_dir, measurements, bundle=bundle),
                        in_stream=target == "kernel")
    _check_finite(rows, weights_dir)
    out = summarise(rows)
    cls_of = dict(zip(rows.op, rows.op_class))
    fallback = {}
    for r in out:  # banded predictors: the share of measured latencies inside the p10-p90 band
        part = rows[(rows.predictor == r["predictor"]) & (rows.gpu == r["gpu"]) & (rows.op == r["op"])]
        if (part.p90_ms > part.p10_ms).any():
            r["coverage_80"] = round(coverage(part), 3)
        if r["predictor"] in LEARNED and cls_of[r["op"]] not in learned_classes(r["predictor"], bundle):
            r["fallback"] = FALLBACK[r["predictor"]]  # a class these weights have no model of
            fallback.setdefault(r["predictor"], set()).add(cls_of[r["op"]])
    for name, classes in fallback.items():
        warnings.warn(f"these weights have no {name} model for {', '.join(sorted(classes))}: "
                      f"{name}'s rows of it are the {FALLBACK[name]} model's (marked fallback)")
    _note_in_sample(frame, bundle, names)
    return out


def _check_finite(rows: pd.DataFrame, weights_dir=None) -> None:
    """KitError when a predictor gave a latency (or band edge) that is not a positive finite
    number: its scores would print as nan or inf with exit 0 (damaged weights did)."""
    pred = rows[["predicted_ms", "p10_ms", "p90_ms"]].apply(pd.to_numeric, errors="coerce")
    bad = ~(np.isfinite(pred) & (pred > 0)).all(axis=1)
    if not bad.any():
        return
    i = int(np.flatnonzero(bad.to_numpy())[0])
    first = rows.iloc[i]
    value = next(float(v) for v in pred.iloc[i] if not (np.isfinite(v) and v > 0))
    name = first.predictor
    n = int((bad & (rows.predictor == name)).sum())
    weights = f"the weights in {weights_dir}" if weights_dir is not None else "the shipped weights"
    cause = (f"{weights} may be damaged: restore them, or retrain with `kit train --out DIR`"
             if name in LEARNED else "a bug in the kit: please report it")
    raise KitError(f"{name} gave no finite, positive latency (or band) for {n} of its "
                   f"{int((rows.predictor == name).sum())} test rows (the first: {first.op} on "
                   f"{first.gpu}, got {value}); {cause}")


def _note_in_sample(frame: pd.DataFrame, bundle, names) -> None:
    """A note when the weights trained on NeuSight's softmax and layer-norm test rows
    (kit.predict.training.training_frame) and the scored rows hold those classes on a GPU
    trained on: scored on NeuSight's test files, those rows are in-sample."""
    n = int((bundle.manifest.get("test_rows_trained_on") or 0) if bundle is not None else 0)
    if not n or not set(LEARNED) & set(names):
        return
    hit = frame[frame.op_class.isin(["softmax", "layernorm"]) & frame.gpu.isin(bundle.train_gpus)]
    if len(hit):
        warnings.warn(f"these weights trained on {n} softmax and layer-norm rows of NeuSight's test "
                      f"files, of {', '.join(sorted(hit.gpu.unique()))}: scored on those files, "
                      "these GPUs' softmax and layernorm rows are in-sample")
