"""How well the kit predicts a convolution, costed as the whole-model path costs it (the faster of
its implicit GEMM and, for a 3x3 stride-1 conv, Winograd F(4x4, 3x3)), against NeuSight's
measured conv2d rows.

Each measured row (F.conv2d without bias, fp32, square kernel and input; NeuSight's
train/collect/conv files) is turned into the kit op exactly as a captured model's aten
`convolution` is (kit.workload.mapping.map_op on meta tensors of the row's shapes) and predicted
by the shipped tile predictor and, for comparison, the roofline. Both are isolated-kernel
predictions, as the measurements are (CUDA events around one call; the whole-model path then
takes the per-kernel dispatch floor off in the stream). No predictor was trained on conv rows;
the A100 80GB PCIe is also a GPU outside the tile predictor's training set.

Prints JSON:
  per_gpu        per GPU and predictor: n, MAPE, median and p90 APE (percent), and the median
                 ratio predicted / measured (below 1: the kit predicts faster than measured)
  by_algorithm   the tile predictor's scores per GPU and the algorithm cuDNN ran, read off the
                 measured kernel names: winograd (fewer multiplies than the implicit GEMM's),
                 fft, or implicit (an implicit or explicit GEMM)
  kernel_sizes   the kernel sizes among the rows scored (NeuSight measured 3x3, stride 1, pad 1)
  rows_per_gpu, seed, trained_on

    .venv/bin/python benchmarks/conv_model.py [--per-gpu 0] [--seed 0] [--data DIR]

--per-gpu N scores a seeded sample of N rows per GPU; 0 (the default) every row (about 24,700,
seconds). Needs the NeuSight data (KIT_DATA).
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pandas as pd

PREDICTORS = ("tile", "roofline")


def conv_op(row) -> object:
    """The kit op of one measured conv row, through the capture's own mapping."""
    import torch

    from kit.workload.mapping import map_op

    b, cin, cout = int(row.b), int(row.in_channels), int(row.out_channels)
    ks, size, stride, pad = int(row.kernel_size), int(row.input_size), int(row.stride), int(row.padding)
    out_size = (size + 2 * pad - ks) // stride + 1
    x = torch.empty(b, cin, size, size, device="meta")
    w = torch.empty(cout, cin, ks, ks, device="meta")
    y = torch.empty(b, cout, out_size, out_size, device="meta")
    args = (x, w, None, [stride, stride], [pad, pad], [1, 1], False, [0, 0], 1)
    op, op_class, _ = map_op("convolution", args, {}, y)
    assert op_class == "gemm", op_class
    return op  # an implicit GEMM, or the Cheapest of it and Winograd (kit.workload.mapping_vision)


def sample_rows(rows: pd.DataFrame, per_gpu: int, seed: int) -> pd.DataFrame:
    """At most per_gpu rows of each GPU (0: all), drawn with a seeded generator."""
    if per_gpu <= 0:
        return rows.reset_index(drop=True)
    parts = [g.sample(n=min(per_gpu, len(g)), random_state=seed) for _, g in rows.groupby("gpu")]
    return pd.concat(parts).reset_index(drop=True)


def predict_rows(rows: pd.DataFrame, predictors=PREDICTORS) -> pd.DataFrame:
    """One row per (measured row, predictor): gpu, kernel_size, algorithm, measured_ms,
    predicted_ms, ape."""
    from kit.predict import get_predictor
    from kit.workload.iteration import isolated_latencies

    ops = [conv_op(r) for r in rows.itertuples(index=False)]
    algorithm = rows.kernels.fillna("").map(algorithm_of).to_numpy()
    out = []
    for name in predictors:
        model = get_predictor(name)
        for gpu, idx in rows.groupby("gpu").indices.items():
            pred = isolated_latencies([ops[i] for i in idx], gpu, model)[:, 0]
            meas = rows.latency_ms.to_numpy(float)[idx]
            out.append(pd.DataFrame({"predictor": name, "gpu": gpu,
                                     "kernel_size": rows.kernel_size.to_numpy()[idx].astype(int),
                                     "algorithm": algorithm[idx],
                                     "measured_ms": meas, "predicted_ms": pred,
                                     "ape": 100 * np.abs(pred - meas) / meas}))
    return pd.concat(out, ignore_index=True)


def algorithm_of(kernels: str) -> str:
    """cuDNN's algorithm family from the kernel names a measured conv launched."""
    names = kernels.lower()
    return "winograd" if "winograd" in names else "fft" if "fft" in names else "implicit"


def _stats(grp: pd.DataFrame) -> dict:
    ape = grp.ape.to_numpy(float)
    ratio = grp.predicted_ms.to_numpy(float) / grp.measured_ms.to_numpy(float)
    return {"n": int(len(ape)), "mape": round(float(ape.mean()), 2),
            "median_ape": round(float(np.median(ape)), 2),
            "p90_ape": round(float(np.percentile(ape, 90)), 2),
            "median_ratio": round(float(np.median(ratio)), 3)}


def score(rows: pd.DataFrame, predictors=PREDICTORS) -> dict:
    """The benchmark's result on a table of measured conv rows (kit.data schema)."""
    pred = predict_rows(rows, predictors)
    per_gpu = {gpu: {name: _stats(p) for name, p in g.groupby("predictor")}
               for gpu, g in pred.groupby("gpu")}
    tile = pred[pred.predictor == "tile"] if "tile" in predictors else pred.iloc[:0]
    by_alg = {gpu: {alg: _stats(p) for alg, p in g.groupby("algorithm")}
              for gpu, g in tile.groupby("gpu")}
    sizes = sorted({f"{k}x{k}" for k in rows.kernel_size.astype(int)})
    return {"per_gpu": per_gpu, "by_algorithm": by_alg, "kernel_sizes": sizes}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="NeuSight folder (default KIT_DATA)")
    ap.add_argument("--per-gpu", type=int, default=0, help="rows sampled per GPU (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from kit.data import load_neusight
    from kit.predict.weights import SHIPPED_DIR, read_manifest

    rows = load_neusight("train-collect", data_dir=args.data, ops=["conv"])
    rows = sample_rows(rows[rows.op_class == "conv"], args.per_gpu, args.seed)
    result = score(rows)
    result.update(rows_per_gpu=args.per_gpu, seed=args.seed,
                  trained_on=read_manifest(SHIPPED_DIR).get("train_gpus"))
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
