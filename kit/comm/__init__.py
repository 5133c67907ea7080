"""Collectives on real topologies: algorithms, fitted bandwidth curves, parsers and measurement.

    from kit.comm import predict_collective
    predict_collective("allreduce", 1e9, "dgx-h100").time_ms
"""
from kit.comm.conventions import KINDS, CollectiveResult, busbw_factor, canonical_kind
from kit.comm.calibration import Calibration, fit_table, load_calibration
from kit.comm.curves import BandwidthCurve, fit_curve
from kit.comm.predict import collective_table, predict_alltoallv, predict_collective

__all__ = ["KINDS", "BandwidthCurve", "Calibration", "CollectiveResult", "busbw_factor",
           "canonical_kind", "collective_table", "fit_curve", "fit_table", "load_calibration",
           "predict_alltoallv", "predict_collective"]
