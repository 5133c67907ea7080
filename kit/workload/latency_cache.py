"""Predicted kernel latencies of a cached capture on one GPU, kept on disk between processes.

A zoo capture carries its cache key (graph.meta["cache_key"], kit.workload.zoo). Predicting it
on a GPU gives three arrays per kernel (latency, p10, p90); they depend only on

    the capture (its key), the fusion mode, the GPU's spec, the predictor and its code/weights

so they are stored under $KIT_CACHE/latency/<key>.npz and a later process that asks for the
same configuration needs neither the capture nor the predictor (nor torch, which the learned
predictors import). Any change to the GPU spec, the predictor's files or the shipped weights
changes the key. Graphs without a cache key (a user's nn.Module) are never cached here.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from kit.whole_file import replace_file

PREDICT_DIR = Path(__file__).resolve().parents[1] / "predict"
# what the predictors compute with, outside kit/predict: tiles, waves and the op definitions (and
# their counts: bytes per dtype, FLOPs per element), and the catalog: a GPU's predictions may be
# bounded by another GPU's (kit.predict.sibling_bound), whose spec the key does not hold; and
# the GPU's class, whose derived figures (mem_bw_bytes_per_s, gemm_peak_tflops, simt_fp32_tflops)
# the predictors read and its spec (to_dict) does not hold: halving mem_bw_bytes_per_s had left a
# fresh roofline `kit predict gpt:... --tp 2` at the cached 10.499 ms, not 16.529
KIT_FILES = tuple(Path(__file__).resolve().parents[1] / n
                  for n in ("tiling.py", "ops.py", "op_counts.py", "hardware/gpus.json", "hardware/gpu.py"))


HERE = Path(__file__).resolve().parent
COSTING_FILES = ("iteration.py", "kernel_times.py", "fusion.py", "kernels.py", "latency_cache.py",
                 "generation.py")  # HF's generate loop around each pass (hf_loop)


def predictor_files() -> list[Path]:
    """The files _predictor_stamp hashes."""
    return (sorted(PREDICT_DIR.rglob("*.py")) + sorted((PREDICT_DIR / "weights").glob("*"))
            + [HERE / n for n in COSTING_FILES] + list(KIT_FILES))


def _predictor_stamp() -> str | None:
    """Changes whenever a predictor's code, the shipped weights or the code that turns a graph
    into the ops to predict (fusion, derived kernels, iteration) change: by their contents (it
    had been their names, sizes and mtimes, so an edit of the same size within the clock's
    tick, or a copy that keeps mtimes, served another code's latencies). None once they are no
    longer the files this process imported (source_digest.process_stamp)."""
    from kit.source_digest import process_stamp

    return process_stamp("latency", ((str(f.relative_to(f.parents[1])), f) for f in predictor_files()))


def key_for(graph, fusion: str, gpu, predictor: str) -> str | None:
    """The cache key of a graph's predictions on a GPU, or None when the graph has no key."""
    base = graph.meta.get("cache_key")
    if not base or not isinstance(predictor, str):
        return None
    stamp = _predictor_stamp()  # only for a graph with a key: a user's module's step asks too
    if stamp is None:
        return None
    raw = json.dumps([base, fusion, gpu_specs(gpu), predictor, stamp])
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def gpu_specs(gpu) -> str:
    """The GPU's spec, and of every GPU it dominates, as JSON: a training GPU among them bounds
    its predictions (kit.predict.sibling_bound), and a --gpu-file may have replaced one's spec."""
    from kit.hardware import list_gpus
    from kit.predict.sibling_bound import dominates

    specs = [gpu.to_dict()] + [o.to_dict() for o in list_gpus() if dominates(gpu, o)]
    return json.dumps(specs, sort_keys=True, default=str)


def cache_dir() -> Path:
    return Path(os.environ.get("KIT_CACHE") or Path.home() / ".cache" / "gpu-perf-kit") / "latency"


def load(key: str | None, n: int):
    """(lat, p10, p90, predictor name, fallbacks, option taken per kernel) or None (no key,
    missing, unreadable, or a different number of kernels than the graph has). A corrupt file
    (empty, cut short, not an npz, other contents) is a miss: it is predicted again and written
    over."""
    if key is None:
        return None
    path = cache_dir() / f"{key}.npz"
    try:
        with np.load(path, allow_pickle=False) as z:
            vals = z["latency"]
            option = z["option"]
            info = json.loads(str(z["info"]))
        predictor, fallbacks = info["predictor"], info.get("fallbacks", {})
    except (OSError, EOFError, KeyError, ValueError, TypeError, AttributeError, zipfile.BadZipFile):
        return None
    if vals.shape != (3, n) or option.shape != (n,):
        return None
    return vals[0], vals[1], vals[2], predictor, fallbacks, option


def save(key: str | None, lat, p10, p90, predictor: str, fallbacks: dict, option=None) -> None:
    """Store predictions (atomically; an unwritable cache is skipped, never an error)."""
    if key is None:
        return
    path = cache_dir() / f"{key}.npz"
    option = np.zeros(len(lat), dtype=int) if option is None else np.asarray(option, dtype=int)
    data = io.BytesIO()
    np.savez(data, latency=np.vstack([lat, p10, p90]), option=option,
             info=np.array(json.dumps({"predictor": predictor, "fallbacks": fallbacks})))
    try:  # a failed write had left its KEY.PID.tmp.npz in the cache
        replace_file(path, data.getvalue(), sync=False)
    except OSError:
        pass
