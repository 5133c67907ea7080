"""Inference of a trained kit.predict.nets.MLP in numpy, so predicting needs no torch.

Training runs in torch (kit.predict.nets); the shipped weights are plain safetensors arrays, and
loading them into ArrayMLP computes the same function, x -> clamp -> standardise ->
[Linear, SiLU] x depth -> Linear (in float64: an op's answer does not depend on the batch it
is predicted in). A fresh process that only predicts then skips importing torch (about 2 s of
CPU on a small machine).
"""
from __future__ import annotations

import numpy as np

BUFFERS = ("x_mean", "x_std", "x_min", "x_max")


def silu(x: np.ndarray) -> np.ndarray:
    return x * (0.5 + 0.5 * np.tanh(0.5 * x))  # x · sigmoid(x), without exp overflow


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.float32(0), x)


def logsigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(np.float32(0), -x)


class ArrayMLP:
    """The numpy twin of nets.MLP, built from its state_dict arrays (checked against the sizes)."""

    def __init__(self, state: dict, n_in: int, n_out: int, hidden: int, depth: int = 2):
        linear = [f"net.{2 * i}" for i in range(depth + 1)]
        keys = [*BUFFERS, *(f"{p}.{w}" for p in linear for w in ("weight", "bias"))]
        missing = [k for k in keys if k not in state]
        extra = sorted(set(state) - set(keys))
        if missing or extra:
            raise KeyError(f"MLP state: missing {missing[:3]}, unexpected {extra[:3]}")
        widths = [n_in] + [hidden] * depth + [n_out]
        shapes = {k: (n_in,) for k in BUFFERS}
        for i, p in enumerate(linear):
            shapes[f"{p}.weight"] = (widths[i + 1], widths[i])
            shapes[f"{p}.bias"] = (widths[i + 1],)
        self.keys = keys
        self.arrays = {}
        for k in keys:
            a = np.asarray(state[k], dtype=np.float32)
            if a.shape != shapes[k]:
                raise ValueError(f"MLP state: {k} has shape {a.shape}, expected {shapes[k]}")
            if not np.isfinite(a).all():
                raise ValueError(f"MLP state: {k} holds values that are no finite number")
            self.arrays[k] = a
        if not (self.arrays["x_std"] > 0).all() or not (self.arrays["x_min"] <= self.arrays["x_max"]).all():
            # a 0 spread divided every input by 0: NaN latencies, printed with exit 0
            raise ValueError("MLP state: x_std must be > 0 and x_min <= x_max for every input")
        self.n_in, self.n_out, self.hidden = n_in, n_out, hidden
        # computed in float64: float32 products summed in a batch-size-dependent order (BLAS
        # blocking) gave one op answers a few ulps apart beside different neighbours, enough to
        # flip the tile chooser's argmax at a near-tie (a 4.5% move); float64 leaves 1e-16
        self.layers = [(self.arrays[f"{p}.weight"].T.astype(np.float64), self.arrays[f"{p}.bias"].astype(np.float64))
                       for p in linear]
        self.scale = {k: self.arrays[k].astype(np.float64) for k in BUFFERS}

    def __call__(self, x: np.ndarray) -> np.ndarray:
        a = self.scale
        h = np.clip(np.asarray(x, dtype=np.float64), a["x_min"], a["x_max"])
        h = (h - a["x_mean"]) / a["x_std"]
        for w, b in self.layers[:-1]:
            h = silu(h @ w + b)
        w, b = self.layers[-1]
        return h @ w + b

    def state_dict(self) -> dict:
        """torch tensors in nets.MLP's order (for saving or fingerprinting a loaded model)."""
        import torch

        return {k: torch.from_numpy(self.arrays[k].copy()) for k in self.keys}
