"""Paths the CLI writes to, checked before any work: an empty name, a folder where a file goes
(or the reverse), a parent that is a file, or an output that is one of the command's own inputs
(writing it would destroy the input) is one KitError, never a clobbered file or a silent no-op.
A missing parent folder is fine: the commands create it, as they always have.
"""
from __future__ import annotations

import os
from pathlib import Path

from kit.errors import KitError, inside_kit


def nonempty(s: str) -> str:
    """argparse type: any text but the empty string (an empty path or value is never meant)."""
    import argparse

    if not s.strip():
        raise argparse.ArgumentTypeError("expected a value, got an empty string")
    return s


def model_files(model: str | None) -> list[str]:
    """The files a model argument reads: a config .json, or a 'module:callable' module's .py. A
    zoo name reads no file (a file or folder of that name in the working folder is not it)."""
    if not model:
        return []
    mod, sep, _ = model.partition(":")
    if sep and mod:
        base = mod.replace(".", os.sep)
        return [base + ".py", os.path.join(base, "__init__.py"), *_module_origin(mod)]
    return [model] if model.lower().endswith(".json") else []


def _module_origin(mod: str) -> list[str]:
    """The files module `mod` may be read from on the import path (PYTHONPATH, installed
    packages; the working folder is load_callable's first), found without importing anything."""
    import sys

    base = mod.replace(".", os.sep)
    out = []
    for entry in sys.path:
        folder = Path(entry or ".")
        for name in (base + ".py", os.path.join(base, "__init__.py")):
            try:
                if (folder / name).is_file():
                    out.append(str(folder / name))
            except OSError:  # an entry Python's import skips too (no permission, a bad name)
                pass
    return out


def _same(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    except OSError:
        return False


def output_path(value: str | None, flag: str, inputs=(), folder: bool = False,
                package_ok: bool = False) -> str | None:
    """value, once it is a usable output (a file, or a folder with folder=True) under folders (or
    folders to be made), which is none of `inputs` (paths the command reads; None and "" are
    ignored) and not inside the kit package (its code, catalog and shipped weights), unless
    package_ok (kit train, whose weights check says what may be replaced there)."""
    if value is None:
        return None
    if not str(value).strip():
        raise KitError(f"{flag} is empty; give a {'folder' if folder else 'file'} name")
    p = Path(value)
    if not package_ok and inside_kit(p):
        raise KitError(f"{flag} {value} is in the kit package: writing there would change the kit "
                       "itself (its code, GPU catalog or shipped weights); choose a path outside it")
    if not folder and p.is_dir():
        raise KitError(f"{flag} {value} is a directory; give a file name")
    if folder and p.exists() and not p.is_dir():
        raise KitError(f"{flag} {value} is a file; give a folder")
    parent = next((a for a in p.absolute().parents if a.exists()), None)
    if parent is not None and not parent.is_dir():
        raise KitError(f"{flag} {value}: {parent} is a file, not a folder")
    for given in inputs:
        if not given:
            continue
        if _same(p, Path(given)):
            raise KitError(f"{flag} {value} is the input file {given}: writing it would destroy "
                           "the input; choose another name")
        if Path(given).is_dir() and Path(given).resolve() in p.resolve().parents:
            raise KitError(f"{flag} {value} is in the input folder {given}: writing there would "
                           "change that input (a file read next time, or one overwritten); "
                           "choose a path outside it")
    return value
