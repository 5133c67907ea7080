"""Fit, and check, the kit's kernel-time rule for FP32/TF32 matrix-vector products (GEMMs with
m or n of 1; kit.predict.gemv) from the project's own H200 sweeps.

    python benchmarks/gemv_fit.py [--root measurements] > fit.json

Why a rule and not the tile-MLP: cuBLAS runs a GEMM with m or n of 1 on its gemv and dot
kernels (gemv2T_kernel_val, internal::gemvx, dot_kernel on the H200), which stream the matrix
once; the tile-MLP prices it as a GEMM tile of 32-128 rows, nearly all of them padding, and
NeuSight's data has no such row (its thinnest GEMMs have m or n of 2). On the H200's FP32 rows
with m or n of 1 it was 2.3-5x slow (MAPE 130-440% per size bucket). The rule streams the bytes:

    kernel_ms = (c0_us + bytes / (eff x DRAM bandwidth) x 1e6) / 1e3

c0 (launch and tail of a tiny kernel) and eff (the share of the DRAM bandwidth a gemv kernel
streams at) are fitted by a grid search on the mean absolute log error over the fitting rows;
the p10-p90 band is the 10th and 90th percentile of their log residuals.

Rows (kernel_ms, the summed time of the call's kernels; FP32 and TF32, m or n of 1):
* fitted on the random sweeps: measurements/h200-2026-12-04/session/random_linear_fp32,
  sweeps/random_linear_fp32_b and sweeps/random_bmm_fp32_c;
* checked on the aligned sweeps of the second session, other shapes and seeds:
  measurements/h200-2026-12-04-b/session/aligned_linear_fp32 and aligned_linear_tf32;
* and, with the same constants, on the 16-bit rows the rule also takes (check_16bit: the random
  bf16 and fp16 sweeps' GEMVs that Hopper's measured curve does not cover, mostly unaligned).
The output (JSON): the fitted constants and, per set and size bucket, n, MAPE, median APE and
the band's coverage, with the tile-MLP's MAPE on the same rows. tests/test_gemv.py refits and
checks the constants in kit.predict.gemv are what this script gives.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from kit.errors import KitError  # noqa: E402

DEFAULT_ROOT = ROOT / "measurements"
GPU = "h200"
FIT = ["h200-2026-12-04/session/random_linear_fp32.csv.gz",
       "h200-2026-12-04/sweeps/random_linear_fp32_b.csv.gz",
       "h200-2026-12-04/sweeps/random_bmm_fp32_c.csv.gz"]
CHECK = ["h200-2026-12-04-b/session/aligned_linear_fp32.csv.gz",
         "h200-2026-12-04-b/session/aligned_linear_tf32.csv.gz"]
# 16-bit GEMVs the rule takes (off the measured curve: kit.predict.gemv.applies), scored with the
# FP32 constants: the random bf16/fp16 sweeps, mostly unaligned
CHECK_16BIT = ["h200-2026-12-04/session/random_linear_bf16.csv.gz",
               "h200-2026-12-04/session/random_bmm_bf16.csv.gz",
               "h200-2026-12-04/sweeps/random_linear_bf16_b.csv.gz",
               "h200-2026-12-04/sweeps/random_linear_bf16_c.csv.gz",
               "h200-2026-12-04/sweeps/random_bmm_bf16_b.csv.gz",
               "h200-2026-12-04/sweeps/random_bmm_bf16_c.csv.gz",
               "h200-2026-12-04/sweeps/random_linear_fp16_c.csv.gz"]
BUCKETS_BYTES = ((0, 1e6, "<1MB"), (1e6, 1e7, "1-10MB"), (1e7, 1e8, "10-100MB"), (1e8, math.inf, ">=100MB"))
C0_GRID_US = np.round(np.arange(1.0, 5.0001, 0.1), 1)
EFF_GRID = np.round(np.arange(0.10, 1.0001, 0.01), 2)


def gemv_rows(root: Path, files: list[str], dtypes=("fp32", "tf32")) -> pd.DataFrame:
    """The rows of files in dtypes with m or n of 1 and a kernel time, with their bytes; 16-bit
    rows only where the rule takes them (kit.predict.gemv.applies: off the measured curve)."""
    from kit.hardware import get_gpu
    from kit.predict.evaluate import load_test, with_target
    from kit.predict.features import op_from_row
    from kit.predict.gemv import applies

    parts = []
    for f in files:
        path = root / f
        if not path.is_file():
            raise KitError(f"measurement file not found: {path} (give --root, the measurements folder)")
        parts.append(load_test(path))
    rows = with_target(pd.concat(parts, ignore_index=True), "kernel")
    rows = rows[((rows.m == 1) | (rows.n == 1)) & rows.dtype.isin(list(dtypes))].copy()
    rows = rows.reset_index(drop=True)
    ops = [op_from_row(r) for r in rows.to_dict("records")]
    taken = applies(get_gpu(GPU), ops) if ops else np.zeros(0, dtype=bool)
    rows, ops = rows[taken].reset_index(drop=True), [o for o, t in zip(ops, taken) if t]
    # the bytes the predictor streams (kit.ops.Gemm.bytes: a shared weight read once)
    rows["bytes"] = [o.bytes for o in ops]
    return rows


def fit(rows: pd.DataFrame, bw_gbs: float) -> dict:
    mem_us = rows.bytes.to_numpy(float) / (bw_gbs * 1e9) * 1e6
    t_us = rows.latency_ms.to_numpy(float) * 1e3
    best = None
    for c0 in C0_GRID_US:
        for eff in EFF_GRID:
            err = float(np.mean(np.abs(np.log((c0 + mem_us / eff) / t_us))))
            if best is None or err < best[0] - 1e-12:
                best = (err, float(c0), float(eff))
    _, c0, eff = best
    resid = np.log(t_us / (c0 + mem_us / eff))
    return {"c0_us": c0, "eff": eff,
            "band_log": [round(float(np.quantile(resid, 0.1)), 4), round(float(np.quantile(resid, 0.9)), 4)],
            "rows": len(rows)}


def score(rows: pd.DataFrame, params: dict, bw_gbs: float) -> list[dict]:
    from kit.predict.gemv import kernel_ms_of

    t, lo, hi = kernel_ms_of(rows.bytes.to_numpy(float), bw_gbs, params)
    y = rows.latency_ms.to_numpy(float)
    ape = np.abs(t - y) / y * 100
    inside = (y >= lo) & (y <= hi)
    out = []
    for a, b, name in BUCKETS_BYTES:
        sel = (rows.bytes >= a) & (rows.bytes < b)
        if sel.any():
            out.append({"bytes": name, "n": int(sel.sum()), "mape": round(float(ape[sel].mean()), 1),
                        "median_ape": round(float(np.median(ape[sel])), 1),
                        "coverage_80": round(float(inside[sel].mean()), 2)})
    out.append({"bytes": "all", "n": len(rows), "mape": round(float(ape.mean()), 1),
                "median_ape": round(float(np.median(ape)), 1), "coverage_80": round(float(inside.mean()), 2)})
    return out


def tile_mape(rows: pd.DataFrame) -> float:
    """The shipped tile-MLP's kernel-time MAPE on rows (in-stream, without the rule)."""
    from kit.predict.evaluate import predict_rows
    from kit.predict.tile_mlp import TilePredictor

    tile = TilePredictor.shipped()
    tile._gemv_rule = False
    try:
        r = predict_rows(rows.drop(columns=["bytes"]), {"tile": tile}, in_stream=True)
    finally:
        tile._gemv_rule = True
    return round(float(r.ape.mean()), 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(DEFAULT_ROOT), help="the measurements folder")
    args = ap.parse_args(argv)
    from kit.hardware import get_gpu

    root = Path(args.root)
    bw = get_gpu(GPU).mem_bw_gbs
    try:
        fitting, checking = gemv_rows(root, FIT), gemv_rows(root, CHECK)
        half = gemv_rows(root, CHECK_16BIT, ("bf16", "fp16"))
    except KitError as e:
        print(f"gemv_fit: error: {e}", file=sys.stderr)
        return 2
    params = fit(fitting, bw)
    out = {"gpu": GPU, "params": params,
           "fit_rows": score(fitting, params, bw), "check_rows": score(checking, params, bw),
           "check_16bit": score(half, params, bw),
           "tile_mlp_mape": {"fit_rows": tile_mape(fitting), "check_rows": tile_mape(checking),
                             "check_16bit": tile_mape(half)}}
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
