"""Writes notebooks/03_whole_models.ipynb, outputs cleared (nbval runs it:
`.venv/bin/python -m pytest --nbval-lax --nbval-current-env notebooks/03_whole_models.ipynb`)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from build_embedding_notebooks import code, md, write  # noqa: E402  (shared notebook helpers)


CELLS = [
    md(r"""
# 03 · Whole models: a training step and an inference pass, predicted

**Who it is for:** anyone choosing a GPU for a model, or asking why a step takes as long as it does.
**Time:** about 15 minutes. **Needs:** nothing but the kit (no GPU, no downloads).

The kit runs the model on **meta tensors**: tensors with shapes and dtypes but no memory. A
`TorchDispatchMode` records every aten op on the way, forward and backward, into an **op graph**.
Each op becomes a kit op (a GEMM, an attention, an elementwise pass, a norm...) that a predictor
costs on the GPU you name. A 175-billion-parameter model captures on a laptop.
"""),
    code("""
import torch
torch.set_num_threads(1)
import pandas as pd
from kit.api import predict_model
from kit.workload.zoo import build, config, graph_for, zoo_names
from kit.workload.iteration import isolation_floor_ms, iteration
from kit.hardware import get_gpu
from kit.predict import get_predictor
from kit.workload.fusion import apply_fusion
from kit.cli.cmd_compare import compare
zoo_names()
"""),
    md(r"""
## 1. What a forward pass costs in FLOPs

A GPT layer has four linear layers on $T = b\cdot s$ tokens of width $d$: the QKV projection
($d\to 3d$), the output projection ($d\to d$) and the MLP ($d\to 4d\to d$): $12d^2$ weights, so
$2\cdot T\cdot 12 d^2$ FLOPs. Attention adds two batched matmuls, $QK^\top$ and $PV$, each
$2\cdot b\cdot s^2\cdot d$ FLOPs. The LM head is $2\cdot T\cdot d\cdot V$:

$$F_{\text{fwd}} = L\,(24\,T d^2 + 4\,b s^2 d) + 2\,T d V.$$

Constants for GPT-2 small: $L = 12$ layers, $d = 768$, $V = 50257$ tokens.
"""),
    code("""
b, s = 1, 128
g = graph_for("gpt2", batch=b, seq=s, mode="train")
c = config("gpt2")
L, d, V, T = c["n_layer"], c["n_embd"], c["vocab_size"], b * s
fwd = sum(n.op.flops for n in g.by_phase("fwd") if n.op_class == "gemm")
bwd = sum(n.op.flops for n in g.by_phase("bwd") if n.op_class == "gemm")
by_hand = L * (24 * T * d**2 + 4 * b * s**2 * d) + 2 * T * d * V
assert fwd == by_hand
print(f"forward GEMM work {fwd / 1e9:.2f} GFLOP; backward {bwd / fwd:.1f}x the forward")
assert bwd == 2 * fwd   # every matmul has two gradients (input and weight), each as big
pd.Series(g.op_classes()).rename("kernels").to_frame()
"""),
    md(r"""
**Takeaway:** the backward pass does exactly twice the forward's matmul work, so a training step
is about three forward passes of GEMMs, plus the memory-bound ops around them.

## 2. Kernels on a timeline: when the CPU is the bottleneck

The CPU issues ops one by one, each costing a dispatch time $c$ and a launch time per kernel; the
GPU runs kernels in order, never before they are issued:

$$\text{end}_i = \max(\text{end}_{i-1},\ \text{issue}_i) + d_i .$$

When the kernels are short (small batch), the GPU waits for the CPU: it **idles**. The wave model
gives a tiny kernel only its few microseconds of work. A learned predictor is trained on kernels
timed one at a time, where a short kernel's time is the dispatch floor $f$ (tens of µs); in a
model the kernels queue back to back and the host's share is this timeline, so the kit runs each
kernel for its isolated prediction less that floor, never below its roofline plus the start $s$
every grid pays to launch and drain (2 µs, what the shortest kernels of real traces take):

$$d_i = \max\big(d_i^{\text{isolated}} - f,\ \min(\text{roofline}_i + s,\ d_i^{\text{isolated}})\big).$$

