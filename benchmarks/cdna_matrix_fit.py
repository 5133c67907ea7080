"""Fit, and check, the kernel-time curve the kit carries to AMD's 16-bit matrix-core GEMMs
(kit.predict.tensor_core.CDNA_GEMM) from NeuSight's AMD GEMM measurements.

    KIT_DATA=... python benchmarks/cdna_matrix_fit.py > fit.json

Why: no AMD 16-bit (or FP8) GEMM has been timed anywhere the kit can read, and the tile-MLP, which
learned its utilisation from NVIDIA's FP32 SIMT kernels, put an MI300X's bf16 GEMMs at 1-6% of their
roofline below 2,048 rows and made them faster with more rows (a 512 x 768 x 768 bf16 Linear 80 us,
4096 x 768 x 768 64 us; bert-base bf16 inference 6.2 ms at batch 1 against 5.9 ms at batch 2).
NeuSight's AMD rows are the only AMD matrix-core kernels measured: rocBLAS's FP32 GEMMs on the
MI100 (CDNA) and MI210 (CDNA 2) run on the MFMA units (every kernel name holds MI32x32x2 or
MI16x16x4), the kit's FP32 GEMM peak there (GPU.fp32_matrix_tflops). Their time follows the same
form as the H200's tensor-core GEMMs (kit.predict.tensor_core):

    kernel_ms = max(a * roofline_ms ** beta, roofline_ms / eff_max) + c0_us / 1e3

The kit carries it to 16-bit and FP8 GEMMs on CDNA GPUs as a share of their own peak for the dtype,
its band widened (kit.predict.tensor_core.CARRIED_SIGMA_LOG), as it carries the H200's curve to
NVIDIA's other tensor-core GPUs.

Rows: NeuSight's AMD Linear test collections (data/dataset_amd/test/collect/linear, PyTorch 2.4.1 on
ROCm), both GPUs. A row's kernel time is its latency less the tile predictor's dispatch floor on
that GPU (kit.workload.kernel_times.isolation_floor_ms, which the kit adds back to a curve's time)
and less the copy every one of these rows also ran: each row's kernel list holds PyTorch's
direct_copy_kernel before the GEMM (addmm on ROCm copies the bias into the output, which rocBLAS
then accumulates onto), priced as the tile predictor's own copy of m x n FP32 elements in the
stream. Least squares on log time, from several starts (the curve's max() leaves local minima);
the band is the 10th and 90th percentile of the log residuals (kit.predict.tensor_core.SHORT_MS
splits them as for the H200's curves).

c0 is not fitted. These rows are 10 us of roofline and more, and they do not tell c0 apart: with c0
free the fit takes 27 us, and a c0 of 0 or 27 us moves the cross-generation scores by 1.7 points at
most from those with the c0 taken here (1.6 before the power share moved the dispatch floor) (the JSON's "c0_sensitivity"). Free, it would charge every small AMD GEMM 27 us, most of
which is likely the Linear rows' own (the bmm rows, which ran no copy, fit c0 of 0-3 us), and it had
made an MI300X slower than an H100 on memory-bound thin GEMMs. So c0 is the one small-GEMM fixed
cost of a matrix-core GEMM kernel that was measured, the H200 bf16 curve's
(kit.predict.tensor_core.TENSOR_CORE_GEMM), and a, beta and eff_max are fitted around it.

Checks (the JSON's "cross_generation"): fitted on one GPU's Linear rows, scored on the other's
Linear and bmm rows (bmm rows ran no copy), beside the shipped tile-MLP's scores on the same rows.
The scores are FP32: whether the share of the peak carries from FP32 to 16-bit MFMA kernels is not
measured, which is why the band widens. tests/test_cdna_curve.py refits and compares.
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
COLLECT = Path("data") / "dataset_amd" / "test" / "collect"
STARTS = [(a, beta, eff) for a in (0.8, 1.2, 2.0) for beta in (0.7, 0.85, 1.0) for eff in (0.5, 0.65, 0.8)]


def rows(data_dir, kind: str) -> dict:
    """Per GPU of GPUS: (ops, roofline ms, latency ms, kernel ms) of NeuSight's AMD `kind` test
    rows ("linear" or "bmm"); kernel ms as the module doc says."""
    from kit.data import resolve_data_dir
    from kit.hardware import get_gpu
    from kit.ops import Elementwise
    from kit.predict import get_predictor
    from kit.predict.evaluate import load_test, op_from_row, visible_columns
    from kit.predict.roofline import roofline
    from kit.workload.kernel_times import in_stream_ms, isolation_floor_ms

    folder = resolve_data_dir(data_dir) / COLLECT / kind
    sub = sorted(folder.glob("p*")) if folder.is_dir() else []
    if not sub:
        raise KitError(f"NeuSight's AMD {kind} test rows not found under {folder}")
    frame = load_test(sub[0])
    seen = visible_columns(frame)
    tile = get_predictor("tile")
    out = {}
    for key in GPUS:
        idx = frame.index[frame.gpu == key]
        if not len(idx):
            raise KitError(f"no {key} rows in {sub[0]}")
        gpu = get_gpu(key)
        ops = [op_from_row(r) for r in seen.loc[idx].to_dict("records")]
        roof = np.array([roofline(op, gpu).time_ms for op in ops])
        latency = frame.loc[idx, "latency_ms"].to_numpy(float)
        floor = isolation_floor_ms(tile, gpu)
        copy = np.zeros(len(ops))
        if kind == "linear":
            pred = tile.predict([Elementwise("copy", op.m * op.n, "fp32", inputs=1) for op in ops], gpu)
            copy = in_stream_ms(pred.latency_ms.to_numpy(float), pred.roofline_ms.to_numpy(float), floor)
        out[key] = {"ops": ops, "roofline_ms": roof, "latency_ms": latency,
                    "kernel_ms": latency - floor - copy, "added_ms": floor + copy}
    return out


def h200_c0_us() -> float:
    """The H200 bf16 curve's c0 (module doc: the c0 this fit takes)."""
    from kit.predict.tensor_core import TENSOR_CORE_GEMM

    return float(TENSOR_CORE_GEMM["hopper"]["bf16"]["c0_us"])


