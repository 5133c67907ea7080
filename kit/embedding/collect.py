"""Measure embedding bags with controlled index distributions, into a CSV that loses nothing.

Backends: "torch" (nn.EmbeddingBag, one per table, cpu or cuda) and "fbgemm" (FBGEMM's fused
table-batched embedding, cuda only, used when fbgemm_gpu is installed; "auto" picks it then).
Each config is (batch, rows, dim, pooling, tables, distribution, mode, dtype, pass): `tables`
equal tables each look up `batch` bags of exactly `pooling` indices drawn from the distribution
(seeded). pass "forward" times the lookup; pass "backward" times backward + optimizer step only
(its forward runs outside the timed region, each repeat, before the L2 flush: the backward finds
the L2 cold, as the forward does).
The distribution column holds its spec (Distribution.spec: "zipf:1.05", "reuse:0.3,0.2"), which
loses nothing: distinct distributions get distinct rows and resume keys, and the correction fitter
reads it back. Files from before hold describe() labels; their zipf and uniform rows still resume.

Timing as the op collector's (kit.data.collect): the largest config first runs for `warmup_ms`
(1000 ms on CUDA) so that clocks leave idle, then each config's mean of the fastest fifth of
`repeats` calls after `warmup`. Each call reads a fresh index set (warmup + repeats sets are drawn up front, at
most INDEX_BUDGET bytes of them, and cycled), so that repeats do not find the rows the last one
touched in L2; on CUDA the L2 is also flushed before each timed call (l2_flush, as
kit.data.collect), as in training, where a step's other work evicts it. unique_rows is the mean
over the sets. fbgemm tables are held in the row's dtype (weights_precision) and return it
(output_dtype). Each finished row is appended with one write, flush and fsync; a resumed run
drops an unfinished last line (no newline) and skips configs already in the file; every row read
back is checked. One run at a time writes a file (kit.data.records.Lock). FILE.meta.json beside it
records each run as the op collector does (kit.data.provenance: host, argv, versions, nvidia-smi
snapshots, settings; Ctrl-C and SIGTERM leave "interrupted").
"""
from __future__ import annotations

import csv
import io
import itertools
import os
import warnings
from pathlib import Path

import numpy as np

from kit.data.collect import _release, sigterm_interrupts, stopped_by
from kit.data.provenance import Meta, _now, gpu_snapshot, run_record
from kit.data.records import Lock, _fsync_dir, first_line, plain_csv, repair
from kit.data.timing import is_fatal_cuda_error, l2_flusher, summarise_ms, time_cpu, time_cuda, warm_for
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


CHOICES = {"backend": ("torch", "fbgemm"), "device": ("cpu", "cuda"), "pass": ("forward", "backward"),
           "optimizer": ("", "sgd", "rowwise_adagrad"), "mode": ("sum", "mean"), "dtype": tuple(TORCH_DTYPES)}
WHOLE = ("batch", "rows", "dim", "pooling", "tables", "lookups", "repeats")
POSITIVE = ("unique_rows", "latency_ms", "latency_min_ms")


def _checked(cells: list[str], where: str) -> dict:
    """One CSV row as a dict of its text, once every field is what the collector writes."""
    if len(cells) != len(COLUMNS):
        raise KitError(f"{where}: has {len(cells)} fields, expected {len(COLUMNS)} ({', '.join(COLUMNS[:4])}, ...)")
    row = dict(zip(COLUMNS, cells))
    for col, allowed in CHOICES.items():
        if row[col] not in allowed:
            raise KitError(f"{where}: {col} must be one of {', '.join(repr(a) for a in allowed)}, got {row[col]!r}")
    for col in WHOLE + POSITIVE:
        try:
            v = float(row[col])
        except ValueError:
            v = float("nan")
        if not (0 < v < float("inf")) or (col in WHOLE and v != int(v)):
            kind = "whole number" if col in WHOLE else "number"
            raise KitError(f"{where}: {col} must be a positive {kind}, got {row[col]!r}")
    if not row["distribution"]:
        raise KitError(f"{where}: distribution is empty")
    return row


