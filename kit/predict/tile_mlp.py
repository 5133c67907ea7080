"""The tile-MLP: a learned per-wave utilisation, bounded by the roofline (after NeuSight, ASPLOS'25).

    latency = base_ms / utilisation,   base_ms = max(waves × per-wave time at peak, roofline_ms)
    utilisation = sigmoid(MLP(tile features, GPU features)) in (0, 1]

A GPU's peak and bandwidth set base_ms exactly; what the network learns is how far from that
bound a wave of one tile runs, from numbers that mean the same on any GPU (features.py). That is
why it carries over to GPUs it has never seen: it never predicts a latency outright, only a
fraction of a roofline it can compute for any catalog GPU, and never a time below it.

One model per op class (gemm, elementwise, softmax, layernorm). Each is a small deep ensemble
(seeds seed, seed+1, ...) whose members have three heads: the 10th, 50th and 90th percentile
of log latency, trained with the pinball loss. The band p10–p90 combines, in quadrature, the
heads' width, the members' disagreement (which grows off the training distribution) and a
per-class transfer error σ(d) that grows with the GPU's distance d to the nearest training GPU
(kit.predict.training.transfer_sigma, split-conformal on the training GPUs alone): σ_0 at d = 0,
measured on shapes held out of every training GPU, and σ from d_near on, measured by leaving
each training GPU out in turn (a new GPU is exactly what those left-out GPUs were); linear
in between (sigma_at_distance).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from kit.hardware import GPU, get_gpu
from kit.predict.base import COLUMNS, WavePredictor, dedupe, expand
from kit.predict.element_rates import element_bound_ms
from kit.predict.gemv import applies as gemv_applies
from kit.predict.gemv import kernel_ms_of as gemv_kernel_ms
from kit.predict.gemv import stream_bound_ms as gemv_stream_bound_ms
from kit.predict.split_k import apply_split_k, split_limits
from kit.predict.tensor_core import (ATTENTION_MIN_SEQ_Q, applies, attention_params_for, curve_gemm, kernel_ms_of,
                                     params_for)
from kit.ops import DTYPE_BYTES
from kit.predict.roofline import roofline
from kit.predict.features import (arrays_from_ops, feature_matrix, feature_row_blocking,
                                  gpu_distance, op_class_of, row_launches, waves)
from kit.tiling import ELEMENTWISE_ELEMS_PER_THREAD, ELEMENTWISE_THREADS

QUANTILES = (0.1, 0.5, 0.9)
FEW_ROWS = 16  # GEMMs this thin are bounded by as many calls of their one-row twin (few_rows_ms)
FLOOR_SHARE = 0.5  # of the dispatch floor, the least an isolated vector or row call predicts
Z80 = 1.2816  # standard normal 90th percentile: ±Z80·σ spans 80%


def heads_to_log_latency(out, log_base):
    """Network outputs (n, 3) -> log-latency quantiles (n, 3) [p10, p50, p90], each ≥ log_base.

    Head 0 is the median utilisation's logit; heads 1 and 2 move it up (faster, p10) and down
    (slower, p90) by a softplus, so the quantiles never cross."""
    import torch
    from torch.nn.functional import logsigmoid, softplus

    z = out[:, 0]
    fast = z + softplus(out[:, 1])
    slow = z - softplus(out[:, 2])
    return log_base[:, None] - torch.stack([logsigmoid(fast), logsigmoid(z), logsigmoid(slow)], 1)


def direct_heads(out, log_base):
    """The direct MLP's heads: log latency itself (plus log_base, zero there), and two widths."""
    from torch.nn.functional import softplus
    import torch

    c = out[:, 0] + log_base
    return torch.stack([c - softplus(out[:, 1]), c, c + softplus(out[:, 2])], 1)


HEADS = {"utilisation": heads_to_log_latency, "direct": direct_heads}


def heads_to_log_latency_np(out: np.ndarray, log_base: np.ndarray) -> np.ndarray:
    """heads_to_log_latency in numpy (for the numpy-loaded weights)."""
    from kit.predict.array_mlp import logsigmoid, softplus

    z = out[:, 0]
    fast, slow = z + softplus(out[:, 1]), z - softplus(out[:, 2])
    return log_base[:, None] - np.stack([logsigmoid(fast), logsigmoid(z), logsigmoid(slow)], 1)


def direct_heads_np(out: np.ndarray, log_base: np.ndarray) -> np.ndarray:
    """direct_heads in numpy."""
    from kit.predict.array_mlp import softplus

    c = out[:, 0] + log_base
    return np.stack([c - softplus(out[:, 1]), c, c + softplus(out[:, 2])], 1)


HEADS_NP = {"utilisation": heads_to_log_latency_np, "direct": direct_heads_np}


