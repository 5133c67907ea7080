"""Read the element rates of kit.predict.element_rates off the project's H200 measurements, and
show how the tile predictor meets those rows with and without them.

    python benchmarks/element_rates.py [--dir FOLDER ...] > rates.json

--dir may be given more than once (default: measurements/h200-2026-12-04 and its second session,
h200-2026-12-04-b). For each elementwise kind and dtype of the vector sweeps (`vector_*.csv.gz`,
kernel time, rows of at least 20 us), the fastest rate in elements per SM per clock (132 SMs,
1,980 MHz: the clock the nvidia-smi samples read under load; device_session.sh PLAN=rows's
`rows_*.csv.gz` are read too, and a tarball's plain `.csv` files unpacked into the folder) and,
for comparison, the bandwidth
it implies. A kind is element-bound where its 16-bit rate stays at its fp32 rate, well under what
its bytes allow (a bf16 add: 2.7, a unary bf16 op: 4.0). `bounds` is what
kit.predict.element_rates ships: the fastest rate of each bound kind over both dtypes (pow and its
scalar-exponent form, powu, are one kind in the kit; GELU's fp32 rows are bound by their bytes,
so its rate is the bf16 one). `tile_bf16` scores the tile predictor's in-stream time against the
bf16 rows of the bound kinds.

`softmax_row_latency` fits one row's latency in softmax's warp kernel
(kit.predict.element_rates.SOFTMAX_ROW_CLOCKS) on the sweep rows with at most one row per SM.

`softmax` does the same for softmax rows, by row band (SOFTMAX_ELEMS_PER_SM_CLOCK: rows of
257-512, 513-1,024 and 1,025-2,048 elements). Its rows are the sweeps' softmax rows
and the attention softmax kernels of the whole-model inference passes (`model_steps*.jsonl`,
softmax_warp_forward: batch x heads x seq rows of seq, the heads from the zoo's config, one
kernel per layer); `softmax_bounds` is the fastest rate of each band over both sources and
dtypes, rows whose bytes ran at 80% of the catalog bandwidth or more left out (bound by their
bytes, not their elements). `softmax_held_out` checks the bound on the rows it was not read from:
the training steps' attention softmax and the sweeps' rows under 20 us (the fastest of each as a
share of its band's rate; over 1 would be a row faster than the bound).
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

DEFAULT_DIRS = (ROOT / "measurements" / "h200-2026-12-04", ROOT / "measurements" / "h200-2026-12-04-b")
SMS, CLOCK_HZ = 132, 1.98e9
KIND_OF = {"pow": "pow", "powu": "pow", "gelu": "gelu"}  # sweep op -> kit kind, for the bound kinds
MIN_KERNEL_MS = 0.02
BYTES_BOUND_SHARE = 0.8  # of the catalog bandwidth: a row at least this fast is bound by its bytes


def sweep_files(folder: Path) -> list[Path]:
    """The vector sweeps one folder down (`vector_*`, PLAN=rows's `rows_*`): gzipped as committed,
    or plain `.csv` as device_session.sh's tarball holds them (a `.csv` beside its `.csv.gz`
    twin is read once, from the `.gz`)."""
    found = {}
    for stem in ("vector_", "rows_"):
        for f in sorted(folder.glob(f"*/{stem}*.csv")):
            found.setdefault(f.with_name(f.name + ".gz"), f)
        for f in sorted(folder.glob(f"*/{stem}*.csv.gz")):
            found[f] = f
    return sorted(found.values())


def all_sweep_rows(folders) -> pd.DataFrame:
    """Every vector-sweep row (`vector_*.csv[.gz]`, PLAN=rows's `rows_*.csv[.gz]`) under folders."""
    from kit.data.records import load_measurements

    files = [f for folder in folders for f in sweep_files(Path(folder))]
    if not files:
        raise KitError(f"no vector sweeps (*/vector_*.csv[.gz], */rows_*.csv[.gz]) under "
                       f"{', '.join(map(str, folders))}")
    return pd.concat([load_measurements(f) for f in files], ignore_index=True)


def sweeps(folders) -> pd.DataFrame:
    """Every vector-sweep row of at least MIN_KERNEL_MS, with its rate."""
    d = all_sweep_rows(folders)
    d = d[d.kernel_ms >= MIN_KERNEL_MS].copy()
    d["elems_per_sm_clock"] = d.rows * d.cols / (d.kernel_ms * 1e-3) / (SMS * CLOCK_HZ)
    return d


def rows(folders) -> pd.DataFrame:
    d = sweeps(folders)
    return d[~d.op.isin(["softmax", "ln"])].copy()


def bounds(d: pd.DataFrame) -> dict:
    out = {}
    for op, kind in KIND_OF.items():
        part = d[(d.op == op) & ((d.dtype == "bf16") if kind == "gelu" else True)]
        if len(part):
            out[kind] = round(max(out.get(kind, 0.0), float(part.elems_per_sm_clock.max())), 2)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", action="append", help="a measurement folder (repeatable; default: both "
                    "H200 folders)")
    args = ap.parse_args(argv)
    folders = [Path(f) for f in (args.dir or DEFAULT_DIRS)]
    try:
        for folder in folders:
            if not folder.is_dir():
                raise KitError(f"measurement folder not found: {folder}")
        d = rows(folders)
        table = (d.groupby(["op", "dtype"]).elems_per_sm_clock.agg(["size", "max", "median"])
                 .round(3).reset_index().to_dict("records"))
        out = {"source": [str(f) for f in folders], "min_kernel_ms": MIN_KERNEL_MS, "rates": table,
               "bounds": bounds(d)}
        out["tile_bf16"] = tile_scores(d[(d.dtype == "bf16") & d.op.isin(list(KIND_OF))])
        soft = softmax_rows(folders)
        out["softmax"] = (soft.groupby(["band", "dtype", "source"]).elems_per_sm_clock
                          .agg(["size", "max", "median"]).round(3).reset_index().to_dict("records"))
        out["softmax_bounds"] = softmax_bounds(soft)
        out["softmax_held_out"] = softmax_held_out(softmax_rows(folders, held_out=True))
        out["softmax_row_latency"] = softmax_row_latency(folders)
        sw = sweeps(folders)
        out["tile_softmax"] = tile_scores(sw[sw.op == "softmax"], by="dtype")
    except KitError as e:
        print(f"element_rates: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1))
    return 0


def softmax_rows(folders, held_out: bool = False) -> pd.DataFrame:
    """Softmax rows of at least MIN_KERNEL_MS: the sweeps' and the model steps' attention softmax
    (one row per inference pass: its softmax_warp_forward kernels' mean time). held_out: the rows
    the rates were not read from instead: the training steps' attention softmax (the same kernel,
    timed in another run) and the sweeps' rows under MIN_KERNEL_MS."""
    from kit.data.records import read_jsonl
    from kit.hardware import get_gpu
    from kit.workload.zoo_configs import config

    sw = all_sweep_rows(folders)
    sw = sw[(sw.op == "softmax") & (sw.kernel_ms > 0)]
    sw = sw[(sw.kernel_ms < MIN_KERNEL_MS) if held_out else (sw.kernel_ms >= MIN_KERNEL_MS)]
    out = [{"source": "sweep", "gpu": _gpu_key(r.gpu), "dtype": r.dtype, "rows": float(r.rows),
            "cols": float(r.cols), "kernel_ms": float(r.kernel_ms)} for r in sw.itertuples()]
    latest = {}
    mode = "train" if held_out else "inference"
    for folder in folders:
        for f in sorted([*folder.glob("model_steps/*.jsonl"), *folder.glob("[!m]*/model_steps*.jsonl")]):
            for r in read_jsonl(f):
                if "error" not in r and r["mode"] == mode:  # a later file's row replaces
                    latest[(r["model"], r["dtype"], r["batch"], r["seq"])] = r
    for r in latest.values():
        ks = [k for k in r["top_kernels"] if "softmax_warp_forward" in k["name"]]
        if not ks:
            continue
        cfg = config(r["model"])
        heads = cfg.get("n_head") or cfg.get("num_attention_heads")
        layers = cfg.get("n_layer") or cfg.get("num_hidden_layers")
        if not heads or not layers:
            raise KitError(f"{r['model']}: no head or layer count in its zoo config")
        count, us = sum(k["count"] for k in ks), sum(k["us"] for k in ks)
        if count != layers:
            raise KitError(f"{r['model']}: {count} softmax kernels against {layers} layers")
        out.append({"source": "model_steps", "gpu": "h200", "dtype": r["dtype"],  # the H200 sessions'
                    "rows": float(r["batch"] * heads * r["seq"]), "cols": float(r["seq"]),
                    "kernel_ms": us / count / 1e3})
    d = pd.DataFrame(out, columns=["source", "gpu", "dtype", "rows", "cols", "kernel_ms"])
    if not held_out:
        d = d[d.kernel_ms >= MIN_KERNEL_MS]
    d = d.copy()
    numel = d.rows * d.cols
    d["elems_per_sm_clock"] = numel / (d.kernel_ms * 1e-3) / (SMS * CLOCK_HZ)
    d["band"] = [_band(c) for c in d.cols]
    # read and written once each: the bandwidth a row's bytes ran at
    tbps = 2 * numel * d.dtype.map({"bf16": 2, "fp16": 2, "fp32": 4}) / (d.kernel_ms * 1e-3) / 1e12
    # against the bandwidth of the GPU that measured the row (an H100's 3.35 TB/s, not the H200's 4.8)
    d["bytes_bound"] = tbps >= BYTES_BOUND_SHARE * d.gpu.map(lambda k: get_gpu(k).mem_bw_gbs) / 1e3
    return d[d.band > 0]


def _gpu_key(gpu) -> str:
    """A sweep row's catalog GPU (the collector's `gpu` column); "h200" where it names none (the
    H200 sessions' rows all name it)."""
    return gpu if isinstance(gpu, str) and gpu else "h200"


def softmax_row_latency(folders) -> dict:
    """One row's latency in softmax's warp kernel (kit.predict.element_rates.SOFTMAX_ROW_CLOCKS):
    per dtype, the least-squares line a + b x cols in clocks through the sweeps' softmax rows (any
    kernel time) with at most one row per SM and at most SOFTMAX_WARP_MAX_COLS columns, where no
    other warp hides a row. `fit` is over every such row; `check` fits the even rows and scores
    the odd ones (MAPE, geometric bias); `under_line` is the share of the dtype's other warp-kernel
    rows (more rows than SMs) that ran faster than the line, and the lowest of their ratios."""
    from kit.predict.element_rates import SOFTMAX_WARP_MAX_COLS

    d = all_sweep_rows(folders)
    d = d[(d.op == "softmax") & (d.kernel_ms > 0) & (d.cols <= SOFTMAX_WARP_MAX_COLS)].copy()
    d["clocks"] = d.kernel_ms * 1e-3 * CLOCK_HZ

    def line(p):
        a, b = np.linalg.lstsq(np.column_stack([np.ones(len(p)), p.cols]), p.clocks.to_numpy(), rcond=None)[0]
        return float(a), float(b)

    out = {}
    for dtype, part in d.groupby("dtype", sort=True):
        few = part[part.rows <= SMS].reset_index(drop=True)
        if len(few) < 4:
            continue
        a, b = line(few)
        ea, eb = line(few.iloc[0::2])
        odd = few.iloc[1::2]
        ratio = (ea + eb * odd.cols) / odd.clocks
        many = part[part.rows > SMS]
        under = many.clocks / (a + b * many.cols)
        # kit.predict.element_rates.SOFTMAX_ROW_CLOCKS's keys: fp32, and bf16's for 16-bit (fp16
        # rows, where a folder has them, are reported apart and not shipped)
        out["fp32" if dtype == "fp32" else "16bit" if dtype == "bf16" else dtype] = {
            "dtype": dtype, "rows": int(len(few)), "fit": [round(a, 0), round(b, 2)],
            "check": {"n": int(len(odd)), "mape": round(float(np.mean(np.abs(ratio - 1)) * 100), 1),
                      "geo_bias": round(float(np.exp(np.mean(np.log(ratio)))), 3)},
            "under_line": {"n": int(len(many)), "share": round(float((under < 1).mean()), 3),
                           "lowest": round(float(under.min()), 2)}}
    return out


def _band(cols: float) -> int:
    """The row band (kit.predict.element_rates.SOFTMAX_ELEMS_PER_SM_CLOCK) a row length is in; 0:
    none (SOFTMAX_UNBOUND_COLS or fewer, or past the last band)."""
    from kit.predict.element_rates import SOFTMAX_ELEMS_PER_SM_CLOCK, SOFTMAX_UNBOUND_COLS

    if cols <= SOFTMAX_UNBOUND_COLS:
        return 0
    return next((b for b in sorted(SOFTMAX_ELEMS_PER_SM_CLOCK) if cols <= b), 0)


def softmax_bounds(d: pd.DataFrame) -> dict:
    """The fastest element-bound rate of each band, over sources and dtypes."""
    d = d[~d.bytes_bound]
    return {int(b): round(float(p.elems_per_sm_clock.max()), 2) for b, p in d.groupby("band")}


def softmax_held_out(d: pd.DataFrame) -> dict:
    """The rows the rates were not read from against the shipped bound: per source, how many,
    and the fastest as a share of its band's rate (over 1: a row ran faster than the bound)."""
    from kit.predict.element_rates import SOFTMAX_ELEMS_PER_SM_CLOCK

    share = d.elems_per_sm_clock / d.band.map(SOFTMAX_ELEMS_PER_SM_CLOCK)
    return {src: {"n": int((d.source == src).sum()), "fastest_share_of_bound": round(float(share[d.source == src].max()), 3)}
            for src in sorted(d.source.unique())}


def tile_scores(d: pd.DataFrame, by: str = "op") -> dict:
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
    key = frame[by].to_numpy()
    return {k: {"n": int((key == k).sum()), "mape": round(float(np.mean(np.abs(ratio[key == k] - 1)) * 100), 1),
                "geo_bias": round(float(np.exp(np.mean(np.log(ratio[key == k])))), 3)}
            for k in sorted(set(key))}


if __name__ == "__main__":
    sys.exit(main())
