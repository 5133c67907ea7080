"""Predictors behind one protocol (see kit.predict.base)."""
from kit.predict.base import COLUMNS, Predictor, RooflinePredictor, WavePredictor
from kit.predict.roofline import Roofline, roofline

__all__ = ["COLUMNS", "Predictor", "Roofline", "RooflinePredictor", "WavePredictor", "roofline",
           "get_predictor", "predictor_name", "PREDICTORS"]

PREDICTORS = {"roofline": RooflinePredictor, "wave": WavePredictor}


def _register_learned() -> None:
    """The learned predictors, built from the shipped weights on first use (kit.predict.weights)."""
    from kit.predict import weights

    PREDICTORS.update(habitat=weights.shipped_habitat, li=weights.shipped_li,
                      mlp=weights.shipped_mlp, tile=weights.shipped_tile)


_register_learned()


def predictor_name(name: str = "auto") -> str:
    """The predictor a name stands for, without building it. "auto" is the best one available:
    the shipped tile-MLP when present, else the wave model."""
    if name != "auto":
        return name
    from kit.predict.weights import has_shipped

    return "tile" if has_shipped() else "wave"


def get_predictor(name: str = "auto"):
    """A predictor by name (see predictor_name for "auto")."""
    from kit.errors import KitError

    if not isinstance(name, str):
        raise KitError(f"predictor must be a name ({', '.join(PREDICTORS)} or auto), got {name!r}")
    name = predictor_name(name)
    try:
        return PREDICTORS[name]()
    except KeyError:
        raise KitError(f"unknown predictor {name!r}: choose one of {', '.join(PREDICTORS)}") from None
