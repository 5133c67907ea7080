"""An NVLS all-reduce's cost per byte follows what each GPU's NVLink carries: the buffer once and
its own 1/n shard once each way, (1 + 1/n), read at 8 GPUs (it had been the same for any n)."""
import pytest

from kit.comm import predict_collective
from kit.comm.algorithms import NVLS_CALIBRATED_RANKS, nvls_wire, plans
from kit.comm.topology import resolve_group
from kit.hardware import get_system


def _nvls_per_byte(ranks):
    s = get_system("dgx-h100")
    (p,) = [p for p in plans(s, "allreduce", resolve_group(s, ranks)) if p.algorithm == "nvls"]
    return p.us_per_byte


def test_fewer_ranks_carry_more_a_byte_on_each_link():
    from kit.comm.algorithms import _kappa

    assert nvls_wire(NVLS_CALIBRATED_RANKS) == 1.0
    hbm = _kappa(get_system("dgx-h100"), True) / 2  # the local HBM term both share
    wire4, wire8 = _nvls_per_byte(4) - hbm, _nvls_per_byte(8) - hbm
    assert wire4 / wire8 == pytest.approx((1 + 1 / 4) / (1 + 1 / 8))


def test_an_eight_gpu_nvls_all_reduce_keeps_its_calibrated_time():
    r = predict_collective("allreduce", 1e9, "dgx-h100")
    assert r.algorithm == "nvls"
    four = predict_collective("allreduce", 1e9, "dgx-h100", ranks=4)
    assert four.time_ms > r.time_ms  # was: equal
