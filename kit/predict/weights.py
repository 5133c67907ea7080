"""Trained predictor weights on disk: one safetensors file and a manifest.json beside it.

    <dir>/model.safetensors   every tensor (tile chooser, tile-MLP and direct-MLP ensembles);
                              safetensors holds plain tensors only, so loading runs no code
    <dir>/manifest.json       format tag, what the weights were trained on (GPUs, data source,
                              rows), the seed, the command that reproduces them, and each
                              component's settings (tile vocabulary, Li coefficients, transfer σ)

The manifest records the sha256 of model.safetensors (key "sha256", written by save_bundle, as
`kit train` does). The loader refuses anything else (a missing or foreign manifest, manifest
values of the wrong type, a file that is not safetensors, a file whose sha256 is not the one
its manifest records, tensors holding NaN or infinite values, tensors that do not fit the
manifest) with a KitError that says what it expected. Weights written before the hash was
recorded (no "sha256" in the manifest) are still read, with every other check. The package ships
default weights in kit/predict/weights/; which folder the learned predictors read (the CLI's
--weights, $KIT_WEIGHTS) is kit.predict's choice, loaded here once per folder (load_cached).
"""
from __future__ import annotations

import hashlib
import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kit.errors import KitError, inside_kit

FORMAT = "gpu-perf-kit/predictors"
VERSION = 1
SHIPPED_DIR = Path(__file__).with_name("weights")
TENSORS_FILE = "model.safetensors"
MANIFEST_FILE = "manifest.json"


@dataclass
class Bundle:
    """The learned predictors trained together, and the manifest that describes them."""

    tile: object  # kit.predict.tile_mlp.TilePredictor
    li: object  # kit.predict.linear_li.LiPredictor
    mlp: object | None  # kit.predict.mlp_direct.DirectMLP
    manifest: dict = field(default_factory=dict)
    folder: Path | None = None  # where load_bundle read it (None: trained in this process)
    # sha256 over its manifest.json and model.safetensors (files_identity): what caches of its
    # predictions are keyed by; the Li coefficients and transfer σ live in the manifest alone
    identity: str = ""

    @property
    def train_gpus(self) -> list[str]:
        return list(self.manifest.get("train_gpus", []))


def check_weights_folder(out_dir: str | Path, replace_shipped: bool = False) -> Path:
    """KitError unless out_dir can take a weights bundle: a folder still to be made (under one
    that can be written), an empty one, or one holding kit weights alone, which are replaced.
    The shipped folder (SHIPPED_DIR), or any folder inside the kit package, is replaced only with
    replace_shipped (`kit train --replace-shipped`, as the manifest's command reproduces the
    shipped weights): every default prediction reads it. Anything else there is the user's and
    is not written over. Nothing is left behind (a trial entry is made and removed at once): a
    training that fails leaves no folder behind."""
    import os
    import tempfile

    out = Path(out_dir)
    shipped = out.resolve() == SHIPPED_DIR.resolve()
    if shipped and not replace_shipped:
        raise KitError(f"{out} is the kit's shipped weights folder, which every default prediction "
                       "reads; give another folder, or add --replace-shipped (replace_shipped=True "
                       "from Python) to retrain the shipped weights on purpose")
    if not shipped and replace_shipped:
        raise KitError(f"--replace-shipped (replace_shipped) is for the shipped weights folder "
                       f"{SHIPPED_DIR}; {out} is another: leave it out")
    if not shipped and inside_kit(out):
        raise KitError(f"{out} is in the kit package; give a folder outside it")
    other = other_kit_package(out)
    if other is not None:
        raise KitError(f"{out} is in another copy of the kit package ({other}), whose default "
                       "predictions read its own shipped weights; give a folder outside it")
    if out.exists() and not out.is_dir():
        raise KitError(f"weights folder {out} is a file; give a folder")
    if out.is_dir():
        others = sorted(p.name for p in out.iterdir() if p.name not in (TENSORS_FILE, MANIFEST_FILE))
        if others:
            shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            raise KitError(f"weights folder {out} holds other files ({shown}); give a new or empty "
                           f"folder, or one holding kit weights alone")
        for name in (TENSORS_FILE, MANIFEST_FILE):
            if (out / name).exists() and not (out / name).is_file():
                raise KitError(f"{out / name} is a folder; the weights cannot be written there")
        if (out / MANIFEST_FILE).exists() or (out / TENSORS_FILE).exists():
            try:
                fmt = json.loads((out / MANIFEST_FILE).read_text()).get("format")
            except (OSError, ValueError, UnicodeDecodeError, AttributeError):
                fmt = None
            if fmt != FORMAT:
                raise KitError(f"{out} holds a {MANIFEST_FILE} or {TENSORS_FILE} that is not kit "
                               f"weights; it is not written over: give another folder")
    base = out
    while not base.exists():  # the nearest folder that exists must take the new ones
        base = base.parent
    if not base.is_dir():
        raise KitError(f"cannot write the weights folder {out}: {base} is not a writable folder")
    try:  # a real entry, made and removed: permission bits do not tell (/proc, a read-only mount)
        os.rmdir(tempfile.mkdtemp(prefix=".kit-write-check-", dir=base))
    except OSError as e:
        raise KitError(f"cannot write the weights folder {out}: {base} is not a writable folder "
                       f"({e.strerror or e})") from None
    return out


