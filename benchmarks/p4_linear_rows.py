"""The shipped recipe retrained with the P4's Linear training rows kept, scored beside the shipped
weights on the training GPUs' GEMM test rows.

NeuSight's P4 train-collect Linear rows run 3-5x slower than the P4's own Linear test rows of the
same size (median 0.8-2.1 TFLOP/s against 2.6-4.6 by size; its bmm training rows match its test
rows), and they were timed on other kernels (maxwell_sgemm_*_tn kernels, where the test rows ran
sgemm_128x128x8_NT_vec). kit.predict.training.SUSPECT_ROWS leaves them out of every training frame
by default; weights trained on them (the shipped weights until then) predicted the P4's Linear
test rows 3.4x slow (243% MAPE) and its whole-model inference labels 50% slow.
gemm_ablation.py's drop_p4_linear refits the GEMM ensemble alone (shipped chooser).

This refits everything, chooser included, as `kit train --keep-suspect-rows` does (seed, one
thread, calibrated band), writes the weights to --out and prints JSON: GEMM MAPE and median APE on
every training GPU's test rows, for the shipped weights (suspect rows left out) and the ones
retrained with them. Score the held-out GPUs with `tile_predictor.py --weights OUT --skip-logo`
and whole models with `KIT_WEIGHTS=OUT whole_model.py --skip-speed`.

    .venv/bin/python benchmarks/p4_linear_rows.py --out /tmp/w-with-p4-linear [--seed 0]

Needs the NeuSight data (KIT_DATA). About 3 minutes on one thread. Not run by the tests.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def scores(test, predictor) -> dict:
    from kit.predict.evaluate import predict_rows

    rows = predict_rows(test, {"tile": predictor})
    return {f"{g} {op}": {"n": int(len(p)), "mape": round(float(p.ape.mean()), 2),
                          "median_ape": round(float(p.ape.median()), 2)}
            for (g, op), p in rows.groupby(["gpu", "op"])}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="NeuSight folder (default KIT_DATA)")
    ap.add_argument("--out", required=True, help="folder for the retrained weights")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from kit.data import resolve_data_dir
    from kit.predict.evaluate import load_neusight_test
    from kit.predict.training import DEFAULT_TRAIN_GPUS, suspect_mask, train_bundle, training_frame
    from kit.predict.weights import check_weights_folder, save_bundle, shipped_tile

    check_weights_folder(args.out)
    root = resolve_data_dir(args.data)
    frame = training_frame(root, DEFAULT_TRAIN_GPUS, suspect_rows=True)
    t0 = time.perf_counter()
    bundle = train_bundle(frame, DEFAULT_TRAIN_GPUS, seed=args.seed, threads=1, calibrate=True,
                          info={"command": "benchmarks/p4_linear_rows.py",
                                "data_source": "NeuSight training rows, the suspect ones too "
                                               "(kit.predict.training.SUSPECT_ROWS)"})
    seconds = round(time.perf_counter() - t0, 1)
    save_bundle(bundle, args.out)
    test = load_neusight_test(root)
    test = test[(test.op_class == "gemm") & test.gpu.isin(DEFAULT_TRAIN_GPUS)].reset_index(drop=True)
    json.dump({"suspect_rows_kept": int(suspect_mask(frame).sum()), "training_rows": int(len(frame)),
               "training_seconds": seconds, "seed": args.seed, "out": args.out,
               "training_gpus_test_rows": {"shipped": scores(test, shipped_tile()),
                                           "with_p4_linear": scores(test, bundle.tile)}},
              sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
