"""The whole-model panel: model, GPU, mode, batch and sequence length drive a breakdown by op
class and phase, and a timeline of the CPU issuing ops against the GPU running them (one bar
per layer and phase). The summary says when the step would not fit in the GPU's memory (the
estimate `kit compare` uses), and the seq control is off for DLRM, which has no sequence.
Decoder-only models also offer mode decode: one generated token per sequence, with seq tokens
already in the KV cache (kit.workload.kv_cache), static (written in place) or dynamic (HF's
DynamicCache, grown by torch.cat every step); the cache control is off in the other modes.
Mode generate answers a seq-token prompt with `new tokens` tokens (kit.api.predict_generation):
the prefill's time to first token, then one decode step per token, charted as the time split
between prefill and decode (GPU work against GPU waiting on the CPU) and the decode step's time
as the cache grows; seq leaves positions for the new tokens. The dtype control offers what the
GPU supports (no bf16 before Ampere: a bf16 choice falls back to fp16 there). A mode, seq or
dtype the reader chose and a model or GPU cannot take comes back when the choice is offered
again (gpt2 decode, then BERT, then gpt2: decode)."""
from __future__ import annotations

from types import SimpleNamespace

import altair as alt
import ipywidgets as W
import pandas as pd

from kit.api import predict_generation, predict_model
from kit.errors import KitError
from kit.hardware import get_gpu, gpu_keys
from kit.workload.models import memory_bytes
from kit.workload.modes import KV_CACHES
from kit.workload.zoo import (DECODERS, check_mode, check_seq, decodes, max_seq, resolve, uses_seq,
                              zoo_names)
from widgets.base import Panel, check_init

SEQS = (32, 64, 128, 256, 512, 1024, 2048)
MODES, FUSIONS, MAX_BATCH = ("train", "inference", "decode", "generate"), ("eager", "compiled"), 64
NEW_TOKENS = (16, 32, 64, 128, 256)
PANEL_DTYPES = ("fp32", "fp16", "bf16")
DECODING = ("decode", "generate")  # the modes with a KV cache


def timeline_bars(timeline: pd.DataFrame) -> pd.DataFrame:
    """One bar per (track, phase, layer): when the CPU issued that layer's ops and when the GPU
    ran them."""
    t = timeline.assign(layer=timeline["layer"].fillna(-1).astype(int))
    rows = []
    for (phase, layer), g in t.groupby(["phase", "layer"], sort=False):
        label = "other" if layer < 0 else f"layer {layer}"
        rows.append({"track": "CPU issue", "phase": phase, "part": label,
                     "start_ms": float(g["cpu_start_ms"].min()), "end_ms": float(g["cpu_end_ms"].max())})
        rows.append({"track": "GPU", "phase": phase, "part": label,
                     "start_ms": float(g["gpu_start_ms"].min()), "end_ms": float(g["gpu_end_ms"].max()),
                     "busy_ms": float(g["latency_ms"].sum())})
    return pd.DataFrame(rows)


