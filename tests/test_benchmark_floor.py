"""benchmarks/tile_floor.py's data checks on small hand-made tables: batch inversions and the
train/test shift find what was planted, and nothing where nothing was."""
import pandas as pd
import pytest
from benchmark_modules import load_benchmark


@pytest.fixture(scope="module")
def floor():
    return load_benchmark("tile_floor")


def gemm_rows(rows):
    return pd.DataFrame([{"op": "bmm", "op_class": "gemm", "b": b, "m": 64, "n": 196, "k": 196,
                          "latency_ms": t} for b, t in rows])


def test_batch_inversions_counts_a_faster_larger_batch(floor):
    clean = floor.batch_inversions(gemm_rows([(8, 0.10), (16, 0.19), (32, 0.37)]))
    assert clean["pairs"] == 3 and clean["inverted"] == 0 and clean["worst"] is None
    noisy = floor.batch_inversions(gemm_rows([(8, 0.10), (16, 0.19), (32, 0.08)]))
    assert noisy["inverted"] == 2 and noisy["pairs"] == 3
    # the worst inversion is b=16 at 0.19 ms against b=32 at 0.08 ms
    assert noisy["worst"]["b"] == [16, 32]
    assert noisy["worst"]["faster_by"] == pytest.approx(0.19 / 0.08, abs=1e-3)


def test_batch_inversions_ignores_pairs_below_the_time_floor(floor):
    # b=32 at 0.03 ms is under min_ms: launch noise, not a measurement of the kernel
    out = floor.batch_inversions(gemm_rows([(8, 0.10), (32, 0.03)]))
    assert out["pairs"] == 0 and out["inverted"] == 0


def vector_rows(op, cls, shapes, per_elem_ms):
    return pd.DataFrame([{"op": op, "op_class": cls, "rows": r, "cols": c,
                          "latency_ms": r * c * per_elem_ms} for r, c in shapes])


def test_train_test_shift_finds_a_planted_speed_up(floor):
    train = pd.concat([vector_rows("ln", "layernorm", [(16000, 1000), (9000, 3000)], 1e-8),
                       vector_rows("add", "elementwise", [(1, 10 ** 7)], 2e-8)])
    # layer norm test rows 25% faster per element, within 10% of a training shape; one far away
    test = pd.concat([vector_rows("ln", "layernorm", [(16384, 1024), (8192, 3072)], 1e-8 / 1.25),
                      vector_rows("ln", "layernorm", [(10 ** 6, 768)], 1e-9),
                      vector_rows("add", "elementwise", [(1, 1.05 * 10 ** 7)], 2e-8)])
    out = floor.train_test_shift(train, test)
    assert out["layernorm"] == {"matched": 2, "test_faster_by": pytest.approx(1.25, abs=1e-3)}
    assert out["elementwise"] == {"matched": 1, "test_faster_by": pytest.approx(1.0, abs=1e-3)}
    assert "softmax" not in out  # no rows of it on either side


def test_sustained_efficiency_finds_a_planted_slowdown_of_long_kernels(floor):
    from kit.hardware import get_gpu

    peak = get_gpu("t4").gemm_peak_flops_per_s("fp32")

    def row(m, share, op="linear"):
        flops = 2.0 * m * 1024 * 1024
        return {"op": op, "op_class": "gemm", "b": 1, "m": m, "n": 1024, "k": 1024,
                "latency_ms": flops / (share * peak) * 1e3}

    # short kernels at 60% of peak, long ones at 30%; a skinny one and a bmm are left out
    rows = pd.DataFrame([row(1024, 0.6), row(2048, 0.6), row(2 ** 17, 0.3), row(2 ** 18, 0.3),
                         row(64, 0.9), row(4096, 0.99, op="bmm")])
    assert rows.latency_ms.iloc[1] < 1.0 < rows.latency_ms.iloc[2]  # the bands the test means
    predicted = rows.latency_ms.to_numpy() * 1.5  # a model 1.5x slow everywhere
    out = floor.sustained_efficiency(rows, "t4", predicted)
    short = out["0-1 ms"]
    long_ = [v for k, v in out.items() if k != "0-1 ms"]
    assert short == {"n": 2, "peak_share": 0.6, "predicted_over_measured": 1.5}
    assert sum(v["n"] for v in long_) == 2 and all(v["peak_share"] == 0.3 for v in long_)
    assert list(out)[0] == "0-1 ms"  # bands in duration order, the shortest first
    assert "predicted_over_measured" not in floor.sustained_efficiency(rows, "t4")["0-1 ms"]


def test_shape_spread_finds_two_clock_states_in_one_shape(floor):
    """A shape whose big batches ran at two rates (a clock that switched mid-sweep) spreads by
    their ratio; a level one by 1; small batches (under the work floor) and shapes with too few
    rows count for nothing."""
    m = n = k = 512
    flop = 2 * m * n * k

    def rows(shape, rates):  # (b, TFLOP/s) -> latency
        mm, nn, kk = shape
        return [{"op": "bmm", "op_class": "gemm", "b": b, "m": mm, "n": nn, "k": kk,
                 "latency_ms": 2 * b * mm * nn * kk / (r * 1e9)} for b, r in rates]

    two = rows((m, n, k), [(128, 6.0), (160, 12.0), (192, 6.0), (256, 12.0), (2, 1.0)])
    level = rows((256, 256, 256), [(1024, 9.0), (2048, 9.0), (4096, 9.0), (8192, 9.0)])
    few = rows((64, 64, 64), [(10 ** 6, 5.0), (2 * 10 ** 6, 10.0)])
    out = floor.shape_spread(pd.DataFrame(two + level + few))
    assert 2 * 128 * flop >= 20e9  # the planted big batches are over the floor; b = 2 is not
    assert out["bmm"]["shapes"] == 2
    assert out["bmm"]["median"] == pytest.approx((2.0 + 1.0) / 2)
    assert out["bmm"]["over_1_5x"] == pytest.approx(0.5)
