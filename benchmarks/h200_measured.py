"""Score the kit against the project's own H200 measurements (measurements/h200-2026-12-04 and
measurements/h200-2026-12-04-b, the second session's).

    python benchmarks/h200_measured.py [--dir FOLDER ...] [--skip-models] > out.json

--dir may be given more than once (default: both folders); where two folders measured the same
whole-model configuration, the later folder's row is scored (the second session remeasured the
bf16 rows with random token ids; the first's were all zero). The tile-MLP was never trained on
an H200 row, but the H200 is no unseen GPU here: the kernel-level constants IN_SAMPLE lists (and
the output's "in_sample" repeats) were read off these folders, the GEMM and attention curves that
price every aligned 16-bit GEMM and fused attention of the bf16 models among them, and two of
them off the whole-model steps' own kernels (the generic loop's rate; the softmax rates, also
read off the inference passes' softmax kernels). No whole-model step time was fitted, so the
whole-model figures score how those kernel times compose into a step, not how the kit carries
to a GPU it has no data of. Three parts:
* whole_model: each measured training step / inference pass (benchmarks/model_steps.py) beside
  kit.api.predict_model for the same model, dtype, batch and sequence on "h200" (train = forward,
  LM loss, backward, no optimizer, as measured). APE of the step time, and of the summed kernel
  time against the predicted kernel time; means per dtype and mode, and the share of measured
  steps inside the predicted p10-p90 band (band_coverage).
* ops: the op sweeps (`kit collect`), scored as a whole model uses them: the tile predictor's
  in-stream time (kit.workload.iteration.in_stream_ms: the isolated prediction less its dispatch
  floor, never under the roofline or 2 us) against each row's summed kernel time (kernel_ms),
  by dtype, op class, kernel-time bucket and, for GEMMs, whether both leading dimensions (n and
  k) are 16-byte aligned (cuBLAS takes its Hopper kernels only then; unaligned 16-bit GEMMs run
  legacy cutlass_75/80 tensor-op kernels at a fraction of the speed). Also the isolated
  prediction against the event-timed latency_ms, as `kit evaluate` scores NeuSight's rows.
* decode: the eager decode steps (benchmarks/decode_steps.py) beside kit.api.predict_model's
  decode step now: APE of the step time and of the kernel time. A row whose model's zoo decode
  step changed after its session (decode_steps.stale_reason: gpt2's and opt-1.3b's since
  83bfdaa, llama3-8b's static-cache step since 80b931a) timed another program than the one
  predicted now: it is listed with the reason ("stale") and left out of every figure.
* input_data: the configurations both folders measured, the second (random token ids) against
  the first (all-zero ids): the ratio of their kernel times, whole and per kernel kind (GEMM,
  fused attention, other) over the kernels both top-ten lists name (input_data_effect). Only
  the models whose rows are identical under zero ids (no learned positions: llama3-8b,
  qwen3-8b) moved; the power their GEMMs draw is in the data, not the shapes.
APE is |predicted - measured| / measured in percent; geo_bias is the geometric mean of
predicted / measured (below 1: the kit is fast).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # decode_steps, beside this script

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from kit.errors import KitError  # noqa: E402
from kit.ops import DTYPE_BYTES  # noqa: E402

DEFAULT_DIRS = (ROOT / "measurements" / "h200-2026-12-04", ROOT / "measurements" / "h200-2026-12-04-b")
GPU = "h200"
BUCKETS_MS = ((0.0, 0.02, "<20us"), (0.02, 0.1, "20-100us"), (0.1, 1.0, "0.1-1ms"), (1.0, math.inf, ">=1ms"))


def _stats(ape: pd.Series, ratio: pd.Series | None = None) -> dict:
    out = {"n": int(len(ape)), "mape": round(float(ape.mean()), 2),
           "median_ape": round(float(ape.median()), 2), "p90_ape": round(float(ape.quantile(0.9)), 2)}
    if ratio is not None:
        out["geo_bias"] = round(float(np.exp(np.log(ratio).mean())), 3)
    return out


def _folders(folder) -> list[Path]:
    return [Path(folder)] if isinstance(folder, (str, Path)) else [Path(f) for f in folder]


def _rows(folder, pattern: str) -> list[dict]:
    """The JSON-lines rows of every file matching pattern under each folder, in order
    (kit.data.records.read_jsonl)."""
    from kit.data.records import read_jsonl

    return [r for d in _folders(folder) for f in sorted(d.glob(pattern)) for r in read_jsonl(f)]


def _scored(r: dict, it) -> dict:
    """A measured row's prediction (an Iteration) and both APEs: step time and kernel time."""
    return {"predicted_ms": round(it.total_ms, 3), "predicted_kernel_ms": round(it.kernel_ms, 3),
            "ape": round(abs(it.total_ms - r["measured_ms"]) / r["measured_ms"] * 100, 2),
            "kernel_ape": round(abs(it.kernel_ms - r["measured_kernel_ms"]) / r["measured_kernel_ms"] * 100, 2)}