def other_kit_package(path: str | Path) -> Path | None:
    """The kit package (a folder with __init__.py and predict/weights.py) that path is, or lies
    in, when it is another copy than this one (a second checkout): None otherwise. inside_kit
    knows only the running copy, so `kit train --out /work/main/kit/predict/weights`, run from a
    clone, had written over that checkout's shipped weights."""
    here = Path(__file__).resolve().parents[1]
    target = Path(path).resolve()
    for folder in (target, *target.parents):
        if (folder / "__init__.py").is_file() and (folder / "predict" / "weights.py").is_file():
            return None if folder == here else folder
    return None


def save_bundle(bundle: Bundle, out_dir: str | Path, replace_shipped: bool = False) -> Path:
    """Write model.safetensors and manifest.json as out_dir, all or nothing: both go into a new
    sibling folder first, which then takes out_dir's place in one step (swap_folder), so a
    failure or a crash at any point leaves either the old pair or the new one, never a
    mismatched pair (the two renames of before could leave the new tensors beside the old
    manifest, which load_bundle then refused on its sha256). check_weights_folder's rules hold
    here too: the shipped folder takes them only with replace_shipped, no other folder of the
    package does, and a folder holding other files is refused (replacing the folder would have
    lost them)."""
    import os

    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from kit.data.records import _fsync_dir as _fsync_folder  # a folder's entries, to disk

    out = Path(out_dir)
    check_weights_folder(out, replace_shipped)
    tensors, parts = {}, {}
    t, meta = bundle.tile.chooser.state()
    tensors.update(t)
    parts["tile_choice"] = meta
    parts["tile"] = {"transfer_sigma": bundle.tile.transfer_sigma, "classes": {}}
    if bundle.tile.band:
        parts["tile"]["band"] = bundle.tile.band
    for cls, model in bundle.tile.models.items():
        t, meta = model.state(prefix="tile.")
        tensors.update(t)
        parts["tile"]["classes"][cls] = meta
    if bundle.mlp is not None:
        parts["mlp"] = {"classes": {}}
        for cls, model in bundle.mlp.models.items():
            t, meta = model.state(prefix="mlp.")
            tensors.update(t)
            parts["mlp"]["classes"][cls] = meta
    parts["li"] = {"coefs": bundle.li.coefs}
    manifest = {"format": FORMAT, "version": VERSION, **bundle.manifest, "parts": parts}
    real = out.resolve()  # a link to a weights folder: its target takes them, the link stays
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        new = _sibling_folder(real, "new")
    except OSError as e:
        raise KitError(f"cannot create weights folder {out}: {e.strerror or e}") from None
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(new / TENSORS_FILE))
        (new / TENSORS_FILE).chmod(0o644)  # safetensors writes 0600; weights are meant to be shared
        # the file as written: the loader refuses one changed since (same seed: same hash)
        manifest["sha256"] = {TENSORS_FILE: hashlib.sha256((new / TENSORS_FILE).read_bytes()).hexdigest()}
        (new / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        for name in (TENSORS_FILE, MANIFEST_FILE):  # on disk before the swap names them
            with open(new / name, "rb") as f:
                os.fsync(f.fileno())
        _fsync_folder(new)  # its entries too
        swap_folder(new, real)
        for folder in (real, real.parent):  # the swap (or the files renamed in), past a power cut
            _fsync_folder(folder)
    except (OSError, SafetensorError) as e:  # safetensors reports I/O as its own error
        shutil.rmtree(new, ignore_errors=True)
        raise KitError(f"cannot write the weights into {out}: {getattr(e, 'strerror', None) or e}") from None
    return out


def _sibling_folder(path: Path, what: str) -> Path:
    """A new, empty hidden folder beside path (same file system, so a rename can swap them),
    with the permissions path has, or a new folder would (the umask's)."""
    import os
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=f".{path.name}.kit-{what}-", dir=path.parent))
    try:
        mode = path.stat().st_mode & 0o7777
    except OSError:
        mask = os.umask(0o022)
        os.umask(mask)
        mode = 0o777 & ~mask
    folder.chmod(mode)
    return folder


