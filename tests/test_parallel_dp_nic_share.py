"""The collectives a stage's groups run at once across nodes share each node's NICs: the tp DP
groups' gradient all-reduces (reduce-scatters and all-gathers under ZeRO), and the tp x dp pairs
of the tied embedding's all-reduce between the first and last stages. A NIC's line rate caps the
flows of every NCCL communicator through it (kit.comm.topology.node_net_gbs)."""
import warnings

import pytest

from kit.comm import predict_collective
from kit.comm.calibration import Calibration
from kit.comm.curves import BandwidthCurve
from kit.errors import KitError
from kit.hardware.system import get_system
from kit.parallel import Layout, predict_parallel
from kit.parallel.costs import Coster

BIG = 2**30  # bandwidth-bound: the latency is a rounding error beside the wire time


def _dp_ms(key: str, tp: int, dp: int, kind: str, nodes: int = 2) -> tuple[float, float]:
    """(the stage's DP collective as the Coster prices it, its group's alone)."""
    system = get_system(key, nodes=nodes)
    c = Coster(Layout(tp=tp, dp=dp, pp=1, dtype="fp16"), system, "roofline")
    group = c.group("dp", 0)
    alone = max(predict_collective(kind, BIG, system, ranks=list(g)).time_ms
                for g in (group, *group.peers))
    return c.comm_ms(kind, BIG, group), alone


@pytest.mark.parametrize("kind", ["allreduce", "reducescatter", "allgather"])
@pytest.mark.parametrize("key", ["pcie8", "dgx1-v100", "a100x4-nvlink"])
def test_dp_groups_of_one_gpu_a_node_share_the_node_nics(key, kind):
    # tp = GPUs a node, dp 2 on two nodes: each of the tp DP groups has one GPU in each node and
    # all of them reduce at once, so each gets nics / gpus of a NIC (pcie8 2/8, dgx1-v100 4/8,
    # a100x4-nvlink 2/4) where alone it has a whole one: its wire time grows gpus / nics times
    system = get_system(key, nodes=2)
    shared, alone = _dp_ms(key, system.gpus_per_node, 2, kind)
    slower = system.gpus_per_node / system.nics_per_node
    assert slower > 1
    assert shared / alone == pytest.approx(slower, rel=0.03)


@pytest.mark.parametrize("key", ["dgx-a100", "dgx-h100"])
@pytest.mark.parametrize("tp,dp", [(8, 2), (4, 4), (2, 8)])
def test_a_nic_a_gpu_keeps_each_dp_group_its_own_nics(key, tp, dp):
    shared, alone = _dp_ms(key, tp, dp, "allreduce")
    assert shared == pytest.approx(alone, rel=1e-9)