STEP_KEY = ("model", "dtype", "batch", "seq", "mode")

# Constants read off these folders' rows (module: what, from where), so the parts of this benchmark
# that meet them are in-sample for them. A figure from here is no unseen-GPU figure.
IN_SAMPLE = {
    "kit.predict.tensor_core.TENSOR_CORE_GEMM": "bf16/fp16/tf32 GEMM curves (-b's op sweeps, "
                                                "benchmarks/tensor_core_fit.py): ops, whole models",
    "kit.predict.tensor_core.FUSED_ATTENTION": "fused attention's forward curve (-b's attention "
                                               "sweep): whole models",
    "kit.workload.kernels.ATTENTION_BWD_SCALE": "attention backward / forward 2.8 (-b's attention "
                                                "sweep, median 2.79): training steps",
    "kit.predict.element_rates": "pow, GELU and softmax rates and the warp softmax's row latency "
                                 "(the vector sweeps and the inference passes' softmax kernels): "
                                 "ops, whole models",
    "kit.workload.kernel_times.GENERIC_LOOP_ELEMS_PER_SM_CLOCK": "the generic elementwise loop's "
                                                                 "rate (the whole-model steps' "
                                                                 "kernels): whole models",
    "kit.predict.features.UNALIGNED_SHARE_ON_H200": "unaligned 16-bit GEMMs' share of the peak "
                                                    "(the first folder's GEMMs): ops, whole models",
    "kit.predict.gemv": "the GEMV stream and STREAM_SHARE_MAX (both folders' GEMM rows, "
                        "benchmarks/gemv_fit.py): ops, decode steps",
    "kit.predict.norm_paths": "the two-kernel layer norm (the first folder's vector sweeps, "
                              "benchmarks/layernorm_paths.py): ops",
}


def model_steps(folder) -> dict:
    """Every measured model step under folder(s) (`model_steps.py`'s rows, errors left out), by
    STEP_KEY; a later folder's or file's row of the same configuration replaces the earlier."""
    latest = {}
    for r in (r for d in _folders(folder) for pattern in ("model_steps/*.jsonl", "[!m]*/model_steps*.jsonl")
              for r in _rows(d, pattern)):
        if "error" not in r:
            latest[tuple(r[k] for k in STEP_KEY)] = r
    return latest


def whole_model(folder: Path, limit: int | None = None) -> dict:
    """Predict every measured model step (see the module doc)."""
    from kit.api import predict_model

    rows = list(model_steps(folder).values())
    if limit is not None:
        rows = rows[:limit]
    out = []
    for r in rows:
        it = predict_model(r["model"], GPU, mode=r["mode"], batch=r["batch"], seq=r["seq"], dtype=r["dtype"])
        out.append({k: r[k] for k in ("model", "dtype", "batch", "seq", "mode", "measured_ms", "measured_kernel_ms")}
                   | _scored(r, it)
                   | {"band_ms": [round(it.total_p10_ms, 3), round(it.total_p90_ms, 3)],
                      "in_band": bool(it.total_p10_ms <= r["measured_ms"] <= it.total_p90_ms)})
    frame = pd.DataFrame(out)
    summary = []
    if len(frame):
        for (dtype, mode), part in frame.groupby(["dtype", "mode"], sort=True):
            s = _stats(part.ape, part.predicted_ms / part.measured_ms)
            summary.append({"dtype": dtype, "mode": mode, **s, "max_ape": round(float(part.ape.max()), 2),
                            "kernel_mape": round(float(part.kernel_ape.mean()), 2),
                            "band_coverage": round(float(part.in_band.mean()), 3)})
    return {"rows": out, "summary": summary}


KERNEL_KINDS = (("attention", ("flash", "sdpa", "fmha")), ("gemm", ("nvjet", "gemm", "cutlass", "xmma")))


