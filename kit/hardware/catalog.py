"""The GPU catalog: lookup by key, name or alias (case-insensitive), plus user-added GPUs."""
from __future__ import annotations

import difflib
import json
import re
from functools import lru_cache
from pathlib import Path

from kit.errors import KitError, need_path, refuse_device
from kit.hardware.gpu import GPU, gpu_from_dict

CATALOG_PATH = Path(__file__).with_name("gpus.json")

_user_gpus: dict[str, GPU] = {}


_NOT_ALNUM = re.compile(r"[^a-z0-9]")


def _norm(name: str) -> str:
    """Case- and punctuation-insensitive form: 'NVIDIA H100 80GB HBM3' -> 'nvidiah10080gbhbm3'."""
    return _NOT_ALNUM.sub("", name.lower())


# the vendor words a driver or exporter may put before a GPU's name, or leave out: nvidia-smi
# and Kineto say "NVIDIA V100-SXM2-32GB" where older drivers said "Tesla V100-SXM2-32GB"
_VENDOR_PREFIX = re.compile(r"^\s*(?:nvidia|tesla)(?=[^a-z0-9]|$)[^a-z0-9]*", re.I)


def _bare(name: str) -> str:
    """_norm of name without its leading NVIDIA/Tesla words: 'NVIDIA Tesla V100-SXM2-32GB' and
    'Tesla V100-SXM2-32GB' -> 'v100sxm232gb'."""
    while (m := _VENDOR_PREFIX.match(name)) and m.end():
        name = name[m.end():]
    return _norm(name)


