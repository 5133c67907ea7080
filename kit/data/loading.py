"""Measurement CSVs read back as schema tables: the kit's own (the collector's) or NeuSight's,
plain or gzipped, with the checks every reader applies (checked_table). The appender that writes
them is kit.data.records.
"""
from __future__ import annotations

import csv
import gzip
import io
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from kit.data import schema
from kit.data.csv_read import data_line, read_csv_strict
from kit.data.neusight import NEUSIGHT_COLUMNS, from_neusight, read_neusight_csv
from kit.errors import KitError, need_path


# the columns every kit collector's file starts with: the schema's, less those added later
KIT_WRITTEN = [c for c in schema.COLUMNS if c not in schema.LATER_COLUMNS]


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
        start = 0  # its first line that is not blank (pandas skips those)
        while not data[start:data.find(b"\n", start)].strip(b" \t\r") and data.find(b"\n", start) >= 0:
            start = data.find(b"\n", start) + 1
        head = data[start:data.find(b"\n", start)].decode("utf-8-sig", "replace")
        header = next(csv.reader([head.rstrip("\r")]), [])
        # an unfinished line from a killed writer: fields missing, or, in a file of the kit's
        # collectors (their header starts with the schema's columns), any last line without its
        # newline: they write each line whole with it, and a kill can cut the last field short
        # (a latency_median_ms of 0.005268 read as 0.005)
        if len(fields) < len(header) or header[:len(KIT_WRITTEN)] == KIT_WRITTEN:
            data = data[:data.rfind(b"\n") + 1]
            dropped = True
    if dropped:
        warnings.warn(f"{path}: ignored an unfinished last line", stacklevel=3)
    try:
        raw = read_csv_strict(io.BytesIO(data), str(path), dtype=text_cols, keep_default_na=False,
                              na_values=[""])
    except pd.errors.EmptyDataError:
        raise KitError(f"{path} is empty (expected a header line)") from None
    except (pd.errors.ParserError, ValueError, UnicodeDecodeError) as e:
        raise KitError(f"{path} is malformed: {e}") from None
    return raw


class NotMeasurementCSV(KitError):
    """A CSV without the measurement columns (nvidia-smi samples, a sweep's log): a folder's
    readers (`kit evaluate --test DIR`, `kit train --extra DIR`) skip such files and say so."""


MEASUREMENT_SUFFIXES = (".csv", ".csv.gz")


def measurement_files(folder: Path) -> list[Path]:
    """Every CSV (or .csv.gz) in folder and its subfolders, sorted: what a folder of
    measurements holds for its readers."""
    return sorted(f for f in Path(folder).rglob("*") if f.is_file() and f.name.endswith(MEASUREMENT_SUFFIXES))


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
            line = f.readline()
            while line and not line.strip(" \t\r\n"):  # blank lines before it: pandas skips them too
                line = f.readline()
            header = next(csv.reader([line]), [])
    except UnicodeDecodeError:
        raise KitError(f"{path} is not a text CSV") from None
    except (OSError, EOFError) as e:  # a .gz that is not gzip, or is cut short
        raise KitError(f"cannot read {path}: {e}") from None
    neusight = any(c in header for c in NEUSIGHT_COLUMNS) and "op" not in header
    if neusight and not all(c in header for c in NEUSIGHT_COLUMNS):
        # some of NeuSight's columns, not all: a table of its own (NeuSight's fp16mm.csv has
        # B, M, N, K, Latency, pred, err and no OPName or Device), not a measurement CSV: a
        # folder's reader skips it and says so, as it does other CSVs
        missing = [c for c in NEUSIGHT_COLUMNS if c not in header]
        raise NotMeasurementCSV(f"{path}: not a measurement CSV: missing column(s) {', '.join(missing)} "
                                f"of NeuSight's ({', '.join(NEUSIGHT_COLUMNS)}), and op, latency_ms of "
                                "the kit schema's")
    if neusight:
        split = "test" if "test" in path.parts else "train"
        return from_neusight(read_neusight_csv(path), f"neusight:{path.name}", split)
    needed = ("op", "latency_ms")
    if not any(c.strip() for c in header):
        raise KitError(f"{path} is empty (expected a measurement CSV with a header)")
    if not all(c in header for c in needed):
        missing = [c for c in needed if c not in header]
        raise NotMeasurementCSV(f"{path}: not a measurement CSV: missing column(s) {', '.join(missing)}; "
                       f"expected the kit schema ({', '.join(list(schema.COLUMNS)[:6])}, ...) or NeuSight's "
                       f"({', '.join(NEUSIGHT_COLUMNS)}, ...)")
    raw = _read_schema_csv(path)
    known = raw["op"].isin(list(schema.OPS))
    if not known.all():  # name the line of the first op the schema lacks
        i = int(np.flatnonzero(~known.to_numpy())[0])
        op = raw["op"].iloc[i]
        raise KitError(f"{path}:{data_line(path, i)}: " + ("op is empty" if pd.isna(op) else
                       f"unknown op {op!r}: the schema knows {', '.join(schema.OPS)}"))
    if "op_class" not in raw or raw["op_class"].isna().any():
        info = schema.op_columns(raw["op"].astype("str"))
        for col in info:
            raw[col] = info[col] if col not in raw else raw[col].where(raw[col].notna(), info[col])
    else:
        schema.op_columns(raw["op"].astype("str"))  # validates the op names
    return checked_table(raw, str(path))