def _read(path: Path) -> tuple[list[dict], str]:
    """(rows, their text) of a collector CSV, every row checked (KitError naming the file and its
    line); a last line without its newline is unfinished: left out, with a warning."""
    first_line(path, "an embedding measurement CSV")  # unreadable or not UTF-8: one clear line
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        warnings.warn(f"{path}: ignored an unfinished last line (no newline)", stacklevel=3)
        text = text[:text.rfind("\n") + 1]
    lines = list(csv.reader(io.StringIO(text, newline="")))
    if not lines or lines[0] != COLUMNS:
        raise KitError(f"{path} is not an embedding measurement CSV (its header differs from "
                       f"{', '.join(COLUMNS[:5])}, ...); choose another --out")
    return [_checked(cells, f"{path}:{i}") for i, cells in enumerate(lines[1:], start=2) if cells], text


def _key(row: dict) -> tuple:
    return tuple(_spec(row[k]) if k == "distribution" else str(row[k]) for k in KEY)


def _spec(label: str) -> str:
    """The spec of a stored distribution: itself, or an older file's zipf(1.05) label as its spec
    (a reuse or index-tensor label is kept as it is: it matches no spec, so those rows re-run)."""
    try:
        return parse_distribution(label).spec()
    except KitError:
        return label


def _open_for_append(out: Path, resume: bool) -> tuple[set, bool]:
    """(keys of the rows already in out, whether it had any) once out may be appended to: a plain
    CSV of the collector's header (checked before anything is cut), its unfinished last line
    dropped (a cut header too: it is written again)."""
    plain_csv(out)
    exists = out.is_file() and out.stat().st_size > 0
    if exists and not resume:
        raise KitError(f"{out} already exists; pass --resume to carry on with it, or choose another --out")
    if not exists:
        return set(), False
    first = first_line(out, "an embedding measurement CSV")
    if first.endswith("\n") and next(csv.reader([first]), []) != COLUMNS:
        raise KitError(f"{out} is not an embedding measurement CSV (its header differs from "
                       f"{', '.join(COLUMNS[:5])}, ...); choose another --out")
    repair(out)
    return ({_key(r) for r in _read(out)[0]} if out.stat().st_size else set()), True


def collect(configs: list[dict], out: str | Path, device: str = "cpu", backend: str = "torch",
            repeats: int = 10, warmup: int = 2, resume: bool = False, progress=None,
            l2_flush: bool = True, warmup_ms: float | None = None) -> dict:
    """Measure every config, appending one fsynced CSV row each; returns a summary. warmup_ms: run
    the largest config this long first, so that clocks leave idle (default 1000 on CUDA, 0 on CPU)."""
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
    if warmup_ms is not None and not 0 <= warmup_ms < float("inf"):
        raise KitError(f"warmup_ms must be a finite number >= 0, got {warmup_ms!r}")
    if not configs:
        raise KitError("nothing to measure: the grid is empty (no distribution, mode or dtype given?)")
    for cfg in configs:
        if cfg["dtype"] not in TORCH_DTYPES:
            raise KitError(f"dtype {cfg['dtype']!r} not measurable; choose one of {', '.join(TORCH_DTYPES)}")
        if cfg["mode"] not in ("sum", "mean"):
            raise KitError(f"mode {cfg['mode']!r} not measurable; choose sum or mean")
        if backend == "torch" and cfg["pass"] == "backward" and cfg["optimizer"] not in ("", "sgd"):
            raise KitError(f"optimizer {cfg['optimizer']!r} needs the fbgemm backend; torch does sgd")
    if out.is_dir():
        raise KitError(f"--out {out} is a directory; give a CSV file name")
    warmup_ms = (1000.0 if device == "cuda" else 0.0) if warmup_ms is None else warmup_ms
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    with Lock(out):
        done, exists = _open_for_append(out, resume)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            f = open(out, "a", encoding="utf-8", newline="")
        except OSError as e:
            raise KitError(f"cannot write {out}: {e.strerror or e}; choose another --out") from None
        with f:
            return _measure(configs, out, f, done, exists, device, device_name, backend, repeats,
                            warmup, warmup_ms, l2_flush, progress)


