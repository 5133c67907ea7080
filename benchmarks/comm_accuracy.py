"""Accuracy and speed of the collective model; prints JSON.

1. Presets against measured NCCL all-reduce on an A100 SXM4 node (vTrain's allreduce_lut_a100.csv,
   2-8 GPUs, 1 MiB-1 GiB in 1 MiB steps): mean APE on time over every row, and over the
   power-of-two sizes only (which weights small sizes as much as large ones). The preset's few
   calibrated constants (kit/hardware/systems.json "software" and the nvlink3 efficiency and step
   latency) were fitted on the 2-4 GPU rows only, so 5-8 GPUs are held out.
   Reported per GPU count. The table has no size below 1 MiB or above 1 GiB: the preset's times at
   1 KiB and 8 GiB are printed beside NCCL's own latency model for a tiny all-reduce, but nothing
   measured checks them.
2. Fitted curves reproduce held-out sizes: fit on every other size (both ends included), score
   the sizes in between (interpolation only). On real gloo data measured here (kit collect-comm,
   2-4 CPU processes, pinned, per-call p10 over rounds of interleaved sizes) and on the vTrain
   NCCL table; each with the algorithm-switch detection and with one regime only.
3. Time of predict_collective: warm per call, and the first call of a fresh process (with the
   import time and whether scipy/pandas/torch got imported).

    .venv/bin/python benchmarks/comm_accuracy.py [--gloo FILE ...] [--ranks 2,3,4] [--sizes 1K:16M]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kit.comm import collective_table, fit_curve, predict_collective
from kit.comm.parsers import read_measurements

SHARED = Path(os.environ.get("KIT_SHARED", Path(__file__).resolve().parents[1] / ".." / "shared"))
VTRAIN = SHARED / "data" / "vtrain" / "allreduce_lut_a100.csv"


def _ape(pred, meas):
    return np.abs(np.asarray(pred) - np.asarray(meas)) / np.asarray(meas)


# NCCL's own latency model (src/graph/tuning.cc, NCCL 2.18): base latency of the ring algorithm
# with the LL protocol 6.6 us, plus 0.6 us per NVLink hop; a ring all-reduce takes 2(n-1) hops.
NCCL_RING_LL_BASE_US, NCCL_NVLINK_LL_HOP_US = 6.6, 0.6


def preset_vs_vtrain() -> dict:
    if not VTRAIN.exists():
        return {"skipped": f"{VTRAIN} not found"}
    d = pd.read_csv(VTRAIN)
    out = {"measured_range_bytes": [int(d.size_bytes.min()), int(d.size_bytes.max())],
           "note": "no measured reference below 1 MiB or above 1 GiB here; the 1 KiB and 8 GiB figures "
                   "are the model's alone"}
    for n, g in d.groupby("n_gpus"):
        t = collective_table("allreduce", g.size_bytes.values, "dgx-a100", ranks=int(n))
        meas = g.time_ns_out_of_place.values / 1e6
        ape = _ape(t.time_ms.values, meas)
        pow2 = np.log2(g.size_bytes.values) % 1 == 0
        ends = collective_table("allreduce", [1024.0, 8.0 * 2**30], "dgx-a100", ranks=int(n))
        out[f"{n}gpu"] = {"mape_all_sizes": round(float(ape.mean()), 4),
                          "mape_pow2_sizes": round(float(ape[pow2].mean()), 4),
                          "max_ape": round(float(ape.max()), 4), "rows": int(len(g)),
                          "used_for_calibration": bool(n <= 4),
                          "algorithms": sorted(set(t.algorithm)),
                          "measured_1mib_us": round(float(meas[g.size_bytes.values == 2**20][0] * 1e3), 1),
                          "preset_1kib_us": round(float(ends.time_ms[0] * 1e3), 1),
                          "nccl_ll_model_1kib_us": round(NCCL_RING_LL_BASE_US + 2 * (n - 1) * NCCL_NVLINK_LL_HOP_US, 1),
                          "preset_8gib_ms": round(float(ends.time_ms[1]), 2),
                          "preset_8gib_busbw_gbs": round(float(ends.busbw_gbs[1]), 1),
                          "measured_1gib_busbw_gbs": round(float(g.busbw_gbps_out_of_place.values[-1]), 1)}
    return out


def heldout(table: pd.DataFrame, breaks=None) -> dict:
    """Fit on even-indexed sizes, score the odd-indexed ones inside the fitted range, per (kind, ranks)."""
    out = {}
    for (kind, ranks), g in table.groupby(["kind", "ranks"]):
        g = g.groupby("size_bytes", as_index=False)["time_us"].median().sort_values("size_bytes")
        train, test = g.iloc[::2], g.iloc[1::2]
        test = test[test.size_bytes < train.size_bytes.max()]
        if len(train) < 4 or test.empty:
            continue
        c = fit_curve(kind, int(ranks), train.size_bytes.values, train.time_us.values, breaks=breaks)
        ape = _ape(c.time_us(test.size_bytes.values), test.time_us.values)
        out[f"{kind}@{ranks}"] = {"heldout_mape": round(float(ape.mean()), 4),
                                  "heldout_max_ape": round(float(ape.max()), 4),
                                  "train_mape": round(c.fit_mape, 4), "train_sizes": int(len(train)),
                                  "test_sizes": int(len(test)),
                                  "within_10pct": round(float(np.mean(ape <= 0.10)), 3),
                                  "breaks_bytes": [round(b) for b in c.breaks_bytes],
                                  "curve": {"floor_us": round(c.floor_us, 2), "busbw_max_gbs": round(c.busbw_max_gbs, 4),
                                            "half_bytes": round(c.half_bytes), "steepness": round(c.steepness, 3)}}
    return out


def vtrain_table() -> pd.DataFrame:
    d = pd.read_csv(VTRAIN)
    d = d[np.log2(d.size_bytes) % 1 == 0]  # 11 sizes per rank count, 1 MiB..1 GiB
    return pd.DataFrame({"kind": "allreduce", "ranks": d.n_gpus, "size_bytes": d.size_bytes,
                         "time_us": d.time_ns_out_of_place / 1e3})


def gloo_table(paths: list[str], ranks: list[int], sizes: str, kinds: list[str], iters: int,
               repeats: int) -> tuple[pd.DataFrame, list[str], dict]:
    from kit.comm.measure import collect

    if paths:
        return pd.concat([read_measurements(f) for f in paths], ignore_index=True), paths, {}
    files, frames, seconds = [], [], {}
    tmp = Path(tempfile.mkdtemp(prefix="kit-comm-bench-"))
    for n in ranks:
        f = tmp / f"gloo{n}.txt"
        t0 = time.perf_counter()
        _, t = collect("gloo", n, sizes, kinds=kinds, iters=iters, warmup=3, repeats=repeats, out=f)
        seconds[f"{n}_ranks"] = round(time.perf_counter() - t0, 1)
        frames.append(t)
        files.append(str(f))
    return pd.concat(frames, ignore_index=True), files, seconds


_FRESH = """
import json, sys, time
t0 = time.perf_counter()
from kit.comm import predict_collective
t1 = time.perf_counter()
predict_collective(*ARGS)
t2 = time.perf_counter()
predict_collective(*ARGS)
t3 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "first_call_ms": (t2 - t1) * 1e3, "second_call_ms": (t3 - t2) * 1e3,
                  "scipy_imported": "scipy" in sys.modules, "pandas_imported": "pandas" in sys.modules,
                  "torch_imported": "torch" in sys.modules}))
