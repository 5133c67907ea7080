"""Measure embedding bags with controlled index distributions, into a CSV that loses nothing.

Backends: "torch" (nn.EmbeddingBag, one per table, cpu or cuda) and "fbgemm" (FBGEMM's fused
table-batched embedding, cuda only, used when fbgemm_gpu is installed; "auto" picks it then).
Each config is (batch, rows, dim, pooling, tables, distribution, mode, dtype, pass): `tables`
equal tables each look up `batch` bags of exactly `pooling` indices drawn from the distribution
(seeded). pass "forward" times the lookup; pass "backward" times backward + optimizer step only
(its forward runs before the timed region, each repeat).
The distribution column holds its spec (Distribution.spec: "zipf:1.05", "reuse:0.3,0.2"), which
loses nothing: distinct distributions get distinct rows and resume keys, and the correction fitter
reads it back. Files from before hold describe() labels; their zipf and uniform rows still resume.

Timing as the op collector's (kit.data.collect): mean of the fastest fifth of `repeats` calls
after `warmup`. Each call reads a fresh index set (warmup + repeats sets are drawn up front, at
most INDEX_BUDGET bytes of them, and cycled), so that repeats do not find the rows the last one
touched in L2; on CUDA the L2 is also flushed before each timed call (l2_flush, as
kit.data.collect), as in training, where a step's other work evicts it. unique_rows is the mean
over the sets. fbgemm tables are held in the row's dtype (weights_precision) and return it
(output_dtype). Each finished row is appended with one write, flush and fsync; a resumed run
drops an unfinished last line and skips configs already in the file. FILE.meta.json beside it
records the device, versions and settings of each run (kit.data.collect.Meta).
"""
from __future__ import annotations

import csv
import io
import itertools
import os
from pathlib import Path

import numpy as np

from kit.data.collect import (Meta, _now, is_fatal_cuda_error, l2_flusher, summarise_ms, time_cpu,
                              time_cuda)
from kit.data.records import _fsync_dir, repair
from kit.embedding.distributions import parse_distribution
from kit.errors import KitError

COLUMNS = ["backend", "device", "device_name", "pass", "optimizer", "mode", "dtype", "batch", "rows",
           "dim", "pooling", "tables", "distribution", "unique_rows", "lookups", "latency_ms",
           "latency_min_ms", "repeats", "torch_version"]
KEY = ["backend", "device_name", "pass", "optimizer", "mode", "dtype", "batch", "rows", "dim",
       "pooling", "tables", "distribution"]
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
INDEX_BUDGET = 1 << 30  # bytes of pre-drawn index sets at most (int64 indices)


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
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)
    except ImportError:
        return None
    return (EmbOptimType, EmbeddingLocation, PoolingMode, ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen, SparseType)


def _precision(dtype: str, sparse_type) -> dict:
    """fbgemm's TBE keyword arguments for a row dtype: tables held in it and output in it."""
    t = {"fp32": sparse_type.FP32, "fp16": sparse_type.FP16, "bf16": sparse_type.BF16}[dtype]
    return {"weights_precision": t, "output_dtype": t}


