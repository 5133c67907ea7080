"""The parallel model's kernel times on one GPU, kept on disk between processes.

Coster predicts each distinct op once a process (kit.parallel.costs._OP_CACHE); a fresh
`kit predict gpt:... --nodes 128 ...` (GPT-3 175B on 1,024 GPUs) had spent 0.25 s of its 1.2 s
CPU re-predicting the same few hundred shapes. An op's four times (latency, p10, p90, roofline)
depend only on the op, the predictor and its weights (its name carries weights other than the
shipped ones: kit.predict.predictor_name), the GPU's spec and those of the training GPUs that
bound it, and the code: kit.workload.latency_cache's files (the predictors, the shipped weights,
the op definitions, tiling, the catalog) and this package's costs.py and this file. The key holds
all of them, by contents (kit.source_digest.process_stamp: None, and no disk cache, once the code
on disk is not what this process imported).

$KIT_CACHE/parallel_ops/<key>.jsonl: one JSON line {repr(op): [latency, p10, p90, roofline]} per
call that predicted new ops, appended (two processes may append at once: each line is one
write). A line that does not parse (a write cut short) is skipped: its ops are predicted again.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from kit.jsonl import read_jsonl

HERE = Path(__file__).resolve().parent


def _stamp() -> str | None:
    from kit.source_digest import process_stamp
    from kit.workload.latency_cache import predictor_files

    files = [*predictor_files(), HERE / "costs.py", HERE / "op_cache.py"]
    return process_stamp("parallel-ops", ((str(f.relative_to(f.parents[1])), f) for f in files))


def cache_path(predictor_name, gpu) -> Path | None:
    """The file of a predictor's (a name: kit.predict.predictor_name) times on gpu; None for a
    predictor object (its weights are not known) or when the code changed under this process."""
    if not isinstance(predictor_name, str):
        return None
    stamp = _stamp()
    if stamp is None:
        return None
    from kit.workload.latency_cache import cache_dir, gpu_specs

    raw = json.dumps([predictor_name, gpu_specs(gpu), stamp])
    return cache_dir().parent / "parallel_ops" / f"{hashlib.sha256(raw.encode()).hexdigest()[:24]}.jsonl"


def load(path: Path | None) -> dict:
    """repr(op) -> its four times, from every line of path that parses (none: {})."""
    out: dict = {}
    if path is None:
        return out
    for entries in read_jsonl(path):
        out.update((k, tuple(v)) for k, v in entries.items()
                   if isinstance(v, list) and len(v) == 4 and all(isinstance(x, float) for x in v))
    return out


def append(path: Path | None, entries: dict) -> None:
    """Add repr(op) -> four times to path, as one line in one write; a cache that cannot be
    written is skipped, never an error."""
    if path is None or not entries:
        return
    line = (json.dumps({k: [float(x) for x in v] for k, v in entries.items()}) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        pass
