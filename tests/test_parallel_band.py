"""The kernels' p10-p90 band carried up to a multi-GPU iteration (kit.parallel.predict_parallel)."""
import pandas as pd
import pytest

from kit.errors import KitError
from kit.hardware.system import get_system
from kit.parallel import GPTSpec, HostModel, Layout, predict_parallel
from kit.parallel.costs import Coster

NO_HOST = HostModel(launch_us=0.0, collective_us=0.0, p2p_sync=False)
SPEC = GPTSpec(layers=4, hidden=1024, heads=16, seq=512, vocab=32000, name="band")


class Banded:
    """1 µs per MFLOP for every kernel, with a band from `lo` to `hi` times that."""

    def __init__(self, lo, hi, name):
        self.lo, self.hi, self.name = lo, hi, name

    def predict(self, ops, gpu):
        ms = [max(op.flops, 1.0) / 1e9 for op in ops]
        return pd.DataFrame({"latency_ms": ms, "latency_p10_ms": [m * self.lo for m in ms],
                             "latency_p90_ms": [m * self.hi for m in ms]})


def test_band_scales_with_the_kernels_when_nothing_else_costs_time():
    """One GPU, no host costs, no collectives: the iteration is a sum of kernel times, so the
    band's ends are the iteration at the kernels' band ends, lo x and hi x the latency."""
    lay = Layout(micro_batch=2, global_batch=4, optimizer_step=False)
    r = predict_parallel(SPEC, "dgx-a100", lay, predictor=Banded(0.5, 2.0, "banded-a"),
                         host=NO_HOST, graph=False)
    assert r["band_ms"] == pytest.approx([0.5 * r["iteration_ms"], 2.0 * r["iteration_ms"]],
                                         rel=1e-9)


def test_collectives_keep_their_point_prediction():
    """With TP all-reduces in the passes, only the kernels move: the band's upper end is more
    than the iteration but less than twice it, and the gap to 2x is the unscaled communication."""
    lay = Layout(tp=8, micro_batch=1, global_batch=2, optimizer_step=False)
    mid = predict_parallel(SPEC, "dgx-a100", lay, predictor=Banded(1.0, 1.0, "banded-b"),
                           host=NO_HOST, graph=False)
    r = predict_parallel(SPEC, "dgx-a100", lay, predictor=Banded(0.5, 2.0, "banded-c"),
                         host=NO_HOST, graph=False)
    assert r["iteration_ms"] == pytest.approx(mid["iteration_ms"])
    comm = r["breakdown"]["communication"]
    assert comm > 0
    assert r["iteration_ms"] < r["band_ms"][1] < 2 * r["iteration_ms"]
    assert r["band_ms"][1] == pytest.approx(2 * r["iteration_ms"] - comm, rel=0.05)


def test_no_band_without_one_from_the_predictor():
    lay = Layout(tp=2, micro_batch=1, global_batch=2)
    r = predict_parallel(SPEC, "dgx-a100", lay, predictor="roofline", graph=False)
    assert r["band_ms"] == [r["iteration_ms"], r["iteration_ms"]]


def test_shipped_tile_predictor_band_brackets_the_iteration():
    lay = Layout(tp=2, pp=2, micro_batch=1, global_batch=4)
    r = predict_parallel(SPEC, "dgx-a100", lay, predictor="tile", graph=False)
    assert r["band_ms"][0] < r["iteration_ms"] < r["band_ms"][1]


def test_unknown_quantile_is_a_kit_error():
    with pytest.raises(KitError, match="unknown quantile"):
        Coster(Layout(), get_system("dgx-a100"), "roofline", quantile="p50")