def n_index_sets(cfg: dict, wanted: int) -> int:
    """How many index sets to draw: one per call (`wanted`), at most INDEX_BUDGET bytes of them."""
    per_set = 8 * cfg["batch"] * cfg["pooling"] * cfg["tables"]
    return max(1, min(wanted, INDEX_BUDGET // max(per_set, 1)))


def _inputs(cfg, device):
    """(index sets, offsets, mean unique rows): cfg["_sets"] sets (default 1), each a list of one
    index tensor per table, drawn from one seeded stream."""
    import torch

    rng = np.random.default_rng(1234 + cfg["rows"] + cfg["batch"])
    dist = parse_distribution(cfg["_dist"])
    n = cfg["batch"] * cfg["pooling"]
    sets, uniques = [], []
    for _ in range(int(cfg.get("_sets", 1))):
        idx = [dist.sample(n, cfg["rows"], rng) for _ in range(cfg["tables"])]
        uniques += [np.unique(i).size for i in idx]
        sets.append([torch.from_numpy(i).to(device) for i in idx])
    offsets = torch.arange(0, n + 1, cfg["pooling"], dtype=torch.int64, device=device)
    return sets, offsets, float(np.mean(uniques))


class _Rotor:
    """The index set of the next call: advance() (outside the timed region) moves to the next."""

    def __init__(self, sets):
        self.sets, self.i = sets, 0

    def advance(self):
        self.i = (self.i + 1) % len(self.sets)

    @property
    def cur(self):
        return self.sets[self.i]


def _torch_call(cfg, device):
    """(call, unique rows, before): before() runs outside the timed region before each call:
    it moves to the next index set and, for a backward row, runs the forward."""
    import torch

    if cfg["pass"] == "backward" and cfg["optimizer"] != "sgd":
        raise KitError(f"optimizer {cfg['optimizer']!r} needs the fbgemm backend; torch does sgd")
    dtype = getattr(torch, TORCH_DTYPES[cfg["dtype"]])
    bags = [torch.nn.EmbeddingBag(cfg["rows"], cfg["dim"], mode=cfg["mode"], sparse=True,
                                  dtype=dtype, device=device) for _ in range(cfg["tables"])]
    sets, offsets, unique = _inputs(cfg, device)
    rotor = _Rotor(sets)
    if cfg["pass"] == "forward":
        def call():
            with torch.no_grad():
                for bag, i in zip(bags, rotor.cur):
                    bag(i, offsets[:-1])
        return call, unique, rotor.advance
    opt = torch.optim.SGD([p for b in bags for p in b.parameters()], lr=0.01)
    outs: list = []
    grad = torch.ones(cfg["batch"], cfg["dim"], dtype=dtype, device=device)

    def before():
        rotor.advance()
        outs[:] = [bag(i, offsets[:-1]) for bag, i in zip(bags, rotor.cur)]

    def call():  # backward + update only: the forward ran in before()
        for out in outs:
            out.backward(grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
        outs.clear()
    return call, unique, before


def _fbgemm_call(cfg, device):
    import torch

    fb = _fbgemm()
    if fb is None:
        raise KitError("the fbgemm backend needs fbgemm_gpu installed (pip install fbgemm-gpu)")
    if device != "cuda":
        raise KitError("the fbgemm backend runs on cuda only")
    EmbOptimType, EmbeddingLocation, PoolingMode, ComputeDevice, TBE, SparseType = fb
    optim = {"sgd": EmbOptimType.EXACT_SGD, "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
             "": EmbOptimType.EXACT_SGD}[cfg["optimizer"]]
    specs = [(cfg["rows"], cfg["dim"], EmbeddingLocation.DEVICE, ComputeDevice.CUDA)] * cfg["tables"]
    tbe = TBE(specs, optimizer=optim, learning_rate=0.01,
              pooling_mode=PoolingMode.SUM if cfg["mode"] == "sum" else PoolingMode.MEAN,
              **_precision(cfg["dtype"], SparseType))
    sets, _, unique = _inputs(cfg, device)
    rotor = _Rotor([torch.cat(ind) for ind in sets])
    n = cfg["batch"] * cfg["pooling"]
    offsets = torch.arange(0, n * cfg["tables"] + 1, cfg["pooling"], dtype=torch.int64, device=device)
    if cfg["pass"] == "forward":
        def call():
            with torch.no_grad():
                tbe(rotor.cur, offsets)
        return call, unique, rotor.advance
    dtype = getattr(torch, TORCH_DTYPES[cfg["dtype"]])
    grad = torch.ones(cfg["batch"], cfg["dim"] * cfg["tables"], dtype=dtype, device=device)
    outs: list = []

    def before():
        rotor.advance()
        outs[:] = [tbe(rotor.cur, offsets)]

    def call():  # the fused backward applies the optimizer; the forward ran in before()
        outs.pop().backward(grad)
    return call, unique, before


def _format(row: dict) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(
        [repr(float(row[c])) if isinstance(row[c], float) else str(row[c]) for c in COLUMNS])
    return buf.getvalue()


def _existing_keys(path: Path) -> set[tuple]:
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != COLUMNS:
                raise KitError(f"{path} is not an embedding measurement CSV (its header differs from "
                               f"{', '.join(COLUMNS[:5])}, ...); choose another --out")
            return {tuple(_spec(r[k]) if k == "distribution" else r[k] for k in KEY) for r in reader}
    except UnicodeDecodeError:
        raise KitError(f"{path} is not an embedding measurement CSV (it is not UTF-8 text); "
                       "choose another --out") from None


def _spec(label: str) -> str:
    """The spec of a stored distribution: itself, or an older file's zipf(1.05) label as its spec
    (a reuse or index-tensor label is kept as it is: it matches no spec, so those rows re-run)."""
    try:
        return parse_distribution(label).spec()
    except KitError:
        return label


def collect(configs: list[dict], out: str | Path, device: str = "cpu", backend: str = "torch",
            repeats: int = 10, warmup: int = 2, resume: bool = False, progress=None,
            l2_flush: bool = True) -> dict:
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
    if backend == "fbgemm" and _fbgemm() is None:  # before --out is created: nothing measured
        raise KitError("the fbgemm backend needs fbgemm_gpu installed (pip install fbgemm-gpu)")
    if backend == "fbgemm" and device != "cuda":
        raise KitError("the fbgemm backend runs on cuda only")
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
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KitError(f"cannot write {out}: {e.strerror or e}; choose another --out") from None
    timer = time_cuda if device == "cuda" else time_cpu
    flush, policy = l2_flusher(device, l2_flush)
    fbgemm_version = None
    if backend == "fbgemm":
        try:
            import fbgemm_gpu

            fbgemm_version = getattr(fbgemm_gpu, "__version__", None)
        except ImportError:
            pass
    meta = Meta(out, {"started": _now(), "finished": None, "status": "running", "device": device,
                      "device_name": device_name, "backend": backend, "fbgemm_version": fbgemm_version,
                      "torch_version": torch.__version__,
                      "cuda_version": torch.version.cuda if device == "cuda" else None,
                      "settings": {"repeats": repeats, "warmup": warmup, **policy,
                                   "indices": "a fresh index set each call (cycled)",
                                   "backward": "backward + optimizer step only; the forward runs "
                                               "outside the timed region"}}, exists)
    meta.write()
    written, skipped, failed = 0, 0, []
    try:
        f = open(out, "a", encoding="utf-8", newline="")
    except OSError as e:
        raise KitError(f"cannot write {out}: {e.strerror or e}; choose another --out") from None
    with f:
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
                sized = {**cfg, "_sets": n_index_sets(cfg, warmup + repeats)}
                call, unique, before = (_fbgemm_call if backend == "fbgemm" else _torch_call)(sized, device)
                times = timer(call, warmup, repeats, flush=flush, before=before)
                del call, before
            except KitError:
                raise
            except (RuntimeError, ValueError, MemoryError) as e:  # e.g. out of memory: keep going
                failed.append({**row, "error": str(e).splitlines()[0][:200]})
                if device == "cuda" and is_fatal_cuda_error(e):  # the context is lost: stop
                    break
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
    meta.run.update(finished=_now(), status="done", written=written, skipped=skipped,
                    failed=len(failed))
    meta.write()
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
