"""Which training rows does the GEMM model's transfer lean on? Refit it without some of them.

NeuSight's Tesla P4 training rows slow down as GEMMs run longer: Linear rows with every dim at
least 512 reach 52% of the P4's FP32 peak under 1 ms and 16% over 100 ms, while the P4's own test
rows of the same kind stay at 70-82% up to 100 ms (benchmarks/tile_floor.py,
`sustained_efficiency`): the training session ran the card throttled. This refits only the GEMM
ensemble (shipped settings, shipped tile chooser, the other classes as shipped) on variants of
the training rows and scores every GPU of the test set:

  all            every measured training row, the suspect ones too (training_frame with
                 suspect_rows: the recipe before kit.predict.training.SUSPECT_ROWS)
  drop_p4_long   all, without the P4's GEMM rows over 1 ms (its throttled rows)
  drop_p4        all, without any P4 GEMM row
  drop_p4_linear all, without the P4's Linear training rows (all of them run 3-5x slower than the
                 P4's own Linear test rows of the same size: median 0.8-2.1 TFLOP/s against
                 2.6-4.6, where its bmm training rows match its test rows; a model trained on them
                 predicted the P4's Linear test rows 3.4x slow, 243% MAPE). These are the rows
                 SUSPECT_ROWS leaves out, so this variant reproduces the shipped GEMM model
                 with --threads 1 (the shipped fit's)

The shipped tile chooser is used throughout; it is trained without the suspect rows, so `all`
scores the former GEMM model with the current chooser, not the former weights as a whole
(benchmarks/p4_linear_rows.py retrains everything with them kept).

    .venv/bin/python benchmarks/gemm_ablation.py [--data DIR] [--variants all,drop_p4_long]

Needs the NeuSight data (KIT_DATA). About 15 s a variant on two cores. Not run by the tests.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import pandas as pd

LONG_MS = 1.0
VARIANTS = ("all", "drop_p4_long", "drop_p4", "drop_p4_linear")


def variant_rows(gemm: pd.DataFrame, variant: str) -> pd.DataFrame:
    """The GEMM training rows a variant keeps."""
    if variant == "all":
        return gemm
    if variant == "drop_p4_long":
        return gemm[~((gemm.gpu == "p4") & (gemm.latency_ms > LONG_MS))]
    if variant == "drop_p4":
        return gemm[gemm.gpu != "p4"]
    if variant == "drop_p4_linear":
        return gemm[~((gemm.gpu == "p4") & (gemm.op == "linear"))]
    raise SystemExit(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="NeuSight folder (default KIT_DATA)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import torch

    from kit.data import resolve_data_dir
    from kit.predict.evaluate import load_test, predict_rows, summarise
    from kit.predict.nets import set_threads
    from kit.predict.tile_fit import gpu_balanced_weights, training_design
    from kit.predict.tile_ensemble import ClassModel
    from kit.predict.tile_mlp import TilePredictor
    from kit.predict.training import DEFAULT_TRAIN_GPUS, SETTINGS, training_frame
    from kit.predict.weights import shipped_tile

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        variant_rows(pd.DataFrame(columns=["gpu", "op", "latency_ms"]), v)  # unknown names fail first
    set_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    root = resolve_data_dir(args.data)
    gemm = training_frame(root, DEFAULT_TRAIN_GPUS, suspect_rows=True).query("op_class == 'gemm'")
    test = load_test(root / "data" / "dataset" / "test").query("op_class == 'gemm'")
    ship = shipped_tile()
    result = {"settings": SETTINGS, "seed": args.seed, "variants": {}}
    for v in variants:
        t0 = time.perf_counter()
        rows = variant_rows(gemm, v)
        x, lb, ly, gpus = training_design(rows, "gemm", ship.chooser)
        model = ClassModel.fit("gemm", x, lb, ly, gpu_balanced_weights(gpus), seed=args.seed,
                               members=SETTINGS["members"], epochs=SETTINGS["epochs"],
                               hidden=SETTINGS["hidden"], min_steps=SETTINGS["min_steps"])
        tile = TilePredictor(ship.chooser, {**ship.models, "gemm": model}, ship.transfer_sigma,
                             ship.manifest, ship.band)
        scored = summarise(predict_rows(test, {v: tile}))
        result["variants"][v] = {
            "training_rows": int(len(rows)), "seconds": round(time.perf_counter() - t0, 1),
            "test": {f"{s['gpu']} {s['op']}": {k: s[k] for k in ("n", "mape", "median_ape")}
                     for s in scored}}
        print(f"{v} done", file=sys.stderr, flush=True)
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
