"""Why the tile predictor gave an op its time: which curve, bound or cap set it (kit op's
`source` line, kit.api.predict_op). Each check redoes the bound and compares it with the time."""
from __future__ import annotations

import numpy as np


def tile_source(model, op, gpu, out: dict, cls: str) -> None:
    """Set out["source"] where a curve, a bound or a cap set out["latency_ms"] (in place)."""
    from kit.ops import Attention
    from kit.predict.tensor_core import attention_params_for, curve_attention, curve_gemm, params_for
    from kit.predict.sibling_bound import runs_dtype

    gemm_curve = params_for(gpu, op.dtype) if cls == "gemm" else None
    # an unaligned GEMM its aligned twin's time lifted (TilePredictor._aligned_bound)
    lifted = (cls == "gemm" and out.get("tile") != "gemv"
              and out["latency_ms"] <= (1 + 1e-9) * model.aligned_twin_ms([op], gpu)[0])
    params = (gemm_curve if cls == "gemm" and (curve_gemm(gpu, op) or lifted)
              else attention_params_for(gpu, op.dtype) if isinstance(op, Attention) else None)
    if params is not None and out.get("tile") != "gemv":  # a curve, not the tile-MLP
        carried = params.get("carried_from")
        out["source"] = "kit.predict.tensor_core" + (f" (carried from the {carried} curve)" if carried else "")
        if isinstance(op, Attention) and op.seq_q == 1:  # the blend's weight is 0
            out["source"] = "roofline (one query, a decode step: kit.predict.tensor_core's curve takes no part)"
        elif isinstance(op, Attention) and not curve_attention(gpu, op):
            out["source"] += " (blended with the roofline: under 128 queries)"
        if lifted:
            out["source"] += " (its aligned twin's time: an unaligned GEMM is never faster)"
    few = model.few_rows_ms([op], gpu)[0] if cls == "gemm" else np.nan
    if np.isfinite(few) and not lifted and abs(out["latency_ms"] - few) <= 1e-9 * few:
        rows = min(op.m, op.n)
        out["source"] = (f"{rows} back-to-back calls of its one-row twin (their kernel times and one "
                         "dispatch floor): a GEMM this thin is never slower than those; "
                         f"{_answer(op, gpu, out, cls)} was slower")
    if out.get("tile") == "gemv":
        twin = model.two_row_ms([op], gpu, np.array([True]))[0]
        if np.isfinite(twin) and abs(out["latency_ms"] - twin) <= 1e-9 * twin:
            out["source"] = ("its two-row twin's time: a GEMV is never slower than the GEMM of "
                             "two rows, whose kernel could run it with a row of padding; the "
                             "GEMV rule's stream was slower")
    batches = model.few_batches_ms([op], gpu)[0] if cls == "gemm" else np.nan
    if np.isfinite(batches) and abs(out["latency_ms"] - batches) <= 1e-9 * batches:
        out["source"] = (f"{op.b} back-to-back calls of its b = 1 twin (their kernel times and one "
                         "dispatch floor): a batch this small is never slower than those; "
                         f"{_answer(op, gpu, out, cls)} was slower")
    if cls == "gemm" and out.get("tile") != "gemv":
        long_ms = model.long_reduction_ms([op], gpu)[0]
        if np.isfinite(long_ms) and abs(out["latency_ms"] - long_ms) <= 1e-9 * long_ms:
            out["source"] = _long_reduction_text(op, gpu, out, cls)
        from kit.predict.gemv import MEASURED_STREAM, STREAM_SHARE_DEFAULT, STREAM_SHARE_MAX, stream_bound_ms
        from kit.workload.kernel_times import isolation_floor_ms

        low = stream_bound_ms([op], gpu.mem_bw_gbs)[0] + isolation_floor_ms(model, gpu)
        if abs(out["latency_ms"] - low) <= 1e-9 * low:
            share = STREAM_SHARE_MAX.get(op.dtype, STREAM_SHARE_DEFAULT)
            whose = (f"the most a {op.dtype} GEMM reached on the H200" if op.dtype in MEASURED_STREAM
                     else f"the most a 16-bit GEMM reached on the H200 ({op.dtype} was not timed)")
            out["source"] = (f"its bytes at {100 * share:.0f}% of the memory bandwidth, {whose}, plus "
                             f"the dispatch floor: no GEMM streams faster; {_answer(op, gpu, out, cls)} "
                             "was faster")
    if cls == "gemm":
        bound, _ = model.padded_rows_ms([op], gpu)
        if (np.isfinite(bound[0]) and abs(out["latency_ms"] - bound[0]) <= 1e-9 * bound[0]
                and not str(out.get("source", "")).startswith("its two-row twin")  # says more
                and _unpadded_ms(model, op, gpu) > bound[0] * (1 + 1e-9)):  # it bound, not a tie
            own = _answer(op, gpu, out, cls)
            out["source"] = ("the time of a twin with more rows on its thin side or a longer "
                             "reduction, as it could run padded: no GEMM this thin or short is faster "
                             f"for more rows or a longer k; {own} was slower")
    if cls == "gemm":  # a GEMV too: an H100 FP32 64 x 1 x 64 takes its 128-row twin's 14.69 us
        _doubled_source(model, op, gpu, out, cls)
    own = None
    # a training GPU without op's dtype bounds nothing (TilePredictor._reference skips it; a
    # Memcpy, of no dtype, had raised an AttributeError here)
    for other in [g for g in model.dominated_training_gpus(gpu) if runs_dtype(g, op)]:
        theirs = float(model.predict_unbounded([op], other).latency_ms.iloc[0])
        if own is None:
            own = float(model.predict_unbounded([op], gpu).latency_ms.iloc[0])
        if abs(out["latency_ms"] - theirs) <= 1e-9 * theirs and own > theirs * (1 + 1e-9):
            out["source"] = (f"its time on the {other.key}, a training GPU with the same SM design "
                             f"that the {gpu.key} matches or beats in every resource: never slower "
                             f"than there; {_answer(op, gpu, out, cls)} here was slower")
    from kit.predict.norm_paths import two_kernel_mask, two_kernel_ms

    if two_kernel_mask([op], gpu)[0]:
        from kit.workload.kernel_times import isolation_floor_ms

        low = two_kernel_ms([op.rows], [op.cols], gpu)[0] + isolation_floor_ms(model, gpu)
        if abs(out["latency_ms"] - low) <= 1e-9 * low:
            out["source"] = ("PyTorch's two-kernel layer norm (a width not a multiple of 4: "
                             "RowwiseMomentsCUDAKernel, then LayerNormForwardCUDAKernel), timed on "
                             "an H200 (kit.predict.norm_paths), plus the dispatch floor; the "
                             "tile-MLP's own answer was faster")
    if cls in ("elementwise", "softmax"):
        _rate_source(model, op, gpu, out, cls)
    from kit.ops import elementwise_proxy

    proxy = elementwise_proxy(op)
    if proxy is not None:
        out["source"] = (f"the learned elementwise {proxy[0].kind} pass over {proxy[0].numel} "
                         f"elements, times {proxy[1]:.4g} for the bytes it moves (as in a model)")