The start adds to the bytes' time rather than standing beside it: on the project's H200, vectorised
elementwise kernels of 3-20 µs ran 1.6-1.8x their bare roofline (the cell below reads one sweep).
"""),
    code("""
import kit
import numpy as np
from pathlib import Path
from kit.data.records import load_measurements
from kit.workload.kernel_times import KERNEL_MIN_US
here = [Path("../measurements"), Path(kit.__file__).resolve().parents[1] / "measurements"]


def measured(*parts):
    \"\"\"A file of the repository's measurements folder, or None (an installed kit without it).\"\"\"
    return next((p.joinpath(*parts) for p in here if p.joinpath(*parts).exists()), None)


vec = measured("h200-2026-12-04", "session", "vector_bf16.csv.gz")
if vec is None:
    print("the measurements folder is not here (an installed kit without the repository)")
else:
    from kit.predict.roofline import roofline
    from kit.ops import Elementwise
    v = load_measurements(vec)
    v = v[v.op.isin(["add", "mul", "div", "relu", "tanh"]) & (v.kernel_ms > 0.003) & (v.kernel_ms < 0.02)]
    roof = np.array([roofline(Elementwise(r.op, int(r.rows * r.cols), "bf16",
                                          inputs=2 if r.op in ("add", "mul", "div") else 1), "h200").time_ms
                     for r in v.itertuples()])
    bare, start = v.kernel_ms / roof, v.kernel_ms / (roof + KERNEL_MIN_US / 1e3)
    print(f"{len(v)} bf16 kernels of 3-20 us: measured / roofline {np.median(bare):.2f} (median), "
          f"measured / (roofline + {KERNEL_MIN_US:.0f} us) {np.median(start):.2f}")
    assert np.median(bare) > 1.3 and 0.8 < np.median(start) < 1.3
"""),
    code("""
small = predict_model("gpt2", "h100-sxm", mode="inference", batch=1, seq=32, predictor="wave")
large = predict_model("gpt2", "h100-sxm", mode="inference", batch=16, seq=512, predictor="wave")
for name, it in (("batch 1, seq 32", small), ("batch 16, seq 512", large)):
    print(f"{name:>18}: {it.total_ms:7.2f} ms, GPU busy {it.kernel_ms:7.2f} ms, idle {max(it.gpu_idle_ms, 0):6.2f} ms")
assert small.gpu_idle_ms / small.total_ms > 0.3          # launch-bound
assert large.gpu_idle_ms / large.total_ms < 0.05         # GPU-bound
auto = predict_model("gpt2", "h100-sxm", mode="inference", batch=1, seq=32)
print(f"with the {auto.predictor} predictor: {auto.total_ms:.2f} ms, {auto.kernel_ms / len(auto.timeline) * 1e3:.1f} us per kernel")
assert auto.total_ms >= auto.cpu_ms                     # never faster than the CPU can issue
floor_us = 1e3 * isolation_floor_ms(get_predictor(auto.predictor), get_gpu("h100-sxm"))
print(f"the {auto.predictor} predictor's isolated-kernel floor on h100-sxm: {floor_us:.1f} us")
assert auto.predictor in ("wave", "roofline") or 1 < floor_us < 100
"""),
    md(r"""
**Takeaway:** for small shapes the step time is the CPU's, not the GPU's: a faster GPU does not
help, fewer launches (fusion, CUDA graphs, bigger batches) do.

## 3. Breakdown and the top kernels
"""),
    code("""
it = predict_model("gpt2", "a100-pcie-40gb", mode="train", batch=4, seq=256)
print(f"{it.total_ms:.1f} ms per step: " + ", ".join(f"{k} {v:.1f} ms" for k, v in it.phases_ms.items()))
it.by_class().round(3)
"""),
    code("""
it.top_kernels()[["where", "aten", "phase", "count", "ms"]].round(3)
"""),
    md(r"""
## 4. Eager versus compiled: bytes that never leave the chip

In eager mode every elementwise op reads its inputs from DRAM and writes its output back. A
compiler fuses a chain of them into one kernel that moves only the chain's **external** inputs
and outputs. For the tanh-GELU of GPT-2 (eight elementwise ops on a $T\times 4d$ tensor of fp32):

