"""kit.sim: hand-computed timelines, inter-rank sync, critical-path causes, deadlocks, classes."""
import pytest

from kit.errors import KitError
from kit.sim import ExecGraph, simulate


def test_launch_bound_chain_is_paced_by_the_cpu():
    # 100 kernels of 1 µs, each launched in 10 µs: the GPU waits for the CPU every time.
    g = ExecGraph()
    for _ in range(100):
        g.gpu(0, "compute", 0.001, "k", launch_ms=0.010)
    res = simulate(g)
    assert res.makespan_ms == pytest.approx(100 * 0.010 + 0.001)
    b = res.breakdown(0)
    assert b["cpu"] == pytest.approx(1.0)
    assert b["compute"] == pytest.approx(0.001)
    assert b["total_ms"] == pytest.approx(res.makespan_ms)


def test_gpu_bound_chain_queues_on_the_stream():
    g = ExecGraph()
    for _ in range(10):
        g.gpu(0, "compute", 1.0, "k", launch_ms=0.01)
    res = simulate(g)
    assert res.makespan_ms == pytest.approx(0.01 + 10 * 1.0)
    assert res.breakdown(0)["compute"] == pytest.approx(10.0)


def test_collective_waits_for_the_slowest_rank():
    g = ExecGraph()
    for r, work in ((0, 1.0), (1, 3.0)):
        a = g.gpu(r, "compute", work, "fwd")
        g.collective(r, "comm", 0.5, "allreduce", group="ar", deps=(a,))
    res = simulate(g)
    tl = res.timeline()
    ar = tl[tl.name == "allreduce"]
    assert list(ar.start_ms) == [3.0, 3.0] and list(ar.end_ms) == [3.5, 3.5]
    b0 = res.breakdown(0)
    assert b0["wait"] == pytest.approx(2.0)  # rank 0 ready at 1, rank 1 at 3
    assert b0["compute"] == pytest.approx(1.0) and b0["communication"] == pytest.approx(0.5)
    across = res.breakdown(0, follow_ranks=True)
    assert across["wait"] == 0 and across["compute"] == pytest.approx(3.0)


def test_comm_stream_overlaps_compute_through_an_event():
    # bucketed all-reduce after the 2nd of 3 backward kernels overlaps the 3rd.
    g = ExecGraph()
    k1 = g.gpu(0, "compute", 1.0, "b1")
    k2 = g.gpu(0, "compute", 1.0, "b2")
    g.collective(0, "comm", 1.5, "ar", group="ar", deps=(k2,))
    g.gpu(0, "compute", 1.0, "b3")
    res = simulate(g)
    assert res.makespan_ms == pytest.approx(2.0 + 1.5)
    assert res.end_ms[k1] == 1.0
    path = res.critical_path(0)
    assert list(path.cause) == ["compute", "compute", "communication"]


def test_host_sync_blocks_the_next_launch():
    g = ExecGraph()
    k = g.gpu(0, "compute", 2.0, "k", launch_ms=0.01)
    s = g.sync(0, [k], dur_ms=0.005)
    k2 = g.gpu(0, "compute", 1.0, "k2", launch_ms=0.01)
    res = simulate(g)
    assert res.end_ms[s] == pytest.approx(2.01 + 0.005)
    assert res.start_ms[k2] == pytest.approx(2.015 + 0.01)


def test_device_sync_waits_for_every_stream():
    g = ExecGraph()
    g.gpu(0, "compute", 1.0, "a")
    g.gpu(0, "side", 4.0, "b")
    s = g.device_sync(0)
    assert simulate(g).end_ms[s] == pytest.approx(4.0)