def kernel_kind(name: str) -> str:
    """A profiled kernel's kind by its name: "attention" (fused attention), "gemm" or "other"."""
    low = name.lower()
    return next((kind for kind, marks in KERNEL_KINDS if any(m in low for m in marks)), "other")


def input_data_effect(earlier: Path, later: Path) -> dict:
    """The same whole-model configurations measured in two folders, later against earlier: the
    ratio of their step times (the timed runs), of their summed kernel times (the profiled run,
    another run of the same step: its kernel time can exceed the timed step's), and of the time
    of each kernel kind (kernel_kind) over the kernels both rows' top-ten lists name. The first
    H200 session ran every model on token ids of all zeros and the second on random ids (its
    README), on the same machine type, driver and torch: where a model's activations then
    differ, so do the bits its tensor cores switch, the power they draw and the clock the power
    cap leaves. Shapes are the same, so no kernel model that sees only shapes can tell the two
    apart."""
    a, b = model_steps(earlier), model_steps(later)
    rows = []
    for key in sorted(set(a) & set(b)):
        ra, rb = a[key], b[key]
        ka = {k["name"]: k["us"] for k in ra.get("top_kernels", [])}
        kb = {k["name"]: k["us"] for k in rb.get("top_kernels", [])}
        row = dict(zip(STEP_KEY, key))
        row["step_ms_ratio"] = round(rb["measured_ms"] / ra["measured_ms"], 3)
        row["kernel_ms_ratio"] = round(rb["measured_kernel_ms"] / ra["measured_kernel_ms"], 3)
        for kind, _ in (*KERNEL_KINDS, ("other", ())):
            both = [n for n in ka if n in kb and kernel_kind(n) == kind]
            if both:
                row[f"{kind}_ratio"] = round(sum(kb[n] for n in both) / sum(ka[n] for n in both), 3)
        rows.append(row)
    frame = pd.DataFrame(rows)
    by_model = []
    if len(frame):
        for model, part in frame.groupby("model", sort=True):
            entry = {"model": model, "configs": int(len(part))}
            for col in [c for c in frame.columns if c.endswith("_ratio")]:
                vals = part[col].dropna()
                if len(vals):
                    entry[col] = [round(float(vals.min()), 3), round(float(vals.max()), 3)]
            by_model.append(entry)
    return {"earlier": earlier.name, "later": later.name, "rows": rows, "by_model": by_model}


def op_rows(folder: Path) -> pd.DataFrame:
    """Every op-sweep row with the tile predictor's isolated and in-stream times and the roofline."""
    from kit.data.records import load_measurements
    from kit.hardware import get_gpu
    from kit.predict import get_predictor
    from kit.predict.evaluate import _test_frame, predict_rows
    from kit.workload.iteration import in_stream_ms, isolation_floor_ms

    files = [f for d in _folders(folder) for f in sorted([*d.glob("*/*.csv.gz"), *d.glob("*/*.csv")])]
    if not files:
        raise KitError(f"no measurement CSVs under {', '.join(map(str, _folders(folder)))}")
    frames = []
    for f in files:
        d = load_measurements(f)
        d["file"] = f.name
        frames.append(d)
    frame = _test_frame(pd.concat(frames, ignore_index=True))
    tile, roof = get_predictor("tile"), get_predictor("roofline")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pred = predict_rows(frame, {"tile": tile, "roofline": roof})
    t = pred[pred.predictor == "tile"].set_index("row").sort_index()
    r = pred[pred.predictor == "roofline"].set_index("row").sort_index()
    floor = isolation_floor_ms(tile, get_gpu(GPU))
    frame["isolated_ms"] = t.predicted_ms.to_numpy()
    frame["roofline_ms"] = r.predicted_ms.to_numpy()
    frame["in_stream_ms"] = in_stream_ms(frame.isolated_ms.to_numpy(), frame.roofline_ms.to_numpy(), floor)
    size = frame.dtype.map(DTYPE_BYTES).fillna(4)
    n, k = frame.n.fillna(0), frame.k.fillna(0)
    frame["aligned"] = ((n * size) % 16 == 0) & ((k * size) % 16 == 0)
    frame["floor_ms"] = floor
    return frame


