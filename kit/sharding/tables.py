"""The tables file `kit shard` reads: CSV with name, rows, dim, pooling [, zipf_alpha, dtype]."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from kit.embedding import Table, Uniform, Zipf
from kit.errors import KitError, refuse_device
from kit.whole_numbers import exact_whole
from kit.ops import DTYPE_BYTES

REQUIRED = ("name", "rows", "dim", "pooling")
OPTIONAL = ("zipf_alpha", "dtype")


def _number(text: str, col: str, where: str, whole: bool):
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise KitError(f"{where}: {col} must be a number, got {text!r}") from None
    if not math.isfinite(v) or v < 0 or (col != "zipf_alpha" and v <= 0):
        raise KitError(f"{where}: {col} must be {'>= 0' if col == 'zipf_alpha' else 'positive'}, got {text!r}")
    if whole:  # exactly (kit.whole_numbers): through float, rows 1000.0000000000000001 had been 1000
        try:
            return exact_whole(text)
        except (ValueError, OverflowError):
            raise KitError(f"{where}: {col} must be a whole number, got {text!r}") from None
    return v


def read_tables(path: str | Path) -> list[Table]:
    """Tables from a CSV; every problem (missing file/column, bad value) is a KitError."""
    path = Path(path)
    refuse_device(path, "tables file")
    if path.is_dir():
        raise KitError(f"{path} is a directory, expected a tables CSV file")
    if not path.is_file():
        raise KitError(f"tables file not found: {path}")
    try:  # utf-8-sig: a spreadsheet's byte-order mark is not part of the first column's name
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader, rows, lines = csv.DictReader(f), [], []
            for raw in reader:  # each record's first line: blank lines and quoted line breaks
                rows.append(raw)  # had shifted the lines the messages name (enumerate's count)
                lines.append(reader.line_num - sum(v.count("\n") for v in _fields(raw)))
            f.seek(0)
            header = next(csv.reader(f), [])  # as written: DictReader keeps one of two same names
    except (UnicodeDecodeError, csv.Error) as e:
        raise KitError(f"{path} is not a readable CSV: {e}") from None
    header = [h.strip() for h in header if h is not None]
    twice = sorted({h for h in header if h and header.count(h) > 1})
    if twice:  # the last of them had been read, the first dropped without a word
        raise KitError(f"{path}: column(s) {', '.join(twice)} appear twice in the header; give each once")
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise KitError(f"{path}: missing column(s) {', '.join(missing)}; the tables CSV needs "
                       f"{', '.join(REQUIRED)} and may have {', '.join(OPTIONAL)}")
    unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
    if unknown:  # a misspelt zipf_alpha would silently make every table uniform
        raise KitError(f"{path}: unknown column(s) {', '.join(map(repr, unknown))}; the tables CSV has "
                       f"{', '.join(REQUIRED)} and may have {', '.join(OPTIONAL)}")
    if not rows:
        raise KitError(f"{path}: no tables (only a header)")
    tables = []
    for i, raw in zip(lines, rows):
        if None in raw:
            raise KitError(f"{path} line {i}: more fields than the header has columns")
        r = {k.strip(): (v or "").strip() for k, v in raw.items()}
        where = f"{path} line {i}"
        name = r["name"]
        if not name:
            raise KitError(f"{where}: name is empty")
        alpha = r.get("zipf_alpha", "")
        dist = Zipf(_number(alpha, "zipf_alpha", where, False)) if alpha else Uniform()
        dtype = r.get("dtype") or "fp32"
        if dtype not in DTYPE_BYTES:
            raise KitError(f"{where}: dtype {dtype!r} unknown; choose one of {', '.join(DTYPE_BYTES)}")
        n_rows, dim = _number(r["rows"], "rows", where, True), _number(r["dim"], "dim", where, True)
        pooling = _number(r["pooling"], "pooling", where, False)
        try:  # Table bounds the size and pooling: its message, with the line
            tables.append(Table(rows=n_rows, dim=dim, pooling=pooling, dtype=dtype, name=name,
                                distribution=dist))
        except KitError as e:
            raise KitError(f"{where}: {e}") from None
    check_unique_names(tables, lambda i: f"{path} line {lines[i]}")
    return tables


def _fields(raw: dict) -> list[str]:
    """A DictReader record's text fields: a long line's extra fields are a list under None."""
    out = []
    for v in raw.values():
        out += v if isinstance(v, list) else [v or ""]
    return out


def check_unique_names(tables, where) -> None:
    """A KitError when two tables share a name (the plan would list both under it); unnamed
    tables are told apart by their place. where(i) says where the i-th table came from."""
    first: dict[str, int] = {}
    for i, t in enumerate(tables):
        if t.name and t.name in first:
            raise KitError(f"{where(i)}: table name {t.name!r} appears twice (first at {where(first[t.name])})")
        first.setdefault(t.name, i)


def as_tables(tables, who: str = "tables") -> list[Table]:
    """tables as a list of kit.embedding.Table: a tables CSV (read_tables) or such a list, no two
    of the same name (check_unique_names); anything else, an empty list included, is a KitError
    naming it."""
    if isinstance(tables, str) or hasattr(tables, "__fspath__"):
        if not str(tables).strip():
            raise KitError(f"{who} must be a path (a non-empty string or Path), got {tables!r}")
        return read_tables(tables)
    if not isinstance(tables, (list, tuple)) or not tables or not all(isinstance(t, Table) for t in tables):
        raise KitError(f"{who} must be a CSV path or a list of kit.embedding.Table (a non-empty "
                       f"list), got {tables!r:.200}")
    check_unique_names(tables, lambda i: f"{who}[{i}]")
    return list(tables)


def synthetic_tables(n: int = 26, seed: int = 0, alpha: float | None = None) -> list[Table]:
    """A seeded, DLRM-like mix: rows 10^3-10^7.5 (log-uniform), dims 16-256, pooling 1-80,
    Zipf α in [0.3, 1.3] (or the given α for every table)."""
    import numpy as np

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise KitError(f"number of tables must be a positive whole number, got {n!r}")
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        rows = int(10 ** rng.uniform(3, 7.5))
        dim = int(rng.choice([16, 32, 64, 128, 256]))
        pooling = float(rng.integers(1, 80))
        a = float(rng.uniform(0.3, 1.3))
        out.append(Table(rows=rows, dim=dim, pooling=pooling, name=f"t{i:02d}",
                         distribution=Zipf(alpha if alpha is not None else a)))
    return out
