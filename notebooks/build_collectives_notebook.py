"""Writes notebooks/04_collectives.ipynb, outputs cleared (nbval runs it:
`.venv/bin/python -m pytest --nbval-lax --nbval-current-env notebooks/04_collectives.ipynb`)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from build_embedding_notebooks import code, md, write  # noqa: E402  (shared notebook helpers)

CELLS = [
    md(r"""
# 04 · Collectives on real topologies

**Who it is for:** anyone who trains on more than one GPU and wants to know what the all-reduce,
all-gather or all-to-all of a step costs, on a box they may not have.
**Time:** about 15 minutes. **Needs:** nothing but the kit (the last part reads vTrain's measured
A100 table from `../shared/data` when it is there).

A collective moves data between $n$ ranks. Its time has two parts: a **latency** paid per step
whatever the size, and a **bandwidth** part that grows with the bytes each GPU must send over its
slowest link. Which part wins depends on the size, the algorithm and the wiring between GPUs.
"""),
    code("""
import numpy as np
import pandas as pd
from kit.comm import (BandwidthCurve, busbw_factor, collective_table, fit_curve, predict_alltoallv,
                      predict_collective)
from kit.comm.topology import ring_gbs
from kit.hardware import get_system, list_systems
pd.DataFrame([get_system(s).to_dict() for s in list_systems()])[
    ["key", "nodes", "gpus_per_node", "gpu", "fabric", "gpu_fabric_bw_gbs", "nics_per_node", "network"]]
"""),
    md(r"""
## 1. How nccl-tests counts bandwidth

For a buffer of $S$ bytes taking time $t$, **algbw** $= S/t$. The **bus bandwidth** rescales it to
the traffic on the busiest link, so that it is comparable across rank counts:

$$\text{busbw} = \text{algbw}\cdot F,\qquad F_{\text{all-reduce}} = \frac{2(n-1)}{n},\quad
F_{\text{all-gather, reduce-scatter, all-to-all}} = \frac{n-1}{n},\quad F_{\text{broadcast, reduce, send/recv}} = 1.$$

