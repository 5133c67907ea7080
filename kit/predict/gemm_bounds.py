"""Bounds on the tile-MLP's GEMMs: ways a library could run a GEMM, each a time it need not
exceed or cannot beat (TilePredictor mixes these in). The GEMV stream, Hopper's measured
tensor-core curve, as many one-row or unbatched calls (caps), the aligned twin on the curve and
the bandwidth a GEMM of its dtype ever streamed at (lifts)."""
from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pandas as pd

from kit.hardware import GPU, get_gpu
from kit.predict.gemv import kernel_ms_of as gemv_kernel_ms
from kit.predict.gemv import stream_bound_ms as gemv_stream_bound_ms
from kit.predict.roofline import roofline
from kit.predict.tensor_core import applies, curve_gemm, kernel_ms_of, params_for

FEW_ROWS = 16  # GEMMs this thin are bounded by as many calls of their one-row twin (few_rows_ms)
# The longest reduction the tile-MLP met in a GEMM with its own right-hand side per batch:
# NeuSight's bmm training rows stop at k = 1,025 (99th percentile 995; its Linear rows, a shared
# weight, reach 65,371). Past it a reduction step costs no more than at it (long_reduction_ms)
BMM_TRAINED_K = 1024
PAD_ROWS_MAX = 64  # GEMMs thinner than this are bounded by their twins with more rows (padded_rows_ms)
# GEMMs whose roofline is under this are bounded by their twin with twice the rows (doubled_rows_ms)
DOUBLE_ROOF_MS = 0.02
PAD_K_MAX = 32  # GEMMs with a shorter reduction are bounded by their twins with a longer one (padded_k)


