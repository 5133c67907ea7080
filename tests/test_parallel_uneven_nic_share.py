"""Groups that sit unevenly on a node's NICs (kit.comm.topology.gpu_nics, group_nics,
shared_nics). A node with r NICs for g GPUs (r < g) has a NIC on each PCIe switch, serving GPUs
i with i x r // g equal to its index (DGX-1: GPU i on NIC i // 2; pcie8: GPUs 0-3 on NIC 0, 4-7
on NIC 1). A group uses the NICs of its GPUs, and groups crossing nodes at once split a NIC only
where they both use it. Expected NIC counts below are worked out by hand from that map."""
import pytest

from kit.comm import predict_collective
from kit.comm.topology import nics_by_node, resolve_group
from kit.errors import KitError
from kit.hardware.system import get_system
from kit.parallel import Layout
from kit.parallel.costs import Coster

BIG = 2**30  # bandwidth-bound: the latency is a rounding error beside the wire time


@pytest.mark.parametrize("key,ranks,nics", [
    ("dgx1-v100", [0, 2, 4, 6, 8, 10, 12, 14], 4.0),  # GPUs 0, 2, 4, 6: NICs 0, 1, 2, 3 (packed: 2)
    ("dgx1-v100", [0, 4, 8, 12], 2.0),                # GPUs 0, 4: NICs 0, 2 (packed: 1)
    ("pcie8", [3, 4, 11, 12], 2.0),                   # GPUs 3, 4: NICs 0, 1 (packed: 1)
    ("pcie8", [0, 1, 8, 9], 1.0),                     # GPUs 0, 1: both on NIC 0
    ("dgx-a100", [0, 4, 8, 12], 2.0),                 # a NIC a GPU
])
def test_a_lone_group_uses_the_nics_of_its_gpus(key, ranks, nics):
    system = get_system(key, nodes=2)
    group = resolve_group(system, ranks)
    assert nics_by_node(system, group) == [(len(ranks) // 2, nics)] * 2


def test_a_lone_group_on_four_nics_runs_at_four_nics():
    # an all-to-all over GPUs 0, 2, 4, 6 of two DGX-1 nodes: each GPU sends 4/8 of its buffer off
    # its node, 2 buffers a node over its 4 NICs = 0.5 buffer a NIC, as much as each GPU's own
    # NIC carries; so its network time is what the 2 GPUs [0, 8] take, each sending 1/2 of its
    # buffer over its own NIC. Counted on 2 NICs it had taken twice that
    system = get_system("dgx1-v100", nodes=2)
    four = predict_collective("alltoall", BIG, system, ranks=[0, 2, 4, 6, 8, 10, 12, 14])
    pair = predict_collective("alltoall", BIG, system, ranks=[0, 8])
    nic_gbs = system.network.nic_bw_gbs * system.network.efficiency
    assert pair.bandwidth_ms == pytest.approx(BIG / 2 / nic_gbs / 1e6, rel=0.02)  # the wire, ~1% HBM on top
    assert four.bandwidth_ms < 1.02 * pair.bandwidth_ms


def test_tp3_groups_crossing_on_different_nics_keep_their_own():
    # tp 3 x dp 8 on three DGX-1 nodes: the TP groups of ranks 6-8 and 15-17 both cross from
    # node 1, from GPU 0 (NIC 0) and GPU 7 (NIC 3): no NIC carries both, so each runs as alone.
    # Counted (2 groups on node 1, placed as 1 GPU each: 2 GPUs' packed NIC / 2) each had half a NIC
    system = get_system("dgx1-v100", nodes=3)
    c = Coster(Layout(tp=3, dp=8, pp=1, dtype="fp16"), system, "roofline")
    group = c.group("tp", 0)
    alone = max(predict_collective("allreduce", BIG, system, ranks=list(g)).time_ms for g in (group, *group.peers))
    assert c.comm_ms("allreduce", BIG, group) == pytest.approx(alone, rel=1e-9)


def test_tp3_dp_groups_meeting_on_a_nic_take_half_of_it():
    # tp 3 x dp 4 on two DGX-1 nodes: the DP groups are ranks (0, 3, 6, 9), (1, 4, 7, 10) and
    # (2, 5, 8, 11). On node 1 NIC 0 serves GPUs 0 and 1 (group 2's and group 0's), NIC 1 GPUs
    # 2 and 3 (group 1's and group 2's): groups 0 and 1 get half a NIC there, the slowest share
    # of the stage (group 2 gets 2 x 1/2 = 1 NIC on node 1; on node 0 each group's 2-3 GPUs span
    # NICs that carry 2 groups each: 1-1.5 NICs). Half a NIC is what a 1-GPU group gets with one
    # other group on its NIC (senders 2 on node 1: 2 GPUs' NIC / 2). The 3 groups had split
    # node 1's 2 NICs evenly, 2/3 of a NIC each
    system = get_system("dgx1-v100", nodes=2)
    c = Coster(Layout(tp=3, dp=4, pp=1, dtype="fp16"), system, "roofline")
    group = c.group("dp", 0)
    expected = predict_collective("allreduce", BIG, system, ranks=[0, 3, 6, 9], senders=(1, 2)).time_ms
    assert c.comm_ms("allreduce", BIG, group) == pytest.approx(expected, rel=1e-9)


def test_placed_groups_agree_with_a_count_where_they_sit_alike():
    # tp 8 on two pcie8 nodes: 8 DP groups of one GPU a node, 4 on each NIC: 1/4 NIC each,
    # as senders=8 (8 GPUs over 2 NICs, / 8) says
    system = get_system("pcie8", nodes=2)
    placed = tuple((i,) for i in range(8))
    assert predict_collective("allreduce", BIG, system, ranks=[0, 8], senders=(placed, placed)).time_ms == \
        pytest.approx(predict_collective("allreduce", BIG, system, ranks=[0, 8], senders=8).time_ms, rel=1e-12)


@pytest.mark.parametrize("bad", [(((0,), (8,)), 1), (((),), 1), ((), 1), (((0.5,),), 1), (((True,),), 1)])
def test_placed_senders_are_checked(bad):
    system = get_system("pcie8", nodes=2)
    with pytest.raises(KitError, match="senders"):
        predict_collective("allreduce", BIG, system, ranks=[0, 8], senders=bad)


def _uneven_pcie8_alltoall_expected_ms(system) -> float:
    # pcie8 GPUs 0, 1, 2, 4 of each of two nodes (n = 8, 4 a node): each GPU sends 4/8 of its
    # buffer off its node through its own NIC (no NVLink, so no PXN): NIC 0 (GPUs 0-3) carries
    # 3 x 1/2 = 1.5 buffers, NIC 1 0.5. The wire time is NIC 0's; spread evenly over the 2 NICs
    # it had been 1 buffer's. (The intra-node part, 3/8 of a buffer over PCIe, is shorter.)
    nic_gbs = system.network.nic_bw_gbs * system.network.efficiency
    return 1.5 * BIG / nic_gbs / 1e6


def test_an_all_to_all_loads_each_nic_with_its_own_gpus_bytes():
    system = get_system("pcie8", nodes=2)
    ranks = [0, 1, 2, 4, 8, 9, 10, 12]
    got = predict_collective("alltoall", BIG, system, ranks=ranks)
    assert got.bandwidth_ms == pytest.approx(_uneven_pcie8_alltoall_expected_ms(system), rel=0.02)  # ~1% HBM


def test_an_uneven_all_to_all_matrix_loads_each_nic_with_its_own_gpus_bytes():
    from kit.comm import predict_alltoallv

    system = get_system("pcie8", nodes=2)
    ranks = [0, 1, 2, 4, 8, 9, 10, 12]
    matrix = [[BIG / 8] * 8 for _ in range(8)]
    got = predict_alltoallv(matrix, system, ranks=ranks)
    assert got.bandwidth_ms == pytest.approx(_uneven_pcie8_alltoall_expected_ms(system), rel=0.02)


def test_a_group_runs_at_its_most_shared_nic_times_its_nics():
    # pcie8 GPUs 3 and 4 (NICs 0 and 1) beside a group on GPU 0 (NIC 0): NIC 0 carries 2 groups,
    # NIC 1 only this one. Its channels carry equal bytes, so each goes at NIC 0's 1/2 share:
    # 2 NICs x 1/2 = 1 NIC, not the 1/2 + 1 = 1.5 of its shares summed
    system = get_system("pcie8", nodes=2)
    group = resolve_group(system, [3, 4, 11, 12])
    placed = ((3, 4), (0,))
    assert nics_by_node(system, group, (placed, placed)) == [(2, 1.0)] * 2


def test_every_preset_with_fewer_nics_than_gpus_states_its_gpu_nic_map():
    # which GPUs a NIC serves moves a group's NICs (above), so a preset sharing NICs says in its
    # source (`kit systems --json`) the map the kit takes, NIC by NIC, as gpu_nics derives it
    from kit.comm.topology import gpu_nics
    from kit.hardware.system import list_systems

    shared = [get_system(k) for k in list_systems()]
    shared = [s for s in shared if s.nics_per_node < s.gpus_per_node]
    assert {s.key for s in shared} >= {"dgx1-v100", "pcie8", "a100x4-nvlink"}
    for s in shared:
        for nic in range(s.nics_per_node):
            gpus = [i for i in range(s.gpus_per_node) if nic in gpu_nics(s, i)]
            assert f"GPUs {gpus[0]}-{gpus[-1]} on NIC {nic}" in s.source, (s.key, nic)


def test_an_all_to_all_matrix_follows_the_order_of_the_ranks_given():
    # pcie8 x2, ranks 4, 1, 2, 0 | 12, 9, 10, 8: row 0 is GPU 4's (NIC 1, alone there), sending
    # 4 x 2^26 B, 1/8 to each rank; the others 2^26 B, 1/8 to each. Node 1's NIC 0 (GPUs 8, 9, 10
    # of it, rows 5-7) then receives the most: each of them 2^26 / 8 x (4 + 3) from node 0, 3 x
    # 7/8 x 2^26 B in all. Read in sorted order, row 0 had been GPU 0's, on NIC 0 with GPUs 1
    # and 2: 4/2 + 2 x 1/2 = 3 x 2^26 B out of it
    from kit.comm import predict_alltoallv

    system = get_system("pcie8", nodes=2)
    matrix = [[2**26 / 8 * (4 if i == 0 else 1)] * 8 for i in range(8)]
    got = predict_alltoallv(matrix, system, ranks=[4, 1, 2, 0, 12, 9, 10, 8])
    nic_gbs = system.network.nic_bw_gbs * system.network.efficiency
    assert got.bandwidth_ms == pytest.approx(3 * 7 / 8 * 2**26 / nic_gbs / 1e6, rel=0.03)  # ~2% HBM
