"""How far NeuSight's test split is from its train split on the same GPU, at the same amount of work.

    .venv/bin/python benchmarks/split_offset.py [--data DIR]

For every training GPU and op (bmm, linear, softmax, ln and the elementwise ops) the rows of both
splits are put in bins of work (log2 of the FLOPs for GEMMs, of the bytes moved for the others,
kit.ops), and each bin's median achieved rate (TFLOP/s or GB/s) is compared: test / train. Only
bins with at least MIN_ROWS rows in both splits count. A ratio near 1 means both splits ran alike
at equal work; the tile predictor is fitted on the train split and scored on the test split, so a
ratio well above 1 is a gap it must explain from the shapes alone (the test shapes are aligned
powers of two and mostly larger than any training row; the train shapes are random). Where its
shape features cannot (A100-40GB bmm: yes, within 2-8%; V100 and T4 bmm: no, 12-34% slow), that
gap is its error even on a GPU it was trained on.

Output JSON: per (gpu, op) the shared bins with their rates and ratio, the geometric mean ratio over
them, and each split's median fraction of the GPU's peak (fp32 compute for GEMMs, DRAM bandwidth
for the others).
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd

MIN_ROWS = 3
TRAIN_GPUS = ["p4", "p100-pcie-16gb", "t4", "v100-pcie-32gb", "a100-pcie-40gb"]
OPS = ["bmm", "linear", "softmax", "ln", "add", "mul", "div", "relu", "tanh", "gelu"]


def rates(frame: pd.DataFrame) -> pd.DataFrame:
    """Per row: the op, GPU, work (FLOPs or bytes), achieved rate and fraction of peak."""
    from kit.hardware import get_gpu
    from kit.predict.features import op_from_row

    out = []
    for gpu_key, part in frame.groupby("gpu"):
        gpu = get_gpu(gpu_key)
        for r in part.to_dict("records"):
            op = op_from_row(r)
            s = r["latency_ms"] / 1e3
            if r["op_class"] == "gemm":
                work, rate = op.flops, op.flops / s / 1e12
                frac = rate / gpu.gemm_peak_tflops("fp32")
            else:
                work, rate = op.bytes, op.bytes / s / 1e9
                frac = rate / gpu.mem_bw_gbs
            out.append({"gpu": gpu_key, "op": r["op"], "work": work, "rate": rate, "peak_fraction": frac})
    return pd.DataFrame(out)


def compare(train: pd.DataFrame, test: pd.DataFrame) -> list[dict]:
    rows = []
    for (gpu, op), te in test.groupby(["gpu", "op"]):
        tr = train[(train.gpu == gpu) & (train.op == op)]
        if tr.empty:
            continue
        tb, eb = np.floor(np.log2(tr.work)), np.floor(np.log2(te.work))
        bins = []
        for b in sorted(set(tb) & set(eb)):
            a, e = tr[tb == b], te[eb == b]
            if len(a) >= MIN_ROWS and len(e) >= MIN_ROWS:
                bins.append({"log2_work": int(b), "train_rows": len(a), "test_rows": len(e),
                             "train_rate": round(float(a.rate.median()), 3),
                             "test_rate": round(float(e.rate.median()), 3),
                             "ratio": round(float(e.rate.median() / a.rate.median()), 3)})
        rows.append({
            "gpu": gpu, "op": op, "unit": "TFLOP/s" if op in ("bmm", "linear") else "GB/s",
            "shared_bins": len(bins),
            "geo_mean_ratio": (round(float(np.exp(np.mean([np.log(b["ratio"]) for b in bins]))), 3)
                               if bins else None),
            "train_peak_fraction_median": round(float(tr.peak_fraction.median()), 3),
            "test_peak_fraction_median": round(float(te.peak_fraction.median()), 3),
            "test_rows_beyond_train_work": round(float((te.work > tr.work.max()).mean()), 3),
            "bins": bins})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="NeuSight data folder (default: KIT_DATA)")
    a = ap.parse_args()
    from kit.data import load_neusight
    from kit.predict.training import training_frame

    # the train split alone, every measured row (SUSPECT_ROWS too: the two files are compared)
    train = training_frame(a.data, TRAIN_GPUS, test_rows=False, suspect_rows=True)
    test = load_neusight("test", a.data)
    test = test[test.gpu.isin(TRAIN_GPUS) & test.op.isin(OPS) & (test.latency_ms > 0)]
    train = train[train.op.isin(OPS)]
    result = compare(rates(train), rates(test))
    print(json.dumps({"benchmark": "split_offset", "min_rows_per_bin": MIN_ROWS,
                      "train_gpus": TRAIN_GPUS, "pairs": result}, indent=1))


if __name__ == "__main__":
    main()
