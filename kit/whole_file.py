"""Output files written whole or not at all.

A file the kit writes for the user (a --trace, a calibration, collect-comm's measurements) goes
to a temporary file beside it, which then replaces it (os.replace: one step on one filesystem).
A write that fails part-way (a full disk, a file-size limit) leaves the earlier file as it was
and no part-written file behind, where writing in place had left a truncated one.
"""
from __future__ import annotations

import os
from pathlib import Path


def replace_file(path, data: bytes) -> Path:
    """data as the whole content of path (its folder made when missing); returns path. An
    OSError reaches the caller, with path unchanged and the temporary file removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with open(tmp, "wb") as f:  # the umask's permissions, as an ordinary write gives
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