$$\text{eager} \approx 8 \times 2 \times 4\,T\cdot 4d\ \text{bytes},\qquad
\text{fused} = \underbrace{4\,T\cdot 4d}_{\text{read}} + \underbrace{4\,T\cdot 4d}_{\text{write}}.$$
"""),
    code("""
gi = graph_for("gpt2", batch=1, seq=128, mode="inference")
fused = apply_fusion(gi, "compiled")
gelu = [n for n in fused if n.op_class == "fused" and "tanh" in n.aten][0]
elems = 1 * 128 * 4 * 768
print(gelu.aten, f"moves {gelu.op.bytes / 2**20:.2f} MiB")
assert gelu.op.bytes == 2 * 4 * elems                     # one read and one write of T x 4d fp32
eager_ms = iteration(gi, "a100-pcie-40gb", fusion="eager").total_ms
compiled_ms = iteration(gi, "a100-pcie-40gb", fusion="compiled").total_ms
print(f"eager {eager_ms:.2f} ms, compiled {compiled_ms:.2f} ms")
assert compiled_ms < eager_ms
"""),
    md(r"""
## 5. Choosing hardware

`kit compare` predicts one model on many GPUs: step time, throughput, whether weights, gradients,
AdamW state and activations fit, energy at TDP, and, with **your** prices per GPU-hour, the cost
per million tokens ($/h ÷ 3600 × step seconds ÷ tokens per step × 10⁶). The kit has no built-in
prices: a GPU without one shows "no price".
"""),
    code("""
r = compare("gpt2", ["t4", "l4", "a100-pcie-40gb", "h100-sxm"], mode="train", batch=4, seq=256,
            prices={"t4": 0.35, "h100-sxm": 2.50})      # example prices in $/GPU-hour, not data
table = pd.DataFrame(r["rows"])[["gpu", "step_ms", "tokens_per_s", "fits", "energy_j_per_step",
                                 "cost_per_m_tokens"]]
for row in r["rows"]:
    assert abs(row["tokens_per_s"] - 4 * 256 / (row["step_ms"] / 1e3)) < 1e-6 * row["tokens_per_s"]
assert table.set_index("gpu").loc["h100-sxm", "step_ms"] < table.set_index("gpu").loc["t4", "step_ms"]
t4 = table.set_index("gpu").loc["t4"]
assert abs(t4.cost_per_m_tokens - 0.35 / 3600 * t4.step_ms / 1e3 / (4 * 256) * 1e6) < 1e-12
shown = table.round(3)
shown["cost_per_m_tokens"] = [f"{v:.3f}" if pd.notna(v) else "no price" for v in shown.cost_per_m_tokens]
shown
"""),
    md(r"""
**Memory.** Weights alone of GPT-3 175B in fp16 are $2\cdot 175\times 10^9$ bytes = 350 GB: more
than any single GPU, so it needs the multi-GPU strategies of notebook 06.
"""),
    code("""
params = sum(p.numel() for p in build("gpt3-175b").parameters())   # built on meta: no memory used
print(f"GPT-3 175B: {params / 1e9:.1f} B parameters, {2 * params / 1e9:.0f} GB of fp16 weights")
assert 174e9 < params < 176e9 and 2 * params > 80 * 2**30
"""),
    md(r"""
## 5b. Convolutional models

