"""Measure embedding bags with controlled index distributions, into a CSV that loses nothing.

Backends: "torch" (nn.EmbeddingBag, one per table, cpu or cuda) and "fbgemm" (FBGEMM's fused
table-batched embedding, cuda only, used when fbgemm_gpu is installed; "auto" picks it then).
Each config is (batch, rows, dim, pooling, tables, distribution, mode, dtype, pass): `tables`
equal tables each look up `batch` bags of exactly `pooling` indices drawn from the distribution
(seeded). pass "forward" times the lookup; pass "backward" times backward + optimizer step.
The distribution column holds its spec (Distribution.spec: "zipf:1.05", "reuse:0.3,0.2"), which
loses nothing: distinct distributions get distinct rows and resume keys, and the correction fitter
reads it back. Files from before hold describe() labels; their zipf and uniform rows still resume.

Timing as the op collector's (kit.data.collect): mean of the fastest fifth of `repeats` calls
after `warmup`. Each finished row is appended with one write, flush and fsync; a resumed run
drops an unfinished last line and skips configs already in the file.
"""
from __future__ import annotations

import csv
import io
import itertools
import os
from pathlib import Path

import numpy as np

from kit.data.collect import summarise_ms, time_cpu, time_cuda
from kit.data.records import _fsync_dir, repair
from kit.embedding.distributions import parse_distribution
from kit.errors import KitError

COLUMNS = ["backend", "device", "device_name", "pass", "optimizer", "mode", "dtype", "batch", "rows",
           "dim", "pooling", "tables", "distribution", "unique_rows", "lookups", "latency_ms",
           "latency_min_ms", "repeats", "torch_version"]
KEY = ["backend", "device_name", "pass", "optimizer", "mode", "dtype", "batch", "rows", "dim",
       "pooling", "tables", "distribution"]
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def grid(batch, rows, dim, pooling, distributions, tables=(1,), modes=("sum",), dtypes=("fp32",),
         passes=("forward",), optimizer="sgd") -> list[dict]:
    """Every combination, as config dicts."""
    out = []
    for b, e, d, l, dist, t, mo, dt, ps in itertools.product(batch, rows, dim, pooling, distributions,
                                                              tables, modes, dtypes, passes):
        out.append({"batch": int(b), "rows": int(e), "dim": int(d), "pooling": int(l), "tables": int(t),
                    "distribution": parse_distribution(dist).spec(), "_dist": dist, "mode": mo,
                    "dtype": dt, "pass": ps, "optimizer": optimizer if ps == "backward" else ""})
    return out


def _fbgemm():
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)
    except ImportError:
        return None
    return EmbOptimType, EmbeddingLocation, PoolingMode, ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen


def _inputs(cfg, device):
    import torch

    rng = np.random.default_rng(1234 + cfg["rows"] + cfg["batch"])
    dist = parse_distribution(cfg["_dist"])
    n = cfg["batch"] * cfg["pooling"]
    idx = [dist.sample(n, cfg["rows"], rng) for _ in range(cfg["tables"])]
    unique = float(np.mean([np.unique(i).size for i in idx]))
    ind = [torch.from_numpy(i).to(device) for i in idx]
    offsets = torch.arange(0, n + 1, cfg["pooling"], dtype=torch.int64, device=device)
    return ind, offsets, unique


