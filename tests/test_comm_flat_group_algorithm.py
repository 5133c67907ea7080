"""A group with one GPU on each node has no intra-node phase: its all-reduce, reduce-scatter and
all-gather are the flat ring. hier-ring had been offered there too, with the ring's latency and a
per-byte cost equal but for rounding (1.5 x (1/46000) against 1.5 / 46000), so `kit comm predict
allreduce --system dgx-h100 --nodes 4 --ranks 0,8,16,24` named the algorithm hier-ring."""
import pytest

from kit.comm import collective_table, predict_collective
from kit.comm.algorithms import plans
from kit.comm.topology import resolve_group
from kit.hardware.system import get_system


@pytest.mark.parametrize("kind", ["allreduce", "reducescatter", "allgather"])
def test_one_gpu_per_node_is_the_flat_ring(kind):
    s = get_system("dgx-h100", nodes=4)
    ranks = [0, 8, 16, 24]
    names = {p.algorithm for p in plans(s, kind, resolve_group(s, ranks))}
    assert "hier-ring" not in names
    r = predict_collective(kind, 1e9, s, ranks=ranks)
    assert r.algorithm == "ring"
    # the ring across 4 nodes, one NIC a node: (n-1)/n per byte, doubled for all-reduce
    wire = (2.0 if kind == "allreduce" else 1.0) * 3 / 4 / (50 * 0.92e3)
    kappa = s.soft("hbm_bytes_per_byte") / (1 if kind == "allreduce" else 2) / (s.gpu.mem_bw_gbs * 1e3)
    assert r.bandwidth_ms * 1e3 == pytest.approx((wire + kappa) * 1e9, rel=1e-9)
    t = collective_table(kind, [2.0**k for k in range(10, 34, 4)], s, ranks=ranks)
    assert set(t.algorithm) <= {"ring", "tree"}


def test_two_gpus_on_a_node_still_get_the_hierarchical_plan():
    s = get_system("dgx1-v100", nodes=2)
    g = resolve_group(s, None)
    assert "hier-ring" in {p.algorithm for p in plans(s, "allreduce", g)}
    assert predict_collective("allreduce", 4e9, s).algorithm == "hier-ring"
