"""Predictors behind one protocol (see kit.predict.base)."""
from kit.predict.base import COLUMNS, Predictor, RooflinePredictor, WavePredictor
from kit.predict.roofline import Roofline, roofline

__all__ = ["COLUMNS", "Predictor", "Roofline", "RooflinePredictor", "WavePredictor", "roofline",
           "get_predictor", "PREDICTORS"]

PREDICTORS = {"roofline": RooflinePredictor, "wave": WavePredictor}


def get_predictor(name: str = "auto"):
    """A predictor by name. "auto" is the best one available: the shipped tile-MLP when present,
    else the wave model."""
    from kit.errors import KitError

    if name == "auto":
        name = "tile" if "tile" in PREDICTORS else "wave"
    try:
        return PREDICTORS[name]()
    except KeyError:
        raise KitError(f"unknown predictor {name!r}: choose one of {', '.join(PREDICTORS)}") from None