class ClassModel:
    """The ensemble for one op class."""

    def __init__(self, op_class: str, members: list, hidden: int, mode: str = "utilisation",
                 n_in: int | None = None):
        self.op_class, self.members, self.hidden, self.mode = op_class, members, hidden, mode
        self.n_in = n_in if n_in is not None else int(members[0].x_mean.numel())

    @staticmethod
    def fit(op_class: str, x: np.ndarray, log_base: np.ndarray, log_y: np.ndarray,
            weight: np.ndarray, *, seed: int, members: int = 3, epochs: int = 30,
            hidden: int = 64, mode: str = "utilisation", min_steps: int = 300,
            progress=None) -> "ClassModel":
        import torch

        from kit.predict.nets import MLP, fit, pinball

        lb = torch.as_tensor(log_base, dtype=torch.float32)
        ly = torch.as_tensor(log_y, dtype=torch.float32)
        heads = HEADS[mode]
        nets = []
        for i in range(members):
            torch.manual_seed(seed + i)
            net = MLP(x.shape[1], 3, hidden=hidden, depth=2)
            net.set_scale(x)
            with torch.no_grad():  # start near utilisation 0.5 (or the mean) with a narrow band
                start = 0.0 if mode == "utilisation" else float(ly.mean())
                net.net[-1].bias.copy_(torch.tensor([start, -1.0, -1.0]))
            fit(net, x, lambda out, idx: pinball(heads(out, lb[idx]), ly[idx], QUANTILES),
                epochs=epochs, seed=seed + i, sample_weight=weight, min_steps=min_steps,
                progress=progress)
            nets.append(net)
        return ClassModel(op_class, nets, hidden, mode)

    def log_quantiles(self, x: np.ndarray, log_base: np.ndarray) -> np.ndarray:
        """(members, n, 3) log-latency quantiles."""
        from kit.predict.array_mlp import ArrayMLP

        if all(isinstance(m, ArrayMLP) for m in self.members):  # loaded weights: no torch
            lb = np.asarray(log_base, dtype=np.float32)
            x32 = np.asarray(x, dtype=np.float32)
            return np.stack([HEADS_NP[self.mode](m(x32), lb) for m in self.members]).astype(float)
        import torch

        lb = torch.as_tensor(log_base, dtype=torch.float32)
        with torch.no_grad():
            xt = torch.as_tensor(x, dtype=torch.float32)
            heads = HEADS[self.mode]
            return np.stack([heads(m(xt), lb).numpy() for m in self.members])

    def state(self, prefix: str = "") -> tuple[dict, dict]:
        tensors = {f"{prefix}{self.op_class}.{i}.{k}": v for i, m in enumerate(self.members)
                   for k, v in m.state_dict().items()}
        return tensors, {"members": len(self.members), "hidden": self.hidden,
                         "n_in": self.n_in, "mode": self.mode}

    @staticmethod
    def from_state(op_class: str, tensors: dict, meta: dict, prefix: str = "") -> "ClassModel":
        from kit.predict.array_mlp import ArrayMLP

        nets = []
        for i in range(meta["members"]):
            head = f"{prefix}{op_class}.{i}."
            nets.append(ArrayMLP({k[len(head):]: v for k, v in tensors.items() if k.startswith(head)},
                                 meta["n_in"], 3, hidden=meta["hidden"], depth=2))
        return ClassModel(op_class, nets, meta["hidden"], meta.get("mode", "utilisation"),
                          meta["n_in"])


def combine(logq: np.ndarray, transfer_sigma: float = 0.0):
    """Ensemble (members, n, 3) -> (log p50, log p10, log p90) per op.

    half-width² = head width² + (Z80 · member spread)² + (Z80 · transfer σ)²"""
    centre = logq[:, :, 1].mean(0)
    spread = logq[:, :, 1].std(0) if len(logq) > 1 else np.zeros_like(centre)
    extra = (Z80 * spread) ** 2 + (Z80 * transfer_sigma) ** 2
    down = np.sqrt(((logq[:, :, 1] - logq[:, :, 0]) ** 2).mean(0) + extra)
    up = np.sqrt(((logq[:, :, 2] - logq[:, :, 1]) ** 2).mean(0) + extra)
    return centre, centre - down, centre + up


def sigma_at_distance(sigma_0: float, sigma_far: float, distance: float, near: float) -> float:
    """The transfer σ at a GPU's distance to the nearest training GPU: σ_0 (the in-distribution
    anchor) at 0, σ_far (the leave-one-GPU-out anchor) from `near` (the closest left-out
    transfer) on, linear in between; never below σ_0, never decreasing with distance."""
    sigma_far = max(sigma_far, sigma_0)
    share = 1.0 if near <= 0 else min(1.0, max(0.0, distance) / near)
    return sigma_0 + (sigma_far - sigma_0) * share


