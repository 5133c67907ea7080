"""PyTorch's two-kernel layer norm: when it runs, and what its kernel time is, from the H200's
layer-norm sweep rows (kit.predict.norm_paths ships the constants this prints).

    python benchmarks/layernorm_paths.py [--dir FOLDER ...] > layernorm_paths.json

It reads every layer-norm row of the vector sweeps (`*/vector_*.csv.gz`, `*/rows_*.csv.gz`) under
the folders (default: the project's H200 measurements), then:
* path: per width class (cols % 4 == 0 or not), how many rows ran PyTorch's vectorised kernel
  and how many the two kernels (RowwiseMomentsCUDAKernel, LayerNormForwardCUDAKernel);
* fit: the two-kernel rows' kernel time as FIXED + ceil(rows / SMs) x (ROW + cols x ELEM) clocks,
  least squares on the relative error, bf16 and fp32 together; and fitted on one dtype, scored
  on the other (held_out), the check that the time is set by instructions, not bytes;
* scores: the tile predictor's in-stream time against these rows' kernel time, MAPE by path.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from element_rates import CLOCK_HZ, DEFAULT_DIRS, SMS, all_sweep_rows  # noqa: E402
from kit.errors import KitError  # noqa: E402

TWO_KERNELS = "RowwiseMomentsCUDAKernel"


def layernorm_rows(folders) -> pd.DataFrame:
    """The sweeps' layer-norm rows with a kernel time, with their path and width class."""
    d = all_sweep_rows(folders)
    d = d[(d.op == "ln") & d.kernel_ms.notna() & (d.kernel_ms > 0)].copy()
    names = d.kernels.fillna("") if "kernels" in d.columns else d.kernel_name.fillna("")
    d["two_kernels"] = names.str.contains(TWO_KERNELS)
    d["unaligned"] = d.cols.astype(int) % 4 != 0
    return d.reset_index(drop=True)


def design(d: pd.DataFrame) -> np.ndarray:
    per_sm = np.ceil(d.rows.to_numpy(float) / SMS)
    return np.column_stack([np.ones(len(d)), per_sm, per_sm * d.cols.to_numpy(float)])


def fit(d: pd.DataFrame) -> dict:
    """(FIXED, ROW, ELEM) clocks, least squares on the relative error."""
    y = d.kernel_ms.to_numpy(float) * 1e-3 * CLOCK_HZ
    x = design(d)
    coef, *_ = np.linalg.lstsq(x / y[:, None], np.ones(len(y)), rcond=None)
    return {"fixed_clocks": float(coef[0]), "row_clocks": float(coef[1]), "elem_clocks": float(coef[2])}


def scores(d: pd.DataFrame, c: dict) -> dict:
    pred = design(d) @ np.array([c["fixed_clocks"], c["row_clocks"], c["elem_clocks"]]) / CLOCK_HZ * 1e3
    ape = np.abs(pred / d.kernel_ms.to_numpy(float) - 1) * 100
    return {"n": int(len(d)), "mape": round(float(ape.mean()), 2), "median_ape": round(float(np.median(ape)), 2),
            "p90_ape": round(float(np.quantile(ape, 0.9)), 2)}


def tile_scores(d: pd.DataFrame) -> dict:
    """The shipped tile predictor's in-stream time against the kernel time, by path."""
    from kit.hardware import get_gpu
    from kit.ops import LayerNorm
    from kit.predict import get_predictor
    from kit.workload.kernel_times import in_stream_ms, isolation_floor_ms

    tile, gpu = get_predictor("tile"), get_gpu("h200")
    ops = [LayerNorm(int(r), int(c), dtype=t) for r, c, t in zip(d.rows, d.cols, d.dtype)]
    p = tile.predict(ops, gpu)
    stream = in_stream_ms(p.latency_ms.to_numpy(float), p.roofline_ms.to_numpy(float), isolation_floor_ms(tile, gpu))
    ape = np.abs(stream / d.kernel_ms.to_numpy(float) - 1) * 100
    out = {}
    for two, part in pd.Series(ape).groupby(d.two_kernels.to_numpy()):
        out["two_kernels" if two else "vectorised"] = {"n": int(len(part)), "mape": round(float(part.mean()), 2),
                                                       "median_ape": round(float(part.median()), 2)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", action="append", type=Path, help="measurement folder (repeatable)")
    args = ap.parse_args(argv)
    folders = args.dir or list(DEFAULT_DIRS)
    try:
        for folder in folders:
            if not folder.is_dir():
                raise KitError(f"measurement folder not found: {folder}")
        d = layernorm_rows(folders)
        two = d[d.two_kernels]
        if len(two) < 3 or two.dtype.nunique() < 2:
            raise KitError(f"too few two-kernel layer-norm rows to fit ({len(two)}, dtypes "
                           f"{sorted(two.dtype.unique())}): need 3 or more, in bf16 and fp32")
    except KitError as e:
        print(f"layernorm_paths: {e}", file=sys.stderr)
        return 2
    held = {}
    for train, test in (("bf16", "fp32"), ("fp32", "bf16")):
        held[f"fit_{train}_score_{test}"] = scores(two[two.dtype == test], fit(two[two.dtype == train]))
    c = fit(two)
    out = {"source": [str(f) for f in folders],
           "path": {("unaligned" if u else "aligned"): {"rows": int(len(p)), "two_kernels": int(p.two_kernels.sum())}
                    for u, p in d.groupby("unaligned")},
           "fit": {k: round(v, 3) for k, v in c.items()}, "fit_scores": scores(two, c),
           "held_out": held, "tile_in_stream": tile_scores(d)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