class GemmBounds:
    """TilePredictor's GEMM rules; each needs self.predict and the dispatch floor
    (kit.workload.kernel_times.isolation_floor_ms)."""

    # re-entry flags while a bound predicts its twins; declared here so that one put back is the
    # class's value again, which kit.predict.call_memo does not key
    _twin_depth = 0
    _in_two_row_twin = False
    _raw_doubled = False  # while doubled_rows_ms predicts its chain of twins

    @contextmanager
    def as_twins(self):
        """Predictions made inside are a bound's twins: the padding cap skips them, so that an op's
        own time and its time as another's twin are one number (padded_rows_ms). The row bound
        is off there whatever its own flag, which is put back to the class's value meanwhile, so
        that the call memo keys a twin's twins alike inside and outside the row bound's chain."""
        self._twin_depth = getattr(self, "_twin_depth", 0) + 1
        raw, self._raw_doubled = self._raw_doubled, False
        try:
            yield
        finally:
            self._twin_depth -= 1
            self._raw_doubled = raw

    def _gemv(self, ops: list, gpu: GPU, rows: np.ndarray, part: pd.DataFrame) -> pd.DataFrame:
        """GEMMs with m or n of 1 (kit.predict.gemv.applies) take its stream of their bytes, plus
        this predictor's dispatch floor, so the isolated latency means what it means for every
        other op; the tile shown is the gemv kernel's (no tiles, one wave)."""
        from kit.workload.kernel_times import isolation_floor_ms

        floor = isolation_floor_ms(self, gpu)
        idx = np.flatnonzero(rows)
        t, lo, hi = gemv_kernel_ms(np.array([ops[i].bytes for i in idx]), gpu.mem_bw_gbs)
        # never under the roofline: a weight shared over many batches of one row (b = 2,048 over
        # 4096 x 4096, shared_rhs) is compute-bound, and its bytes alone had put it at a tenth of
        # its roofline on an H100 in FP32
        roof = part.loc[idx, "roofline_ms"].to_numpy(float)
        t, lo, hi = np.maximum(t, roof), np.maximum(lo, roof), np.maximum(hi, roof)
        lat = t + floor
        part.loc[idx, "latency_ms"] = lat
        part.loc[idx, "latency_p10_ms"] = np.maximum(lo + floor, part.loc[idx, "roofline_ms"].to_numpy(float))
        part.loc[idx, "latency_p90_ms"] = hi + floor
        part.loc[idx, "utilisation"] = part.loc[idx, "roofline_ms"].to_numpy(float) / lat
        part.loc[idx, ["tile", "tiles", "waves", "split_k"]] = ["gemv", 1, 1, 1]
        return part

    def _tensor_core(self, a: dict, gpu: GPU, dtype: str, roofline_ms, lat, p10, p90) -> None:
        """Aligned tensor-core GEMMs on Hopper take kit.predict.tensor_core's measured curve, not
        the utilisation learned from FP32 SIMT kernels (in place), plus this predictor's dispatch
        floor, so the isolated latency means what it means for every other op."""
        tc = applies(gpu, dtype, a["align"])
        if not tc.any():
            return
        from kit.workload.kernel_times import isolation_floor_ms

        floor = isolation_floor_ms(self, gpu)
        t, lo, hi = kernel_ms_of(np.asarray(roofline_ms, dtype=float)[tc], params_for(gpu, dtype))
        lat[tc], p10[tc], p90[tc] = t + floor, lo + floor, hi + floor

    def few_rows_ms(self, ops: list, gpu: GPU | str, split_k: bool = True) -> np.ndarray:
        """Per GEMM, r kernel times of its one-row twin where its m or n is r (2 <= r <= FEW_ROWS),
        plus one dispatch floor: the most it may take, as it could run as those back-to-back calls
        (predict caps it, cap_at); NaN for any other. Where the tile-MLP is off its data for thin
        GEMMs the gap had been a cliff once GEMVs streamed: on an MI300X (no timed AMD GEMV, no
        tensor-core curve) a bf16 GEMM of 8192 x 8192 weights took 0.067 ms at one row and 0.25
        ms at two. The floor counts once, as in few_batches_ms: r whole isolated calls had held r
        floors, and in a model (which sheds one) a Linear(256, 1024) of 2 rows took 8.6x its one
        row on an A100. split_k: as predict's, for the twin too."""
        return self._as_calls(ops, gpu, lambda op: min(op.m, op.n),
                              lambda op: replace(op, m=1) if op.m <= op.n else replace(op, n=1), split_k)

    def _as_calls(self, ops: list, gpu: GPU | str, count_of, twin_of, split_k: bool = True) -> np.ndarray:
        """Per GEMM whose count_of(op) is 2..FEW_ROWS, that many kernel times of twin_of(op) plus
        one dispatch floor (few_rows_ms, few_batches_ms); NaN for any other. split_k: whether
        the twin may split (predict(split_k=False) had still been capped by split twins)."""
        from kit.workload.kernel_times import isolation_floor_ms

        gpu = get_gpu(gpu)
        out = np.full(len(ops), np.nan)
        rows = [j for j, op in enumerate(ops) if 2 <= count_of(op) <= FEW_ROWS]
        if rows:
            floor = isolation_floor_ms(self, gpu)
            with self.as_twins():
                twin = self.predict([twin_of(ops[j]) for j in rows], gpu, split_k).latency_ms.to_numpy(dtype=float)
            count = np.array([count_of(ops[j]) for j in rows], dtype=float)
            out[rows] = count * np.maximum(twin - floor, 0.0) + floor
        return out

    def two_row_ms(self, ops: list, gpu: GPU | str, rows: np.ndarray, split_k: bool = True) -> np.ndarray:
        """Per GEMV (rows: m or n of 1, the other over 1), the isolated latency of its two-row
        twin: the most it may take, as the twin's kernel could run it with a row of padding
        (predict caps it, cap_at); NaN for any other. The GEMV rule streams at one share of the
        bandwidth, fitted on the H200's GEMVs of 1-100 MB (kit.predict.gemv); a large FP32 GEMV
        there streamed at 0.65-0.70 of it, and the rule's 0.51 had put an fp32 decode step at
        batch 1 on an L4 (phi3-mini, 256 cached) at 1.35x the same step at batch 2."""
        out = np.full(len(ops), np.nan)
        if getattr(self, "_in_two_row_twin", False):
            return out  # the twin's own one-row cap predicts its GEMV uncapped
        idx = [j for j in np.flatnonzero(rows) if max(ops[j].m, ops[j].n) > 1]
        if idx:
            twins = [replace(ops[j], m=2) if ops[j].m == 1 else replace(ops[j], n=2) for j in idx]
            self._in_two_row_twin = True
            try:
                with self.as_twins():
                    out[idx] = self.predict(twins, gpu, split_k).latency_ms.to_numpy(dtype=float)
            finally:
                self._in_two_row_twin = False
        return out

    def padded_rows_ms(self, ops: list, gpu: GPU,
                       split_k: bool = True) -> tuple[np.ndarray, pd.DataFrame | None]:
        """Per GEMM whose thin side r = min(m, n) is 1..PAD_ROWS_MAX - 1, the least isolated
        latency of its twins with r + 1 .. PAD_ROWS_MAX rows on that side: the most it may take,
        as it could run padded to that many rows (predict caps it, cap_at), so no GEMM of that
        range is faster for more rows. NaN for any other; with the twin's frame row that set
        each bound (its tile is shown where the cap binds). The tile chooser and the tile-MLP read
        the rows, and more of them had come out faster: on a T4 a Linear 8192 -> 2048 took 0.361
        ms at 2 tokens and 0.309 at 3 (a 32x32 tile split 4 ways against 128x32 split 16), and
        opt-1.3b's fp32 decode step 35.6 ms at batch 2 against 33.2 at batch 4. A reduction k
        under PAD_K_MAX is padded alike (padded_k: zeros add nothing): a T4 GEMM of 8192 x 109
        had taken 99.5 us at k = 1 and 75.1 at k = 32, falling all the way."""
        out = np.full(len(ops), np.nan)
        if getattr(self, "_twin_depth", 0):
            # a twin's own time is what the ladder compares, the other bounds' twins' too: an
            # op's own time and its time as another's twin are then the same number (the ladder
            # is monotone), at a fifth of the cost
            return out, None
        twins, owner = [], []
        for j, op in enumerate(ops):
            r = min(op.m, op.n)
            if 1 <= r < PAD_ROWS_MAX:  # a GEMV too: its two-row cap is a twin one predict down
                side = "m" if op.m <= op.n else "n"
                for w in padded_rows(r):
                    twins.append(_with_side(op, side, w))
                    owner.append(j)
            for w in padded_k(op.k):
                twins.append(_with_side(op, "k", w))
                owner.append(j)
        if not twins:
            return out, None
        with self.as_twins():
            frame = self.predict_unbounded(twins, gpu, split_k).reset_index(drop=True)
        owner = np.asarray(owner)
        lat = frame.latency_ms.to_numpy(dtype=float)
        best = np.full(len(ops), -1)
        for j in np.unique(owner):
            at = np.flatnonzero(owner == j)
            best[j] = at[np.argmin(lat[at])]
            out[j] = lat[best[j]]
        rows = frame.iloc[np.where(best >= 0, best, 0)].reset_index(drop=True)
        rows.loc[best < 0, "latency_ms"] = np.nan  # an op with no twins has no bound
        return out, rows

    def _padded_bound(self, ops: list, gpu: GPU, part: pd.DataFrame,
                      split_k: bool = True) -> pd.DataFrame:
        """cap_at padded_rows_ms, the twin's tile shown where the cap binds (split_k: as predict's).
        A GEMV keeps its name, as under its two-row cap: cuBLAS runs an m or n of 1 on its gemv
        kernels whatever a padded tile would take (an L4's fp32 1 x 8192 x 8192 came out 1.757 ms
        as its three-row twin on 128x32 split 4 ways, 1.789 ms streamed, and `kit op` showed the
        twin's tile)."""
        bound, twin = self.padded_rows_ms(ops, gpu, split_k)
        if twin is None:
            return part
        gemv = (part.tile == "gemv").to_numpy()
        if gemv.any():
            part = cap_at(part, np.where(gemv, bound, np.nan))
            twin = twin.copy()
            twin.loc[gemv, "latency_ms"] = np.nan
        return cap_as(part, twin)

    def _doubled_bound(self, ops: list, gpu: GPU, part: pd.DataFrame,
                       split_k: bool = True) -> pd.DataFrame:
        """cap_as doubled_rows_ms, the twin's tile shown where the cap binds (split_k: as
        predict's)."""
        twin = self.doubled_rows_ms(ops, gpu, split_k, part.latency_ms.to_numpy(dtype=float))
        return part if twin is None else cap_as(part, twin)

    def doubled_rows_ms(self, ops: list, gpu: GPU, split_k: bool = True,
                        own_ms: np.ndarray | None = None) -> pd.DataFrame | None:
        """Per GEMM of m > PAD_ROWS_MAX / 2 rows whose roofline is under DOUBLE_ROOF_MS, the
        frame row of its twin with 2m rows, predicted whole (so itself bounded by its 4m twin,
        and so on up to the ceiling): the most it may take, as it could run padded with m rows of
        zeros (predict caps it, cap_as); so below the ceiling no GEMM is faster for twice the
        rows. NaN latency for any other; None where no op has a twin. Past the thin-side ladder
        (padded_rows_ms) the tile-MLP had more rows come out faster: on an A100-PCIe-80GB the
        Winograd bmm of a 3x3 conv, 36 x M x 64 x 64, took 33.52 us at M = 128 and 32.67 at 256,
        and the conv 14.79, 14.56, 13.71 us at batch 1, 2, 4. A single 2m twin (its own time)
        had left t(m) > t(2m) in 12 of 120 varied GEMMs there (their 4m twins faster still);
        the chain leaves none. A model's batch doubles a Linear's or a conv's m; the chain runs on
        m only (on n and b too it would be a lattice of twins) and stops at the ceiling, where a
        GEMM's time scales with its work.
        The chain's twins (2m, 4m, ... up to the first at the ceiling) are predicted in one batch,
        each without its own row bound (_raw_doubled), and folded from the top down, each capped
        by the one above (cap_as): what predicting each twin whole, bounded by the next, gives,
        but one predict instead of one per doubling: 423 varied GEMMs on five GPUs took 53 s of
        CPU against 105 recursing (14 with no row bound).
        own_ms: each op's time before this bound (predict's part); the twins that cannot beat it
        are never predicted (_doubling_chain), which leaves every answer as it was. The twins
        themselves are the cost, each with its own padding ladder: the H200 op sweeps of
        benchmarks/h200_measured.py are one batch of 10,010 GEMMs, 8,049 under the ceiling, whose
        chains held 54,405 twins with 653,518 ladder rungs (the ops' own ladders: 129,150); of
        6,855 twins of 970 of those ops, 3,267 are left. The benchmark's CPU went 339 -> 232 s
        against 96 with no row bound (a shared machine).
        Limits (the review's sweeps over m 1..128 on six GPUs): an op on the thin-side ladder
        (m < 64 rows, m <= n) takes the ladder's top, 64 rows, as its twin, not 2m, so t(m) may
        still exceed t(2m) there (an A100-PCIe-80GB FP32 Linear 1024 -> 256: 52.12 us at 40 and
        48 rows, 51.00 at 96); and between m and a twin that is no doubling (m < m' < 2m) the
        chain can open an inversion it closes elsewhere (MI300X FP32 208 x 40: t(65) 60.80 us,
        t(85) 59.04). Pairs t(m) > t(m') for m < m' <= 2m fell 65,550 -> 49,942, 9,619 of them new."""
        if getattr(self, "_twin_depth", 0) or self._raw_doubled:
            return None  # a twin is compared at its own time, as in padded_rows_ms
        from kit.workload.kernel_times import isolation_floor_ms

        floor = isolation_floor_ms(self, gpu)
        own = np.full(len(ops), np.inf) if own_ms is None else np.asarray(own_ms, dtype=float)
        chains = [_doubling_chain(op, gpu, below, floor) for op, below in zip(ops, own)]
        if not any(chains):
            return None
        twins = [t for c in chains for t in c]
        self._raw_doubled = True
        try:
            frame = self.predict_unbounded(twins, gpu, split_k).reset_index(drop=True)
        finally:
            self._raw_doubled = False
        start = np.cumsum([0] + [len(c) for c in chains])
        depth = np.array([len(c) for c in chains])
        # the top twin of each chain, then down a rung at a time, each capped by the one above
        at = np.where(depth > 0, start[1:] - 1, 0)
        out = frame.iloc[at].reset_index(drop=True)
        for level in range(int(depth.max()) - 2, -1, -1):
            rows = np.flatnonzero(depth > level + 1)
            capped = cap_as(frame.iloc[start[rows] + level].reset_index(drop=True),
                            out.iloc[rows].reset_index(drop=True))
            for c in out.columns:  # column by column, each keeping its dtype
                values = out[c].to_numpy(copy=True)
                values[rows] = capped[c].to_numpy()
                out[c] = values
        out.loc[depth == 0, "latency_ms"] = np.nan  # an op with no twin has no bound
        return out

    def few_batches_ms(self, ops: list, gpu: GPU | str, split_k: bool = True) -> np.ndarray:
        """Per GEMM of batch b (2 <= b <= FEW_ROWS), b kernel times of its b = 1 twin plus one
        dispatch floor: the most it may take, as it could run as those back-to-back calls
        (predict caps it, cap_at); NaN for any other. Split-K is open to an unbatched GEMM only
        (cuBLAS's rule in NeuSight's data), so a batch of 2 of a small output over a long k had
        walked all of k on a couple of SMs: 24 x 8 outputs over k = 16384 on an H100 took
        0.053 ms at b = 1 and 1.07 ms at b = 2. split_k: as predict's, for the twin too."""
        return self._as_calls(ops, gpu, lambda op: op.b, lambda op: replace(op, b=1), split_k)

    def long_reduction_ms(self, ops: list, gpu: GPU | str, split_k: bool = True) -> np.ndarray:
        """Per FP32 GEMM with its own right-hand side per batch (kind bmm or mm, not a Linear's
        shared weight) whose reduction k exceeds BMM_TRAINED_K: its twin's kernel time at k =
        BMM_TRAINED_K, scaled by k / BMM_TRAINED_K, plus one dispatch floor. The most it may take
        (predict caps it, cap_at); NaN for any other. Past the longest reduction it met in such a
        GEMM, the tile-MLP extrapolates a tile's utilisation, and had it fall as k grew: NeuSight's
        V100 test rows of attention's P @ V (n = a head, k = the sequence) came out 1.5x slow,
        T4's 1.2x, P100's 1.16x. A longer reduction only amortises a tile's start and end over more
        steps, so past that edge a step costs no more than at it. The cap equals the twin at the
        edge and grows with k, so it leaves time non-decreasing in k wherever the network's own
        time was. Those rows reach k = 4,096; past that the rule is carried, unmeasured.
        FP32 only, where the evidence is: scaling the part over the floor by k also scales an
        inversion the twins already had, and in 16-bit, whose unaligned GEMMs the network
        prices through other rules, it had made an H100 fp16 bmm of 256 rows faster than one of
        12 at k = 8,192 (the twins at 1,024 were already inverted). The twins are predicted
        without the bound by the training GPUs a GPU dominates (predict applies that to the
        capped result), which halved the throughput on GEMM sets full of long batched ones. A
        GEMM thin enough for the padding ladder (min(m, n) under PAD_ROWS_MAX) is left to it: its
        twins of 64 rows take this cap, and capping every rung too had made the test suite's
        sibling-bound sweeps 3.5x slower. split_k: as predict's, for the twins too."""
        from kit.workload.kernel_times import isolation_floor_ms

        gpu = get_gpu(gpu)
        out = np.full(len(ops), np.nan)
        rows = [j for j, op in enumerate(ops)
                if getattr(op, "kind", None) in ("bmm", "mm") and not getattr(op, "shared_rhs", False)
                and op.dtype == "fp32" and op.k > BMM_TRAINED_K and min(op.m, op.n) >= PAD_ROWS_MAX
                and not curve_gemm(gpu, op)]
        if rows:
            with self.as_twins():
                twin = self.predict_unbounded([replace(ops[j], k=BMM_TRAINED_K) for j in rows], gpu,
                                              split_k).latency_ms.to_numpy(dtype=float)
            floor = isolation_floor_ms(self, gpu)
            steps = np.array([ops[j].k for j in rows], dtype=float) / BMM_TRAINED_K
            out[rows] = steps * np.maximum(twin - floor, 0.0) + floor
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
        return lift_at(part, rows, twin[rows])

    def _stream_bound(self, ops: list, gpu: GPU, part: pd.DataFrame) -> pd.DataFrame:
        """No GEMM streams its bytes faster than the largest share of the bandwidth a GEMM of its
        dtype reached on the H200 (kit.predict.gemv.STREAM_SHARE_MAX), plus this predictor's
        dispatch floor. A split-K Linear of a few rows had come out at 100% of an L4's bandwidth
        (its split batch shares the weight in the features, so the tile-MLP saw a k / S slice of
        it, and only the roofline held it): 2 x 4096 x 4096 in FP32 at 0.224 ms, half its
        one-row twin's time. The band moves up with it, p10 to the bound."""
        from kit.workload.kernel_times import isolation_floor_ms

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
        from kit.workload.kernel_times import isolation_floor_ms

        gpu = get_gpu(gpu)
        out = np.full(len(ops), np.nan)
        for j, op in enumerate(ops):
            params = params_for(gpu, op.dtype)
            if params is not None and not curve_gemm(gpu, op):
                # kit.predict.roofline's roofline: the full tensor peak, whatever the alignment
                out[j] = kernel_ms_of([roofline(op, gpu).time_ms], params)[0][0]
        return out + isolation_floor_ms(self, gpu) if np.isfinite(out).any() else out


