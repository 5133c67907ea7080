"""A norm row of up to 1,024 columns is never slower than one column more
(kit.predict.small_op_bounds.SmallOpBounds._norm_column_cap): PyTorch runs both widths on one
kernel, and the tile-MLP's features, which block the two sides apart, had made one bf16 row of
1,024 on an L4 1.8x slower than one of 1,025."""
import numpy as np
import pytest

from kit.hardware import get_gpu
from kit.ops import LayerNorm, RMSNorm
from kit.predict.small_op_bounds import NORM_SHORT_COLS


@pytest.fixture(scope="module")
def model():
    from kit.predict.weights import has_shipped, shipped_tile

    if not has_shipped():
        pytest.skip("no shipped weights")
    return shipped_tile()


@pytest.mark.parametrize("gpu", ["l4", "h200", "a100-pcie-80gb", "t4", "mi300x"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_norm_rows_never_get_faster_across_the_feature_switch(model, gpu, dtype):
    # widths PyTorch vectorises (multiples of 4): others run two kernels (kit.predict.norm_paths),
    # slower, so a LayerNorm of 1,023 is rightly slower than one of 1,024
    cols = list(range(NORM_SHORT_COLS - 64, NORM_SHORT_COLS + 68, 4))
    for rows in (1, 64, 4096):
        for kind in (LayerNorm, RMSNorm):
            lat = model.predict([kind(rows, c, dtype=dtype) for c in cols], gpu).latency_ms.to_numpy(float)
            assert (lat / np.maximum.accumulate(lat)).min() > 0.995, (kind.__name__, rows)


def test_the_cap_binds_where_the_sides_came_apart(model):
    # an RMSNorm (one kernel at any width in the kit) shows the cap alone; a LayerNorm of 1,025
    # columns also runs PyTorch's two kernels (kit.predict.norm_paths), slower still
    pair = [RMSNorm(1, 1024, dtype="bf16"), RMSNorm(1, 1025, dtype="bf16")]
    short, long_ = model.predict(pair, "l4").itertuples()
    assert short.latency_ms <= long_.latency_ms * (1 + 1e-9)
    assert short.latency_p10_ms <= short.latency_ms <= short.latency_p90_ms
    # the same rows uncapped: the feature blocking's side alone was the slower one
    raw = model._predict_class("layernorm", [RMSNorm(1, 1024, dtype="bf16")], get_gpu("l4"))
    assert raw.latency_ms.iloc[0] > 1.2 * long_.latency_ms
    ln = model.predict([LayerNorm(1, 1024, dtype="bf16"), LayerNorm(1, 1025, dtype="bf16")], "l4")
    assert ln.latency_ms.iloc[0] <= ln.latency_ms.iloc[1]
