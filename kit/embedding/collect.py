"""Measure embedding bags with controlled index distributions, into a CSV that loses nothing.

Backends (kit.embedding.backends): "torch" (nn.EmbeddingBag, one per table, cpu or cuda) and
"fbgemm" (FBGEMM's fused table-batched embedding, cuda only, used when fbgemm_gpu is installed;
"auto" picks it then).
Each config is (batch, rows, dim, pooling, tables, distribution, mode, dtype, pass): `tables`
equal tables each look up `batch` bags of exactly `pooling` indices drawn from the distribution
(seeded). pass "forward" times the lookup; pass "backward" times backward + optimizer step only
(its forward runs outside the timed region, each repeat, before the L2 flush: the backward finds
the L2 cold, as the forward does).
The distribution column holds its spec (Distribution.spec: "zipf:1.05", "reuse:0.3,0.2"), which
loses nothing: distinct distributions get distinct rows and resume keys, and the correction fitter
reads it back. Files from before hold describe() labels; their zipf and uniform rows still resume.
(The CSV's columns, keys, row checks and reader: kit.embedding.measured_rows.)

Timing as the op collector's (kit.data.collect): the largest config first runs for `warmup_ms`
(1000 ms on CUDA) so that clocks leave idle, then each config's mean of the fastest fifth of
`repeats` calls after `warmup`. Each call reads a fresh index set (warmup + repeats sets are drawn up front, at
most INDEX_BUDGET bytes of them, and cycled), so that repeats do not find the rows the last one
touched in L2; on CUDA the L2 is also flushed before each timed call (l2_flush, as
kit.data.collect), as in training, where a step's other work evicts it. unique_rows is the mean
over the sets. fbgemm tables are held in the row's dtype (weights_precision) and return it
(output_dtype). Each finished row is appended with one write, flush and fsync; a resumed run
drops an unfinished last line (no newline) and skips configs already in the file; every row read
back is checked (kit.data.records.Appender, as the op collector writes). One run at a time writes
a file (kit.data.records.Lock). FILE.meta.json beside it
records each run as the op collector does (kit.data.provenance: host, argv, versions, nvidia-smi
snapshots, settings; Ctrl-C and SIGTERM leave "interrupted").
"""
from __future__ import annotations

import itertools
import math
import numbers
from pathlib import Path

from kit.data.collect import MAX_WARMUP_MS, _release, check_wait_ms, sigterm_interrupts, stopped_by
from kit.data.provenance import Meta, _now, gpu_snapshot, run_record
from kit.data.timing import is_fatal_cuda_error, l2_flusher, summarise_ms, time_cpu, time_cuda, warm_for
from kit.embedding.backends import TORCH_DTYPES, _fbgemm, _fbgemm_call, _torch_call, n_index_sets
from kit.embedding.backends import _precision  # noqa: F401 (re-exported: tests import it from here)
from kit.embedding.distributions import parse_distribution
from kit.embedding.index_streams import Empirical
from kit.embedding.measured_rows import CHOICES, RowAppender, _key
from kit.embedding.measured_rows import COLUMNS, load  # noqa: F401 (re-exported: tests import them from here)
from kit.errors import KitError


# equal tables a config may hold: the torch backend builds one nn.EmbeddingBag per table (about
# 0.6 ms and 20 KB each on a 2-core machine: 1,000 tables took 16 s, 10,000 21 s); --tables 1e8
# ran past 90 s without a row and would have needed ~2 TB of modules
MAX_TABLES = 2**16
ELEM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def _memory_bytes(device: str) -> int | None:
    """The device's memory: the GPU's, or this machine's RAM for cpu (None: unknown)."""
    import os

    import torch

    if device == "cuda":
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _too_big(cfg: dict, memory: int | None) -> str | None:
    """Why cfg's tables cannot be held on the device, or None. Tables allocated one by one fill
    memory until the OOM killer ends the run without a word (--tables 1000 --rows 1e9 is 238 TiB
    of fp32 weights), where one too-large table fails at once."""
    held = cfg["tables"] * cfg["rows"] * cfg["dim"] * ELEM_BYTES.get(cfg["dtype"], 4)
    if memory is None or held <= memory:
        return None
    return (f"its {cfg['tables']:,} table(s) of {cfg['rows']:,} x {cfg['dim']:,} {cfg['dtype']} hold "
            f"{held / 2**30:.4g} GiB, more than the device's {memory / 2**30:.4g} GiB")


SIZES = ("batch", "rows", "dim", "pooling", "tables")  # a config's whole numbers, each >= 1


