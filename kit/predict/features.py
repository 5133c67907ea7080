"""What the learned predictors see: one tile and the GPU, as numbers that mean the same on any GPU.

The tile-MLP never sees a GPU's name. It sees ratios that carry over to hardware it has not
met: a tile's FLOPs against one SM's share of the peak (how long the tile computes, in µs), its
bytes against one SM's share of the bandwidth, its intensity against the ridge point, how many
waves the GPU needs, how full the last wave is, the GPU's memory, L2 and power per SM, and the
share of its peak its TDP can feed (power_share).

    base_ms = max((waves − 1) · full_wave_ms + last_wave_ms, roofline_ms)
              (softmax and norms: also the DRAM time of their compulsory bytes plus the
               re-reads that spill the caches, kit.predict.row_reread)
    full_wave_ms = ceil(tiles in the wave / SMs) · tile FLOPs / (peak / SMs)
    latency = base_ms / utilisation,  utilisation in (0, 1]

so whatever the network outputs, the latency is never below the roofline.

Everything here is vectorised over a batch of one op class on one GPU (a dict of numpy arrays,
from kit.ops objects with `arrays_from_ops` or from a measurement table with
`arrays_from_frame`): training sees a quarter of a million rows. The tile, block and wave
arithmetic is kit.tiling's (the same occupancy function, the same tile and block rules) in
array form; tests check the two agree.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kit.errors import KitError
from kit.hardware import GPU, get_gpu
from kit.ops import (DTYPE_BYTES, ELEMENTWISE_FLOPS, MAX_ALIGN_ELEMS, Elementwise, Gemm, LayerNorm,
                     RMSNorm, Softmax, lead_alignment)
from kit.predict.row_reread import reread_bytes
from kit.tiling import (BASE_REGS_PER_THREAD, ELEMENTWISE_ELEMS_PER_THREAD, ELEMENTWISE_THREADS,
                        ROW_REGS_PER_THREAD, ROW_SMEM_BYTES, occupancy, row_launch)

# the four op classes the tile-MLP models (RMSNorm rides on the layer-norm model)
CLASSES = ("gemm", "elementwise", "softmax", "layernorm")
ELEM_KINDS = ("add", "mul", "div", "pow", "relu", "gelu", "tanh")
ROW_FLOPS = {"softmax": Softmax.flops_per_elem, "layernorm": LayerNorm.flops_per_elem}
ROW_EXTRA = {"softmax": Softmax.extra_bytes_per_col, "layernorm": LayerNorm.extra_bytes_per_col}
STAGES = 2  # kit.tiling.TileShape's default pipeline depth

GPU_FEATURES = [
    "log_sm_gflops",       # per-SM fp32 peak, GFLOP/s
    "log_sm_bw_gbs",       # per-SM share of DRAM bandwidth, GB/s
    "log_ridge",           # peak / bandwidth, FLOP/byte
    "log_l2_mib_per_sm",
    "log_smem_kib_per_sm",
    "log_sm_count",
    "log_power_share",     # the share of the peak its TDP sustains (power_share; 0 = none lost)
    "log_w_per_sm",
    "log_clock_ghz",
    "lanes_per_sm_64",     # fp32 lanes per SM / 64
    "log_threads_per_sm",
]


# The most FP32 TFLOP/s per watt of TDP a training GPU sustains on large GEMMs: the
# A100-PCIe-40GB's, 16.0 TFLOP/s (the 90th percentile of its NeuSight train-collect GEMMs of 10
# GFLOP or more) at 250 W. The others sustain less per watt (T4 and V100 0.049, P4 0.041, P100
# 0.028). benchmarks/sustained_power.py derives it from the five training GPUs' rows alone; the
# held-out GPUs' rows never enter it.
SUSTAINED_TFLOPS_PER_W = 0.064


def power_share(gpu: GPU | str) -> float:
    """The share of its FP32 vector peak a GPU's TDP can sustain at SUSTAINED_TFLOPS_PER_W, at
    most 1 (GEMMs on AMD's matrix cores too: gpu_vector): 0.82 for the A100-PCIe-40GB (250 W for 19.5 TFLOP/s),
    0.98 for the A100-PCIe-80GB (300 W), 0.55 for the T4, 1 for the V100 and P100. A GEMM that
    would run a power-capped card at its peak draws more than its TDP, so the card lowers its
    clock: the tile-MLP sees that share, not TDP over peak, which told two cards with watts to
    spare apart (the V100's 17.9 W per TFLOP/s and the P100's 26.9) as if it mattered, and left
    the A100-PCIe-80GB about as fast as the 40GB (it runs 0.90x its time; predicted 0.97x)."""
    g = get_gpu(gpu)
    return min(1.0, SUSTAINED_TFLOPS_PER_W * g.tdp_w / g.fp32_tflops)


def op_class_of(op) -> str:
    """The tile-MLP class of an op ("gemm", "elementwise", "softmax", "layernorm")."""
    if isinstance(op, Gemm):
        return "gemm"
    if isinstance(op, Elementwise):
        return "elementwise"
    if isinstance(op, Softmax):
        return "softmax"
    if isinstance(op, (LayerNorm, RMSNorm)):
        return "layernorm"
    return getattr(op, "op_class", type(op).__name__)


def gpu_vector(gpu: GPU | str, gemm: bool = False) -> np.ndarray:
    """GPU_FEATURES for one GPU at its fp32 peak (the measured data is all FP32): for GEMMs the
    peak of the unit sgemm runs on (GPU.gemm_peak_tflops: AMD CDNA's FP32 matrix cores; NVIDIA's
    SIMT lanes, the same as the vector peak), for every other op the vector peak."""
    g = get_gpu(gpu)
    peak = g.gemm_peak_tflops("fp32") if gemm else g.fp32_tflops
    # the power share is the vector peak's on every op: the frontier was read on SIMT FMAs, and
    # a matrix core's FLOP costs less energy by an amount no training GPU shows (against AMD's
    # FP32 matrix peak, 0.42 of it, MI100 and MI210 Linear scored 38% and 33%, not 15%)
    return np.array([
        math.log(peak * 1e3 / g.sm_count), math.log(g.mem_bw_gbs / g.sm_count),
        math.log(peak * 1e3 / g.mem_bw_gbs), math.log(g.l2_cache_mib / g.sm_count),
        math.log(g.smem_per_sm_kib), math.log(g.sm_count), math.log(power_share(g)),
        math.log(g.tdp_w / g.sm_count), math.log(g.boost_clock_mhz / 1e3),
        g.fp32_lanes_per_sm / 64, math.log(g.max_threads_per_sm),
    ])


def gpu_distance(gpu: GPU | str, others) -> float:
    """How far a GPU lies from the nearest of `others`: the largest gap in any GPU_FEATURES
    column (natural-log units: 0.22 = the A100 80GB's 24% more bandwidth than the 40GB's),
    minimised over `others`. 0 for a GPU in `others`; inf when `others` is empty."""
    v = gpu_vector(gpu)
    gaps = [float(np.abs(v - gpu_vector(o)).max()) for o in others]
    return min(gaps) if gaps else math.inf


# -- batches: dicts of arrays ----------------------------------------------------------------
def arrays_from_ops(op_class: str, ops: list) -> dict:
    """The dims of a list of kit ops of one class (one dtype) as arrays."""
    f = lambda attr: np.array([getattr(o, attr) for o in ops], dtype=float)  # noqa: E731
    if op_class == "gemm":
        return {"m": f("m"), "n": f("n"), "k": f("k"), "b": f("b"),
                "linear": np.array([float(o.shared_rhs) for o in ops]),
                "align": np.array([float(getattr(o, "lead_align", MAX_ALIGN_ELEMS)) for o in ops])}
    if op_class == "elementwise":
        return {"numel": f("numel"), "inputs": np.array([float(o.n_inputs) for o in ops]),
                "kind": np.array([o.kind for o in ops], dtype=object)}
    if op_class in ("softmax", "layernorm"):
        return {"rows": f("rows"), "cols": f("cols")}
    raise KitError(f"no features for op class {op_class!r}; modelled: {', '.join(CLASSES)}")


def arrays_from_frame(op_class: str, frame: pd.DataFrame) -> dict:
    """The same arrays from a measurement table's rows of one class (kit.data.schema)."""
    num = lambda c: frame[c].to_numpy(dtype=float, na_value=np.nan)  # noqa: E731
    if op_class == "gemm":
        a = {"m": num("m"), "n": num("n"), "k": num("k"), "b": num("b"),
             "linear": (frame.op.to_numpy(dtype=object) == "linear").astype(float)}
    elif op_class == "elementwise":
        kind = frame.elem_kind.to_numpy(dtype=object)
        unknown = sorted(set(kind) - set(ELEMENTWISE_FLOPS), key=str)
        if unknown:
            raise KitError(f"unknown elementwise kind(s) {unknown}")
        binary = np.isin(kind, ["add", "sub", "mul", "div", "pow", "max", "min"])
        scalar = frame.scalar.fillna(False).to_numpy(dtype=bool)
        a = {"numel": num("rows") * num("cols"), "kind": kind,
             "inputs": np.where(binary & ~scalar, 2.0, 1.0)}
    elif op_class in ("softmax", "layernorm"):
        a = {"rows": num("rows"), "cols": num("cols")}
    else:
        raise KitError(f"no features for op class {op_class!r}; modelled: {', '.join(CLASSES)}")
    for name, v in a.items():
        if v.dtype == float and (np.isnan(v).any() or (v < (0 if name == "linear" else 1)).any()):
            raise KitError(f"{op_class} rows need positive {name}; some are missing or < 1")
    if op_class == "gemm":  # lead_alignment(n, k): the lowest set bit of gcd(n, k), at most 8
        g = np.gcd(a["n"].astype(np.int64), a["k"].astype(np.int64))
        a["align"] = np.minimum(g & -g, MAX_ALIGN_ELEMS).astype(float)
    return a


def work(op_class: str, a: dict, dtype: str = "fp32") -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, bytes) per op, as kit.ops counts them."""
    d = DTYPE_BYTES[dtype]
    if op_class == "gemm":
        m, n, k, b = a["m"], a["n"], a["k"], a["b"]
        rhs = k * n * np.where(a["linear"] > 0, 1.0, b)
        return 2.0 * b * m * n * k, d * (b * m * k + rhs + b * m * n)
    if op_class == "elementwise":
        per = np.array([ELEMENTWISE_FLOPS[kd] for kd in a["kind"]], dtype=float)
        return per * a["numel"], d * a["numel"] * (a["inputs"] + 1)
    numel = a["rows"] * a["cols"]
    return ROW_FLOPS[op_class] * numel, d * (2 * numel + ROW_EXTRA[op_class] * a["cols"])


def _occupancy(gpu: GPU, threads: np.ndarray, regs: np.ndarray, smem: np.ndarray) -> np.ndarray:
    """kit.tiling.occupancy for each (threads, regs, smem), computed once per distinct triple."""
    keys = np.column_stack([threads, regs, smem]).astype(np.int64)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    bps = np.array([occupancy(gpu, int(t), int(r), int(s)).blocks_per_sm for t, r, s in uniq])
    return bps[inv.reshape(-1)].astype(float)


def row_launches(op_class: str, cols: np.ndarray, elem_bytes: int = 4,
                 vendor: str = "nvidia") -> tuple[np.ndarray, np.ndarray]:
    """kit.tiling.row_launch for each row length: (rows per block, threads per block) arrays."""
    uniq, inv = np.unique(np.asarray(cols, dtype=float), return_inverse=True)
    launch = np.array([row_launch(op_class, int(c), elem_bytes, vendor) for c in uniq], dtype=float)
    launch = launch.reshape(-1, 2)[inv.reshape(-1)]
    return launch[:, 0], launch[:, 1]


def feature_row_blocking(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The row blocking the tile-MLP's softmax and layer-norm features are computed on: 4 rows
    per 128-thread block up to 1024 columns, else one row per block of 32 threads per 128
    columns (at most 1024).

    This is not PyTorch's launch (kit.tiling.row_launch: layer norm is always one row per
    warp x 4 threads; long-row softmax 256 or 512 threads). The shipped weights were fitted on this
    blocking. Refitting the two classes on the true launch, everything else as shipped, scored
    worse where it can be judged without the held-out GPUs: leave-one-training-GPU-out layer
    norm 14.6% -> 16.3% mean over the five one-member folds (softmax 21.4% -> 21.1%). So the
    features keep it, and the predictor reports the true launch's tiles and waves
    (waves(launch=True))."""
    short = cols <= 1024
    return (np.where(short, 4.0, 1.0),
            np.where(short, 128.0, np.minimum(1024.0, 32 * np.ceil(cols / 128))))


