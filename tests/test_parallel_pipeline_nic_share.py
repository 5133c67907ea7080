"""A pipeline stage's tp x dp ranks send to the next stage at once, so on nodes with fewer NICs
than GPUs the concurrent cross-node sends share the node's NICs (kit.comm.algorithms.nic_share)."""
import pytest

from kit.comm import predict_collective
from kit.errors import KitError
from kit.hardware.system import get_system
from kit.parallel import Layout
from kit.parallel.costs import Coster

BIG = 2**30  # bandwidth-bound: the latency is a rounding error beside the wire time


def _boundary_ms(key: str, tp: int, dp: int, nbytes: float = BIG) -> float:
    system = get_system(key, nodes=2)
    c = Coster(Layout(tp=tp, dp=dp, pp=2, dtype="fp16"), system, "roofline")
    return c.comm_ms("sendrecv", nbytes, c.pp_pair(0, 1))


def _lone_ms(key: str) -> float:
    """One send from GPU 0 of node 0 to GPU 0 of node 1, nothing else on the wire."""
    system = get_system(key, nodes=2)
    return predict_collective("sendrecv", BIG, system, ranks=[0, system.gpus_per_node]).time_ms


@pytest.mark.parametrize("key,tp,dp", [("pcie8", 8, 1), ("pcie8", 4, 2), ("dgx1-v100", 8, 1),
                                       ("dgx1-v100", 4, 2), ("a100x4-nvlink", 4, 1),
                                       ("a100x4-nvlink", 2, 2)])
def test_stage_boundary_sends_share_the_node_nics(key, tp, dp):
    # stage 0 fills node 0 and stage 1 node 1: every GPU of a node sends across at once, so
    # each gets nics_per_node / gpus_per_node of a NIC (pcie8: 2/8, dgx1-v100: 4/8,
    # a100x4-nvlink: 2/4), and its send takes gpus / nics times a lone send's wire time
    system = get_system(key, nodes=2)
    slower = system.gpus_per_node / system.nics_per_node
    assert slower > 1
    assert _boundary_ms(key, tp, dp) / _lone_ms(key) == pytest.approx(slower, rel=0.03)


@pytest.mark.parametrize("key", ["dgx-a100", "dgx-h100"])
def test_one_nic_a_gpu_keeps_its_whole_nic(key):
    assert _boundary_ms(key, 8, 1) == pytest.approx(_lone_ms(key), rel=1e-9)


def test_sends_inside_a_node_are_unchanged():
    # pp 2 x tp 4 on one dgx1-v100: both stages in node 0, NVLink pairs, no NIC involved
    system = get_system("dgx1-v100")
    c = Coster(Layout(tp=4, dp=1, pp=2, dtype="fp16"), system, "roofline")
    lone = max(predict_collective("sendrecv", BIG, system, ranks=[t, t + 4]).time_ms for t in range(4))
    assert c.comm_ms("sendrecv", BIG, c.pp_pair(0, 1)) == pytest.approx(lone, rel=1e-9)


def test_one_sender_a_node_gets_a_whole_nic():
    # tp 1 x dp 1 x pp 16 on two pcie8 nodes: stages 7 and 8 are the only pair across the nodes,
    # a single send, as nccl-tests' two-rank sendrecv measures it
    system = get_system("pcie8", nodes=2)
    c = Coster(Layout(tp=1, dp=1, pp=16, dtype="fp16"), system, "roofline")
    pair = c.pp_pair(7, 8)
    assert list(pair) == [7, 8]
    assert c.comm_ms("sendrecv", BIG, pair) == pytest.approx(
        predict_collective("sendrecv", BIG, system, ranks=[7, 8]).time_ms, rel=1e-9)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_senders_must_be_a_positive_count(bad):
    with pytest.raises(KitError, match="senders"):
        predict_collective("sendrecv", 2**20, get_system("pcie8", nodes=2), ranks=[0, 8], senders=bad)


def test_a_fitted_lone_send_still_pays_its_nic_share():
    # a calibration measures nccl-tests' two-rank sendrecv: one send a node. Four concurrent
    # sends of a pcie8 node (one NIC for those four GPUs, node_nics) get 1/4 of that NIC, so
    # each byte takes 4x the fitted lone send's wire time (less the ~1% of local HBM traffic)
    from kit.comm.calibration import Calibration
    from kit.comm.curves import BandwidthCurve

    system = get_system("pcie8", nodes=2)
    fitted = BandwidthCurve(kind="sendrecv", ranks=2, floor_us=20.0, busbw_max_gbs=10.0,
                            half_bytes=2**16, steepness=1.0, nodes=2)
    cal = Calibration(system=system.key, curves=(fitted,))
    one = predict_collective("sendrecv", BIG, system, ranks=[0, 8], calibration=cal)
    four = predict_collective("sendrecv", BIG, system, ranks=[0, 8], calibration=cal, senders=4)
    assert one.source.startswith("calibration") and four.source.startswith("calibration")
    fitted_us_per_byte = 1.0 / (10.0 * 1e3)
    assert (four.time_ms - one.time_ms) * 1e3 == pytest.approx(3 * BIG * fitted_us_per_byte, rel=0.015)


@pytest.mark.parametrize("kind", ["allreduce", "alltoall"])
def test_senders_apply_to_every_kind(kind):
    # concurrent groups share the NICs whatever they run (a stage's DP all-reduces, its EP
    # groups' all-to-alls; the all-to-all had refused senders)
    system = get_system("pcie8", nodes=2)
    assert predict_collective(kind, 2**30, system, ranks=[0, 8], senders=8).time_ms > \
        3 * predict_collective(kind, 2**30, system, ranks=[0, 8]).time_ms


def test_a_fitted_shared_send_reports_the_time_it_predicts():
    # the extra wire time of a fitted lone send's NIC share belongs to its bandwidth part, its
    # plateau and its crossover too: they had stayed the lone send's (plateau 10 GB/s for a
    # 64 MiB send at 2.6 GB/s, bandwidth 6.7 of 25.7 ms)
    from kit.comm.calibration import Calibration
    from kit.comm.curves import BandwidthCurve

    system = get_system("pcie8", nodes=2)
    fitted = BandwidthCurve(kind="sendrecv", ranks=2, floor_us=20.0, busbw_max_gbs=10.0,
                            half_bytes=2**16, steepness=1.0, nodes=2)
    cal = Calibration(system=system.key, curves=(fitted,))
    r = predict_collective("sendrecv", BIG, system, ranks=[0, 8], calibration=cal, senders=4)
    assert r.latency_ms + r.bandwidth_ms == pytest.approx(r.time_ms, rel=1e-9)  # above the floor
    assert r.plateau_busbw_gbs == pytest.approx(r.busbw_gbs, rel=1e-3)  # 1 GiB: on the plateau
    x = predict_collective("sendrecv", r.crossover_bytes, system, ranks=[0, 8], calibration=cal, senders=4)
    # the crossover: where the bandwidth term reaches the latency term, the floor if larger
    assert x.bandwidth_ms == pytest.approx(max(x.latency_ms, x.floor_ms), rel=1e-6)