def _exchange(a: Path, b: Path) -> None:
    """Swap two paths in one atomic step: Linux's renameat2(RENAME_EXCHANGE) (glibc 2.28+;
    man 2 rename). OSError ENOSYS off Linux, or where the C library cannot be opened or has no
    renameat2; the kernel's own errno otherwise (EINVAL where the file system cannot exchange,
    EXDEV across file systems, EBUSY for a mount point)."""
    import ctypes
    import errno
    import os
    import sys

    try:
        if not sys.platform.startswith("linux"):  # RENAME_EXCHANGE = 2 is Linux's flag
            raise OSError
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError, TypeError):
        raise OSError(errno.ENOSYS, "renameat2 is not available", str(b)) from None
    at_fdcwd, rename_exchange = -100, 2  # <fcntl.h>, <linux/fs.h>
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(b))


def swap_folder(new: Path, target: Path) -> None:
    """Put folder `new` where `target` is, removing the old target: a target not there yet is a
    rename (atomic in POSIX); one there is exchanged with new in one atomic step (_exchange),
    then removed. Where the system cannot exchange, POSIX has no atomic replacement of a folder
    that holds files: the old one is renamed aside and new renamed in, and a crash between the
    two renames leaves no target, with both folders whole beside it (.NAME.kit-old-*, the old;
    load_bundle names them). A target that cannot be renamed at all (a mount point: EBUSY; a
    folder of another file system layer, as overlayfs's lower one: EXDEV) takes new's files one
    by one (_replace_files), as before the swap: not all or nothing, but the sha256 check
    refuses a mismatched pair."""
    import errno
    import os

    if not os.path.lexists(target):
        os.rename(new, target)
        return
    try:
        _exchange(new, target)
        old = new  # the exchange left the old folder at new's name
    except OSError as e:
        if e.errno in (errno.EXDEV, errno.EBUSY):
            _replace_files(new, target)
            shutil.rmtree(new, ignore_errors=True)
            return
        if e.errno not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        old = _sibling_folder(target, "old")
        try:
            os.rename(target, old)  # onto the empty folder just made
        except OSError as e2:
            os.rmdir(old)  # still empty: leave nothing behind
            if e2.errno in (errno.EXDEV, errno.EBUSY):
                _replace_files(new, target)
                shutil.rmtree(new, ignore_errors=True)
                return
            raise
        try:
            os.rename(new, target)
        except OSError:
            os.rename(old, target)  # the old weights back in place
            raise
    shutil.rmtree(old, ignore_errors=True)


