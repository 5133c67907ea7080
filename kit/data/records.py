"""Schema CSV files: the durable appender the collectors write with (the reader for any CSV is
kit.data.loading), and JSON-lines files appended the same way.

A schema CSV has the header `kit.data.schema.COLUMNS` once, then one line per finished
measurement. The appender writes each line with one write, then flush and fsync, so a run killed
at any moment (SIGKILL included) keeps every finished row; at worst the last line is cut short,
and `repair` drops that unfinished line before a resumed run appends to the file. One run at a
time appends to a file (Lock), and never to a gzipped one (plain_csv).
"""
from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from kit.data import schema
from kit.data.loading import KIT_WRITTEN, _read_schema_csv, is_gzip
# re-exported: kit.predict.evaluate, tests and benchmarks import them from here
from kit.data.loading import check_times, checked_table, gpu_keys, load_measurements  # noqa: F401
from kit.errors import KitError
from kit.jsonl import read_jsonl  # noqa: F401 (re-exported: its importers take it from here)

HEADER = list(schema.COLUMNS)
LEGACY_HEADER = KIT_WRITTEN  # kit CSVs from before schema.LATER_COLUMNS
KEY_COLUMNS = ("op", "dtype", "device_name", "b", "m", "n", "k", "rows", "cols", "in_channels",
               "out_channels", "kernel_size", "input_size", "stride", "padding")


def _format(value) -> str:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    return str(value)


def format_row(row: dict, header: list[str] = HEADER) -> str:
    """One CSV line (with its newline) in the header's column order (the schema's)."""
    unknown = set(row) - set(header)
    if unknown:
        raise KitError(f"not schema columns: {', '.join(sorted(unknown))}")
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([_format(row.get(c)) for c in header])
    return buf.getvalue()


def _key_part(value) -> str:
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        value = int(value)  # 6.0 read back from a CSV is the 6 that was written
    return _format(value)


def row_key(row) -> tuple:
    """What makes a measurement the same one again: op, shape, dtype and device."""
    return tuple(_key_part(row.get(c)) for c in KEY_COLUMNS)


def repair(path: Path) -> int:
    """Cut an unfinished last line off a CSV the collectors write, with a warning; returns the bytes
    removed. Every row is written with its newline, so a last line without one is unfinished, even
    when it has every field (a kill can cut the last field short): it is measured again. A cut
    header leaves the file empty (its writer writes the header again)."""
    try:
        f = open(path, "rb+")
    except OSError as e:
        raise KitError(f"cannot write {path}: {e.strerror or e}; choose another --out") from None
    with f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # search backwards for the last newline, 64 KiB at a time
        end, keep = size, 0
        while end > 0:
            start = max(0, end - 65536)
            f.seek(start)
            hit = f.read(end - start).rfind(b"\n")
            if hit >= 0:
                keep = start + hit + 1
                break
            end = start
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    warnings.warn(f"{path}: dropped an unfinished last line ({size - keep} bytes)", stacklevel=3)
    return size - keep


def refuse_foreign_cut_header(path: Path, first: str, headers, what: str) -> None:
    """KitError unless `first`, a first line with no newline, is the start of one of the headers
    a collector writes (a run killed while writing it): resume then drops it as unfinished and
    writes the header again. Any other text is no cut header of ours: 150 bytes of binary with no
    newline had been dropped as "an unfinished last line" and the file written over."""
    if not any((",".join(h) + "\n").startswith(first) for h in headers):
        raise KitError(f"{path} is not {what} (its first line is no collector header, and has no "
                       "newline); choose another --out")


def plain_csv(path: Path) -> None:
    """KitError unless path is (or will be) a plain CSV: the collectors append lines, so they
    cannot write gzip (a .gz name, or gzip's magic bytes under another)."""
    path = Path(path)
    magic = b""
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
    except OSError:  # not there yet, or unreadable: the reader that follows says so
        pass
    if is_gzip(path) or magic == b"\x1f\x8b":
        raise KitError(f"{path}: the collectors append to a plain CSV and cannot write gzip; give "
                       "--out a .csv name (gunzip a gzipped file first to resume it; gzip the CSV "
                       "once it is done)")


def first_line(path: Path, what: str) -> str:
    """The file's first line, with its newline when it is finished; KitError when the file cannot
    be read or is not UTF-8 text (so not `what`)."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.readline()
    except UnicodeDecodeError:
        raise KitError(f"{path} is not {what} (it is not UTF-8 text); choose another --out") from None
    except OSError as e:
        raise KitError(f"cannot read {path}: {e.strerror or e}; choose another --out") from None


def side_path(out: str | Path, suffix: str) -> Path:
    """FILE.csv (or FILE.csv.gz, FILE) -> FILE<suffix> beside it (e.g. .meta.json, .failed.jsonl,
    .lock): the one name every file kept beside a collector's output derives from."""
    out = Path(out)
    name = out.name[:-3] if out.name.lower().endswith(".csv.gz") else out.name  # a gzipped one's
    stem = name[:-4] if name.lower().endswith(".csv") else name
    return out.with_name(stem + suffix)


def side_twins(path: str | Path) -> list[Path]:
    """The other non-empty files beside `path` whose side files are its own (FILE, FILE.csv,
    FILE.csv.gz in any case: side_path gives them one FILE.meta.json, FILE.failed.jsonl, ...)."""
    path = Path(path)
    own = side_path(path, "")
    try:
        entries = list(path.parent.iterdir()) if path.parent.is_dir() else []
    except OSError:
        return []
    twins = []
    for p in entries:
        if p.name == path.name or side_path(p, "") != own:
            continue
        try:
            if p.is_file() and p.stat().st_size > 0 and not (path.exists() and os.path.samefile(p, path)):
                twins.append(p)
        except OSError:
            continue
    return sorted(twins)