A CNN goes through the same capture. A convolution is an implicit GEMM (M = batch x output pixels,
N = output channels, K = input channels x kernel pixels); a plain 3x3 stride-1 one may also run
as Winograd F(4x4, 3x3), 36 small GEMMs with a quarter of the multiplies plus three transforms,
and, as cuDNN picks an algorithm, the kit costs whichever its predictor finds faster in the
stream (the backward's two gradients too: cuDNN has Winograd algorithms for each). Batch norm
and pooling move bytes and barely compute, so they are memory-bound kernels.
"""),
    code("""
from kit.workload.kernels import Cheapest
from kit.workload.iteration import isolated_latencies
r50 = graph_for("resnet50", batch=32, mode="inference")
convs = [n for n in r50.kernels() if n.name() == "convolution"]
choices = [n for n in convs if isinstance(n.op, Cheapest)]
tile = get_predictor("tile")
op = choices[-1].op                      # a 3x3 conv of the last stage
each = [isolated_latencies([o], "a100-pcie-80gb", tile)[0, 0] for o in op.options]
assert isolated_latencies([op], "a100-pcie-80gb", tile)[0, 0] == min(each)
print(f"{len(convs)} convolutions, {len(choices)} of them 3x3 stride 1; the last one: implicit GEMM "
      f"{each[0]:.3f} ms, Winograd {each[1]:.3f} ms")
cnn = predict_model("resnet50", "a100-pcie-80gb", mode="train", batch=32)
assert cnn.phases_ms["bwd"] > cnn.phases_ms["fwd"]
cnn.by_class().round(3)
"""),
    md(r"""
**Accuracy.** `benchmarks/conv_model.py` scores this costing against NeuSight's 24,662 measured
conv rows (all 3x3, stride 1; no predictor was trained on them): 30-49% MAPE on the five GPUs,
against 40-198% with the implicit GEMM alone, since cuDNN ran Winograd in most of them.
Convolution backward and the other kernel sizes have no measurements to check against.
"""),
    md(r"""
## 5c. Recurrent models: capture what the GPU runs

On meta tensors PyTorch runs an `nn.LSTM` as its CPU code does: about a dozen small ops per
time step. A GPU runs it through cuDNN (Appleyard et al., 2016): per layer, **one** GEMM of the
input by $W_{ih}$ for all $T$ steps at once ($T\cdot B$ rows), then per step one recurrent GEMM
$h_{t-1} W_{hh}^T$ ($B$ rows) and one fused kernel for the gates: $1 + 2T$ kernels a layer. The
capture records that schedule (`kit/workload/rnn.py`), so a small-batch LSTM is costed as the
launch-bound chain of tiny GEMMs it is on a GPU, not as five times as many kernels.
"""),
    code("""
import torch.nn as nn
from kit.workload.capture import capture
T, B, layers = 64, 8, 2
lstm = nn.LSTM(256, 512, num_layers=layers, batch_first=True)
x = torch.zeros(B, T, 256)
(rnn_node,) = [n for n in capture(lstm, (x,), mode="inference").kernels() if n.op_class == "rnn"]
assert rnn_node.kernels == layers * (1 + 2 * T)
it = predict_model(lstm, "a100-pcie-80gb", mode="inference", inputs=(x,))
print(f"{rnn_node.name()}: {rnn_node.kernels} kernels, {it.total_ms:.2f} ms on an A100-80GB "
      f"({it.kernel_ms / rnn_node.kernels * 1e3:.0f} us a kernel: far from any roofline)")
"""),
    md(r"""
## 5d. Generating tokens: one decode step with a KV cache

A decoder generates text one token at a time. Each step reads **one** new token per sequence:
every weight GEMM has $m = $ batch rows, so it is a matrix-vector product that reads the whole
weight matrix from DRAM for a handful of FLOPs. Attention reads the keys and values of every
earlier token from the **KV cache**, $2 \cdot L \cdot B \cdot h_{kv} \cdot T \cdot d$ elements.
`mode="decode"` (CLI: `--mode decode`, with `--seq` the tokens already in the cache) captures that
step with a static cache written in place (`kit/workload/kv_cache.py`), masked over its whole
preallocated length as HF's `generate` masks a static cache at every step, so that attention runs
the memory-efficient kernel on that mask rather than flash attention (`kit/workload/hf_masks.py`).

**Takeaway:** a decode step is bounded by bytes (weights plus cache), not FLOPs, and in eager
PyTorch its hundreds of tiny kernels often leave the GPU waiting on the CPU.
"""),
    code("""
gpu = get_gpu("h100-sxm")
step = predict_model("llama3-8b", gpu, mode="decode", batch=8, seq=4096, dtype="bf16")
cache_gib = step.meta["kv_cache_bytes"] / 2**30
weights_ms = step.meta["param_bytes"] / gpu.mem_bw_bytes_per_s * 1e3
assert step.meta["kv_cache_bytes"] == 2 * 32 * 8 * 8 * 4097 * 128 * 2  # K and V, 32 layers, bf16
assert step.kernel_ms >= weights_ms  # every weight is read once a step
print(f"llama3-8b, 8 sequences at 4,096 tokens of context on an H100: {step.total_ms:.1f} ms a step, "
      f"{8 / step.total_ms * 1e3:.0f} tokens/s; KV cache {cache_gib:.2f} GiB; the weights alone take "
      f"{weights_ms:.1f} ms at the memory roofline; GPU idle {max(step.gpu_idle_ms, 0):.1f} ms")
"""),
    md(r"""
In eager PyTorch the CPU issues each of those ~1,530 kernels one by one, and the GPU waits for it.
`torch.compile(mode="reduce-overhead")` fuses the elementwise chains and replays the step as one
**CUDA graph**: `fusion="compiled"` with the `CUDA_GRAPH` host cost (CLI: `--fusion compiled
--cuda-graphs`) leaves only the kernels' own times, none shorter than the 2 µs that real traces
show for the smallest kernels.
"""),
    code("""
from kit.workload.iteration import CUDA_GRAPH
graphed = predict_model("llama3-8b", gpu, mode="decode", batch=8, seq=4096, dtype="bf16",
                        fusion="compiled", overhead=CUDA_GRAPH)
assert graphed.cpu_ms == 0 and graphed.total_ms < step.total_ms
print(f"eager {step.total_ms:.1f} ms a step (GPU idle {max(step.gpu_idle_ms, 0):.1f} ms); "
      f"compiled + CUDA graph {graphed.total_ms:.1f} ms, all of it GPU work")
"""),
    md(r"""
A whole answer is the prompt's **prefill** (one forward pass over it, which yields the first
token: the time to first token, TTFT; only the last position's logits are computed, as HF's
`generate` does) and then one decode step per further token, each with one more token in the
cache. `predict_generation` (CLI: `--mode generate --new-tokens N`) sums the
steps from decode steps predicted at five contexts and interpolated between them. Each pass
carries the GPU work HF's greedy `generate` runs around the model (input slices, position ids,
the last logits copied to FP32, argmax, the stopping criteria: 24 small kernels a decode step),
and each step ends at HF's stop check, a host read that waits for the GPU to drain. Over a
static cache, HF 5.25's `generate` compiles the decode steps by default (torch.compile, mode
reduce-overhead: CUDA graphs) and runs the prefill as it is; so the steps are priced compiled
under CUDA graphs, the prefill as asked (eager here), and the result says how (`priced`).
`disable_compile=True` (CLI `--disable-compile`), HF's flag, prices the steps as asked too.
"""),
    code("""
