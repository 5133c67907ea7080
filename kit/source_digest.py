"""A digest of source files' contents, for cache keys that must change whenever the code that
built a cached result does (the data tables' loader, the zoo's captured graphs, `kit models`'
table). Contents, not mtimes: two checkouts written in the same second had shared a key."""
from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Iterable

import kit


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


_MEMO: dict = {}  # _stamp_and_signature's hashes, by the files' names, paths, sizes and mtimes (ns)


def _stamp_and_signature(files):
    """A 16-hex-digit stamp of the files' contents (contents_digest), hashed again only when a
    file's size or mtime changes (a warm prediction asks for its stamps several times a
    configuration, a decode prediction 7, and hashing the capture code is ~2 ms a time), and
    the files' signature: (name, path, size, mtime in ns) each."""
    files = [(name, Path(path)) for name, path in files]
    sig = []
    for name, path in files:
        try:
            st = path.stat()
            sig.append((name, str(path), st.st_size, st.st_mtime_ns))
        except OSError:
            sig.append((name, str(path), None, None))
    sig = tuple(sig)
    if sig not in _MEMO:
        _MEMO[sig] = contents_digest(files).hex()[:16]
    return _MEMO[sig], sig


_FIRST: dict = {}  # process_stamp's first stamp of each label in this process (None: not known)
_WARNED: set = set()  # the labels process_stamp has warned of
_STARTED_NS = kit.IMPORTED_NS  # when this process imported the kit


def process_stamp(label: str, files: Iterable[tuple[str, Path]]) -> str | None:
    """The files' stamp as this process first found them, or None once the files on disk differ
    from it. A process runs the code it imported: a Jupyter kernel left open across an edit or a
    `git pull` had stored its old code's results under the new code's key, which fresh
    processes then served (a 2 -> 20 us kernel floor: 6.649 ms served where the new code gives
    9.193). None tells the caller to neither read nor write its disk cache: the code in memory
    is then not known (the old, or the new one under autoreload).

    The first stamp is taken at first use, after the import: a file written between the kit's
    import and then (a kernel opened, a `git pull`, then its first prediction) had given the new
    code's stamp to the old code in memory. Such a file (its mtime after the import, and not in
    the future: an archive unpacked from a machine whose clock ran ahead says nothing) makes
    the stamp None for the whole process."""
    now, sig = _stamp_and_signature(files)
    if label not in _FIRST:
        clock = time.time_ns()
        written = any(m is not None and _STARTED_NS < m <= clock for *_, m in sig)
        _FIRST[label] = None if written else now
    first = _FIRST[label]
    if first is not None and now == first:
        return first
    if label not in _WARNED:  # once: each later call is slower (recomputed), never wrong
        _WARNED.add(label)
        import warnings

        warnings.warn(f"the kit's code on disk changed after this process imported it: its {label} "
                      f"cache is off until the process restarts (restart the kernel)", stacklevel=3)
    return None