# A 16-bit GEMM whose leading dimensions are not 16-byte aligned (an odd vocabulary: GPT-2's
# 50257; BERT's 30522 is 2-aligned) cannot take cuBLAS's vectorised kernels (on Hopper its
# TMA/wgmma nvjet kernels). It runs Turing/Ampere-style mma.sync kernels that load 2
# (cutlass_75_tensorop_*_align1) or 4-8 bytes (cutlass_80_tensorop_*_align2/4) at a time.
# Measured on an H200 (measurements/h200-2026-12-04, kernel time, GEMMs over 0.05 ms): the best
# of them reached 129 TFLOP/s at align 1 and 239 at align 2-4, 13% and 24% of the 989 TFLOP/s
# dense peak, where aligned nvjet kernels reached 572 in the same sweeps and 830-894 inside
# models. Those kernels are bound by their narrow loads, which an SM issues at a rate per clock,
# not by the tensor cores, so the H200's rates are kept per SM and clock (0.13 x 989.4e12 /
# (132 SMs x 1.98 GHz) = 492 FLOP per SM-clock at align 1, 909 at 2-4) and carried to every
# NVIDIA GPU with tensor cores as a share of its dense peak: min(1, rate x SMs x clock / peak).
# Hopper keeps 0.13 and 0.24; an A100 gets 0.24 and 0.44 (it had the whole peak, so an
# odd-vocabulary GEMM ran 2x faster on an A100 than on an H100); an RTX 4090, whose
# FP32-accumulate peak is 512 per SM-clock, loses almost nothing. Turing on (the align-1 kernels
# are sm75's); not Volta, whose HMMA.884 kernels are others. Measured on the H200 alone:
# the rates on other GPUs are this carry-over, not measurements.
UNALIGNED_SHARE_ON_H200 = {1: 0.13, 2: 0.24, 4: 0.24}
H200_DENSE_FLOP_PER_SM_CLOCK = 989.4e12 / (132 * 1980e6)  # the catalog's h200: bf16, SMs, clock
TENSOR_16BIT = ("bf16", "fp16")