from kit.api import predict_generation
gen = predict_generation("llama3-8b", gpu, batch=8, prompt=1024, new_tokens=256, dtype="bf16")
assert abs(gen["total_ms"] - gen["ttft_ms"] - 255 * gen["tpot_ms"]) < 1e-6 * gen["total_ms"]
assert gen["ttft_ms"] > gen["tpot_ms"]  # one token after the prompt costs less than the prompt
print(f"TTFT {gen['ttft_ms']:.0f} ms, then {gen['tpot_ms']:.1f} ms a token: "
      f"{gen['total_ms'] / 1e3:.2f} s for 256 tokens x 8 sequences ({gen['tokens_per_s']:.0f} tokens/s)")
print({name: (p["fusion"], "CUDA graphs" if p["cuda_graphs"] else "host launches")
       for name, p in gen["priced"].items()})
"""),
    md(r"""
On a Hopper GPU in bf16 the weight GEMMs of a decode step ($m \le 16$: matrix-vector products in
all but name) take the measured tensor-core curve (`kit.predict.tensor_core`, fitted on the
project's own H200 sweeps, decode shapes among them), with its 2.9 us floor; the step's GPU work
came within 9-14% of the kernel time measured on the H200 (docs/accuracy.md, "Decode steps"). On NVIDIA's
other tensor-core GPUs the same curve is carried over as a share of each GPU's own peak, with a
wider band; FP32 and TF32 GEMVs take the streaming GEMV model (`kit.predict.gemv`). No 16-bit
decode GEMM off Hopper has been measured: treat those GEMM times as the least certain part of
the step. How much of a step rests on such a carried curve is part of every prediction
(`carried_ms`; `kit predict`'s `carried` line, `kit compare`'s `carried` column):
"""),
    code("""
for g in ("h100-sxm", "a100-sxm4-80gb"):
    it = predict_model("llama3-8b", g, mode="decode", batch=8, seq=1024, dtype="bf16")
    assert 0 <= it.carried_share <= 1
    print(f"{g}: {it.total_ms:.1f} ms a step, {100 * it.carried_share:.0f}% of its kernel "
          "time on a curve carried to it from the H200")
assert sum(predict_model("llama3-8b", "h100-sxm", mode="decode", batch=8, seq=1024,
                         dtype="bf16").meta["carried_ms"].values()) == 0  # Hopper: measured
"""),
    md(r"""
## 5e. Families that change the decode step: sliding windows and experts

Decoders differ in more than their sizes (`kit models` lists the zoo). Two changes matter most
for a decode step. **Sliding-window layers** keep only the last $W$ tokens in the cache (Gemma 2
on every other layer, Gemma 3 on five in six, Mistral on all), so past $W$ tokens of context their
cache and their attention stop growing. **Mixture-of-experts layers** hold many experts, but one
decode step runs only those its tokens pick: at most batch $\times$ top-$k$ of them, each with the
weights of one small MLP. How it runs them is the library's choice: Hugging Face transformers 5
runs a prefill's experts as one grouped GEMM, and its `generate` switches a decode step to
`batched_mm`, which gathers a copy of the expert's weights for every (token, expert) pair.

**Takeaway:** parameter count alone does not set a decode step's cost; how many weights and
cached tokens the step actually reads does.
"""),
    code("""
from kit.workload import zoo
rows = []
for name in ("llama3-8b", "gemma2-9b", "gemma3-1b", "qwen3-30b-a3b"):
    cfg = zoo.config(name)
    it = predict_model(name, gpu, mode="decode", batch=8, seq=8192, dtype="bf16")
    full = (predict_model({**cfg, "sliding_window": None, "name": name + " (no window)"}, gpu,
                          mode="decode", batch=8, seq=8192, dtype="bf16")
            if cfg.get("sliding_window") else it)
    rows.append({"model": name, "params (B)": round(it.meta["params"] / 1e9, 2),
                 "KV cache (GiB)": round(it.meta["kv_cache_bytes"] / 2**30, 2),
                 "without its window (GiB)": round(full.meta["kv_cache_bytes"] / 2**30, 2),
                 "GPU work (ms)": round(it.kernel_ms, 1), "step (ms)": round(it.total_ms, 1)})
table = pd.DataFrame(rows).set_index("model")
assert (table["KV cache (GiB)"] <= table["without its window (GiB)"]).all()
assert table.loc["gemma3-1b", "KV cache (GiB)"] < table.loc["gemma3-1b", "without its window (GiB)"] / 3
moe = predict_model("qwen3-30b-a3b", gpu, mode="decode", batch=8, seq=8192, dtype="bf16")
top = moe.top_kernels(2)
assert top["where"].str.endswith("mlp.experts").all()  # the expert gathers and their GEMVs lead
display(table, top[["where", "aten", "count", "ms", "shapes"]])
"""),
    md(r"""
Two rows cost more than their bytes suggest, and both follow HF's eager code. Gemma 2 soft-caps
its attention scores, so HF runs attention by hand and first repeats each key/value head for the
query heads it serves: a copy of the whole cache, every layer, every step. Qwen3-30B-A3B's 8
sequences pick 8 experts each, 64 (token, expert) pairs a layer, and `batched_mm` gathers a copy
of the chosen expert's weights for each pair, then reads the copies again in a batch of
matrix-vector products: the gathers are the step's largest kernels. Serving engines fuse both away (flash attention with soft-capping, fused MoE
kernels that read each expert once).
"""),
    md(r"""
