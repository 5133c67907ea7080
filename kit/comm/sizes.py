"""Message sizes as the collectors and `kit comm` take them: bytes, with binary K/M/G suffixes,
lists and doubling (or xFACTOR) ranges.
"""
from __future__ import annotations

import re

from kit.errors import KitError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _whole_bytes(value, spec) -> int:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if not (v == v and abs(v) < float("inf")) or v != int(v):
        raise KitError(f"sizes must be whole byte counts, got {value!r} in {spec!r}")
    return int(v)


def parse_sizes(spec) -> list[int]:
    """'1K:4M' (doubling), '1K:4M:4' (x4 steps), '1K,64K,1M', or a list of byte counts."""
    if isinstance(spec, (list, tuple)):
        out = [_whole_bytes(s, spec) if not isinstance(s, str) else parse_sizes(s)[0] for s in spec]
    else:
        text = str(spec).strip().upper().replace("IB", "").replace("I", "")

        def one(tok: str) -> int:
            m = re.fullmatch(r"((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:E[0-9]+)?)\s*([KMG]?)B?", tok.strip())
            if not m:
                raise KitError(f"bad size in {spec!r}: use bytes or K/M/G suffixes (binary), e.g. 64K")
            value = float(m.group(1)) * _UNITS[m.group(2)]
            if value != int(value):
                raise KitError(f"bad size {tok.strip()!r} in {spec!r}: sizes are whole bytes")
            return int(value)

        if ":" in text:
            parts = text.split(":")
            if len(parts) not in (2, 3):
                raise KitError(f"bad size range {spec!r}: use MIN:MAX or MIN:MAX:FACTOR")
            lo, hi = one(parts[0]), one(parts[1])
            try:
                factor = float(parts[2]) if len(parts) == 3 else 2.0
            except ValueError:
                raise KitError(f"bad size range {spec!r}: FACTOR must be a number > 1") from None
            if lo <= 0 or hi < lo or not 1 < factor < float("inf"):  # also NaN
                raise KitError(f"bad size range {spec!r}: need 0 < MIN <= MAX and a finite FACTOR > 1")
            out, s = [], float(lo)
            while s <= hi * (1 + 1e-9):
                out.append(int(round(s)))
                s *= factor
        else:
            out = [one(t) for t in text.split(",") if t.strip()]
    if not out or any(s <= 0 for s in out):
        raise KitError(f"sizes must be positive byte counts, got {spec!r}")
    return sorted(set(out))
