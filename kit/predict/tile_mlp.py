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

import numpy as np
import pandas as pd

from kit.hardware import GPU, get_gpu
from kit.ops import DTYPE_BYTES
from kit.predict.base import COLUMNS, WavePredictor, dedupe, op_list
from kit.predict.call_memo import CallMemo
from kit.predict.features import (arrays_from_ops, feature_matrix, gpu_distance, lib_tile,
                                  op_class_of, row_launches, waves)
from kit.predict.gemm_bounds import GemmBounds, cap_as, cap_at
from kit.predict.gemv import applies as gemv_applies
from kit.predict.sibling_bound import dominated_training_gpus, runs_dtype
from kit.predict.small_op_bounds import ONE_WAVE_CLASSES, SmallOpBounds
from kit.predict.split_k import apply_split_k, split_limits
from kit.predict.tensor_core import curve_gemm
from kit.predict.tile_ensemble import combine, sigma_at_distance


class TilePredictor(CallMemo, GemmBounds, SmallOpBounds):
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
        # asked by every batch's band (kit.predict.call_memo: once per GPU spec within a call)
        return self.memoised_value("transfer_scale", get_gpu(gpu),
                                   lambda: min(1.0, gpu_distance(gpu, gpus) / near))

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
        their reduction (kit.predict.split_k); False gives the unsplit prediction of each. On a
        GPU that dominates a training GPU (kit.predict.sibling_bound) no op is slower than there:
        where that binds, the op runs as it does on that GPU (its tile shown)."""
        gpu = get_gpu(gpu)
        ops = op_list(ops)  # read once per GPU below: a generator would be empty the second time
        # a bound's twins are predicted many times within one call (kit.predict.call_memo)
        return self._memoised("predict", gpu, split_k, ops, lambda: self._predict(ops, gpu, split_k))

    def _predict(self, ops: list, gpu: GPU, split_k: bool) -> pd.DataFrame:
        out = self.predict_unbounded(ops, gpu, split_k)
        for other in self.dominated_training_gpus(gpu):
            ref = self._reference(ops, other, split_k)
            if ref is None:
                continue
            out = cap_as(out, ref)
            # the band too: no end of it above that GPU's (a capped op had kept its own, wider p90:
            # gpt2's step the same 5.7 ms on both A100s, its p90 7.7 ms on the SXM4 against 5.8);
            # fmin: a row that GPU cannot run (NaN) keeps its own band
            lat = out.latency_ms.to_numpy(dtype=float)
            out["latency_p90_ms"] = np.maximum(np.fmin(out.latency_p90_ms.to_numpy(dtype=float),
                                                       ref.latency_p90_ms.to_numpy(dtype=float)), lat)
            out["latency_p10_ms"] = np.minimum(np.maximum(np.fmin(
                out.latency_p10_ms.to_numpy(dtype=float), ref.latency_p10_ms.to_numpy(dtype=float)),
                out.roofline_ms.to_numpy(dtype=float)), lat)
        return out

    def _reference(self, ops: list, other: GPU, split_k: bool) -> pd.DataFrame | None:
        """The unbounded frame of ops on a training GPU that bounds them, NaN times on the rows of
        a dtype it has no peak for (a peak the weaker card lacks is free to dominate it: a
        --gpu-file Turing card with bf16 over the T4 had failed every bf16 op with 't4 has no
        bf16 support'); None when it runs none of them."""
        runs = np.array([runs_dtype(other, op) for op in ops], dtype=bool)
        if runs.all():
            return self.predict_unbounded(ops, other, split_k)
        if not runs.any():
            return None
        part = self.predict_unbounded([op for op, r in zip(ops, runs) if r], other, split_k)
        # reindexed, not filled into an empty frame: that frame's columns were object, and where
        # the GPU bound a row cap_as wrote its tiles, waves and split into the int64 columns of
        # the answer, which pandas refuses ("Invalid value '[64 0 19532]' for dtype 'int64'");
        # reindexing keeps the strings and makes the counts float, whole, which int64 takes
        return part.set_axis(np.flatnonzero(runs)).reindex(range(len(ops)))

    def dominated_training_gpus(self, gpu: GPU | str) -> list[GPU]:
        """The training GPUs whose predictions bound gpu's (kit.predict.sibling_bound)."""
        gpu = get_gpu(gpu)
        # asked for by every dispatch floor (kit.workload.kernel_times.isolation_floor_ms): once
        # per GPU spec within a call
        return list(self.memoised_value("dominated", gpu, lambda: dominated_training_gpus(
            gpu, self.band.get("train_gpus") or self.manifest.get("train_gpus"))))

    def predict_unbounded(self, ops, gpu: GPU | str, split_k: bool = True) -> pd.DataFrame:
        """predict without the bound by the training GPUs gpu dominates."""
        gpu = get_gpu(gpu)
        ops = op_list(ops)
        return self._memoised("unbounded", gpu, split_k, ops,
                              lambda: self._predict_unbounded(ops, gpu, split_k))

    def _predict_unbounded(self, ops: list, gpu: GPU, split_k: bool) -> pd.DataFrame:
        unique, where = dedupe(ops)
        out = _Columns(len(unique))
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
                out.put(idx, part)
                continue
            part = self._predict_class(cls, ops_c, gpu)
            if cls == "layernorm":
                part = self._norm_column_cap(ops_c, gpu, part.reset_index(drop=True))
                part = self._two_kernel_norm_bound(ops_c, gpu, part)
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
                    for c in COLUMNS:  # column by column: one .loc write of a mixed block (an
                        # object array) had been 6% of opt-1.3b's generation on an A100 (profiled)
                        values = part[c].to_numpy(copy=True)
                        values[free] = split[c].to_numpy()
                        part[c] = values
            if gemv.any():
                part = self._gemv(ops_c, gpu, gemv, part.reset_index(drop=True))
                part = cap_at(part.reset_index(drop=True), self.two_row_ms(ops_c, gpu, gemv, split_k))
            if cls == "gemm":
                # the caps (ways it could run: as one-row or unbatched calls) hold over the
                # aligned twin's lift too, so they apply on both sides of it
                rows_ms, batches_ms = self.few_rows_ms(ops_c, gpu, split_k), self.few_batches_ms(ops_c, gpu, split_k)
                long_ms = self.long_reduction_ms(ops_c, gpu, split_k)
                part = cap_at(cap_at(cap_at(part.reset_index(drop=True), rows_ms), batches_ms), long_ms)
                part = self._aligned_bound(ops_c, gpu, part.reset_index(drop=True))
                part = cap_at(cap_at(cap_at(part, rows_ms), batches_ms), long_ms)
                part = self._stream_bound(ops_c, gpu, part.reset_index(drop=True))
                part = self._padded_bound(ops_c, gpu, part, split_k)
                part = self._doubled_bound(ops_c, gpu, part.reset_index(drop=True), split_k)
            out.put(idx, part)
        # utilisation is a share in (0, 1] of a bound under the latency. Where a path other than
        # the tile-MLP set the time (a curve, a bound, the stream), the wave bound may exceed it
        # (744% of it for a b = 2 GEMM of 24 x 8 outputs over k = 16384 on an H100): the share
        # of the roofline is then the one that holds
        c = out.columns
        over = c["utilisation"] > 1.0
        c["utilisation"][over] = (c["roofline_ms"] / c["latency_ms"])[over]
        # the band holds the latency: the paths that mix tiles (split-K's log-weighted mean) can
        # leave an end a rounding error past it (5.6e-17 ms on an L4's 64-row split Linear)
        c["latency_p10_ms"] = np.minimum(c["latency_p10_ms"], c["latency_ms"])
        c["latency_p90_ms"] = np.maximum(c["latency_p90_ms"], c["latency_ms"])
        return out.frame(where)

    _gemv_rule = True  # False: the tile-MLP's own GEMV prediction (benchmarks/gemv_fit.py)

    def _predict_reduce(self, ops: list, gpu: GPU) -> pd.DataFrame:
        """A split GEMM's reduce kernels: the elementwise model, or the wave model in weights
        fitted without one (a GEMM-only fit)."""
        if "elementwise" in self.models:
            return self._predict_class("elementwise", ops, gpu)
        return WavePredictor().predict(ops, gpu)

    # Tiles whose probability is within this of the chooser's most likely one share the GEMM's
    # prediction (_tile_mixture) and its split choice (kit.predict.split_k). 0 is the hard
    # choice. At 0.25 NeuSight's held-out GEMM rows moved at most 0.1 point (A100-80GB linear
    # 7.59 -> 7.54%, L4 12.04 -> 12.02%), the AMD rows and the H200's FP32 GEMMs a little the
    # right way (MI210 linear 14.5 -> 14.0%; H200 kernels of 1 ms or more 13.0 -> 11.6%), and the
    # cliffs where the choice flips went: an H200 FP32 Linear of 4,010 x 12,438 had run 16%
    # faster at k = 13,099 than at 13,008, an L4 one of 100 x 10,321 26% faster at k = 1,226
    # than at 1,224 (a flip that halved its tiles let a split in).
    soft_tile_margin = 0.25

    def _log_quantiles(self, cls: str, a: dict, gpu: GPU, w: dict) -> tuple:
        """(log p50, log p10, log p90) per op of the batch a, whose waves are w."""
        x = feature_matrix(cls, a, gpu, w)
        return combine(self.models[cls].log_quantiles(x, np.log(w["base_ms"])), self.class_sigma(cls, gpu))

    def _tile_mixture(self, a: dict, gpu: GPU, dtype: str, prob: np.ndarray, chosen: tuple,
                      chosen_tiles: np.ndarray) -> tuple:
        """(log p50, log p10, log p90, options) per GEMM: the mean over the tiles the chooser finds nearly
        as likely as its choice, weighted by how far each is inside soft_tile_margin of it
        (max(0, p - p_max + margin), normalised), chosen being the choice's own quantiles. The
        weights are continuous in the shape, so where the choice flips the prediction passes from
        one tile's to the other's instead of jumping: the classifier was unsure there, and the
        tile-MLP's two tiles can differ by a fifth or by 4x (its GEMM tiles were all the library's own
        choices, made on shapes like these). options: per GEMM, the weights and tile counts of
        the tiles mixed, the choice first (kit.predict.split_k lets each tile's splits in by its
        weight)."""
        weight = tile_weights(prob, self.soft_tile_margin)
        top = prob.argmax(1)
        rows = np.arange(len(prob))
        out = [part * weight[rows, top] for part in chosen]
        counts = np.zeros(weight.shape)
        counts[rows, top] = chosen_tiles
        vocab = np.array(self.chooser.vocab, dtype=float).reshape(-1, 4)
        for v in range(len(vocab)):
            idx = np.flatnonzero((weight[:, v] > 0) & (top != v))
            if not idx.size:
                continue
            sub = _rows(a, idx)
            t = np.repeat(vocab[v:v + 1], idx.size, axis=0)
            sub.update(lib_tile(t[:, 0], t[:, 1], t[:, 3], t[:, 2]))
            w = waves("gemm", sub, gpu, dtype)
            counts[idx, v] = w["tiles"]
            for o, part in zip(out, self._log_quantiles("gemm", sub, gpu, w)):
                o[idx] += weight[idx, v] * part
        options = []
        for i in rows:
            order = [top[i]] + [v for v in np.flatnonzero(weight[i] > 0) if v != top[i]]
            options.append((weight[i, order], counts[i, order]))
        return (*out, options)

    def _predict_class(self, cls: str, ops: list, gpu: GPU, split_ways=None, frame: bool = True):
        """split_ways: for GEMMs that are split-K batches (kit.predict.split_k), each one's S.
        frame False: only the {latency_ms, latency_p10_ms, latency_p90_ms} arrays, the same
        numbers, without the frame's tiles and waves (the small-op bounds read only those: framing
        their rungs had been a tenth of a warm prediction on a new GPU)."""
        if not ops:
            return pd.DataFrame(columns=COLUMNS) if frame else {c: np.zeros(0) for c in QUANTILES}
        dtypes = {getattr(op, "dtype", "fp32") for op in ops}
        if len(dtypes) > 1:  # one batch per dtype
            frames, order = [], []
            for d in sorted(dtypes):
                idx = [i for i, op in enumerate(ops) if op.dtype == d]
                frames.append(self._predict_class(cls, [ops[i] for i in idx], gpu,
                                                  None if split_ways is None else [split_ways[i] for i in idx],
                                                  frame))
                order += idx
            if not frame:
                out = {}
                for c in QUANTILES:
                    out[c] = np.empty(len(ops))
                    out[c][order] = np.concatenate([f[c] for f in frames])
                return out
            out = pd.concat(frames, ignore_index=True)
            out.index = order
            return out.sort_index()
        dtype = dtypes.pop()
        a = arrays_from_ops(cls, ops)
        names = None
        if cls == "gemm":
            if split_ways is not None:
                a["split_ways"] = np.asarray(split_ways, dtype=float)
            prob = self.chooser.probabilities(a, gpu, dtype)
            tile, names = self.chooser.tile_arrays(a, gpu, dtype, prob.argmax(1))
            a.update(tile)
        w = waves(cls, a, gpu, dtype)
        if names is None:
            names = tile_names(cls, a, dtype, gpu.vendor)
        base = w["base_ms"]
        centre, lo, hi = self._log_quantiles(cls, a, gpu, w)
        options = None
        if cls == "gemm" and self.soft_tile_margin > 0:
            centre, lo, hi, options = self._tile_mixture(a, gpu, dtype, prob, (centre, lo, hi), w["tiles"])
        lat = np.exp(centre).astype(np.float64)  # float64: the curves and bounds below write into it
        p10, p90 = np.minimum(np.maximum(np.exp(lo), base), lat), np.maximum(np.exp(hi), lat)
        if cls in ONE_WAVE_CLASSES:  # the floor first: the cap keeps a small op under a full wave
            self._dispatch_floor(gpu, w["roofline_ms"], lat, p10, p90)
            if cls in ("elementwise", "softmax"):  # before the cap, whose rungs carry their own bound:
                self._element_bound(cls, a, gpu, w["roofline_ms"], lat, p10, p90)  # after it, a bf16 gelu at 0.9 of a wave came out over the full wave
            lat, p10, p90 = self._one_wave_cap(cls, ops, gpu, w["tiles"], w["slots"], lat, p10, p90)
            if cls == "softmax":
                self._softmax_row_latency(a, gpu, dtype, lat, p10, p90)
        if cls == "gemm":
            self._tensor_core(a, gpu, dtype, w["roofline_ms"], lat, p10, p90)
        if not frame:
            return dict(zip(QUANTILES, (lat, p10, p90)))
        shown = w if cls in ("gemm", "elementwise") else waves(cls, a, gpu, dtype, launch=True)
        frame = pd.DataFrame({
            "latency_ms": lat, "roofline_ms": w["roofline_ms"], "bound": w["bound"],
            "tile": names, "tiles": shown["tiles"].astype(int), "waves": shown["waves"].astype(int),
            "utilisation": base / lat, "latency_p10_ms": p10, "latency_p90_ms": p90,
            "split_k": 1}, columns=COLUMNS)
        if options is not None:  # which tiles it mixes, for the split choice (kit.predict.split_k)
            frame["tile_options"] = options
        return frame


QUANTILES = ("latency_ms", "latency_p10_ms", "latency_p90_ms")  # _predict_class(frame=False)'s


class _Columns:
    """A prediction frame's columns as arrays, filled class by class and framed once: setting
    rows of a pandas frame per class had cost a third of a warm prediction's time."""

    FLOAT = ("latency_ms", "roofline_ms", "utilisation", "latency_p10_ms", "latency_p90_ms")
    INT = ("tiles", "waves", "split_k")

    def __init__(self, n: int):
        self.columns = {c: np.zeros(n, dtype=float if c in self.FLOAT else int if c in self.INT else object)
                        for c in COLUMNS}

    def put(self, idx: list[int], part: pd.DataFrame) -> None:
        for c, arr in self.columns.items():
            if c in self.INT:  # a count that is not finite is a bug upstream: said, never INT_MIN
                values = part[c].to_numpy(dtype=float)
                if not np.isfinite(values).all():
                    raise ValueError(f"tile predictor: a non-finite {c} in a {len(idx)}-op part")
                arr[idx] = values.astype(int)
            else:
                arr[idx] = part[c].to_numpy(dtype=arr.dtype)

    def frame(self, where: list[int]) -> pd.DataFrame:
        """The frame of the ops each distinct op stands for (where: each op's distinct index)."""
        at = np.asarray(where, dtype=int)
        return pd.DataFrame({c: arr[at] if c not in ("tile", "bound") else arr[at].astype(str)
                             for c, arr in self.columns.items()}, columns=COLUMNS)


def tile_weights(prob: np.ndarray, margin: float) -> np.ndarray:
    """(n, tiles) weights of each tile in a GEMM's prediction (TilePredictor._tile_mixture):
    max(0, p - p_max + margin), normalised per GEMM; margin 0 is the likeliest tile alone."""
    if margin <= 0:
        return np.eye(prob.shape[1])[prob.argmax(1)]
    weight = np.maximum(0.0, prob - prob.max(1, keepdims=True) + margin)
    return weight / weight.sum(1, keepdims=True)


def _rows(a: dict, idx: np.ndarray) -> dict:
    """The GEMM arrays a, rows idx only."""
    n = len(a["m"])
    return {k: (v[idx] if isinstance(v, np.ndarray) and v.shape[:1] == (n,) else v) for k, v in a.items()}


def tile_names(cls: str, a: dict, dtype: str = "fp32", vendor: str = "nvidia") -> list[str]:
    """kit.tiling's tile names of vector ops: "512" elements, or rows-per-block x cols."""
    if cls == "elementwise":
        return ["512"] * len(a["numel"])
    rpb = row_launches(cls, a["cols"], DTYPE_BYTES[dtype], vendor)[0].astype(int)
    return [f"{r}x{int(c)}" for r, c in zip(rpb, a["cols"])]