def fit(roof: np.ndarray, kernel_ms: np.ndarray, c0_us: float | None = None) -> dict:
    """a, beta, eff_max (least squares on log time, best of STARTS) around c0_us (default: the
    H200's, h200_c0_us; NaN: fitted too), and the band."""
    from scipy.optimize import least_squares

    from kit.predict.tensor_core import SHORT_MS

    c0_us = h200_c0_us() if c0_us is None else c0_us
    free = bool(np.isnan(c0_us))
    keep = kernel_ms > 0
    roof, kernel_ms = roof[keep], kernel_ms[keep]

    def model(p):
        return np.maximum(p[0] * roof ** p[1], roof / p[2]) + (p[3] if free else c0_us) / 1e3

    best = None
    for a, beta, eff in STARTS:
        start, lo, hi = [a, beta, eff], [0.3, 0.5, 0.2], [5.0, 1.2, 1.0]
        if free:
            start, lo, hi = start + [3.0], lo + [0.0], hi + [100.0]
        res = least_squares(lambda p: np.log(model(p)) - np.log(kernel_ms), start, bounds=(lo, hi))
        if best is None or res.cost < best.cost - 1e-12:
            best = res
    pred = model(best.x)
    resid = np.log(kernel_ms / pred)
    short = pred < SHORT_MS

    def band(r):
        return [round(float(q), 4) for q in np.quantile(r, [0.1, 0.9])] if len(r) else None

    out = {"a": round(float(best.x[0]), 4), "beta": round(float(best.x[1]), 4),
           "c0_us": round(float(best.x[3] if free else c0_us), 3), "eff_max": round(float(best.x[2]), 4),
           "band_log": band(resid[~short])}
    out["band_log_short"] = band(resid[short]) or out["band_log"]
    return out | {"rows": int(len(roof))}


def score(pred: np.ndarray, measured: np.ndarray) -> dict:
    ape = np.abs(pred - measured) / measured * 100
    return {"n": int(len(ape)), "mape": round(float(ape.mean()), 2), "median_ape": round(float(np.median(ape)), 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="NeuSight's data folder (default: KIT_DATA)")
    args = ap.parse_args(argv)
    try:
        from kit.predict import get_predictor
        from kit.predict.tensor_core import kernel_ms_of

        linear, bmm = rows(args.data, "linear"), rows(args.data, "bmm")
        both = fit(np.concatenate([linear[g]["roofline_ms"] for g in GPUS]),
                   np.concatenate([linear[g]["kernel_ms"] for g in GPUS]))
        tile = get_predictor("tile")

        def cross(c0_us=None, with_tile=False):
            out = []
            for fitted, other in (GPUS, GPUS[::-1]):
                params = fit(linear[fitted]["roofline_ms"], linear[fitted]["kernel_ms"], c0_us)
                for kind, table in (("linear", linear), ("bmm", bmm)):
                    r = table[other]
                    curve = kernel_ms_of(r["roofline_ms"], params)[0] + r["added_ms"]
                    row = {"fitted_on": fitted, "scored_on": other, "op": kind,
                           "curve": score(curve, r["latency_ms"]),
                           "fit": {k: params[k] for k in ("a", "beta", "c0_us", "eff_max")}}
                    if with_tile:
                        row["tile_mlp"] = score(tile.predict(r["ops"], other).latency_ms.to_numpy(float),
                                                r["latency_ms"])
                    out.append(row)
            return out

        sensitivity = [{"c0_us": label, "cross_generation_mape": [c["curve"]["mape"] for c in cross(c0)]}
                       for label, c0 in (("0", 0.0), ("fitted", float("nan")))]
        print(json.dumps({"source": str(COLLECT / "linear"), "gpus": list(GPUS), "fit": both,
                          "cross_generation": cross(with_tile=True), "c0_sensitivity": sensitivity},
                         indent=1))
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
