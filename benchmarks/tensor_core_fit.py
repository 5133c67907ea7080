"""Fit, and check, the kit's kernel-time rule for aligned tensor-core GEMMs on Hopper
(kit.predict.tensor_core) from the project's own H200 sweeps.

    python benchmarks/tensor_core_fit.py [--dir measurements/h200-2026-12-04-b] > fit.json

Why a rule and not the tile-MLP: the tile-MLP learned utilisation from FP32 SIMT kernels
(NeuSight's data has no other). On the H200's aligned bf16 GEMMs (cuBLAS's nvjet kernels: TMA,
wgmma, a persistent tile scheduler) its utilisation does not carry over: it is 2x slow where it
predicts a low utilisation and 20% fast where it predicts a high one, 46% MAPE over the kernels
above 20 us, while the measured share of the roofline sits between 0.55 and 0.82 whatever the
shape. A persistent scheduler leaves little wave quantisation to model (a wave model with a fixed
128x128 or 128x256 tile scored 18-24% on the same rows). So the rule is a curve in the roofline
time alone:

    kernel_ms = max(a * roofline_ms ** beta, roofline_ms / eff_max) + c0_us / 1e3

beta < 1: a bigger GEMM reaches a bigger share of the peak, up to eff_max (the curve alone
would pass the peak past a few ms). a, beta, c0 and eff_max are fitted by least squares on log
kernel time over the fitting rows; the p10-p90 band is the 10th and 90th
percentile of the fitting rows' log residuals, taken apart for the rows the curve puts under
20 us (band_log_short: launch and tail effects spread them wider) and the rest (band_log).

Rows (measurements/h200-2026-12-04-b; kernel_ms, the summed time of the call's kernels):
* bf16 (also used for fp16): fitted on session/aligned_linear_bf16 and aligned_bmm_bf16 (seeds
  31 and 32) and layouts/gemm_layouts_bf16 (seed 51: a Linear layer's forward, input-gradient
  and weight-gradient GEMMs, benchmarks/gemm_layouts.py); checked on the same three kinds of
  sweep drawn with other seeds (extra/aligned_*_bf16_b, seeds 41 and 42; layouts/
  gemm_layouts_bf16_b, seed 52) and on session/aligned_linear_fp16;
* tf32: fitted on the even shapes of session/aligned_linear_tf32 and layouts/gemm_layouts_tf32
  (a layout shape's three GEMMs stay together), checked on the odd ones.
The output (JSON): per dtype the fitted constants and, per check set and kernel-time bucket, n,
MAPE, median APE and the band's coverage. tests/test_tensor_core.py refits from these files and
checks the constants in kit.predict.tensor_core are what this script gives.
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
from kit.ops import DTYPE_BYTES  # noqa: E402

DEFAULT_DIR = ROOT / "measurements" / "h200-2026-12-04-b"
GPU = "h200"
BUCKETS_MS = ((0.0, 0.02, "<20us"), (0.02, 0.1, "20-100us"), (0.1, 1.0, "0.1-1ms"), (1.0, math.inf, ">=1ms"))
SETS = {  # dtype: (fitting files, [(check name, files, rows)]); rows: every row, or the even/odd half
    "bf16": (["session/aligned_linear_bf16.csv.gz", "session/aligned_bmm_bf16.csv.gz",
              "layouts/gemm_layouts_bf16.jsonl.gz"],
             [("other_shapes_bf16", ["extra/aligned_linear_bf16_b.csv.gz", "extra/aligned_bmm_bf16_b.csv.gz",
                                     "layouts/gemm_layouts_bf16_b.jsonl.gz"], None),
              ("fp16", ["session/aligned_linear_fp16.csv.gz"], None)]),
    "tf32": (["session/aligned_linear_tf32.csv.gz", "layouts/gemm_layouts_tf32.jsonl.gz"],
             [("odd_shapes_tf32", ["session/aligned_linear_tf32.csv.gz", "layouts/gemm_layouts_tf32.jsonl.gz"], "odd")]),
}


ATTENTION_FILE = "session/attention_bf16.jsonl"
SHORT_MS = 0.02  # kit.predict.tensor_core.SHORT_MS: the curve's two bands part here


def load(folder: Path, files: list[str], rows: str | None = None) -> pd.DataFrame:
    """The 16-byte-aligned rows of `files` with a kernel time, in file order; rows "even"/"odd":
    the even or odd shapes only (None: all)."""
    from kit.data.records import load_measurements

    frames = []
    for name in files:
        path = folder / name
        if not path.exists():
            raise KitError(f"measurement file not found: {path}")
        if name.endswith((".jsonl", ".jsonl.gz")):  # benchmarks/gemm_layouts.py rows: kit's m, n, k
            f = pd.read_json(path, lines=True)
            f = f[f.get("error", pd.Series(index=f.index, dtype=object)).isna()].assign(b=1, op="mm")
            # every layout's leading dimensions are d_in and d_out (the weight gradient reduces
            # over the tokens, which lead nothing); the halves split shapes, not rows, so a
            # shape's three layouts stay together
            lead = np.gcd(f.d_in.to_numpy(int), f.d_out.to_numpy(int))
            shape = f.groupby(["tokens", "d_in", "d_out"], sort=False).ngroup().to_numpy()
        else:
            f = load_measurements(path)
            lead = np.gcd(f.n.to_numpy(int), f.k.to_numpy(int))
            shape = np.arange(len(f))
        keep = (lead * f.dtype.map(DTYPE_BYTES).to_numpy()) % 16 == 0
        if rows is not None:
            keep &= shape % 2 == (0 if rows == "even" else 1)
        frames.append(f.loc[keep, ["op", "dtype", "b", "m", "n", "k", "kernel_ms"]])
    d = pd.concat(frames, ignore_index=True)
    return d[d.kernel_ms.notna() & (d.kernel_ms > 0)].reset_index(drop=True)


def roofline_ms(d: pd.DataFrame) -> np.ndarray:
    """The kit's roofline time of each GEMM row on the H200 (kit.predict.features.work)."""
    from kit.hardware import get_gpu
    from kit.predict.features import arrays_from_frame, work

    gpu = get_gpu(GPU)
    out = np.empty(len(d))
    for dtype, part in d.groupby("dtype"):
        flops, nbytes = work("gemm", arrays_from_frame("gemm", part), dtype)
        out[part.index] = np.maximum(flops / gpu.gemm_peak_flops_per_s(dtype), nbytes / gpu.mem_bw_bytes_per_s) * 1e3
    return out