def unaligned_peak_share(gpu: GPU, dtype: str, align, min_mn=None) -> np.ndarray | float:
    """The share of the dense peak a 16-bit GEMM with leading dimensions aligned to `align`
    elements runs against on an NVIDIA GPU (UNALIGNED_SHARE_ON_H200 per SM-clock; 1.0 where aligned,
    on Pascal and Volta or on another vendor). A GEMV (min(m, n) = 1, `min_mn`) keeps the
    whole peak: cuBLAS runs it on its gemv kernels, no tensor cores (334 of the H200's 390
    unaligned rows with m or n of 1)."""
    if align is None or dtype not in TENSOR_16BIT or gpu.vendor != "nvidia" \
            or gpu.arch in ("pascal", "volta") or not gpu.peak_tflops(dtype):
        # Pascal has no tensor cores; Volta's HMMA.884 path has its own kernels, not the sm75+
        # mma.sync ones measured (cutlass_75_*_align1 and cutlass_80_*_align2/4)
        return 1.0
    peak = gpu.gemm_peak_flops_per_s(dtype)
    per_clock = gpu.sm_count * gpu.boost_clock_mhz * 1e6
    shares = {a: min(1.0, v * H200_DENSE_FLOP_PER_SM_CLOCK * per_clock / peak)
              for a, v in UNALIGNED_SHARE_ON_H200.items()}
    align = np.asarray(align, dtype=float)
    share = np.select([align <= 1, align <= 2, align <= 4], [shares[1], shares[2], shares[4]], 1.0)
    if min_mn is not None:
        share = np.where(np.asarray(min_mn, dtype=float) <= 1, 1.0, share)
    return share


