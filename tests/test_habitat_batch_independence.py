"""Habitat predicts each op as it would alone: the origin GPU it scales from is chosen by the op's
own dtypes, not by every dtype in the batch beside it."""
import pytest

from kit.ops import Attention, Elementwise, Gemm, RMSNorm
from kit.predict import get_predictor

ALONE_AND_BESIDE = [
    # (gpu, op, a GEMM of another dtype whose presence moved the origin)
    ("a10", RMSNorm(23, 13, "fp16"), Gemm(5, 32, 4, dtype="bf16", kind="linear", shared_rhs=True)),
    ("a10", Elementwise("add", 19, "fp16"), Gemm(64, 64, 64, dtype="bf16")),
    ("l4", Gemm(256, 256, 256), Gemm(256, 256, 256, dtype="bf16")),
    ("l4", Attention(2, 8, 128, 128, 64, "fp16"), Gemm(64, 64, 64, dtype="bf16")),
]


@pytest.mark.parametrize("gpu,op,other", ALONE_AND_BESIDE)
def test_habitat_row_is_the_same_alone_and_in_a_batch(gpu, op, other):
    hab = get_predictor("habitat")
    alone = hab.predict([op], gpu).iloc[0]
    for batch in ([op, other], [other, op, op], [other, other, op, other]):
        rows = hab.predict(batch, gpu)
        for i, o in enumerate(batch):
            if o == op:
                for col in ("latency_ms", "latency_p10_ms", "latency_p90_ms", "utilisation"):
                    assert rows[col].iloc[i] == pytest.approx(alone[col], rel=1e-12), (col, batch)


def test_habitat_still_refuses_a_batch_with_an_op_no_training_gpu_runs():
    from kit.errors import KitError

    hab = get_predictor("habitat")
    with pytest.raises(KitError, match="fp8"):
        hab.predict([Gemm(64, 64, 64), Gemm(64, 64, 64, dtype="fp8")], "h100-sxm")
