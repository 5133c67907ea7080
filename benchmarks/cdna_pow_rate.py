"""Read, and check, the element rate the kit gives pow on AMD CDNA GPUs
(kit.predict.element_rates.CDNA_ELEMS_PER_CU_CLOCK) off NeuSight's AMD elementwise rows.

    KIT_DATA=... python benchmarks/cdna_pow_rate.py > rate.json

Rows: data/dataset_amd/train/elem.csv (PyTorch 2.4.1 on ROCm, MI100 and MI210, fp32), the pow
rows: a tensor exponent (pow) and a scalar one (powu), which the kit costs as one kind. The kit
does not train on them. A row's rate is its elements over its kernel time (latency less the tile
predictor's dispatch floor on that GPU, kit.workload.kernel_times.isolation_floor_ms), per CU per
boost clock. As on NVIDIA (kit.predict.element_rates), the shipped rate is the fastest measured,
over both GPUs: pow is never faster than that.

Output (JSON):
- `rates`: per GPU, the fastest, 90th-percentile and median rate (elements per CU per clock);
- `shipped`: the fastest over both GPUs;
- `cross_generation`: the fastest rate of one GPU's rows, as the bound, scored on the other's
  rows (latency MAPE, geometric bias measured over predicted), beside the shipped tile predictor
  on the same rows. The shipped predictor applies the pooled rate, so its score is in-sample; the
  cross-generation score is the held-out figure;
- `other_kinds`: the shipped predictor on the same files' other kinds (no rate there), for scale.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from cdna_softmax_fit import score  # noqa: E402  (the same scores, one definition)
from kit.errors import KitError  # noqa: E402

GPUS = ("mi100", "mi210")
ELEM = Path("data") / "dataset_amd" / "train" / "elem.csv"
POW = ("pow", "powu")


def rows(data_dir) -> dict:
    """Per GPU of GPUS: NeuSight's AMD elementwise rows with the shipped predictor's latency,
    each row's elements, and the GPU's dispatch floor."""
    from kit.data import resolve_data_dir
    from kit.hardware import get_gpu
    from kit.predict import get_predictor
    from kit.predict.evaluate import load_test, predict_rows
    from kit.workload.kernel_times import isolation_floor_ms

    path = resolve_data_dir(data_dir) / ELEM
    if not path.is_file():
        raise KitError(f"NeuSight's AMD elementwise rows not found at {path}")
    frame = load_test(path)
    tile = get_predictor("tile")
    scored = predict_rows(frame, {"tile": tile})
    out = {}
    for key in GPUS:
        part = scored[scored.gpu == key]
        if not part.op.isin(POW).any():
            raise KitError(f"no {key} pow rows in {path}")
        gpu = get_gpu(key)
        numel = (frame.loc[part.row, "rows"].astype(float) * frame.loc[part.row, "cols"].astype(float)).to_numpy()
        out[key] = {"gpu": gpu, "op": part.op.to_numpy(), "measured_ms": part.measured_ms.to_numpy(float),
                    "predicted_ms": part.predicted_ms.to_numpy(float), "numel": numel,
                    "floor_ms": isolation_floor_ms(tile, gpu)}
    return out


def per_cu_clock(r: dict) -> np.ndarray:
    """Each row's elements per CU per clock."""
    gpu = r["gpu"]
    return r["numel"] / ((r["measured_ms"] - r["floor_ms"]) * 1e-3) / (gpu.sm_count * gpu.boost_clock_mhz * 1e6)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="NeuSight's data folder (default: KIT_DATA)")
    args = ap.parse_args(argv)
    try:
        tables = rows(args.data)
        pow_rows = {g: np.isin(r["op"], POW) for g, r in tables.items()}
        rates = {}
        for g, r in tables.items():
            rate = per_cu_clock(r)[pow_rows[g]]
            rates[g] = {"fastest": round(float(rate.max()), 3), "p90": round(float(np.quantile(rate, 0.9)), 3),
                        "median": round(float(np.median(rate)), 3), "rows": int(len(rate))}
        cross = []
        for fitted, other in (GPUS, GPUS[::-1]):
            r, keep = tables[other], pow_rows[other]
            gpu = r["gpu"]
            bound = r["numel"] / (rates[fitted]["fastest"] * gpu.sm_count * gpu.boost_clock_mhz * 1e6) * 1e3
            cross.append({"fitted_on": fitted, "scored_on": other,
                          "rate": score((r["floor_ms"] + bound)[keep], r["measured_ms"][keep]),
                          "tile_predictor": score(r["predicted_ms"][keep], r["measured_ms"][keep])})
        other_kinds = {g: score(r["predicted_ms"][~pow_rows[g]], r["measured_ms"][~pow_rows[g]])
                       for g, r in tables.items()}
        print(json.dumps({"source": str(ELEM), "gpus": list(GPUS), "rates": rates,
                          "shipped": max(v["fastest"] for v in rates.values()),
                          "cross_generation": cross, "other_kinds": other_kinds}, indent=1))
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