def fit(roof: np.ndarray, kernel_ms: np.ndarray, causal=None, small_head=None) -> dict:
    """a, beta, c0_us, eff_max (least squares on log time) and the band (see the module doc).
    For attention, also the factors a causal mask and a head size under 128 put on the time
    (kit.predict.tensor_core.kernel_ms_of)."""
    from scipy.optimize import least_squares

    from kit.predict.tensor_core import kernel_ms_of

    extra = causal is not None

    def params(p):
        out = {"a": p[0], "beta": p[1], "c0_us": p[2], "eff_max": p[3], "band_log": [0.0, 0.0]}
        if extra:
            out.update(causal_factor=p[4], small_head_factor=p[5])
        return out

    def model(p):
        return kernel_ms_of(roof, params(p), causal, small_head)[0]

    p0, lo, hi = [1.2, 0.95, 3.0, 0.8], [0.5, 0.6, 0.0, 0.3], [5.0, 1.2, 50.0, 1.0]
    if extra:
        p0, lo, hi = p0 + [1.0, 1.0], lo + [0.5, 0.5], hi + [3.0, 3.0]
    res = least_squares(lambda p: np.log(model(p)) - np.log(kernel_ms), p0, bounds=(lo, hi))
    pred = model(res.x)
    resid = np.log(kernel_ms / pred)
    short = pred < SHORT_MS

    def band(r):
        return [round(float(q), 4) for q in np.quantile(r, [0.1, 0.9])]

    out = {k: round(float(v), 3 if k == "c0_us" else 4) for k, v in params(res.x).items() if k != "band_log"}
    return out | {"band_log": band(resid[~short]), "band_log_short": band(resid[short]), "rows": int(len(roof))}


