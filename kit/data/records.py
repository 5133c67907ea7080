"""Schema CSV files: the durable appender the collector writes with, and the reader for any CSV.

A schema CSV has the header `kit.data.schema.COLUMNS` once, then one line per finished
measurement. The appender writes each line with one write, then flush and fsync, so a run killed
at any moment (SIGKILL included) keeps every finished row; at worst the last line is cut short,
and `repair` drops that unfinished line before a resumed run appends to the file. One run at a
time appends to a file (Lock), and never to a gzipped one (plain_csv).
"""
from __future__ import annotations

import csv
import errno
import gzip
import io
import json
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from kit.data import schema
from kit.data.neusight import NEUSIGHT_COLUMNS, from_neusight, read_neusight_csv
from kit.errors import KitError, need_path

HEADER = list(schema.COLUMNS)
LEGACY_HEADER = [c for c in HEADER if c not in schema.LATER_COLUMNS]  # kit CSVs from before them
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


class Lock:
    """One writer at a time: an exclusive fcntl.flock on PATH.lock beside the file, taken without
    waiting (KitError when another run holds it) and removed by release(). The kernel drops the
    lock of a killed run, so a lock file left behind blocks no one."""

    def __init__(self, path: str | Path):
        import fcntl

        self.fd, self.path = None, Path(str(path) + ".lock")
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
    """Append schema rows to a CSV durably; the header is written once, when the file is new.

    A subclass may write more columns after the schema's (NEW_HEADER) and resume files with any
    header of ACCEPTED, each in its own format."""

    NEW_HEADER: list[str] = HEADER
    ACCEPTED: tuple = (HEADER, LEGACY_HEADER)

    def __init__(self, path: str | Path, resume: bool = False):
        self.path = Path(path)
        self.keys: set[tuple] = set()
        self.header = self.NEW_HEADER
        plain_csv(self.path)
        exists = self.path.is_file() and self.path.stat().st_size > 0
        if exists and not resume:
            raise KitError(f"{self.path} already exists; pass --resume to carry on with it, "
                           "or choose another --out")
        self._lock = Lock(self.path)
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
                existing = schema.conform(_read_schema_csv(self.path), str(self.path))
                self.keys = {row_key(r) for r in existing.to_dict("records")}
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
        if not first.endswith("\n"):
            return  # cut short before its newline: repair() drops it, _open writes it again
        cols = first.rstrip("\r\n").split(",")
        if cols not in self.ACCEPTED:
            raise KitError(f"{self.path} is not a kit measurement CSV (its header differs from "
                           "kit.data.schema.COLUMNS); choose another --out")
        self.header = cols

    def _write(self, text: str):
        self._file.write(text)
        self._file.flush()
        os.fsync(self._file.fileno())

    def __contains__(self, key: tuple) -> bool:
        return key in self.keys

    def append(self, row: dict) -> None:
        if set(row) - set(self.header) <= set(self.NEW_HEADER) - set(self.header):
            row = {k: v for k, v in row.items() if k in self.header}  # an older file's format
        key = row_key(row)
        if key in self.keys:
            return
        self._write(format_row(row, self.header))
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