def _size(value, what: str) -> int:
    """value as an int once it is a whole number >= 1 (1e6 too). int() had cut pooling 2.5 to 2
    and let batch 0 through, whose row the CSV's reader refuses: the file could then be neither
    loaded nor resumed."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value < 1 or value != int(value):
        raise KitError(f"{what} values must be whole numbers of at least 1, got {value!r}")
    return int(value)


FIELDS = SIZES + ("distribution", "mode", "dtype", "pass")  # a config's fields; optimizer may be left out


def _config(cfg) -> dict:
    """A config as it is measured and written: grid's, or one built by hand. A hand-built one had
    been written as given: a Zipf(1.2) as 'Zipf(alpha=1.2)' and an index tensor as '[0 5 9 9]' (no
    spec: the fitter cannot read them, and tensors numpy prints alike share a resume key), pass
    'Forward' timed as a backward and written as a row the CSV's reader refuses, and one without
    an optimizer ended in KeyError 'optimizer'."""
    if not isinstance(cfg, dict):
        raise KitError(f"a config is a dict of {', '.join(FIELDS)} (see grid), got {type(cfg).__name__}")
    missing = [k for k in FIELDS if k not in cfg]
    if missing:
        raise KitError(f"config has no {', '.join(missing)}: a config holds {', '.join(FIELDS)} "
                       f"(and optimizer, for a backward pass; see grid)")
    for k in SIZES:
        if isinstance(cfg[k], bool) or not isinstance(cfg[k], numbers.Integral) or cfg[k] < 1:
            raise KitError(f"config {k} must be a whole number of at least 1, got {cfg[k]!r}")
    if cfg["pass"] not in CHOICES["pass"]:
        raise KitError(f"config pass must be forward or backward, got {cfg['pass']!r}")
    backward = cfg["pass"] == "backward"
    optimizer = cfg.get("optimizer", "sgd") if backward else ""  # as grid writes them
    if optimizer not in CHOICES["optimizer"]:
        raise KitError(f"config optimizer must be sgd or rowwise_adagrad, got {optimizer!r}")
    given = cfg.get("_dist", cfg["distribution"])
    dist = parse_distribution(given)
    if isinstance(dist, Empirical):  # before anything is measured: its ids must be rows
        dist.groups(cfg["rows"])
    return {**cfg, **{k: int(cfg[k]) for k in SIZES}, "optimizer": optimizer,
            "distribution": dist.spec(), "_dist": given}


def grid(batch, rows, dim, pooling, distributions, tables=(1,), modes=("sum",), dtypes=("fp32",),
         passes=("forward",), optimizer="sgd") -> list[dict]:
    """Every combination, as config dicts."""
    out = []
    for b, e, d, l, dist, t, mo, dt, ps in itertools.product(batch, rows, dim, pooling, distributions,
                                                              tables, modes, dtypes, passes):
        b, e, d, l, t = (_size(v, k) for v, k in zip((b, e, d, l, t), SIZES))
        out.append({"batch": b, "rows": e, "dim": d, "pooling": l, "tables": t,
                    "distribution": parse_distribution(dist).spec(), "_dist": dist, "mode": mo,
                    "dtype": dt, "pass": ps, "optimizer": optimizer if ps == "backward" else ""})
    return out


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
    if warmup_ms is not None:  # the op collector's rule: at most an hour
        check_wait_ms("--warmup-ms", warmup_ms, MAX_WARMUP_MS)
    if not configs:
        raise KitError("nothing to measure: the grid is empty (no distribution, mode or dtype given?)")
    configs = [_config(cfg) for cfg in configs]
    for cfg in configs:
        if cfg["tables"] > MAX_TABLES:
            raise KitError(f"tables {cfg['tables']:,} a config is more than the collector builds "
                           f"(at most {MAX_TABLES:,}; one module each); give fewer --tables")
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
    with RowAppender(out, resume=resume) as sink:
        return _measure(configs, out, sink, device, device_name, backend, repeats, warmup, warmup_ms,
                        l2_flush, progress)


def _measure(configs, out, sink, device, device_name, backend, repeats, warmup, warmup_ms, l2_flush,
             progress) -> dict:
    import torch

    done, exists = set(sink.keys), sink.existed  # the rows in the file before this run

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
    build = _fbgemm_call if backend == "fbgemm" else _torch_call
    memory = _memory_bytes(device)
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
                too_big = _too_big(cfg, memory)
                if too_big:
                    failed.append({**row, "error": too_big})
                    continue
                if warmup_ms:  # once, before the first measurement
                    _warm(configs, build, device, warmup_ms, memory)
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
                sink.append(row)
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


def _warm(configs, build, device, warmup_ms, memory=None) -> None:
    """kit.data.timing.warm_for, as the op collector's warm-up, on the largest config (most bytes
    looked up) the device holds; a failure other than a lost CUDA context is left to the
    measurements to report."""
    import torch

    configs = [c for c in configs if not _too_big(c, memory)]
    if not configs:
        return
    cfg = max(configs, key=lambda c: c["batch"] * c["pooling"] * c["tables"] * c["dim"])
    try:
        call, _, before = build({**cfg, "_sets": 1}, device)
        warm_for(lambda: (before(), call()), warmup_ms / 1000,
                 torch.cuda.synchronize if device == "cuda" else None)
    except (RuntimeError, ValueError, MemoryError) as e:
        if device == "cuda" and is_fatal_cuda_error(e):
            raise
        _release(device)

