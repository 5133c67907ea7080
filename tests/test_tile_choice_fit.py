"""What the tile chooser learns from (kit.predict.tile_choice.TileChooser.fit)."""
import itertools

import pandas as pd
import pytest

from kit.errors import KitError
from kit.ops import linear
from kit.predict.tile_choice import TileChooser


def _rows(dtype, tile, threads, gpu="a100-pcie-40gb"):
    shapes = list(itertools.product([64, 512, 4096], [256, 1024, 8192], [512, 4096]))
    return pd.DataFrame({
        "op_class": "gemm", "op": "linear", "gpu": gpu, "dtype": dtype,
        "m": [s[0] for s in shapes], "n": [s[1] for s in shapes], "k": [s[2] for s in shapes],
        "b": 1, "tile_m": tile[0], "tile_n": tile[1], "tile_k": tile[2],
        "block_x": threads, "block_y": 1, "block_z": 1})


def test_the_chooser_learns_fp32_tiles_alone():
    """The chooser has no dtype input: a bf16 row's tensor-core tile, measured on the same
    shapes, must neither join its vocabulary nor be its answer for an FP32 GEMM."""
    pytest.importorskip("torch")
    frame = pd.concat([_rows("fp32", (128, 64, 8), 128), _rows("bf16", (128, 256, 64), 384),
                       _rows("bf16", (256, 128, 64), 384)], ignore_index=True)
    chooser = TileChooser.fit(frame, epochs=2, min_steps=20)
    assert [v[:2] for v in chooser.vocab] == [(128, 64)]
    assert chooser.choose([linear(4096, 4096, 8192)], "a100-pcie-40gb")[0][:2] == (128, 64)


def test_a_table_without_fp32_gemm_tiles_is_refused():
    pytest.importorskip("torch")
    with pytest.raises(KitError, match="no FP32 GEMM rows"):
        TileChooser.fit(_rows("bf16", (128, 256, 64), 384))
