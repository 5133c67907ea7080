"""kit.sim collectives: start together once every member has reached them, end together for equal
durations; a collective some of its ranks never issue or never reach is one KitError naming it,
the ranks that reached it, the ranks that did not and where those are held."""
import pytest

from kit.errors import KitError
from kit.sim import ExecGraph, simulate


def test_a_collective_starts_at_the_last_arrival_and_ends_together():
    # rank r computes 1 + r ms after a 0.1 ms launch, then a 2 ms all-reduce: start 3.1, end 5.1
    g = ExecGraph()
    ar = []
    for r in range(3):
        k = g.gpu(r, "compute", 1.0 + r, "fwd", launch_ms=0.1)
        ar.append(g.collective(r, "comm", 2.0, "allreduce", group="ar", deps=(k,), ranks=range(3)))
    res = simulate(g)
    assert [res.start_ms[i] for i in ar] == pytest.approx([3.1] * 3)
    assert [res.end_ms[i] for i in ar] == pytest.approx([5.1] * 3)
    for r in range(3):  # the critical path tiles each rank's time: waits included
        b = res.breakdown(r)
        assert b["total_ms"] == pytest.approx(5.1)
        assert b["wait"] == pytest.approx(2.0 - r)


def test_a_declared_rank_that_never_issues_the_collective_is_an_error():
    # without ranks= the group is whoever holds the key: ranks 0 and 2 ran it alone in 2 ms
    g = ExecGraph()
    g.gpu(1, "compute", 1.0, "other work")
    for r in (0, 2):
        g.collective(r, "comm", 2.0, "allreduce", group="ar", ranks=(0, 1, 2))
    with pytest.raises(KitError, match=r"collective 'allreduce' \(group 'ar'\): rank 1 never issues "
                                       r"it, though it names ranks 0-2"):
        simulate(g)


def test_declared_ranks_must_agree():
    g = ExecGraph()
    g.collective(0, "comm", 1.0, "ar", group="ar", ranks=(0, 1))
    with pytest.raises(KitError, match="ranks \\[0, 1, 2\\] on rank 1, but \\[0, 1\\]"):
        g.collective(1, "comm", 1.0, "ar", group="ar", ranks=(0, 1, 2))
    with pytest.raises(KitError, match="rank 3: the rank is not among its ranks"):
        g.collective(3, "comm", 1.0, "ar", group="ar", ranks=(0, 1))


def test_a_deadlock_names_the_ranks_that_did_not_arrive_and_where_they_are():
    # rank 5 issues ar2 before ar1, the 15 others ar1 first. The message had read "op 'ar1' on
    # rank 0 never started: 15 of 16 ranks reached it ([0, 1, ..., 15])", naming neither rank 5
    # nor what held it
    g = ExecGraph()
    for r in range(16):
        g.gpu(r, "compute", 1.0, "fwd")
        for key in (("ar2", "ar1") if r == 5 else ("ar1", "ar2")):
            g.collective(r, "comm", 1.0, key, group=key)
    with pytest.raises(KitError) as e:
        simulate(g)
    msg = str(e.value)
    assert "collective 'ar1' (group 'ar1') never started: ranks 0-4, 6-15 reached it, rank 5 did not" in msg
    assert "rank 5: waiting at collective 'ar2' (group 'ar2')" in msg


def test_a_collective_issued_twice_on_a_rank_says_so():
    # rank 0 calls "ar" twice, rank 1 once: "2 of 3 ranks reached it" of a 2-rank job
    g = ExecGraph()
    g.collective(0, "comm", 1.0, "ar", group="ar")
    g.collective(0, "comm", 1.0, "ar", group="ar")
    g.collective(1, "comm", 1.0, "ar", group="ar")
    with pytest.raises(KitError, match="rank 0 issues it more than once"):
        simulate(g)


def test_a_rank_held_through_a_host_sync_names_the_collective_behind_it():
    # rank 1 launches "ar" only after a host sync on its "ag", which rank 0 issues after "ar"
    g = ExecGraph()
    g.collective(0, "comm", 1.0, "ar", group="ar")
    g.collective(0, "comm", 1.0, "ag", group="ag")
    ag = g.collective(1, "side", 1.0, "ag", group="ag")
    g.sync(1, [ag], label="wait for ag")
    g.collective(1, "comm", 1.0, "ar", group="ar", launch_ms=0.01)
    with pytest.raises(KitError, match=r"collective 'ar' \(group 'ar'\) never started: rank 0 reached "
                                       r"it, rank 1 did not \(rank 1: waiting at collective 'ag'"):
        simulate(g)


