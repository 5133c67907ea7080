"""NeuSight's 4-GPU labels (-dp4, -tp4, -pp4_1): which layout each stands for, predicted.

Labels are FP32 training steps (forward + backward, no optimizer step) of a zoo model with
`batch` sequences per step on N GPUs of one NVLink node (Lee et al., ASPLOS 2025):

    -dpN     N data-parallel replicas, batch/N sequences each, gradient all-reduce
    -tpN     Megatron tensor parallelism over N GPUs, the whole batch
    -ppN_M   N pipeline stages, the batch split into M micro-batches
"""
from __future__ import annotations

import re

from kit.errors import KitError
from kit.parallel.gpt import parse_model
from kit.parallel.layout import Layout

_OPTION = re.compile(r"^(dp|tp|pp)(\d+)(?:_(\d+))?$")


def label_layout(option: str, batch: int) -> Layout:
    m = _OPTION.match(option or "")
    if not m:
        raise KitError(f"multi-GPU option {option!r}: expected dpN, tpN or ppN_M")
    kind, n, mbs = m.group(1), int(m.group(2)), int(m.group(3) or 1)
    if kind != "pp" and m.group(3):  # dp4_7 had been scored as dp4, the _7 dropped
        raise KitError(f"multi-GPU option {option!r}: _M (micro-batches) goes with ppN_M only")
    if n < 1 or mbs < 1:  # dp0 had divided by zero
        raise KitError(f"multi-GPU option {option!r}: N and M must be at least 1")
    common = dict(dtype="fp32", optimizer_step=False, schedule="gpipe")
    if kind == "dp":
        if batch % n:
            raise KitError(f"-dp{n} needs a batch divisible by {n}, got {batch}")
        return Layout(dp=n, micro_batch=batch // n, global_batch=batch, **common)
    if kind == "tp":
        return Layout(tp=n, micro_batch=batch, **common)
    if batch % mbs:
        raise KitError(f"-pp{n}_{mbs} needs a batch divisible by {mbs}, got {batch}")
    return Layout(pp=n, micro_batch=batch // mbs, global_batch=batch, **common)


def node_system(gpu_key: str, n: int):
    """The preset node with n GPUs of this kind (e.g. 4x A100-SXM4 NVLink: a100x4-nvlink)."""
    from kit.hardware.system import get_system, list_systems

    fits = [get_system(s) for s in list_systems()]
    fits = [s for s in fits if s.gpu_key == gpu_key and s.nodes == 1 and s.gpus_per_node >= n]
    if not fits:
        raise KitError(f"no system preset with {n} x {gpu_key} (see `kit systems`)")
    return min(fits, key=lambda s: s.gpus_per_node)


def predict_label(model: str, seq: int, batch: int, option: str, gpu_key: str,
                  predictor: str = "auto") -> dict:
    """{predicted_ms, band_ms, system, layout, breakdown, predictor} for one multi-GPU label."""
    from kit.parallel.predict import predict_parallel

    spec = parse_model(model, seq=seq)
    spec = type(spec)(**{**spec.__dict__, "attention": "unfused"})  # eager HF-style attention
    lay = label_layout(option, batch)
    system = node_system(gpu_key, lay.world_size)
    # the analytic layer these labels were validated with (the captured HF graph is the option)
    r = predict_parallel(spec, system, lay, predictor=predictor, graph=False)
    return {"predicted_ms": r["iteration_ms"], "band_ms": r["band_ms"], "system": system.key,
            "layout": r["layout"],
            "breakdown": r["breakdown"], "predictor": r["predictor"]}