def _torch_call(cfg, device):
    import torch

    if cfg["pass"] == "backward" and cfg["optimizer"] != "sgd":
        raise KitError(f"optimizer {cfg['optimizer']!r} needs the fbgemm backend; torch does sgd")
    dtype = getattr(torch, TORCH_DTYPES[cfg["dtype"]])
    bags = [torch.nn.EmbeddingBag(cfg["rows"], cfg["dim"], mode=cfg["mode"], sparse=True,
                                  dtype=dtype, device=device) for _ in range(cfg["tables"])]
    ind, offsets, unique = _inputs(cfg, device)
    if cfg["pass"] == "forward":
        def call():
            with torch.no_grad():
                for bag, i in zip(bags, ind):
                    bag(i, offsets[:-1])
        return call, unique
    opt = torch.optim.SGD([p for b in bags for p in b.parameters()], lr=0.01)
    outs = [bag(i, offsets[:-1]) for bag, i in zip(bags, ind)]
    grad = torch.ones_like(outs[0])

    def call():
        for bag, i in zip(bags, ind):
            bag(i, offsets[:-1]).backward(grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return call, unique


def _fbgemm_call(cfg, device):
    import torch

    fb = _fbgemm()
    if fb is None:
        raise KitError("the fbgemm backend needs fbgemm_gpu installed (pip install fbgemm-gpu)")
    if device != "cuda":
        raise KitError("the fbgemm backend runs on cuda only")
    EmbOptimType, EmbeddingLocation, PoolingMode, ComputeDevice, TBE = fb
    optim = {"sgd": EmbOptimType.EXACT_SGD, "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
             "": EmbOptimType.EXACT_SGD}[cfg["optimizer"]]
    specs = [(cfg["rows"], cfg["dim"], EmbeddingLocation.DEVICE, ComputeDevice.CUDA)] * cfg["tables"]
    tbe = TBE(specs, optimizer=optim, learning_rate=0.01,
              pooling_mode=PoolingMode.SUM if cfg["mode"] == "sum" else PoolingMode.MEAN)
    ind, _, unique = _inputs(cfg, device)
    n = cfg["batch"] * cfg["pooling"]
    indices = torch.cat(ind)
    offsets = torch.arange(0, n * cfg["tables"] + 1, cfg["pooling"], dtype=torch.int64, device=device)
    if cfg["pass"] == "forward":
        def call():
            with torch.no_grad():
                tbe(indices, offsets)
        return call, unique
    grad = torch.ones(cfg["batch"], cfg["dim"] * cfg["tables"], device=device)

    def call():
        tbe(indices, offsets).backward(grad)  # fused backward applies the optimizer
    return call, unique


def _format(row: dict) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(
        [repr(float(row[c])) if isinstance(row[c], float) else str(row[c]) for c in COLUMNS])
    return buf.getvalue()


def _existing_keys(path: Path) -> set[tuple]:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != COLUMNS:
            raise KitError(f"{path} is not an embedding measurement CSV (its header differs from "
                           f"{', '.join(COLUMNS[:5])}, ...); choose another --out")
        return {tuple(_spec(r[k]) if k == "distribution" else r[k] for k in KEY) for r in reader}


def _spec(label: str) -> str:
    """The spec of a stored distribution: itself, or an older file's zipf(1.05) label as its spec
    (a reuse or index-tensor label is kept as it is: it matches no spec, so those rows re-run)."""
    try:
        return parse_distribution(label).spec()
    except KitError:
        return label


def collect(configs: list[dict], out: str | Path, device: str = "cpu", backend: str = "torch",
            repeats: int = 10, warmup: int = 2, resume: bool = False, progress=None) -> dict:
    """Measure every config, appending one fsynced CSV row each; returns a summary."""
    import torch

    out = Path(out)
    if device not in ("cpu", "cuda"):
        raise KitError(f"device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise KitError("device cuda asked for, but torch sees no CUDA GPU here")
    if backend == "auto":
        backend = "fbgemm" if device == "cuda" and _fbgemm() is not None else "torch"
    if backend not in ("torch", "fbgemm"):
        raise KitError(f"backend must be torch, fbgemm or auto, got {backend!r}")
    if repeats < 1 or warmup < 0:
        raise KitError("repeats must be >= 1 and warmup >= 0")
    if not configs:
        raise KitError("nothing to measure: the grid is empty (no distribution, mode or dtype given?)")
    for cfg in configs:
        if cfg["dtype"] not in TORCH_DTYPES:
            raise KitError(f"dtype {cfg['dtype']!r} not measurable; choose one of {', '.join(TORCH_DTYPES)}")
        if cfg["mode"] not in ("sum", "mean"):
            raise KitError(f"mode {cfg['mode']!r} not measurable; choose sum or mean")
    if out.is_dir():
        raise KitError(f"--out {out} is a directory; give a CSV file name")
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    exists = out.is_file() and out.stat().st_size > 0
    if exists and not resume:
        raise KitError(f"{out} already exists; pass --resume to carry on with it, or choose another --out")
    done = set()
    if exists:
        repair(out)
        done = _existing_keys(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    timer = time_cuda if device == "cuda" else time_cpu
    written, skipped, failed = 0, 0, []
    with open(out, "a", encoding="utf-8", newline="") as f:
        if out.stat().st_size == 0:
            f.write(",".join(COLUMNS) + "\n")
            f.flush()
            os.fsync(f.fileno())
            _fsync_dir(out.parent)
        for cfg in configs:
            row = {**{k: v for k, v in cfg.items() if not k.startswith("_")}, "backend": backend,
                   "device": device, "device_name": device_name}
            key = tuple(str(row[k]) for k in KEY)
            if key in done:
                skipped += 1
                continue
            try:
                call, unique = (_fbgemm_call if backend == "fbgemm" else _torch_call)(cfg, device)
                times = timer(call, warmup, repeats)
            except KitError:
                raise
            except (RuntimeError, ValueError, MemoryError) as e:  # e.g. out of memory: keep going
                failed.append({**row, "error": str(e).splitlines()[0][:200]})
                continue
            row.update(unique_rows=unique, lookups=cfg["batch"] * cfg["pooling"] * cfg["tables"],
                       latency_ms=summarise_ms(times), latency_min_ms=float(min(times)),
                       repeats=repeats, torch_version=torch.__version__)
            f.write(_format(row))
            f.flush()
            os.fsync(f.fileno())
            done.add(key)
            written += 1
            if progress:
                progress(row)
    if failed and not written:  # every config tried failed: an error, not "0 rows written"
        if not exists:  # the header alone would make the next run ask for --resume
            out.unlink(missing_ok=True)
        first = failed[0]
        raise KitError(f"every measurement failed ({len(failed)}); nothing was written to {out}. "
                       f"First: batch {first['batch']} rows {first['rows']} dim {first['dim']}: "
                       f"{first['error']}")
    return {"out": str(out), "backend": backend, "device": device, "device_name": device_name,
            "written": written, "skipped": skipped, "failed": failed}


def load(path: str | Path):
    """A collector CSV as a DataFrame (KitError when it is not one)."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise KitError(f"embedding measurement file not found: {path}")
    _existing_keys(path)
    return pd.read_csv(path, keep_default_na=False, na_values=[""])
