"""altair charts over the kit's answers: rooflines, waves, staircases. Charts only, no modelling."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from kit.hardware import get_gpu
from kit.predict.roofline import roofline
from kit.tiling import Tiling

MAX_WAVE_BARS = 64  # beyond this, the first 63 waves and the last are drawn (the title says so)

# Charts shown in a notebook render offline, as SVG drawn by vl-convert: altair 6's default
# renderer loads vega from a CDN (blank without network), and JupyterLab 4.6 renders only
# vega-lite v5 natively. Panels are unaffected: they use alt.JupyterChart (widgets/base.py).
alt.renderers.enable("svg")


def roofline_frame(gpus, dtype: str = "fp32", intensities=None) -> pd.DataFrame:
    """Attainable TFLOP/s = min(peak, bandwidth × intensity) per GPU over a log grid of intensity
    (the GEMM peak of dtype: GPU.gemm_peak_tflops, AMD CDNA fp32 = its FP32 matrix cores)."""
    if intensities is None:
        intensities = np.logspace(-2, 4, 61)
    rows = []
    for name in gpus:
        gpu = get_gpu(name)
        peak = gpu.gemm_peak_tflops(dtype)
        if peak is None:
            continue
        for i in intensities:
            rows.append({"gpu": gpu.key, "intensity_flops_per_byte": float(i),
                         "attainable_tflops": min(peak, gpu.mem_bw_gbs * i / 1e3)})
    return pd.DataFrame(rows)


def ridge_frame(gpus, dtype: str = "fp32") -> pd.DataFrame:
    rows = []
    for name in gpus:
        gpu = get_gpu(name)
        peak = gpu.gemm_peak_tflops(dtype)
        if peak is not None:
            rows.append({"gpu": gpu.key, "ridge_flops_per_byte": peak * 1e3 / gpu.mem_bw_gbs,
                         "peak_tflops": peak})
    return pd.DataFrame(rows)


def roofline_chart(gpus, dtype: str = "fp32", ops=(), title: str | None = None) -> alt.Chart:
    """Log-log rooflines of the GPUs, their ridge points, and where each op of `ops` sits
    (op, label) at its intensity and the attainable rate on the first GPU."""
    lines = alt.Chart(roofline_frame(gpus, dtype)).mark_line().encode(
        x=alt.X("intensity_flops_per_byte:Q", scale=alt.Scale(type="log"),
                title="arithmetic intensity (FLOP/byte)"),
        y=alt.Y("attainable_tflops:Q", scale=alt.Scale(type="log"), title=f"attainable {dtype} TFLOP/s"),
        color=alt.Color("gpu:N"))
    ridges = alt.Chart(ridge_frame(gpus, dtype)).mark_point(filled=True, size=60).encode(
        x="ridge_flops_per_byte:Q", y="peak_tflops:Q", color="gpu:N",
        tooltip=["gpu", alt.Tooltip("ridge_flops_per_byte:Q", format=".1f")])
    layers = [lines, ridges]
    if ops:
        gpu = get_gpu(gpus[0])
        pts = []
        for op, label in ops:
            r = roofline(op, gpu)
            peak = r.peak_tflops
            pts.append({"op": label, "intensity_flops_per_byte": r.intensity_flops_per_byte,
                        "attainable_tflops": min(peak, gpu.mem_bw_gbs * r.intensity_flops_per_byte / 1e3),
                        "bound": r.bound})
        layers.append(alt.Chart(pd.DataFrame(pts)).mark_point(shape="diamond", size=120, color="black")
                      .encode(x="intensity_flops_per_byte:Q", y="attainable_tflops:Q",
                              tooltip=["op", "bound"]))
    return alt.layer(*layers).properties(title=title or f"Roofline ({dtype})", width=360, height=260)


def waves_frame(t: Tiling) -> pd.DataFrame:
    """Per wave: blocks that run and slots left empty (the last wave may be mostly empty)."""
    rows = []
    for w in range(t.waves):
        used = t.slots if w < t.waves - 1 else t.tiles - (t.waves - 1) * t.slots
        rows.append({"wave": w + 1, "kind": "tiles", "blocks": used})
        rows.append({"wave": w + 1, "kind": "empty slots", "blocks": t.slots - used})
    df = pd.DataFrame(rows)
    if t.waves > MAX_WAVE_BARS:  # keep the first full waves and the last one
        keep = set(range(1, MAX_WAVE_BARS)) | {t.waves}
        df = df[df.wave.isin(keep)]
    return df


def waves_chart(t: Tiling, title: str | None = None) -> alt.Chart:
    return alt.Chart(waves_frame(t)).mark_bar().encode(
        x=alt.X("wave:O", title="wave"),
        y=alt.Y("blocks:Q", stack=True, title=f"blocks ({t.slots} slots per wave)"),
        color=alt.Color("kind:N", scale=alt.Scale(domain=["tiles", "empty slots"],
                                                  range=["#4c78a8", "#e0e0e0"])),
        tooltip=["wave", "kind", "blocks"],
    ).properties(title=title or _waves_title(t), width=300, height=260)


def _waves_title(t: Tiling) -> str:
    title = (f"{t.tiles} tile{'s' if t.tiles != 1 else ''} of {t.tile} in {t.waves} "
             f"wave{'s' if t.waves != 1 else ''}")
    if t.waves > MAX_WAVE_BARS:  # waves_frame drops the middle ones
        title += f" (waves {MAX_WAVE_BARS}-{t.waves - 1} not drawn)"
    return title


def staircase_chart(frame: pd.DataFrame, x: str, title: str) -> alt.Chart:
    """Latency against one swept dimension: the wave staircase beside the smooth roofline."""
    long = frame.melt(id_vars=[x], value_vars=["wave_model_ms", "roofline_ms"],
                      var_name="model", value_name="time_ms")
    return alt.Chart(long).mark_line(interpolate="step-after").encode(
        x=alt.X(f"{x}:Q"), y=alt.Y("time_ms:Q", title="time (ms)"), color="model:N",
    ).properties(title=title, width=420, height=240)
