"""Bounds on the tile-MLP's small and non-GEMM ops (TilePredictor mixes these in): the dispatch
floor under a vector or row call, the element rates, the one-wave cap, fused attention on the
tensor-core curve, host copies at a link's share and the ops priced as an elementwise pass."""
from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pandas as pd

from kit.hardware import GPU
from kit.op_counts import MAX_DIM
from kit.predict.base import dedupe
from kit.predict.element_rates import element_bound_ms, softmax_bound_ms, softmax_row_ms
from kit.predict.features import feature_row_blocking
from kit.predict.roofline import roofline
from kit.predict.tensor_core import attention_curve_weight, attention_params_for, kernel_ms_of
from kit.tiling import ELEMENTWISE_ELEMS_PER_THREAD, ELEMENTWISE_THREADS

FLOOR_SHARE = 0.5  # of the dispatch floor, the least an isolated vector or row call predicts
WHOLE_WAVES_ALL = 16  # whole-wave counts an elementwise op is floored at, each; then powers of two (whole_waves)
# classes whose kernels are one block per tile of a fixed size (SmallOpBounds._one_wave_cap)
ONE_WAVE_CLASSES = ("elementwise", "softmax", "layernorm")
NORM_SHORT_COLS = 1024  # the tile-MLP's features block norm rows this short apart (_norm_column_cap)


