"""Writes notebooks/05_embeddings.ipynb and 07_sharding.ipynb (outputs cleared; run with
`.venv/bin/jupyter nbconvert --to notebook --execute --inplace` to store outputs)."""
from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).parent


def md(s):
    return nbf.v4.new_markdown_cell(s.strip())


def code(s):
    return nbf.v4.new_code_cell(s.strip())


def write(name, cells):
    """Write cells as notebooks/<name>, with cell ids from their place (not random: a rebuild
    changes nothing but what changed); tests/test_notebook_builders.py holds each notebook to its
    builder."""
    nb = nbf.v4.new_notebook()
    for i, cell in enumerate(cells):
        cell["id"] = f"{Path(name).stem.split('_')[0]}-{i:02d}"
    nb.cells = cells
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    nbf.write(nb, HERE / name)


NB05 = [
    md(r"""
# 05 · Embeddings: lookups that know their data

**Who it is for:** anyone sizing a recommendation model, whose time goes into embedding tables.
**Time:** about 15 minutes. **Needs:** nothing but the kit (no GPU).

An embedding bag reads $L$ rows of a table ($E$ rows of $D$ elements) for each of $B$ bags and sums
(or averages) them. It does almost no arithmetic: its time is the bytes it moves. How many bytes
depends on the *indices*: hot rows are read once from DRAM and then served from L2.
"""),
    code("""
import numpy as np
import pandas as pd
from kit.embedding import (Empirical, ReuseHistogram, Table, Uniform, Zipf, l2_bw_gbs,
                           lookup_cost)
from kit.embedding import cost as C
from kit.hardware import get_gpu
"""),
    md(r"""
## 1. Unique rows

$n = B\cdot L$ draws, row $i$ drawn with probability $p_i$. Row $i$ is touched at least once with
probability $1-(1-p_i)^n$, so the expected number of distinct rows is

$$U(n) = \sum_{i=1}^{E}\big[1-(1-p_i)^n\big].$$

Uniform: $p_i = 1/E$, $U = E\,(1-(1-1/E)^n) \approx E\,(1-e^{-n/E})$.
Zipf($\alpha$): $p_i \propto i^{-\alpha}$; the kit sums the first 4,096 ranks one by one, then geometric
bins of ranks, so $E = 10^9$ costs a few thousand terms.
"""),
    code("""
E, n = 10**6, 10**6
u = Uniform().expected_unique(n, E)
print(f"uniform: {u:,.0f} unique of {n:,} lookups")
assert abs(u - E * (1 - np.exp(-1))) / u < 1e-5          # 1 - 1/e of the table
skew = pd.DataFrame({"alpha": [0.0, 0.6, 0.9, 1.05, 1.2, 1.5]})
skew["unique_rows"] = [Zipf(a).expected_unique(n, E) for a in skew.alpha]
skew
"""),
    code("""
assert skew.unique_rows.is_monotonic_decreasing
third, quarter = (Zipf(a).expected_unique(n, E) / u for a in (1.0, 1.05))
assert 0.3 < third < 0.37 and 0.25 < quarter < 0.3            # the takeaway's "a third to a quarter"
x = Zipf(1.05).sample(n, E, np.random.default_rng(0))      # a seeded stream of that skew
assert abs(np.unique(x).size / Zipf(1.05).expected_unique(n, E) - 1) < 0.01
"""),
    md(r"""
**Takeaway:** at $\alpha \approx 1$, typical of click logs, a million lookups touch only a third
($\alpha = 1$) to a quarter ($\alpha = 1.05$) as many rows as uniform ones do. The rest are
repeats, and repeats can come from L2.

## 2. L2 hits

A repeat hits L2 when the row is still there. For an LRU-like cache of $C$ rows, Che's
approximation gives each row a *characteristic time* $T$: the number of draws after which it
has been pushed out,

$$\sum_i \big[1-e^{-p_i T}\big] = C,$$

and in a window of $n$ draws the re-accesses of row $i$ that come within $T$ of the previous one
are $\int_0^n p_i\,(1-e^{-p_i \min(s,T)})\,ds$. The check below replays a stream through a real
LRU cache.
"""),
    code("""
from kit.embedding.replay import lru_hit_rate   # a reference cache, replayed access by access

rows, draws, cap = 50_000, 30_000, 2_000
for dist in (Uniform(), Zipf(0.8), Zipf(1.1)):
    s = dist.sample(draws, rows, np.random.default_rng(1))
    model, truth = dist.hit_rate(draws, rows, cap), lru_hit_rate(s, cap)
    print(f"{dist.describe():>10}: model {model:.3f}  LRU {truth:.3f}")
    assert abs(model - truth) < 0.02
"""),
    md(r"""
## 3. Bytes and time

Rows move in 32-byte sectors, so a row costs $r = 32\lceil D\cdot\text{bytes}/32\rceil$. With $M$ misses
and $H = n - M$ hits,

$$\text{DRAM} = M r + n\cdot 8 + B D\cdot 4 + (B+1)\cdot 8, \qquad \text{L2} = H r,$$
$$t = t_\text{launch} + \max\Big(\frac{\text{DRAM}}{e\cdot BW_\text{DRAM}}, \frac{\text{L2}}{BW_\text{L2}}, t_\text{latency}\Big).$$

The third term is Little's law, counted as round trips: when too few bags run to fill the memory
pipe, each bag's warp reads its $L$ indices 32 at a time and then its rows 4 at a time, and a round
in which any row misses waits the DRAM latency $\ell$ (600 ns, assumed). With $W$ bags at once,
$t_\text{latency} = \frac{B}{\min(B, W)}\,\ell\,\big(\max(\tfrac{L}{32}, 1) + \max(\tfrac{L}{4}, 1)\,p\big)$,
where $p = 1 - (1 - M/n)^{\min(L, 4)}$. A few bags are latency-bound; a training batch is not.

Constants (cited in `kit/embedding/cost.py`): $e$ = 0.75 for random gathers (assumed; a fitted
correction replaces it), $t_\text{launch}$ = 5 µs, and the L2 bandwidth per architecture (the catalog
has none): achieved bytes per clock per SM × SMs × clock.
"""),
    code("""
a100 = get_gpu("a100-sxm4-40gb")
print(f"A100 DRAM {a100.mem_bw_gbs:.0f} GB/s, L2 {l2_bw_gbs(a100):.0f} GB/s, "
      f"L2 {a100.l2_cache_mib:.0f} MiB; factor of L2 rows may keep: {C.L2_USABLE_FRACTION}")
t = Table(rows=10**9, dim=64, pooling=10)                 # so big that nothing repeats
B = 8192
r = lookup_cost(t, B, a100, "uniform")
nb = B * 10 * 256 + B * 10 * 8 + B * 64 * 4 + (B + 1) * 8
by_hand = C.LAUNCH_MS + nb / (C.DRAM_GATHER_EFF * a100.mem_bw_gbs * 1e9) * 1e3
print(f"{r.time_ms:.4f} ms by the kit, {by_hand:.4f} ms by hand")
assert abs(r.time_ms / by_hand - 1) < 1e-3
"""),
    code("""
few = lookup_cost(t, 16, a100, "uniform")                # 16 bags: far too few to fill the pipe
stream_ms = few.parts["dram_bytes"] / (C.DRAM_GATHER_EFF * a100.mem_bw_gbs * 1e6)
print(f"16 bags: {few.time_ms * 1e3:.2f} us; the gather waits {few.parts['dram_ms'] * 1e3:.2f} us "
      f"of round trips, {few.parts['dram_ms'] / stream_ms:.0f}x its bytes at full bandwidth")
assert few.parts["dram_ms"] > stream_ms
"""),
    code("""
hot = Table(rows=10**7, dim=128, pooling=30)
rows_ = []
for a in (0.0, 0.8, 1.05, 1.3):
    p = lookup_cost(hot, 4096, a100, Zipf(a)).parts
    rows_.append({"alpha": a, "hit_rate": round(p["hit_rate"], 3), "dram_ms": round(p["dram_ms"], 4),
                  "l2_ms": round(p["l2_ms"], 4), "bound": p["bound"]})
table = pd.DataFrame(rows_)
table
"""),
    code("""
assert table.hit_rate.is_monotonic_increasing and table.dram_ms.is_monotonic_decreasing
"""),
    md(r"""
**Takeaway:** skew moves a lookup from DRAM-bound towards L2-bound; at $\alpha = 1.3$ most rows come
from L2 and DRAM time falls several-fold.

## 4. Tables that run at once share the L2

FBGEMM's table-batched embedding (TBE) runs many tables in one kernel. They share the L2 in
proportion to their unique footprint $U_t r_t$: the more tables, the smaller each one's share
and the lower its hit rate.
"""),
    code("""
alone = lookup_cost(hot, 4096, a100, Zipf(1.05)).parts["hit_rate"]
crowd = lookup_cost([hot] * 8, 4096, a100, Zipf(1.05)).per_table[0]["hit_rate"]
print(f"hit rate alone {alone:.3f}, with 7 others in the same kernel {crowd:.3f}")
assert crowd < alone
"""),
    md(r"""
## 5. Backward: sort, sum, update

TBE's fused backward sorts the indices (8-bit radix passes), sums each unique row's gradients
and updates the row in place: $2Ur$ bytes of rows. Row-wise Adagrad keeps one fp32 per row,
read and written, and a lone 4-byte value still moves a 32-byte sector: $+\,2U\cdot 32$ bytes.
The backward is many small kernels (fills, scans, the sort, run-length encoding, the segment
kernels): their floors, read off FBGEMM's kernels in a V100 DLRM trace, add about 73 µs; beyond
4,096 lookups the sort takes more passes, $5 + 9$ µs per 8-bit pass of the row ids (3 passes
for $2^{24}$ rows: 105 µs in all).
"""),
    code("""
t = Table(rows=2**24, dim=32, pooling=5)
sgd = lookup_cost(t, 1024, a100, "uniform", backward=True)
ada = lookup_cost(t, 1024, a100, "uniform", backward=True, optimizer="rowwise_adagrad")
extra = ada.parts["dram_bytes"] - sgd.parts["dram_bytes"]
print(f"row-wise Adagrad adds {extra / 1e6:.2f} MB over SGD ({sgd.parts['unique_rows']:,.0f} rows)")
assert abs(extra - 2 * sgd.parts["unique_rows"] * 32) < 1
assert abs(sgd.parts["launch_ms"] - (10 * 0.0025 + 4 * 0.012 + 0.005 + 3 * 0.009)) < 1e-12  # 105 us
"""),
    md(r"""
## 6. Real indices and reuse histograms

Give the kit a real index tensor and it counts its unique rows and replays its own reuse. Or
give a histogram of *reuse time* (accesses since the previous access to the same row) in
power-of-two bins; Denning and Schwartz's working-set relation $s(t) = \sum_{k<t} P(R>k)$ turns it
into unique rows and hits.
"""),
    code("""
h = ReuseHistogram.from_indices([1, 2, 1, 1, 3, 2])      # reuse times 2, 1 (row 1) and 4 (row 2)
print(h.bins, h.cold_fraction)
assert h.bins == (1/6, 1/6, 1/6) and h.cold_fraction == 0.5
real = Zipf(1.1).sample(20_000, 10**5, np.random.default_rng(2))
e = Empirical(real)
assert e.expected_unique(20_000, 10**5) == np.unique(real).size
print(f"real stream: {np.unique(real).size:,} unique; hit rate at 1,000 rows of cache "
      f"{e.hit_rate(20_000, 10**5, 1000):.3f} (LRU replay {lru_hit_rate(real, 1000):.3f})")
assert abs(e.hit_rate(20_000, 10**5, 1000) - lru_hit_rate(real, 1000)) < 0.02
"""),
    md(r"""
## 7. The panel

Move the skew, the table size or the number of tables sharing the kernel, and watch the hit
rate and the DRAM and L2 times.
"""),
    code("""
from widgets.embeddings import EmbeddingPanel
panel = EmbeddingPanel(rows=10**7, dim=128, pooling=30, batch=4096)
panel
"""),
    code("""
hits = {r["alpha"]: r["value"] for r in panel.chart_data() if r.get("what") == "hit_rate"}
assert hits[1.6] > hits[1.0] > hits[0.0]
"""),
    md(r"""
## Problems

1. How many unique rows do 4,096 bags of 20 lookups touch in a uniform table of $10^5$ rows?
   $U = 10^5(1-e^{-0.8192}) \approx 55{,}920$.
"""),
    code("""
u = Uniform().expected_unique(4096 * 20, 10**5)
assert abs(u - 1e5 * (1 - np.exp(-0.8192))) < 5
"""),
    md(r"""
2. A 64-wide fp16 table: how many bytes does one looked-up row cost? $64\cdot 2 = 128$ B, four
   sectors; an 8-wide fp16 row (16 B) still costs one 32-byte sector.
"""),
    code("""
assert Table(rows=10, dim=64, pooling=1, dtype="fp16").sector_row_bytes == 128
assert Table(rows=10, dim=8, pooling=1, dtype="fp16").sector_row_bytes == 32
"""),
]

