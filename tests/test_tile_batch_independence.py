"""The tile a GEMM is shown with does not hang on the ops predicted beside it: a bound within
rounding of the latency is a tie (gemm_bounds.TIE_REL), not a cap that brings its twin's tile."""
from kit.ops import Gemm
from kit.predict import get_predictor


def test_a_gemm_shows_one_tile_alone_and_in_a_batch():
    p = get_predictor("tile")
    op = Gemm(2, 105, 53, dtype="bf16", kind="mm", align=4)
    others = [Gemm(18, 517, 2090, dtype="bf16", kind="mm", align=2), Gemm(64, 64, 64, dtype="bf16")]
    alone = p.predict([op], "a100-sxm4-40gb").iloc[0]
    for company in ([others[0]], others, [others[1], others[0]]):
        row = p.predict([op, *company], "a100-sxm4-40gb").iloc[0]
        assert (row.tile, row.tiles, row.split_k) == (alone.tile, alone.tiles, alone.split_k)
        assert abs(row.latency_ms / alone.latency_ms - 1) < 1e-9
