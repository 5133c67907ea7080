"""Wave scaling after Habitat (Yu et al., USENIX ATC'21): carry a kernel measured on one GPU over
to another by the ratios of their bandwidth, clock and SM count.

    T_d = T_o · (D_o/D_d)^γ · (C_o/C_d)^(1−γ) · (SM_o/SM_d)^(1−γ)

D: DRAM bandwidth, C: clock, SM: streaming multiprocessors; o the origin GPU, d the destination.
γ weighs memory against compute by the kernel's arithmetic intensity I against the origin's
ridge point R = peak / bandwidth, piecewise as the paper defines it:

    γ = 1 − I / (2R)   for I < R        (I = 0: 1, all bandwidth;  I = R: ½)
    γ = R / (2I)       for I ≥ R        (I ≫ R: γ → 0, all compute)

The origin is the training GPU closest to the destination (distance between GPU_FEATURES).
Its time T_o is the measurement of the same shape when the training data has one, else the
reference predictor's answer on the origin (by default the tile-MLP, which was fitted there).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from kit.errors import KitError
from kit.hardware import GPU, get_gpu
from kit.ops import Attention, Gemm
from kit.predict.base import dedupe, expand, frame_of
from kit.predict.features import arrays_from_frame, gpu_vector, op_class_of
from kit.predict.roofline import roofline


def gamma(intensity_flops_per_byte: float, ridge_flops_per_byte: float) -> float:
    """Memory weight γ in [0, 1], Habitat's: 1 − I/(2R) below the ridge, R/(2I) above it. The
    kit had used R / (R + I), which meets it at 0, R and ∞ only: at I = R/2 it gave 0.67, not
    0.75, at I = 2R 0.33, not 0.25 (up to 0.086 apart, a factor of 1.13 in time where the two
    GPUs' bandwidth and compute ratios differ by 4x)."""
    i, r = intensity_flops_per_byte, ridge_flops_per_byte
    if not np.isfinite(i):
        return 0.0
    return 1.0 - i / (2.0 * r) if i < r else r / (2.0 * i)


def scale_ms(t_origin_ms: float, origin: GPU, dest: GPU, g: float) -> float:
    """Habitat's wave-scaling equation."""
    return (t_origin_ms * (origin.mem_bw_gbs / dest.mem_bw_gbs) ** g
            * (origin.boost_clock_mhz / dest.boost_clock_mhz) ** (1 - g)
            * (origin.sm_count / dest.sm_count) ** (1 - g))


def op_key(op) -> tuple:
    """What makes two measurements the same kernel: class, kind and dims (fp32)."""
    cls = op_class_of(op)
    if cls == "gemm":
        return (cls, bool(op.shared_rhs), op.b, op.m, op.n, op.k)
    if cls == "elementwise":
        return (cls, op.kind, op.n_inputs, op.numel)
    if cls in ("softmax", "layernorm"):
        return (cls, op.rows, op.cols)
    return (cls, op)


def frame_keys(cls: str, a: dict) -> list[tuple]:
    """op_key of every row of a batch (kit.predict.features arrays)."""
    if cls == "gemm":
        return [(cls, bool(lin), int(b), int(m), int(n), int(k))
                for lin, b, m, n, k in zip(a["linear"], a["b"], a["m"], a["n"], a["k"])]
    if cls == "elementwise":
        return [(cls, kd, int(i), int(n)) for kd, i, n in zip(a["kind"], a["inputs"], a["numel"])]
    return [(cls, int(r), int(c)) for r, c in zip(a["rows"], a["cols"])]


def _peak_dtypes(ops) -> tuple[str, ...]:
    """The dtypes whose peaks ops run against, fp32 always among them: only GEMMs and attention
    run against a dtype's own peak (kit.predict.roofline)."""
    return tuple(sorted({op.dtype for op in ops if isinstance(op, (Gemm, Attention))} | {"fp32"}))


def nearest_gpu(dest: GPU, candidates: list[str]) -> GPU:
    """The candidate GPU whose features lie closest to dest's (itself when it is one)."""
    v = gpu_vector(dest)
    return get_gpu(min(sorted(candidates), key=lambda k: float(np.sum((gpu_vector(k) - v) ** 2))))


class HabitatPredictor:
    name = "habitat"

    def __init__(self, reference, train_gpus: list[str], measurements: pd.DataFrame | None = None):
        self.reference = reference  # a predictor for shapes the data has not measured
        self.train_gpus = [get_gpu(g).key for g in train_gpus]
        self.measured: dict = {}
        if measurements is not None:
            self.add_measurements(measurements)

    def add_measurements(self, frame: pd.DataFrame) -> None:
        """Index a measurement table's fp32 rows (training GPUs only) by (gpu, shape key)."""
        rows = frame[frame.gpu.isin(self.train_gpus) & (frame.dtype.fillna("fp32") == "fp32")]
        for (gpu, cls), grp in rows.groupby(["gpu", "op_class"], sort=True):
            if cls not in ("gemm", "elementwise", "softmax", "layernorm"):
                continue
            keys = frame_keys(cls, arrays_from_frame(cls, grp))
            for key, t in zip(keys, grp.latency_ms.to_numpy(float)):
                self.measured.setdefault((gpu, key), float(t))

    def _origins(self, dest: GPU, ops) -> list[str]:
        """The training GPUs that run every dtype of ops (a bf16 GEMM on L4 scales from the
        A100, not from the nearer T4, which has no bf16); a KitError when dest or none does."""
        return self._origins_of(dest, _peak_dtypes(ops))

    def _origins_of(self, dest: GPU, dtypes: tuple[str, ...]) -> list[str]:
        """_origins of ops whose peak dtypes (_peak_dtypes) are dtypes."""
        for d in dtypes:
            dest.peak_flops_per_s(d)  # "l4 has no fp8 support": the GPU asked about, first
        able = [g for g in self.train_gpus if all(get_gpu(g).peak_tflops(d) for d in dtypes)]
        if not able:
            raise KitError(f"habitat scales a kernel from a training GPU, and none of "
                           f"{', '.join(self.train_gpus)} runs {', '.join(dtypes)}; choose another "
                           "predictor")
        return able

    def predict(self, ops, gpu: GPU | str) -> pd.DataFrame:
        dest = get_gpu(gpu)
        unique, where = dedupe(ops)
        # each op's own origin: the nearest training GPU that runs its dtypes. One origin for the
        # whole batch had made an op's time depend on the ops beside it (an fp16 RMSNorm on an
        # A10 took 5.7 us alone and 30.6 us beside an fp16 GEMM, scaled from another GPU)
        nearest: dict = {}
        origins = []
        for op in unique:
            dtypes = _peak_dtypes([op])
            if dtypes not in nearest:
                nearest[dtypes] = nearest_gpu(dest, self._origins_of(dest, dtypes))
            origins.append(nearest[dtypes])
        keys = [(origin.key, op_key(op)) for origin, op in zip(origins, unique)]
        fp32 = [getattr(op, "dtype", "fp32") == "fp32" for op in unique]
        ref = {}
        for origin in {o.key: o for o in origins}.values():
            missing = [op for op, o, k, f in zip(unique, origins, keys, fp32)
                       if o.key == origin.key and not (f and k in self.measured)]
            if missing:
                pred = self.reference.predict(missing, origin)
                ref.update(zip(missing, pred.itertuples(index=False)))
        rows = []
        for op, origin, key, f in zip(unique, origins, keys, fp32):
            r_o, r_d = roofline(op, origin), roofline(op, dest)
            if f and key in self.measured:
                t_o = lo_o = hi_o = self.measured[key]
            else:
                p = ref[op]
                t_o, lo_o, hi_o = p.latency_ms, p.latency_p10_ms, p.latency_p90_ms
            g = gamma(r_o.intensity_flops_per_byte, r_o.ridge_flops_per_byte)
            lat, lo, hi = (max(scale_ms(t, origin, dest, g), r_d.time_ms) for t in (t_o, lo_o, hi_o))
            # the origin's tile and waves need not hold on the destination: none reported
            rows.append((lat, r_d.time_ms, r_d.bound, "", 0, 0, r_d.time_ms / lat,
                         min(lo, lat), max(hi, lat)))
        return expand(frame_of(rows), where)