def read_jsonl(path: str | Path) -> list[dict]:
    """The JSON objects of a JSON-lines file, in order; a line cut short by a kill, or anything
    else that is not a JSON object, is left out. A missing file is none."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


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


def is_gzip(path: Path) -> bool:
    """A measurement file kept gzipped (FILE.csv.gz), as the project's own measurements ship."""
    return Path(path).suffix == ".gz"


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped for a .gz; a broken archive is one KitError naming the file."""
    try:
        if is_gzip(path):
            with gzip.open(path, "rb") as f:
                return f.read()
        with open(path, "rb") as f:
            return f.read()
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise KitError(f"cannot read {path}: {e}") from None


def _read_schema_csv(path: Path) -> pd.DataFrame:
    text_cols = {c: "str" for c, d in schema.COLUMNS.items() if d in ("str", "boolean")}
    data = _read_bytes(path)
    dropped = False
    if data and not data.endswith(b"\n") and b"\n" in data:
        last = data[data.rfind(b"\n") + 1:]
        fields = next(csv.reader([last.decode("utf-8", "replace")]), [])
        # the file's own header, not the schema's: a file of some of the columns is read too
        head = data[:data.find(b"\n")].decode("utf-8-sig", "replace")
        header = next(csv.reader([head.rstrip("\r")]), [])
        if len(fields) < len(header):  # an unfinished line from a killed writer
            data = data[:data.rfind(b"\n") + 1]
            dropped = True
    if dropped:
        warnings.warn(f"{path}: ignored an unfinished last line", stacklevel=3)
    try:
        raw = pd.read_csv(io.BytesIO(data), dtype=text_cols, keep_default_na=False,
                          na_values=[""])
    except pd.errors.EmptyDataError:
        raise KitError(f"{path} is empty (expected a header line)") from None
    except (pd.errors.ParserError, ValueError, UnicodeDecodeError) as e:
        raise KitError(f"{path} is malformed: {e}") from None
    return raw


def load_measurements(path: str | Path) -> pd.DataFrame:
    """A measurement CSV (or a gzipped FILE.csv.gz) as a schema table: the kit's own (the
    collector's) or NeuSight's format.

    The format is told by the header: NeuSight's has OPName, Latency and Device.
    """
    path = Path(need_path(path, "the measurement file"))
    if path.is_dir():
        raise KitError(f"measurement file {path} is a folder; give a CSV file")
    if not path.is_file():
        raise KitError(f"measurement file not found: {path}")
    try:
        opener = gzip.open if is_gzip(path) else open
        # utf-8-sig: a BOM (Excel's "CSV UTF-8") is no part of the first column's name
        with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
            header = next(csv.reader([f.readline()]), [])
    except UnicodeDecodeError:
        raise KitError(f"{path} is not a text CSV") from None
    except (OSError, EOFError) as e:  # a .gz that is not gzip, or is cut short
        raise KitError(f"cannot read {path}: {e}") from None
    neusight = any(c in header for c in NEUSIGHT_COLUMNS) and "op" not in header
    if neusight:  # read_neusight_csv names a missing OPName, Latency or Device
        split = "test" if "test" in path.parts else "train"
        return from_neusight(read_neusight_csv(path), f"neusight:{path.name}", split)
    needed = ("op", "latency_ms")
    if not any(c.strip() for c in header):
        raise KitError(f"{path} is empty (expected a measurement CSV with a header)")
    if not all(c in header for c in needed):
        missing = [c for c in needed if c not in header]
        raise KitError(f"{path}: not a measurement CSV: missing column(s) {', '.join(missing)}; "
                       f"expected the kit schema ({', '.join(HEADER[:6])}, ...) or NeuSight's "
                       f"({', '.join(NEUSIGHT_COLUMNS)}, ...)")
    raw = _read_schema_csv(path)
    known = raw["op"].isin(list(schema.OPS))
    if not known.all():  # name the line of the first op the schema lacks
        i = int(np.flatnonzero(~known.to_numpy())[0])
        op = raw["op"].iloc[i]
        raise KitError(f"{path}:{i + 2}: " + ("op is empty" if pd.isna(op) else
                       f"unknown op {op!r}: the schema knows {', '.join(schema.OPS)}"))
    if "op_class" not in raw or raw["op_class"].isna().any():
        info = schema.op_columns(raw["op"].astype("str"))
        for col in info:
            raw[col] = info[col] if col not in raw else raw[col].where(raw[col].notna(), info[col])
    else:
        schema.op_columns(raw["op"].astype("str"))  # validates the op names
    return checked_table(raw, str(path))


TIMES = ("latency_ms", "kernel_ms")  # kernel_ms may be missing (the kit collector's rows only)


def bad_times(frame: pd.DataFrame, column: str) -> pd.Series:
    """True where a row's time (ms) in column is not a positive, finite number: NaN, zero,
    negative or infinite. A missing kernel_ms is no bad one (only the kit's collector has it)."""
    values = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    bad = ~(np.isfinite(values) & (values > 0))
    return bad & values.notna() if column == "kernel_ms" else bad


def check_times(frame: pd.DataFrame, where: str, lines: bool = True,
                raw: pd.DataFrame | None = None) -> None:
    """KitError naming the first row whose latency_ms (or kernel_ms, where it has one) is not a
    positive, finite number of ms. lines: the frame was read from the CSV `where` names (header
    on line 1); else rows are named by their index label. raw: the values as the file has them,
    for the message."""
    for col in TIMES:
        if col not in frame:
            continue
        wrong = bad_times(frame, col)
        if wrong.any():
            i = int(np.flatnonzero(wrong.to_numpy())[0])
            shown = raw if raw is not None and col in raw else frame
            row = f"row {i + 2}" if lines else f"the row at index {frame.index[i]!r}"
            raise KitError(f"{where}: {col} must be a positive number; {row} has "
                           f"{str(shown[col].iloc[i])!r}")


def _text(values: pd.Series) -> pd.Series:
    """values as text, a missing one kept missing (astype("str") alone writes it as the text
    "nan" on pandas 2; pandas 3's str dtype keeps it)."""
    return values.astype("str").where(values.notna())


def gpu_keys(frame: pd.DataFrame, where: str = "") -> pd.DataFrame:
    """frame with its gpu column as catalog keys: a row without one gets its device_name's (a CPU
    row stays NaN), and a gpu the catalog knows by another name ("T4", "Tesla T4") gets its key
    ("t4"), as NeuSight's Device is mapped; "cpu" is no GPU (NaN). A gpu the catalog lacks is kept
    as written: a collect on a GPU of the user's own file (--gpu-file) names one, and whoever
    predicts it says so."""
    from kit.hardware import get_gpu

    need_gpu = frame["gpu"].isna() & frame["device_name"].notna()
    if need_gpu.any():  # rows without a catalog key: look the device up (CPU rows stay NaN)
        keys = _text(schema.gpu_keys_for(frame.loc[need_gpu, "device_name"], where))
        frame["gpu"] = frame["gpu"].where(~need_gpu, keys.reindex(frame.index))
    table = {}
    for name in pd.unique(frame["gpu"].dropna()):
        text = str(name).strip()
        if not text or text.lower() == "cpu" or text.lower().startswith("cpu:"):
            table[name] = np.nan
            continue
        try:
            table[name] = get_gpu(text).key
        except KitError:
            table[name] = name
    if any(k != v for k, v in table.items()):
        frame["gpu"] = _text(frame["gpu"].map(table))
    return frame


def checked_table(raw: pd.DataFrame, where: str, lines: bool = True) -> pd.DataFrame:
    """A table of measured rows (with op_class filled) as the schema's, with the checks every
    reader applies (load_measurements, and kit.predict.evaluate on a caller's own frame): column
    types, each row's op class, dtype and shape (schema.check_rows), positive finite times
    (check_times) and the gpu as catalog keys (gpu_keys). KitError names `where` and the row:
    its CSV line with lines, else its index label."""
    frame = schema.conform(raw, where if lines else "")
    schema.check_rows(frame, where, lines=lines)  # what evaluate would refuse, named for every reader
    check_times(frame, where, lines=lines, raw=raw if lines else None)
    return gpu_keys(frame, where)