def tile_choice(model, op, gpu, split: int = 1) -> list[dict]:
    """The tile chooser's view of a GEMM, or of its split batch where it runs split `split` ways
    (kit.predict.split_k.split_op, chosen as that split): each tile its prediction mixes
    (kit.predict.tile_mlp.tile_weights), likeliest first, then the next likeliest to three in
    all, as {tile, p, weight}."""
    from kit.predict.features import arrays_from_ops
    from kit.predict.split_k import split_op
    from kit.predict.tile_mlp import tile_weights

    a = arrays_from_ops("gemm", [split_op(op, split) if split > 1 else op])
    if split > 1:
        a["split_ways"] = np.array([float(split)])
    prob = model.chooser.probabilities(a, gpu, op.dtype)
    weight = tile_weights(prob, model.soft_tile_margin)[0]
    order = np.argsort(-prob[0], kind="stable")
    keep = [int(t) for t in order if weight[t] > 0 or t in order[:3]]
    return [{"tile": f"{model.chooser.vocab[t][0]}x{model.chooser.vocab[t][1]}",
             "p": round(float(prob[0, t]), 4), "weight": round(float(weight[t]), 4)} for t in keep]


def _answer(op, gpu, out: dict, cls: str) -> str:
    """What a cap overrode: the GEMV rule's stream, a curve's answer (kit.predict.tensor_core) or
    the tile-MLP's."""
    from kit.predict.tensor_core import curve_gemm

    if out.get("tile") == "gemv":
        return "the GEMV rule's stream"
    if cls == "gemm" and curve_gemm(gpu, op):
        return "the kernel-time curve's own answer (kit.predict.tensor_core)"
    return "the tile-MLP's own answer"


