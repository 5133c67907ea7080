"""The tiling behind a prediction row (kit op's tiling line, kit.api.op_tiling): the Tiling whose
tile, tiles and waves are the row's. Where a bound set a GEMM's time (kit.predict.gemm_bounds:
a twin with more rows; kit.predict.sibling_bound: a training GPU it outdoes), the row carries
that twin's tile, tiles and waves, so the Tiling is the twin's, and RowTiling says which twin.
Searched, not recorded: the frames the predictors return keep one row per op, with no shape."""
from __future__ import annotations

import math
from dataclasses import dataclass

from kit.hardware import GPU
from kit.tiling import SIMT_TILES, TENSOR_TILES, TileShape, Tiling, gemm_tiling_for, tiling

MAX_DOUBLINGS = 30  # the row bound's chain stops at a 20 us roofline, far below 2**30 rows


@dataclass(frozen=True)
class RowTiling:
    """tiling: the Tiling of the row's tile; op and gpu: what it tiles (the op itself on its own
    GPU, or the twin or training GPU whose time the row took); own: whether that is the op's own."""

    tiling: Tiling
    op: object
    gpu: GPU
    own: bool


def row_tiling(op, gpu: GPU, row, vocab=(), others=(), first: GPU | None = None,
               times_of=None, verify_own: bool = True) -> RowTiling | None:
    """The tiling behind a predictor's row for op on gpu; None for a GEMV the predictor streams
    (tile "gemv", kit.predict.gemv), which has no tiles. For a GEMM: the tile the predictor
    chose (a learned predictor reports the library's tile, named column-major as cuBLAS does,
    so its m x n is the kit's n x m), on the op, else on a twin the GEMM bounds compare it with
    (_twins), else on the GPUs in others (sibling_bound's), each matched by the row's tiles and
    waves; vocab: the tile chooser's (m, n, k step, threads), tried first; first: one of others
    to search before gpu (the one whose time the row took). The library's orientation is tried
    on every twin before the kit's: a 64 x 64 x 64 on an A100-PCIe-80GB takes its 8,192-row
    twin's 128 tiles of 32x128 (library names: the kit's 128 x 32), and a twin-major search had
    named the 4,096-row twin, whose 128 tiles are 32 x 128 the kit's way.
    times_of(twins, where): their frame on where with no twin's bound (TilePredictor's, see
    kit.api._row_tiling), one batch per GPU; where given, the first match whose time and tile
    are the row's is taken, so that of twins with the same tiles and waves (the padded ladder's
    9 .. 32 rows on a 32-row tile) the one named is the one whose time it is; the first match
    otherwise. verify_own: whether the op's own tiling is checked so too where it matches (a
    3-row twin of a 2-row GEMM has its tiles); False where no twin's bound set the time.
    Other ops: kit.tiling's."""
    from kit.ops import Gemm

    if str(getattr(row, "tile", "")) == "gemv":
        return None
    t = tiling(_split(op, row), gpu)
    if not isinstance(op, Gemm) or not row.tile or t is None:
        return None if t is None else RowTiling(t, op, gpu, True)
    try:
        a, b = (int(x) for x in str(row.tile).split("x"))
    except ValueError:
        return RowTiling(t, op, gpu, True)
    own = RowTiling(t, op, gpu, True)
    mine = t.tiles == row.tiles and t.waves == row.waves and tuple(t.tile_dims[:2]) in ((a, b), (b, a))
    if mine and (times_of is None or not verify_own):
        return own  # the same tile: one 128x32 tile is not kit.tiling's one 32x32 tile
    fallback, found = None, [own] if mine else []
    order = [first] if first is not None else []
    places = (*order, gpu, *[g for g in others if g is not first])
    tiles, waves = int(row.tiles), int(row.waves)
    twins_at = {}
    for tm, tn in ((b, a), (a, b)):  # the library's orientation on every twin first
        shapes = _shapes(op.dtype, tm, tn, vocab)
        for where in places:
            if where not in twins_at:
                twins_at[where] = list(_twins(op, where))
            for twin in twins_at[where]:
                split = _split(twin, row)
                if split.b * math.ceil(split.m / tm) * math.ceil(split.n / tn) != tiles:
                    continue  # no block size of this tile matches: no tiling needed
                is_own = twin is op and where is gpu
                for shape in shapes:
                    candidate = gemm_tiling_for(split, where, shape)
                    if candidate.waves == waves:
                        if times_of is None:
                            return RowTiling(candidate, twin, where, is_own)
                        found.append(RowTiling(candidate, twin, where, is_own))
                        break  # another block size of this twin has the same time
                    if is_own:
                        fallback = fallback or RowTiling(candidate, op, gpu, True)
    if found:
        return _whose_time(found, row, times_of)
    return fallback or RowTiling(tiling(_split(op, row), gpu), op, gpu, True)