@pytest.mark.parametrize("key", ["pcie8", "dgx1-v100", "a100x4-nvlink"])
def test_dp_groups_inside_one_node_are_unchanged(key):
    # one node: no NIC on the way, whatever the sharing
    system = get_system(key)
    shared, alone = _dp_ms(key, 2, system.gpus_per_node // 2, "allreduce", nodes=1)
    assert shared == pytest.approx(alone, rel=1e-9)


def test_dp_groups_of_gpus_on_two_switches_meet_on_their_nics():
    # tp 4 x dp 4 on two dgx1-v100 nodes (a NIC on each PCIe switch of 2 GPUs: GPU i on NIC
    # i // 2): DP group t has GPUs t and t + 4 in each node, on NICs t // 2 and t // 2 + 2, so
    # alone it has 2 NICs, and groups t and t ^ 1 use the same two: 2 groups a NIC, 2 x 1/2 =
    # 1 NIC each, what 4 groups placed alike (8 GPUs over 4 NICs: 4 / 4) get. Its GPUs had been
    # counted on 1 NIC alone too (packed: ceil(2 x 4 / 8)), so shared and alone had agreed
    system = get_system("dgx1-v100", nodes=2)
    c = Coster(Layout(tp=4, dp=4, pp=1, dtype="fp16"), system, "roofline")
    group = c.group("dp", 0)
    shared, alone = _dp_ms("dgx1-v100", 4, 4, "allreduce")
    assert shared == pytest.approx(max(predict_collective("allreduce", BIG, system, ranks=list(g), senders=4).time_ms
                                       for g in (group, *group.peers)), rel=1e-9)
    assert shared / alone > 1.5


def test_the_tied_embedding_all_reduce_shares_the_node_nics():
    # tp 8, pp 2 on two pcie8 nodes: the 8 (first, last) pairs cross between the nodes at once,
    # each on 2/8 of a NIC: 4x the wire time of a lone pair. The embedding shard is bandwidth
    # bound: [51,200 / 8, 8,192] fp16 = 105 MB, ~9.9 ms on one 100 GbE NIC against ~0.06 ms latency
    lay = Layout(dp=1, tp=8, pp=2, micro_batch=1, global_batch=2, dtype="fp16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = predict_parallel("gpt:layers=2,hidden=8192,heads=64,seq=128,vocab=50257", "pcie8", lay,
                               nodes=2, predictor="roofline", graph=False, keep=True)["_result"]
    g = res.graph
    ops = [i for i, label in enumerate(g.label) if "tied embedding grads all-reduce" in label
           and g.kind[i] == "comm"]
    assert ops
    nbytes = 51200 // 8 * 8192 * 2
    alone = predict_collective("allreduce", nbytes, get_system("pcie8", nodes=2), ranks=[0, 8]).time_ms
    for i in ops:
        assert g.dur_ms[i] / alone == pytest.approx(4.0, rel=0.03)


@pytest.mark.parametrize("plateau_gbs", [6.0, 10.0, 12.0])
@pytest.mark.parametrize("kind,senders", [("sendrecv", 4), ("allreduce", 8), ("alltoall", 8)])
def test_a_fitted_lone_group_shares_its_own_measured_rate(kind, senders, plateau_gbs):
    # a calibration measures a group alone. s groups on one NIC (pcie8: 4 sends, or 8 two-rank
    # all-reduces or all-to-alls over its 2 NICs, each on 1/4 of a NIC) each get a 1/4 of the
    # rate measured, whatever the preset's NIC rate: the fitted bandwidth part grows 4x (within
    # the ~1% of local HBM traffic the preset's ratio holds). Adding the preset's extra wire
    # time had made it 2.7x at a fitted 6 GB/s and 4.4x at 12 (the preset NIC: 10.6 GB/s)
    system = get_system("pcie8", nodes=2)
    fitted = BandwidthCurve(kind=kind, ranks=2, floor_us=20.0, busbw_max_gbs=plateau_gbs,
                            half_bytes=2**16, steepness=1.0, nodes=2)
    cal = Calibration(system=system.key, curves=(fitted,))
    one = predict_collective(kind, BIG, system, ranks=[0, 8], calibration=cal)
    many = predict_collective(kind, BIG, system, ranks=[0, 8], calibration=cal, senders=senders)
    assert one.source.startswith("calibration") and many.source.startswith("calibration")
    assert many.bandwidth_ms / one.bandwidth_ms == pytest.approx(4.0, rel=0.015)
    assert many.latency_ms == pytest.approx(one.latency_ms, rel=1e-9)  # the wire is shared, not the steps


def test_groups_crossing_on_different_nodes_share_node_by_node():
    # tp 6 x dp 4 on three pcie8 nodes (2 NICs for 8 GPUs): the TP group of ranks 6-11 crosses
    # alone on node 0 (GPUs 6, 7) and with ranks 12-17's group on node 1, where their 4 + 4 GPUs
    # have a NIC each. No NIC carries two groups, so the TP all-reduce is the lone groups' time;
    # node 1's count of 2 applied to node 0 too had halved the group's NICs there (167 -> 268 ms)
    system = get_system("pcie8", nodes=3)
    c = Coster(Layout(tp=6, dp=4, pp=1, dtype="fp16"), system, "roofline")
    group = c.group("tp", 0)
    alone = max(predict_collective("allreduce", BIG, system, ranks=list(g)).time_ms
                for g in (group, *group.peers))
    assert c.comm_ms("allreduce", BIG, group) == pytest.approx(alone, rel=1e-9)


def test_senders_node_by_node_agree_with_one_count_and_are_checked():
    system = get_system("pcie8", nodes=2)
    one = predict_collective("allreduce", BIG, system, ranks=[0, 8], senders=8).time_ms
    assert predict_collective("allreduce", BIG, system, ranks=[0, 8], senders=(8, 8)).time_ms == \
        pytest.approx(one, rel=1e-12)
    # the busier node decides: 8 groups meet on node 1 even if this one crosses alone on node 0
    assert predict_collective("allreduce", BIG, system, ranks=[0, 8], senders=(1, 8)).time_ms == \
        pytest.approx(one, rel=1e-12)
    for bad in [(8,), (8, 8, 8), (8, 0), ()]:
        with pytest.raises(KitError, match="senders"):
            predict_collective("allreduce", BIG, system, ranks=[0, 8], senders=bad)
    with pytest.raises(KitError, match="senders"):
        predict_collective("sendrecv", BIG, system, ranks=[0, 8], senders=(4, 4))
