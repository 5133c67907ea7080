"""Reading JSON-lines files (collect runs' results, the parallel model's kernel-time cache), in a
module of its own so that a reader needs neither pandas nor numpy (kit.data.records, which
writes them, imports both)."""
from __future__ import annotations

import json
from pathlib import Path


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
