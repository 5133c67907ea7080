"""A placement's all-to-all traffic as numpy outer products (kit.sharding.a2a.Sends), not Python
lists of (src, dst, bytes) tuples: 2 tables on 512 GPUs (dgx-a100 --nodes 64) built ~3,200 lists
of ~W^2 tuples and took ~30 s before the search began. The matrices must be the ones the tuples
made, and the features of a cluster must come without any W x W matrix."""
import numpy as np
import pytest

from kit.embedding import Table, Zipf
from kit.hardware import get_system
from kit.sharding.a2a import Sends
from kit.sharding.model import ShardingModel

B, DIM, POOL = 64, 32, 5.0  # samples per rank, columns, lookups a sample


def _model(system, kinds):
    t = Table(rows=1600, dim=DIM, pooling=POOL, name="t", distribution=None)
    return ShardingModel([t], get_system(system), batch=B, kinds=kinds)


def _option(m, kind, first):
    return next(o for o in m.options[0] if o.kind == kind and o.ranks[0] == first)


def test_table_row_wise_traffic_is_the_hand_built_matrix():
    m = _model("dgx-a100-x2", ("twrw",))  # 2 nodes x 8 GPUs; node 1 holds the table
    W, g = 16, 8
    out, idx, dp = m.traffic(0, _option(m, "twrw", 8))
    want_out, want_idx = np.zeros((W, W)), np.zeros((W, W))
    for r in range(8, 16):
        for k in range(8, 16):
            if k != r:  # node 1 reduce-scatters its partial sums of all W ranks' samples
                want_out[r, k] = B * W / g * DIM * 4
        for j in range(W):
            if j != r:  # every rank sends node 1's ranks their rows' indices (+1 offset each)
                want_idx[j, r] = B * (POOL / g + 1) * 8
    for j in range(8):  # then rank 8 + j hands rank j its samples' pooled fp32 rows
        want_out[8 + j, j] = B * DIM * 4
    assert dp == 0
    np.testing.assert_array_equal(out.matrix(), want_out)
    np.testing.assert_allclose(idx.matrix(), want_idx, rtol=1e-12)


def test_a_rank_s_sums_within_and_across_nodes_by_hand():
    m = _model("dgx-a100-x2", ("twrw",))
    out, _, _ = m.traffic(0, _option(m, "twrw", 8))
    blk = m.a2a.block_of(out)
    W, c_rs, c_out = 16, B * 16 / 8 * DIM * 4, B * DIM * 4
    sent_in, sent_x, recv_in, recv_x = blk[:W], blk[W:2 * W], blk[2 * W:3 * W], blk[3 * W:4 * W]
    # rank 8: 7 partial-sum blocks to its node, one output block to rank 0 across
    assert (sent_in[8], sent_x[8], recv_in[8], recv_x[8]) == (7 * c_rs, c_out, 7 * c_rs, 0)
    # rank 0 only receives, from rank 8 on the other node
    assert (sent_in[0], sent_x[0], recv_in[0], recv_x[0]) == (0, 0, 0, c_out)


@pytest.mark.parametrize("system", ["dgx-a100-x4", "dgx1-v100-x2", "pcie8", "dgx-a100"])
def test_features_from_outer_products_equal_the_matrix_s(system):
    t = Table(rows=10_001, dim=64, pooling=12, name="t", distribution=Zipf(1.1))
    m = ShardingModel([t], get_system(system), batch=256)
    rng = np.random.default_rng(0)
    for opt in m.options[0]:
        for sends in m.traffic(0, opt)[:2]:
            np.testing.assert_allclose(m.a2a.block_of(sends), m.a2a.block(sends.matrix()),
                                       rtol=1e-12, atol=1e-9)
    s = Sends(m.world)  # and any sum of outer products
    for _ in range(3):
        s.add(rng.random(m.world) * (rng.random(m.world) < 0.5) * 1e6, rng.random(m.world))
    np.testing.assert_allclose(m.a2a.block_of(s), m.a2a.block(s.matrix()), rtol=1e-12, atol=1e-9)


def test_a_cluster_s_features_build_no_send_matrix(monkeypatch):
    """On 64 GPUs no pair's bytes are a feature: the model reads per-rank sums of the outer
    products, and never builds a W x W matrix (the surrogate's fit probes aside)."""
    built = []
    monkeypatch.setattr(Sends, "matrix", lambda self: built.append(1) or np.zeros((self.world,) * 2))
    t = Table(rows=10**6, dim=64, pooling=8, name="t")
    m = ShardingModel([t, Table(rows=10**5, dim=128, pooling=2, name="u")], get_system("dgx-a100-x8"))
    assert m.valid.sum() > 2 * 64 and built == []
