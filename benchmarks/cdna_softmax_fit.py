"""Fit, and check, the block-softmax row latency the kit gives AMD CDNA GPUs
(kit.predict.cdna_softmax.CDNA_SOFTMAX_ROW_CLOCKS) on NeuSight's AMD softmax rows.

    KIT_DATA=... python benchmarks/cdna_softmax_fit.py > fit.json

Rows: data/dataset_amd/train/softmax.csv (PyTorch 2.4.1 on ROCm, MI100 and MI210, fp32), those
past the warp kernel (more than 1,024 columns). The kit does not train on them; they are the
only AMD softmax kernels measured. A row's kernel time is its latency less the tile predictor's
dispatch floor on that GPU (kit.workload.kernel_times.isolation_floor_ms, which the kit adds
back), divided by its rounds of resident blocks (kit.predict.cdna_softmax.slots) and put in
clocks at the GPU's boost clock. Per kernel (three-pass or shared-memory, as
kit.predict.cdna_softmax.kernel_of tells them apart), the least-squares line a + b x cols through
those clocks is the fit.

Output (JSON):
- `kernel_names`: how often kernel_of's choice matches the kernel name each row recorded;
- `fit`: the line per kernel over both GPUs' rows (what the kit ships) and its MAPE on them;
- `per_gpu`: the line fitted on each GPU alone, in clocks (nearly the same on both);
- `cross_generation`: a fit on one GPU's rows, scored on the other's (latency MAPE, median APE
  and geometric bias, measured over predicted), beside the shipped tile predictor's score on the
  same rows and the share of them inside its p10-p90 band. The shipped predictor applies the
  pooled fit, so its score here is in-sample; the cross-generation score is the held-out figure;
- `band_log`: the 10th and 90th percentiles of the held-out log residuals, log(measured /
  line), over both directions (kit.predict.cdna_softmax.CDNA_SOFTMAX_BAND_LOG);
- `warp_rows`: the shipped predictor on the warp kernel's rows (no bound there), for scale.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from kit.errors import KitError  # noqa: E402

GPUS = ("mi100", "mi210")
SOFTMAX = Path("data") / "dataset_amd" / "train" / "softmax.csv"


def rows(data_dir) -> dict:
    """Per GPU of GPUS: arrays of NeuSight's AMD softmax rows (rows, cols, latency_ms, the
    kernel name's variant, kit's variant, slots, dispatch floor ms)."""
    from kit.data import resolve_data_dir
    from kit.hardware import get_gpu
    from kit.predict import get_predictor
    from kit.predict.cdna_softmax import kernel_of, slots
    from kit.predict.evaluate import load_test
    from kit.workload.kernel_times import isolation_floor_ms

    path = resolve_data_dir(data_dir) / SOFTMAX
    if not path.is_file():
        raise KitError(f"NeuSight's AMD softmax rows not found at {path}")
    frame = load_test(path)
    tile = get_predictor("tile")
    out = {}
    for key in GPUS:
        part = frame[frame.gpu == key]
        if not len(part):
            raise KitError(f"no {key} rows in {path}")
        gpu = get_gpu(key)
        names = part.kernel_name.astype(str)
        recorded = np.where(names.str.contains("warp"), "warp",
                            np.where(names.str.contains("Smem"), "smem", "three_pass"))
        cols = part.cols.to_numpy(int)
        kit_kernel = np.array([kernel_of(c, gpu, 4) or "warp" for c in cols])
        out[key] = {"gpu": gpu, "rows": part.rows.to_numpy(float), "cols": cols.astype(float),
                    "latency_ms": part.latency_ms.to_numpy(float), "recorded": recorded,
                    "kernel": kit_kernel, "slots": np.array([slots(c, gpu, 4) for c in cols], dtype=float),
                    "floor_ms": isolation_floor_ms(tile, gpu), "frame": part}
    return out


def clocks_per_round(r: dict) -> np.ndarray:
    rounds = np.ceil(r["rows"] / r["slots"])
    return (r["latency_ms"] - r["floor_ms"]) * 1e-3 * r["gpu"].boost_clock_mhz * 1e6 / rounds


def fit(tables: list[dict]) -> dict:
    """{kernel: (a, b)}: the least-squares line per block kernel through the tables' rows."""
    out = {}
    for kernel in ("three_pass", "smem"):
        cols, clocks = [], []
        for r in tables:
            keep = r["kernel"] == kernel
            cols.append(r["cols"][keep])
            clocks.append(clocks_per_round(r)[keep])
        cols, clocks = np.concatenate(cols), np.concatenate(clocks)
        if len(cols) < 4:
            raise KitError(f"too few {kernel} softmax rows to fit ({len(cols)})")
        a, b = np.linalg.lstsq(np.column_stack([np.ones(len(cols)), cols]), clocks, rcond=None)[0]
        out[kernel] = (round(float(a), 0), round(float(b), 2))
    return out


