"""Predictors behind one protocol (see kit.predict.base).

The learned predictors (LEARNED) read one weights folder, the weights in use: the folder of the
innermost `using_weights` (the CLI's --weights), else $KIT_WEIGHTS, else the shipped weights
(kit.predict.weights). Anything that keys cached predictions by predictor_name keys them by the
weights too, so one folder's predictions are never served for another's.
"""
import os
from contextlib import contextmanager

from kit.errors import KitError
from kit.predict.base import COLUMNS, Predictor, RooflinePredictor, WavePredictor
from kit.predict.roofline import Roofline, roofline

__all__ = ["COLUMNS", "Predictor", "Roofline", "RooflinePredictor", "WavePredictor", "roofline",
           "get_predictor", "predictor_name", "resolve_name", "PREDICTORS", "LEARNED", "FP32_ONLY",
           "WEIGHTS_ENV", "using_weights", "bundle_in_use", "other_weights_in_use", "weights_in_use",
           "refuse_other_dtypes", "DtypeNotLearned", "fp32_only_message"]

WEIGHTS_ENV = "KIT_WEIGHTS"
LEARNED = ("habitat", "li", "mlp", "tile")  # the predictors built from the weights in use
# the baselines fitted on NeuSight's rows, all FP32, with no dtype among their inputs
FP32_ONLY = ("li", "mlp")
PREDICTORS = {"roofline": RooflinePredictor, "wave": WavePredictor}

_chosen: list = []  # (folder, where it was named) of each open using_weights, innermost last


def _learned(name: str):
    """A factory of one learned predictor from the weights in use (habitat takes measurements)."""
    def build(measurements=None):
        from kit.predict.weights import predictor_of

        return predictor_of(bundle_in_use(), name, measurements)

    build.__name__ = build.__qualname__ = f"{name}_in_use"
    return build


PREDICTORS.update({name: _learned(name) for name in LEARNED})


@contextmanager
def using_weights(folder, origin: str = "--weights"):
    """Within it, the learned predictors read the weights in `folder` (from `kit train --out`);
    origin names where the folder was given, for errors and outputs. None changes nothing
    ($KIT_WEIGHTS or the shipped weights)."""
    if folder is None:
        yield
        return
    from kit.errors import need_path

    _chosen.append((os.fspath(need_path(folder, "weights (a folder from `kit train --out`)")), origin))
    try:
        yield
    finally:
        _chosen.pop()


def chosen_weights():
    """(folder, where it was named) of the weights chosen in place of the shipped ones, or None.
    An empty KIT_WEIGHTS is no choice, as an unset one."""
    if _chosen:
        return _chosen[-1]
    folder = os.environ.get(WEIGHTS_ENV, "")
    return (folder, WEIGHTS_ENV) if folder else None


def bundle_in_use():
    """The weights bundle the learned predictors read now (kit.predict.weights.Bundle)."""
    from kit.predict import weights

    chosen = chosen_weights()
    if chosen is None:
        bundle = weights.shipped_bundle()
    else:
        folder, origin = chosen
        named = f"{origin} {folder}" if origin.startswith("-") else f"{origin}={folder}"
        if not os.path.exists(folder):
            raise KitError(f"{named}: no such weights folder (give a folder written by "
                           "`kit train --out`)")
        try:
            bundle = weights.load_cached(folder)
        except KitError as e:
            raise KitError(f"{named}: {e}") from None
    return bundle


def other_weights_in_use():
    """The bundle in use when it is not the shipped weights (a copy of them, file for file, is
    them), else None."""
    if chosen_weights() is None:
        return None
    from kit.predict import weights

    bundle = bundle_in_use()
    if weights.has_shipped() and bundle.identity == weights.shipped_bundle().identity:
        return None
    return bundle


def weights_in_use() -> dict | None:
    """What an output says of weights that are not the shipped ones: their folder, where it was
    named (--weights or KIT_WEIGHTS) and, where the manifest has them, the GPUs they were trained
    on and model.safetensors' sha256. None for the shipped weights."""
    from kit.predict.weights import TENSORS_FILE

    bundle = other_weights_in_use()
    if bundle is None:
        return None
    info = {"folder": str(bundle.folder), "from": chosen_weights()[1]}
    if bundle.train_gpus:
        info["train_gpus"] = bundle.train_gpus
    sha = (bundle.manifest.get("sha256") or {}).get(TENSORS_FILE)
    if sha:
        info["sha256"] = sha
    return info


def resolve_name(name: str = "auto") -> str:
    """The predictor a name stands for, without building it. "auto" is the best one available:
    the tile-MLP when weights are chosen or shipped, else the wave model."""
    if name != "auto":
        return name
    from kit.predict.weights import has_shipped

    return "tile" if chosen_weights() is not None or has_shipped() else "wave"


def predictor_name(name: str = "auto") -> str:
    """resolve_name, and for a learned predictor reading weights other than the shipped ones,
    their identity too ("tile@weights:<16 hex>"): kit.workload.latency_cache keys its entries by
    this, so predictions of other weights never meet the shipped weights' entries."""
    name = resolve_name(name)
    other = other_weights_in_use() if name in LEARNED else None
    return f"{name}@weights:{other.identity[:16]}" if other is not None else name


def get_predictor(name: str = "auto"):
    """A predictor by name (see resolve_name for "auto"); a learned one from the weights in use."""
    if not isinstance(name, str):
        raise KitError(f"predictor must be a name ({', '.join(PREDICTORS)} or auto), got {name!r}")
    name = resolve_name(name)
    try:
        factory = PREDICTORS[name]
    except KeyError:
        raise KitError(f"unknown predictor {name!r}: choose one of {', '.join(PREDICTORS)}") from None
    return factory()


class DtypeNotLearned(KitError):
    """An FP32-only baseline asked for another dtype: bad input, not an op type it cannot cost
    (a whole model's costing routes the latter to the wave model, and should re-raise this)."""


def fp32_only_message(predictor: str, dtype: str) -> str:
    return (f"the {predictor} predictor was fitted on FP32 kernels only (NeuSight's data) and has no "
            f"dtype input, so it cannot predict {dtype} ops (it would give their FP32 time): use the "
            f"tile predictor (predictor tile, or auto, the default), which models {dtype}")


def refuse_other_dtypes(ops, predictor: str, learned_classes) -> None:
    """KitError for the first op an FP32-only baseline (FP32_ONLY) would run through its fitted
    model in another dtype; ops of classes it has no model of take the roofline, which reads
    their dtype, and pass."""
    from kit.predict.features import op_class_of

    for op in ops:
        dtype = getattr(op, "dtype", "fp32")
        if dtype != "fp32" and op_class_of(op) in learned_classes:
            raise DtypeNotLearned(fp32_only_message(predictor, dtype))
