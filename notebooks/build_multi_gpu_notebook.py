"""Writes notebooks/06_multi_gpu.ipynb (then run
`.venv/bin/jupyter nbconvert --to notebook --execute --inplace notebooks/06_multi_gpu.ipynb`)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from build_embedding_notebooks import code, md, write  # noqa: E402  (shared notebook helpers)


CELLS = [
    md(r"""
# 06 · Many GPUs: execution graphs, a simulator, parallel strategies and trace replay

**Who it is for:** anyone who has to say how long one training step takes on 8, 64 or 1,024 GPUs,
and *why*: which part is compute, which is communication, which is the host, and which is one
rank waiting for another. **Time:** about 20 minutes. **Needs:** the kit; section 7 replays a real
8-GPU trace from `../shared/data/traces` when it is there.

The kit composes what earlier notebooks predicted (kernels, collectives, launch overheads) into
**per-rank execution graphs**: a CPU thread that launches work, GPU streams that run it in order,
events between streams, host syncs, and collectives that no rank can start alone. A
discrete-event simulation turns the graphs into a **timeline**, and the chain of ops that set its
end is the **critical path**.
"""),
    code("""
import pandas as pd
from kit.sim import ExecGraph, simulate
from kit.parallel import GPTSpec, HostModel, Layout, memory_per_rank, parse_model, predict_parallel
from kit.parallel.schedule import bubble_fraction, in_flight
"""),
    md(r"""
## 1. The rule of the simulator

Every op waits for the op before it on its resource (a stream or the CPU thread) and for its
dependencies; a collective also waits for every member of its group:

$$t^{\text{start}}_{\text{op}} = \max\big(t^{\text{end}}_{\text{prev}},\ \max_{d\in\text{deps}} t^{\text{end}}_d\big),
\qquad t^{\text{start}}_{\text{coll}} = \max_{r\in\text{group}} t^{\text{ready}}_r .$$

Two ranks run 1 ms and 3 ms of compute, then all-reduce for 0.5 ms:
"""),
    code("""
g = ExecGraph()
for rank, work_ms in ((0, 1.0), (1, 3.0)):
    k = g.gpu(rank, "compute", work_ms, "forward", launch_ms=0.005)
    g.collective(rank, "comm", 0.5, "all-reduce", group="grads", deps=(k,))
res = simulate(g)
res.timeline()[["rank", "stream", "name", "kind", "start_ms", "end_ms"]]
"""),
    code("""
b0 = res.breakdown(0)   # rank 0's critical path, by cause
assert abs(b0["wait"] - 2.0) < 1e-9          # ready at 1.005 ms, the all-reduce starts at 3.005
assert abs(res.makespan_ms - 3.505) < 1e-9
{k: round(v, 3) for k, v in b0.items()}
"""),
    md(r"""
**Takeaway:** a fast rank does not finish early: it waits at the first collective, and the wait
shows up on its critical path as *waiting on another rank*.

## 2. Host-bound or GPU-bound

The CPU issues kernels one after another, $\ell$ ms each; the GPU runs them in order. $n$ kernels
of $k$ ms take

$$T \approx \max(n\,\ell + k,\ \ell + n\,k).$$
"""),
    code("""
def chain(n, launch_ms, kernel_ms):
    g = ExecGraph()
    for _ in range(n):
        g.gpu(0, "compute", kernel_ms, "k", launch_ms=launch_ms)
    return simulate(g)

cpu_bound, gpu_bound = chain(200, 0.010, 0.002), chain(200, 0.010, 0.050)
assert abs(cpu_bound.makespan_ms - (200 * 0.010 + 0.002)) < 1e-9
assert abs(gpu_bound.makespan_ms - (0.010 + 200 * 0.050)) < 1e-9
round(cpu_bound.breakdown(0)["cpu"], 3), round(gpu_bound.breakdown(0)["compute"], 3)
"""),
    md(r"""