def _doubled_source(model, op, gpu, out: dict, cls: str) -> None:
    """out["source"] where the row bound (kit.predict.gemm_bounds.doubled_rows_ms) set a GEMM's
    time: its twin with twice the rows, or a twin of that twin, was faster than its own answer."""
    from kit.predict.gemm_bounds import DOUBLE_ROOF_MS

    twin = model.doubled_rows_ms([op], gpu)
    if twin is None:
        return
    bound = float(twin.latency_ms.iloc[0])
    if not (np.isfinite(bound) and abs(out["latency_ms"] - bound) <= 1e-9 * bound):
        return
    raw, model._raw_doubled = model._raw_doubled, True  # its time without the row bound
    try:
        unbound = float(model.predict([op], gpu).latency_ms.iloc[0])
    finally:
        model._raw_doubled = raw
    if unbound > bound * (1 + 1e-9):  # it bound, not a tie
        shape = "a GEMV" if twin.tile.iloc[0] == "gemv" else f"{twin.tiles.iloc[0]} tiles"
        out["source"] = (f"the time of a twin with more rows ({shape}: {op.m} rows "
                         f"doubled, predicted whole, on up to a {1e3 * DOUBLE_ROOF_MS:g} us roofline), as it could run "
                         "padded with zero rows: below that no GEMM is faster for twice the rows; "
                         f"without it {1e3 * unbound:.2f} us")


def _unpadded_ms(model, op, gpu) -> float:
    """The op's time without the padding cap (kit.predict.gemm_bounds.padded_rows_ms)."""
    with model.as_twins():
        return float(model.predict_unbounded([op], gpu).latency_ms.iloc[0])


def _long_reduction_text(op, gpu, out: dict, cls: str) -> str:
    """kit op's source where the long-reduction cap (kit.predict.gemm_bounds.long_reduction_ms)
    set a GEMM's time."""
    from kit.predict.gemm_bounds import BMM_TRAINED_K

    text = (f"its k = {BMM_TRAINED_K:,} twin's kernel time scaled by k / {BMM_TRAINED_K:,} "
            f"({op.k / BMM_TRAINED_K:.3g}x), plus one dispatch floor: past the longest reduction "
            "the tile-MLP met in a GEMM with its own right-hand side, a reduction step costs no "
            f"more than at it (kit.predict.gemm_bounds); {_answer(op, gpu, out, cls)} was slower")
    if op.k > LONG_REDUCTION_MEASURED_K:
        text += (f"; carried past k = {LONG_REDUCTION_MEASURED_K:,}, the longest reduction of the "
                 "rows it was checked on")
    return text


# the longest reduction among the held-out bmm rows the long-reduction cap was checked on
# (NeuSight's test rows past the edge; kit.predict.gemm_bounds.long_reduction_ms)
LONG_REDUCTION_MEASURED_K = 4096


def _carried_text(reasons: list[str], wider: bool = False) -> str:
    """The carried reasons; wider: the rule widens its band where carried (the block softmax's
    does, kit.predict.cdna_softmax.band_log; the element rates and the warp kernel's row latency
    keep the network's band)."""
    if not reasons:
        return ""
    return f"; carried, not measured: {'; '.join(reasons)}" + ("; so its band is wider" if wider else "")


