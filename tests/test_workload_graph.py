"""The op graph data structure: selections, dependency resolution through free nodes."""
import pytest

from kit.errors import KitError
from kit.ops import Elementwise, Gemm
from kit.workload.graph import Node, OpGraph


def _graph():
    g = Gemm(m=4, n=4, k=4)
    e = Elementwise("relu", 16)
    nodes = (
        Node(0, "aten.mm.default", g, "gemm", "fwd", (), "h.0.mlp", 0, 64),
        Node(1, "aten.view.default", None, "free", "fwd", (0,), "h.0.mlp", 0, 0, kernels=0),
        Node(2, "aten.t.default", None, "free", "fwd", (1,), "h.0.mlp", 0, 0, kernels=0),
        Node(3, "aten.relu.default", e, "elementwise", "fwd", (2,), "h.1.mlp", 1, 64),
        Node(4, "aten.threshold_backward.default", e, "elementwise", "bwd", (0, 3), "h.1.mlp", 1, 64),
        Node(5, "aten.foo.default", e, "unknown", "bwd", (4,), "", None, 64),
    )
    return OpGraph(nodes, "toy", {"params": 16})


def test_selections():
    g = _graph()
    assert len(g) == 6 and [n.id for n in g.kernels()] == [0, 3, 4, 5]
    assert [n.id for n in g.by_phase("bwd")] == [4, 5]
    assert g.phases() == ["fwd", "bwd"] and g.layers() == [0, 1]
    assert [n.id for n in g.by_layer(None)] == [5]
    assert g.unknown_ops() == {"aten.foo.default": 1}
    assert g.consumers()[0] == [1, 4]
    assert g[0].name() == "mm"
    with pytest.raises(KitError, match="phase"):
        g.by_phase("forward")


def test_without_free_keeps_edges_through_views():
    k = _graph().without_free()
    assert [n.aten for n in k] == ["aten.mm.default", "aten.relu.default",
                                   "aten.threshold_backward.default", "aten.foo.default"]
    # relu read view(t(mm)): it now depends on the mm directly
    assert k[1].deps == (0,) and k[2].deps == (0, 1) and k[3].deps == (2,)
    assert [n.id for n in k] == [0, 1, 2, 3]


def test_only_phase_and_frame():
    g = _graph().only("bwd")
    assert [n.aten for n in g] == ["aten.threshold_backward.default", "aten.foo.default"]
    assert g[0].deps == () and g[1].deps == (0,)
    f = _graph().to_frame()
    assert f.loc[0, "flops"] == 2 * 4 * 4 * 4 and f.loc[1, "flops"] == 0
