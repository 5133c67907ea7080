"""Message sizes as the collectors and `kit comm` take them: bytes, with binary K/M/G suffixes,
lists and doubling (or xFACTOR) ranges.
"""
from __future__ import annotations

import math
import re

from kit.errors import KitError, comma_items
from kit.whole_numbers import exact_whole

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# 1 TiB: no rank holds a buffer this big, so a larger size is a typo (1e30), for measuring
# (kit collect-comm) and predicting (kit comm predict) alike
MAX_BYTES = 1 << 40
# sizes one sweep may expand to: a doubling sweep over all of 1 B .. 1 TiB is 41; a factor a hair
# over 1 (1K:1M:1.0000001) asked for ~7e7 and ran for minutes before printing anything
MAX_SIZES = 10_000


def _whole_bytes(value, spec) -> int:
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past a float (10**400)
        v = float("nan")
    if not (v == v and abs(v) < float("inf")) or v != int(v):
        raise KitError(f"sizes must be whole byte counts, got {value!r} in {spec!r}")
    return int(v)


class TooLarge(KitError):
    """A size past MAX_BYTES: a reason of its own, which `kit comm predict --bytes` passes on
    instead of its generic one."""


def check_max_bytes(size: float, what: str) -> None:
    """A TooLarge naming `what` (the size as the user wrote it) for a size past MAX_BYTES; inf
    (1e400 reads as inf) and NaN too."""
    if not size <= MAX_BYTES:
        raise TooLarge(f"{what} is more than any device holds (at most {MAX_BYTES // 2**30} GiB "
                       "a buffer); give a smaller size")


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
            check_max_bytes(value, f"size {tok.strip()!r} in {spec!r}")  # first: 1e400 is inf
            try:  # exactly: through float, 1.0000000000000001 had passed as 1 byte
                return exact_whole(m.group(1), _UNITS[m.group(2)])
            except ValueError:
                raise KitError(f"bad size {tok.strip()!r} in {spec!r}: sizes are whole bytes") from None

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
            count = math.floor(math.log(hi * (1 + 1e-9) / lo) / math.log(factor)) + 1  # as the loop below
            if count > MAX_SIZES:  # counted before expanding: the loop would run that many times
                raise KitError(f"size range {spec!r} expands to {count:,} sizes, more than "
                               f"{MAX_SIZES:,}; give a larger FACTOR or a narrower range")
            out, s = [], float(lo)
            while s <= hi * (1 + 1e-9):
                out.append(int(round(s)))
                s *= factor
        else:
            try:
                toks = comma_items(text)
            except ValueError as e:
                raise KitError(f"bad size list {spec!r}: {e}") from None
            out = [one(t) for t in toks]
    if not out or any(s <= 0 for s in out):
        raise KitError(f"sizes must be positive byte counts, got {spec!r}")
    check_max_bytes(max(out), f"size {max(out):.4g} B in {spec!r}")  # a list of numbers
    return sorted(set(out))