def _rate_source(model, op, gpu, out: dict, cls: str) -> None:
    """Set out["source"] where a row's latency (PyTorch's warp softmax on NVIDIA, the block
    softmax on AMD: kit.predict.cdna_softmax) or an element rate (kit.predict.element_rates) set
    a vector or row op's time: that bound plus the dispatch floor (kit.predict.small_op_bounds),
    and where it is carried past what was measured (another GPU, dtype or row length)."""
    from kit.ops import DTYPE_BYTES
    from kit.predict import cdna_softmax
    from kit.predict.element_rates import (CDNA_ELEMS_PER_CU_CLOCK, ELEMS_PER_SM_CLOCK, RATE_DTYPES,
                                           SOFTMAX_BF16_ONLY_COLS, SOFTMAX_DTYPES, SOFTMAX_WARP_MAX_COLS,
                                           element_bound_ms, softmax_bound_ms, softmax_row_ms)
    from kit.workload.kernel_times import isolation_floor_ms

    floor, lat = isolation_floor_ms(model, gpu), out["latency_ms"]

    def sets(bound_ms: float) -> bool:
        return bound_ms > 0 and abs(lat - (floor + bound_ms)) <= 1e-9 * (floor + bound_ms)

    def from_h200(by: str) -> list[str]:
        return [] if gpu.key == "h200" else [f"read on the H200, taken to the {gpu.key} by {by}"]

    if cls == "elementwise":
        if sets(float(element_bound_ms([op.kind], [op.numel], gpu)[0])):
            amd = gpu.vendor == "amd"
            rate = (CDNA_ELEMS_PER_CU_CLOCK if amd else ELEMS_PER_SM_CLOCK)[op.kind]
            where = ("the fastest of NeuSight's MI100 and MI210 rows, ROCm's powf" if amd
                     else "the fastest measured on the H200")
            if not amd:
                carried = from_h200("its SMs and clock")
            elif gpu.key in cdna_softmax.MEASURED_GPUS:  # the pow rows' GPUs, as the softmax rows'
                carried = []
            else:
                carried = [f"read on the MI100 and MI210, taken to the {gpu.key} by its CUs and clock"]
            measured = RATE_DTYPES.get((gpu.vendor, op.kind), ())
            if op.dtype not in measured:
                carried.append(f"{op.dtype} (it was read in {' and '.join(measured)})")
            out["source"] = (f"its {op.numel:,} elements at {rate:g} per {'CU' if amd else 'SM'} per "
                             f"clock, {where} (kit.predict.element_rates), plus the dispatch floor: "
                             f"{op.kind}'s arithmetic, not its bytes, sets the time" + _carried_text(carried))
        return
    eb = DTYPE_BYTES[op.dtype]
    block = float(cdna_softmax.block_softmax_ms([op.rows], [op.cols], gpu, eb)[0])
    dtype_carried = [] if op.dtype in SOFTMAX_DTYPES else [f"{op.dtype} (it was read in {' and '.join(SOFTMAX_DTYPES)})"]
    if sets(block):
        kernel = cdna_softmax.kernel_of(op.cols, gpu, eb)
        a, b = cdna_softmax.CDNA_SOFTMAX_ROW_CLOCKS[kernel]
        rounds = int(np.ceil(op.rows / cdna_softmax.slots(op.cols, gpu, eb)))
        carried = [why for why, yes in (
            (f"a {op.dtype} row, its slope taken per byte", eb != 4),
            (f"rows over {cdna_softmax.MEASURED_MAX_COLS:,} columns", op.cols > cdna_softmax.MEASURED_MAX_COLS),
            (f"the {gpu.key} is neither an MI100 nor an MI210", gpu.key not in cdna_softmax.MEASURED_GPUS)) if yes]
        slope = b * eb / 4  # a traffic slope: per byte of the row (block_softmax_ms)
        out["source"] = (f"ROCm's block softmax ({'shared-memory' if kernel == 'smem' else 'three-pass'} "
                         f"kernel): {rounds:,} round{'s' if rounds != 1 else ''} of resident blocks, each one "
                         f"row's latency of {a:.0f} + {slope:.3g} x cols clocks"
                         + (f" ({b:.2f} per fp32 column, taken per byte)" if eb != 4 else "")
                         + " (kit.predict.cdna_softmax, fitted on NeuSight's MI100 and MI210 fp32 rows), "
                         "plus the dispatch floor: the row's latency, not its bytes, sets the time"
                         + _carried_text(carried, wider=True))
    elif sets(float(softmax_row_ms([op.cols], gpu, op.dtype)[0])):
        out["source"] = ("one row's latency in PyTorch's warp softmax kernel, a + b x cols clocks "
                         "(kit.predict.element_rates.SOFTMAX_ROW_CLOCKS, fitted on the H200's rows), "
                         "plus the dispatch floor: with rows this few, no other warp hides it"
                         + _carried_text(from_h200("its clock") + dtype_carried))
    elif sets(float(softmax_bound_ms([op.rows], [op.cols], gpu)[0])):
        long = op.cols > SOFTMAX_WARP_MAX_COLS
        if op.cols <= SOFTMAX_BF16_ONLY_COLS and op.dtype != "bf16":
            dtype_carried = [f"{op.dtype} (rows this short were read in bf16 alone)"]
        out["source"] = (("its elements at the warp softmax kernel's rate for rows of this length"
                          if not long else
                          f"its rows counted as rows of {SOFTMAX_WARP_MAX_COLS:,} (a longer row is never "
                          f"faster) at the warp softmax kernel's rate for rows of 1,025-{SOFTMAX_WARP_MAX_COLS:,}")
                         + ", the fastest measured on the H200 (kit.predict.element_rates), plus the "
                         "dispatch floor: its arithmetic, not its bytes, sets the time"
                         + _carried_text(from_h200("its SMs and clock") + dtype_carried
                                         + ([f"rows over {SOFTMAX_WARP_MAX_COLS:,} run a block per row, another "
                                             "kernel, whose own rate was not bound"] if long else [])))