def waves(op_class: str, a: dict, gpu: GPU, dtype: str = "fp32", launch: bool = False) -> dict:
    """Tiles, blocks per SM, slots, waves, last-wave fill, tile FLOPs and bytes, base_ms and
    roofline_ms per op. GEMM batches carry their tile as a["tm"], a["tn"], a["threads"]
    (kit orientation: tm covers m). Row ops are blocked as the features are
    (feature_row_blocking), or with launch=True as PyTorch launches them (kit.tiling)."""
    d = DTYPE_BYTES[dtype]
    flops, nbytes = work(op_class, a, dtype)
    peak = gpu.gemm_peak_flops_per_s(dtype) if op_class == "gemm" else gpu.peak_flops_per_s("fp32")
    if op_class == "gemm":
        peak = peak * unaligned_peak_share(gpu, dtype, a.get("align"), np.minimum(a["m"], a["n"]))
    bw = gpu.mem_bw_bytes_per_s
    if op_class == "gemm":
        tm, tn, threads = a["tm"], a["tn"], a["threads"]
        tk = a.get("tk", np.full(len(tm), 8.0))
        tiles = a["b"] * np.ceil(a["m"] / tm) * np.ceil(a["n"] / tn)
        regs = np.floor(tm * tn / threads) + BASE_REGS_PER_THREAD
        bps = _occupancy(gpu, threads, regs, STAGES * (tm + tn) * tk * d)
        tile_flops = 2.0 * tm * tn * a["k"]
        tile_bytes = d * ((tm + tn) * a["k"] + tm * tn)
    elif op_class == "elementwise":
        per_block = ELEMENTWISE_THREADS * ELEMENTWISE_ELEMS_PER_THREAD
        threads = np.full(len(a["numel"]), float(ELEMENTWISE_THREADS))
        tiles = np.ceil(a["numel"] / per_block)
        bps = _occupancy(gpu, threads, np.full(len(tiles), 32.0), np.zeros(len(tiles)))
        tile_flops = flops / a["numel"] * per_block
        tile_bytes = nbytes / a["numel"] * per_block
    else:
        rpb, threads = (row_launches(op_class, a["cols"], d, gpu.vendor) if launch
                        else feature_row_blocking(a["cols"]))
        tiles = np.ceil(a["rows"] / rpb)
        bps = _occupancy(gpu, threads, np.full(len(tiles), float(ROW_REGS_PER_THREAD)),
                         np.full(len(tiles), float(ROW_SMEM_BYTES)))
        tile_flops = flops / a["rows"] * rpb
        tile_bytes = nbytes / a["rows"] * rpb
    slots = gpu.sm_count * bps
    n_waves = np.maximum(1.0, np.ceil(tiles / slots))
    last = tiles - (n_waves - 1) * slots
    sm_peak = peak / gpu.sm_count
    full_ms = np.ceil(np.minimum(tiles, slots) / gpu.sm_count) * tile_flops / sm_peak * 1e3
    last_ms = np.ceil(last / gpu.sm_count) * tile_flops / sm_peak * 1e3
    roof = np.maximum(flops / peak, nbytes / bw) * 1e3
    base = np.maximum((n_waves - 1) * full_ms + last_ms, roof)
    if op_class in ("softmax", "layernorm"):  # re-reads that spill the caches go to DRAM
        base = np.maximum(base, (nbytes + reread_bytes(op_class, a["rows"], a["cols"], gpu, d))
                          / bw * 1e3)
    return {"flops": flops, "bytes": nbytes, "tiles": tiles, "blocks_per_sm": bps,
            "slots": slots, "waves": n_waves, "last_wave_fill": last / slots,
            "threads": threads, "tile_flops": tile_flops, "tile_bytes": tile_bytes,
            "base_ms": base, "roofline_ms": roof,
            "bound": np.where(flops / peak >= nbytes / bw, "compute", "memory")}


