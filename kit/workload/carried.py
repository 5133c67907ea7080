"""How much of a step's kernel time takes a kernel-time curve carried from where it was measured.

The tile predictor prices aligned tensor-core GEMMs and fused attention by curves fitted on one
GPU and dtype (kit.predict.tensor_core): the H200's, carried to NVIDIA's other tensor-core GPUs,
and AMD's FP32 matrix-core GEMMs, carried to 16-bit and FP8 on AMD's. Such a kernel's band is
wider, but a whole step's total does not say which part of it rests on a curve nobody timed on
that GPU or dtype. carried_ms sums, per curve, the time of the kernels that take one where it is
carried (measured curves and the tile-MLP's own answers are left out); `kit predict` prints the
share. A node counts where every leaf of the way it runs (kit.workload.kernel_times's choice among
its options: a convolution's implicit GEMM or Winograd) takes the same carried curve. Not counted:
an unaligned GEMM lifted to its aligned twin's time on a carried curve. An attention of 2-127
queries takes a log-linear blend of its roofline and the curve (kit.predict.small_op_bounds,
weight log2(queries) / 7 on the curve) and counts that share of its time (curve_weight); it had
counted whole.
"""
from __future__ import annotations

import numpy as np


def curve_tag(op, gpu) -> str | None:
    """The carried curve a leaf op takes on gpu ("h200 bf16", "amd fp32 matrix-core", ...), or
    None: no curve, a measured one, or a GEMV (kit.predict.gemv prices those)."""
    from kit.ops import Attention, Gemm
    from kit.predict.gemv import applies as gemv_applies
    from kit.predict.tensor_core import attention_params_for, curve_gemm, params_for

    if isinstance(op, Gemm):
        if not curve_gemm(gpu, op) or gemv_applies(gpu, [op])[0]:
            return None
        return (params_for(gpu, op.dtype) or {}).get("carried_from")
    if isinstance(op, Attention) and op.seq_q > 1:  # one query keeps its roofline (a decode step)
        return attention_params_for(gpu, op.dtype).get("carried_from")
    return None


def curve_weight(op) -> float:
    """The share of a leaf's time its curve sets: 1, but an attention's blend weight
    (kit.predict.tensor_core.attention_curve_weight: log2(queries) / 7 under 128 queries)."""
    from kit.ops import Attention
    from kit.predict.tensor_core import attention_curve_weight

    return float(attention_curve_weight(op.seq_q)) if isinstance(op, Attention) else 1.0


def carried_nodes(leaves: tuple, gpu, fallbacks=()) -> dict[tuple[int, int], tuple[str, float]]:
    """{(node, option): (curve, share)} for each way to run a kernel node every leaf of which
    takes the same carried curve on gpu (leaves: kit.workload.kernel_times._leaves's (leaf ops,
    owner node, scale, option)); share: the leaves' curve_weight, their scales' weighted mean (a
    node's leaves are one attention, or GEMMs whose weight is 1). fallbacks: the op types the
    predictor could not cost (the wave model priced them, no curve)."""
    ops, owner, scale, option = leaves
    # tag and weight once per distinct op (a step's ~1,000 leaves are a few dozen ops), and only
    # the leaves of ways one of whose leaves has a tag (no other way can count): asked leaf by
    # leaf, every leaf, they had been 7% of a warm prediction on a new GPU (gpt2-large, profiled)
    distinct: dict = {}
    code = np.array([distinct.setdefault(op, len(distinct)) for op in ops], dtype=int)
    tags = [None if type(op).__name__ in fallbacks else curve_tag(op, gpu) for op in distinct]
    weights = [curve_weight(op) for op in distinct]
    owner, scale, option = (np.asarray(a) for a in (owner, scale, option))
    way_id = owner.astype(int) * (int(option.max()) + 1 if len(option) else 1) + option.astype(int)
    tagged = np.array([t is not None for t in tags], dtype=bool)[code]
    keep = np.flatnonzero(np.isin(way_id, way_id[tagged]))  # every leaf of those ways, in order
    way_tag: dict[tuple[int, int], str | None] = {}
    weight: dict[tuple[int, int], list[float]] = {}
    for c, node, s, k in zip(code[keep].tolist(), owner[keep].tolist(), scale[keep].tolist(),
                             option[keep].tolist()):
        key, tag = (int(node), int(k)), tags[c]
        way_tag[key] = tag if way_tag.get(key, tag) == tag else None
        w = weight.setdefault(key, [0.0, 0.0])
        w[0] += float(s) * weights[c]
        w[1] += float(s)
    return {key: (tag, weight[key][0] / weight[key][1] if weight[key][1] > 0 else 1.0)
            for key, tag in way_tag.items() if tag is not None}


def carried_ms(ways: dict[tuple[int, int], tuple[str, float]], latency_ms, taken) -> dict[str, float]:
    """{curve: ms}: the times of the nodes whose way taken (taken: per node, the option
    kit.workload.kernel_times chose) is one of carried_nodes', each times its share, by curve."""
    lat = np.asarray(latency_ms, dtype=float)
    out: dict[str, float] = {}
    for (node, k), (tag, share) in ways.items():
        if int(taken[node]) == k:
            out[tag] = out.get(tag, 0.0) + share * float(lat[node])
    return out
