"""A digest of source files' contents, for cache keys that must change whenever the code that
built a cached result does (the data tables' loader, the zoo's captured graphs, `kit models`'
table). Contents, not mtimes: two checkouts written in the same second had shared a key."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable


def contents_digest(files: Iterable[tuple[str, Path]]) -> bytes:
    """sha256 over each (name, path): the name, then the file's bytes, or a 'missing' mark for a
    file that cannot be read (so a file that is gone changes the key rather than raising)."""
    h = hashlib.sha256()
    for name, path in files:
        try:
            h.update(name.encode() + b"\0" + Path(path).read_bytes() + b"\0")
        except OSError:
            h.update(name.encode() + b"\0missing\0")
    return h.digest()
