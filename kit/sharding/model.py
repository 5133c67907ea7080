"""The cost of a sharding plan, vectorised over many plans at once.

iteration_ms = max_r fwd_r + max_r bwd_r          lookups; every rank waits for the slowest
             + a2a(indices) + 2·a2a(pooled)       input dist, output dist and its gradient
             + allreduce(Σ dp table gradients)     data-parallel tables
with a plan infeasible (inf) when a rank's weights + optimizer state (+ a data-parallel
replica's dense gradient) exceed the memory cap.

Each (table, option) adds a fixed vector of features: per-rank fwd and bwd lookup ms, shard
count, bytes held, lookups and rows (the backward's sort size), and for each all-to-all a block
of traffic features (kit.sharding.a2a). A plan's features are the sum over its tables, so
thousands of plans cost one numpy gather-sum. The all-to-all time comes from a surrogate fitted
to kit.comm.predict_alltoallv on probe matrices; `exact_cost` re-prices a plan with kit.comm
itself and with each rank's true L2 co-residency.
"""
from __future__ import annotations

import math
import os

import numpy as np

from kit.embedding import Empirical, Table, Uniform, lookup_cost
from kit.embedding.cost import LAUNCH_MS, OPTIMIZERS, backward_fixed_ms
from kit.embedding.distributions import RowBlock
from kit.errors import KitError, whole_number
from kit.ops import dtype_bytes
from kit.sharding.plans import KINDS, Option, count_options, options_for

OUT_BYTES = 4  # pooled embeddings travel as fp32
EMPTY_BLOCK_LOOKUPS = 1e-6  # a row-wise block no index of a real tensor reads (_row_blocks)
# the (tables, options, features) arrays held at once: contrib in float64 and float32, and 8
# bytes of room (the search had held a float64 array of every single-table move; it prices them
# in batches of kit.sharding.search.MOVE_CHUNK_VALUES now, and RSS at 1,024 GPUs, 2 tables, was
# 1.36 GB where these 20 bytes a feature say 1.84 GB)
MODEL_BYTES_PER_FEATURE = 8 + 4 + 8
MAX_MODEL_BYTES = 8 * 2**30
INDEX_BYTES = 8  # int64 indices and offsets
# samples a rank may look up per iteration: 2^40, as a model's tokens a step (kit.workload's
# MAX_TOKENS), past any GPU's memory by orders of magnitude. Unbounded, --batch 1e300 overflowed
# numpy's casts and priced each rank at 1.2e294 ms, with exit 0
MAX_BATCH = 2**40


def block_rows(rows: int, k: int) -> list[int]:
    """The rows of each of k row-wise blocks of a table of `rows` rows, as TorchRec cuts them:
    blocks of ceil(rows / k) rows from the first, the last rows in a shorter block, and none on
    the blocks past them (10 rows over 8 ranks: 2, 2, 2, 2, 2, 0, 0, 0). Every block had been
    given ceil(rows / k) rows: 16 rows held for a table of 10."""
    size = math.ceil(rows / k)
    return [max(0, min(size, rows - j * size)) for j in range(k)]


MEMINFO = "/proc/meminfo"  # Linux: MemAvailable, the memory it can give without swapping
# a container's limit and use (cgroup v2, then v1): MemAvailable reads the host's, where the
# OOM killer acts at the container's limit
CGROUP_LIMITS = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def _read_number(path: str) -> float | None:
    try:
        with open(path) as f:
            return float(f.read().split()[0])  # "max" (no limit) is a ValueError
    except (OSError, ValueError, IndexError):
        return None


def available_memory_bytes() -> float | None:
    """The memory this process can still take: Linux's MemAvailable, less where a container's
    cgroup limit leaves less; elsewhere (macOS, which has no /proc) the machine's physical
    memory, as os.sysconf gives it; None where none of these is known."""
    free = None
    try:
        with open(MEMINFO) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = float(line.split()[1]) * 1024  # kB
                    break
    except (OSError, ValueError, IndexError):
        pass
    for limit_path, used_path in CGROUP_LIMITS:
        limit, used = _read_number(limit_path), _read_number(used_path)
        if limit is not None and used is not None:
            free = min(free if free is not None else float("inf"), max(0.0, limit - used))
            break
    if free is None:
        try:
            free = float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (AttributeError, OSError, ValueError):
            pass
    return free