def predicted_ms(r: dict, constants: dict) -> np.ndarray:
    from kit.predict.cdna_softmax import block_softmax_ms

    return r["floor_ms"] + block_softmax_ms(r["rows"], r["cols"], r["gpu"], 4, constants)


def score(pred: np.ndarray, measured: np.ndarray) -> dict:
    ape = np.abs(pred - measured) / measured * 100
    return {"n": int(len(ape)), "mape": round(float(ape.mean()), 2),
            "median_ape": round(float(np.median(ape)), 2),
            "geo_bias": round(float(np.exp(np.mean(np.log(measured / pred)))), 3)}


def shipped_frame(r: dict, keep: np.ndarray):
    """The shipped tile predictor's frame for the rows keep."""
    from kit.predict import get_predictor
    from kit.predict.evaluate import op_from_row, visible_columns

    seen = visible_columns(r["frame"][keep])
    ops = [op_from_row(x) for x in seen.to_dict("records")]
    return get_predictor("tile").predict(ops, r["gpu"].key)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="NeuSight's data folder (default: KIT_DATA)")
    args = ap.parse_args(argv)
    try:
        tables = rows(args.data)
        both = fit(list(tables.values()))
        block = {g: r["kernel"] != "warp" for g, r in tables.items()}
        names = {g: {"rows": int(len(r["kernel"])),
                     "matching": int((r["kernel"] == r["recorded"]).sum())} for g, r in tables.items()}
        pooled = {k: {"a": a, "b": b} for k, (a, b) in both.items()}
        for kernel in both:
            meas, pred = [], []
            for g, r in tables.items():
                keep = r["kernel"] == kernel
                meas.append(r["latency_ms"][keep])
                pred.append(predicted_ms(r, both)[keep])
            pooled[kernel]["in_sample"] = score(np.concatenate(pred), np.concatenate(meas))
        per_gpu = {g: {k: list(v) for k, v in fit([r]).items()} for g, r in tables.items()}
        cross, resid = [], []
        for fitted, other in (GPUS, GPUS[::-1]):
            constants = fit([tables[fitted]])
            r, keep = tables[other], block[other]
            line = predicted_ms(r, constants)[keep]
            resid.append(np.log(r["latency_ms"][keep] / line))
            pred = shipped_frame(r, keep)
            measured = r["latency_ms"][keep]
            inside = (pred.latency_p10_ms.to_numpy(float) <= measured) & (measured <= pred.latency_p90_ms.to_numpy(float))
            cross.append({"fitted_on": fitted, "scored_on": other, "line": score(line, measured),
                          "tile_predictor": {**score(pred.latency_ms.to_numpy(float), measured),
                                             "band_coverage": round(float(inside.mean()), 3)}})
        band = [round(float(q), 4) for q in np.quantile(np.concatenate(resid), [0.1, 0.9])]
        warp = {g: score(shipped_frame(r, ~block[g]).latency_ms.to_numpy(float), r["latency_ms"][~block[g]])
                for g, r in tables.items()}
        print(json.dumps({"source": str(SOFTMAX), "gpus": list(GPUS), "kernel_names": names,
                          "fit": pooled, "per_gpu": per_gpu, "cross_generation": cross,
                          "band_log": band, "warp_rows": warp}, indent=1))
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
