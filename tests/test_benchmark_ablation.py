"""benchmarks/gemm_ablation.py's variants keep exactly the rows they name."""
import pandas as pd
import pytest
from benchmark_modules import load_benchmark


@pytest.fixture(scope="module")
def ablation():
    return load_benchmark("gemm_ablation")


ROWS = pd.DataFrame({"gpu": ["p4", "p4", "t4", "t4"], "latency_ms": [0.5, 5.0, 0.5, 5.0],
                     "op": ["linear", "bmm", "linear", "bmm"]})


def test_variants_drop_what_they_say(ablation):
    assert ablation.variant_rows(ROWS, "all").equals(ROWS)
    long_gone = ablation.variant_rows(ROWS, "drop_p4_long")
    assert list(zip(long_gone.gpu, long_gone.latency_ms)) == [("p4", 0.5), ("t4", 0.5), ("t4", 5.0)]
    assert set(ablation.variant_rows(ROWS, "drop_p4").gpu) == {"t4"}
    kept = ablation.variant_rows(ROWS, "drop_p4_linear")
    assert list(zip(kept.gpu, kept.op)) == [("p4", "bmm"), ("t4", "linear"), ("t4", "bmm")]


def test_an_unknown_variant_is_one_clear_error(ablation):
    with pytest.raises(SystemExit, match="unknown variant 'nope'; choose from all"):
        ablation.variant_rows(ROWS, "nope")
