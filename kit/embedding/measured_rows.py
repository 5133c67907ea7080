"""The embedding collector's CSV (kit.embedding.collect): its columns, the key a resumed run skips
a config by, the check of every row read back, the reader (load) and the appender that writes it
(kit.data.records.Appender, with this file's format).

The distribution column holds its spec (Distribution.spec: "zipf:1.05", "reuse:0.3,0.2"); files
from before hold describe() labels, whose zipf and uniform rows still resume (_spec).
"""
from __future__ import annotations

import csv
import io
import warnings
from pathlib import Path

from kit.data.records import Appender, first_line, refuse_foreign_cut_header
from kit.embedding.backends import TORCH_DTYPES
from kit.embedding.distributions import parse_distribution
from kit.errors import KitError

COLUMNS = ["backend", "device", "device_name", "pass", "optimizer", "mode", "dtype", "batch", "rows",
           "dim", "pooling", "tables", "distribution", "unique_rows", "lookups", "latency_ms",
           "latency_min_ms", "repeats", "torch_version"]
KEY = ["backend", "device_name", "pass", "optimizer", "mode", "dtype", "batch", "rows", "dim",
       "pooling", "tables", "distribution"]


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
        raise _not_ours(path)
    return [_checked(cells, f"{path}:{i}") for i, cells in enumerate(lines[1:], start=2) if cells], text


def _not_ours(path) -> KitError:
    return KitError(f"{path} is not an embedding measurement CSV (its header differs from "
                    f"{', '.join(COLUMNS[:5])}, ...); choose another --out")


def _key(row: dict) -> tuple:
    return tuple(_spec(row[k]) if k == "distribution" else str(row[k]) for k in KEY)


def _spec(label: str) -> str:
    """The spec of a stored distribution: itself, or an older file's zipf(1.05) label as its spec
    (a reuse or index-tensor label is kept as it is: it matches no spec, so those rows re-run)."""
    try:
        return parse_distribution(label).spec()
    except KitError:
        return label


class RowAppender(Appender):
    """Appends the collector's rows to its CSV, one fsynced line each (kit.data.records.Appender):
    a resumed file must have the collector's header (checked before anything is cut), its
    unfinished last line is dropped (a cut header too: it is written again), and a row whose key
    the file holds is not written again."""

    NEW_HEADER = COLUMNS
    ACCEPTED = (COLUMNS,)
    SIDE_FILES = (".meta.json",)  # kit.embedding.collect keeps no failure log or marker

    def _check_header(self):
        first = first_line(self.path, "an embedding measurement CSV")
        if first.endswith("\n") and next(csv.reader([first]), []) != COLUMNS:
            raise _not_ours(self.path)
        if not first.endswith("\n"):  # a cut header is written again; other text is not ours
            refuse_foreign_cut_header(self.path, first, (COLUMNS,), "an embedding measurement CSV")

    def _read_keys(self) -> set[tuple]:
        return {_key(r) for r in _read(self.path)[0]}

    def key(self, row) -> tuple:
        return _key(row)

    def line(self, row: dict) -> str:
        return _format(row)


def load(path: str | Path):
    """A collector CSV as a DataFrame, every row checked (KitError naming the line of a bad one)."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise KitError(f"embedding measurement file not found: {path}")
    _, text = _read(path)
    return pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""])
