"""Type checks that accept numpy's scalars without importing numpy.

A value can only be a numpy bool or integer once numpy is loaded, so these look it up in
sys.modules instead of importing it: the modules a fresh `kit` process loads for every command
(kit.ops, through the parser) and for a collective (kit.comm.predict) had imported numpy for such
checks alone, 0.1 s of a 0.19 s `kit comm predict`.
"""
from __future__ import annotations

import sys


def is_bool(x) -> bool:
    """isinstance(x, (bool, numpy.bool_))."""
    np = sys.modules.get("numpy")
    return isinstance(x, bool) or (np is not None and isinstance(x, np.bool_))


def is_int(x) -> bool:
    """isinstance(x, (int, numpy.integer)) (a bool is an int, as there)."""
    np = sys.modules.get("numpy")
    return isinstance(x, int) or (np is not None and isinstance(x, np.integer))