def attention_rows(folder: Path, rows: str) -> tuple[pd.DataFrame, np.ndarray]:
    """The even or odd half of the attention sweep's rows (benchmarks/attention_sweep.py) with
    both kernel times, and each forward's roofline time on the H200 (kit.predict.roofline)."""
    from kit.ops import Attention
    from kit.predict.roofline import roofline

    path = folder / ATTENTION_FILE
    if not path.exists():
        raise KitError(f"measurement file not found: {path}")
    d = pd.read_json(path, lines=True)
    d = d.iloc[(0 if rows == "even" else 1)::2]
    d = d[d.fwd_kernel_ms.notna() & d.train_kernel_ms.notna()].reset_index(drop=True)
    roof = np.array([roofline(Attention(b=int(r.batch), heads=int(r.heads), seq_q=int(r.seq),
                                        seq_kv=int(r.seq), head_dim=int(r.head_dim), dtype=r.dtype,
                                        causal=bool(r.causal)), GPU).time_ms for r in d.itertuples()])
    return d, roof


def score(pred: np.ndarray, p10: np.ndarray, p90: np.ndarray, kernel_ms: np.ndarray) -> list[dict]:
    ape = np.abs(pred - kernel_ms) / kernel_ms * 100
    inside = (p10 <= kernel_ms) & (kernel_ms <= p90)
    out = []
    for lo, hi, label in (*BUCKETS_MS, (0.02, math.inf, ">=20us")):
        m = (kernel_ms >= lo) & (kernel_ms < hi)
        if m.any():
            out.append({"kernel_time": label, "n": int(m.sum()), "mape": round(float(ape[m].mean()), 2),
                        "median_ape": round(float(np.median(ape[m])), 2),
                        "band_coverage": round(float(inside[m].mean()), 3)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help="the measurement folder")
    args = ap.parse_args(argv)
    folder = Path(args.dir)
    try:
        if not folder.is_dir():
            raise KitError(f"measurement folder not found: {folder}")
        from kit.predict.tensor_core import kernel_ms_of

        out = {"source": str(folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder), "gpu": GPU,
               "fits": {}}
        for dtype, (files, checks) in SETS.items():
            d = load(folder, files, "even" if dtype == "tf32" else None)
            params = fit(roofline_ms(d), d.kernel_ms.to_numpy(float))
            entry = {"fit": params, "checks": {}}
            for name, cfiles, rows in checks:
                c = load(folder, cfiles, rows)
                pred, p10, p90 = kernel_ms_of(roofline_ms(c), params)
                entry["checks"][name] = score(pred, p10, p90, c.kernel_ms.to_numpy(float))
            out["fits"][dtype] = entry
        # fused attention, bf16: the forward's curve from the even rows, checked on the odd ones,
        # forward and backward (the kit's backward: kit.workload.mapping.ATTENTION_BWD_SCALE x
        # the forward's prediction)
        from kit.workload.mapping import ATTENTION_BWD_SCALE

        d, roof = attention_rows(folder, "even")
        params = fit(roof, d.fwd_kernel_ms.to_numpy(float), d.causal.to_numpy(bool), d.head_dim.to_numpy() < 128)
        c, croof = attention_rows(folder, "odd")
        pred, p10, p90 = kernel_ms_of(croof, params, c.causal.to_numpy(bool), c.head_dim.to_numpy() < 128)
        bwd = (c.train_kernel_ms - c.fwd_kernel_ms).to_numpy(float)
        every = pd.concat([d, c])
        out["fits"]["attention_bf16"] = {
            "fit": params,
            "measured_bwd_over_fwd_median": round(float(np.median(
                (every.train_kernel_ms - every.fwd_kernel_ms) / every.fwd_kernel_ms)), 3),
            "checks": {"odd_rows_fwd": score(pred, p10, p90, c.fwd_kernel_ms.to_numpy(float)),
                       "odd_rows_bwd": score(ATTENTION_BWD_SCALE * pred, ATTENTION_BWD_SCALE * p10,
                                             ATTENTION_BWD_SCALE * p90, bwd)}}
    except KitError as e:
        print(f"tensor_core_fit: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