NB07 = [
    md(r"""
# 07 · Sharding embedding tables

**Who it is for:** anyone placing a recommendation model's tables on several GPUs.
**Time:** about 15 minutes. **Needs:** nothing but the kit.

Each table is placed one way (TorchRec's names): **table-wise** (whole, on one rank),
**column-wise** (its $D$ columns split into $k$ shards), **row-wise** (its rows over every rank),
**table-row-wise** (rows over one node's ranks) or **data-parallel** (a replica everywhere).
An iteration waits for the slowest rank, then moves pooled embeddings through an uneven
all-to-all:

$$t = \max_r t^\text{fwd}_r + \max_r t^\text{bwd}_r + a2a(\text{indices}) + 2\,a2a(\text{pooled}) +
\text{allreduce}(\text{dp grads}).$$

Lookup times come from `kit.embedding.lookup_cost`, all-to-all times from
`kit.comm.predict_alltoallv` on the System's topology. A plan is infeasible when a rank's
weights and optimizer state exceed its memory cap.
"""),
    code("""
import numpy as np
import pandas as pd
from kit.comm import predict_alltoallv
from kit.embedding import Table, Uniform, Zipf, lookup_cost
from kit.hardware.system import get_system
from kit.sharding import (ShardingModel, baselines, exhaustive, local_search, plan_sharding,
                          synthetic_tables)
"""),
    md(r"""
## 1. One plan, priced by hand

Two tables, table-wise, on a 4-GPU A100 box with NVLink, 256 samples per rank. Each owner looks
up the global batch $B = 4\cdot 256$ and sends every other rank its $256 \times D$ slice of pooled fp32
embeddings.
"""),
    code("""
sysm = get_system("a100x4-nvlink")
b, W = 256, sysm.world_size
tabs = [Table(rows=10**9, dim=64, pooling=8, name="a", distribution=Uniform()),
        Table(rows=10**9, dim=128, pooling=4, name="b", distribution=Uniform())]
m = ShardingModel(tabs, sysm, batch=b, memory_cap_bytes=1e15)
choice = np.array([0, 2])                                   # a on rank 0, b on rank 2
print(m.labels(choice))
gpu = sysm.gpu
fwd = [lookup_cost(t, b * W, gpu).time_ms for t in tabs]
bwd = [lookup_cost(t, b * W, gpu, backward=True, optimizer="rowwise_adagrad").time_ms for t in tabs]
out = np.zeros((W, W)); out[0, [1, 2, 3]] = b * 64 * 4; out[2, [0, 1, 3]] = b * 128 * 4
idx = np.zeros((W, W)); idx[[1, 2, 3], 0] = b * 9 * 8; idx[[0, 1, 3], 2] = b * 5 * 8
a2a = lambda x: predict_alltoallv(x, sysm).time_ms
by_hand = max(fwd) + max(bwd) + a2a(out) + a2a(out.T) + a2a(idx)
kit_ms = m.exact_cost(choice)["cost_ms"]
print(f"{kit_ms:.4f} ms by the kit, {by_hand:.4f} ms by hand")
assert abs(kit_ms / by_hand - 1) < 1e-6
print(f"lookups {max(fwd) + max(bwd):.4f} ms (forward: b, backward: a sets the pace), "
      f"all-to-alls {a2a(out) + a2a(out.T) + a2a(idx):.4f} ms")
assert np.argmax(fwd) == 1 and np.argmax(bwd) == 0
assert a2a(out) + a2a(out.T) + a2a(idx) > max(fwd) + max(bwd)
"""),
    md(r"""
**Takeaway:** with two tables, two ranks sit idle, and each pass waits for its slower table (b's
forward, a's backward). Tables this small cost less to look up than to exchange: the three
all-to-alls, each near its latency floor, take longer than the lookups.

## 2. Pricing thousands of plans at once

Each (table, placement) adds a fixed vector: per-rank forward and backward ms, bytes held, and
per-rank bytes sent and received within and across nodes. A plan's vector is the sum over its
tables, so a batch of plans is one numpy gather-sum. The all-to-all uses a surrogate fitted to
`kit.comm` on probe matrices: $\alpha + $ busiest rank's bytes / bandwidth, within and across nodes.
"""),
    code("""
dgx = get_system("dgx-a100")
tables = synthetic_tables(26, seed=0)
model = ShardingModel(tables, dgx, batch=512)
rng = np.random.default_rng(0)
plans = np.stack([[rng.integers(0, k) for k in model.n_options] for _ in range(5000)])
costs = model.cost(plans)
print(f"{len(tables)} tables, up to {model.n_options.max()} placements each; "
      f"a2a surrogate max error {100 * model.a2a_fit_rel_err:.1f}%")
assert costs.shape == (5000,) and np.isfinite(costs).mean() > 0.5
"""),
    md(r"""
## 3. Greedy baselines, and a search that beats them

The classic heuristics sort tables by a key (size, $D\cdot L$, $D\cdot L\cdot\log E$), largest first, and
put each whole table on the least-loaded rank with memory left. The local search starts from all
of them, takes the best single-table move (every option of every table, priced in one step),
and kicks a few tables at each local optimum. It keeps a move only when it improves, so it
never ends worse than the best baseline.
"""),
    code("""
base = {k: float(model.cost(c[None])[0]) for k, c in baselines(model).items()}
best, best_ms, priced, _ = local_search(model, time_budget_s=3.0, seed=0)
print(pd.Series(base).round(3).to_string())
print(f"search: {best_ms:.3f} ms after pricing {priced:,} plans")
assert best_ms <= min(base.values())
"""),
    md(r"""
## 4. Is it optimal? Exhaustive search on a small case

Four tables on four GPUs have 6 to 14 placements each (the two with $D = 16$ cannot be split by
column), $6\cdot 6\cdot 10\cdot 14 = 5{,}040$ plans: few enough to price them all.
"""),
    code("""
small = ShardingModel(synthetic_tables(4, seed=3), sysm, batch=512)
opt_choice, opt_ms, n_plans = exhaustive(small)
# a budget it never reaches: the restarts, not the clock, end the search, so it is deterministic
found, found_ms, _, _ = local_search(small, time_budget_s=600.0, seed=1)
print(f"{n_plans:,} plans; optimum {opt_ms:.4f} ms, search {found_ms:.4f} ms")
assert abs(found_ms - opt_ms) <= 1e-6 * opt_ms         # float32 sums: same plan cost
assert n_plans == np.prod(small.n_options) == 6 * 6 * 10 * 14
"""),
    md(r"""
## 5. A memory cap forces a big table apart

A $10^8 \times 64$ fp32 table holds 25.6 GB; with a 10 GiB cap per GPU no rank can hold it whole,
and the planner spreads it.
"""),
    code("""
big = [Table(rows=10**8, dim=64, pooling=4, name="huge", distribution=Zipf(1.0))] + synthetic_tables(5, seed=1)
r = plan_sharding(big, dgx, batch=512, memory_cap_gib=10, time_budget_s=1.0)
print(r["plan"][0])
assert r["plan"][0]["kind"] in ("rw", "cw", "twrw") and max(r["parts"]["memory_bytes"]) <= 10 * 2**30
"""),
    md(r"""
## 6. The panel

Per-rank bars of the searched plan (or a baseline's), coloured by sharding kind, next to the
iteration time of each plan.
"""),
    code("""
from widgets.sharding import ShardingPanel
panel = ShardingPanel(system="dgx-a100", n_tables=20, batch=512, budget_s=1.0)
panel
"""),
    code("""
rows = panel.chart_data()
costs = {x["plan"]: x["cost_ms"] for x in rows if "plan" in x}
assert costs["search"] <= min(v for k, v in costs.items() if k != "search")
"""),
    md(r"""
## Problems

1. A table-wise table of dim 128 on one of 8 ranks, 512 samples per rank: how many bytes does its
   owner send in the forward all-to-all? $7 \cdot 512 \cdot 128 \cdot 4 = 1{,}835{,}008$ B.
"""),
    code("""
m8 = ShardingModel([Table(rows=1000, dim=128, pooling=1, name="x")], dgx, batch=512)
out_sends, _, _ = m8.traffic(0, m8.options[0][0])  # bytes from rank i to rank j
assert out_sends.matrix().sum() == 7 * 512 * 128 * 4
"""),
]

if __name__ == "__main__":
    write("05_embeddings.ipynb", NB05)
    write("07_sharding.ipynb", NB07)