"""

CASES = {"allreduce dgx-h100 8 ranks": ("allreduce", 1e9, "dgx-h100"),
         "allreduce dgx1-v100 8 ranks (cube-mesh LP)": ("allreduce", 1e9, "dgx1-v100"),
         "allgather dgx-h100-x4 ranks 0,1,8,9": ("allgather", 1e6, "dgx-h100-x4", [0, 1, 8, 9])}


def speed() -> dict:
    """Warm time per call (after one call on the same case), and a fresh interpreter's first call."""
    warm, fresh = {}, {}
    for label, args in CASES.items():
        predict_collective(*args)
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            predict_collective(*args)
        warm[label] = round((time.perf_counter() - t0) / n * 1e3, 4)
        r = subprocess.run([sys.executable, "-c", _FRESH.replace("ARGS", repr(args))], capture_output=True,
                           text=True, check=True)
        fresh[label] = {k: round(v, 3) if isinstance(v, float) else v for k, v in json.loads(r.stdout).items()}
    return {"warm_ms_per_call": warm, "fresh_process": fresh}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gloo", nargs="*", default=[], help="use these collect-comm / nccl-tests files instead of measuring")
    p.add_argument("--ranks", default="2,3,4")
    p.add_argument("--sizes", default="1K:16M")
    p.add_argument("--collectives", default="allreduce,allgather,reducescatter,alltoall,broadcast")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args(argv)
    gloo, files, seconds = gloo_table(a.gloo, [int(r) for r in a.ranks.split(",")], a.sizes,
                                      a.collectives.split(","), a.iters, a.repeats)
    preset = preset_vs_vtrain()
    held_gloo, held_gloo_one = heldout(gloo), heldout(gloo, breaks=0)
    held_nccl = heldout(vtrain_table()) if VTRAIN.exists() else {}
    fast = speed()
    per_n = {k: v["mape_all_sizes"] <= 0.10 for k, v in preset.items() if k.endswith("gpu")}
    goals = {"preset_mape_le_10pct_1mib_1gib": per_n,
             "preset_8gpu_pow2_mape_le_10pct": preset.get("8gpu", {}).get("mape_pow2_sizes", 1) <= 0.10,
             "gloo_heldout_mape_le_10pct": {k: v["heldout_mape"] <= 0.10 for k, v in held_gloo.items()},
             "nccl_heldout_mape_le_10pct": all(v["heldout_mape"] <= 0.10 for v in held_nccl.values()),
             "predict_warm_under_1ms": all(v < 1.0 for v in fast["warm_ms_per_call"].values()),
             "predict_fresh_first_call_under_1ms": {k: v["first_call_ms"] < 1.0
                                                    for k, v in fast["fresh_process"].items()}}
    summary = {k: {"switch_detection": v["heldout_mape"], "one_regime": held_gloo_one.get(k, {}).get("heldout_mape")}
               for k, v in held_gloo.items()}
    result = {"goals": goals, "preset_vs_vtrain_a100_allreduce": preset,
              "fitted_curve_heldout_gloo_summary": summary,
              "fitted_curve_heldout_gloo": {"files": files, "sweep_seconds": seconds,
                                            "settings": {"sizes": a.sizes, "iters": a.iters, "repeats": a.repeats,
                                                         "stat": "p10 per call, slowest rank", "pinned": True},
                                            **held_gloo},
              "fitted_curve_heldout_gloo_one_regime": held_gloo_one,
              "fitted_curve_heldout_vtrain_nccl": held_nccl, "speed": fast}
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