def ops(frame: pd.DataFrame) -> dict:
    f = frame[frame.kernel_ms.notna() & (frame.kernel_ms > 0)].copy()
    f["ape"] = (f.in_stream_ms - f.kernel_ms).abs() / f.kernel_ms * 100
    f["ratio"] = f.in_stream_ms / f.kernel_ms
    f["bucket"] = pd.cut(f.kernel_ms, [b[0] for b in BUCKETS_MS] + [math.inf], right=False,
                         labels=[b[2] for b in BUCKETS_MS])
    in_stream = []
    for (cls, dtype, bucket), part in f.groupby(["op_class", "dtype", "bucket"], sort=True, observed=True):
        in_stream.append({"op_class": cls, "dtype": dtype, "kernel_time": bucket, **_stats(part.ape, part.ratio)})
    gemm = []
    g = f[(f.op_class == "gemm") & (f.kernel_ms >= 0.02)]
    for (dtype, aligned), part in g.groupby(["dtype", "aligned"], sort=True):
        gemm.append({"dtype": dtype, "aligned_16B": bool(aligned), **_stats(part.ape, part.ratio)})
    lat = frame.copy()
    lat["ape"] = (lat.isolated_ms - lat.latency_ms).abs() / lat.latency_ms * 100
    isolated = [{"op_class": c, "dtype": d, **_stats(p.ape, p.isolated_ms / p.latency_ms)}
                for (c, d), p in lat.groupby(["op_class", "dtype"], sort=True)]
    return {"rows": int(len(frame)), "floor_ms": round(float(frame.floor_ms.iloc[0]), 4),
            "in_stream_vs_kernel_ms": in_stream, "gemm_over_20us_by_alignment": gemm,
            "isolated_vs_latency_ms": isolated}


def session_date(folder: Path) -> str | None:
    """When a measurement folder's session ran (its provenance.json's date, UTC), None if unknown."""
    path = Path(folder) / "session" / "provenance" / "provenance.json"
    try:
        return json.loads(path.read_text()).get("date")
    except (OSError, ValueError):
        return None


def decode(folder: Path) -> dict:
    """Each measured decode step beside the kit's prediction now (the rows also keep the one
    made on the H200 machine when they were measured: predicted_then_ms). A stale row (its
    model's step changed since: decode_steps.stale_reason) goes to "stale", with the reason,
    and into no figure: it timed another program."""
    from decode_steps import stale_reason

    from kit.api import predict_model

    out, stale = [], []
    for d in _folders(folder):
        when = session_date(d)
        for r in (r for r in _rows(d, "session/decode_steps*.jsonl") if "measured_ms" in r):
            reason = stale_reason(r, when)
            if reason:
                stale.append({k: r.get(k) for k in ("model", "batch", "context", "kv_cache", "measured_ms")}
                             | {"reason": reason})
                continue
            it = predict_model(r["model"], GPU, mode="decode", batch=r["batch"], seq=r["context"],
                               dtype=r["dtype"], kv_cache=r.get("kv_cache", "static"))
            out.append({k: r[k] for k in ("model", "batch", "context", "kv_cache", "measured_ms", "measured_kernel_ms")}
                       | _scored(r, it) | {"predicted_then_ms": r.get("predicted_ms")})
    frame = pd.DataFrame(out)
    summary = []
    if len(frame):
        for (model, kind), part in frame.groupby(["model", "kv_cache"], sort=True):
            summary.append({"model": model, "kv_cache": kind, "n": int(len(part)),
                            "mape": round(float(part.ape.mean()), 2),
                            "kernel_mape": round(float(part.kernel_ape.mean()), 2),
                            "kernel_geo_bias": _stats(part.kernel_ape, part.predicted_kernel_ms
                                                      / part.measured_kernel_ms)["geo_bias"]})
    return {"rows": out, "summary": summary, "stale": stale}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", action="append", default=None,
                    help="a measurement folder (repeat for more; default: both H200 folders)")
    ap.add_argument("--skip-models", action="store_true", help="leave out the whole-model part (the slow one)")
    args = ap.parse_args(argv)
    folder = [Path(d) for d in (args.dir or DEFAULT_DIRS)]
    try:
        for d in folder:
            if not d.is_dir():
                raise KitError(f"measurement folder not found: {d}")
        t0 = time.perf_counter()
        out = {"source": [str(d.relative_to(ROOT) if d.is_relative_to(ROOT) else d) for d in folder], "gpu": GPU,
               "in_sample": IN_SAMPLE,
               "ops": ops(op_rows(folder)), "decode": decode(folder)}
        if not args.skip_models:
            out["whole_model"] = whole_model(folder)
        if len(folder) >= 2:
            out["input_data"] = input_data_effect(folder[0], folder[-1])
        out["seconds"] = round(time.perf_counter() - t0, 1)
    except KitError as e:
        print(f"h200_measured: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
