"""ExecGraph.sync and set_duration take op ids and durations as gpu() and cpu() do: what is not
one is a KitError naming it, never read as another op (int() had made 1.5 and True op 1) nor
a traceback."""
import pytest

from kit.errors import KitError
from kit.sim import ExecGraph, simulate


def _graph():
    g = ExecGraph()
    g.gpu(0, "compute", 1.0, "short")
    g.gpu(0, "comm", 4.0, "long", kind="comm")
    return g


@pytest.mark.parametrize("on", [[1.5], [True], ["a"], [1.0]])
def test_a_sync_on_what_is_not_an_op_id_is_refused(on):
    g = _graph()
    with pytest.raises(KitError, match="is not an op id"):
        g.sync(0, on)
    assert len(g) == 2  # nothing added


def test_a_sync_on_something_not_a_sequence_is_one_error():
    with pytest.raises(KitError, match="sequence of op ids"):
        _graph().sync(0, 3)


def test_a_sync_still_drops_none_and_an_empty_resource_tail():
    g = _graph()
    s = g.sync(0, [None, g.tail(0, "memcpy"), 1], 0.5)  # tail of a resource with no op: -1
    assert g.deps[s] == (1,)
    assert simulate(g).end_ms[s] == pytest.approx(4.0 + 0.5)  # after "long", then its own cost


@pytest.mark.parametrize("op", [-1, 2, 99, 1.0, True, "0"])
def test_set_duration_of_what_is_not_an_op_is_refused(op):
    g = _graph()
    with pytest.raises(KitError, match="is not an op of this graph"):
        g.set_duration(op, 7.0)
    assert g.dur_ms == [1.0, 4.0]  # -1 had set the last op's


@pytest.mark.parametrize("ms", ["x", None, -1.0, float("nan"), float("inf")])
def test_set_duration_to_what_is_not_a_duration_is_refused(ms):
    g = _graph()
    with pytest.raises(KitError, match="duration must be"):
        g.set_duration(0, ms)
    assert g.dur_ms == [1.0, 4.0]


def test_set_duration_retimes_the_op():
    g = _graph()
    g.set_duration(0, 2.5)
    assert simulate(g).end_ms[0] == pytest.approx(2.5)
