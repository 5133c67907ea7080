"""The tables file `kit shard` reads: CSV with name, rows, dim, pooling [, zipf_alpha, dtype]."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from kit.embedding import Table, Uniform, Zipf
from kit.errors import KitError
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
    if whole:
        if v != int(v):
            raise KitError(f"{where}: {col} must be a whole number, got {text!r}")
        return int(v)
    return v


def read_tables(path: str | Path) -> list[Table]:
    """Tables from a CSV; every problem (missing file/column, bad value) is a KitError."""
    path = Path(path)
    if not path.is_file():
        raise KitError(f"tables file not found: {path}")
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
            header = rows and list(rows[0].keys()) or []
            if not rows:
                f.seek(0)
                header = next(csv.reader(f), [])
    except (UnicodeDecodeError, csv.Error) as e:
        raise KitError(f"{path} is not a readable CSV: {e}") from None
    header = [h.strip() for h in header if h is not None]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise KitError(f"{path}: missing column(s) {', '.join(missing)}; the tables CSV needs "
                       f"{', '.join(REQUIRED)} and may have {', '.join(OPTIONAL)}")
    if not rows:
        raise KitError(f"{path}: no tables (only a header)")
    tables, names = [], set()
    for i, raw in enumerate(rows, start=2):
        if None in raw:
            raise KitError(f"{path} line {i}: more fields than the header has columns")
        r = {k.strip(): (v or "").strip() for k, v in raw.items()}
        where = f"{path} line {i}"
        name = r["name"]
        if not name:
            raise KitError(f"{where}: name is empty")
        if name in names:
            raise KitError(f"{where}: table name {name!r} appears twice")
        names.add(name)
        alpha = r.get("zipf_alpha", "")
        dist = Zipf(_number(alpha, "zipf_alpha", where, False)) if alpha else Uniform()
        dtype = r.get("dtype") or "fp32"
        if dtype not in DTYPE_BYTES:
            raise KitError(f"{where}: dtype {dtype!r} unknown; choose one of {', '.join(DTYPE_BYTES)}")
        tables.append(Table(rows=_number(r["rows"], "rows", where, True),
                            dim=_number(r["dim"], "dim", where, True),
                            pooling=_number(r["pooling"], "pooling", where, False),
                            dtype=dtype, name=name, distribution=dist))
    return tables
