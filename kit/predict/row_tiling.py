"""The tiling behind a prediction row (kit op's tiling line, kit.api.op_tiling): the Tiling whose
tile, tiles and waves are the row's. Where a bound set a GEMM's time (kit.predict.gemm_bounds:
a twin with more rows; kit.predict.sibling_bound: a training GPU it outdoes), the row carries
that twin's tile, tiles and waves, so the Tiling is the twin's, and RowTiling says which twin.
Searched, not recorded: the frames the predictors return keep one row per op, with no shape."""
from __future__ import annotations

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


def row_tiling(op, gpu: GPU, row, vocab=(), others=(), first: GPU | None = None) -> RowTiling | None:
    """The tiling behind a predictor's row for op on gpu; None for a GEMV the predictor streams
    (tile "gemv", kit.predict.gemv), which has no tiles. For a GEMM: the tile the predictor
    chose (a learned predictor reports the library's tile, named column-major as cuBLAS does,
    so its m x n is the kit's n x m), on the op, else on a twin the GEMM bounds compare it with
    (its rows doubled, its thin side padded), else on the GPUs in others (sibling_bound's), each
    matched by the row's tiles and waves; vocab: the tile chooser's (m, n, k step, threads),
    tried first; first: one of others to search before gpu (the one whose time the row took).
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
    own = _split(op, row)
    if t.tiles == row.tiles and t.waves == row.waves and tuple(t.tile_dims[:2]) in ((a, b), (b, a)):
        return RowTiling(t, op, gpu, True)  # the same tile: one 128x32 tile is not kit.tiling's one 32x32 tile
    shapes = _shapes(op.dtype, a, b, vocab)
    fallback = None
    order = [first] if first is not None else []
    for where in (*order, gpu, *[g for g in others if g is not first]):
        for j, twin in enumerate(_twins(op)):
            split = _split(twin, row)
            for shape in shapes:
                candidate = gemm_tiling_for(split, where, shape)
                if candidate.tiles != row.tiles:
                    continue
                if candidate.waves == row.waves:
                    return RowTiling(candidate, twin, where, j == 0 and where is gpu)
                if j == 0 and where is gpu:
                    fallback = fallback or candidate
    return RowTiling(fallback or tiling(own, gpu), op, gpu, True)


def _split(op, row):
    """op as the row ran it: its S-way split (kit.predict.split_k) where the row split k."""
    from kit.ops import Gemm

    split = int(getattr(row, "split_k", 1) or 1)
    if isinstance(op, Gemm) and split > 1:
        from kit.predict.split_k import split_op

        return split_op(op, split)
    return op


def _shapes(dtype: str, a: int, b: int, vocab) -> list[TileShape]:
    """The block shapes a tile named a x b (library m x n) may be: the chooser's own (vocab, its
    thread count), the op's own library tiles (SIMT for fp32, where SIMT and tensor-core tiles
    share a shape), the other kind's, then other thread counts; the kit's n x m orientation first."""
    own = SIMT_TILES if dtype == "fp32" else TENSOR_TILES
    other = TENSOR_TILES if own is SIMT_TILES else SIMT_TILES
    out = []
    for tm, tn in ((b, a), (a, b)):
        out += [TileShape(tm, tn, v[2], v[3]) for v in vocab if (v[1], v[0]) == (tm, tn)]
        out += [s for s in (*own, *other) if (s.tm, s.tn) == (tm, tn)]
        out += [TileShape(tm, tn, 8, threads) for threads in (256, 128, 64)]
    seen = []
    for s in out:
        if s not in seen:
            seen.append(s)
    return seen


def _twins(op) -> list:
    """op, then the twins kit.predict.gemm_bounds prices it by and shows the tile of where they
    bind: its thin side padded (padded_rows_ms), its rows doubled (doubled_rows_ms's chain)."""
    from dataclasses import replace

    from kit.predict.gemm_bounds import doubled_rows, padded_rows

    out = [op]
    r = min(op.m, op.n)
    side = "m" if op.m <= op.n else "n"
    out += [replace(op, **{side: w}) for w in padded_rows(r)]
    rows = doubled_rows(op)
    for _ in range(MAX_DOUBLINGS):
        if not rows:
            break
        out.append(replace(op, m=rows))
        rows *= 2
    return out
