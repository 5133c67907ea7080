"""Per-GPU linear regression (after Li et al.), extended to unseen GPUs through bandwidth.

On each training GPU and op class, latency is a straight line in the work:

    latency_ms = a · GFLOPs + c · MB + d         (a, c, d ≥ 0; fitted for relative error)

For a GPU with no measurements, each coefficient is read off a line through the training
GPUs' coefficients against memory bandwidth, in log-log space:

    log coef(gpu) = α + β · log mem_bw_gbs(gpu)

fitted over the GPUs whose fit kept that term (a coefficient of 0 has no log); 0 where most
of them dropped it.

This is the classic "learn the latency per GPU" baseline: good on the GPUs it saw, blind to
everything but bandwidth elsewhere. Its prediction is clamped to the roofline. Every line was
fitted on FP32 kernels (NeuSight's data), so an op of another dtype in a class it has lines for
is refused (kit.predict.refuse_other_dtypes), not given its FP32 time.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from kit.hardware import GPU, get_gpu
from kit.predict.base import dedupe, expand, frame_of
from kit.predict.features import CLASSES, op_class_of
from kit.predict.roofline import roofline

def fit_line(gflops: np.ndarray, mb: np.ndarray, latency_ms: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative error: minimise Σ ((pred − y) / y)²."""
    from scipy.optimize import nnls

    a = np.column_stack([gflops, mb, np.ones_like(gflops)]) / latency_ms[:, None]
    coef, _ = nnls(a, np.ones_like(latency_ms))
    return coef


class LiPredictor:
    name = "li"

    def __init__(self, coefs: dict[str, dict[str, list[float]]]):
        # coefs[op_class][gpu_key] = [a_ms_per_gflop, c_ms_per_mb, d_ms]
        self.coefs = coefs

    @staticmethod
    def fit(frame: pd.DataFrame) -> "LiPredictor":
        from kit.predict.features import arrays_from_frame, work

        coefs: dict[str, dict[str, list[float]]] = {}
        for cls in CLASSES:
            rows = frame[frame.op_class == cls]
            for gpu, grp in rows.groupby("gpu", sort=True):
                flops, nbytes = work(cls, arrays_from_frame(cls, grp))
                coef = fit_line(flops / 1e9, nbytes / 1e6, grp.latency_ms.to_numpy(float))
                coefs.setdefault(cls, {})[gpu] = [float(c) for c in coef]
        return LiPredictor(coefs)

    def coefficients(self, op_class: str, gpu: GPU) -> np.ndarray:
        """The GPU's own fit, or the bandwidth line through the training GPUs' fits."""
        table = self.coefs[op_class]
        if gpu.key in table:
            return np.array(table[gpu.key])
        keys = sorted(table)
        out = []
        for j in range(3):
            values = np.array([table[k][j] for k in keys], dtype=float)
            kept = values > 0
            # a term the fit dropped (0) on a GPU is no point of the line: as log(1e-9) = -20.7
            # one P100 zero had pulled the elementwise ms/GFLOP term, 0.028-0.086 on the other
            # four GPUs, to 0.0031 on the L4 and 0.00035 on the A100 80GB. Zero where most GPUs
            # dropped it (softmax's FLOP term, layer norm's byte term)
            if kept.sum() * 2 < len(keys):
                out.append(0.0)
                continue
            logbw = np.log([get_gpu(k).mem_bw_gbs for k, ok in zip(keys, kept) if ok])
            y = np.log(values[kept])
            if len(y) > 1 and np.ptp(logbw) > 0:
                beta, alpha = np.polyfit(logbw, y, 1)
            else:
                beta, alpha = 0.0, float(np.mean(y))
            out.append(float(np.exp(alpha + beta * np.log(gpu.mem_bw_gbs))))
        return np.array(out)

    def predict(self, ops, gpu: GPU | str) -> pd.DataFrame:
        from kit.predict import refuse_other_dtypes

        gpu = get_gpu(gpu)
        unique, where = dedupe(ops)
        refuse_other_dtypes(unique, self.name, self.coefs)  # its lines are FP32 kernels' alone
        rows = []
        for op in unique:
            r = roofline(op, gpu)
            cls = op_class_of(op)
            if cls in self.coefs:
                a, c, d = self.coefficients(cls, gpu)
                lat = max(a * op.flops / 1e9 + c * op.bytes / 1e6 + d, r.time_ms)
            else:
                lat = r.time_ms
            util = r.time_ms / lat if lat > 0 else 1.0
            rows.append((lat, r.time_ms, r.bound, "", 0, 0, util, lat, lat))
        return expand(frame_of(rows), where)
