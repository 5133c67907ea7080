"""Split-K on the GEMM rows: the tile-MLP with and without kit.predict.split_k, as JSON.

For a seeded sample of each training GPU's Linear rows (its own training file) and for every
Linear test row of NeuSight's test set, the MAPE with the split choice off and on, over the rows
the library ran split (grid z > 1; the measured kernel shows it, the predictors never see it)
and over the unsplit ones, with the share of rows the kit chose to split.

    .venv/bin/python benchmarks/split_k.py [--data DIR] [--per-gpu 800] [--seed 0]

Needs the NeuSight data (KIT_DATA). About 10 s on two cores. Not run by the tests.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pandas as pd


def score(frame: pd.DataFrame, tile) -> dict:
    """Per GPU and row set (split, unsplit): n, MAPE without and with split-K, share chosen."""
    from kit.predict.evaluate import visible_columns
    from kit.predict.features import op_from_row

    out = {}
    for gpu, part in frame.groupby("gpu", sort=True):
        ops = [op_from_row(r) for r in visible_columns(part).to_dict("records")]
        y = part.latency_ms.to_numpy(float)
        split = part.grid_z.fillna(1).to_numpy(float) > 1
        pred = {on: tile.predict(ops, gpu, split_k=on) for on in (False, True)}
        chosen = pred[True].split_k.to_numpy() > 1
        out[gpu] = {}
        for name, mask in (("split", split), ("unsplit", ~split)):
            if not mask.any():
                continue
            ape = {on: np.abs(pred[on].latency_ms.to_numpy(float)[mask] - y[mask]) / y[mask] * 100
                   for on in (False, True)}
            out[gpu][name] = {"n": int(mask.sum()), "mape_off": round(float(ape[False].mean()), 2),
                              "mape_on": round(float(ape[True].mean()), 2),
                              "chosen_split": round(float(chosen[mask].mean()), 3)}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="NeuSight folder (default KIT_DATA)")
    ap.add_argument("--per-gpu", type=int, default=800, help="training rows sampled per GPU")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from kit.data import resolve_data_dir
    from kit.predict.evaluate import load_test
    from kit.predict.training import DEFAULT_TRAIN_GPUS, training_frame
    from kit.predict.weights import shipped_tile

    root = resolve_data_dir(args.data)
    train = training_frame(root, DEFAULT_TRAIN_GPUS,  # every measured split row, the P4's too
                           suspect_rows=True).query("op == 'linear'")
    sample = train.groupby("gpu").sample(min(args.per_gpu, train.gpu.value_counts().min()),
                                         random_state=args.seed)
    test = load_test(root / "data" / "dataset" / "test").query("op == 'linear'")
    tile = shipped_tile()
    result = {"per_gpu_training_rows": args.per_gpu, "seed": args.seed,
              "training_rows": score(sample, tile), "test_rows": score(test, tile)}
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
