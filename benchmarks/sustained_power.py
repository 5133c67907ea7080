"""Where kit.predict.features.SUSTAINED_TFLOPS_PER_W comes from: FP32 TFLOP/s per watt of TDP.

    .venv/bin/python benchmarks/sustained_power.py [--data DIR]

For each training GPU, the 90th percentile of the TFLOP/s its NeuSight train-collect GEMMs of 10
GFLOP or more reached (Linear and bmm rows; large enough to fill the GPU), over its TDP. The most
any training GPU sustains per watt is the frontier: a card whose peak asks more than TDP x that
frontier lowers its clock under a long GEMM, and `power_share` is the share of its peak left.
Only the five training GPUs' training rows enter the fit. Then, as a check and not a fit, every
GPU's GEMMs of 10 GFLOP or more in NeuSight's test files, by the same statistic, beside the share
the constant gives it (the share the tile-MLP sees, of the vector peak as in its features): the
held-out A100-PCIe-80GB and L4, and the training GPUs as a control (their test files were timed
in other sessions than their training rows: the A100-PCIe-40GB reaches 0.068 per watt there).
The L4 (TSMC 4N, a 5 nm-class process) sustains about twice the frontier per watt, so its share,
0.15, understates the 0.25-0.33 of its peak it reaches: the frontier is the training GPUs' (16 to
7 nm), and no training GPU is newer.

Output: JSON {"frontier_tflops_per_w", "shipped", "matches_shipped", "by_gpu": [...],
"test_file_check": [...]}.
"""
from __future__ import annotations

import argparse
import json
import sys

MIN_GFLOP = 10.0
QUANTILE = 0.9


def gemm_rates(frame):
    """TFLOP/s of each GEMM row of MIN_GFLOP or more, with its GPU."""
    g = frame[frame.op_class == "gemm"].copy()
    g["gflop"] = 2 * g.b.fillna(1) * g.m * g.n * g.k / 1e9
    g = g[g.gflop >= MIN_GFLOP]
    g["tflops"] = g.gflop / g.latency_ms
    return g


def per_gpu(rates, quantile=QUANTILE) -> list[dict]:
    from kit.hardware import get_gpu
    from kit.predict.features import power_share

    out = []
    for gpu, part in rates.groupby("gpu"):
        g = get_gpu(gpu)
        peak = g.gemm_peak_tflops("fp32")
        sustained = float(part.tflops.quantile(quantile))
        out.append({"gpu": gpu, "rows": int(len(part)), "tdp_w": g.tdp_w, "peak_tflops": peak,
                    "sustained_tflops": round(sustained, 2),
                    "share_of_peak": round(sustained / peak, 3),
                    "tflops_per_w": round(sustained / g.tdp_w, 4),
                    "power_share": round(power_share(g), 3)})
    return out


def frontier_of(frame, gpus=None) -> float:
    """The frontier (the most TFLOP/s per watt of any GPU's large GEMMs) over the training rows
    of `gpus` (default: every GPU in frame), rounded as the shipped constant is: what
    SUSTAINED_TFLOPS_PER_W would be had only those GPUs been trained on. Test rows (split
    "test") never enter it."""
    rows = frame[frame.split != "test"] if "split" in frame else frame
    if gpus is not None:
        rows = rows[rows.gpu.isin(list(gpus))]
    return round(max(r["tflops_per_w"] for r in per_gpu(gemm_rates(rows))), 3)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="NeuSight folder (default KIT_DATA)")
    args = ap.parse_args(argv)
    from kit.data import resolve_data_dir
    from kit.predict.evaluate import load_neusight_test
    from kit.predict.features import SUSTAINED_TFLOPS_PER_W
    from kit.predict.training import DEFAULT_TRAIN_GPUS, training_frame

    root = resolve_data_dir(args.data)
    train = training_frame(root, DEFAULT_TRAIN_GPUS)
    rows = per_gpu(gemm_rates(train[train.split != "test"]))
    frontier = frontier_of(train)
    test = load_neusight_test(root)
    result = {"min_gflop": MIN_GFLOP, "quantile": QUANTILE,
              "frontier_tflops_per_w": round(frontier, 3),
              "frontier_gpu": max(rows, key=lambda r: r["tflops_per_w"])["gpu"],
              "shipped": SUSTAINED_TFLOPS_PER_W,
              "matches_shipped": round(frontier, 3) == SUSTAINED_TFLOPS_PER_W,
              "by_gpu": rows,
              "test_file_check": [{**r, "trained_on": r["gpu"] in DEFAULT_TRAIN_GPUS}
                                  for r in per_gpu(gemm_rates(test))]}
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
