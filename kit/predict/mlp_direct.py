"""The "learn the latency" baseline: an MLP from shape and GPU features straight to log latency.

It sees the same GPU features as the tile-MLP (kit.predict.features.GPU_FEATURES) and the op's
shape, FLOPs and bytes, but no tiles, waves or roofline, and nothing bounds its answer from
below except a final clamp to the roofline. Off the training GPUs it has only the GPU features
to go on, which is what the tile-MLP's bounded utilisation is compared against. One small
ensemble per op class, with the same p10/p50/p90 heads as the tile-MLP. It learned FP32 kernels
alone (NeuSight's data) and has no dtype input, so it refuses an op of another dtype in a class
it has a model of (kit.predict.refuse_other_dtypes).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from kit.hardware import GPU, get_gpu
from kit.predict.base import dedupe, expand, frame_of
from kit.predict.features import (CLASSES, ELEM_KINDS, arrays_from_frame, arrays_from_ops,
                                  gpu_vector, op_class_of, work)
from kit.predict.roofline import roofline


def shape_features(op_class: str, a: dict, gpu: GPU | str) -> np.ndarray:
    """log dims, log FLOPs and bytes (and the elementwise kind) of a batch, then the GPU's."""
    flops, nbytes = work(op_class, a)
    w = [np.log(np.maximum(flops, 1.0)), np.log(nbytes)]
    if op_class == "gemm":
        cols = [np.log(a["m"]), np.log(a["n"]), np.log(a["k"]), np.log(a["b"]), a["linear"], *w]
    elif op_class == "elementwise":
        kinds = np.array([[float(kd == k) for k in ELEM_KINDS] for kd in a["kind"]])
        cols = [np.log(a["numel"]), a["inputs"], *w, *kinds.reshape(len(flops), -1).T]
    else:
        cols = [np.log(a["rows"]), np.log(a["cols"]), *w]
    return np.column_stack([*cols, np.tile(gpu_vector(gpu), (len(flops), 1))])


def direct_design(frame: pd.DataFrame, op_class: str):
    """(x, log_y, gpu) for the rows of one class in a measurement table; None if it has none."""
    xs, ys, gpus = [], [], []
    for gpu, grp in frame[frame.op_class == op_class].groupby("gpu", sort=True):
        xs.append(shape_features(op_class, arrays_from_frame(op_class, grp), gpu))
        ys.append(np.log(grp.latency_ms.to_numpy(float)))
        gpus += [gpu] * len(grp)
    if not xs:
        return None
    return np.concatenate(xs), np.concatenate(ys), np.array(gpus, dtype=object)


class DirectMLP:
    name = "mlp"

    def __init__(self, models: dict):
        self.models = models  # op_class -> kit.predict.tile_ensemble.ClassModel (mode "direct")

    @staticmethod
    def fit(frame: pd.DataFrame, *, seed: int = 0, members: int = 3, epochs: int = 30,
            hidden: int = 64, min_steps: int = 300, progress=None) -> "DirectMLP":
        from kit.predict.tile_fit import gpu_balanced_weights
        from kit.predict.tile_ensemble import ClassModel

        models = {}
        for cls in CLASSES:
            design = direct_design(frame, cls)
            if design is None:
                continue
            x, ly, gpus = design
            models[cls] = ClassModel.fit(cls, x, np.zeros(len(x)), ly, gpu_balanced_weights(gpus),
                                         seed=seed, members=members, epochs=epochs,
                                         hidden=hidden, mode="direct", min_steps=min_steps,
                                         progress=progress)
        return DirectMLP(models)

    def predict(self, ops, gpu: GPU | str) -> pd.DataFrame:
        from kit.predict import refuse_other_dtypes
        from kit.predict.tile_ensemble import combine

        gpu = get_gpu(gpu)
        unique, where = dedupe(ops)
        # fitted on FP32 rows with no dtype input: a bf16 GEMM would get its FP32 time
        refuse_other_dtypes(unique, self.name, self.models)
        out = np.zeros((len(unique), 3))
        roof = [roofline(op, gpu) for op in unique]
        by_class: dict[str, list[int]] = {}
        for i, op in enumerate(unique):
            by_class.setdefault(op_class_of(op), []).append(i)
        for cls, idx in by_class.items():
            if cls not in self.models:
                out[idx] = [[roof[i].time_ms] * 3 for i in idx]
                continue
            x = shape_features(cls, arrays_from_ops(cls, [unique[i] for i in idx]), gpu)
            c, lo, hi = combine(self.models[cls].log_quantiles(x, np.zeros(len(x))))
            out[idx] = np.exp(np.column_stack([c, lo, hi]))
        rows = []
        for (lat, lo, hi), r in zip(out, roof):
            lat = max(lat, r.time_ms)
            rows.append((lat, r.time_ms, r.bound, "", 0, 0, r.time_ms / lat,
                         min(max(lo, r.time_ms), lat), max(hi, lat)))
        return expand(frame_of(rows), where)