## 6. A trace you can open

`kit predict MODEL --gpu NAME --trace out.json` (or `it.to_trace()`) writes the predicted
timeline as Chrome trace events: a CPU-issue track and a GPU-stream track, for ui.perfetto.dev.
"""),
    code("""
trace = small.to_trace()
kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
assert abs(sum(e["dur"] for e in kernels) / 1e3 - small.kernel_ms) < 1e-3 * small.kernel_ms
len(kernels)
"""),
    md(r"""
## 7. The panel

Pick a model, a GPU, the mode, the batch, the sequence length and the dtype (the ones the GPU
supports): the bars show where the GPU time
goes, the timeline shows the CPU issuing each layer against the GPU running it. For a decoder,
mode `decode` is one token step with the KV cache kind of your choice, and mode `generate` answers
a `seq`-token prompt with `new tokens` tokens: the prefill (TTFT) against the decode steps, and
how one step's time grows with the cache.
"""),
    code("""
from widgets.whole_model import WholeModelPanel
panel = WholeModelPanel(model="gpt2", gpu="a100-pcie-40gb", mode="train", batch=2, seq=128)
assert {r["track"] for r in panel.chart_data() if "track" in r} == {"CPU issue", "GPU"}
panel
"""),
    md(r"""
**Accuracy.** `kit validate --labels $KIT_DATA/label` predicts every NeuSight
whole-model measurement; `benchmarks/whole_model.py` prints the errors as JSON. How close it gets
depends on the kernel predictor behind `"auto"` (notebook 02): `benchmarks/whole_model_nodes.py`
puts NeuSight's per-node labels beside the kit's kernels, class by class, and shows that the GEMMs
carry most of what is left.

