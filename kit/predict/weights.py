"""Trained predictor weights on disk: one safetensors file and a manifest.json beside it.

    <dir>/model.safetensors   every tensor (tile chooser, tile-MLP and direct-MLP ensembles);
                              safetensors holds plain tensors only, so loading runs no code
    <dir>/manifest.json       format tag, what the weights were trained on (GPUs, data source,
                              rows), the seed, the command that reproduces them, and each
                              component's settings (tile vocabulary, Li coefficients, transfer σ)

The loader refuses anything else (a missing or foreign manifest, a file that is not
safetensors, tensors that do not fit the manifest) with a KitError that says what it expected.
The package ships default weights in kit/predict/weights/.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kit.errors import KitError

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

    @property
    def train_gpus(self) -> list[str]:
        return list(self.manifest.get("train_gpus", []))


def check_weights_folder(out_dir: str | Path) -> Path:
    """KitError unless out_dir can take a weights bundle: a folder still to be made (under one
    that can be written), an empty one, or one holding kit weights alone, which are replaced (as
    `kit train` reproduces the shipped ones). Anything else there is the user's and is not
    written over. Nothing is created: a training that fails leaves no folder behind."""
    import os

    out = Path(out_dir)
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
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        raise KitError(f"cannot write the weights folder {out}: {base} is not a writable folder")
    return out


def save_bundle(bundle: Bundle, out_dir: str | Path) -> Path:
    """Write model.safetensors and manifest.json into out_dir (created if needed), each to a
    temporary name first and then renamed, so a failed write leaves the old files whole."""
    import os

    from safetensors import SafetensorError
    from safetensors.torch import save_file

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KitError(f"cannot create weights folder {out}: {e.strerror}") from None
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
    tmp = {name: out / f".{name}.partial" for name in (TENSORS_FILE, MANIFEST_FILE)}
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp[TENSORS_FILE]))
        tmp[TENSORS_FILE].chmod(0o644)  # safetensors writes 0600; weights are meant to be shared
        tmp[MANIFEST_FILE].write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        for name, path in tmp.items():
            os.replace(path, out / name)
    except (OSError, SafetensorError) as e:  # safetensors reports I/O as its own error
        for path in tmp.values():
            if path.is_file():
                path.unlink()
        raise KitError(f"cannot write the weights into {out}: {getattr(e, 'strerror', None) or e}") from None
    return out


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
        raise KitError(f"{path} is not a predictor weights folder: no {MANIFEST_FILE} "
                       f"(expected {TENSORS_FILE} + {MANIFEST_FILE}, as `kit train --out` writes)")
    try:
        manifest = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise KitError(f"{mpath} is not valid JSON: {e}") from None
    except OSError as e:
        raise KitError(f"cannot read {mpath}: {e.strerror or e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise KitError(f"{mpath} is not a gpu-perf-kit predictor manifest "
                       f"(its format tag should be {FORMAT!r})")
    if manifest.get("version") != VERSION:
        raise KitError(f"{mpath}: weights format version {manifest.get('version')!r}; "
                       f"this kit reads version {VERSION}")
    if not isinstance(manifest.get("parts"), dict):
        raise KitError(f"{mpath}: manifest has no 'parts' section")
    return manifest


def _read_tensors(path: Path) -> dict:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file  # plain arrays: predicting needs no torch

    if not path.is_file():
        raise KitError(f"weights file not found: {path}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise KitError(f"{path} is not a safetensors weights file ({e}); "
                       "retrain with `kit train --out DIR`") from None


def load_bundle(weights_dir: str | Path | None = None) -> Bundle:
    """Load a weights folder (default: the shipped one). Refuses files that are not such weights."""
    from kit.predict.linear_li import LiPredictor
    from kit.predict.mlp_direct import DirectMLP
    from kit.predict.tile_choice import TileChooser
    from kit.predict.tile_mlp import ClassModel, TilePredictor

    folder = _folder_of(Path(weights_dir)) if weights_dir is not None else SHIPPED_DIR
    manifest = read_manifest(folder)
    tensors = _read_tensors(folder / TENSORS_FILE)
    parts = manifest["parts"]
    try:
        chooser = TileChooser.from_state(tensors, parts["tile_choice"])
        models = {cls: ClassModel.from_state(cls, tensors, meta, prefix="tile.")
                  for cls, meta in parts["tile"]["classes"].items()}
        mlp = None
        if "mlp" in parts:
            mlp = DirectMLP({cls: ClassModel.from_state(cls, tensors, meta, prefix="mlp.")
                             for cls, meta in parts["mlp"]["classes"].items()})
        li = LiPredictor(_li_coefs(parts["li"]["coefs"], folder / MANIFEST_FILE))
    except (KeyError, RuntimeError, TypeError, ValueError) as e:
        raise KitError(f"weights in {folder} do not match their manifest ({type(e).__name__}: "
                       f"{str(e).splitlines()[0][:200]})") from None
    info = {k: v for k, v in manifest.items() if k != "parts"}
    _check_info(parts["tile"].get("transfer_sigma", {}), info, folder / MANIFEST_FILE)
    tile = TilePredictor(chooser, models, parts["tile"].get("transfer_sigma", {}), info,
                         parts["tile"].get("band"))
    return Bundle(tile, li, mlp, info)


def _check_info(sigma, info: dict, where: Path) -> None:
    """KitError for a transfer σ that is not {op_class: finite number >= 0} (a string failed deep
    inside, NaN dropped the band's coverage without a word) and for train_gpus that are not a
    list of names ("t4" was read letter by letter)."""
    import math

    if not isinstance(sigma, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
            for v in sigma.values()):
        raise KitError(f"{where}: parts.tile.transfer_sigma must map op classes to finite numbers "
                       f">= 0, got {sigma!r:.80}; retrain with `kit train`")
    gpus = info.get("train_gpus", [])
    if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
        raise KitError(f"{where}: train_gpus must be a list of GPU names, got {gpus!r:.80}")


def _li_coefs(coefs, where: Path) -> dict:
    """The Li coefficients of a manifest: {op_class: {gpu: [a, c, d]}}, each a finite number >= 0
    (a string, NaN or a negative slope would give a silently wrong or NaN prediction)."""
    import math

    if not isinstance(coefs, dict):
        raise KitError(f"{where}: parts.li.coefs must be an object of op classes, got {type(coefs).__name__}")
    for cls, table in coefs.items():
        if not isinstance(table, dict) or not table:
            raise KitError(f"{where}: parts.li.coefs.{cls} must be a non-empty object of GPUs")
        for gpu, line in table.items():
            ok = isinstance(line, list) and len(line) == 3 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                for v in line)
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


def shipped_tile():
    return shipped_bundle().tile


def shipped_li():
    return shipped_bundle().li


def shipped_mlp():
    bundle = shipped_bundle()
    if bundle.mlp is None:
        raise KitError("the shipped weights have no direct MLP; train one with `kit train`")
    return bundle.mlp


def shipped_habitat(measurements=None):
    """Habitat over the shipped tile-MLP (reference for unmeasured shapes) and its training GPUs."""
    from kit.predict.habitat import HabitatPredictor

    bundle = shipped_bundle()
    return HabitatPredictor(bundle.tile, bundle.train_gpus, measurements)