def _replace_files(new: Path, target: Path) -> None:
    """Copy each file of `new` into `target` under a hidden name, then rename it over its own
    name there (a rename inside one folder works where the folder itself cannot be renamed);
    the manifest last, so a crash between leaves new tensors that the old manifest's sha256
    refuses."""
    import os

    for name in (TENSORS_FILE, MANIFEST_FILE):
        part = target / f".{name}.partial"
        try:
            shutil.copyfile(new / name, part)
            part.chmod((new / name).stat().st_mode & 0o777)
            with open(part, "rb") as f:
                os.fsync(f.fileno())
            os.replace(part, target / name)
        except BaseException:
            part.unlink(missing_ok=True)
            raise


def leftovers(folder: str | Path) -> list[Path]:
    """The folders a save into `folder` that stopped midway left beside it (.NAME.kit-new-*,
    .NAME.kit-old-*: whole weights, the new or the old, or a part-written new one)."""
    folder = Path(folder)
    heads = (f".{folder.name}.kit-new-", f".{folder.name}.kit-old-")
    try:
        return sorted(p for p in folder.parent.iterdir() if p.name.startswith(heads) and p.is_dir())
    except OSError:
        return []


def _folder_of(path: Path) -> Path:
    """A weights folder, or the folder of its manifest.json or model.safetensors; any other file
    is named in the error rather than its parent folder."""
    if path.is_file():
        if path.name not in (MANIFEST_FILE, TENSORS_FILE):
            raise KitError(f"{path} is a file, not a predictor weights folder (expected a folder with "
                           f"{TENSORS_FILE} + {MANIFEST_FILE}, as `kit train --out` writes)")
        return path.parent
    return path


def read_manifest(weights_dir: str | Path) -> dict:
    """The manifest of a weights folder; KitError unless it is this kit's predictor manifest."""
    path = _folder_of(Path(weights_dir))
    mpath = path / MANIFEST_FILE
    if not mpath.is_file():
        left = leftovers(path) if not path.exists() else []
        hint = (f"; a `kit train` into it stopped midway and left {', '.join(map(str, left))} "
                f"(one holds the old weights, one the new: rename the one to keep to {path.name})"
                if left else "")
        raise KitError(f"{path} is not a predictor weights folder: no {MANIFEST_FILE} "
                       f"(expected {TENSORS_FILE} + {MANIFEST_FILE}, as `kit train --out` writes){hint}")
    try:
        manifest = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise KitError(f"{mpath} is not valid JSON: {e}") from None
    except OSError as e:
        raise KitError(f"cannot read {mpath}: {e.strerror or e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise KitError(f"{mpath} is not a gpu-perf-kit predictor manifest "
                       f"(its format tag should be {FORMAT!r})")
    if manifest.get("version") != VERSION or isinstance(manifest.get("version"), bool):  # True == 1
        raise KitError(f"{mpath}: weights format version {manifest.get('version')!r}; "
                       f"this kit reads version {VERSION}")
    if not isinstance(manifest.get("parts"), dict):
        raise KitError(f"{mpath}: manifest has no 'parts' section")
    _check_manifest_types(manifest, mpath)
    return manifest


# the widest transfer σ (log latency) a manifest may hold: e^10, a band 22,000x each way; 1e308
# passed as finite and overflowed the band's arithmetic
MAX_SIGMA_LOG = 10.0


