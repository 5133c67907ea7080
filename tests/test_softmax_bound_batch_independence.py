"""A softmax's row-latency bound (kit.predict.small_op_bounds._softmax_row_latency) lifts only the
ops it bounds: an op with no row latency keeps its own time whatever shares its batch."""
import pytest

from kit.ops import Softmax
from kit.predict import get_predictor

CASES = [
    # (gpu, an op the bound leaves alone, an op it bounds)
    ("mi210", Softmax(211545, 1, "fp32"), Softmax(1, 1025, "fp32")),  # AMD: warp row beside a block row
    ("mi210", Softmax(138920, 1, "fp16"), Softmax(4, 8192, "fp16")),
    ("mi300x", Softmax(3, 1, "fp8"), Softmax(2, 4096, "fp8")),
    ("v100-sxm2-32gb", Softmax(41, 14219, "fp16"), Softmax(41, 1000, "fp16")),  # NVIDIA: past the warp kernel
]


@pytest.mark.parametrize("gpu,free,bound", CASES)
def test_softmax_time_does_not_depend_on_its_batch(gpu, free, bound):
    tile = get_predictor("tile")
    alone = tile.predict([free], gpu).iloc[0]
    for batch in ([free, bound], [bound, free, bound]):
        row = tile.predict(batch, gpu).iloc[batch.index(free)]
        for col in ("latency_ms", "latency_p10_ms", "latency_p90_ms"):
            assert row[col] == pytest.approx(alone[col], rel=1e-9), (col, batch)
    # and the bounded op is still bounded as it is alone
    assert tile.predict([free, bound], gpu).latency_ms.iloc[1] == pytest.approx(
        tile.predict([bound], gpu).latency_ms.iloc[0], rel=1e-9)