class WholeModelPanel(Panel):
    title = "Whole model: one training step or inference pass, kernel by kernel"

    def __init__(self, model="gpt2", gpu="a100-pcie-40gb", mode="train", batch=1, seq=128,
                 fusion="eager", kv_cache="static", new_tokens=64, dtype="fp32"):
        check_init("WholeModelPanel", "mode", mode, MODES)
        check_init("WholeModelPanel", "fusion", fusion, FUSIONS)
        check_init("WholeModelPanel", "kv_cache", kv_cache, KV_CACHES)
        check_init("WholeModelPanel", "new_tokens", new_tokens, NEW_TOKENS)
        check_init("WholeModelPanel", "batch", batch, lo=1, hi=MAX_BATCH)  # the slider would clamp it
        check_init("WholeModelPanel", "dtype", dtype, PANEL_DTYPES)
        if seq is None:  # a model without a sequence (DLRM, ViT) takes none; the others their default
            seq = 128
        check_init("WholeModelPanel", "seq", seq, lo=1, hi=2**20)
        get_gpu(gpu).peak_flops_per_s(dtype)  # one KitError naming what the GPU supports
        self._init = dict(model=resolve(model), gpu=get_gpu(gpu).key, mode=mode, batch=batch, seq=seq,
                          fusion=fusion, kv_cache=kv_cache, new_tokens=new_tokens, dtype=dtype)
        if mode == "generate" and not decodes(self._init["model"]):
            raise KitError(f"WholeModelPanel: mode generate needs a decoder-only model "
                           f"({', '.join(DECODERS)}); {self._init['model']} is not one")
        check_mode(self._init["model"], mode if mode != "generate" else "decode")
        check_seq(self._init["model"], seq, self._after(mode, new_tokens))
        self._wanted = {k: self._init[k] for k in ("mode", "seq", "dtype")}  # the reader's choices
        self.result = None
        super().__init__()

    def controls(self):
        i = self._init
        style = {"description_width": "initial"}
        self.model = W.Dropdown(options=zoo_names(), value=i["model"], description="model", style=style)
        self.gpu = W.Dropdown(options=gpu_keys(), value=i["gpu"], description="GPU", style=style)
        self.mode = W.ToggleButtons(options=self._modes(i["model"]), value=i["mode"],
                                    description="mode", style=style)
        self.batch = W.IntSlider(value=i["batch"], min=1, max=MAX_BATCH, description="batch",
                                 continuous_update=False, style=style)
        self.seq = W.Dropdown(options=self._seqs(i["model"], i["mode"], i["new_tokens"]), value=i["seq"],
                              description="seq", style=style, disabled=not uses_seq(i["model"]))
        self.fusion = W.ToggleButtons(options=list(FUSIONS), value=i["fusion"],
                                      description="fusion", style=style)
        self.kv_cache = W.ToggleButtons(options=list(KV_CACHES), value=i["kv_cache"],
                                        description="KV cache", style=style,
                                        disabled=i["mode"] not in DECODING)
        self.new_tokens = W.Dropdown(options=list(NEW_TOKENS), value=i["new_tokens"],
                                     description="new tokens", style=style,
                                     disabled=i["mode"] != "generate")
        self.dtype = W.ToggleButtons(options=self._dtypes(i["gpu"]), value=i["dtype"],
                                     description="dtype", style=style)
        return [self.model, self.gpu, self.mode, self.batch, self.seq, self.dtype, self.fusion,
                self.kv_cache, self.new_tokens]

    @staticmethod
    def _dtypes(gpu) -> list[str]:
        """PANEL_DTYPES that gpu has a peak for."""
        return [d for d in PANEL_DTYPES if d in get_gpu(gpu).dtypes]

    @staticmethod
    def _modes(model) -> list[str]:
        """decode and generate only for decoder-only models (kit.workload.zoo.decodes)."""
        return list(MODES) if decodes(model) else [m for m in MODES if m not in DECODING]

    @staticmethod
    def _after(mode, new_tokens) -> int:
        """Positions a prompt of seq tokens must leave free: one for a decode step's new token;
        generate's last step decodes at seq + new_tokens - 1 (kit.workload.generation)."""
        return {"decode": 1, "generate": new_tokens - 1}.get(mode, 0)

    def _seqs(self, model, mode, new_tokens) -> list[int]:
        """The sequence lengths offered: SEQS (and the one asked for) up to the model's learned
        position table, if it has one (kit.workload.zoo.max_seq), less the positions decoding
        needs after them (_after)."""
        limit = max_seq(model)
        if limit is not None:
            limit -= self._after(mode, new_tokens)
        return [s for s in sorted(set(SEQS) | {self._init["seq"]}) if limit is None or s <= limit]

    def refresh(self, change=None):
        """A model without a decode step narrows the modes, one with a shorter position table
        (BERT: 512) the seq choices, and a GPU without bf16 the dtypes, before the prediction.
        The reader's own choice of mode, seq and dtype is kept (self._wanted) and comes back
        as soon as a model or GPU offers it again."""
        if getattr(self, "_narrowing", False):
            return
        try:
            self._narrow(change)
        except Exception as e:  # outside Panel.refresh's guard: the same message in the panel
            self.show_failure(e)
            if not isinstance(e, KitError):
                raise
            return
        super().refresh(change)

    def _narrow(self, change):
        """refresh's narrowing of the modes, seqs and dtypes to what the model and GPU offer."""
        owner = change.get("owner") if isinstance(change, dict) else getattr(change, "owner", None)
        for name in self._wanted:
            if owner is getattr(self, name):
                self._wanted[name] = change["new"]
        modes = self._modes(self.model.value)
        mode = self._pick("mode", modes, "inference")
        seqs = self._seqs(self.model.value, mode, self.new_tokens.value)
        dtypes = self._dtypes(self.gpu.value)
        # the dtype follows the reader's choice and the GPU alone, never the control's value on
        # the way: bf16 asked for, then a P4 (fp32 only), then an RTX 2080 Ti had kept fp32 there
        # (10.10 ms a gpt2 pass) where going to it straight gave fp16 (5.91 ms)
        dtype = next((d for d in (self._wanted["dtype"], "fp16", "fp32") if d in dtypes), dtypes[0])
        choices = {"dtype": (dtypes, dtype),
                   "mode": (modes, mode), "seq": (seqs, self._closest_seq(seqs))}
        if any(list(getattr(self, n).options) != opts or getattr(self, n).value != value
               for n, (opts, value) in choices.items()):
            self._narrowing = True
            try:
                for name, (opts, value) in choices.items():
                    control = getattr(self, name)
                    if list(control.options) != opts:
                        control.options = opts
                    control.value = value
            finally:
                self._narrowing = False
        self.seq.disabled = not uses_seq(self.model.value)
        self.kv_cache.disabled = self.mode.value not in DECODING
        self.new_tokens.disabled = self.mode.value != "generate"

    def _closest_seq(self, seqs: list[int]) -> int:
        """The reader's seq where offered, else the longest offered below it (else the shortest).
        Not the control's value on the way: a reader's 2048 had shown gpt2 at 1024 straight from
        llama3-8b but at 512 by way of BERT (512 positions), two answers for one choice."""
        wanted = self._wanted["seq"]
        return max((s for s in seqs if s <= wanted), default=min(seqs))

    def _pick(self, name: str, options: list, fallback):
        """The reader's choice of control `name` where options hold it, else the control's
        current value, else fallback."""
        for value in (self._wanted[name], getattr(self, name).value):
            if value in options:
                return value
        return fallback

    def predict(self):
        """An Iteration (kit.workload.iteration) for one step or pass; for mode generate the
        dict of kit.api.predict_generation."""
        kv_cache = self.kv_cache.value if self.mode.value in DECODING else "static"
        if self.mode.value == "generate":
            self.result = predict_generation(self.model.value, self.gpu.value, batch=self.batch.value,
                                             prompt=self.seq.value, new_tokens=self.new_tokens.value,
                                             dtype=self.dtype.value, fusion=self.fusion.value,
                                             kv_cache=kv_cache)
            return self.result
        self.result = predict_model(self.model.value, self.gpu.value, mode=self.mode.value,
                                    batch=self.batch.value,
                                    seq=self.seq.value if uses_seq(self.model.value) else None,
                                    dtype=self.dtype.value, fusion=self.fusion.value,
                                    kv_cache=kv_cache)
        return self.result

    def make_chart(self):
        it = self.predict()
        if self.mode.value == "generate":
            return self._generation_chart(it)
        t = it.timeline
        by = (t.groupby(["op_class", "phase"], sort=False)["latency_ms"].sum().reset_index()
              .rename(columns={"latency_ms": "ms"}).round(6))
        breakdown = alt.Chart(by).mark_bar().encode(
            x=alt.X("ms:Q", title="GPU time (ms)"),
            y=alt.Y("op_class:N", sort="-x", title="op class"),
            color=alt.Color("phase:N", title="phase"),
            tooltip=["op_class:N", "phase:N", alt.Tooltip("ms:Q", format=".3f")],
        ).properties(width=300, height=220, title="where the time goes")
        bars = timeline_bars(t).round(6)
        timeline = alt.Chart(bars).mark_bar().encode(
            x=alt.X("start_ms:Q", title="time (ms)"), x2="end_ms:Q",
            y=alt.Y("track:N", title=None, sort=["CPU issue", "GPU"]),
            color=alt.Color("phase:N", title="phase"),
            tooltip=["track:N", "phase:N", "part:N", alt.Tooltip("start_ms:Q", format=".3f"),
                     alt.Tooltip("end_ms:Q", format=".3f")],
        ).properties(width=420, height=120, title="timeline (one bar per layer)")
        return alt.hconcat(breakdown, timeline).resolve_scale(color="shared")

    @staticmethod
    def _generation_chart(r: dict):
        """Prefill against decode (GPU work and the GPU waiting on the CPU), and the decode step's
        time at the contexts kit predicted it at."""
        parts = []
        for part, total, busy in (("prefill (first token)", r["ttft_ms"], r["prefill"]["kernel_ms"]),
                                  (f"decode ({r['new_tokens'] - 1} tokens)", r["decode_ms"],
                                   r["decode_kernel_ms"])):
            parts += [{"part": part, "GPU": "busy", "ms": busy},
                      {"part": part, "GPU": "waiting on the CPU", "ms": max(total - busy, 0.0)}]
        split = alt.Chart(pd.DataFrame(parts).round(6)).mark_bar().encode(
            x=alt.X("ms:Q", title="time (ms)", stack="zero"),
            y=alt.Y("part:N", title=None, sort=None),
            color=alt.Color("GPU:N", title="GPU"),
            tooltip=["part:N", "GPU:N", alt.Tooltip("ms:Q", format=".3f")],
        ).properties(width=300, height=120, title="where a generation's time goes")
        steps = pd.DataFrame([{"tokens in cache": s["context"], "ms": s["ms"]}
                              for s in r["decode_steps"]]).round(6)
        line = alt.Chart(steps).mark_line(point=True).encode(
            x=alt.X("tokens in cache:Q", scale=alt.Scale(zero=False)),
            y=alt.Y("ms:Q", title="decode step (ms)", scale=alt.Scale(zero=False)),
            tooltip=["tokens in cache:Q", alt.Tooltip("ms:Q", format=".3f")],
        ).properties(width=300, height=120, title="one decode step as the cache grows")
        return alt.hconcat(split, line).resolve_scale(color="independent")

    def _generation_summary(self) -> str:
        r, gpu = self.result, get_gpu(self.result["gpu"])
        need = r["memory"]["total_bytes"]
        fit = ("" if r["memory"]["fits"] else
               f"; <b>does not fit</b>: needs about {need / 2**30:,.1f} GiB (weights, activations, "
               f"KV cache), {gpu.key} has {gpu.memory_text()}")
        tpot = (f", then <b>{r['tpot_ms']:.2f} ms</b> a token (TPOT) for {r['new_tokens'] - 1} more"
                if r["tpot_ms"] is not None else "")
        return (f"first token after <b>{r['ttft_ms']:.2f} ms</b> (TTFT){tpot}; "
                f"{r['total_ms']:.1f} ms for {r['new_tokens']} tokens a sequence, "
                f"{r['tokens_per_s']:,.0f} tokens/s over the batch, {r['kv_cache']} KV cache; "
                f"{r['dtype']}, predictor {r['predictor']}{fit}")

    def summary_text(self):
        if self.mode.value == "generate":
            return self._generation_summary()
        it = self.result
        phases = ", ".join(f"{k} {v:.2f} ms" for k, v in it.phases_ms.items())
        idle = max(it.gpu_idle_ms, 0.0)
        bound = "CPU-bound (GPU idles waiting for launches)" if idle > 0.1 * it.total_ms else "GPU-bound"
        need = memory_bytes(SimpleNamespace(meta=it.meta))["total_bytes"]  # reads graph.meta only
        gpu = get_gpu(it.gpu)
        fit = ("" if need <= gpu.usable_memory_bytes else  # a T4 with ECC on: 15 of 16 GiB
               f"; <b>does not fit</b>: needs about {need / 2**30:,.1f} GiB (weights"
               f"{', gradients, AdamW state' if it.mode == 'train' else ''}, activations"
               f"{', KV cache' if it.mode == 'decode' else ''}), "
               f"{gpu.key} has {gpu.memory_text()}")
        per = {"train": "step", "inference": "pass"}.get(it.mode, "token step")
        tokens = (f"; {it.tokens_per_s:,.0f} tokens/s over the batch, "
                  f"{it.meta.get('kv_cache', 'static')} KV cache" if it.mode == "decode" else "")
        return (f"<b>{it.total_ms:.2f} ms</b> per {per}{tokens} "
                f"({phases}); {int(it.timeline['kernels'].sum())} kernels, GPU idle {idle:.2f} ms: "
                f"{bound}; {self.dtype.value}, predictor {it.predictor}{fit}")
