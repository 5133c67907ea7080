"""Megatron iteration times on one 8x A100 node (vTrain's ground_truth_single.csv, 1,440 configs of
TP, DP, PP and micro-batch; GPT, hidden 1024/2048, seq 1024, fp16, full activation checkpointing,
1F1B) against kit.parallel. Goal: mean APE <= 5% (vTrain reports 8.37%).

    .venv/bin/python benchmarks/vtrain_megatron.py            # evaluate the shipped profile
    .venv/bin/python benchmarks/vtrain_megatron.py --fit      # refit megatron-a100 (tile-MLP)
    .venv/bin/python benchmarks/vtrain_megatron.py --fit --predictor wave --name megatron-a100-wave
    .venv/bin/python benchmarks/vtrain_megatron.py --raw      # no profile: predictor + defaults
    .venv/bin/python benchmarks/vtrain_megatron.py --lut      # all-reduce from vTrain's NCCL LUT

The "megatron-a100" host profile has seven fitted constants: launch_us (host time per kernel),
collective_rank_us (host/arrival cost of a collective per extra rank in its group),
microbatch_ms (host work per forward micro-batch), gemm_scale and other_scale (achieved /
predicted kernel time), full_vocab_scale (empirical: the LM head's GEMMs at TP = 1) and
tp_comm_scale (empirical: achieved / predicted time of the in-layer TP collectives; the curves
are nccl-tests-style back-to-back timings, in a layer each collective starts cold between
compute kernels and waits for its group; fitted ~1.95; the backward's input-gradient all-reduces
run beside the weight-gradient GEMMs, as Megatron's async column-parallel backward does, and
cost only their excess over them). The analytic layer also models, with no constant and as
megatron-core 0.16.1 runs them with its defaults (kit.parallel.gpt): Megatron's fused-softmax
availability (b*heads/tp % 4: TP 8 at micro-batch 1, 32 rows, falls back to torch's cast,
masked_fill_, softmax and cast back, five kernels backward; no scale multiply, as
apply_query_key_layer_scaling is off; the causal mask is the data loader's, none built in the
layer), the context's permute(2, 0, 1, 3).contiguous() copy after the second attention GEMM
(forward only, rerun by the recompute), the vocab-parallel cross entropy's fp32 passes and its
three all-reduces, vocabulary padding to 128*tp, and the embedding all-reduce's identity
backward.

What vTrain ran is not quite that: its rows are Megatron-DeepSpeed (legacy
megatron/model/transformer.py), whose CoreAttention ends with the same context permute copy,
but whose query-key layer scaling, inherited from Megatron-LM's arguments of before 2023, is on
unless --no-query-key-layer-scaling is passed (neither that source nor vTrain's launch scripts
are in this environment: unverified). With it on, the softmax runs in fp32 with scale = the
layer number, so the 32 fallback rows run five torch kernels forward (a scale multiply among
them) where the kit prices four; on the other 1,408 rows the fused kernel applies the scale
inside and the two agree. The profile below was fitted before the context copy was priced;
refit it (--fit) after such a change. Fitted (robust least squares on log time) on a seeded sample of a seeded random half
of the rows (train); the error is reported on the other half (test) and on all rows. The fit
writes kit/parallel/profiles.json. Before these changes: test 5.55%, train 5.19, all 5.38;
after (fit of 02:50 UTC, weights then in the tree): see the profile's test_mean_ape_pct.

What the rows show (per-layer and per-micro-batch costs from regressing each (tp, dp, pp,
hidden, micro-batch) group on layers and micro-batches): a host floor of ~3 ms per layer per
micro-batch (forward + recompute + backward) that hides the GPU up to micro-batch 2-4; a
per-micro-batch cost outside the layers of ~2-3 ms at TP >= 2 but 6-57 ms at TP = 1 (the LM
head over the full 50257 vocabulary); TP = 8 at micro-batch 1 ~1.5 ms per layer slower than
TP = 1..4. What is left after the fit is mostly per-(tp, hidden, micro-batch) offsets of the
measurements (one scale per such group would bring the mean APE to ~1.2%), e.g. TP = 4 groups
whose host floor is below TP = 1's.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kit.parallel import GPTSpec, HostModel, Layout, predict_parallel
from kit.parallel.profiles import PROFILES_PATH, get_profile

SHARED = Path(os.environ.get("KIT_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
CSV = SHARED / "data/vtrain/ground_truth_single.csv"
LUT = SHARED / "data/vtrain/allreduce_lut_a100.csv"
CACHE = Path(os.environ.get("KIT_CACHE", Path.home() / ".cache" / "gpu-perf-kit"))
SEED = 0
# fitted HostModel fields (collective_us is held at 0: collective_rank_us carries the host side
# of a collective, which grows with its group) and where the fit starts
PARAMS = ("launch_us", "gemm_scale", "other_scale", "microbatch_ms", "collective_rank_us",
          "full_vocab_scale", "tp_comm_scale")
X0 = (60.0, 0.85, 0.8, 1.5, 15.0, 2.0, 1.2)
# held, not fitted (collective_rank_us carries the host side of a collective)
FIXED = {"collective_us": 0.0}
FIT_ROWS = 160
MAX_NFEV = int(os.environ.get("VTRAIN_FIT_NFEV", 40))


def split(d: pd.DataFrame):
    rng = np.random.default_rng(SEED)
    is_train = rng.random(len(d)) < 0.5
    return d[is_train], d[~is_train]


def lut_calibration():
    """kit.comm curves fitted to vTrain's measured NCCL all-reduce on 2, 4 and 8 A100s of the same
    node (powers of two, 1 MiB..1 GiB), cached under $KIT_CACHE; None when the LUT is absent."""
    from kit.comm import fit_table, load_calibration

    if not LUT.exists():
        return None
    st = LUT.stat()
    path = CACHE / f"vtrain_allreduce_a100_{st.st_size}_{st.st_mtime_ns}.json"
    if path.exists():
        return load_calibration(path)
    d = pd.read_csv(LUT)
    d = d[np.log2(d.size_bytes) % 1 == 0]
    cal = fit_table(pd.DataFrame({"kind": "allreduce", "ranks": d.n_gpus, "size_bytes": d.size_bytes,
                                  "time_us": d.time_ns_out_of_place / 1e3}),
                    system="dgx-a100", source=f"vTrain {LUT.name}")
    path.parent.mkdir(parents=True, exist_ok=True)
    cal.save(path)
    return cal


def predict_rows(d: pd.DataFrame, host: HostModel, calibration=None) -> np.ndarray:
    out = []
    for x in d.itertuples(index=False):
        spec = GPTSpec(layers=int(x.num_layers), hidden=int(x.hidden), heads=int(x.attention_heads),
                       seq=int(x.seq_len), vocab=50257, attention="unfused", name="vtrain-gpt")
        lay = Layout(dp=int(x.dp), tp=int(x.tp), pp=int(x.pp), micro_batch=int(x.micro_batch),
                     global_batch=int(x.global_batch), recompute="full", schedule="1f1b",
                     dtype="fp16", overlap_grad_reduce=False)
        out.append(predict_parallel(spec, "dgx-a100", lay, host=host,
                                    calibration=calibration)["iteration_ms"])
    return np.asarray(out)


def mape(d: pd.DataFrame, pred: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - d.iter_time_ms.to_numpy()) / d.iter_time_ms.to_numpy()) * 100)


def fit(train: pd.DataFrame, predictor: str, calibration=None, n: int = FIT_ROWS) -> dict:
    """Robust least squares on log(predicted / measured) over a seeded sample of the train half
    (soft-L1: rows off by more than ~5% count linearly, so a few odd measurements do not steer
    the fit); a few minutes on one core."""
    from scipy.optimize import least_squares

    sub = train.sample(min(n, len(train)), random_state=SEED)
    y = sub.iter_time_ms.to_numpy()

    def host(logp):
        return HostModel(**dict(zip(PARAMS, np.exp(logp))), **FIXED, predictor=predictor)

    def residual(logp):
        return np.log(predict_rows(sub, host(logp), calibration) / y)

    # bounded work: at most 40 steps of 1 + len(PARAMS) evaluations of FIT_ROWS rows each
    best = least_squares(residual, np.log(X0), loss="soft_l1", f_scale=0.05, diff_step=1e-3,
                         xtol=1e-4, ftol=1e-4, max_nfev=MAX_NFEV)
    return {**FIXED, **{k: float(v) for k, v in zip(PARAMS, np.exp(best.x))}}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--raw", action="store_true")
    ap.add_argument("--rows", type=int, default=0, help="evaluate a seeded sample of this many rows")
    ap.add_argument("--predictor", default="tile", help="kernel predictor to fit the profile with")
    ap.add_argument("--name", default="megatron-a100", help="profile name to write with --fit")
    ap.add_argument("--profile", default="megatron-a100", help="profile to evaluate")
    ap.add_argument("--lut", action="store_true",
                    help="all-reduce from curves fitted to vTrain's measured LUT, not the preset")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if not CSV.exists():
        print(json.dumps({"error": f"{CSV} not found (set KIT_SHARED)"}))
        return 1
    d = pd.read_csv(CSV)
    train, test = split(d)
    t0 = time.perf_counter()
    cal = lut_calibration() if args.lut else None
    if args.fit:
        params = fit(train, args.predictor, cal)
        host = HostModel(**params, predictor=args.predictor)
    elif args.raw:
        params, host = {}, HostModel(predictor=args.predictor)
    else:
        host = get_profile(args.profile)
        params = {k: getattr(host, k) for k in tuple(FIXED) + PARAMS}
    params["predictor"] = host.predictor
    ev = d if not args.rows else d.sample(args.rows, random_state=SEED)
    pred = predict_rows(ev, host, cal)
    ev = ev.assign(pred_ms=pred, ape=np.abs(pred - ev.iter_time_ms) / ev.iter_time_ms * 100)
    is_test = ev.index.isin(test.index)
    out = {"benchmark": "vtrain_megatron", "rows": len(ev), "profile": params,
           "mean_ape_pct_all": float(ev.ape.mean()),
           "mean_ape_pct_test": float(ev.ape[is_test].mean()),
           "mean_ape_pct_train": float(ev.ape[~is_test].mean()),
           "median_ape_pct": float(ev.ape.median()), "p90_ape_pct": float(ev.ape.quantile(0.9)),
           "goal_mean_ape_pct": 5.0, "vtrain_reported_pct": 8.37,
           "by_tp": ev.groupby("tp").ape.mean().round(2).to_dict(),
           "by_pp": ev.groupby("pp").ape.mean().round(2).to_dict(),
           "by_micro_batch": ev.groupby("micro_batch").ape.mean().round(2).to_dict(),
           "by_hidden": ev.groupby("hidden").ape.mean().round(2).to_dict(),
           "by_dp": ev.groupby("dp").ape.mean().round(2).to_dict(),
           "by_layers": ev.groupby("num_layers").ape.mean().round(2).to_dict(),
           "by_tp_split": {f"{split} tp={tp}": round(float(v), 2) for (split, tp), v in
                           ev.assign(split=np.where(is_test, "test", "train"))
                           .groupby(["split", "tp"]).ape.mean().items()},
           "allreduce": "vTrain LUT curves" if cal is not None else "dgx-a100 preset",
           "seconds": time.perf_counter() - t0}
    if args.fit:
        doc = json.loads(PROFILES_PATH.read_text()) if PROFILES_PATH.exists() else {}
        doc[args.name] = {**params, "p2p_sync": True, "step_overhead_ms": 0.0,
                          "kernels": "analytic GPT layer",  # what it costs: GPTSpec shapes
                                "trained_on": "vTrain ground_truth_single.csv (commit f8dda84), "
                                f"seeded random half (seed {SEED}, {len(train)} rows; {FIT_ROWS} sampled)",
                                "script": "benchmarks/vtrain_megatron.py --fit"
                                + (f" --predictor {args.predictor} --name {args.name}"
                                   if args.name != "megatron-a100" else "")
                                + (" --lut" if args.lut else ""),
                                "allreduce": out["allreduce"],
                                "system": "dgx-a100",
                                "test_mean_ape_pct": out["mean_ape_pct_test"]}
        PROFILES_PATH.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
