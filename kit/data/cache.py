"""A parquet cache for tables read from slow text files, in $KIT_CACHE (or ~/.cache/gpu-perf-kit).

The key is a hash of the table's name, the schema, the code that builds the table (LOADER_FILES)
and each input file's path, size, mtime, ctime and inode, so editing or replacing any input, or
changing the loader, rereads it. Writes are atomic (temp file, then rename); a cache that
cannot be written or read is skipped, never an error.
"""
from __future__ import annotations

import hashlib
import io
import os
import warnings
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from kit.whole_file import replace_file

CACHE_VERSION = "2"  # bump when a loader's output changes for the same input files


def cache_dir() -> Path:
    """$KIT_CACHE, else ~/.cache/gpu-perf-kit (never beside the data)."""
    env = os.environ.get("KIT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "gpu-perf-kit"


# What the cached tables are built by (kit/...): the NeuSight mapping, the schema, the CSV reader
# and the GPU catalog (Device -> gpu key). CACHE_VERSION alone relied on a bump by hand, and
# a37459d (a Latency of True refused, where it had loaded as 1 ms) changed the output without one:
# a table cached before it kept serving the 1 ms row.
LOADER_FILES = ("data/neusight.py", "data/schema.py", "data/csv_read.py", "data/cache.py",
                "hardware/catalog.py", "hardware/gpus.json")


def _loader_stamp() -> str | None:
    """The loader's code as this process imported it (source_digest.process_stamp), or None once
    it changed on disk: a Jupyter kernel left open across an edit or a `git pull` would store its
    old loader's table under the new loader's key."""
    from kit.source_digest import process_stamp

    kit_dir = Path(__file__).resolve().parents[1]
    return process_stamp("loader", ((rel, kit_dir / rel) for rel in LOADER_FILES))


def cache_key(name: str, files: Sequence[Path]) -> str | None:
    """The table's cache key, or None when this process's loader is not the disk's."""
    from kit.data.schema import COLUMNS

    stamp = _loader_stamp()
    if stamp is None:
        return None
    h = hashlib.sha256()
    h.update(f"{CACHE_VERSION}|{name}|{sorted(COLUMNS.items())}".encode())
    h.update(stamp.encode())
    for f in sorted(Path(p).resolve() for p in files):
        st = f.stat()
        # ctime and inode too: a file replaced by one of the same size with its mtime kept (cp -p,
        # rsync -t, tar, os.utime) had the same size and mtime, and its stale table was served
        h.update(f"|{f}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}".encode())
    return h.hexdigest()[:20]


def cached_table(name: str, files: Sequence[Path], build: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """build() the first time; afterwards read the parquet copy while the input files are unchanged."""
    key = cache_key(name, files)
    if key is None:  # the loader on disk is not the one this process runs: no cache
        return build()
    path = cache_dir() / f"{name}--{key}.parquet"
    if path.is_file():
        try:
            frame = pd.read_parquet(path)
        except Exception as e:  # a corrupt or foreign cache file: rebuild it
            warnings.warn(f"ignoring unreadable cache {path}: {e}", stacklevel=2)
        else:
            from kit.data.schema import COLUMNS

            if list(frame.columns) == list(COLUMNS):
                return frame
            # a parquet file under this table's name, but not this table (a user's, a tool's)
            warnings.warn(f"ignoring cache {path}: its columns are not the measurement schema's",
                          stacklevel=2)
    frame = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in path.parent.glob(f"{name}--*.parquet"):  # stale copies of this table only
            old.unlink(missing_ok=True)
        data = io.BytesIO()
        frame.to_parquet(data, index=False)
        replace_file(path, data.getvalue(), sync=False)  # a failed write had left its .tmpPID
    except OSError as e:
        warnings.warn(f"could not write cache {path}: {e}", stacklevel=2)
    return frame
