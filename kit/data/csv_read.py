"""pandas.read_csv for measurement files, strict about rows longer than the header."""
from __future__ import annotations

import csv
import gzip
import re
import warnings

import pandas as pd

from kit.errors import KitError


def read_csv_strict(source, where: str, **kw) -> pd.DataFrame:
    """pd.read_csv(source, **kw) that never takes a first column for the index: a file whose
    rows all carry one field more than its header had its first column read as the index, so
    every other column shifted by one ("unknown op '0.5'"). Rows with more fields than the
    header are a KitError naming `where` (pandas' ParserError, raised by the caller's handler,
    or its warning when every row is longer), and so is a column named twice."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.ParserWarning)
        try:
            frame = pd.read_csv(source, index_col=False, **kw)
        except pd.errors.ParserWarning:
            head = pd.read_csv(source, nrows=0, **{k: v for k, v in kw.items() if k != "dtype"}) \
                if not hasattr(source, "seek") else None
            cols = f" ({len(head.columns)} columns)" if head is not None else ""
            raise KitError(f"{where}: its rows have more fields than its header{cols}; a field "
                           "is missing from the header or a row has one too many") from None
    # pandas renames a repeated column "latency_ms.1", and readers took the first without a word
    twice = sorted({m.group(1) for c in frame.columns
                    if (m := re.fullmatch(r"(.+)\.(\d+)", str(c))) and m.group(1) in frame.columns})
    if twice:
        raise KitError(f"{where}: column(s) {', '.join(twice)} appear twice in the header; give each once")
    return frame


def data_line(path, i: int) -> int:
    """The line of the CSV at path on which its data row i (0-based, as pandas reads the file)
    begins: pandas skips blank (or blank-looking, spaces and tabs alone) lines, so "row + 2" had
    named line 4 for the bad row on line 6 of a file with two blank lines. Only an error message
    needs it: the file is read again here, row by row (a quoted field over several lines counts
    them all). A file that cannot be read again falls back to i + 2."""
    try:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8-sig", errors="replace", newline="") as f:
            reader = csv.reader(f)
            end, row = 0, -1  # the last line read; the header is row -1
            for fields in reader:
                start, end = end + 1, reader.line_num
                if not fields or (len(fields) == 1 and not fields[0].strip(" \t")):
                    continue  # what pandas skips
                if row == i:
                    return start
                row += 1
    except (OSError, EOFError, csv.Error, ValueError):
        pass
    return i + 2
