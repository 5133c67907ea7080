"""The GEMM panel: a shape and a GPU drive a tiles/waves picture and a roofline chart."""
from __future__ import annotations

import altair as alt
import ipywidgets as W

from kit import viz
from kit.api import memory_problem, op_tiling, predict_op
from kit.hardware import DTYPES, get_gpu, gpu_keys
from kit.ops import Gemm
from kit.predict.gemv import blas_library
from widgets.base import Panel, check_init, message_chart

MAX_DIM = 1 << 20  # the largest m, n or k the panel's boxes take


def gemv_note(gpu) -> str:
    """What runs a GEMV on gpu: the vendor's library (cuBLAS, or rocBLAS on AMD) streams it."""
    return (f"a matrix-vector product (m or n of 1): {blas_library(gpu)}'s gemv kernel streams "
            "the matrix once, no GEMM tiles or waves (kit.predict.gemv)")


class GemmPanel(Panel):
    title = "GEMM on a GPU: tiles, waves and the roofline"

    def __init__(self, m=4096, n=4096, k=4096, gpu="a100-sxm4-80gb", dtype="fp32",
                 compare=("v100-sxm2-32gb", "h100-sxm")):
        for name, value in (("m", m), ("n", n), ("k", k)):  # the boxes would clamp it
            check_init("GemmPanel", name, value, lo=1, hi=MAX_DIM)
        Gemm(m=m, n=n, k=k, dtype=dtype)  # a KitError for a dtype no GEMM has
        self._init = dict(m=m, n=n, k=k, gpu=get_gpu(gpu).key, dtype=dtype)
        compare = () if compare is None else [compare] if isinstance(compare, str) else compare  # one name, or several
        self.compare = tuple(get_gpu(g).key for g in compare)
        super().__init__()

    def controls(self):
        i = self._init
        style = {"description_width": "initial"}
        self.m = W.BoundedIntText(value=i["m"], min=1, max=MAX_DIM, description="m", style=style)
        self.n = W.BoundedIntText(value=i["n"], min=1, max=MAX_DIM, description="n", style=style)
        self.k = W.BoundedIntText(value=i["k"], min=1, max=MAX_DIM, description="k", style=style)
        self.gpu = W.Dropdown(options=gpu_keys(), value=i["gpu"], description="GPU")
        self.dtype = W.Dropdown(options=list(DTYPES), value=i["dtype"], description="dtype")
        for w in (self.m, self.n, self.k):
            w.layout = W.Layout(width="150px")
        return [self.m, self.n, self.k, self.gpu, self.dtype]

    def op(self) -> Gemm:
        return Gemm(m=self.m.value, n=self.n.value, k=self.k.value, dtype=self.dtype.value)

    def _problem(self) -> str | None:
        """Why this GEMM cannot run on the chosen GPU (no such dtype, operands beyond its
        memory), or None."""
        if get_gpu(self.gpu.value).peak_tflops(self.dtype.value) is None:
            return f"{self.gpu.value} has no {self.dtype.value} support; pick another dtype."
        problem = memory_problem(self.op(), self.gpu.value)
        return f"{problem}; pick a smaller shape." if problem else None

    def _supported(self) -> bool:
        return self._problem() is None

    def make_chart(self):
        msg = self._problem()
        if msg:
            return message_chart(msg)
        op = self.op()
        t = op_tiling(op, self.gpu.value)  # the tile the predictor chose
        left = viz.waves_chart(t) if t is not None else message_chart(gemv_note(get_gpu(self.gpu.value)))
        roof = viz.roofline_chart(self._gpus(), self.dtype.value, ops=[(op, "this GEMM")])
        left_out = self._left_out()
        if left_out:
            roof = roof.properties(title=alt.TitleParams(roof.title, subtitle=left_out))
        return alt.hconcat(left, roof).resolve_scale(color="independent")  # shared, "gpu" had no colour

    def _gpus(self) -> list[str]:
        """The chosen GPU, then the compared ones."""
        return [self.gpu.value] + [g for g in self.compare if g != self.gpu.value]

    def _left_out(self) -> str:
        """Which compared GPUs the roofline leaves out (no GEMM peak for the dtype), or ""."""
        dtype = self.dtype.value
        lack = [g for g in self._gpus() if get_gpu(g).gemm_peak_tflops(dtype) is None]
        return f"left off the roofline (no {dtype}): {', '.join(lack)}" if lack else ""

    def result(self) -> dict | None:
        return predict_op(self.op(), self.gpu.value) if self._supported() else None

    def summary_text(self) -> str:
        r = self.result()
        if r is None:
            return self._problem()
        tail = (f"{r['bound']}-bound · roofline {r['roofline_ms']:.4g} ms · predicted "
                f"{r['latency_ms']:.4g} ms ({r['predictor']}")
        source = str(r.get("source", ""))
        if source.startswith("kit.predict.tensor_core"):
            tail += ("; the H200's tensor-core curve, carried to this GPU" if "carried" in source
                     else "; Hopper's measured tensor-core curve") + ": the tiles are for the picture"
        elif source:  # a bound or a cap set the time, not the tiles (kit op's source line says all)
            tail += "; set by " + source.split(":")[0].split(";")[0]
        tail += ")"
        mixed = [c for c in r.get("tile_choice") or [] if c["weight"] > 0]
        if len(mixed) > 1 and not source:  # as kit op's choice line: the tiles the time mixes
            tail += (" · the tile choice is unsure (" + ", ".join(f"{c['tile']} p {c['p']:.2f}" for c in mixed)
                     + "): the time is their weighted mean")
        left_out = self._left_out()
        if left_out:
            tail += f" · {left_out}"
        if r["tile"] == "gemv":  # no tiles: the summary says so, as kit op does
            return f"{gemv_note(get_gpu(self.gpu.value))} · {tail}"
        split = (f", reduction split {r['split_k']} ways (split-K: then a kernel sums the partial "
                 "outputs)" if r.get("split_k", 1) > 1 else "")
        tile = "x".join(map(str, r["tile_dims"][:2]))  # m x n of C, as the chart shows it
        fill = 100 * r["last_wave_fill"]
        fill = "<1%" if fill < 0.5 else f"{fill:.0f}%"  # one tile of 2,000 slots is not "0% full"
        waves = f"{r['waves']} wave{'s' if r['waves'] != 1 else ''}"
        return (f"{r['tiles']} tile{'s' if r['tiles'] != 1 else ''} of {tile}{split}, "
                f"{r['blocks_per_sm']} blocks/SM, {waves} (last {fill} full) · {tail}")