def test_the_critical_path_sees_members_added_after_an_earlier_one():
    # the group index was cached in graph.meta by the first critical path: a third rank added to
    # "ar" afterwards was not seen, rank 0 read "wait for rank 1" and its cross-rank path 1 ms
    # compute + 2 ms wait instead of rank 2's 3 ms compute
    g = ExecGraph()
    g.collective(0, "comm", 1.0, "ar", group="ar")
    k = g.gpu(1, "compute", 1.0, "mid")
    g.collective(1, "comm", 1.0, "ar", group="ar", deps=(k,))
    assert list(simulate(g).critical_path(0).name)[0] == "wait for rank 1"
    k = g.gpu(2, "compute", 3.0, "slow")
    g.collective(2, "comm", 1.0, "ar", group="ar", deps=(k,))
    res = simulate(g)
    assert list(res.critical_path(0).name)[0] == "wait for rank 2"
    across = res.breakdown(0, follow_ranks=True)
    assert across["compute"] == pytest.approx(3.0) and across["wait"] == 0


def test_a_deadlock_names_every_rank_that_did_not_arrive_past_four_places():
    # ranks 1-5 each wait at their own pair collective before "x": five places, of which the
    # message shows four; rank 5 had been left out of the list of where they are held
    g = ExecGraph()
    g.collective(0, "comm", 1.0, "x", group="x")
    for r in range(1, 6):
        for key in (f"p{r}", "x"):
            g.collective(r, "comm", 1.0, key, group=key)
    for r in range(1, 6):
        for key in ("x", f"p{r}"):
            g.collective(5 + r, "comm", 1.0, key, group=key)
    with pytest.raises(KitError) as e:
        simulate(g)
    msg = str(e.value)
    assert "ranks 1-5 did not" in msg
    held = msg[msg.index("did not (") + len("did not ("):msg.index("; check")]
    assert [part.split(":")[0] for part in held[:-1].split("; ")] == [f"rank {r}" for r in range(1, 6)]


@pytest.mark.parametrize("follow_ranks", [False, True])
def test_a_member_held_up_by_its_own_ranks_other_stream_is_not_a_wait(follow_ranks):
    # rank 0 joins "x" from two streams, after 1 ms on one and 3 ms on the other; rank 1 after
    # 2 ms. The group starts at 3 ms, when rank 0's own 3 ms kernel ends: its path is that kernel
    # and the 1 ms all-reduce, not 1 ms compute + 2 ms "wait for rank 0"
    fast_ms, slow_ms, other_ms, ar_ms = 1.0, 3.0, 2.0, 1.0
    g = ExecGraph()
    fast = g.gpu(0, "compute", fast_ms, "fast")
    slow = g.gpu(0, "side", slow_ms, "slow")
    other = g.gpu(1, "compute", other_ms, "rank 1")
    g.collective(0, "comm", ar_ms, "ar", group="x", deps=(fast,))
    g.collective(0, "comm 2", ar_ms, "ar", group="x", deps=(slow,))
    g.collective(1, "comm", ar_ms, "ar", group="x", deps=(other,))
    res = simulate(g)
    end_ms = max(fast_ms, slow_ms, other_ms) + ar_ms
    assert res.makespan_ms == pytest.approx(end_ms)
    b = res.breakdown(0, follow_ranks=follow_ranks)
    assert b["wait"] == 0
    assert b["compute"] == pytest.approx(slow_ms) and b["communication"] == pytest.approx(ar_ms)
    assert b["total_ms"] == pytest.approx(end_ms)
    assert "slow" in list(res.critical_path(0, follow_ranks=follow_ranks).name)


@pytest.mark.parametrize("issued", [("fast", "slow"), ("slow", "fast")])
def test_a_wait_for_another_rank_starts_when_the_rank_itself_was_ready(issued):
    # rank 0 joins "x" from a 1 ms and a 2 ms stream, rank 1 after 3 ms: rank 0 was ready at
    # 2 ms and waited 1 ms, whichever member it issued first (it had read 2 ms of wait from the
    # 1 ms stream's member when that one came first)
    ms = {"fast": 1.0, "slow": 2.0}
    other_ms, ar_ms = 3.0, 1.0
    g = ExecGraph()
    kernels = {name: g.gpu(0, f"stream {name}", ms[name], name) for name in ms}
    rank1 = g.gpu(1, "compute", other_ms, "rank 1")
    for k, name in enumerate(issued):
        g.collective(0, f"comm {k}", ar_ms, "ar", group="x", deps=(kernels[name],))
    g.collective(1, "comm", ar_ms, "ar", group="x", deps=(rank1,))
    res = simulate(g)
    b = res.breakdown(0)
    assert b["wait"] == pytest.approx(other_ms - max(ms.values()))
    assert b["compute"] == pytest.approx(max(ms.values()))
    assert b["total_ms"] == pytest.approx(res.makespan_ms) == pytest.approx(other_ms + ar_ms)
    path = res.critical_path(0)
    assert "slow" in list(path.name) and "fast" not in list(path.name)
    assert list(path[path.cause == "wait"].name) == ["wait for rank 1"]