class TilePredictor:
    """The kit's own predictor: tile choice + per-class utilisation ensembles."""

    name = "tile"

    def __init__(self, chooser, models: dict, transfer_sigma: dict | None = None,
                 manifest: dict | None = None, band: dict | None = None):
        self.chooser, self.models = chooser, models
        self.transfer_sigma = {k: float(v) for k, v in (transfer_sigma or {}).items()}
        self.manifest = manifest or {}
        self.band = dict(band or {})  # kit.predict.training.transfer_sigma's band settings

    def transfer_scale(self, gpu: GPU | str) -> float:
        """The share of the way from σ_0 to σ a GPU gets: min(1, d / near_distance), d its
        distance to the nearest training GPU (0 on a training GPU). 1 for weights without band
        settings."""
        near, gpus = self.band.get("near_distance"), self.band.get("train_gpus")
        if not near or not gpus:
            return 1.0
        return min(1.0, gpu_distance(gpu, gpus) / near)

    def class_sigma(self, op_class: str, gpu: GPU | str) -> float:
        """The transfer σ of an op class on a GPU: sigma_at_distance between the band's σ_0
        (sigma_at_0; 0 in weights calibrated before it was measured) and the class's σ."""
        far = self.transfer_sigma.get(op_class, 0.0)
        s0 = float(self.band.get("sigma_at_0", {}).get(op_class, 0.0))
        return sigma_at_distance(s0, far, self.transfer_scale(gpu), 1.0)

    @classmethod
    def shipped(cls) -> "TilePredictor":
        from kit.predict.weights import shipped_bundle

        return shipped_bundle().tile

    def predict(self, ops, gpu: GPU | str, split_k: bool = True) -> pd.DataFrame:
        """The protocol's frame for ops on gpu. split_k: GEMMs that underfill the GPU may split
        their reduction (kit.predict.split_k); False gives the unsplit prediction of each."""
        gpu = get_gpu(gpu)
        unique, where = dedupe(list(ops))
        out = pd.DataFrame(index=range(len(unique)), columns=COLUMNS)
        by_class: dict[str, list[int]] = {}
        for i, op in enumerate(unique):
            cls = op_class_of(op)
            by_class.setdefault(cls if cls in self.models else "other", []).append(i)
        for cls, idx in by_class.items():
            ops_c = [unique[i] for i in idx]
            if cls == "other":  # attention, embedding, memcpy, ...: the wave model
                part = WavePredictor().predict(ops_c, gpu)
                self._fused_attention(ops_c, gpu, part)
                self._elementwise_proxies(ops_c, gpu, part)
                self._wave_floor(ops_c, gpu, part)
                out.loc[idx, COLUMNS] = part[COLUMNS].values
                continue
            part = self._predict_class(cls, ops_c, gpu)
            gemv = gemv_applies(gpu, ops_c) if cls == "gemm" and self._gemv_rule else \
                np.zeros(len(ops_c), dtype=bool)
            if cls == "gemm" and split_k:
                # a GEMM on a measured tensor-core curve keeps it: the curve was fitted on kernel
                # times that already hold cuBLAS's own split-K and reduce kernels; a gemv kernel
                # is no tiled GEMM to split
                free = [j for j, op in enumerate(ops_c) if not curve_gemm(gpu, op) and not gemv[j]]
                if free:
                    part = part.reset_index(drop=True)
                    split = apply_split_k(lambda o, ways: self._predict_class("gemm", o, gpu, ways),
                                          lambda o: self._predict_reduce(o, gpu),
                                          [ops_c[j] for j in free],
                                          part.loc[free].reset_index(drop=True), gpu.sm_count,
                                          split_limits(gpu.vendor))
                    part.loc[free, COLUMNS] = split[COLUMNS].values
            if gemv.any():
                part = self._gemv(ops_c, gpu, gemv, part.reset_index(drop=True))
            if cls == "gemm":
                # the caps (ways it could run: as one-row or unbatched calls) hold over the
                # aligned twin's lift too, so they apply on both sides of it
                rows_ms, batches_ms = self.few_rows_ms(ops_c, gpu), self.few_batches_ms(ops_c, gpu)
                part = _cap_at(_cap_at(part.reset_index(drop=True), rows_ms), batches_ms)
                part = self._aligned_bound(ops_c, gpu, part.reset_index(drop=True))
                part = _cap_at(_cap_at(part, rows_ms), batches_ms)
                part = self._stream_bound(ops_c, gpu, part.reset_index(drop=True))
            out.loc[idx, COLUMNS] = part[COLUMNS].values
        for c in ("latency_ms", "roofline_ms", "utilisation", "latency_p10_ms", "latency_p90_ms"):
            out[c] = out[c].astype(float)
        # utilisation is a share in (0, 1] of a bound under the latency. Where a path other than
        # the tile-MLP set the time (a curve, a bound, the stream), the wave bound may exceed it
        # (744% of it for a b = 2 GEMM of 24 x 8 outputs over k = 16384 on an H100): the share
        # of the roofline is then the one that holds
        over = out.utilisation.to_numpy(float) > 1.0
        if over.any():
            out.loc[over, "utilisation"] = (out.roofline_ms / out.latency_ms)[over]
        out["tiles"] = out["tiles"].astype(int)
        out["waves"] = out["waves"].astype(int)
        out["tile"] = out["tile"].astype(str)
        out["bound"] = out["bound"].astype(str)
        out["split_k"] = out["split_k"].astype(int)
        return expand(out, where)

    _gemv_rule = True  # False: the tile-MLP's own GEMV prediction (benchmarks/gemv_fit.py)

    def _gemv(self, ops: list, gpu: GPU, rows: np.ndarray, part: pd.DataFrame) -> pd.DataFrame:
        """GEMMs with m or n of 1 (kit.predict.gemv.applies) take its stream of their bytes, plus
        this predictor's dispatch floor, so the isolated latency means what it means for every
        other op; the tile shown is the gemv kernel's (no tiles, one wave)."""
        from kit.workload.iteration import isolation_floor_ms

        floor = isolation_floor_ms(self, gpu)
        idx = np.flatnonzero(rows)
        t, lo, hi = gemv_kernel_ms(np.array([ops[i].bytes for i in idx]), gpu.mem_bw_gbs)
        lat = t + floor
        part.loc[idx, "latency_ms"] = lat
        part.loc[idx, "latency_p10_ms"] = np.maximum(lo + floor, part.loc[idx, "roofline_ms"].to_numpy(float))
        part.loc[idx, "latency_p90_ms"] = hi + floor
        part.loc[idx, "utilisation"] = part.loc[idx, "roofline_ms"].to_numpy(float) / lat
        part.loc[idx, ["tile", "tiles", "waves", "split_k"]] = ["gemv", 1, 1, 1]
        return part

    def _predict_reduce(self, ops: list, gpu: GPU) -> pd.DataFrame:
        """A split GEMM's reduce kernels: the elementwise model, or the wave model in weights
        fitted without one (a GEMM-only fit)."""
        if "elementwise" in self.models:
            return self._predict_class("elementwise", ops, gpu)
        return WavePredictor().predict(ops, gpu)

    def _predict_class(self, cls: str, ops: list, gpu: GPU, split_ways=None) -> pd.DataFrame:
        """split_ways: for GEMMs that are split-K batches (kit.predict.split_k), each one's S."""
        dtypes = {getattr(op, "dtype", "fp32") for op in ops}
        if len(dtypes) > 1:  # one batch per dtype
            frames, order = [], []
            for d in sorted(dtypes):
                idx = [i for i, op in enumerate(ops) if op.dtype == d]
                frames.append(self._predict_class(cls, [ops[i] for i in idx], gpu,
                                                  None if split_ways is None else [split_ways[i] for i in idx]))
                order += idx
            out = pd.concat(frames, ignore_index=True)
            out.index = order
            return out.sort_index()
        dtype = dtypes.pop()
        a = arrays_from_ops(cls, ops)
        names = None
        if cls == "gemm":
            if split_ways is not None:
                a["split_ways"] = np.asarray(split_ways, dtype=float)
            tile, names = self.chooser.tile_arrays(a, gpu, dtype)
            a.update(tile)
        w = waves(cls, a, gpu, dtype)
        if names is None:
            names = tile_names(cls, a, dtype, gpu.vendor)
        x = feature_matrix(cls, a, gpu, w)
        base = w["base_ms"]
        centre, lo, hi = combine(self.models[cls].log_quantiles(x, np.log(base)),
                                 self.class_sigma(cls, gpu))
        lat = np.exp(centre).astype(np.float64)  # float64: the curves and bounds below write into it
        p10, p90 = np.minimum(np.maximum(np.exp(lo), base), lat), np.maximum(np.exp(hi), lat)
        if cls in ONE_WAVE_CLASSES:  # the floor first: the cap keeps a small op under a full wave
            self._dispatch_floor(gpu, w["roofline_ms"], lat, p10, p90)
            if cls == "elementwise":  # before the cap, whose rungs carry their own bound: after
                self._element_bound(a, gpu, lat, p10, p90)  # it, a bf16 gelu at 0.9 of a wave came out over the full wave
            lat, p10, p90 = self._one_wave_cap(cls, ops, gpu, w["tiles"], w["slots"], lat, p10, p90)
        if cls == "gemm":
            self._tensor_core(a, gpu, dtype, w["roofline_ms"], lat, p10, p90)
        shown = w if cls in ("gemm", "elementwise") else waves(cls, a, gpu, dtype, launch=True)
        return pd.DataFrame({
            "latency_ms": lat, "roofline_ms": w["roofline_ms"], "bound": w["bound"],
            "tile": names, "tiles": shown["tiles"].astype(int), "waves": shown["waves"].astype(int),
            "utilisation": base / lat, "latency_p10_ms": p10, "latency_p90_ms": p90,
            "split_k": 1}, columns=COLUMNS)

    def _tensor_core(self, a: dict, gpu: GPU, dtype: str, roofline_ms, lat, p10, p90) -> None:
        """Aligned tensor-core GEMMs on Hopper take kit.predict.tensor_core's measured curve, not
        the utilisation learned from FP32 SIMT kernels (in place), plus this predictor's dispatch
        floor, so the isolated latency means what it means for every other op."""
        tc = applies(gpu, dtype, a["align"])
        if not tc.any():
            return
        from kit.workload.iteration import isolation_floor_ms

        floor = isolation_floor_ms(self, gpu)
        t, lo, hi = kernel_ms_of(np.asarray(roofline_ms, dtype=float)[tc], params_for(gpu, dtype))
        lat[tc], p10[tc], p90[tc] = t + floor, lo + floor, hi + floor

    def few_rows_ms(self, ops: list, gpu: GPU | str) -> np.ndarray:
        """Per GEMM, r calls of its one-row twin where its m or n is r (2 <= r <= FEW_ROWS): the
        most it may take, as it could run as those (predict caps it, _cap_at); NaN for any other.
        Where the tile-MLP is off its data for thin GEMMs the gap had been a cliff once GEMVs
        streamed: on an MI300X (no timed AMD GEMV, no tensor-core curve) a bf16 GEMM of 8192 x
        8192 weights took 0.067 ms at one row and 0.25 ms at two."""
        out = np.full(len(ops), np.nan)
        rows = [j for j, op in enumerate(ops) if 2 <= min(op.m, op.n) <= FEW_ROWS]
        if rows:
            twins = [replace(ops[j], m=1) if ops[j].m <= ops[j].n else replace(ops[j], n=1) for j in rows]
            count = np.array([min(ops[j].m, ops[j].n) for j in rows], dtype=float)
            out[rows] = count * self.predict(twins, gpu).latency_ms.to_numpy(dtype=float)
        return out

    def few_batches_ms(self, ops: list, gpu: GPU | str) -> np.ndarray:
        """Per GEMM of batch b (2 <= b <= FEW_ROWS), b kernel times of its b = 1 twin plus one
        dispatch floor: the most it may take, as it could run as those back-to-back calls
        (predict caps it, _cap_at); NaN for any other. Split-K is open to an unbatched GEMM only
        (cuBLAS's rule in NeuSight's data), so a batch of 2 of a small output over a long k had
        walked all of k on a couple of SMs: 24 x 8 outputs over k = 16384 on an H100 took
        0.053 ms at b = 1 and 1.07 ms at b = 2."""
        from kit.workload.iteration import isolation_floor_ms

        gpu = get_gpu(gpu)
        out = np.full(len(ops), np.nan)
        rows = [j for j, op in enumerate(ops) if 2 <= op.b <= FEW_ROWS]
        if rows:
            floor = isolation_floor_ms(self, gpu)
            twin = self.predict([replace(ops[j], b=1) for j in rows], gpu).latency_ms.to_numpy(dtype=float)
            b = np.array([ops[j].b for j in rows], dtype=float)
            out[rows] = b * np.maximum(twin - floor, 0.0) + floor
        return out

    def _aligned_bound(self, ops: list, gpu: GPU, part: pd.DataFrame) -> pd.DataFrame:
        """An unaligned GEMM in a dtype with a tensor-core curve is never faster than the same GEMM
        aligned, on the curve (padding it would be a way to run it), split-K included. TF32 and
        Volta's fp16, which no unaligned share slows, had come out 15-20% under their aligned
        twins on an A100, a B200 and a V100. The band moves up with it."""
        twin = self.aligned_twin_ms(ops, gpu)
        rows = [j for j in range(len(ops)) if np.isfinite(twin[j]) and part.tile.iloc[j] != "gemv"]
        if not rows:
            return part
        lift = np.maximum(1.0, twin[rows] / part.latency_ms.to_numpy(dtype=float)[rows])
        # utilisation stays a share of the same wave bound: it falls as the latency rises
        for col, f in (("latency_ms", lift), ("latency_p10_ms", lift), ("latency_p90_ms", lift),
                       ("utilisation", 1.0 / lift)):
            part.loc[part.index[rows], col] = part[col].to_numpy(dtype=float)[rows] * f
        return part

    def _stream_bound(self, ops: list, gpu: GPU, part: pd.DataFrame) -> pd.DataFrame:
        """No GEMM streams its bytes faster than the largest share of the bandwidth a GEMM of its
        dtype reached on the H200 (kit.predict.gemv.STREAM_SHARE_MAX), plus this predictor's
        dispatch floor. A split-K Linear of a few rows had come out at 100% of an L4's bandwidth
        (its split batch shares the weight in the features, so the tile-MLP saw a k / S slice of
        it, and only the roofline held it): 2 x 4096 x 4096 in FP32 at 0.224 ms, half its
        one-row twin's time. The band moves up with it, p10 to the bound."""
        from kit.workload.iteration import isolation_floor_ms

        low = gemv_stream_bound_ms(ops, gpu.mem_bw_gbs) + isolation_floor_ms(self, gpu)
        lat = part.latency_ms.to_numpy(dtype=float)
        lift = np.maximum(1.0, low / lat)
        if not (lift > 1).any():
            return part
        p10 = part.latency_p10_ms.to_numpy(dtype=float)
        part["latency_ms"] = lat * lift
        part["latency_p90_ms"] = part.latency_p90_ms.to_numpy(dtype=float) * lift
        part["latency_p10_ms"] = np.where(lift > 1, np.maximum(p10, low), p10)
        part["utilisation"] = part.utilisation.to_numpy(dtype=float) / lift
        return part

    def aligned_twin_ms(self, ops: list, gpu: GPU | str) -> np.ndarray:
        """Per GEMM, the isolated latency of its aligned twin on the tensor-core curve (the
        curve at the full tensor peak, plus this predictor's dispatch floor): the least an
        unaligned GEMM in a dtype with a curve may take (_aligned_bound). NaN for an op on the
        curve itself or in a dtype without one."""
        from kit.workload.iteration import isolation_floor_ms

        gpu = get_gpu(gpu)
        out = np.full(len(ops), np.nan)
        for j, op in enumerate(ops):
            params = params_for(gpu, op.dtype)
            if params is not None and not curve_gemm(gpu, op):
                # kit.predict.roofline's roofline: the full tensor peak, whatever the alignment
                out[j] = kernel_ms_of([roofline(op, gpu).time_ms], params)[0][0]
        return out + isolation_floor_ms(self, gpu) if np.isfinite(out).any() else out

    def _wave_floor(self, ops: list, gpu: GPU, part: pd.DataFrame) -> None:
        """A host-device copy, still the wave model's, is its bytes at the achievable share of a
        PCIe link (kit.hardware.system.pcie_efficiency; all of any other host link's rate) plus
        the least isolated time of a vector kernel (_dispatch_floor's share of the floor), in
        place; its band runs from the link's full rate up as far again (in ratio).
        It had no floor (a one-byte copy came out at 16 fs), then a floor only under it, so a
        copy of 131,072 bytes took 1.4x one of 262,144, both at the link's full rate."""
        from kit.hardware.system import pcie_efficiency
        from kit.ops import Memcpy, elementwise_proxy
        from kit.workload.iteration import isolation_floor_ms

        idx = [i for i, op in enumerate(ops) if isinstance(op, Memcpy) and elementwise_proxy(op) is None]
        if not idx:
            return
        low = FLOOR_SHARE * isolation_floor_ms(self, gpu)
        roof = part.loc[idx, "roofline_ms"].to_numpy(dtype=float)
        eff = pcie_efficiency(gpu.pcie_gen)
        if gpu.host_link_gbs is None:  # PCIe: its achievable share, the band as far again
            lat, p10 = low + roof / eff, low + roof
            p90 = lat * lat / p10
        else:  # another host link (GH200's NVLink-C2C) has no measured share: its full rate, the
            lat = p10 = low + roof  # band up to PCIe's share of it
            p90 = low + roof / eff
        part.loc[idx, ["latency_ms", "latency_p10_ms", "latency_p90_ms", "utilisation"]] = \
            np.column_stack([lat, p10, p90, roof / lat])

    def _dispatch_floor(self, gpu: GPU, roofline_ms, lat, p10, p90) -> None:
        """A vector or row kernel's isolated call is never under FLOOR_SHARE of this predictor's
        dispatch floor (in place). Every measured call carries most of it (NeuSight's fastest
        vector rows: 0.63x the floor on the P100, 0.96x on the A100 40GB, above it elsewhere), so
        a prediction far under it is the MLP off its data: a one-element fill, copy or cast, whose
        FLOP features are empty, came out at 0.08 us on an H100 and 3.9 us at 64 elements, against
        12 us for any other kind. Such a prediction takes that share of the floor plus its
        roofline, its band lifted with it."""
        if getattr(self, "_probing_floor", False):
            return  # the floor's own probe (an add of 2^17 elements) predicts unfloored
        from kit.workload.iteration import isolation_floor_ms

        self._probing_floor = True
        try:
            low = FLOOR_SHARE * isolation_floor_ms(self, gpu)
        finally:
            self._probing_floor = False
        t = low + np.asarray(roofline_ms, dtype=float)
        lift = np.where(lat < low, np.maximum(1.0, t / lat), 1.0)
        lat[:], p10[:], p90[:] = lat * lift, p10 * lift, p90 * lift

    def _element_bound(self, a: dict, gpu: GPU, lat, p10, p90) -> None:
        """Kinds whose elements set their speed (kit.predict.element_rates) are no faster than
        that (in place), plus the dispatch floor the prediction carries (this predictor's floor,
        or all of a prediction under it). Where the bound lifts an op, its band moves up with it:
        p90 by the same factor, p10 to the bound (the fastest rate measured)."""
        bound = element_bound_ms(a["kind"], a["numel"], gpu)
        if not (bound > 0).any():
            return
        from kit.workload.iteration import isolation_floor_ms

        low = np.where(bound > 0, bound + np.minimum(lat, isolation_floor_ms(self, gpu)), 0.0)
        lift = np.maximum(1.0, low / lat)
        p10[:] = np.where(lift > 1, low, p10)
        lat[:], p90[:] = lat * lift, p90 * lift

    def _fused_attention(self, ops: list, gpu: GPU, part: pd.DataFrame) -> None:
        """Fused attention takes kit.predict.tensor_core's curve (in place): measured on Hopper
        in 16-bit, carried over with a wider band elsewhere, plus this predictor's dispatch
        floor. Before, attention off Hopper ran at its bare roofline, 100% of the peak.

        Under 128 queries (ATTENTION_MIN_SEQ_Q: the fitted shapes had 128 to 8,192) an attention
        takes the log-linear blend of its roofline and the curve, by w = log2(queries) / 7, plus
        the floor: one query (a decode step) keeps the roofline in the stream, which the H200's
        decode steps bear out (the curve there made their kernel time 8.6 -> 14.4% off). The
        weight follows the queries alone, so the time grows with queries and with keys: it had
        jumped 1.8x from 127 queries to 128 over a longer cache (A100, 4,096 keys: 0.27 -> 0.48
        ms), and dropped 45% from 16 keys to 17 at 16 queries, where only a longer cache made an
        attention decode-like. The band is the curve's, relative to that centre, its p10 never
        under the roofline."""
        from kit.ops import Attention

        rows = [i for i, op in enumerate(ops) if isinstance(op, Attention)]
        if not rows:
            return
        from kit.workload.iteration import isolation_floor_ms

        floor = isolation_floor_ms(self, gpu)
        for dtype in sorted({ops[i].dtype for i in rows}):
            idx = [i for i in rows if ops[i].dtype == dtype]
            roof = part.loc[idx, "roofline_ms"].to_numpy(dtype=float)
            params, small = attention_params_for(gpu, dtype), [ops[i].head_dim < 128 for i in idx]
            t, lo, hi = kernel_ms_of(roof, params, [ops[i].causal for i in idx], small)
            # a causal mask only removes work: the curve's causal factor (fitted on square
            # shapes, where the mask keeps half the pairs) never makes a masked attention slower
            # than the same one unmasked, as it did where the mask keeps nearly every pair
            # (queries far fewer than keys) or the kernel is memory-bound
            masked = [j for j, i in enumerate(idx) if ops[i].causal]
            if masked:
                full = np.array([roofline(replace(ops[idx[j]], causal=False), gpu).time_ms for j in masked])
                cap = kernel_ms_of(full, params, None, [small[j] for j in masked])
                for arr, bound in zip((t, lo, hi), cap):
                    arr[masked] = np.minimum(arr[masked], bound)
            # a head under 128 is never slower than the same attention at 128 (the kernels pad
            # it there): the small-head factor alone had made a head of 127 1.21x slower than 128
            narrow = [j for j in range(len(idx)) if small[j]]
            if narrow:
                twins = [replace(ops[idx[j]], head_dim=128) for j in narrow]
                padded = np.array([roofline(o, gpu).time_ms for o in twins])
                cap = kernel_ms_of(padded, params, [o.causal for o in twins], None)
                # the padded twin's own time, its causal one capped by its unmasked one as above
                unmasked = kernel_ms_of(np.array([roofline(replace(o, causal=False), gpu).time_ms
                                                  for o in twins]), params, None, None)
                causal = np.array([o.causal for o in twins])
                for arr, bound, free in zip((t, lo, hi), cap, unmasked):
                    arr[narrow] = np.minimum(arr[narrow], np.where(causal, np.minimum(bound, free), bound))
            # the share of the way from the roofline to the curve: 1 from 128 queries on
            w = np.minimum(1.0, np.log2([ops[i].seq_q for i in idx]) / np.log2(ATTENTION_MIN_SEQ_Q))
            centre = np.exp((1 - w) * np.log(roof) + w * np.log(t))
            # the band keeps the curve's relative width around the blended centre, never under
            # the roofline: blending its ends too had left one query a zero-width band
            t, lo, hi = centre, np.minimum(np.maximum(roof, centre * lo / t), centre), centre * hi / t
            part.loc[idx, ["latency_ms", "latency_p10_ms", "latency_p90_ms", "utilisation"]] = np.column_stack(
                [t + floor, lo + floor, hi + floor, roof / (t + floor)])

    def _elementwise_proxies(self, ops: list, gpu: GPU, part: pd.DataFrame) -> None:
        """Dropout and a device-to-device memcpy take their learned elementwise pass, scaled by
        their bytes (kit.ops.elementwise_proxy), in place: as a captured model costs them. The
        tiling shown stays the op's own (kit.tiling's)."""
        from kit.ops import elementwise_proxy

        proxies = {i: p for i, op in enumerate(ops) if (p := elementwise_proxy(op)) is not None}
        if not proxies:
            return
        idx = list(proxies)
        pred = self.predict([proxies[i][0] for i in idx], gpu)
        scale = np.array([proxies[i][1] for i in idx])
        lat = pred.latency_ms.to_numpy(float) * scale
        part.loc[idx, ["latency_ms", "latency_p10_ms", "latency_p90_ms", "utilisation"]] = np.column_stack(
            [lat, pred.latency_p10_ms.to_numpy(float) * scale, pred.latency_p90_ms.to_numpy(float) * scale,
             part.loc[idx, "roofline_ms"].to_numpy(float) / lat])

    def _one_wave_cap(self, cls, ops, gpu, tiles, slots, lat, p10, p90):
        """Every block of a one-wave kernel runs at once, so adding blocks up to a full wave
        cannot make it faster: an op with fewer tiles than the GPU has slots is capped, quantile
        by quantile, at the prediction for the same op grown to each size of a doubling ladder
        from itself to exactly one full wave (wave_ladder), the lowest of them.

        The networks saw few such ops (1% of the vector rows are under 4,500 elements) and,
        left alone, rise as an op shrinks: gelu on 37 elements came out at 0.67 ms on the
        A100-PCIe-40GB, where NeuSight measured 0.03 ms and the same gelu on a million
        elements is predicted at 0.03 ms. The full wave alone was too loose a cap where a wave
        is large: a layer norm of 4 rows of 768 took the 6,912-row wave's 0.086 ms, where
        NeuSight measured 0.047 ms for every layer norm up to ~1e5 elements on that GPU."""
        small = np.flatnonzero(tiles < slots)
        if not small.size:
            return lat, p10, p90
        ladders = [wave_ladder(cls, ops[i], int(tiles[i]), int(slots[i])) for i in small]
        # small ops of one kind and row length share rungs: predict each rung once
        rungs, where = dedupe([op for ladder in ladders for op in ladder])
        pred = expand(self._predict_class(cls, rungs, gpu), where)
        owner = np.repeat(np.arange(small.size), [len(ladder) for ladder in ladders])
        caps = []
        for col in ("latency_ms", "latency_p10_ms", "latency_p90_ms"):
            cap = np.full(small.size, np.inf)
            np.minimum.at(cap, owner, pred[col].to_numpy(float))
            caps.append(cap)
        lat, p10, p90 = lat.copy(), p10.copy(), p90.copy()
        lat[small] = np.minimum(lat[small], caps[0])
        p10[small] = np.minimum(p10[small], np.minimum(caps[1], lat[small]))
        p90[small] = np.maximum(np.minimum(p90[small], caps[2]), lat[small])
        return lat, p10, p90