# kernel_ms and latency_median_ms may be missing (the kit collector's rows only); a given one is
# checked like latency_ms (a latency_median_ms of -1 had been read without a word)
TIMES = ("latency_ms", "kernel_ms", "latency_median_ms")
MIN_TIME_MS, MAX_TIME_MS = schema.MIN_TIME_MS, schema.MAX_TIME_MS


def bad_times(frame: pd.DataFrame, column: str) -> pd.Series:
    """True where a row's time (ms) in column is not a finite number from MIN_TIME_MS to
    MAX_TIME_MS: NaN, zero, negative, infinite, subnormal, or past an hour. A missing kernel_ms or
    latency_median_ms is no bad one (only the kit's collector has them)."""
    values = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    bad = ~(np.isfinite(values) & (values >= MIN_TIME_MS) & (values <= MAX_TIME_MS))
    return bad if column == "latency_ms" else bad & values.notna()


def check_times(frame: pd.DataFrame, where: str, lines: bool = True,
                raw: pd.DataFrame | None = None) -> None:
    """KitError naming the first row whose latency_ms (or kernel_ms or latency_median_ms, where it
    has one) is not a positive, finite number of ms. lines: the frame was read from the CSV
    `where` names (header on line 1); else rows are named by their index label. raw: the values
    as the file has them, for the message."""
    for col in TIMES:
        if col not in frame:
            continue
        wrong = bad_times(frame, col)
        if wrong.any():
            i = int(np.flatnonzero(wrong.to_numpy())[0])
            shown = raw if raw is not None and col in raw else frame
            row = f"row {data_line(where, i)}" if lines else f"the row at index {frame.index[i]!r}"
            raise KitError(f"{where}: {col} must be a positive number; {row} has "
                           f"{str(shown[col].iloc[i])!r} (the least taken is {MIN_TIME_MS:g} ms, the most "
                           f"{MAX_TIME_MS:g} ms: an hour)")


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
    for col in TIMES:  # before conform makes floats of them: True is no time of 1 ms
        if col in raw and (raw[col].dtype == bool or raw[col].dtype == object):
            is_bool = raw[col].map(lambda v: isinstance(v, (bool, np.bool_))).astype(bool)
            if is_bool.any():
                i = int(np.flatnonzero(is_bool.to_numpy())[0])
                row = f"row {data_line(where, i)}" if lines else f"the row at index {raw.index[i]!r}"
                raise KitError(f"{where}: {col} must be a positive number; {row} has a bool "
                               f"({raw[col].iloc[i]!r})")
    frame = schema.conform(raw, where if lines else "")
    # elem_kind and scalar follow from the op, and the predictors read them: a CSV with op_class
    # but neither had its addu rows refused as 'unknown elementwise kind nan' (and a missing
    # scalar priced them as a tensor add); check_rows refuses one given that contradicts the op
    if frame["op"].isin(list(schema.OPS)).all():  # (else check_rows names the unknown op)
        info = schema.op_columns(frame["op"].astype("str"))
        for col in ("elem_kind", "scalar"):
            frame[col] = frame[col].where(frame[col].notna(), info[col])
    schema.check_rows(frame, where, lines=lines)  # what evaluate would refuse, named for every reader
    check_times(frame, where, lines=lines, raw=raw if lines else None)
    return gpu_keys(frame, where)