def _measure(configs, out, f, done, exists, device, device_name, backend, repeats, warmup, warmup_ms,
             l2_flush, progress) -> dict:
    import torch

    timer = time_cuda if device == "cuda" else time_cpu
    flush, policy = l2_flusher(device, l2_flush)
    fbgemm_version = None
    if backend == "fbgemm":
        try:
            import fbgemm_gpu

            fbgemm_version = getattr(fbgemm_gpu, "__version__", None)
        except ImportError:
            pass
    meta = Meta(out, {**run_record(device), "device": device,
                      "device_name": device_name, "backend": backend, "fbgemm_version": fbgemm_version,
                      "torch_version": torch.__version__,
                      "cuda_version": torch.version.cuda if device == "cuda" else None,
                      "settings": {"repeats": repeats, "warmup": warmup, "warmup_ms": warmup_ms, **policy,
                                   "indices": "a fresh index set each call (cycled)",
                                   "backward": "backward + optimizer step only; the forward runs "
                                               "outside the timed region, before the L2 flush"}}, exists)
    meta.write()
    written, skipped, duplicates, failed, planned = 0, 0, 0, [], set()  # planned: tried in this run
    if out.stat().st_size == 0:
        f.write(",".join(COLUMNS) + "\n")
        f.flush()
        os.fsync(f.fileno())
        _fsync_dir(out.parent)
    build = _fbgemm_call if backend == "fbgemm" else _torch_call
    try:
        with sigterm_interrupts():
            for cfg in configs:
                row = {**{k: v for k, v in cfg.items() if not k.startswith("_")}, "backend": backend,
                       "device": device, "device_name": device_name}
                key = _key(row)
                if key in done or key in planned:  # in the file before, or twice in the grid
                    skipped += key in done
                    duplicates += key not in done
                    continue
                planned.add(key)
                if warmup_ms:  # once, before the first measurement
                    _warm(configs, build, device, warmup_ms)
                    warmup_ms = 0
                try:
                    sized = {**cfg, "_sets": n_index_sets(cfg, warmup + repeats)}
                    call, unique, before = build(sized, device)
                    times = timer(call, warmup, repeats, flush=flush, before=before)
                    del call, before
                except KitError:
                    raise
                except (RuntimeError, ValueError, MemoryError) as e:  # e.g. out of memory: keep going
                    failed.append({**row, "error": str(e).splitlines()[0][:200]})
                    if device == "cuda" and is_fatal_cuda_error(e):  # the context is lost: stop
                        break
                    _release(device)
                    continue
                row.update(unique_rows=unique, lookups=cfg["batch"] * cfg["pooling"] * cfg["tables"],
                           latency_ms=summarise_ms(times), latency_min_ms=float(min(times)),
                           repeats=repeats, torch_version=torch.__version__)
                f.write(_format(row))
                f.flush()
                os.fsync(f.fileno())
                written += 1
                if progress:
                    progress(row)
    except BaseException as e:  # Ctrl-C, SIGTERM, ...: say so in the metadata, then raise
        meta.run.update(status=stopped_by(e), finished=_now(), written=written, failed=len(failed))
        meta.write()
        raise
    meta.run.update(finished=_now(), status="done", written=written, skipped=skipped,
                    failed=len(failed), nvidia_smi_after=gpu_snapshot() if device == "cuda" else None)
    meta.write()
    if failed and not written:  # every config tried failed: an error, not "0 rows written"
        if not exists:  # the header alone would make the next run ask for --resume
            out.unlink(missing_ok=True)
        first = failed[0]
        raise KitError(f"every measurement failed ({len(failed)}); nothing was written to {out}. "
                       f"First: batch {first['batch']} rows {first['rows']} dim {first['dim']}: "
                       f"{first['error']}")
    return {"out": str(out), "backend": backend, "device": device, "device_name": device_name,
            "written": written, "skipped": skipped, "duplicates": duplicates, "failed": failed}


def _warm(configs, build, device, warmup_ms) -> None:
    """kit.data.timing.warm_for, as the op collector's warm-up, on the largest config (most bytes
    looked up); a failure other than a lost CUDA context is left to the measurements to report."""
    import torch

    cfg = max(configs, key=lambda c: c["batch"] * c["pooling"] * c["tables"] * c["dim"])
    try:
        call, _, before = build({**cfg, "_sets": 1}, device)
        warm_for(lambda: (before(), call()), warmup_ms / 1000,
                 torch.cuda.synchronize if device == "cuda" else None)
    except (RuntimeError, ValueError, MemoryError) as e:
        if device == "cuda" and is_fatal_cuda_error(e):
            raise
        _release(device)


def load(path: str | Path):
    """A collector CSV as a DataFrame, every row checked (KitError naming the line of a bad one)."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise KitError(f"embedding measurement file not found: {path}")
    _, text = _read(path)
    return pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""])