class SmallOpBounds:
    """TilePredictor's rules for vector, row, attention and copy ops; each needs
    self.predict / self._predict_class and the dispatch floor."""

    # re-entry flags while a bound predicts its probes; declared here so that one put back is
    # the class's value again, which kit.predict.call_memo does not key
    _probing_floor = _raw_ladder = _raw_rows = _raw_waves = False

    def _wave_floor(self, ops: list, gpu: GPU, part: pd.DataFrame) -> None:
        """A host-device copy, still the wave model's, is its bytes at the achievable share of a
        PCIe link (kit.hardware.system.pcie_efficiency; all of any other host link's rate) plus
        the least isolated time of a vector kernel (_dispatch_floor's share of the floor), in
        place; its band runs from the link's full rate up as far again (in ratio).
        It had no floor (a one-byte copy came out at 16 fs), then a floor only under it, so a
        copy of 131,072 bytes took 1.4x one of 262,144, both at the link's full rate."""
        from kit.hardware.system import pcie_efficiency
        from kit.ops import Memcpy, elementwise_proxy
        from kit.workload.kernel_times import isolation_floor_ms

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
        from kit.workload.kernel_times import isolation_floor_ms

        self._probing_floor = True
        try:
            low = FLOOR_SHARE * isolation_floor_ms(self, gpu)
        finally:
            self._probing_floor = False
        t = low + np.asarray(roofline_ms, dtype=float)
        lift = np.where(lat < low, np.maximum(1.0, t / lat), 1.0)
        lat[:], p10[:], p90[:] = lat * lift, p10 * lift, p90 * lift

    def _norm_column_cap(self, ops: list, gpu: GPU, part):
        """A norm of up to NORM_SHORT_COLS columns is never slower than the same rows at one
        column more as the tile-MLP prices them: PyTorch's vectorised kernel runs a row per warp x
        4 threads at any width it takes (kit.tiling.row_launch; a layer norm of a width not a
        multiple of 4 runs two kernels instead, bound after this: _two_kernel_norm_bound), but the
        features block rows of up to 1,024 columns 4 to a 128-thread block and longer ones one to
        a block (feature_row_blocking), and the two sides had come apart: one bf16 row of 1,024
        took 41.8 us on an L4 and one of 1,025 23.6 us. Where the twin binds, the op takes its
        time and band (cap_at)."""
        from kit.predict.gemm_bounds import cap_at

        short = [j for j, op in enumerate(ops) if op.cols <= NORM_SHORT_COLS]
        if not short:
            return part
        twins = self._predict_class("layernorm", [replace(ops[j], cols=NORM_SHORT_COLS + 1) for j in short], gpu)
        bound = np.full(len(ops), np.nan)
        bound[short] = twins.latency_ms.to_numpy(dtype=float)
        return cap_at(part, bound)

    def _two_kernel_norm_bound(self, ops: list, gpu: GPU, part):
        """A layer norm whose width PyTorch cannot vectorise runs two kernels, never faster than
        kit.predict.norm_paths's time for them plus the dispatch floor; where that binds, the op's
        time and band are scaled up to it (its utilisation down with it). The bound is on the
        central time: the band keeps the tile-MLP's relative width, so its p10 may sit under the
        bound (the fit itself is 10% off on the rows it was read from)."""
        from kit.predict.gemm_bounds import lift_at
        from kit.predict.norm_paths import two_kernel_mask, two_kernel_ms
        from kit.workload.kernel_times import isolation_floor_ms

        idx = np.flatnonzero(two_kernel_mask(ops, gpu))
        if not idx.size:
            return part
        low = two_kernel_ms([ops[i].rows for i in idx], [ops[i].cols for i in idx], gpu) + isolation_floor_ms(self, gpu)
        return lift_at(part, idx, low)

    def _element_bound(self, cls: str, a: dict, gpu: GPU, roofline_ms, lat, p10, p90) -> None:
        """Elementwise kinds and softmax rows whose elements set their speed
        (kit.predict.element_rates) are no faster than that (in place). A prediction over the
        dispatch floor becomes at least the bound plus the floor (in the stream, where the floor is
        shed, the bound holds). One under the floor carries no floor's worth of work, but at least
        its roofline's: it grows by what the bound exceeds that by, unless the bound exceeds its
        roofline plus a kernel's start (kit.workload.kernel_times), the least the stream gives a
        kernel: then it too becomes the bound plus the floor, so the stream keeps the bound. The
        band moves with it: p90 by the same factor; a lifted op's p10 by the floor's rule on its
        own value, and to at least the bound (the fastest rate measured) plus the floor p10
        carries, never over the latency.
        Before, an op under the floor had the whole bound added and its p10 set to the latency,
        even where its bytes bind first: an L4 fp32 softmax of 1,024 x 300 went 33.0 -> 34.0 us
        against a bound of 1 us and a roofline of 8."""
        if cls == "softmax":
            bound = softmax_bound_ms(a["rows"], a["cols"], gpu)
        else:
            bound = element_bound_ms(a["kind"], a["numel"], gpu)
        if not (bound > 0).any():
            return
        from kit.workload.kernel_times import isolation_floor_ms, stream_least_ms

        floor, roof = isolation_floor_ms(self, gpu), np.asarray(roofline_ms, dtype=float)
        # where the bound is more than the stream's least (roofline + a kernel's start), an op
        # under the floor is lifted to the bound plus the floor too, so the stream keeps the bound:
        # adding only the bound past the bytes had left an H200 bf16 pow of 2M elements at 4.6 us
        # in the stream against its bound of 6.2 (an A100's at 8.2 against 10.6)
        binds = bound > stream_least_ms(roof)

        def lifted(t, stream=True):  # over the floor: the bound plus the floor; under it: the
            # bound past the bytes (or, where it binds in the stream, the bound plus the floor)
            over = (t >= floor) | (binds if stream else False)
            return np.where(over, np.maximum(t, floor + bound), t + np.maximum(0.0, bound - roof))

        new = lifted(lat)
        lift = new / lat
        # a lifted op's p10: the bound (the fastest rate measured) plus the floor that p10 carries
        # (an op lifted for the stream keeps its p10 under the floor's rule, so its band does not
        # close to a point)
        p10[:] = np.where(lift > 1, np.minimum(new, np.maximum(lifted(p10, stream=False),
                                                               bound + np.minimum(p10, floor))), p10)
        lat[:], p90[:] = new, p90 * lift

    def _softmax_row_latency(self, a: dict, gpu: GPU, dtype: str, lat, p10, p90) -> None:
        """A softmax is no faster than one row's latency in PyTorch's warp kernel
        (kit.predict.element_rates.softmax_row_ms), which sets its time when its rows are few: in
        isolation that plus the dispatch floor, so that the stream, which sheds the floor, keeps
        the row's latency (in place; after the one-wave cap, whose rungs, predicted under the
        floor, would undo it). Every softmax, however many rows: lifting only those whose latency
        exceeds their roofline plus a kernel's start had dropped an op back to the network's
        isolated time as its rows grew past that (an H200 bf16 softmax of 300 columns 14.5 ->
        11.7 us from 2,692 to 2,983 rows; in the stream, through the sibling bound, an
        A100-80GB's 3.81 -> 3.43 us). p90 moves by the same factor; p10 stays where the network
        put it (the line is a least-squares fit, not an envelope: some rows ran up to 15% under
        it), so a lifted op's band widens below.

        On an AMD GPU the same holds for the block kernel of a row past the warp kernel, whose
        latency sets its time however many rows it has (kit.predict.cdna_softmax.block_softmax_ms:
        rounds of resident blocks times one row's latency). That line transfers between CDNA
        generations within 2% (MAPE), so where it sets the time its own band does too
        (kit.predict.cdna_softmax.band_log: the held-out residuals, wider where carried), not
        the network's, which had kept 0.75-1.35x around a line good to 4%."""
        from kit.op_counts import dtype_bytes
        from kit.predict.cdna_softmax import band_log, block_softmax_ms
        from kit.workload.kernel_times import isolation_floor_ms

        eb = dtype_bytes(dtype)
        row = softmax_row_ms(a["cols"], gpu, dtype)
        block = block_softmax_ms(a["rows"], a["cols"], gpu, eb)
        if not ((row > 0) | (block > 0)).any():
            return
        floor = isolation_floor_ms(self, gpu)
        bound = np.maximum(row, block)
        # only an op with a row latency (a warp row on NVIDIA, a block row on AMD) is lifted: one
        # with neither (a row past the warp kernel on NVIDIA, a warp row on AMD) had been lifted
        # to the bare floor whenever a bound op shared its batch, so its time hung on its company
        # (an MI210 fp32 softmax of 211,545 x 1: 26.0 us alone, 28.0 beside one of 1 x 1,025)
        new = np.where(bound > 0, np.maximum(lat, floor + bound), lat)
        lift = new / lat
        binds = (block > 0) & (lift > 1)
        lo, hi = band_log(a["cols"], gpu, eb)
        # each end the higher of the line's and the network's, p10 wherever the block kernel
        # runs (the line's low end is a floor on it too), so that neither end drops where the
        # line starts or stops setting the time (p10 had fallen 10% there on an MI100 in bf16)
        on_block = block > 0
        p10[:] = np.where(on_block, np.minimum(new, np.maximum(p10, floor + block * np.exp(lo))), p10)
        p90[:] = np.where(binds, np.maximum.reduce([new, p90, floor + block * np.exp(hi)]), p90 * lift)
        lat[:] = new

    def _fused_attention(self, ops: list, gpu: GPU, part: pd.DataFrame) -> None:
        """Fused attention takes kit.predict.tensor_core's curve (in place): measured on Hopper
        in 16-bit, carried over with a wider band elsewhere, plus this predictor's dispatch
        floor. Before, attention off Hopper ran at its bare roofline, 100% of the peak.

        Under 128 queries (ATTENTION_MIN_SEQ_Q: the fitted shapes had 128 to 8,192) an attention
        takes the log-linear blend of its roofline and the curve, by w = log2(queries) / 7, plus
        the floor: one query (a decode step) keeps the roofline in the stream (plus one kernel's
        start, as every kernel there), which the H200's decode steps bear out (the curve there
        made their kernel time 8.6 -> 14.4% off; their attention kernels ran 5-12 us over the
        roofline). The
        weight follows the queries alone, so the time grows with queries and with keys: it had
        jumped 1.8x from 127 queries to 128 over a longer cache (A100, 4,096 keys: 0.27 -> 0.48
        ms), and dropped 45% from 16 keys to 17 at 16 queries, where only a longer cache made an
        attention decode-like. The band is the curve's, relative to that centre, its p10 never
        under the roofline."""
        from kit.ops import Attention

        rows = [i for i, op in enumerate(ops) if isinstance(op, Attention)]
        if not rows:
            return
        from kit.workload.kernel_times import isolation_floor_ms

        floor = isolation_floor_ms(self, gpu)
        for dtype in sorted({ops[i].dtype for i in rows}):
            idx = [i for i in rows if ops[i].dtype == dtype]
            roof = part.loc[idx, "roofline_ms"].to_numpy(dtype=float)
            params, small = attention_params_for(gpu, dtype), [ops[i].head_dim < 128 for i in idx]
            factor = params.get("causal_factor", 1.0)
            t, lo, hi = kernel_ms_of(roof, params, None, small, _causal_scales([ops[i] for i in idx], factor, gpu))
            # a causal mask only removes work: the curve's causal factor (fitted on square
            # shapes, where the mask keeps half the pairs) never makes a masked attention slower
            # than the same one unmasked, as it did where the mask keeps nearly every pair
            # (queries far fewer than keys) or the kernel is memory-bound; unmasked over the keys it
            # reads (Attention.unmasked: a top-left mask hides the keys past the last query)
            masked = [j for j, i in enumerate(idx) if ops[i].causal]
            if masked:
                full = np.array([roofline(ops[idx[j]].unmasked(), gpu).time_ms for j in masked])
                cap = kernel_ms_of(full, params, None, [small[j] for j in masked])
                for arr, bound in zip((t, lo, hi), cap):
                    arr[masked] = np.minimum(arr[masked], bound)
            # a head under 128 is never slower than the same attention at 128 (the kernels pad
            # it there): the small-head factor alone had made a head of 127 1.21x slower than 128
            narrow = [j for j in range(len(idx)) if small[j]]
            if narrow:
                twins = [replace(ops[idx[j]], head_dim=128) for j in narrow]
                padded = np.array([roofline(o, gpu).time_ms for o in twins])
                cap = kernel_ms_of(padded, params, None, None, _causal_scales(twins, factor, gpu))
                # the padded twin's own time, its causal one capped by its unmasked one as above
                unmasked = kernel_ms_of(np.array([roofline(o.unmasked(), gpu).time_ms
                                                  for o in twins]), params, None, None)
                causal = np.array([o.causal for o in twins])
                for arr, bound, free in zip((t, lo, hi), cap, unmasked):
                    arr[narrow] = np.minimum(arr[narrow], np.where(causal, np.minimum(bound, free), bound))
            # the share of the way from the roofline to the curve: 1 from 128 queries on
            w = attention_curve_weight([ops[i].seq_q for i in idx])
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
        NeuSight measured 0.047 ms for every layer norm up to ~1e5 elements on that GPU.
        An elementwise op past k full waves is floored at exactly k of them first
        (_past_one_wave_floor).

        A row op (softmax, norms) also meets the powers of two of tiles, as caps and as a floor
        (_row_wave_cap)."""
        lat, p10, p90 = _past_one_wave_floor(self, cls, ops, gpu, tiles, slots, lat, p10, p90)
        small = np.flatnonzero(tiles < slots)
        if not small.size:
            return lat, p10, p90
        if cls != "elementwise":
            return self._row_wave_cap(cls, ops, gpu, tiles, slots, small, lat, p10, p90)
        if getattr(self, "_raw_ladder", False):  # a rung of an op's ladder: its own ladder is the
            return lat, p10, p90  # rest of that one, whose rungs all count there
        ladders = [wave_ladder(cls, ops[i], int(tiles[i]), int(slots[i])) for i in small]
        # small ops of one kind and row length share rungs: predict each rung once, uncapped.
        # A rung's own ladder is the rest of the op's (every rung is a power of two of tiles, or
        # the full wave), and its cap by it is the least of those rungs, quantile by quantile,
        # so the least over the op's whole ladder of the rungs' uncapped answers is the least of
        # their capped ones (p10 and p90 then clipped to the latency, as each rung's were): one
        # batch, where capping each rung by its own ladder had predicted them log2(wave) deep
        pred = _raw_predictions(self, "_raw_ladder", cls, [op for ladder in ladders for op in ladder], gpu)
        owner = np.repeat(np.arange(small.size), [len(ladder) for ladder in ladders])
        caps = []
        for col in ("latency_ms", "latency_p10_ms", "latency_p90_ms"):
            cap = np.full(small.size, np.inf)
            np.minimum.at(cap, owner, pred[col])
            caps.append(cap)
        # an op at its own rung (whole tiles, a power of two of them) keeps its own answer among
        # the rungs; any other takes the rungs' alone, so the time is the same function of the
        # rung, the lowest from it up, and never falls as the op grows
        own = np.array([wave_rung(cls, ops[i], int(tiles[i]), int(slots[i])) == ops[i] for i in small])
        lat, p10, p90 = lat.copy(), p10.copy(), p90.copy()
        lat[small] = np.where(own, np.minimum(lat[small], caps[0]), caps[0])
        p10[small] = np.minimum(np.where(own, np.minimum(p10[small], caps[1]), caps[1]), lat[small])
        p90[small] = np.maximum(np.where(own, np.minimum(p90[small], caps[2]), caps[2]), lat[small])
        return lat, p10, p90

    def _row_wave_cap(self, cls, ops, gpu, tiles, slots, small, lat, p10, p90):
        """_one_wave_cap for row ops (softmax, norms), quantile by quantile: each op under one
        wave keeps its own answer where that is the lowest, capped at its rung sizes
        (row_rungs: the doubling ladder from its own tiles, its rows in whole tiles at the power
        of two at or above its tiles, the powers of two above, one full wave), and floored at
        what an op of the power of two of tiles at or under its own gets, the lowest of that
        size and the powers of two above it (floor_rungs). Every rung is the network's own
        answer (no cap of its own): one batch, no nesting. So the time never falls as the rows
        cross a power of two of tiles: the ladder from its own tiles alone had let a P100 layer
        norm of 17 rows of 128 come out 15% under one of 13; over 196 series of 1 to 300,000
        rows (7 GPUs, 2 dtypes, 7 widths) those dropping by more than 10% somewhere went 22 -> 0,
        by more than 3% 85 -> 24 (a dip inside a power-of-two interval, or past the wave,
        remains). Taking the rungs' answer alone, as elementwise ops do, had made NeuSight's
        MI100 layer norms 12.2 -> 14.5% and softmax 25.0 -> 27.7%; this moved no NeuSight figure."""
        if getattr(self, "_raw_rows", False):
            return lat, p10, p90
        ups = [row_rungs(cls, ops[i], int(tiles[i]), int(slots[i])) for i in small]
        downs = [floor_rungs(cls, ops[i], int(tiles[i]), int(slots[i])) for i in small]
        pred = _raw_predictions(self, "_raw_rows", cls, [op for group in (*ups, *downs) for op in group], gpu)
        n_up = sum(len(u) for u in ups)
        up_owner = np.repeat(np.arange(small.size), [len(u) for u in ups])
        down_owner = np.repeat(np.arange(small.size), [len(d) for d in downs])
        lat, p10, p90 = lat.copy(), p10.copy(), p90.copy()
        for arr, col in ((lat, "latency_ms"), (p10, "latency_p10_ms"), (p90, "latency_p90_ms")):
            values = pred[col]
            cap = np.full(small.size, np.inf)
            np.minimum.at(cap, up_owner, values[:n_up])
            floor = np.full(small.size, np.inf)
            np.minimum.at(floor, down_owner, values[n_up:])
            arr[small] = np.maximum(np.minimum(arr[small], cap), floor)
        p10[small] = np.minimum(p10[small], lat[small])
        p90[small] = np.maximum(p90[small], lat[small])
        return lat, p10, p90


def _causal_scales(attentions: list, factor: float, gpu) -> list:
    """Each fused attention's time multiplier under the curve's causal factor: a causal op
    takes the factor, as fitted; a sliding window's band its kit.ops.Attention.causal_scale
    (the factor on its causal triangle, its other rows' partly masked tiles), which is tensor
    work: it scales the roofline's FLOP time, so a band too narrow to be compute-bound stays at
    its bytes (a 64-key window's 1.5 key tiles of 128 a 64-query tile are 3x its pairs, not 3x
    its memory time), and a compute-bound one takes it whole."""
    scale = []
    for op in attentions:
        m = op.causal_scale(factor)
        if op.causal and 0 < op.window < op.seq_q:
            r = roofline(op, gpu)
            m = max(r.memory_ms, r.compute_ms * m) / r.time_ms
        scale.append(m)
    return scale


def _raw_predictions(model, flag: str, cls: str, ops: list, gpu) -> dict:
    """model._predict_class's {latency_ms, latency_p10_ms, latency_p90_ms} arrays of ops (each
    distinct op predicted once), with model.<flag> set, so the bound that asks for them skips
    itself on them (their own would recurse)."""
    unique, where = dedupe(ops)
    setattr(model, flag, True)
    try:
        arrays = model._predict_class(cls, unique, gpu, frame=False)
    finally:
        setattr(model, flag, False)
    at = np.asarray(where, dtype=int)
    return {c: np.asarray(v, dtype=float)[at] for c, v in arrays.items()}


def whole_waves(done: int) -> list[int]:
    """The whole-wave counts an op past `done` full waves is floored at: 1 to WHOLE_WAVES_ALL
    each, then the powers of two up to `done`, and `done` itself."""
    out = list(range(1, min(done, WHOLE_WAVES_ALL) + 1))
    w = 2 * WHOLE_WAVES_ALL
    while w <= done:
        out.append(w)
        w *= 2
    return out if out[-1] == done else out + [done]


def _past_one_wave_floor(model, cls, ops, gpu, tiles, slots, lat, p10, p90):
    """An elementwise op of more than one wave is never faster than the same op over exactly k
    full waves (one_wave_twin) for any k under its own (whole_waves: each k to WHOLE_WAVES_ALL,
    then powers of two), which do less of its work, nor slower than its last wave filled:
    quantile by quantile, capped at that and then at least the slowest of the others, each as
    the network gives it (their own floors would recurse). The networks' wave
    features had made the first sizes past a wave faster than a full one (a copy of 683,261
    elements 2.2% under the full wave on a V100, gelu 4.7%), and an op of exactly two waves
    faster than one (a relu on a P100 3.3%). Inside a partial last wave a dip under 0.02%
    remains."""
    if cls != "elementwise" or getattr(model, "_raw_waves", False):
        return lat, p10, p90
    done = (np.asarray(tiles) - 1) // np.asarray(slots)  # whole waves before its last
    past = np.flatnonzero(done >= 1)
    if not len(past):
        return lat, p10, p90
    ladders = [[one_wave_twin(cls, ops[i], int(w * slots[i])) for w in whole_waves(int(done[i]))] for i in past]
    # and its last wave filled: exactly done + 1 waves, which it is never slower than (a partial
    # last wave had come out slower than a full one on an H200, 2.5% at 17 waves)
    fills = [one_wave_twin(cls, ops[i], int((done[i] + 1) * slots[i])) for i in past]
    pred = _raw_predictions(model, "_raw_waves", cls, [t for ladder in ladders for t in ladder] + fills, gpu)
    n_ladder = sum(len(ladder) for ladder in ladders)
    owner = np.repeat(np.arange(len(past)), [len(ladder) for ladder in ladders])
    lat, p10, p90 = lat.copy(), p10.copy(), p90.copy()
    for arr, col in ((lat, "latency_ms"), (p10, "latency_p10_ms"), (p90, "latency_p90_ms")):
        values = pred[col]
        floor = np.full(len(past), -np.inf)
        np.maximum.at(floor, owner, values[:n_ladder])
        arr[past] = np.maximum(np.minimum(arr[past], values[n_ladder:]), floor)
    p10[past], p90[past] = np.minimum(p10[past], lat[past]), np.maximum(p90[past], lat[past])
    return lat, p10, p90


def wave_rung(cls: str, op, tiles: int, slots: int):
    """Elementwise: the op grown to its rung, whole tiles, the power of two of them at or above
    its own (at most one full wave); every block of a one-wave kernel runs at once, so it is no
    slower. Row ops (softmax, norms): the op itself."""
    if cls != "elementwise":
        return op
    return one_wave_twin(cls, op, _rung_tiles(cls, tiles, slots))


def _rung_tiles(cls: str, tiles: int, slots: int) -> int:
    """The tiles of an op's rung: elementwise, the power of two at or above its own (at most one
    full wave); row ops, its own."""
    if cls != "elementwise":
        return int(tiles)
    return min(1 << max(int(tiles) - 1, 0).bit_length(), int(slots))


def wave_ladder(cls: str, op, tiles: int, slots: int) -> list:
    """Its rung (wave_rung; not the op itself), then 2x, 4x, ... that while under one wave, then
    exactly one full wave (one_wave_twin): sizes the op cannot be slower than. An elementwise
    op's rungs are the same for every op between two powers of two of tiles, so the lowest of
    them never falls as the op grows (a copy of 533 elements had come out 13.6% under one of 512
    on a V100: its own ladder, from 2 tiles, was not 512's, from 1). A row op's ladder starts
    from its own tiles; row_rungs adds the powers of two to it."""
    first = wave_rung(cls, op, tiles, slots)
    ladder = [] if first == op else [first]
    rung = 2 * _rung_tiles(cls, tiles, slots)
    while rung < slots:
        ladder.append(one_wave_twin(cls, op, rung))
        rung *= 2
    return ladder + [one_wave_twin(cls, op, slots)]


def row_rungs(cls: str, op, tiles: int, slots: int) -> list:
    """The sizes a row op under one wave is capped at (SmallOpBounds._row_wave_cap): its
    doubling ladder (wave_ladder), its rows in whole tiles at the power of two of tiles at or
    above its own, and the powers of two above; not the op itself."""
    ladder = wave_ladder(cls, op, tiles, slots)
    rung = 1 << max(int(tiles) - 1, 0).bit_length()
    while rung < slots:
        twin = one_wave_twin(cls, op, rung)
        if twin != op and twin not in ladder:
            ladder.append(twin)
        rung *= 2
    return ladder


def floor_rungs(cls: str, op, tiles: int, slots: int) -> list:
    """The sizes whose lowest answer a row op under one wave is floored at: the power of two of
    tiles at or under its own, each power of two above it under one wave, and one full wave."""
    rung = 1 << (int(tiles).bit_length() - 1)
    out = []
    while rung < slots:
        out.append(one_wave_twin(cls, op, rung))
        rung *= 2
    return out + [one_wave_twin(cls, op, slots)]


def one_wave_twin(cls: str, op, slots: int):
    """The same op (kind, dtype, row length) grown to exactly `slots` tiles: one full wave.
    Elementwise tiles are ELEMENTWISE_THREADS x ELEMENTWISE_ELEMS_PER_THREAD elements; row ops
    are blocked as the features are (feature_row_blocking)."""
    if cls == "elementwise":
        return _grown(op, "numel", int(slots * ELEMENTWISE_THREADS * ELEMENTWISE_ELEMS_PER_THREAD))
    rows_per_tile = feature_row_blocking(np.array([float(op.cols)]))[0][0]
    return _grown(op, "rows", int(slots * rows_per_tile))


def _grown(op, field: str, size: int):
    """op with field = size: a copy of an op already checked, its new size a whole number in the
    checked range (dataclasses.replace re-checked every field: 9.3 us a rung against 4.6, and one
    predict of 259 varied ops on an A100 built 59,338 rungs); replace (and its error) for any other."""
    if not (isinstance(size, int) and 1 <= size <= MAX_DIM):
        return replace(op, **{field: size})
    twin = copy.copy(op)
    object.__setattr__(twin, field, size)
    return twin