**Were the labels and the kernel data measured in the same state?** NeuSight timed every node of
a one-layer model on its own, so its GEMM nodes can be set beside the op-level measurements of
the very same shapes on the same GPU (the rows notebook 02 scores the tile predictor on). On
the A100 80GB, P100, T4 and V100 they agree to within 5%. On L4 the model's GEMMs run about a
third faster than the same shapes in its kernel data, and on the A100 40GB and P4 they run
slower (by about 16% and 47%): the two were timed with the GPU in different states (clocks,
power cap). No kernel predictor can match both, which bounds how well those GPUs' whole-model
labels can be predicted from kernel measurements.
"""),
    code("""
from kit.errors import KitError
try:
    from kit.data import label_gemm_nodes, label_kernel_pairs, load_label_nodes
    from kit.predict.evaluate import load_neusight_test
    nodes = label_gemm_nodes(load_label_nodes())
    kernels = load_neusight_test()
    HAVE_DATA = True
except KitError as e:
    HAVE_DATA = False
    print("no measured data:", e)
if HAVE_DATA:
    both = label_kernel_pairs(nodes, kernels)  # nodes over 0.2 ms, long enough to time well
    ratio = both.groupby("gpu").ratio.median()
    display(ratio.round(2).rename("label node / kernel data, same shape (median)").to_frame())
    assert ratio["l4"] < 0.8 and ratio["p4"] > 1.3 and 1.1 < ratio["a100-pcie-40gb"] < 1.25
    assert all(abs(ratio[g] - 1) <= 0.05 for g in ("a100-pcie-80gb", "p100-pcie-16gb", "t4",
                                                  "v100-pcie-32gb"))
"""),
    md(r"""
## What a real GPU showed: an H200

The project measured its own runs on an NVIDIA H200, a GPU no reference dataset has
(`measurements/h200-2026-12-04` and `-b`, with their provenance; `benchmarks/h200_measured.py`
scores the kit on all 60 whole-model rows). Here are GPT-2's, at batch 8 and 1,024 tokens: a training step
(forward, the LM loss, backward) and an inference pass, in fp32 and in bf16.

Two things the FP32 reference data never showed decided the bf16 rows.
* **Alignment.** GPT-2's vocabulary, 50,257, is odd. A 16-bit GEMM whose leading dimensions are
  not multiples of 8 elements (16 bytes) cannot use cuBLAS's Hopper kernels. It falls back to
  older tensor-op kernels, which reached only 13% of the peak there. The capture reads each GEMM's
  alignment off its operands' strides (`Gemm.align`). All three of the LM head's GEMMs are
  unaligned, the weight gradient's included.
* **PyTorch's generic elementwise loop.** A mask broadcast over the heads, a division by a 0-dim
  tensor and a permute's copy all run a kernel that computes every element's offsets. That kernel
  is limited by the elements it handles, not by the bytes it moves (`Elementwise.vectorized`).
"""),
    code("""
