"""simulate() scans an op's dependencies once, however often its queue is woken.

A queue held at an op with D dependencies that end one at a time (a host sync on every
gradient bucket, each bucket after a kernel that waits for the one before) was woken D times
and rescanned the op's dependencies from the first each time: D^2 / 2 checks. 8,000 of them
took 3.5 s for 16,000 ops, against about 0.03 s when each is checked once. The tests count
the reads of the dependency lists (a deterministic stand-in for the time: 1,000 of them had
508,496 reads, 10,994 now)."""
import pytest

from kit.sim import ExecGraph, simulate


def _ping_pong(n: int, kernel_ms: float, comm_ms: float) -> ExecGraph:
    """n kernels and n comm ops in lockstep (kernel k waits for comm k-1, comm k for kernel k),
    and a host sync on every comm op, issued before any of them ends."""
    g = ExecGraph()
    g.cpu(0, 0.0, "start")  # the host's queue is the first the simulation runs
    comms = []
    for k in range(n):
        kern = g.gpu(0, "compute", kernel_ms, f"k{k}", deps=comms[-1:])
        comms.append(g.gpu(0, "comm", comm_ms, f"c{k}", kind="comm", deps=(kern,)))
    g.sync(0, comms, 0.25, "wait for every bucket")
    return g


def test_a_host_sync_on_many_ops_that_end_one_by_one_is_timed_right():
    n, kernel_ms, comm_ms = 50, 1.0, 0.5
    res = simulate(_ping_pong(n, kernel_ms, comm_ms))
    # each kernel and its comm op in turn: the last comm op ends at n x (kernel + comm)
    assert res.end_ms[-2] == pytest.approx(n * (kernel_ms + comm_ms))
    assert res.start_ms[-1] == pytest.approx(n * (kernel_ms + comm_ms))
    assert res.makespan_ms == pytest.approx(n * (kernel_ms + comm_ms) + 0.25)


class _CountedDeps(tuple):
    """An op's deps that count every id read from them (by iteration or by index)."""

    reads = 0

    def __iter__(self):
        for j in tuple.__iter__(self):
            _CountedDeps.reads += 1
            yield j

    def __getitem__(self, k):
        _CountedDeps.reads += 1
        return tuple.__getitem__(self, k)


def test_a_host_sync_on_many_ops_reads_each_dependency_a_few_times():
    n, kernel_ms, comm_ms = 1000, 1.0, 0.5
    g = _ping_pong(n, kernel_ms, comm_ms)
    g.deps = [_CountedDeps(d) for d in g.deps]
    n_deps = sum(len(d) for d in g.deps)  # n on the sync, one on each other op but the first
    _CountedDeps.reads = 0
    res = simulate(g)
    assert res.makespan_ms == pytest.approx(n * (kernel_ms + comm_ms) + 0.25)
    # linear: each read a few times (3.7 now); rescanned from the first on each wake, the
    # sync's n deps were read n^2 / 2 times (508,496 reads, 170 per dependency)
    assert _CountedDeps.reads <= 8 * n_deps
