"""A MoE stage's EP groups (one a tp rank, and one a run of ep DP ranks) run their dispatch and
combine all-to-alls at once: those crossing nodes share each node's NICs, as the stage's other
concurrent collectives do (kit.comm.algorithms.uniform_alltoall_us, topology.shared_nics)."""
import pytest

from kit.comm import predict_collective
from kit.hardware.system import get_system
from kit.parallel import Layout
from kit.parallel.costs import Coster

BIG = 2**30  # bandwidth-bound: the latency is a rounding error beside the wire time


def _ep_ms(key: str, tp: int, dp: int, ep: int, nodes: int = 2) -> tuple[float, float]:
    """(the stage's EP all-to-all as the Coster prices it, its group's alone)."""
    system = get_system(key, nodes=nodes)
    c = Coster(Layout(tp=tp, dp=dp, ep=ep, pp=1, dtype="fp16"), system, "roofline")
    group = c.group("ep", 0)
    alone = max(predict_collective("alltoall", BIG, system, ranks=list(g)).time_ms
                for g in (group, *group.peers))
    return c.comm_ms("alltoall", BIG, group), alone


@pytest.mark.parametrize("key", ["pcie8", "dgx1-v100", "a100x4-nvlink"])
def test_ep_groups_of_one_gpu_a_node_share_the_node_nics(key):
    # tp = GPUs a node, dp 2, ep 2 on two nodes: each of the tp EP groups has one GPU in each
    # node, and all of them dispatch at once, so each gets nics / gpus of a NIC (pcie8 2/8,
    # dgx1-v100 4/8, a100x4-nvlink 2/4) where alone it has a whole one
    system = get_system(key, nodes=2)
    shared, alone = _ep_ms(key, system.gpus_per_node, 2, 2)
    slower = system.gpus_per_node / system.nics_per_node
    assert slower > 1
    assert shared / alone == pytest.approx(slower, rel=0.03)


@pytest.mark.parametrize("key", ["pcie8", "dgx1-v100", "a100x4-nvlink", "dgx-h100"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_concurrent_ep_groups_take_as_long_as_one_group_moving_the_same_bytes(key, tp):
    # tp EP groups of 2 x gpus / tp ranks send, all together, what one EP group of all 2 x gpus
    # ranks (tp 1) sends off each node: (n - c) / n of each GPU's buffer. With the node's NICs
    # shared they take its time; alone on a pcie8 node at tp 8 a group had taken 1/4 of it
    system = get_system(key, nodes=2)
    g = system.gpus_per_node
    if tp > g:
        pytest.skip("tp beyond a node")
    world = 2 * g
    shared, _ = _ep_ms(key, tp, world // tp, world // tp)
    flat, _ = _ep_ms(key, 1, world, world)
    assert shared == pytest.approx(flat, rel=0.02)


@pytest.mark.parametrize("key", ["dgx-a100", "dgx-h100"])
@pytest.mark.parametrize("tp,dp,ep", [(8, 2, 2), (4, 4, 4), (2, 8, 8)])
def test_a_nic_a_gpu_keeps_each_ep_group_its_own_nics(key, tp, dp, ep):
    shared, alone = _ep_ms(key, tp, dp, ep)
    assert shared == pytest.approx(alone, rel=1e-9)


@pytest.mark.parametrize("key", ["pcie8", "dgx1-v100", "a100x4-nvlink"])
def test_ep_groups_inside_one_node_are_unchanged(key):
    system = get_system(key)
    g = system.gpus_per_node
    shared, alone = _ep_ms(key, 2, g // 2, g // 2, nodes=1)
    assert shared == pytest.approx(alone, rel=1e-9)
    # ep within dp at tp 4 on two nodes: EP groups (0, 4), (8, 12) stay inside their node
    shared, alone = _ep_ms(key, g // 2, 4, 2)
    assert shared == pytest.approx(alone, rel=1e-9)


def test_ep_groups_of_gpus_on_two_switches_meet_on_their_nics():
    # tp 4 x dp 4 x ep 4 on two dgx1-v100 nodes: EP group t has GPUs t and t + 4 in each node,
    # on NICs t // 2 and t // 2 + 2 (GPU i on NIC i // 2), which group t ^ 1 uses too: each
    # gets 1 NIC of its 2, as 4 groups placed alike do (4 NICs / 4); alone it has both
    system = get_system("dgx1-v100", nodes=2)
    c = Coster(Layout(tp=4, dp=4, ep=4, pp=1, dtype="fp16"), system, "roofline")
    group = c.group("ep", 0)
    shared, alone = _ep_ms("dgx1-v100", 4, 4, 4)
    assert shared == pytest.approx(max(predict_collective("alltoall", BIG, system, ranks=list(g), senders=4).time_ms
                                       for g in (group, *group.peers)), rel=1e-9)
    assert shared / alone > 1.5


def test_alltoall_takes_senders_as_every_kind_does():
    system = get_system("pcie8", nodes=2)
    alone = predict_collective("alltoall", BIG, system, ranks=[0, 8])
    eight = predict_collective("alltoall", BIG, system, ranks=[0, 8], senders=8)
    assert eight.bandwidth_ms / alone.bandwidth_ms == pytest.approx(4.0, rel=0.015)
    assert eight.latency_ms == pytest.approx(alone.latency_ms, rel=1e-9)
    assert predict_collective("alltoall", BIG, system, ranks=[0, 8], senders=(8, 8)).time_ms == \
        pytest.approx(eight.time_ms, rel=1e-12)
    # the busier node decides, either way round
    for counts in [(1, 8), (8, 1)]:
        assert predict_collective("alltoall", BIG, system, ranks=[0, 8], senders=counts).time_ms == \
            pytest.approx(eight.time_ms, rel=1e-12)
    # a NIC a GPU: any sharing keeps each group's own NICs
    h100 = get_system("dgx-h100", nodes=2)
    assert predict_collective("alltoall", BIG, h100, ranks=[0, 8], senders=8).time_ms == \
        pytest.approx(predict_collective("alltoall", BIG, h100, ranks=[0, 8]).time_ms, rel=1e-12)

