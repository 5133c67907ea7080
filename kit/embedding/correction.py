"""A learned correction on top of the analytic embedding cost, fit from collector measurements.

    log(measured_ms / analytic_ms) ≈ w · x,   x = [1, log2 lookups, log2 row bytes, hit rate,
                                                 backward, log2 tables]

a ridge regression (closed form). It corrects what the analytic model leaves out (gather
efficiency, latency hiding, kernel choice) for the GPU it was measured on. None ships by default;
reproduce one with

    .venv/bin/python -m kit.embedding.correction MEASURED.csv --gpu h100-sxm --out corr.json

and pass `correction=Correction.load("corr.json")` to lookup_cost on that GPU (another GPU is
refused). The JSON records what it was trained on (file, rows, GPU, backends) and its error before
and after.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kit.errors import KitError
from kit.whole_file import replace_file

FEATURES = ("bias", "log2_lookups", "log2_row_bytes", "hit_rate", "backward", "log2_tables")
MAX_LOG_FACTOR = math.log(10.0)  # never scale the analytic time by more than 10x either way


def features(parts: dict, tables, backward: bool) -> np.ndarray:
    row_bytes = float(np.mean([t.row_bytes for t in tables]))
    return np.array([1.0, math.log2(max(parts["lookups"], 1.0)), math.log2(max(row_bytes, 1.0)),
                     float(parts["hit_rate"]), 1.0 if backward else 0.0, math.log2(len(tables))])


@dataclass
class Correction:
    weights: tuple[float, ...]
    gpu: str | None = None
    trained_on: dict = field(default_factory=dict)

    def factor(self, parts, tables, batch, gpu, backward) -> float:
        """exp(w · x), clamped to 10x either way. The weights are the GPU's they were fit on
        (gather efficiency, latency hiding, kernel choice): a lookup on another GPU is refused
        rather than scaled by them (an H100's correction had silently scaled an A100's lookups)."""
        fit_on = [_catalog_key(g) for g in (self.gpu or "").split(",") if g.strip()]
        key = getattr(gpu, "key", gpu)
        if fit_on and key not in fit_on:
            raise KitError(f"this embedding correction was fit on {', '.join(fit_on)}, not {key}: "
                           f"fit one from measurements on {key} (kit.embedding.correction), or "
                           f"predict without a correction")
        z = float(np.dot(self.weights, features(parts, tables, backward)))
        return math.exp(max(-MAX_LOG_FACTOR, min(MAX_LOG_FACTOR, z)))

    def save(self, path) -> None:
        """Written whole or not at all: a failed write leaves an earlier file at path as it was."""
        replace_file(path, json.dumps({"features": FEATURES, "weights": list(self.weights),
                                       "gpu": self.gpu, "trained_on": self.trained_on}, indent=2).encode())

    @classmethod
    def load(cls, path) -> "Correction":
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise KitError(f"correction file not found: {path}") from None
        except json.JSONDecodeError as e:
            raise KitError(f"correction file {path} is not valid JSON: {e.msg}") from None
        except UnicodeDecodeError:
            raise KitError(f"correction file {path} is not UTF-8 text (not a correction's JSON)") from None
        except OSError as e:  # a directory, no permission
            raise KitError(f"cannot read correction file {path}: {e.strerror or e}") from None
        except RecursionError:  # json's decoder on arrays nested ~1,000 deep
            raise KitError(f"correction file {path} is not valid JSON: nested too deep") from None
        # a JSON list or string had ended in an AttributeError, weights ["a", ...] in a ValueError,
        # and NaN weights had been kept: factor()'s clamp then read NaN as +10x (min(10, nan) is 10)
        weights = d.get("weights") if isinstance(d, dict) else None
        # features 5 had been a TypeError ('int' object is not iterable)
        if not isinstance(d, dict) or not isinstance(d.get("features"), list) \
                or tuple(d["features"]) != FEATURES or not isinstance(weights, list) or len(weights) != len(FEATURES):
            raise KitError(f"{path}: not an embedding correction (features must be {', '.join(FEATURES)}, "
                           f"with one weight each)")
        # a weight of 400 digits (JSON's ints are unbounded) had been an OverflowError in isfinite
        if not all(isinstance(w, (int, float)) and not isinstance(w, bool) and abs(w) < 1e300
                   and math.isfinite(w) for w in weights):
            raise KitError(f"{path}: the correction's weights must be finite numbers, got {weights!r}")
        if d.get("gpu") is not None and not isinstance(d["gpu"], str):
            raise KitError(f"{path}: the correction's gpu must be the catalog key(s) it was fit on, "
                           f"comma-separated, or null; got {d['gpu']!r}")
        return cls(tuple(float(w) for w in weights), d.get("gpu"), d.get("trained_on") or {})


def _catalog_key(name: str) -> str:
    """A recorded GPU's catalog key: fit_correction records keys, but a correction written by
    hand (or made in code) may name an alias, "h100" or "H100-SXM" for h100-sxm, which had been
    refused on the very GPU it named ("fit on h100, not h100-sxm"). A name the catalog does not
    know (a --gpu-file GPU not loaded now) stays as written."""
    from kit.hardware import get_gpu

    try:
        return get_gpu(name.strip()).key
    except KitError:
        return name.strip()


def _analytic(row, gpu):
    """The analytic cost of one collector row; its distribution is the stored spec (or an older
    file's zipf/uniform label)."""
    from kit.embedding.cost import Table, lookup_cost
    from kit.embedding.distributions import parse_distribution

    t = Table(rows=int(row["rows"]), dim=int(row["dim"]), pooling=float(row["pooling"]),
              dtype=str(row["dtype"]))
    tables = [t] * int(row["tables"])
    backward = row["pass"] == "backward"
    # an empty optimizer is sgd (the collector's backends time it so); load() reads the empty cell
    # as NaN, which `or "sgd"` kept: "unknown optimizer 'nan'"
    opt = row["optimizer"] if isinstance(row["optimizer"], str) and row["optimizer"] else "sgd"
    r = lookup_cost(tables, int(row["batch"]), gpu, parse_distribution(str(row["distribution"])),
                    backward=backward, optimizer=opt if backward else "sgd",
                    mode=str(row["mode"]), fused=row["backend"] == "fbgemm")
    return r, tables, backward


def fit_correction(data, gpu=None, ridge: float = 1e-2) -> Correction:
    """Fit from a collector CSV path or DataFrame. gpu: the catalog GPU the rows ran on (needed
    when device_name is not a catalog name, e.g. CPU rows used for testing)."""
    from kit.embedding.measured_rows import load
    from kit.hardware import get_gpu

    df = load(data) if not hasattr(data, "columns") else data
    if len(df) < len(FEATURES):
        raise KitError(f"need at least {len(FEATURES)} measurements to fit a correction, got {len(df)}")
    X, y = [], []
    gpus = set()
    src = str(data) if not hasattr(data, "columns") else "DataFrame"
    for i, row in enumerate(df.to_dict("records")):
        name = gpu or row["device_name"]
        if name == "cpu":
            raise KitError("these measurements ran on the CPU; pass the GPU to fit against (gpu=...)")
        g = get_gpu(name)
        gpus.add(g.key)
        try:
            r, tables, backward = _analytic(row, g)
        except KitError as e:
            raise KitError(f"{src} row {i + 1}: {e}") from None
        X.append(features(r.parts, tables, backward))
        y.append(math.log(float(row["latency_ms"]) / r.time_ms))
    X, y = np.array(X), np.array(y)
    A = X.T @ X + ridge * np.diag([0.0] + [1.0] * (len(FEATURES) - 1))
    w = np.linalg.solve(A, X.T @ y)
    before = float(np.mean(np.abs(np.expm1(y))))
    after = float(np.mean(np.abs(np.expm1(y - X @ w))))
    return Correction(tuple(float(v) for v in w), gpu=",".join(sorted(gpus)),
                      trained_on={"source": src, "rows": int(len(df)),
                                  "backends": sorted(set(map(str, df["backend"]))),
                                  "mean_abs_rel_err_before": before, "mean_abs_rel_err_after": after})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="fit an embedding cost correction from collector data")
    ap.add_argument("csv")
    ap.add_argument("--gpu", default=None, help="GPU the rows ran on (default: their device_name)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        c = fit_correction(args.csv, gpu=args.gpu)
        c.save(args.out)
    except KitError as e:  # the kit's CLI contract: one line, exit 2
        print(f"kit: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"kit: error: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(json.dumps(c.trained_on, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
