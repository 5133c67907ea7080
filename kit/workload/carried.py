"""How much of a step's kernel time takes a kernel-time curve carried from where it was measured.

The tile predictor prices aligned tensor-core GEMMs and fused attention by curves fitted on one
GPU and dtype (kit.predict.tensor_core): the H200's, carried to NVIDIA's other tensor-core GPUs,
and AMD's FP32 matrix-core GEMMs, carried to 16-bit and FP8 on AMD's. Such a kernel's band is
wider, but a whole step's total does not say which part of it rests on a curve nobody timed on
that GPU or dtype. carried_ms sums, per curve, the time of the kernels that take one where it is
carried (measured curves and the tile-MLP's own answers are left out); `kit predict` prints the
share. A node counts where every leaf of every way to run it takes the same carried curve.
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


def carried_nodes(leaves: tuple, gpu) -> dict[int, str]:
    """{node: curve} for the kernel nodes every leaf of which takes the same carried curve on gpu
    (leaves: kit.workload.kernel_times._leaves's (leaf ops, owner node, scale, option))."""
    ops, owner = leaves[0], leaves[1]
    tags = {op: curve_tag(op, gpu) for op in set(ops)}
    node_tag: dict[int, str | None] = {}
    for op, node in zip(ops, owner):
        tag = tags[op]
        node_tag[int(node)] = tag if node_tag.get(int(node), tag) == tag else None
    return {node: tag for node, tag in node_tag.items() if tag is not None}


def carried_ms(nodes: dict[int, str], latency_ms) -> dict[str, float]:
    """{curve: ms}: the summed times of carried_nodes' nodes, by curve."""
    lat = np.asarray(latency_ms, dtype=float)
    out: dict[str, float] = {}
    for node, tag in nodes.items():
        out[tag] = out.get(tag, 0.0) + float(lat[node])
    return out