def _whose_time(found: list, row, times_of) -> RowTiling:
    """The first of found whose twin's own time and tile are row's (cap_at scales a latency to
    its bound, so within rounding), one batch of twins per GPU; found[0] where none is."""
    ok = {}
    for where in dict.fromkeys(f.gpu for f in found):
        twins = list(dict.fromkeys(f.op for f in found if f.gpu is where))
        frame = times_of(twins, where)
        mine = float(row.latency_ms)
        for twin, ref in zip(twins, frame.itertuples()):
            ok[(twin, where)] = (abs(float(ref.latency_ms) - mine) <= 1e-9 * mine
                                 and str(ref.tile) == str(row.tile) and int(ref.tiles) == int(row.tiles)
                                 and int(ref.waves) == int(row.waves)
                                 and int(ref.split_k or 1) == int(getattr(row, "split_k", 1) or 1))
    return next((f for f in found if ok[(f.op, f.gpu)]), found[0])


def _split(op, row):
    """op as the row ran it: its S-way split (kit.predict.split_k) where the row split k."""
    from kit.ops import Gemm

    split = int(getattr(row, "split_k", 1) or 1)
    if isinstance(op, Gemm) and split > 1:
        from kit.predict.split_k import split_op

        return split_op(op, split)
    return op


def _shapes(dtype: str, tm: int, tn: int, vocab) -> list[TileShape]:
    """The block shapes of a tm x tn tile (the kit's orientation): the chooser's own (vocab, in
    the library's m x n, with its thread count), the op's own library tiles (SIMT for fp32,
    where SIMT and tensor-core tiles share a shape), the other kind's, then other thread counts."""
    own = SIMT_TILES if dtype == "fp32" else TENSOR_TILES
    other = TENSOR_TILES if own is SIMT_TILES else SIMT_TILES
    out = [TileShape(tm, tn, v[2], v[3]) for v in vocab if (v[1], v[0]) == (tm, tn)]
    out += [s for s in (*own, *other) if (s.tm, s.tn) == (tm, tn)]
    out += [TileShape(tm, tn, 8, threads) for threads in (256, 128, 64)]
    return list(dict.fromkeys(out))  # each once, in order


def _twins(op, gpu: GPU):
    """op, then the twins kit.predict.gemm_bounds may show the tile of where they set its time,
    each once: its rows doubled (doubled_rows_ms's chain, to the first twin whose roofline on gpu
    reaches DOUBLE_ROOF_MS), its thin side padded or its reduction lengthened (padded_rows_ms),
    those with their rows doubled (a padded twin is predicted with its own row bound), the
    doubled twins padded (each is predicted with its own padding ladder), and those doubled
    again. A 24-column GEMM of 40 rows may take the time of 80 x 48 (its doubled twin's padded
    one), which neither the ladder nor the chain of the op itself holds."""
    seen = set()

    def once(twins):
        for t in twins:
            key = (t.m, t.n, t.k)
            if key not in seen:
                seen.add(key)
                yield t

    yield from once([op])
    chain = list(_chain(op, gpu))
    yield from once(chain)
    padded = [p for t in (op, *chain) for p in _padded(t)]
    yield from once(p for p in padded if not p.m > op.m)  # the op's own ladder first
    yield from once(p for p in padded if p.m > op.m)
    for p in padded:  # a chain met before goes on as it did (2m at each step): cut there
        yield from once(_chain(p, gpu, seen))


def _chain(op, gpu: GPU, stop=()):
    """op's doubled twins (kit.predict.gemm_bounds.doubled_rows_ms), up to the first whose
    roofline on gpu reaches DOUBLE_ROOF_MS, or before the first whose (m, n, k) is in stop."""
    from kit.predict.gemm_bounds import DOUBLE_ROOF_MS, _with_side, doubled_rows
    from kit.predict.roofline import roofline

    rows = doubled_rows(op)
    if not rows or roofline(op, gpu).time_ms >= DOUBLE_ROOF_MS:
        return
    for _ in range(MAX_DOUBLINGS):
        twin = _with_side(op, "m", rows)
        if (twin.m, twin.n, twin.k) in stop:
            return
        yield twin
        if roofline(twin, gpu).time_ms >= DOUBLE_ROOF_MS:
            return
        rows *= 2


def _padded(op) -> list:
    """op's twins on padded_rows_ms's ladder: its thin side padded, its reduction lengthened."""
    from kit.predict.gemm_bounds import PAD_ROWS_MAX, _with_side, padded_k, padded_rows

    r = min(op.m, op.n)
    side = "m" if op.m <= op.n else "n"
    out = [_with_side(op, side, w) for w in padded_rows(r)] if 1 <= r < PAD_ROWS_MAX else []
    return out + [_with_side(op, "k", w) for w in padded_k(op.k)]