def _comm():
    try:
        import kit.comm as comm
    except ImportError as e:  # kit.comm is built by another engineer
        raise KitError(f"the collective model kit.comm is not available ({e})") from None
    return comm


def _ms(result) -> float:
    return float(getattr(result, "time_ms", result))


class ShardingModel:
    """Prices plans for `tables` on `system` at `batch` samples per rank."""

    def __init__(self, tables: list[Table], system, batch: int = 512, optimizer: str = "rowwise_adagrad",
                 memory_cap_bytes: float | None = None, kinds=KINDS, comm=None, memory_fraction: float = 0.9):
        batch = whole_number(batch, "batch")
        if batch > MAX_BATCH:
            raise KitError(f"batch {float(batch):.3g} samples per rank is more than any GPU looks up in one "
                           f"iteration (at most 2^40 = {MAX_BATCH:,}); give a smaller --batch")
        if optimizer not in OPTIMIZERS:
            raise KitError(f"unknown optimizer {optimizer!r}: choose one of {', '.join(OPTIMIZERS)}")
        if comm is not None and not all(callable(getattr(comm, f, None))
                                        for f in ("predict_alltoallv", "predict_collective")):
            raise KitError(f"comm must be a collective model like kit.comm (predict_alltoallv and "
                           f"predict_collective), or None for kit.comm, got {comm!r}")
        if not tables:
            raise KitError("no tables to shard")
        self.tables, self.system, self.batch, self.optimizer = list(tables), system, batch, optimizer
        self.comm = comm or _comm()
        self.world = W = system.world_size
        self.g = system.gpus_per_node
        self.gpu = system.gpu
        self.cap = float(memory_cap_bytes) if memory_cap_bytes else memory_fraction * self.gpu.usable_memory_bytes
        T, O = len(self.tables), max(count_options(t, W, self.g, kinds) for t in self.tables)
        F = 14 * W + 1  # at least: the per-rank features and two all-to-all blocks (kit.sharding.a2a)
        need = T * O * F * MODEL_BYTES_PER_FEATURE
        free = available_memory_bytes()
        limit, what = MAX_MODEL_BYTES, "the planner's limit of"
        if free is not None and free < limit:  # the OOM killer, minutes into the setup
            limit, what = free, "the memory this machine has free,"
        if need > limit:  # numpy's MemoryError, or the OOM killer with no word at all
            gib = need / 2**30
            raise KitError(f"planning {T} table(s) over {W} GPUs needs about "
                           f"{f'{gib:,.0f}' if gib >= 10 else f'{gib:.3g}'} GiB "
                           f"for the planner's cost model ({T} tables x {O:,} placements x "
                           f"{F:,} features; it grows as GPUs squared), over {what} "
                           f"{limit / 2**30:.3g} GiB; plan fewer nodes (--nodes) or "
                           f"fewer kinds (--kinds: tw and cw have a placement per GPU)")
        self.options = [options_for(t, W, self.g, kinds) for t in self.tables]
        stuck = [t.name or f"t{i}" for i, (t, o) in enumerate(zip(self.tables, self.options)) if not o]
        if stuck:
            raise KitError(f"no placement of kind {', '.join(kinds)} exists on {system.key} ({W} GPUs, "
                           f"{W // self.g} node(s)) for table(s) {', '.join(stuck[:5])}"
                           + (f" and {len(stuck) - 5} more" if len(stuck) > 5 else "")
                           + "; twrw needs several nodes, rw and dp several GPUs, cw a dim it can split; "
                           "allow more kinds")
        self.n_options = np.array([len(o) for o in self.options])
        from kit.sharding.a2a import A2ASurrogate

        self.a2a = A2ASurrogate(system, self.comm)
        self.a2a_fit_rel_err = self.a2a.max_rel_err
        A = self.a2a.size
        self.out_at, self.idx_at, self.dp_at = 6 * W, 6 * W + A, 6 * W + 2 * A
        self.F = 6 * W + 2 * A + 1
        self.contrib = np.zeros((T, O, self.F), dtype=np.float64)
        self.valid = np.zeros((T, O), dtype=bool)
        self._lookup_cache: dict = {}
        self._rank_cache: dict = {}  # a rank's shards -> _rank_lookups (exact_cost)
        self._blocks: dict = {}  # (table, k) -> its k row-wise blocks (_row_blocks)
        # A table shares its rank's L2 with the others there. The search's features take each
        # table's share in proportion to its footprint against an average rank's (a fast
        # estimate); exact_cost re-prices a plan as one fused kernel per rank shares it
        # (kit.embedding.cost: Che's approximation forward, grad_output backward).
        foot = np.array([self._footprint(tab, tab.rows, tab.pooling, batch * W) for tab in self.tables])
        self.l2_shares = np.minimum(1.0, foot / max(foot.sum() / W, 1e-9))
        for t, opts in enumerate(self.options):
            for o, opt in enumerate(opts):
                self.contrib[t, o] = self._features(t, opt)
                self.valid[t, o] = True
        self.contrib[~self.valid, 3 * W] = np.inf  # a padded option is never feasible
        self.contrib32 = self.contrib.astype(np.float32)
        self._fit_surrogates()

    # -- per-option features ------------------------------------------------------------
    @staticmethod
    def _footprint(tab: Table, rows: int, pooling: float, batch: int) -> float:
        dist = tab.distribution or Uniform()
        return dist.expected_unique(batch * pooling, max(1, rows)) * tab.sector_row_bytes

    def _rank_l2_shares(self, shards: list) -> tuple[list[float], list[float]]:
        """The share of the L2 each shard on one rank holds, forward and backward, as one fused
        kernel of them shares it (kit.embedding.cost.fused_l2_shares); each at least 1e-3."""
        from kit.embedding.cost import L2_USABLE_FRACTION, fused_l2_shares

        if not shards:
            return [], []
        l2 = L2_USABLE_FRACTION * self.gpu.l2_cache_bytes
        tabs, batches = [s[2] for s in shards], [s[3] for s in shards]
        dists = [t.distribution or Uniform() for t in tabs]
        return tuple([max(min(x / l2, 1.0), 1e-3) for x in fused_l2_shares(tabs, dists, batches, l2, bwd)]
                     for bwd in (False, True))

    def _state_bytes(self, rows: int) -> float:
        return 4.0 * rows if self.optimizer == "rowwise_adagrad" else 0.0

    def _shard_bytes(self, tab: Table, opt, rows: int, dim: int) -> float:
        """A shard's memory on its rank: its rows, the optimizer's state and, for a data-parallel
        replica, its dense gradient, which the step writes whole and all-reduces (the time
        charged it, traffic() all-reduces it, but the cap had not counted it: a replicated
        table took half the memory it needs)."""
        weights = rows * dim * dtype_bytes(tab.dtype)
        return weights * (2 if opt.kind == "dp" else 1) + self._state_bytes(rows)

    def _shard_ms(self, table: Table, rows: int, dim: int, pooling: float, batch: int,
                  l2_share: float, bwd_l2_share: float | None = None, dist="table") -> tuple[float, float]:
        """(fwd, bwd) ms of one shard, cached on everything the cost depends on: the shard's shape,
        dtype and index distribution (by value; None is uniform), batch and L2 shares (the
        backward's, where it differs). The name is only a label: equal tables share an entry, and
        unnamed tables do not collide. dist: the shard's own index distribution (a row-wise shard
        of a real index tensor's, _row_blocks), else the table's."""
        dist = (table.distribution if dist == "table" else dist) or Uniform()
        bwd_l2_share = l2_share if bwd_l2_share is None else bwd_l2_share
        # shares to 3 significant digits, and priced at those: priced at the first caller's own
        # share (and keyed to 3 decimals), a plan's price had depended on the plans priced before
        # it (a hot table at 0.00573 or 0.00589 of the L2: 16.0738 or 16.0799 us, by call order)
        l2_share, bwd_l2_share = float(f"{l2_share:.3g}"), float(f"{bwd_l2_share:.3g}")
        key = (rows, dim, pooling, table.dtype, dist, batch, l2_share, bwd_l2_share)
        if key not in self._lookup_cache:
            shard = Table(rows=max(1, rows), dim=dim, pooling=pooling, dtype=table.dtype,
                          name=table.name, distribution=dist)
            f = lookup_cost(shard, batch, self.gpu, l2_share=l2_share)
            b = lookup_cost(shard, batch, self.gpu, backward=True, optimizer=self.optimizer,
                            l2_share=bwd_l2_share)
            self._lookup_cache[key] = (f.time_ms - f.parts["launch_ms"], b.time_ms - b.parts["launch_ms"])
        return self._lookup_cache[key]

    def shards(self, t: int, opt: Option):
        """(rank, rows, dim, pooling, batch, distribution) of each shard of table t under opt."""
        tab, W, b = self.tables[t], self.world, self.batch
        d = tab.distribution
        if opt.kind == "tw":
            return [(opt.ranks[0], tab.rows, tab.dim, tab.pooling, b * W, d)]
        if opt.kind == "cw":
            k = len(opt.ranks)
            return [(r, tab.rows, tab.dim // k, tab.pooling, b * W, d) for r in opt.ranks]
        if opt.kind in ("rw", "twrw"):
            k = len(opt.ranks)
            return [(r, rows, tab.dim, pooling, b * W, dist)
                    for r, rows, (pooling, dist) in zip(opt.ranks, block_rows(tab.rows, k), self._row_blocks(t, k))]
        if opt.kind == "dp":
            return [(r, tab.rows, tab.dim, tab.pooling, b, d) for r in opt.ranks]
        raise KitError(f"unknown sharding kind {opt.kind!r}")

    def _row_blocks(self, t: int, k: int) -> list[tuple[float, object]]:
        """(pooling, index distribution) of each of table t's k row-wise shards (block_rows:
        blocks of ceil(rows / k) rows). A distribution of row ranks spreads its hot rows over the
        blocks (ids hashed), so each block takes its rows' share of the pooling (pooling / k where
        k divides the rows) and holds that share of the rows the table's lookups touch (RowBlock;
        a uniform block is uniform over its own rows); a real
        index tensor (Empirical) gives each block the indices in its rows, re-based, and their
        share of the lookups: its hot rows stay where they are. (Every shard had been given the
        whole tensor, which names rows past a shard's: no plan with a row-wise option could be
        priced.)"""
        key = (t, k)
        if key not in self._blocks:
            tab = self.tables[t]
            d = tab.distribution
            if not isinstance(d, Empirical):
                # hashed ids spread the lookups over the rows, so a block takes its rows' share of
                # them; a block past the last row takes none (rows 10 over 8 ranks: 2,2,2,2,2,0,0,0
                # rows, where every rank had held 2 rows and taken an eighth of the lookups). Its
                # distribution is a RowBlock of that same share, E/n blocks' worth, not 1/k: a
                # k-th had the blocks of 37 rows over 64 ranks touch 0.58 of the rows the table's
                # lookups touch (1001 rows: 0.978), where each block takes 1/37 of the lookups.
                def block(n):
                    if not n:
                        return Uniform()
                    if d is None or isinstance(d, Uniform) or n == tab.rows:
                        return d
                    return RowBlock(d, k if n * k == tab.rows else tab.rows / n, tab.rows)
                self._blocks[key] = [(tab.pooling * max(n, EMPTY_BLOCK_LOOKUPS) / tab.rows, block(n))
                                     for n in block_rows(tab.rows, k)]
            else:
                rows, ids = math.ceil(tab.rows / k), d.indices
                self._blocks[key] = []
                for j in range(k):
                    mine = ids[(ids >= j * rows) & (ids < (j + 1) * rows)] - j * rows
                    # a block no index reads does no lookup: a vanishing pooling, not 0 (a Table's
                    # pooling is positive), under the uniform distribution
                    self._blocks[key].append((tab.pooling * max(mine.size, EMPTY_BLOCK_LOOKUPS) / ids.size,
                                              Empirical(mine) if mine.size else Uniform()))
        return self._blocks[key]

    def traffic(self, t: int, opt: Option):
        """(out_sends, idx_sends, dp_grad_bytes): the output and index all-to-alls' bytes from
        rank i to rank j as kit.sharding.a2a.Sends (.matrix() gives the W x W matrix)."""
        from kit.sharding.a2a import Sends

        tab, W, b = self.tables[t], self.world, self.batch
        out, idx = Sends(W), Sends(W)
        if opt.kind == "dp":
            return out, idx, dtype_bytes(tab.dtype) * tab.rows * tab.dim  # the gradient in the table dtype

        def on(ranks, values=1.0):  # a vector over the ranks: values on `ranks`, 0 elsewhere
            v = np.zeros(W)
            v[list(ranks)] = values
            return v

        if opt.kind in ("tw", "cw"):  # each shard's rank sends its columns to every other rank
            d = tab.dim // len(opt.ranks)
            out.add(on(opt.ranks, b * d * OUT_BYTES), 1.0)
            idx.add(1.0, on(opt.ranks, b * (tab.pooling + 1) * INDEX_BYTES))
        elif opt.kind == "rw":
            out.add(b * tab.dim * OUT_BYTES, 1.0)
            blocks = self._row_blocks(t, W)  # the indices each rank's rows take
            idx.add(1.0, [b * (pooling + 1) * INDEX_BYTES for pooling, _ in blocks])
        elif opt.kind == "twrw":
            R, g = opt.ranks, len(opt.ranks)
            # intra-node reduce-scatter of partial sums, then to the owners
            out.add(on(R, b * W / g * tab.dim * OUT_BYTES), on(R))
            idx.add(1.0, on(R, [b * (pooling + 1) * INDEX_BYTES for pooling, _ in self._row_blocks(t, g)]))
            for k in range(g):  # rank R[k] sends to every rank j with j % g == k
                out.add(on([R[k]], b * tab.dim * OUT_BYTES), np.arange(W) % g == k)
        return out, idx, 0.0

    def _features(self, t: int, opt: Option) -> np.ndarray:
        W, tab = self.world, self.tables[t]
        v = np.zeros(self.F)
        for r, rows, dim, pooling, batch, dist in self.shards(t, opt):
            f, b = self._shard_ms(tab, rows, dim, pooling, batch, float(self.l2_shares[t]), dist=dist)
            if opt.kind == "dp":  # dense gradient: read + write every row once more
                b += 2 * tab.rows * tab.row_bytes / (self.gpu.mem_bw_gbs * 1e9) * 1e3
            v[r] += f
            v[W + r] += b
            v[2 * W + r] += 1
            v[3 * W + r] += self._shard_bytes(tab, opt, rows, dim)
            v[4 * W + r] += batch * pooling  # lookups and rows: the backward's sort size
            v[5 * W + r] += rows
        out, idx, dp = self.traffic(t, opt)
        for at, sends in ((self.out_at, out), (self.idx_at, idx)):
            v[at:at + self.a2a.size] = self.a2a.block_of(sends)
        v[self.dp_at] = dp
        return v

    # -- surrogates for the collectives --------------------------------------------------
    def _fit_surrogates(self):
        """The all-reduce of data-parallel gradients: a + b·bytes fitted to kit.comm."""
        from scipy.optimize import nnls

        sizes = np.geomspace(1e4, 4e9, 14)
        ar = np.array([_ms(self.comm.predict_collective("allreduce", s, self.system)) for s in sizes])
        A = np.stack([np.ones_like(sizes), sizes], axis=1)
        self.ar_coef, _ = nnls(A / ar[:, None], np.ones_like(ar))

    # -- evaluation ----------------------------------------------------------------------
    def features(self, choices: np.ndarray) -> np.ndarray:
        """(P, T) option indices -> (P, F) summed features."""
        choices = np.asarray(choices)
        T = len(self.tables)
        out = np.zeros((choices.shape[0], self.F), dtype=np.float32)
        for t in range(T):
            out += self.contrib32[t, choices[:, t]]
        return out

    def cost_from_features(self, X: np.ndarray, detail: bool = False):
        W = self.world
        has = X[:, 2 * W:3 * W] > 0
        fwd = X[:, :W] + LAUNCH_MS * has
        bwd = X[:, W:2 * W] + self._bwd_fixed(X[:, 4 * W:5 * W], X[:, 5 * W:6 * W]) * has
        A = self.a2a.size
        out_ms = self.a2a.time_ms(X[:, self.out_at:self.out_at + A])
        idx_ms = self.a2a.time_ms(X[:, self.idx_at:self.idx_at + A])
        dp = X[:, self.dp_at]
        ar_ms = np.where(dp > 0, self.ar_coef[0] + self.ar_coef[1] * dp, 0.0)
        total = fwd.max(1) + bwd.max(1) + 2 * out_ms + idx_ms + ar_ms
        over = (X[:, 3 * W:4 * W] > self.cap).any(1)
        total = np.where(over, np.inf, total)
        if detail:
            return dict(total=total, fwd=fwd, bwd=bwd, out_a2a_ms=out_ms, idx_a2a_ms=idx_ms,
                        allreduce_ms=ar_ms, mem_bytes=X[:, 3 * W:4 * W], over=over)
        return total

    @staticmethod
    def _bwd_fixed(lookups, rows):
        """backward_fixed_ms, vectorised over ranks and plans."""
        from kit.embedding import cost as C

        base = C.BWD_HELPER_KERNELS * C.HELPER_KERNEL_MS + C.BWD_MAIN_KERNELS * C.MAIN_KERNEL_FLOOR_MS
        passes = np.maximum(1, np.ceil(np.log2(np.maximum(rows, 2)) / 8))
        extra = 2 * C.HELPER_KERNEL_MS + passes * C.SORT_PASS_MS
        return base + np.where(lookups > C.SORT_SINGLE_TILE_KEYS, extra, 0.0)

    def cost(self, choices: np.ndarray) -> np.ndarray:
        """Cost in ms of each plan in a (P, T) array of option indices (inf when over the cap)."""
        choices = np.atleast_2d(np.asarray(choices))
        return np.concatenate([self.cost_from_features(self.features(c))
                               for c in np.array_split(choices, max(1, len(choices) // 2048))])

    def describe(self, choice) -> dict:
        """The parts of one plan under the vectorised model."""
        d = self.cost_from_features(self.features(np.asarray(choice)[None]), detail=True)
        return {"cost_ms": float(d["total"][0]), "per_rank_ms": (d["fwd"] + d["bwd"])[0].tolist(),
                "fwd_ms": d["fwd"][0].tolist(), "bwd_ms": d["bwd"][0].tolist(),
                "output_alltoall_ms": float(d["out_a2a_ms"][0]), "input_alltoall_ms": float(d["idx_a2a_ms"][0]),
                "allreduce_ms": float(d["allreduce_ms"][0]), "memory_bytes": d["mem_bytes"][0].tolist(),
                "over_memory_cap": bool(d["over"][0])}

    def _rank_lookups(self, rank_shards: list) -> tuple[list[tuple[float, float]], float, float]:
        """One rank's fused lookup: each shard's own (fwd, bwd) ms, priced with the L2 share it
        holds in the fused kernel (a dp shard's backward with its dense gradient), and the
        kernel's fixed costs no shard owns, (fwd launch, bwd floors) in ms; 0 on an idle rank."""
        if not rank_shards:
            return [], 0.0, 0.0
        key = tuple(rank_shards)  # (table, kind, shard Table, batch): what the pricing reads
        if key not in self._rank_cache:  # plans re-priced together share most of their ranks
            self._rank_cache[key] = self._price_rank(rank_shards)
        return self._rank_cache[key]

    def _price_rank(self, rank_shards: list) -> tuple[list[tuple[float, float]], float, float]:
        own = []
        for (t, kind, shard, batch), fs, bs in zip(rank_shards, *self._rank_l2_shares(rank_shards)):
            f, b = self._shard_ms(self.tables[t], shard.rows, shard.dim, shard.pooling, batch, fs, bs,
                                  dist=shard.distribution)
            if kind == "dp":
                b += 2 * self.tables[t].rows * self.tables[t].row_bytes / (self.gpu.mem_bw_gbs * 1e9) * 1e3
            own.append((f, b))
        fixed_bwd = backward_fixed_ms(sum(s[2].pooling * s[3] for s in rank_shards),
                                      sum(s[2].rows for s in rank_shards))
        return own, LAUNCH_MS, fixed_bwd

    def exact_cost(self, choice) -> dict:
        """A plan re-priced with kit.comm itself and each rank's true L2 co-residency.

        Beside the parts of the cost: fixed_ms, each rank's fused-kernel fixed costs (its
        forward's launch, its backward's kernel floors), and shard_ms, (table index, rank,
        fwd + bwd ms) of every shard on its own; a rank's per_rank_ms is the sum of its
        shards' shard_ms plus its fixed_ms."""
        W = self.world
        shards = [[] for _ in range(W)]
        out_m, idx_m, dp = np.zeros((W, W)), np.zeros((W, W)), 0.0
        mem = np.zeros(W)
        for t, o in enumerate(choice):
            opt = self.options[t][o]
            tab = self.tables[t]
            for r, rows, dim, pooling, batch, dist in self.shards(t, opt):
                shard = Table(rows=max(1, rows), dim=dim, pooling=pooling, dtype=tab.dtype,
                              distribution=dist)
                shards[r].append((t, opt.kind, shard, batch))
                mem[r] += self._shard_bytes(tab, opt, rows, dim)
            out, idx, g = self.traffic(t, opt)
            out_m += out.matrix()
            idx_m += idx.matrix()
            dp += g
        fwd, bwd, fixed, shard_ms = np.zeros(W), np.zeros(W), np.zeros(W), []
        for r in range(W):
            own, fixed_fwd, fixed_bwd = self._rank_lookups(shards[r])
            fwd[r] = sum(f for f, _ in own) + fixed_fwd
            bwd[r] = sum(b for _, b in own) + fixed_bwd
            fixed[r] = fixed_fwd + fixed_bwd
            shard_ms += [(t, r, f + b) for (t, *_), (f, b) in zip(shards[r], own)]
        a2a = lambda m: _ms(self.comm.predict_alltoallv(m, self.system)) if m.sum() > 0 else 0.0
        out_ms, back_ms, idx_ms = a2a(out_m), a2a(out_m.T.copy()), a2a(idx_m)
        ar_ms = _ms(self.comm.predict_collective("allreduce", dp, self.system)) if dp > 0 else 0.0
        cost = fwd.max() + bwd.max() + out_ms + back_ms + idx_ms + ar_ms
        if (mem > self.cap).any():
            cost = math.inf
        return {"cost_ms": float(cost), "per_rank_ms": (fwd + bwd).tolist(), "fwd_ms": fwd.tolist(),
                "bwd_ms": bwd.tolist(), "output_alltoall_ms": out_ms, "grad_alltoall_ms": back_ms,
                "input_alltoall_ms": idx_ms, "allreduce_ms": ar_ms, "memory_bytes": mem.tolist(),
                "over_memory_cap": bool((mem > self.cap).any()), "fixed_ms": fixed.tolist(),
                "shard_ms": shard_ms}

    def labels(self, choice) -> list[str]:
        return [self.options[t][o].label() for t, o in enumerate(choice)]