from dataclasses import replace
from kit.data.records import read_jsonl
steps = measured("h200-2026-12-04", "model_steps", "model_steps_1.jsonl")
if steps is None:
    print("the measurements folder is not here (an installed kit without the repository)")
else:
    rows = []
    for r in read_jsonl(steps):
        if r["model"] == "gpt2":
            it = predict_model("gpt2", "h200", mode=r["mode"], batch=r["batch"], seq=r["seq"], dtype=r["dtype"])
            rows.append({"dtype": r["dtype"], "mode": r["mode"], "measured ms": round(r["measured_ms"], 1),
                         "predicted ms": round(it.total_ms, 1),
                         "APE %": round(abs(it.total_ms - r["measured_ms"]) / r["measured_ms"] * 100, 1)})
    h200 = pd.DataFrame(rows)
    display(h200)
    assert len(h200) == 4 and (h200["APE %"] < 10).all()
"""),
    code("""
g16 = graph_for("gpt2", batch=8, seq=1024, mode="train", dtype="bf16")
head = [n.op for n in g16.nodes if n.op_class == "gemm" and 50257 in (n.op.m, n.op.n, n.op.k)]
assert len(head) == 3 and all(op.lead_align == 1 for op in head)
tile = get_predictor("tile")
odd = tile.predict(head, "h200").latency_ms.sum()
even = tile.predict([replace(op, align=8) for op in head], "h200").latency_ms.sum()
generic = [n for n in g16.nodes if n.op_class == "elementwise"
           and not getattr(getattr(n.op, "parts", [n.op])[0], "vectorized", True)]
print(f"LM head, 3 GEMMs: {odd:.1f} ms as they are, {even:.1f} ms were the vocabulary padded to 50,304")
print(f"{len(generic)} of {sum(n.op_class == 'elementwise' for n in g16.nodes)} elementwise kernels run the generic loop")
assert odd > 3 * even and len(generic) > 0
"""),
    md(r"""
### Tensor cores on Hopper: a measured curve

A second H200 session (`measurements/h200-2026-12-04-b`) timed aligned 16-bit GEMMs and fused
attention. The tile-MLP's utilisation, learned from FP32 SIMT kernels, did not carry over to the
H200's aligned bf16 GEMMs (cuBLAS's nvjet kernels, under a persistent tile scheduler): their
measured share of the roofline stays between about 0.55 and 0.82 whatever the shape. So on Hopper
such a GEMM's kernel time is a curve in its roofline time alone,
`max(a * roofline^beta, roofline / eff_max) + c0` (`kit.predict.tensor_core`, fitted by
`benchmarks/tensor_core_fit.py` on some sweeps and checked on others). Below, one sweep of 700
aligned bf16 Linear shapes, scored as `kit evaluate --target kernel` scores them: the measured
kernel time against the kit's time in the stream.
"""),
    code("""
import kit.viz  # noqa: F401  (charts render offline, as SVG)
import altair as alt
from kit.predict.evaluate import load_test, predict_rows, with_target
sweep = measured("h200-2026-12-04-b", "session", "aligned_linear_bf16.csv.gz")
if sweep is None:
    print("the measurements folder is not here (an installed kit without the repository)")
else:
    rows = with_target(load_test(sweep), "kernel")
    pred = predict_rows(rows, {"tile": tile}, in_stream=True).set_index("row").sort_index()
    rows["kit ms"] = pred.predicted_ms.to_numpy()
    big = rows[rows.kernel_ms >= 0.02]
    ape = (big["kit ms"] - big.kernel_ms).abs() / big.kernel_ms * 100
    print(f"{len(big)} of {len(rows)} GEMMs run over 20 us: MAPE {ape.mean():.1f}%, median {ape.median():.1f}%")
    assert ape.median() < 15
    display(alt.Chart(rows[["m", "n", "k", "kernel_ms", "kit ms"]]).mark_circle(size=18, opacity=0.6).encode(
        x=alt.X("kit ms", scale=alt.Scale(type="log")),
        y=alt.Y("kernel_ms", title="measured kernel ms", scale=alt.Scale(type="log")),
        tooltip=["m", "n", "k", "kernel_ms", "kit ms"]).properties(width=320, height=260))
"""),
]


def main():
    write("03_whole_models.ipynb", CELLS)


if __name__ == "__main__":
    main()