def doubled_rows(op) -> int:
    """The rows of op's twin in doubled_rows_ms (0: none). Where m is the thin side the ladder
    runs on (m <= n, m < PAD_ROWS_MAX), the ladder's top, PAD_ROWS_MAX, predicted whole: a 2m
    twin there had bound the rungs over PAD_ROWS_MAX / 2 and not those under, and a T4 Linear
    1024 -> 256 had taken 21.4 us at 40 rows against 21.2 at 48 on the ladder's own test. Else
    2m, where 2m is past PAD_ROWS_MAX."""
    if op.m <= op.n and op.m < PAD_ROWS_MAX:
        return PAD_ROWS_MAX
    return 2 * op.m if 2 * op.m > PAD_ROWS_MAX else 0


def _doubling_chain(op, gpu: GPU, below_ms: float = np.inf, floor_ms: float = 0.0) -> list:
    """op's twins in doubled_rows_ms, from doubled_rows(op) rows up: 2m, 4m, ... (or the
    thin-side ladder's top, then twice that), ending at the first whose roofline reaches
    DOUBLE_ROOF_MS, which is bounded no further; empty where op has no twin.
    Twins that cannot bind are left out (the answer is the same, at less cost):
    - all of them where op's time rises with its rows by the model's own structure
      (rises_with_rows);
    - from the first whose stream floor (its bytes at the widest share of the bandwidth a GEMM
      of its dtype streamed at, plus floor_ms, the dispatch floor: the least any GEMM is
      predicted at, _stream_bound) reaches below_ms, op's own time: it and every twin above,
      whose bytes only grow, take at least that."""
    rows = doubled_rows(op)
    if not rows or roofline(op, gpu).time_ms >= DOUBLE_ROOF_MS or rises_with_rows(op, gpu):
        return []
    chain, twin = [], _with_side(op, "m", rows)
    while gemv_stream_bound_ms([twin], gpu.mem_bw_gbs)[0] + floor_ms < below_ms:
        chain.append(twin)
        if roofline(twin, gpu).time_ms >= DOUBLE_ROOF_MS:
            break
        twin = _with_side(op, "m", 2 * twin.m)
    return chain


