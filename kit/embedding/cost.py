"""The cost of embedding-bag lookups (forward) and their gradient + optimizer update (backward).

Forward, one table with B bags of L rows of D elements (n = B·L lookups):

    U    = expected unique rows among n draws            (kit.embedding.distributions)
    C_t  = L2 rows this table may keep: f_L2 · L2_bytes / r_t alone; the tables of one fused (TBE)
           kernel share the L2 as an LRU cache would, each keeping the rows it touches within one
           characteristic time of the combined stream (_l2_rows_by_table)
    M    = expected misses of a cache of C_t rows, H = n - M hits
    r    = row bytes rounded up to 32-B sectors           (DRAM and L2 move whole sectors)
    DRAM = M·r + n·idx_bytes + B·D·out_bytes              rows, indices, pooled output
    L2   = n·r                                            every row read passes through L2 (hits and misses)
    t    = fixed + max(DRAM / (BW_dram·e), L2 / BW_l2, latency), where latency is Little's law
           as round trips: too few bags in flight to fill the memory pipe wait (per wave of
           bags) max(L/32, 1) index reads and max(L/rows_in_flight, 1) rounds of row reads of
           the DRAM latency, each as likely to wait as any of its rows is to miss (M/n each),
           but the kernel's first round, which finds the L2 cold, always (_gather_latency_ms)

Backward (FBGEMM TBE's fused backward: sort the indices, sum each unique row's gradients, update):

    sort  = n·(idx_bytes + 4)·2 per radix pass, ceil(log2 E / 8) passes (8-bit digits)
    grad  = n·D·4 reads of grad_output rows: B·D·4 from DRAM once, the re-reads from L2 for the
            fraction of grad_output that fits the table's L2 share, from DRAM for the rest; the
            tables of a fused kernel share the L2 in proportion to their grad_output (B·D·4), the
            data they re-read (their unique rows had set it, so a bigger table's backward got faster)
    rows  = 2·U·r (read + write the updated rows)
    state = rowwise_adagrad: 2·U·32 (one fp32 per row, a whole sector each way); sgd: none
    fixed = the kernel floors of TBE's ~14-20 backward kernels (backward_fixed_ms)
    The sort and grad bytes stream at the lookups' parallelism (Little's law over n), the row and
    state updates at the unique rows' (over U): a table of a few rows updates few rows, but still
    sorts and reads every lookup's gradient. The sort keeps a key and value in flight a lookup,
    the state a sector a row (read before the row's update, which needs it), the update a row.

parts["launch_ms"] is the fixed part (launch + kernel floors), the rest is the memory time.
Constants are per architecture where the catalog has no field (L2 bandwidth). A learned
correction (kit.embedding.correction) may scale the total; none ships by default.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from kit.embedding.distributions import Distribution, parse_distribution
from kit.errors import KitError, real_number, whole_number, yes_no
from kit.hardware import GPU, get_gpu
from kit.ops import dtype_bytes

SECTOR_BYTES = 32  # NVIDIA L2/DRAM access granularity since Maxwell
LAUNCH_MS = 0.005  # ~5 µs: launch plus ramp-up/tail of one small kernel
DRAM_GATHER_EFF = 0.75  # random row gathers reach ~3/4 of peak HBM (assumed; the correction fits it)
L2_USABLE_FRACTION = 0.6  # share of L2 that rows can hold (indices/outputs stream through it too)
DRAM_LATENCY_NS = 600.0  # loaded HBM latency, order of magnitude (assumed)
ROWS_IN_FLIGHT_PER_WARP = 4  # TBE unrolls its row loop by ~4 (assumed)
# Fixed GPU time of FBGEMM TBE's backward, read off the kernels one TBE backward launches in the
# 8-rank V100 DLRM Kineto trace of the shared data (traces/param/.../dlrm_kineto.tar.gz): 10
# helper kernels (fills, scans, run-length encode, find_long_segments) of 2-4 µs each and 4 main
# kernels (linearize_index, radix sort, cta_per_row, warp_per_row) that take >= ~12 µs even for
# 768 lookups. A sort of more than one tile (the trace: 4,736 and 13,312 keys) adds a histogram,
# an exclusive sum and one ~9 µs onesweep kernel per 8-bit digit pass.
BWD_HELPER_KERNELS = 10
HELPER_KERNEL_MS = 0.0025
BWD_MAIN_KERNELS = 4
MAIN_KERNEL_FLOOR_MS = 0.012
SORT_SINGLE_TILE_KEYS = 4096
SORT_PASS_MS = 0.009
GRAD_BYTES = 4  # grad_output in fp32

# L2 bandwidth is not in the catalog, so it is derived here: achieved bytes per clock per SM.
# volta:  V100 measured 2155 GB/s L2 (Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via
#         Microbenchmarking", arXiv:1804.06826) / (80 SM · 1.38 GHz) ≈ 19.5
# turing: T4 measured 1270 GB/s (Jia et al., "Dissecting the NVidia Turing T4 GPU via
#         Microbenchmarking", arXiv:1903.07486) / (40 SM · 1.59 GHz) ≈ 20
# ampere: A100 whitepaper: 5120 B/clk L2 read bandwidth (2.3x V100) / 108 SM = 47.4 B/clk/SM
#         theoretical, times V100's measured/theoretical 2155/(2048 · 1.38) ≈ 0.76 -> 36
# pascal, ada, hopper, blackwell, cdna*: no figure at hand; assumed equal to the nearest
#         generation (pascal = volta, ada = turing-class 20, hopper/blackwell = ampere, AMD 13:
#         CDNA2 whitepaper 2 KiB/clk per GCD / 110 CU · 0.7)
L2_BYTES_PER_CLK_PER_SM = {"pascal": 19.5, "volta": 19.5, "turing": 20.0, "ampere": 36.0,
                           "ada": 20.0, "hopper": 36.0, "blackwell": 36.0, "cdna": 13.0,
                           "cdna2": 13.0, "cdna3": 13.0}
L2_DEFAULT_BYTES_PER_CLK_PER_SM = 20.0
OPTIMIZERS = ("sgd", "rowwise_adagrad")


def sort_passes(rows_total: int) -> int:
    """8-bit radix passes to sort row ids below rows_total (TBE sorts ids linearised over its tables)."""
    return max(1, math.ceil(math.log2(max(rows_total, 2)) / 8))


def backward_fixed_ms(lookups: float, rows_total: int) -> float:
    """Kernel floors of one fused backward (see the constants above)."""
    t = BWD_HELPER_KERNELS * HELPER_KERNEL_MS + BWD_MAIN_KERNELS * MAIN_KERNEL_FLOOR_MS
    if lookups > SORT_SINGLE_TILE_KEYS:
        t += 2 * HELPER_KERNEL_MS + sort_passes(rows_total) * SORT_PASS_MS
    return t


def l2_bw_gbs(gpu: GPU) -> float:
    """Achieved L2 bandwidth in GB/s, derived from the architecture (see the table above)."""
    per = L2_BYTES_PER_CLK_PER_SM.get(gpu.arch, L2_DEFAULT_BYTES_PER_CLK_PER_SM)
    return per * gpu.sm_count * gpu.boost_clock_mhz * 1e6 / 1e9


# a pebibyte is more than any system in the catalog holds (the largest production tables are tens
# of GiB to a few TiB), and a million lookups per sample is 10^4 times the heaviest pooling of
# DLRM-style models (~100s); past these a table's int64 byte counts and costs overflow
MAX_TABLE_BYTES = 2**50
MAX_POOLING = 1_000_000


@dataclass(frozen=True)
class Table:
    """One embedding table: rows E, dim D, pooling factor L (mean rows per bag), dtype."""

    rows: int
    dim: int
    pooling: float
    dtype: str = "fp32"
    name: str = ""
    distribution: Distribution | None = None

    def __post_init__(self):
        # numpy numbers (a pandas column's) are numbers, as kit.errors.whole_number has them: rows
        # np.int64(100) had been refused as "not a positive whole number"; they are kept as Python's
        for k in ("rows", "dim"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise KitError(f"table {self.name or '?'}: {k} must be a positive whole number, got {v!r}")
            object.__setattr__(self, k, int(v))
        if isinstance(self.pooling, bool) or not isinstance(self.pooling, numbers.Real) \
                or not math.isfinite(self.pooling) or self.pooling <= 0:
            raise KitError(f"table {self.name or '?'}: pooling must be a positive number, got {self.pooling!r}")
        if not isinstance(self.pooling, (int, float)):
            object.__setattr__(self, "pooling", float(self.pooling))
        size = self.rows * self.dim * dtype_bytes(self.dtype)
        if size > MAX_TABLE_BYTES:  # past int64 row-byte arithmetic long before it matters
            raise KitError(f"table {self.name or '?'}: {self.rows:,} rows x {self.dim:,} {self.dtype} "
                           f"is {size / 2**50:.3g} PiB, more than any GPU system holds (at most "
                           f"1 PiB a table)")
        if self.pooling > MAX_POOLING:
            raise KitError(f"table {self.name or '?'}: pooling {self.pooling:g} lookups per sample "
                           f"is implausible (at most {MAX_POOLING:,})")
        if self.distribution is not None and not isinstance(self.distribution, Distribution):
            try:  # a spec ('zipf:1.05', a Zipf alpha, indices) becomes its Distribution here
                dist = parse_distribution(self.distribution)
            except KitError as e:
                raise KitError(f"table {self.name or '?'}: {e}") from None
            object.__setattr__(self, "distribution", dist)

    @property
    def row_bytes(self) -> int:
        return self.dim * dtype_bytes(self.dtype)

    @property
    def sector_row_bytes(self) -> int:
        return _sectors(self.row_bytes)

    @property
    def bytes(self) -> int:
        return self.rows * self.row_bytes


@dataclass
class LookupCost:
    """time_ms and its parts; per_table holds the same parts table by table."""

    time_ms: float
    parts: dict
    per_table: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"time_ms": self.time_ms, "parts": self.parts, "per_table": self.per_table}


def _as_tables(tables) -> list[Table]:
    from kit.ops import EmbeddingBag

    if isinstance(tables, (Table, EmbeddingBag)):
        tables = [tables]
    try:
        tables = list(tables)
    except TypeError:
        raise KitError(f"tables must be a kit.embedding.Table or a list of them, got {tables!r}") from None
    out = []
    for t in tables:
        if isinstance(t, EmbeddingBag):
            t = Table(rows=t.rows, dim=t.dim, pooling=t.pooling, dtype=t.dtype)
        if not isinstance(t, Table):
            raise KitError(f"tables must be kit.embedding.Table objects, got {type(t).__name__}")
        out.append(t)
    if not out:
        raise KitError("no tables given")
    return out


def _sectors(nbytes: float) -> int:
    """Bytes rounded up to whole 32-B sectors."""
    return SECTOR_BYTES * math.ceil(nbytes / SECTOR_BYTES)


def _achieved_dram_gbs(gpu: GPU, bags: float, row_bytes: float, pooling: float) -> float:
    """min(efficiency · peak, bytes in flight / latency): few bags cannot fill the memory pipe."""
    warps = gpu.sm_count * gpu.max_threads_per_sm / 32
    in_flight = min(bags, warps) * min(pooling, ROWS_IN_FLIGHT_PER_WARP) * row_bytes
    return min(DRAM_GATHER_EFF * gpu.mem_bw_gbs, in_flight / DRAM_LATENCY_NS)  # B/ns = GB/s


def _gather_latency_ms(gpu: GPU, bags: float, bags_at_once: float, pooling: float,
                       miss_share: float) -> float:
    """The forward's time when too few bags keep the memory pipe full (Little's law, as round
    trips): each bag's warp reads its indices a warp (32) at a time, then gathers its rows
    ROWS_IN_FLIGHT_PER_WARP at a time, a round in which any row of the wave's bags misses the
    L2 (miss_share of them do) waiting DRAM_LATENCY_NS; the
    GPU runs min(bags_at_once, warps) bags at once (a fused kernel's bags of every table), so
    this table's bags take bags / that of the waves. The kernel's first round finds the L2 cold:
    every row of it is a first touch (a row drawn twice in it is in flight once, and its twin
    waits on the same read), so it waits, whatever the stream's miss share; this table's part
    of it is min(waves, 1). The pooled output and offsets are stores, which no warp waits for.
    (One bandwidth for every byte, from the rows in flight, had let a bag's extra rows carry its
    output faster: pooling 4 came out 6% under pooling 1 at 16 bags. The first round had taken
    the stream's miss share too, which a bag's warmer later rows lower: its second row had made
    a bag faster, 1 Zipf(1.2) bag of 2 rows 6.1992 us against 6.2000 for 1 row.)"""
    warps = gpu.sm_count * gpu.max_threads_per_sm / 32
    at_once = min(bags_at_once, warps)
    waves = bags / at_once
    row_rounds = waves * max(pooling / ROWS_IN_FLIGHT_PER_WARP, 1.0)
    cold = min(waves, 1.0)  # this table's part of the kernel's first round
    # a later round waits if any row of it misses, in any bag of the wave: the kernel waits for
    # its slowest bag (the hits' L2 latency is left out). Per bag, more bags had come out faster
    # under skewed indices (Zipf 1.05: 6.200 us at 1 bag, 6.153 at 16). They take the stream's
    # miss share, the cold round's certain misses in it: a little high, as leaving out the
    # hits' L2 latency is a little low. The chance is Poisson's in the round's expected misses,
    # 1 - e^(-m·N): the binomial 1 - (1 - m)^N falls as more bags spread the same misses over
    # more rows a round, and had made more bags faster (4 rows of a table all touched at once,
    # pooling 20, Zipf(1.05) on an MI250: 7.5341 us at 7 bags, 7.5278 at 14)
    waits = -math.expm1(-miss_share * min(pooling, ROWS_IN_FLIGHT_PER_WARP) * at_once)
    rounds = waves * max(pooling / 32, 1.0) + cold + (row_rounds - cold) * waits
    return rounds * DRAM_LATENCY_NS / 1e6


def _l2_rows_by_table(tables: list, dists: list, lookups: list, l2_bytes: float) -> list[float]:
    """Rows of a shared L2 that each table of one fused kernel keeps. Its tables' accesses
    interleave, so an LRU-like L2 keeps every row touched within one characteristic time T of
    the combined stream (Che's approximation, across the tables): Σ_t r_t · U_t(f_t · T) = the
    L2's bytes, U_t a table's expected distinct rows in that many of its draws and f_t its share
    of the accesses; table t keeps U_t(f_t · T) rows. Shares in proportion to the tables'
    distinct rows had starved a small, hot table: 100 Zipf rows fused beside a million-row
    table kept 3 rows and ran slower than 10^5 rows in its place."""
    total = float(sum(lookups))
    curves = [d.unique_curve(t.rows) if k > 0 else None for t, d, k in zip(tables, dists, lookups)]

    def rows_kept(T: float) -> list[float]:  # each table's expected_unique(k / total * T, rows)
        return [u(k / total * T) if k > 0 else 0.0 for u, k in zip(curves, lookups)]

    def held_bytes(T: float) -> float:
        return sum(c * t.sector_row_bytes for c, t in zip(rows_kept(T), tables))

    if total <= 0 or held_bytes(total) <= l2_bytes:
        return rows_kept(total)  # every row the batch touches fits
    lo, hi = 0.0, total
    for _ in range(60):  # bisection on T: held_bytes rises with it (to 0.01%: shares, not times)
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if held_bytes(mid) <= l2_bytes else (lo, mid)
        if hi - lo <= 1e-4 * hi:
            break
    return rows_kept(lo)


def fused_l2_shares(tables: list, dists: list, batches: list, l2_bytes: float,
                    backward: bool) -> list[float]:
    """Bytes of the L2 each table of one fused kernel holds (batches: each table's bags):
    forward, the rows it keeps within one characteristic time of their combined stream
    (_l2_rows_by_table); backward, in proportion to the grad_output rows every lookup of a bag
    re-reads. One table holds it all."""
    if len(tables) == 1:
        return [l2_bytes]
    if backward:
        foot = [b * t.dim * GRAD_BYTES for t, b in zip(tables, batches)]
        return [f / (sum(foot) or 1.0) * l2_bytes for f in foot]
    kept = _l2_rows_by_table(tables, dists, [b * t.pooling for t, b in zip(tables, batches)], l2_bytes)
    return [c * t.sector_row_bytes for c, t in zip(kept, tables)]


def lookup_cost(tables, batch: int, gpu, distribution=None, backward: bool = False,
                optimizer: str = "sgd", mode: str = "sum", fused: bool = True,
                index_bytes: int = 8, l2_share: float = 1.0, correction=None) -> LookupCost:
    """Predict an embedding-bag kernel (or its backward) for `tables` at `batch` bags per table.

    distribution: one for all tables (anything parse_distribution reads), or a list, one per
    table (Distributions, strings or Zipf alphas as floats); a Table's own distribution wins. fused=True models one FBGEMM TBE kernel whose tables
    share L2; fused=False one nn.EmbeddingBag kernel per table, each with the whole L2.
    backward=True gives the backward + optimizer update only (sgd or rowwise_adagrad).
    l2_share: fraction of the L2 left to these lookups (other work running at once).
    """
    gpu = get_gpu(gpu)
    tables = _as_tables(tables)
    batch = whole_number(batch, "batch")
    backward, fused = yes_no(backward, "backward"), yes_no(fused, "fused")
    if optimizer not in OPTIMIZERS:
        raise KitError(f"unknown optimizer {optimizer!r}: choose one of {', '.join(OPTIMIZERS)}")
    if mode not in ("sum", "mean"):
        raise KitError(f"pooling mode must be 'sum' or 'mean', got {mode!r}")
    if index_bytes not in (4, 8):
        raise KitError(f"index_bytes must be 4 (int32) or 8 (int64), got {index_bytes!r}")
    l2_share = real_number(l2_share, "l2_share (the fraction of the L2 left to these lookups)",
                           strict=True, high=1.0)
    if correction is not None and not callable(getattr(correction, "factor", None)):
        raise KitError(f"correction must be a kit.embedding.correction.Correction (fit_correction) "
                       f"or None, got {correction!r}")
    if isinstance(distribution, (list, tuple)) and len(distribution) != len(tables) and any(
            isinstance(x, (str, float, Distribution)) or x is None for x in distribution):
        # a per-table list of the wrong length: it had been read as one index tensor, and
        # refused as "index tensor must be a non-empty array of whole numbers"
        raise KitError(f"distribution lists {len(distribution)} distributions for {len(tables)} "
                       f"tables; give one per table, or one for all")
    per_table = isinstance(distribution, (list, tuple)) and len(distribution) == len(tables) and (
        not all(isinstance(x, (int, float)) for x in distribution)  # Distributions or strings
        or any(isinstance(x, float) for x in distribution))  # Zipf alphas; whole numbers are indices
    if per_table:
        dists = [parse_distribution(d) for d in distribution]
    else:
        dists = [parse_distribution(distribution)] * len(tables)
    dists = [t.distribution or d for t, d in zip(tables, dists)]

    n = [batch * t.pooling for t in tables]
    unique = [d.expected_unique(k, t.rows) for d, k, t in zip(dists, n, tables)]
    l2_bytes_total = L2_USABLE_FRACTION * gpu.l2_cache_bytes * l2_share
    shares = (fused_l2_shares(tables, dists, [batch] * len(tables), l2_bytes_total, backward)
              if fused else [l2_bytes_total] * len(tables))
    l2_gbs = l2_bw_gbs(gpu)
    rows_out, sums = [], {"dram_bytes": 0.0, "l2_bytes": 0.0, "dram_ms": 0.0, "l2_ms": 0.0}
    stream_ms = wait_ms = chain_ms = 0.0  # a fused forward's bandwidth and latency, see below
    for t, d, k, u, share in zip(tables, dists, n, unique, shares):
        r = t.sector_row_bytes
        out_bytes = batch * t.dim * dtype_bytes(t.dtype)
        per = len(tables) if fused else 1
        if not backward:
            misses = d.expected_misses(k, t.rows, share / r)
            dram = misses * r + k * index_bytes + out_bytes + (batch + 1) * index_bytes
            l2 = k * r  # every row read passes through the L2: the hits, and the misses it fills
            bw_ms = dram / (DRAM_GATHER_EFF * gpu.mem_bw_gbs * 1e6)
            lat_ms = _gather_latency_ms(gpu, batch, batch * per, t.pooling, misses / k if k else 0.0)
            dram_ms = max(bw_ms, lat_ms)
            stream_ms, wait_ms = stream_ms + bw_ms, wait_ms + lat_ms
            # the bags of a fused kernel's other tables run beside this table's, not inside their
            # chains of round trips: the kernel waits at least as long as these bags alone would
            chain_ms = max(chain_ms, _gather_latency_ms(gpu, batch, batch, t.pooling,
                                                        misses / k if k else 0.0))
        else:
            misses = u
            passes = sort_passes(sum(x.rows for x in tables) if fused else t.rows)
            sort = k * (index_bytes + 4) * 2 * passes
            grad_rows = k * t.dim * GRAD_BYTES
            grad_out = batch * t.dim * GRAD_BYTES
            # grad_output rows are re-read once per lookup; the share of them the L2 holds hits
            kept = min(1.0, share / grad_out) if grad_out > 0 else 1.0
            grad_dram = grad_out + (grad_rows - grad_out) * (1.0 - kept) if grad_rows > grad_out else grad_rows
            state = 2 * u * SECTOR_BYTES if optimizer == "rowwise_adagrad" else 0.0
            dram = sort + grad_dram + 2 * u * r + state
            l2 = grad_rows - grad_dram if grad_dram < grad_rows else 0.0
            # the sort and the grad_output re-reads run over the lookups, a warp per lookup's row;
            # the first read of each bag's grad_output row over the bags (the other lookups of a
            # bag hit the L2 meanwhile or re-read it: they carry no more of those bytes); the row
            # and optimizer-state updates over the unique rows only. Each is capped by how few
            # rows there are to keep in flight (a 3-row table updates 3 rows, but still sorts and
            # reads every lookup's gradient at the lookups' parallelism). The first reads at the
            # lookups' parallelism had made a bag's grad_output faster to read the more rows it had
            first = min(grad_out, grad_dram)
            stream_gbs = _achieved_dram_gbs(gpu, k * per, _sectors(t.dim * GRAD_BYTES), 1)
            first_gbs = _achieved_dram_gbs(gpu, min(k, batch) * per, _sectors(t.dim * GRAD_BYTES), 1)
            # the sort keeps each lookup's key and value in flight, not a gradient row: at the
            # row's size a wider table had sorted faster (76.2 us at D = 8, 74.9 at D = 128)
            sort_gbs = _achieved_dram_gbs(gpu, k * per, index_bytes + 4, 1)
            update_gbs = _achieved_dram_gbs(gpu, u * per, r, 1)
            # a row's optimizer state (rowwise_adagrad's one float) is read before its update,
            # which needs it, so it keeps its own sector in flight, not the row: at the row's size
            # a wider table had updated its state faster (77.80 us at D = 16, 77.35 at D = 64)
            state_gbs = _achieved_dram_gbs(gpu, u * per, SECTOR_BYTES, 1)
            dram_ms = (sort / sort_gbs + (grad_dram - first) / stream_gbs + first / first_gbs
                       + 2 * u * r / update_gbs + state / state_gbs) / 1e6
        l2_ms = l2 / (l2_gbs * 1e9) * 1e3
        rows_out.append({"name": t.name, "rows": t.rows, "dim": t.dim, "pooling": t.pooling,
                         "distribution": d.describe(), "lookups": k, "unique_rows": u,
                         "hit_rate": (k - misses) / k if not backward else 0.0,
                         "l2_share_bytes": share, "dram_bytes": dram, "l2_bytes": l2,
                         "dram_ms": dram_ms, "l2_ms": l2_ms})
        for key in sums:
            sums[key] += rows_out[-1][key]
    if fused and not backward and len(tables) > 1:
        # one kernel: its tables' bytes share one memory pipe and their bags wait at once, so it
        # takes the longer of all their streaming and all their waiting (and of its slowest
        # table's bags alone), not the sum of each table's longer one. That sum, with each
        # table's waiting spread over the fused kernel's bags, had made a table of long bags
        # faster beside a table of short ones: 100k x 64 pooling 30 at 64 bags on an A100,
        # 10.10 us alone, 8.22 us fused with a pooling-5 table
        sums["dram_ms"] = max(stream_ms, wait_ms, chain_ms)
    lookups = sum(n)
    if not backward:
        fixed_ms = LAUNCH_MS * (1 if fused else len(tables))
    elif fused:
        fixed_ms = backward_fixed_ms(lookups, sum(t.rows for t in tables))
    else:  # one backward per table (torch's embedding_bag backward sorts and segments alike)
        fixed_ms = sum(backward_fixed_ms(k, t.rows) for k, t in zip(n, tables))
    busy_ms = max(sums["dram_ms"], sums["l2_ms"]) if fused else \
        sum(max(r["dram_ms"], r["l2_ms"]) for r in rows_out)
    time_ms = fixed_ms + busy_ms
    parts = {"unique_rows": sum(unique), "lookups": lookups,
             "hit_rate": sum(r["hit_rate"] * r["lookups"] for r in rows_out) / lookups,
             **sums, "launch_ms": fixed_ms, "l2_bw_gbs": l2_gbs,
             "bound": "dram" if sums["dram_ms"] >= sums["l2_ms"] else "l2",
             "analytic_ms": time_ms, "correction": 1.0}
    if correction is not None:
        factor = correction.factor(parts, tables, batch, gpu, backward)
        parts["correction"] = factor
        time_ms *= factor
    return LookupCost(time_ms=time_ms, parts=parts, per_table=rows_out)