def _number(v, low: float = 0.0) -> bool:
    """A finite number >= low (not a bool, not text)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= low


def _check_manifest_types(manifest: dict, where: Path) -> None:
    """KitError, one line naming the key, for manifest values the loader or evaluate reads that
    are of the wrong type (a hand-edited manifest gave tracebacks: test_rows_trained_on "abc",
    parts.tile.band "x")."""
    sha = manifest.get("sha256")
    if sha is not None and not (isinstance(sha, dict) and isinstance(sha.get(TENSORS_FILE), str)
                                and len(sha[TENSORS_FILE]) == 64
                                and all(c in "0123456789abcdef" for c in sha[TENSORS_FILE])):
        raise KitError(f"{where}: sha256 must be {{\"{TENSORS_FILE}\": its 64 hex digits}}, got "
                       f"{sha!r:.80}; retrain with `kit train`")
    n = manifest.get("test_rows_trained_on")
    if n is not None and not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
        raise KitError(f"{where}: test_rows_trained_on must be a whole number >= 0, got {n!r:.80}")
    parts = manifest["parts"]
    for name in ("tile_choice", "tile", "li", "mlp"):
        if name in parts and not isinstance(parts[name], dict):
            raise KitError(f"{where}: parts.{name} must be an object, got {parts[name]!r:.80}; "
                           "retrain with `kit train`")
    band = parts.get("tile", {}).get("band")
    if band is None:
        return
    if not isinstance(band, dict):
        raise KitError(f"{where}: parts.tile.band must be an object of band settings, as `kit train` "
                       f"writes, got {band!r:.80}; retrain with `kit train`")
    rules = {"near_distance": ("a number >= 0", lambda v: v is None or _number(v)),
             "train_gpus": ("a list of GPU names",
                            lambda v: isinstance(v, list) and all(isinstance(g, str) for g in v)),
             "sigma_at_0": (f"an object of op classes to numbers from 0 to {MAX_SIGMA_LOG:g}",
                            lambda v: isinstance(v, dict) and all(_number(x) and x <= MAX_SIGMA_LOG
                                                                  for x in v.values()))}
    for key, (what, ok) in rules.items():
        if key in band and not ok(band[key]):
            raise KitError(f"{where}: parts.tile.band.{key} must be {what}, got {band[key]!r:.80}; "
                           "retrain with `kit train`")


def _read_tensors(path: Path, sha256: str | None = None) -> dict:
    """The tensors of a weights file, as numpy arrays. KitError when it is not safetensors, when
    sha256 (the manifest's) is given and the file's differs, or when a tensor holds NaN or
    infinite values (a damaged file scored nan or inf, with exit 0)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load  # plain arrays: predicting needs no torch

    if not path.is_file():
        raise KitError(f"weights file not found: {path}")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise KitError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        tensors = load(data)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise KitError(f"{path} is not a safetensors weights file ({e}); "
                       "retrain with `kit train --out DIR`") from None
    if sha256 is not None:
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha256:
            raise KitError(f"{path}: its sha256 {digest[:16]}... is not the {sha256[:16]}... its "
                           f"{MANIFEST_FILE} records: the file was changed or damaged after `kit train` "
                           "wrote it; restore it, or retrain with `kit train --out DIR`")
    for name, array in sorted(tensors.items()):
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            bad = int((~np.isfinite(array)).sum())
            raise KitError(f"{path}: tensor {name!r} holds {bad} NaN or infinite value(s): the "
                           "weights are damaged; restore them, or retrain with `kit train --out DIR`")
    return tensors


def load_bundle(weights_dir: str | Path | None = None) -> Bundle:
    """Load a weights folder (default: the shipped one). Refuses files that are not such weights."""
    from kit.predict.linear_li import LiPredictor
    from kit.predict.mlp_direct import DirectMLP
    from kit.predict.tile_choice import TileChooser
    from kit.predict.tile_ensemble import ClassModel
    from kit.predict.tile_mlp import TilePredictor

    folder = _folder_of(Path(weights_dir)) if weights_dir is not None else SHIPPED_DIR
    manifest = read_manifest(folder)
    _check_gpu_features(manifest, folder / MANIFEST_FILE)
    tensors = _read_tensors(folder / TENSORS_FILE, (manifest.get("sha256") or {}).get(TENSORS_FILE))
    parts = manifest["parts"]
    info = {k: v for k, v in manifest.items() if k != "parts"}
    try:
        chooser = TileChooser.from_state(tensors, parts["tile_choice"])
        models = {cls: ClassModel.from_state(cls, tensors, meta, prefix="tile.")
                  for cls, meta in parts["tile"]["classes"].items()}
        mlp = None
        if "mlp" in parts:
            mlp = DirectMLP({cls: ClassModel.from_state(cls, tensors, meta, prefix="mlp.")
                             for cls, meta in parts["mlp"]["classes"].items()})
        li = LiPredictor(_li_coefs(parts["li"]["coefs"], folder / MANIFEST_FILE))
        _check_info(parts["tile"].get("transfer_sigma", {}), info, folder / MANIFEST_FILE,
                    parts["tile"].get("band"), parts["li"]["coefs"])
        tile = TilePredictor(chooser, models, parts["tile"].get("transfer_sigma", {}), info,
                             parts["tile"].get("band"))
    except (KeyError, RuntimeError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise KitError(f"weights in {folder} do not match their manifest ({type(e).__name__}: "
                       f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    return Bundle(tile, li, mlp, info, folder, files_identity(folder))


def _check_gpu_features(manifest: dict, where: Path) -> None:
    """KitError unless the weights were trained on the GPU features this kit computes
    (kit.predict.features.GPU_FEATURES, recorded as gpu_features since the TDP-per-peak feature
    gave way to the power share, and the power share's SUSTAINED_TFLOPS_PER_W, recorded as
    sustained_tflops_per_w): a network fed a feature it never saw answers as confidently as one
    fed its own."""
    from kit.predict.features import GPU_FEATURES, SUSTAINED_TFLOPS_PER_W

    got = manifest.get("gpu_features")
    if got == GPU_FEATURES:
        rate = manifest.get("sustained_tflops_per_w")
        if rate is None:
            raise KitError(f"{where}: these weights record no sustained_tflops_per_w, the rate their "
                           f"power share was counted at (this kit's: {SUSTAINED_TFLOPS_PER_W}); "
                           "retrain with `kit train`")
        if rate != SUSTAINED_TFLOPS_PER_W:
            raise KitError(f"{where}: these weights saw the power share at {rate!r:.20} TFLOP/s per W "
                           f"(sustained_tflops_per_w); this kit computes it at {SUSTAINED_TFLOPS_PER_W}, "
                           "so every GPU's feature would move under them; retrain with `kit train`")
        return
    if got is None:
        raise KitError(f"{where}: these weights record no gpu_features: they were trained before "
                       "the kit's GPU features changed (log_w_per_tflops became log_power_share) "
                       "and would be fed one they never saw; retrain with `kit train`")
    theirs = got if isinstance(got, list) else [got]
    differ = [f for f in theirs if f not in GPU_FEATURES] + [f for f in GPU_FEATURES if f not in theirs]
    raise KitError(f"{where}: these weights were trained on other GPU features than this kit "
                   f"computes ({', '.join(map(str, differ[:4])) or 'their order differs'}); "
                   "retrain with `kit train`")


def files_identity(folder: Path) -> str:
    """sha256 over a weights folder's manifest.json and model.safetensors: it changes with any
    part of the weights, the manifest's numbers included (a retraining into the same folder, a
    hand-edited Li coefficient)."""
    digest = hashlib.sha256()
    for name in (MANIFEST_FILE, TENSORS_FILE):
        try:
            digest.update(hashlib.sha256((folder / name).read_bytes()).digest())
        except OSError as e:
            raise KitError(f"cannot read {folder / name}: {e.strerror or e}") from None
    return digest.hexdigest()


def _signature(folder: Path):
    """The size and modification time of a folder's two files (None where one is unreadable):
    a loaded bundle is reused only while neither changed."""
    try:
        return tuple((st.st_size, st.st_mtime_ns)
                     for st in ((folder / n).stat() for n in (MANIFEST_FILE, TENSORS_FILE)))
    except OSError:
        return None


# Every bundle loaded stays alive for the process: kit.workload.kernel_times keys its dispatch
# floors by id(predictor), and a freed bundle's id could be reused by the next one loaded.
_loaded: dict = {}


def load_cached(weights_dir: str | Path) -> Bundle:
    """load_bundle, once per folder while its files stay the same."""
    folder = _folder_of(Path(weights_dir)).resolve()
    key = (folder, _signature(folder))
    if key not in _loaded:
        _loaded[key] = load_bundle(folder)
    return _loaded[key]


def _check_info(sigma, info: dict, where: Path, band=None, li_coefs=None) -> None:
    """KitError for a transfer σ that is not {op_class: number in [0, MAX_SIGMA_LOG]} (band.sigma_at_0:
    _check_manifest_types) (a
    string failed deep inside, NaN dropped the band's coverage without a word, 1e308 overflowed),
    for train_gpus that are not a list of names ("t4" was read letter by letter), and for GPU
    names (train_gpus, the band's, the Li coefficients') the catalog does not know: they had
    surfaced as "unknown GPU" on a prediction for another GPU."""
    from kit.hardware import get_gpu

    if not isinstance(sigma, dict) or not all(_number(v) and v <= MAX_SIGMA_LOG for v in sigma.values()):
        raise KitError(f"{where}: parts.tile.transfer_sigma must map op classes to numbers from 0 to "
                       f"{MAX_SIGMA_LOG:g}, got {sigma!r:.80}; retrain with `kit train`")
    gpus = info.get("train_gpus", [])
    if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
        raise KitError(f"{where}: train_gpus must be a list of GPU names, got {gpus!r:.80}")
    named = [("train_gpus", g) for g in gpus] \
        + [("parts.tile.band.train_gpus", g) for g in ((band or {}).get("train_gpus") or [])] \
        + [(f"parts.li.coefs.{cls}", g) for cls, table in (li_coefs or {}).items() for g in table]
    for key, g in named:
        try:
            get_gpu(g)
        except KitError:
            raise KitError(f"{where}: {key} names GPU {g!r}, which the catalog does not know (see "
                           "`kit gpus`; load its file with --gpu-file first), so these weights "
                           "cannot be used") from None


def _li_coefs(coefs, where: Path) -> dict:
    """The Li coefficients of a manifest: {op_class: {gpu: [a, c, d]}}, each a finite number >= 0
    (a string, NaN or a negative slope would give a silently wrong or NaN prediction)."""
    if not isinstance(coefs, dict):
        raise KitError(f"{where}: parts.li.coefs must be an object of op classes, got {type(coefs).__name__}")
    for cls, table in coefs.items():
        if not isinstance(table, dict) or not table:
            raise KitError(f"{where}: parts.li.coefs.{cls} must be a non-empty object of GPUs")
        for gpu, line in table.items():
            ok = isinstance(line, list) and len(line) == 3 and all(_number(v) for v in line)
            if not ok:
                raise KitError(f"{where}: parts.li.coefs.{cls}.{gpu} must be 3 finite numbers >= 0 "
                               f"(ms per GFLOP, ms per MB, ms), got {line!r:.80}; retrain with `kit train`")
    return coefs


_shipped: list = []


def shipped_bundle() -> Bundle:
    """The package's default weights, loaded once."""
    if not _shipped:
        _shipped.append(load_bundle(SHIPPED_DIR))
    return _shipped[0]


def has_shipped() -> bool:
    return (SHIPPED_DIR / MANIFEST_FILE).is_file() and (SHIPPED_DIR / TENSORS_FILE).is_file()


def predictor_of(bundle: Bundle, name: str, measurements=None):
    """A bundle's learned predictor by name: tile, li, mlp, or habitat (over the bundle's
    tile-MLP, its reference for unmeasured shapes, and its training GPUs; measurements: habitat's
    measured kernels)."""
    if name == "tile":
        return bundle.tile
    if name == "li":
        return bundle.li
    if name == "mlp":
        if bundle.mlp is None:
            where = ("the shipped weights" if bundle.folder == SHIPPED_DIR
                     else f"the weights in {bundle.folder or 'memory'}")
            raise KitError(f"{where} have no direct MLP (trained with --no-direct); train one with "
                           "`kit train`, or choose another predictor")
        return bundle.mlp
    if name == "habitat":
        from kit.predict.habitat import HabitatPredictor

        return HabitatPredictor(bundle.tile, bundle.train_gpus, measurements)
    raise KitError(f"{name!r} is not a learned predictor (tile, li, mlp, habitat)")


def shipped_tile():
    return predictor_of(shipped_bundle(), "tile")


def shipped_li():
    return predictor_of(shipped_bundle(), "li")


def shipped_mlp():
    return predictor_of(shipped_bundle(), "mlp")


def shipped_habitat(measurements=None):
    """Habitat over the shipped tile-MLP (reference for unmeasured shapes) and its training GPUs."""
    return predictor_of(shipped_bundle(), "habitat", measurements)