def rises_with_rows(op, gpu: GPU) -> bool:
    """Whether op's time and its twins' with more rows (doubled_rows_ms) are one non-decreasing
    function of the rows by the predictor's structure, so that no twin can bind: a GEMM on a
    tensor-core curve (kit.predict.tensor_core: the curve at its roofline plus the dispatch
    floor, lifted to the stream floor, both growing with m), with no bound that reads another
    GEMM's time: n and k past the padding ladders (padded_rows_ms, whose rungs of another n or k
    may leave the curve), n over FEW_ROWS (few_rows_ms) and a batch outside few_batches_ms' 2..
    FEW_ROWS (its twin is bounded by the training GPUs a GPU dominates). No split (split-K
    leaves curve GEMMs alone), no GEMV (n > 1), no long-reduction cap (FP32 off the curve)."""
    return (op.n >= PAD_ROWS_MAX and op.k >= PAD_K_MAX and not 2 <= op.b <= FEW_ROWS
            and curve_gemm(gpu, op))


def padded_rows(r: int) -> list[int]:
    """The row counts a GEMM of r rows is compared with (padded_rows_ms): every count up to
    FEW_ROWS, then the multiples of 8 up to PAD_ROWS_MAX (the batch sizes models take; every
    count to 64 made a sweep of thin GEMMs 5x slower to predict). So r <= FEW_ROWS and the
    multiples of 8 are monotone among themselves and with every larger count of the list."""
    return [w for w in range(r + 1, PAD_ROWS_MAX + 1) if w <= FEW_ROWS or w % 8 == 0]