def _log(x) -> np.ndarray:
    return np.log(np.maximum(np.asarray(x, dtype=float), 1e-30))


def feature_names(op_class: str) -> list[str]:
    if op_class == "gemm":
        own = ["log_tm", "log_tn", "log_k", "log_b", "linear", "log_tiles", "log_waves",
               "last_wave_fill", "blocks_per_sm", "log_threads", "log_tile_intensity_vs_ridge",
               "log_tile_compute_us", "log_tile_load_us", "log_base_ms", "log_roofline_ms",
               "log_bytes_vs_l2", "pad_efficiency", "log_m", "log_n"]
    elif op_class == "elementwise":
        own = ["log_numel", "log_tiles", "log_waves", "last_wave_fill", "blocks_per_sm",
               "log_bytes_vs_l2", "log_base_ms", "log_roofline_ms", "log_intensity_vs_ridge",
               "inputs", *[f"kind_{k}" for k in ELEM_KINDS]]
    elif op_class in ("softmax", "layernorm"):
        own = ["log_rows", "log_cols", "log_tiles", "log_waves", "last_wave_fill",
               "blocks_per_sm", "log_threads", "log_bytes_vs_l2", "log_base_ms",
               "log_roofline_ms", "log_row_bytes_vs_smem"]
    else:
        raise KitError(f"no features for op class {op_class!r}; modelled: {', '.join(CLASSES)}")
    return own + GPU_FEATURES