class Lock:
    """One writer at a time: an exclusive fcntl.flock on FILE.lock beside the file (side_path:
    the name its meta and failure log derive from, so FILE and FILE.csv take one lock), taken
    without waiting (KitError when another run holds it) and removed by release(). The kernel
    drops the lock of a killed run, so a lock file left behind blocks no one."""

    def __init__(self, path: str | Path):
        import fcntl

        self.fd, self.path = None, side_path(path, ".lock")
        while self.fd is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise KitError(f"cannot write {self.path} beside {path}: {e.strerror or e}; "
                               "choose another --out") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):  # a file system without locks
                    self.fd = fd
                    break
                os.close(fd)
                raise KitError(f"{path} is being written by another run (it holds {self.path.name}); "
                               "wait for it to end, or choose another --out") from None
            try:  # the holder may have removed the file between our open and flock: lock the new one
                self.fd = fd if os.stat(self.path).st_ino == os.fstat(fd).st_ino else None
            except FileNotFoundError:
                pass
            if self.fd is None:
                os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Appender:
    """Append schema rows to a CSV durably; the header is written once, when the file is new, and
    a row whose key the file holds already is not written again.

    A subclass may write more columns after the schema's (NEW_HEADER) and resume files with any
    header of ACCEPTED, each in its own format; or rows of its own, with its own key, line, reader
    of the keys already there and header check (kit.embedding.measured_rows)."""

    NEW_HEADER: list[str] = HEADER
    ACCEPTED: tuple = (HEADER, LEGACY_HEADER)
    SIDE_FILES: tuple = (".meta.json", ".failed.jsonl", ".measuring.json")  # kit.data.collect's

    def __init__(self, path: str | Path, resume: bool = False):
        self.path = Path(path)
        self.keys: set[tuple] = set()
        self.header = self.NEW_HEADER
        plain_csv(self.path)
        exists = self.path.is_file() and self.path.stat().st_size > 0
        if exists and not resume:
            raise KitError(f"{self.path} already exists; pass --resume to carry on with it, "
                           "or choose another --out")
        if resume and not exists:  # a mistyped --out would measure everything again unsaid
            said = "is empty" if self.path.is_file() else "does not exist"
            warnings.warn(f"--resume: {self.path} {said}, so there is nothing to carry on with: "
                          "this run starts it and measures all it is asked")
        self.existed = exists  # the file was there, not empty, before this run
        self._lock = Lock(self.path)
        twins = side_twins(self.path)
        if twins:  # its meta, failure log and marker would be written over, or read as this file's
            self._lock.release()
            names = ", ".join(side_path(self.path, s).name for s in self.SIDE_FILES)
            raise KitError(f"{self.path} would share {names} with {twins[0]} beside it; choose "
                           "another --out, or move that file away with its side files")
        try:
            self._open(exists)
        except BaseException:
            self._lock.release()
            raise

    def _open(self, exists: bool):
        if exists:
            self._check_header()
            repair(self.path)
            if self.path.stat().st_size:
                self.keys = self._read_keys()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8", newline="")
        except OSError as e:
            raise KitError(f"cannot write {self.path}: {e.strerror or e}; choose another --out") from None
        if self.path.stat().st_size == 0:
            self._write(",".join(self.header) + "\n")
            _fsync_dir(self.path.parent)

    def _check_header(self):
        """The file's header (a finished first line) must be one this appender writes; it is kept."""
        first = first_line(self.path, "a kit measurement CSV")
        if not first.endswith("\n"):  # cut short before its newline: repair() drops it, _open
            refuse_foreign_cut_header(self.path, first, self.ACCEPTED, "a kit measurement CSV")
            return  # writes it again
        cols = first.rstrip("\r\n").split(",")
        if cols not in self.ACCEPTED:
            raise KitError(f"{self.path} is not a kit measurement CSV (its header differs from "
                           "kit.data.schema.COLUMNS); choose another --out")
        self.header = cols

    def _read_keys(self) -> set[tuple]:
        """The keys of the rows the file holds. The rows are checked as every reader checks them
        (checked_table): a resumed sweep had appended to a file no reader could load again."""
        raw = _read_schema_csv(self.path)
        try:
            checked_table(raw, str(self.path))
        except KitError as e:
            said = str(e) if str(self.path) in str(e) else f"{self.path}: {e}"
            raise KitError(f"cannot resume: {said}; mend or move the file") from None
        existing = schema.conform(raw, str(self.path))
        return {self.key(r) for r in existing.to_dict("records")}

    def key(self, row) -> tuple:
        return row_key(row)

    def line(self, row: dict) -> str:
        return format_row(row, self.header)

    def _write(self, text: str):
        self._file.write(text)
        self._file.flush()
        os.fsync(self._file.fileno())

    def __contains__(self, key: tuple) -> bool:
        return key in self.keys

    def append(self, row: dict) -> None:
        if set(row) - set(self.header) <= set(self.NEW_HEADER) - set(self.header):
            row = {k: v for k, v in row.items() if k in self.header}  # an older file's format
        key = self.key(row)
        if key in self.keys:
            return
        self._write(self.line(row))
        self.keys.add(key)

    def close(self):
        self._file.close()
        self._lock.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def append_jsonl(path: str | Path, obj, default=None) -> None:
    """Append obj to a JSON-lines file as one line, flushed and fsynced (a killed run keeps every
    line it finished); a line cut short before it is ended first, so the two never merge."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab+") as f:
        cut = False
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            cut = f.read(1) != b"\n"
        f.write((("\n" if cut else "") + json.dumps(obj, default=default) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