**Takeaway:** below about 10 µs per kernel the host sets the pace, whatever the GPU. Small models
and small micro-batches are often host-bound; that is what the `megatron-a100` host profile
(fitted on vTrain's measurements) captures with its launch cost per kernel.

## 3. Pipelines: bubbles and in-flight micro-batches

With $p$ stages, $m$ micro-batches and per-stage pass times $t_f, t_b$, GPipe and 1F1B both take

$$T = (m + p - 1)(t_f + t_b), \qquad \text{bubble} = \frac{p-1}{m+p-1};$$

interleaving $v$ chunks per stage divides the bubble by $v$. When the stages are not equal, the
slowest one sets the pace: use its $t_f + t_b$. 1F1B holds only $p - s$ micro-batches of
activations on stage $s$; GPipe holds all $m$.
"""),
    code("""
# a small vocabulary keeps the first and last stages close to the others; the last one still
# carries the final norm, the LM head and the fp32 cross entropy, so it is the slowest
spec = GPTSpec(layers=16, hidden=2048, heads=16, seq=1024, vocab=1024, name="gpt-16x2048")
host = HostModel(launch_us=0.0, p2p_sync=False)   # pure GPU time, to compare with the formula
rows = []
for sched, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
    lay = Layout(pp=4, micro_batch=1, global_batch=8, schedule=sched, virtual_stages=v, dtype="bf16",
                 optimizer_step=False)   # forward and backward only, as in the formula
    r = predict_parallel(spec, "dgx-a100", lay, host=host)
    per_stage = {}
    for c in r["per_microbatch_ms"]:
        per_stage[c["stage"]] = per_stage.get(c["stage"], 0.0) + c["fwd_ms"] + c["bwd_ms"]
    stage = max(per_stage.values())   # the bottleneck stage's forward + backward of one micro-batch
    rows.append({"schedule": sched, "iteration_ms": r["iteration_ms"], "stage_pass_ms": stage,
                 "formula_ms": (8 + 3 / v) * stage, "bubble": bubble_fraction(sched, 4, 8, v),
                 "stage0_inflight": in_flight(sched, 0, 4, 8, v)})
pipes = pd.DataFrame(rows).round(3)
pipes
"""),
    code("""
for row in pipes.itertuples():   # the formula ignores the point-to-point sends (~64 µs each here)
    assert abs(row.iteration_ms - row.formula_ms) / row.formula_ms < 0.03, row
assert pipes.iteration_ms[2] < pipes.iteration_ms[1]                 # interleaving helps
assert list(pipes.stage0_inflight[:2]) == [8, 4]                      # GPipe holds all 8
"""),
    md(r"""
**Takeaway:** the schedule changes memory more than time: GPipe and 1F1B take the same time, but
1F1B keeps $p$ micro-batches alive instead of $m$. Interleaving buys time with more
point-to-point messages.

## 4. Data parallelism: gradient buckets overlap the backward pass

The all-reduce of $P$ gradients of $b$ bytes over $d$ ranks moves $2\frac{d-1}{d}Pb$ bytes per GPU.
Bucketed, it starts while the backward pass is still running, so only the last bucket is exposed.
"""),
    code("""
kw = dict(dp=8, micro_batch=4, global_batch=32, dtype="bf16")
serial = predict_parallel(spec, "dgx-a100", Layout(overlap_grad_reduce=False, **kw))
overlap = predict_parallel(spec, "dgx-a100", Layout(**kw))
assert overlap["iteration_ms"] < serial["iteration_ms"]
round(serial["iteration_ms"], 2), round(overlap["iteration_ms"], 2)
"""),
    md(r"""
## 5. Tensor parallelism and memory per rank

Megatron TP splits every GEMM $t$ ways and adds two all-reduces of the activations per layer and
pass. Memory per rank (ZeRO, Korthikanti et al. 2022): $2+4+12$ bytes of weights, gradients and
Adam state per parameter in bf16, whose gradients Megatron keeps in fp32 ($2+2+16$ in fp16,
whose optimizer steps an fp32 copy of the gradients: Megatron-LM's distributed-optimizer docs
count 18 and 20 B; ZeRO-1/2/3 shard the last, then the gradients, then the weights over DP), and per layer $sbh(10 + 24/t + 5as/(ht))$ bytes of activations, $34\,sbh/t$ with sequence
parallelism and selective recompute. ZeRO-2 and -3 are refused with pipeline parallelism
(DeepSpeed's pipeline engine asserts against them; Megatron's distributed optimizer is ZeRO-1),
so the ZeRO table spreads the same 1,024 GPUs as dp 128 x tp 8 in one stage.
"""),
    code("""
gpt3 = parse_model("gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200")
lay = Layout(dp=8, tp=8, pp=16, micro_batch=1, global_batch=1536, dtype="bf16",
             sequence_parallel=True, recompute="selective")
flat = lay.with_(dp=128, pp=1)  # ZeRO-2/3 need pp 1
mem = pd.DataFrame([{"zero": z, **memory_per_rank(gpt3, flat.with_(zero=z))[0]} for z in (0, 1, 2, 3)])
mem[["zero", "weights_gib", "grads_gib", "optimizer_gib", "activations_gib", "total_gib"]].round(2)
"""),
    code("""
m0 = memory_per_rank(gpt3, lay)[1]
assert abs(m0["optimizer_gib"] / m0["weights_gib"] - 6.0) < 1e-9          # 12 B vs 2 B per parameter
assert abs(m0["grads_gib"] / m0["weights_gib"] - 2.0) < 1e-9              # fp32 gradients, bf16 weights
per_layer_bytes = 34 * 2048 * 1 * 12288 / 8
assert abs(m0["activations_gib"] * 2**30 - per_layer_bytes * 6 * 15) < 1   # 6 layers, 15 in flight
assert mem.total_gib.is_monotonic_decreasing
"""),
    md(r"""
## 6. GPT-3 175B on 1,024 GPUs

Ranks of one stage run the same work, so the simulator runs one representative per stage: 16
ranks stand for 1,024.
"""),
    code("""
big = predict_parallel(gpt3, "dgx-h100", lay, nodes=128)
assert big["layout"]["world_size"] == 1024 and big["simulated_ranks"] == 16
assert 0.2 < big["mfu"] < 0.8
assert big["band_ms"][0] < big["iteration_ms"] < big["band_ms"][1]  # the kernels' p10-p90 band
{"iteration_s": round(big["iteration_ms"] / 1e3, 2), "MFU": round(big["mfu"], 3),
 "band_s": [round(v / 1e3, 2) for v in big["band_ms"]],
 **{k: round(v / 1e3, 2) for k, v in big["breakdown"].items() if k in ("compute", "communication", "cpu")}}
"""),
    md(r"""
**Takeaway:** at this scale the critical path is compute plus the TP all-reduces that cannot
overlap it; the pipeline bubble is $\frac{15}{192+15} \approx 7\%$. The band is the same
iteration with every kernel at the p10 (p90) end of its band, as `kit predict` does on one GPU;
the collectives keep their point prediction, so the band is narrower than the kernels' own.

## 7. Replaying a real trace: 8× V100 DLRM

`kit.trace` reads each rank's Kineto trace into an execution graph with the measured durations:
runtime calls and the CPU time between them, kernels on their streams, waits between streams,
host syncs, and NCCL kernels matched across ranks. Replaying it must give back each rank's
measured `ProfilerStep`; transferring it swaps the kernel times for another GPU's.
"""),
    code("""
import os
from pathlib import Path
from kit.trace import replay
TRACE = Path(os.environ.get("KIT_SHARED", "../../shared")) / "data/traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz"
if not TRACE.exists():
    TRACE = Path("../shared") / "data/traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz"
have_trace = TRACE.exists()
if have_trace:
    rep = replay(TRACE)
    d = rep.to_dict()
    table = pd.DataFrame(d["ranks"])[["rank", "measured_ms", "predicted_ms", "error_pct"]].round(2)
    assert table.error_pct.abs().max() < 3.0
    h100 = replay(TRACE, on="dgx-h100").to_dict()
    table["on_dgx_h100_ms"] = [round(x["predicted_ms"], 2) for x in h100["ranks"]]
table if have_trace else "trace not available"
"""),
    code("""
if have_trace:
    cp = d["critical_path"]
    assert cp["cpu"] > cp["compute"]            # this DLRM step is host-bound
    assert cp["wait"] > 1.0                     # ranks started up to 7.5 ms apart
    print({k: round(v, 2) for k, v in cp.items()})
"""),
    md(r"""
**Takeaway:** the ranks' steps differ by 7 ms not because some work more, but because they
*started* at different times and the first all-to-all lined them up. The step is host-bound, so
a faster GPU (H100) barely changes it: the fix is on the CPU side.

## 8. DLRM hybrid: one heavy rank stalls everybody

Tables are model-parallel, MLPs data-parallel; the all-to-all waits for the rank with the most
lookups.
"""),
    code("""
from kit.embedding import Table
from kit.parallel.dlrm import DLRMSpec, predict_dlrm
tables = tuple(Table(rows=500_000, dim=128, pooling=20) for _ in range(16))
dl = DLRMSpec(tables=tables)
even = predict_dlrm(dl, "dgx-a100", batch=2048)
skew = predict_dlrm(dl, "dgx-a100", batch=2048, placement=[0] * 9 + list(range(1, 8)))
assert skew["iteration_ms"] > even["iteration_ms"]
assert max(r["wait_ms"] for r in skew["ranks"]) > max(r["wait_ms"] for r in even["ranks"])
round(even["iteration_ms"], 3), round(skew["iteration_ms"], 3)
"""),
    md(r"""
## 9. Worked problems

**(a)** With $p = 8$ stages, how many micro-batches keep the 1F1B bubble under 10%?
$\frac{p-1}{m+p-1} < 0.1 \Rightarrow m > 63$.
"""),
    code("""
m = next(m for m in range(1, 1000) if bubble_fraction("1f1b", 8, m) < 0.10)
assert m == 64
m
"""),
    md(r"""
**(b)** The fitted `megatron-a100` profile charges every kernel a host launch cost. A layer's
forward issues $n_f$ kernels; with full recompute a micro-batch runs the forward twice and the
backward once ($n_b$ kernels), and each forward micro-batch costs the profile's `microbatch_ms`
outside the layers. What is the host floor of one micro-batch of a 12-layer GPT on one GPU?
$T_{host} = 12\,(2 n_f + n_b)\,t_{launch} + t_{mb}$, whatever the GPU.
"""),
    code("""
from kit.parallel.gpt import GPTSpec, backward_of, layer_forward
from kit.parallel.profiles import get_profile
prof = get_profile("megatron-a100")
layer = layer_forward(GPTSpec(layers=12, hidden=1024, heads=16, seq=1024, attention="unfused"),
                      1, 1, 1, False, "fp16")
n_f = sum(len(b.ops) for b in layer)
n_b = sum(len(backward_of(b).ops) for b in layer)
floor_ms = 12 * (2 * n_f + n_b) * prof.launch_us / 1e3 + prof.microbatch_ms
assert n_b > n_f                      # every GEMM has two backward GEMMs
assert floor_ms > 12 * 3 * n_f * prof.launch_us / 1e3
{"kernels fwd": n_f, "kernels bwd": n_b, "launch_us": round(prof.launch_us, 1),
 "host floor ms": round(floor_ms, 1)}
"""),
    md(r"""
## 10. The panel

Pick a system and a layout; the Gantt chart shows one representative rank per pipeline stage,
its CPU thread, its "launch race" lane (how long the host's launches and the kernels, racing
each other, hold a pass: the host thread itself is free to run ahead) and its streams, with the
critical path underlined in black.
"""),
    code("""
from widgets.timeline import TimelinePanel
panel = TimelinePanel(system="dgx-a100", dp=1, tp=2, pp=4, micro_batches=8)
assert any(r["critical"] for r in panel.chart_data())
panel
"""),
]


if __name__ == "__main__":
    write("06_multi_gpu.ipynb", CELLS)