def feature_matrix(op_class: str, a: dict, gpu: GPU | str, w: dict | None = None) -> np.ndarray:
    """One row of feature_names(op_class) per op of the batch `a` on gpu (w = waves(...))."""
    gpu = get_gpu(gpu)
    w = w if w is not None else waves(op_class, a, gpu)
    n = len(w["tiles"])
    g = np.tile(gpu_vector(gpu, gemm=op_class == "gemm"), (n, 1))
    peak = (gpu.gemm_peak_tflops("fp32") if op_class == "gemm" else gpu.fp32_tflops) * 1e12
    sm_flops = peak / gpu.sm_count
    sm_bw = gpu.mem_bw_gbs * 1e9 / gpu.sm_count
    ridge = peak / (gpu.mem_bw_gbs * 1e9)
    common = [_log(w["tiles"]), _log(w["waves"]), w["last_wave_fill"], w["blocks_per_sm"]]
    to_l2 = _log(w["bytes"] / gpu.l2_cache_bytes)
    times = [_log(w["base_ms"]), _log(w["roofline_ms"])]
    if op_class == "gemm":
        tm, tn, m, nn = a["tm"], a["tn"], a["m"], a["n"]
        pad = (m * nn) / (np.ceil(m / tm) * tm * np.ceil(nn / tn) * tn)
        cols = [np.log2(tm), np.log2(tn), _log(a["k"]), _log(a["b"]), a["linear"], *common,
                _log(w["threads"]), _log(w["tile_flops"] / w["tile_bytes"] / ridge),
                _log(w["tile_flops"] / sm_flops * 1e6), _log(w["tile_bytes"] / sm_bw * 1e6),
                *times, to_l2, pad, _log(m), _log(nn)]
    elif op_class == "elementwise":
        kinds = np.array([[float(kd == k) for k in ELEM_KINDS] for kd in a["kind"]]).reshape(n, -1)
        cols = [_log(a["numel"]), *common, to_l2, *times,
                _log(np.maximum(w["flops"], 1.0) / w["bytes"] / ridge), a["inputs"], *kinds.T]
    else:
        cols = [_log(a["rows"]), _log(a["cols"]), *common, _log(w["threads"]), to_l2, *times,
                _log(a["cols"] * 4 / gpu.smem_per_sm_bytes)]
    return np.column_stack([*cols, g])


def lib_tile(tile_m, tile_n, threads, tile_k=8) -> dict:
    """A library tile (cuBLAS names it column-major: its tile m covers PyTorch's n) as the
    kit-orientation arrays waves() takes."""
    return {"tm": np.asarray(tile_n, float), "tn": np.asarray(tile_m, float),
            "threads": np.asarray(threads, float), "tk": np.asarray(tile_k, float)}


def op_from_row(row) -> object:
    """One schema row (dict or namedtuple) as a kit op; conv and unknown ops are a KitError."""
    get = row.get if isinstance(row, dict) else (lambda c, d=None: getattr(row, c, d))
    cls = get("op_class")
    dtype = get("dtype") if isinstance(get("dtype"), str) else "fp32"
    dims = {c: get(c) for c in ("b", "m", "n", "k", "rows", "cols")}
    need = {"gemm": "bmnk", "elementwise": ("rows", "cols"), "softmax": ("rows", "cols"),
            "layernorm": ("rows", "cols")}.get(cls)
    if need is None:
        raise KitError(f"no predictor models op class {cls!r} (op {get('op')!r}); "
                       f"modelled: {', '.join(CLASSES)}")
    for c in need:
        if dims[c] is None or pd.isna(dims[c]):
            raise KitError(f"{get('op')} row has no {c}")
    i = {c: int(v) for c, v in dims.items() if v is not None and not pd.isna(v)}
    if cls == "gemm":
        linear = get("op") == "linear"
        return Gemm(m=i["m"], n=i["n"], k=i["k"], b=i["b"], dtype=dtype,
                    kind="linear" if linear else "bmm", shared_rhs=linear,
                    align=lead_alignment(i["n"], i["k"]))  # a call as the collector makes it
    if cls == "elementwise":
        return Elementwise(get("elem_kind"), i["rows"] * i["cols"], dtype,
                           1 if get("scalar") is True else None)
    return (Softmax if cls == "softmax" else LayerNorm)(i["rows"], i["cols"], dtype)