# classes whose kernels are one block per tile of a fixed size (tile_mlp._one_wave_cap)
ONE_WAVE_CLASSES = ("elementwise", "softmax", "layernorm")


def _cap_at(part: pd.DataFrame, bound: np.ndarray) -> pd.DataFrame:
    """Each row's latency at most bound (NaN: no bound), its band scaled down with it, p10 never
    under the roofline nor over the latency; utilisation stays a share of the same bound."""
    rows = [j for j in range(len(bound)) if np.isfinite(bound[j])]
    if not rows:
        return part
    lat = part.latency_ms.to_numpy(dtype=float)[rows]
    f = np.minimum(1.0, bound[rows] / lat)
    at = part.index[rows]
    roof = part.roofline_ms.to_numpy(dtype=float)[rows]
    part.loc[at, "latency_ms"] = lat * f
    part.loc[at, "latency_p90_ms"] = part.latency_p90_ms.to_numpy(dtype=float)[rows] * f
    part.loc[at, "latency_p10_ms"] = np.minimum(
        np.maximum(part.latency_p10_ms.to_numpy(dtype=float)[rows] * f, roof), lat * f)
    part.loc[at, "utilisation"] = part.utilisation.to_numpy(dtype=float)[rows] / f
    return part


def wave_ladder(cls: str, op, tiles: int, slots: int) -> list:
    """The op grown to 2x, 4x, ... its tiles while under one wave, then to exactly one full
    wave (one_wave_twin): sizes the op cannot be slower than."""
    ladder, grow = [], 2
    while tiles * grow < slots:
        ladder.append(one_wave_twin(cls, op, tiles * grow))
        grow *= 2
    return ladder + [one_wave_twin(cls, op, slots)]


def one_wave_twin(cls: str, op, slots: int):
    """The same op (kind, dtype, row length) grown to exactly `slots` tiles: one full wave.
    Elementwise tiles are ELEMENTWISE_THREADS x ELEMENTWISE_ELEMS_PER_THREAD elements; row ops
    are blocked as the features are (feature_row_blocking)."""
    if cls == "elementwise":
        return replace(op, numel=int(slots * ELEMENTWISE_THREADS * ELEMENTWISE_ELEMS_PER_THREAD))
    rows_per_tile = feature_row_blocking(np.array([float(op.cols)]))[0][0]
    return replace(op, rows=int(slots * rows_per_tile))


def tile_names(cls: str, a: dict, dtype: str = "fp32", vendor: str = "nvidia") -> list[str]:
    """kit.tiling's tile names of vector ops: "512" elements, or rows-per-block x cols."""
    if cls == "elementwise":
        return ["512"] * len(a["numel"])
    rpb = row_launches(cls, a["cols"], DTYPE_BYTES[dtype], vendor)[0].astype(int)
    return [f"{r}x{int(c)}" for r, c in zip(rpb, a["cols"])]
