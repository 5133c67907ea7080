"""The parallel model's kernel times on one GPU, kept on disk between processes.

Coster predicts each distinct op once a process (kit.parallel.costs._OP_CACHE); a fresh
`kit predict gpt:... --nodes 128 ...` (GPT-3 175B on 1,024 GPUs) had spent 0.25 s of its 1.2 s
CPU re-predicting the same few hundred shapes. An op's four times (latency, p10, p90, roofline)
depend only on the op, the predictor and its weights (its name carries weights other than the
shipped ones: kit.predict.predictor_name), the GPU's spec and those of the training GPUs that
bound it, and the code: kit.workload.latency_cache's files (the predictors, the shipped weights,
the op definitions, tiling, the catalog), the op classes this package defines (OP_FILES), its
costs.py and this file. The key holds all of them, by contents (kit.source_digest.process_stamp:
None, and no disk cache, once the code on disk is not what this process imported).

An op is named on disk by its class and repr, which hold its fields but not its class's code
(a property such as KVRepeat.bytes, a class attribute): only an op whose class and every base
are defined in those files is kept (stamped_class). kit/parallel/gpt.py's and vocab_kernels.py's
ops had been kept under a stamp without their files: an edit of KVRepeat.bytes (x10) left a fresh
`kit predict ... --predictor roofline` at the old 11.972 ms where the edited code gives 12.215;
and an op class of a user's (a notebook's __main__) would have met another's of the same name.

$KIT_CACHE/parallel_ops/<key>.jsonl: one JSON line {repr(op): [latency, p10, p90, roofline]} per
call that predicted new ops, appended (two processes may append at once: each line is one
write). A line that does not parse (a write cut short) is skipped: its ops are predicted again;
the next append starts on a line of its own (_fresh_line).
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path

from kit.jsonl import read_jsonl

HERE = Path(__file__).resolve().parent
OP_FILES = ("gpt.py", "vocab_kernels.py")  # the op classes kit.parallel defines


def _files() -> list[Path]:
    from kit.workload.latency_cache import predictor_files

    return [*predictor_files(), *(HERE / n for n in (*OP_FILES, "costs.py", "op_cache.py"))]


def _stamp() -> str | None:
    from kit.source_digest import process_stamp

    return process_stamp("parallel-ops", ((str(f.relative_to(f.parents[1])), f) for f in _files()))


_STAMPED: dict = {}  # stamped_class's answers, by class
_STAMPED_FILES: set = set()  # the stamp's files, resolved: once a process


def stamped_class(cls) -> bool:
    """Whether cls and every class it inherits from (object aside) are defined in a file the
    stamp holds: only then does a change of the class's code change the key."""
    if cls not in _STAMPED:
        if not _STAMPED_FILES:
            _STAMPED_FILES.update(f.resolve() for f in _files())

        def stamped(c) -> bool:
            path = getattr(sys.modules.get(c.__module__), "__file__", None)
            return path is not None and Path(path).resolve() in _STAMPED_FILES

        _STAMPED[cls] = all(c is object or stamped(c) for c in cls.__mro__)
    return _STAMPED[cls]


def cache_path(predictor_name, gpu) -> Path | None:
    """The file of a predictor's (a name: kit.predict.predictor_name) times on gpu; None for a
    predictor object (its weights are not known) or when the code changed under this process."""
    if not isinstance(predictor_name, str) or not stamped_class(type(gpu)):
        return None  # (a GPU of a class of the user's: its code is not in the key)
    stamp = _stamp()
    if stamp is None:
        return None
    from kit.workload.latency_cache import cache_dir, gpu_specs

    raw = json.dumps([predictor_name, gpu_specs(gpu), stamp])
    return cache_dir().parent / "parallel_ops" / f"{hashlib.sha256(raw.encode()).hexdigest()[:24]}.jsonl"


def load(path: Path | None) -> dict:
    """repr(op) -> its four times, from every line of path that parses (none: {})."""
    out: dict = {}
    # a regular file only: a cache file that is a link to a device (/dev/full, /dev/zero) had been
    # read to its never-reached end, a MemoryError traceback, and a FIFO would block
    if path is None or not path.is_file():
        return out
    for entries in read_jsonl(path):
        out.update((k, tuple(v)) for k, v in entries.items()
                   if isinstance(v, list) and len(v) == 4 and all(isinstance(x, float) for x in v))
    return out


def _fresh_line(fd: int, path: Path) -> bytes:
    """b"\n" when the regular file open at fd (for writing only: a FIFO without a reader must
    stay an error) does not end with one, else b"". A write cut short (a full disk, a kill) left
    the file inside a line, and the next append had joined it: one line that does not parse, so
    that append's times were lost too and the process after predicted and appended them again
    (the cut last line of a GPT run's file: 3 ops predicted by the next two processes, not one).
    Read through a second descriptor, of the same file (device and inode), or the answer is
    b"\n": a blank line is skipped."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return b""
    try:
        rd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return b"\n"
    try:
        same = os.fstat(rd)
        if (same.st_dev, same.st_ino) != (st.st_dev, st.st_ino):
            return b"\n"
        return b"" if os.pread(rd, 1, st.st_size - 1) == b"\n" else b"\n"
    finally:
        os.close(rd)


def append(path: Path | None, entries: dict) -> None:
    """Add repr(op) -> four times to path, as one line in one write; a cache that cannot be
    written is skipped, never an error. Nor is anything written once the code on disk is not the
    code path's stamp holds (_stamp None): path was named at the first prediction, and a process
    that has since run other code (autoreload after an edit) had written its times under the old
    code's key, which a process of the old code (the edit undone) would read."""
    if path is None or not entries or _stamp() is None:
        return
    line = (json.dumps({k: [float(x) for x in v] for k, v in entries.items()}) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # non-blocking: a FIFO without a reader is an error (ENXIO), not a wait; a regular file
        # is written as without it
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
        try:
            os.write(fd, _fresh_line(fd, path) + line)
        finally:
            os.close(fd)
    except OSError:
        pass