def test_symmetric_ranks_simulated_once_match_the_full_simulation():
    def build(classes):
        g = ExecGraph()
        for stage in range(2):
            reps = [stage * 4] if classes else [stage * 4 + i for i in range(4)]
            for r in reps:
                g.add_rank(r, members=range(stage * 4, stage * 4 + 4) if classes else None)
                for mb in range(3):
                    a = g.gpu(r, "compute", 1.0 + stage, f"f{mb}")
                    g.collective(r, "comm", 0.2, "tp", group=("tp", stage, mb, r // 4), deps=(a,))
                    g.collective(r, "comm", 0.1, "p2p", group=("p2p", mb, r % 4), deps=(a,))
        return simulate(g)

    full, once = build(False), build(True)
    assert once.graph.world_size == 8 and len(once.graph.ranks) == 2
    assert once.makespan_ms == pytest.approx(full.makespan_ms)
    assert once.rank_end_ms(4) == pytest.approx(full.rank_end_ms(7))


def test_deadlock_names_the_collective():
    g = ExecGraph()
    g.collective(0, "comm", 1.0, "ar", group="a")
    g.collective(0, "comm", 1.0, "ag", group="b")
    g.collective(1, "comm", 1.0, "ag", group="b")
    g.collective(1, "comm", 1.0, "ar", group="a")
    with pytest.raises(KitError, match="deadlock"):
        simulate(g)


def test_bad_inputs_are_kit_errors():
    g = ExecGraph()
    with pytest.raises(KitError):
        g.gpu(0, "compute", -1.0, "neg")
    with pytest.raises(KitError):
        g.gpu(0, "compute", 1.0, "x", deps=(5,))
    with pytest.raises(KitError):
        g.gpu(0, "compute", 1.0, "x", kind="banana")


def test_many_ranks_and_ops_stay_fast():
    import time

    g = ExecGraph()
    reps = [c * 32 for c in range(32)]
    for r in reps:
        g.add_rank(r, members=range(r, r + 32))  # 1,024 ranks in 32 classes
    for k in range(1000):
        for r in reps:
            a = g.gpu(r, "compute", 0.1, "blk")
            if k % 10 == 0:
                g.collective(r, "comm", 0.05, "ar", group=("ar", k), deps=(a,))
    t = time.perf_counter()
    res = simulate(g)
    assert time.perf_counter() - t < 2.0
    assert g.world_size == 1024
    assert res.makespan_ms == pytest.approx(1000 * 0.1)  # the all-reduces hide under compute


def _random_graph(seed: int) -> ExecGraph:
    """Four ranks, two streams and a host thread each, with events, host syncs and collectives
    issued in the same order on every rank."""
    import random

    rnd = random.Random(seed)
    g = ExecGraph("random")
    for step in range(30):
        kind = rnd.choice(["kernel", "kernel", "comm", "sync", "collective"])
        for r in range(4):
            ms = rnd.uniform(0.0, 2.0)
            if kind == "kernel":
                g.gpu(r, "compute", ms, "k", launch_ms=rnd.uniform(0.0, 0.3))
            elif kind == "comm":
                tail = g.tail(r, "compute")
                g.gpu(r, "comm", ms, "c", kind="comm", deps=(tail,) if tail >= 0 else ())
            elif kind == "sync":
                g.sync(r, [g.tail(r, "comm"), g.tail(r, "compute")], rnd.uniform(0, 0.1))
            else:
                g.collective(r, "comm", ms, "ar", group=("ar", step), launch_ms=0.01)
    return g


@pytest.mark.parametrize("seed", range(5))
def test_retimed_makespan_equals_a_new_simulation(seed):
    import random

    g = _random_graph(seed)
    res = simulate(g)
    rnd = random.Random(100 + seed)
    for _ in range(3):
        other = [d * rnd.uniform(0.2, 3.0) for d in g.dur_ms]
        again = g.copy()
        again.dur_ms = other
        assert res.retimed_makespan_ms(other) == pytest.approx(simulate(again).makespan_ms, rel=1e-12)
    assert res.retimed_makespan_ms(g.dur_ms) == pytest.approx(res.makespan_ms, rel=1e-12)


def test_retime_refuses_wrong_durations():
    res = simulate(_random_graph(0))
    with pytest.raises(KitError, match="durations for a graph"):
        res.retimed_makespan_ms([1.0])
    with pytest.raises(KitError, match=">= 0"):
        res.retimed_makespan_ms([-1.0] * len(res.graph))