def padded_k(k: int) -> list[int]:
    """The reductions a GEMM of reduction k is compared with (padded_rows_ms): every longer one
    up to PAD_K_MAX, so time is non-decreasing in k over 1..PAD_K_MAX (so short a k is rare in
    models: the twins cost little)."""
    return list(range(k + 1, PAD_K_MAX + 1))


def _with_side(op, side: str, rows: int):
    """op with `rows` on one side (m or n): a copy, without re-checking what op already passed."""
    twin = copy.copy(op)
    object.__setattr__(twin, side, int(rows))
    return twin


TIE_REL = 1e-12  # cap_as: a bound this close to the latency is a tie, not a cap


def cap_as(part: pd.DataFrame, ref: pd.DataFrame) -> pd.DataFrame:
    """Each row no slower than the same row of ref (another way it could run: a padded twin, a
    GPU it outdoes), with ref's tile, tiles, waves and split where that binds (cap_at); a
    utilisation over 1 becomes the roofline's share."""
    bound = ref.latency_ms.to_numpy(dtype=float)
    # NaN: no bound. A tie within rounding keeps the row's own tile: the networks' sums can
    # differ in the last bits with the batch around an op, and an exact > had shown an A100's
    # bf16 2 x 105 x 53 GEMM as 32x32 alone and 128x32 in a batch, at the same time
    slower = part.latency_ms.to_numpy(dtype=float) > bound * (1 + TIE_REL)
    if not slower.any():
        return part
    part = cap_at(part, np.where(slower, bound, np.nan))
    for c in ("tile", "tiles", "waves", "split_k"):
        part.loc[part.index[slower], c] = ref.loc[slower, c].to_numpy()
    over = part.utilisation.to_numpy(dtype=float) > 1.0  # a share of a bound under the latency
    part.loc[part.index[over], "utilisation"] = (part.roofline_ms / part.latency_ms)[over].to_numpy()
    return part