(For all-gather and reduce-scatter $S$ is the whole gathered buffer, $n$ times one rank's piece.)
"""),
    code("""
assert busbw_factor("allreduce", 8) == 2 * 7 / 8
assert busbw_factor("allgather", 8) == 7 / 8
assert busbw_factor("broadcast", 8) == 1
"""),
    md(r"""
## 2. Ring all-reduce: latency plus bytes over the link

A ring all-reduce is a reduce-scatter then an all-gather: $2(n-1)$ steps, and every GPU sends
$\frac{2(n-1)}{n}S$ bytes. With a per-step latency $\alpha$, a fixed cost $t_0$, link bandwidth
$B$ and a small local-memory term (the reduction reads and writes HBM at $M$ GB/s, $\kappa$ bytes
per payload byte):

$$t(S) = \max\Big(t_{\text{floor}},\; t_0 + 2(n-1)\,\alpha + \frac{2(n-1)}{n}\frac{S}{\eta B} + \frac{\kappa S}{M}\Big)$$

Constants for a DGX A100 (8 × A100-SXM4-40GB on NVSwitch):

| constant | value | source |
|---|---|---|
| $B$ | 300 GB/s per direction (12 NVLink3 × 25) | A100 whitepaper |
| $M$ | 1555 GB/s | A100 40GB datasheet |
| $\eta$ | 0.975 | calibrated (vTrain table, 2–4 GPUs) |
| $\alpha$ | 2.3 µs | calibrated; NCCL's own NVLink hop latencies are 0.6–3.4 µs |
| $t_0$ | 43.5 µs | calibrated |
| $\kappa$ | 2.75 | calibrated (NCCL reads 2 and writes 1 per reduced element) |
| $t_{\text{floor}}$ | 42 + 5.5 (n−1) µs | calibrated: the host-side floor of a framework-level measurement |
"""),
    code("""
S = 2**30
n = 8
by_hand_us = max(42 + 5.5 * (n - 1),
                 43.5 + 2 * (n - 1) * 2.3 + 2 * (n - 1) / n * S / (0.975 * 300e3) + 2.75 * S / 1555e3)
r = predict_collective("allreduce", S, "dgx-a100")
print(f"1 GiB all-reduce on 8 A100s: {r.time_ms:.3f} ms by {r.algorithm}, busbw {r.busbw_gbs:.0f} GB/s")
assert abs(r.time_ms * 1e3 - by_hand_us) < 1e-6 * by_hand_us
"""),
    md(r"""
**Takeaway:** at 1 GiB a DGX A100 all-reduce is bandwidth-bound at about 225 GB/s busbw, a little
under the 300 GB/s NVLink rate: the wire term is most of it, the HBM term the rest.
"""),
    md(r"""
## 3. The curve: a latency floor, a sigmoid rise in log size, a plateau

Plotted against $\log S$, bus bandwidth rises like a sigmoid from the latency-bound regime
(busbw ∝ S) to a plateau $B_{\max}$ (after Lin et al., TPDS 2025). The kit writes it as

$$\text{busbw}(S) = \frac{B_{\max}}{\big(1 + (S_{1/2}/S)^k\big)^{1/k}},\qquad t(S) = \max\Big(t_{\text{floor}}, \frac{F\,S}{\text{busbw}(S)}\Big)$$

$k = 1$ is the latency-plus-bandwidth model above (the presets); a fitted $k$ lets measured data
choose how sharp the knee is. The **crossover** is the size where the bandwidth term $F S/B_{\max}$
equals the latency term.
"""),
    code("""
sizes = 2.0 ** np.arange(10, 34, 3)
t = collective_table("allreduce", sizes, "dgx-a100", ranks=8)
t.assign(size_mib=t.size_bytes / 2**20, time_us=t.time_ms * 1e3)[["size_mib", "time_us", "busbw_gbs", "algorithm"]].round(2)
"""),
    code("""
x = r.crossover_bytes
print(f"crossover at {x / 2**20:.1f} MiB")
small, big = predict_collective("allreduce", x / 16, "dgx-a100"), predict_collective("allreduce", x * 16, "dgx-a100")
assert small.bound == "latency" and big.bound == "bandwidth"
assert 4 * 2**20 < x < 32 * 2**20
t_1k, t_1m, t_x = (predict_collective("allreduce", b, "dgx-a100").time_ms for b in (2**10, 2**20, x))
assert t_1m < 1.05 * t_1k and t_x < 2.1 * t_1k   # the floor up to 1 MiB, under twice it at the crossover
"""),
    md(r"""
**Takeaway:** up to about 1 MiB an 8-GPU all-reduce costs its floor (about 80 µs) whatever its
size, and below the crossover near 10 MiB less than twice that; bucket small gradients together
before reducing them.
"""),
    md(r"""
### When the library switches algorithm

A library may change algorithm with the size (gloo does near its cache sizes, NCCL between tree
and ring, LL and Simple protocols). One sigmoid cannot follow a step, so a fitted curve may be
piecewise: regime 1 below the break $S_b$, regime 2 from it up, each of the form above,

$$t(S) = t_1(S)\ \text{for}\ S < S_b,\qquad t(S) = t_2(S)\ \text{for}\ S \ge S_b .$$

`fit_curve` tries a break in every gap that leaves 5 sizes on each side (more than a regime's 4
parameters) and keeps the best one
only when it lowers Schwarz's BIC, $n \ln(\max(\text{RSS}/n,\ 0.02^2)) + p \ln n$ on log time
($p = 4$ for one regime, $9$ for two and their break). The break sits where the two regimes cross
inside the gap, else at the gap's geometric middle.

Worked problem: a made-up library switches at 1 MiB from an algorithm with a 300 µs floor and a
1.5 GB/s plateau to one with a higher latency and twice the plateau. Fit 1 KiB–16 MiB.
"""),
    code("""
from dataclasses import replace
low = BandwidthCurve("allreduce", 4, floor_us=300.0, busbw_max_gbs=1.5, half_bytes=4e5, steepness=1.0)
high = BandwidthCurve("allreduce", 4, floor_us=0.0, busbw_max_gbs=3.0, half_bytes=6e6, steepness=1.0)
s = 2.0 ** np.arange(10, 25)
t_true = np.where(s < 2**20, low.time_us(s), high.time_us(s))
two, one = fit_curve("allreduce", 4, s, t_true), fit_curve("allreduce", 4, s, t_true, breaks=0)
print(f"break found at {two.breaks_bytes[0] / 2**20:.2f} MiB; fit MAPE with the switch "
      f"{100 * two.fit_mape:.2f}%, one regime {100 * one.fit_mape:.1f}%")
assert 2**19 < two.breaks_bytes[0] <= 2**20 and two.fit_mape < 0.01 and one.fit_mape > 0.03
assert two.plateau_gbs() == two.upper.busbw_max_gbs  # the plateau as S grows is regime 2's
"""),
    md(r"""
**Takeaway:** measure on both sides of a suspected switch; with five sizes per regime the fit
finds the break itself, and without a switch in the data it keeps one regime.
"""),
    md(r"""
## 4. The wiring decides the bandwidth

* **NVSwitch** (DGX A100/H100, HGX H200): every GPU reaches every other at its full NVLink rate,
  for any subset of GPUs.
* **NVLink mesh** (DGX-1's hybrid cube-mesh, the 4-GPU A100 board): a ring can only use the
  links that exist. NCCL runs several rings at once; the kit finds the best mix of rings with a
  small linear program over the directed Hamiltonian cycles and the link capacities.
* **PCIe only**: GPUs share switch uplinks and cross the CPU-to-CPU link.
"""),
    code("""
dgx1 = get_system("dgx1-v100")
full, quad, apart = ring_gbs(dgx1, tuple(range(8))), ring_gbs(dgx1, (0, 1, 2, 3)), ring_gbs(dgx1, (0, 5))
print(f"DGX-1 ring GB/s: 8 GPUs {full:.1f}, GPUs 0-3 {quad:.1f}, GPUs 0 and 5 (no NVLink) {apart:.1f}")
# all 6 NVLink2 links per GPU (6 x 25 GB/s); in the quad at most 4 links per GPU carry rings;
# 0 and 5 go over PCIe Gen3 (15.75 GB/s x 0.8)
assert abs(full - 6 * 25 * 0.975) < 1e-6 and abs(quad - 4 * 25 * 0.975) < 1e-6 and abs(apart - 15.75 * 0.8) < 1e-9
"""),
    code("""
rows = []
for name in ["dgx1-v100", "a100x4-nvlink", "dgx-a100", "dgx-h100", "hgx-h200", "pcie8"]:
    s = get_system(name)
    for kind in ["allreduce", "allgather", "alltoall"]:
        res = predict_collective(kind, 2**28, s)
        rows.append({"system": name, "ranks": s.world_size, "collective": kind, "algorithm": res.algorithm,
                     "time_ms": round(res.time_ms, 3), "busbw_gbs": round(res.busbw_gbs, 1)})
table = pd.DataFrame(rows)
table.pivot(index="system", columns="collective", values="busbw_gbs")
"""),
    md(r"""
Hopper's third-generation NVSwitch can reduce inside the switch (**NVLS**, NVLink SHARP): each
byte leaves a GPU once and comes back once, instead of $2(n-1)/n$ times around a ring.
"""),
    code("""
h = predict_collective("allreduce", 2**30, "dgx-h100")
ring_plateau = 1.75 / (1.75 / (450 * 0.975) + 2.75 / 3352)
print(f"H100 all-reduce: {h.algorithm}, plateau {h.plateau_busbw_gbs:.0f} GB/s vs ring {ring_plateau:.0f} GB/s")
assert h.algorithm == "nvls" and h.plateau_busbw_gbs > ring_plateau
"""),
    md(r"""
**Takeaway:** on a mesh, which GPUs you group matters (GPUs 0 and 5 of a DGX-1 are 12× slower
to each other than the full ring); on NVSwitch any group is as good as any other.
"""),
    md(r"""
## 5. Many nodes: hierarchical algorithms and the NICs

Across nodes a group's bandwidth is set by the NICs ($R$ rails of $B_{\text{NIC}}$ per node). The
kit weighs a flat **ring** ($2(N-1)$ steps), NCCL's **tree** (fewer steps, 2 bytes per byte on the
node links), a **hierarchical** ring (reduce-scatter inside, all-reduce across, all-gather inside)
and, where the switches reduce (InfiniBand SHARP), **collnet** / **NVLS+SHARP**, and takes the
fastest for each size. NCCL reduces in the network only through its CollNet plugin, switched on
with `NCCL_COLLNET_ENABLE=1`, so the InfiniBand presets leave SHARP off; the `ib-ndr-sharp` and
`ib-hdr-sharp` networks turn it on, and then the all-reduce no longer slows with the node count.
"""),
    code("""
cluster = "dgx-h100-roce-400g-x4"  # 4 DGX H100 over 8 x 400 GbE RoCE each: no SHARP
picks = collective_table("allreduce", 2.0 ** np.arange(12, 34, 3), cluster)
picks.assign(size_mib=picks.size_bytes / 2**20)[["size_mib", "algorithm", "time_ms", "busbw_gbs"]].round(3)
"""),
    code("""
one_per_node = predict_collective("allreduce", 2**32, "dgx-h100-roce-400g-x2", ranks=[0, 8])
# one GPU per node uses one 400 GbE rail: 50 GB/s x 0.85 RoCE efficiency (plus the HBM term)
expect = 1 / (1 / (50 * 0.85) + 2.75 / 3352)
print(f"2 GPUs on 2 nodes: busbw plateau {one_per_node.plateau_busbw_gbs:.1f} GB/s")
assert abs(one_per_node.plateau_busbw_gbs - expect) < 1e-6 * expect
assert picks.algorithm.iloc[0] == "tree" and picks.algorithm.iloc[-1] == "ring"
"""),
    code("""
# one GPU per node, so the network alone carries the all-reduce: 1 GiB over 4 and 32 nodes
sharp_table = pd.DataFrame([
    {"network": net, "nodes": n, **{k: r[k] for k in ("algorithm", "time_ms")}}
    for net in ("ib-ndr", "ib-ndr-sharp") for n in (4, 32)
    for r in [predict_collective("allreduce", 2**30, f"dgx-h100-{net}-x{n}",
                                 ranks=[8 * i for i in range(n)]).to_dict()]])
print(sharp_table.round(2).to_string(index=False))
t = sharp_table.set_index(["network", "nodes"]).time_ms
assert t["ib-ndr", 32] > t["ib-ndr", 4] and abs(t["ib-ndr-sharp", 32] / t["ib-ndr-sharp", 4] - 1) < 0.05
"""),
    md(r"""
## 6. Uneven all-to-all

Expert parallelism sends uneven amounts between ranks. All transfers run at once, so the time
is set by the **busiest rank**: the most bytes any rank sends or receives over its port.
"""),
    code("""
b = 2.0**24
even = np.full((8, 8), b)
skew = even.copy()
skew[0] *= 3                        # rank 0 sends three times as much to everyone
e, s_ = predict_alltoallv(even, "dgx-h100"), predict_alltoallv(skew, "dgx-h100")
print(f"even {e.time_ms * 1e3:.0f} us, skewed {s_.time_ms * 1e3:.0f} us")
# rank 0 now sends 21 b while every receiver gets 9 b: three times the even case's 7 b
assert abs((s_.time_ms - s_.latency_ms) / (e.time_ms - e.latency_ms) - 3) < 1e-9
"""),
    md(r"""
**Takeaway:** an all-to-all is only as fast as its most loaded rank; balancing the router's load
buys more than a faster network.
"""),
    md(r"""
## 7. Against measurements, and fitting your own

vTrain (MICRO 2024) measured NCCL all-reduce on an A100 SXM4 node for 2–8 GPUs, 1 MiB–1 GiB. The
preset's constants were fitted on the 2–4 GPU rows only; 5–8 GPUs are held out. Then we fit a
curve per rank count to every other power-of-two size and score the sizes in between.
On your own machine: `kit collect-comm --backend nccl --ranks 8 --sizes 8:8G --out ar.txt`
(or `--backend gloo` on CPU), then `kit comm fit ar.txt --system dgx-a100 --out cal.json` and
`kit comm predict allreduce --bytes 1e9 --system dgx-a100 --calibration cal.json`.
"""),
    code("""
import os
from pathlib import Path
lut = Path(os.environ.get("KIT_SHARED", "../../shared")) / "data/vtrain/allreduce_lut_a100.csv"
if not lut.exists():
    lut = Path("../../shared/data/vtrain/allreduce_lut_a100.csv")
if lut.exists():
    d = pd.read_csv(lut)
    rows = []
    for n, g in d.groupby("n_gpus"):
        pred = collective_table("allreduce", g.size_bytes.values, "dgx-a100", ranks=int(n)).time_ms.values
        meas = g.time_ns_out_of_place.values / 1e6
        ape = np.abs(pred - meas) / meas
        p2 = g[np.log2(g.size_bytes) % 1 == 0].sort_values("size_bytes")
        train, test = p2.iloc[::2], p2.iloc[1::2]
        c = fit_curve("allreduce", int(n), train.size_bytes.values, train.time_ns_out_of_place.values / 1e3)
        held = np.abs(c.time_us(test.size_bytes.values) / (test.time_ns_out_of_place.values / 1e3) - 1)
        rows.append({"gpus": n, "preset_mape": ape.mean(), "preset_max_ape": ape.max(),
                     "fitted_heldout_mape": held.mean(), "calibrated_on": n <= 4})
    acc = pd.DataFrame(rows).round(3)
    assert acc.loc[acc.gpus == 8, "preset_mape"].item() <= 0.10
    assert acc.preset_mape.max() < 0.03 and acc.fitted_heldout_mape.max() < 0.04
else:
    acc = "vTrain data not found: skipped"
acc
"""),
    md(r"""
**Takeaway:** a few physical constants (link rate, efficiency, per-step latency, an HBM term)
reproduce measured 8-GPU all-reduce to a few per cent over the measured range, 1 MiB–1 GiB
(nothing smaller or larger was measured here: below 1 MiB the preset gives the measured floor);
a curve fitted to every other measured size, knowing nothing of the hardware, predicts the
sizes in between to within 4 % (mean), nearly as well as the preset. On this machine's CPUs,
`kit collect-comm --backend gloo` on 2–4 processes gives curves that predict held-out sizes to
2–7 % (benchmarks/comm_accuracy.py).

## 8. Try it

Pick a system, a collective, a group size and a message size. The dashed line is the crossover
from latency-bound to bandwidth-bound; colours show the algorithm the model picks at each size.
"""),
    code("""
from widgets.collectives import CollectivesPanel
panel = CollectivesPanel(system="dgx-h100", collective="allreduce", ranks=8, size_bytes=2**27)
panel
"""),
]


def main():
    write("04_collectives.ipynb", CELLS)


if __name__ == "__main__":
    main()