def _read_entries(path: Path) -> list[dict]:
    refuse_device(path, "GPU file")
    try:  # bytes: json finds a BOM'd UTF-8 or a UTF-16 file's encoding itself (PowerShell 5's
        # `kit gpus --json > my.json` writes UTF-16; Notepad may save UTF-8 with a BOM), which
        # read_text had refused as "not valid JSON: Unexpected UTF-8 BOM" or "not a text file"
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise KitError(f"GPU file not found: {path}") from None
    except json.JSONDecodeError as e:
        raise KitError(f"GPU file {path} is not valid JSON: {e.msg} at line {e.lineno}") from None
    except UnicodeDecodeError:
        raise KitError(f"GPU file {path} is not a text (JSON) file") from None
    except OSError as e:  # a folder, no permission, ...
        raise KitError(f"cannot read GPU file {path}: {e.strerror or e}") from None
    if isinstance(data, dict) and "gpus" in data:
        data = data["gpus"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise KitError(f"GPU file {path}: expected a list of GPU objects or {{'gpus': [...]}}")
    if not data:
        raise KitError(f"GPU file {path} holds no GPU entries")
    return data


@lru_cache(maxsize=1)
def _builtin_entries() -> dict[str, dict]:
    """The built-in catalog's raw entries by key (read once; validated lazily, per GPU)."""
    return {e["key"]: e for e in _read_entries(CATALOG_PATH)}


@lru_cache(maxsize=None)
def _builtin_gpu(key: str) -> GPU:
    return gpu_from_dict(_builtin_entries()[key], origin=CATALOG_PATH.name)


def _builtin() -> dict[str, GPU]:
    return {key: _builtin_gpu(key) for key in _builtin_entries()}


def _all() -> dict[str, GPU]:
    return {**_builtin(), **_user_gpus}


@lru_cache(maxsize=4)
def _index(generation: int) -> dict[str, str]:
    """Normalised key/name/alias -> key. Built from the raw entries, so looking one GPU up does not
    validate all 33 (a fresh process's first collective prediction: 3.4 -> 1.6 ms)."""
    index: dict[str, str] = {}
    for name, key in _names():
        index.setdefault(_norm(name), key)
    return index


def _names() -> list[tuple[str, str]]:
    """(key, name or alias, as written; its GPU's key) of every GPU known, built-in ones first."""
    names = [(e["key"], e.get("name", ""), *e.get("aliases", ())) for e in _builtin_entries().values()]
    names += [(g.key, g.name, *g.aliases) for g in _user_gpus.values()]
    return [(name, key) for key, *rest in names for name in (key, *rest) if name]


@lru_cache(maxsize=4)
def _bare_index(generation: int) -> dict[str, str | None]:
    """_bare(key/name/alias) -> key, for names the exact index lacks; None where two GPUs' names
    share a bare form (neither is taken: an unrelated GPU is never found by a stripped name)."""
    bare: dict[str, str | None] = {}
    for name, key in _names():
        b = _bare(name)
        if b:
            bare[b] = key if bare.get(b, key) == key else None
    return bare


_generation = [0]


def list_gpus() -> list[GPU]:
    """Every GPU known: the built-in catalog, then the user's own, sorted by key."""
    return sorted(_all().values(), key=lambda g: g.key)


def gpu_keys() -> list[str]:
    return [g.key for g in list_gpus()]


def keys_of(gpus) -> list[str]:
    """The catalog keys of one GPU name (or GPU) or several, in order (get_gpu names an unknown one)."""
    return [get_gpu(g).key for g in ([gpus] if isinstance(gpus, (str, GPU)) else gpus)]


def close_matches(name: str, n: int = 3) -> list[str]:
    """The n catalog keys whose key, name or an alias looks most like `name` (for error messages)."""
    index = _index(_generation[0])
    q = _norm(name)
    best: dict[str, float] = {}
    for alias, key in index.items():
        score = difflib.SequenceMatcher(None, q, alias).ratio() + (0.5 if q and q in alias else 0)
        best[key] = max(best.get(key, 0.0), score)
    return sorted(best, key=lambda k: (-best[k], k))[:n]


_checked_gpus: dict = {}


def _checked(gpu: GPU) -> GPU:
    """A GPU object given directly (dataclasses.replace of a catalog one, or built by hand) is
    validated as a catalog entry is, once per distinct GPU: a NaN bandwidth or 0 SMs is a
    KitError, never a NaN time or a ZeroDivisionError. A catalog or registered GPU (checked when
    it was read) comes back as it is; one whose vendor or arch needed lower-casing comes back
    normalised, from then on without another check or note."""
    if _user_gpus.get(gpu.key) is gpu or (gpu.key in _builtin_entries() and _builtin_gpu(gpu.key) is gpu):
        return gpu
    try:
        hit = _checked_gpus.get(gpu)
    except TypeError:  # unhashable field values: validated below, which names them
        hit = None
    if hit is not None:
        return hit
    checked = gpu_from_dict(gpu.to_dict(), origin="GPU object")
    keep = gpu if checked == gpu else checked  # the caller's own object where nothing changed
    try:
        if len(_checked_gpus) > 256:
            _checked_gpus.clear()
        _checked_gpus[gpu] = keep
        _checked_gpus[keep] = keep
    except TypeError:
        pass
    return keep


def get_gpu(name: str | GPU) -> GPU:
    """Look a GPU up by key, name or alias, ignoring case and punctuation, and with or without
    the NVIDIA/Tesla words before it where no other GPU's name reads the same without them.

    >>> get_gpu("NVIDIA H100 80GB HBM3").key
    'h100-sxm'
    """
    if isinstance(name, GPU):
        return _checked(name)
    if not isinstance(name, str) or not name.strip():
        raise KitError(f"GPU name must be a non-empty string, got {name!r}")
    key = _index(_generation[0]).get(_norm(name))
    if key is None and (bare := _bare(name)):  # "NVIDIA V100-SXM2-32GB": the catalog knows "Tesla V100-..."
        key = _bare_index(_generation[0]).get(bare)
    if key is None:
        raise KitError(f"unknown GPU {name!r}; close matches: {', '.join(close_matches(name))}"
                       " (`kit gpus` lists all)")
    return _user_gpus[key] if key in _user_gpus else _builtin_gpu(key)


def register_gpu(entry: dict | GPU, origin: str = "user GPU") -> GPU:
    """Add a user's GPU (a dict in the catalog's format, or a GPU). It is validated first.

    A user GPU with a built-in key replaces that GPU (to correct a spec); a key, name or alias
    that already names another GPU is refused: lookups would silently keep finding the other one.
    A GPU object is validated as a dict is (it had been registered unchecked, so one with 0 SMs
    or a NaN bandwidth gave a ZeroDivisionError or NaN times when looked up by its key)."""
    gpu = gpu_from_dict(entry.to_dict() if isinstance(entry, GPU) else entry, origin=origin)
    return _register(gpu, origin)


def _refuse_taken_names(gpus: list[GPU], origin: str) -> None:
    """KitError for a GPU whose key, name or alias already names another GPU (known, or earlier
    in `gpus`): lookups would silently keep finding the other one. The key too: a user GPU keyed
    'a100' (an alias of a100-sxm4-40gb) or 't-4' (t4's key, punctuation aside) had been
    registered, and get_gpu of its own key then gave the other GPU."""
    index = dict(_index(_generation[0]))
    for gpu in gpus:
        for what, name in (("key", gpu.key), ("name", gpu.name), *(("alias", a) for a in gpu.aliases)):
            other = index.get(_norm(name)) if name else None
            if other is not None and other != gpu.key:
                raise KitError(f"{origin}: GPU {gpu.key!r}: its {what} {name!r} already names "
                               f"{other!r}; give it another {what} (or use the key {other!r} to "
                               "replace that GPU)")
        for name in (gpu.key, gpu.name, *gpu.aliases):
            if name:
                index.setdefault(_norm(name), gpu.key)


def _register(gpu: GPU, origin: str) -> GPU:
    """register_gpu of a GPU already validated (load_gpu_file's: their notes said once)."""
    _refuse_taken_names([gpu], origin)
    _user_gpus[gpu.key] = gpu
    _generation[0] += 1
    return gpu


def load_gpu_file(path: str | Path) -> list[GPU]:
    """Register every GPU in a JSON file (one object, a list, or {"gpus": [...]}). Each entry is
    validated, and its key, name and aliases checked, before any is registered; a key given twice
    is refused (the last would silently replace the first)."""
    path = Path(need_path(path, "the GPU file"))
    gpus = [gpu_from_dict(e, origin=str(path)) for e in _read_entries(path)]
    seen = {}
    for gpu in gpus:  # keys are looked up ignoring case and punctuation, as names are
        other = seen.get(_norm(gpu.key))
        if other is not None:
            also = f" (as {other!r} too)" if other != gpu.key else ""
            raise KitError(f"GPU file {path}: key {gpu.key!r} is given twice{also}; keep one entry "
                           "for it, or give the other a key of its own")
        seen[_norm(gpu.key)] = gpu.key
    _refuse_taken_names(gpus, str(path))  # all of them first: a clash registers none of the file
    return [_register(gpu, origin=str(path)) for gpu in gpus]


def unregister_gpu(key: str) -> None:
    """Remove a user-added GPU (used by tests and notebooks to clean up)."""
    _user_gpus.pop(key, None)
    _generation[0] += 1