def lift_at(part: pd.DataFrame, rows, low: np.ndarray) -> pd.DataFrame:
    """Rows `rows` of part (positions) at least `low`: latency and band scaled up together (the
    band keeps its relative width); utilisation stays a share of the same bound, so it falls as
    the latency rises. The counterpart of cap_at."""
    rows = np.asarray(rows, dtype=int)
    lift = np.maximum(1.0, np.asarray(low, dtype=float) / part.latency_ms.to_numpy(dtype=float)[rows])
    for col, f in (("latency_ms", lift), ("latency_p10_ms", lift), ("latency_p90_ms", lift),
                   ("utilisation", 1.0 / lift)):
        _scale_rows(part, col, rows, f)
    return part


def _scale_rows(part: pd.DataFrame, col: str, rows: np.ndarray, f: np.ndarray,
                divide: bool = False) -> None:
    """part[col] at positions rows times f (divide: over f), in place, the column written whole:
    a .loc write of the rows had cost more than the arithmetic (the same float64 numbers)."""
    values = part[col].to_numpy(dtype=float, copy=True)
    values[rows] = values[rows] / f if divide else values[rows] * f
    part[col] = values


def cap_at(part: pd.DataFrame, bound: np.ndarray) -> pd.DataFrame:
    """Each row's latency at most bound (NaN: no bound), its band scaled down with it, p10 never
    under the roofline nor over the latency; utilisation stays a share of the same bound."""
    rows = np.flatnonzero(np.isfinite(bound))
    if not rows.size:
        return part
    lat = part.latency_ms.to_numpy(dtype=float)[rows]
    f = np.minimum(1.0, bound[rows] / lat)
    roof = part.roofline_ms.to_numpy(dtype=float)[rows]
    p10 = part.latency_p10_ms.to_numpy(dtype=float, copy=True)
    p10[rows] = np.minimum(np.maximum(p10[rows] * f, roof), lat * f)
    _scale_rows(part, "latency_ms", rows, f)
    _scale_rows(part, "latency_p90_ms", rows, f)
    part["latency_p10_ms"] = p10
    _scale_rows(part, "utilisation", rows, f, divide=True)
    return part
