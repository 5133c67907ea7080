"""Read the element rates of kit.predict.element_rates off the project's H200 vector sweeps, and
show how the tile predictor meets those rows with and without them.

    python benchmarks/element_rates.py [--dir measurements/h200-2026-12-04] > rates.json

For each elementwise kind and dtype of the sweeps (`vector_*.csv.gz`, kernel time, rows of at
least 20 us), the fastest rate in elements per SM per clock (132 SMs, 1,980 MHz: the clock the
nvidia-smi samples read under load) and, for comparison, the bandwidth it implies. A kind is
element-bound where its 16-bit rate stays at its fp32 rate, well under what its bytes allow
(a bf16 add: 2.7, a unary bf16 op: 4.0). `bounds` is what kit.predict.element_rates ships: the
fastest rate of each bound kind over both dtypes (pow and its scalar-exponent form, powu, are
one kind in the kit; GELU's fp32 rows are bound by their bytes, so its rate is the bf16 one).
`tile_bf16` scores the tile predictor's in-stream time against the bf16 rows of the bound kinds.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from kit.errors import KitError  # noqa: E402

DEFAULT_DIR = ROOT / "measurements" / "h200-2026-12-04"
SMS, CLOCK_HZ = 132, 1.98e9
KIND_OF = {"pow": "pow", "powu": "pow", "gelu": "gelu"}  # sweep op -> kit kind, for the bound kinds
MIN_KERNEL_MS = 0.02


def rows(folder: Path) -> pd.DataFrame:
    from kit.data.records import load_measurements

    files = sorted(folder.glob("*/vector_*.csv.gz"))
    if not files:
        raise KitError(f"no vector sweeps (*/vector_*.csv.gz) under {folder}")
    d = pd.concat([load_measurements(f) for f in files], ignore_index=True)
    d = d[~d.op.isin(["softmax", "ln"]) & (d.kernel_ms >= MIN_KERNEL_MS)].copy()
    d["elems_per_sm_clock"] = d.rows * d.cols / (d.kernel_ms * 1e-3) / (SMS * CLOCK_HZ)
    return d


def bounds(d: pd.DataFrame) -> dict:
    out = {}
    for op, kind in KIND_OF.items():
        part = d[(d.op == op) & ((d.dtype == "bf16") if kind == "gelu" else True)]
        if len(part):
            out[kind] = round(max(out.get(kind, 0.0), float(part.elems_per_sm_clock.max())), 2)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help="the measurement folder")
    args = ap.parse_args(argv)
    folder = Path(args.dir)
    try:
        if not folder.is_dir():
            raise KitError(f"measurement folder not found: {folder}")
        d = rows(folder)
        table = (d.groupby(["op", "dtype"]).elems_per_sm_clock.agg(["size", "max", "median"])
                 .round(3).reset_index().to_dict("records"))
        out = {"source": str(folder), "min_kernel_ms": MIN_KERNEL_MS, "rates": table, "bounds": bounds(d)}
        out["tile_bf16"] = tile_scores(d[(d.dtype == "bf16") & d.op.isin(list(KIND_OF))])
    except KitError as e:
        print(f"element_rates: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1))
    return 0


def tile_scores(d: pd.DataFrame) -> dict:
    """MAPE of the tile predictor's in-stream time against these rows' kernel time, as shipped."""
    import warnings

    from kit.predict import get_predictor
    from kit.predict.evaluate import _test_frame, predict_rows

    if not len(d):
        return {}
    frame = _test_frame(d.reset_index(drop=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pred = predict_rows(frame, {"tile": get_predictor("tile")}, in_stream=True).set_index("row").sort_index()
    ratio = pred.predicted_ms.to_numpy() / frame.kernel_ms.to_numpy()
    return {op: {"n": int((frame.op == op).sum()), "mape": round(float(np.mean(np.abs(ratio[frame.op == op] - 1)) * 100), 1),
                 "geo_bias": round(float(np.exp(np.mean(np.log(ratio[frame.op == op])))), 3)}
            for op in sorted(frame.op.unique())}


if __name__ == "__main__":
    sys.exit(main())
