"""kit replay: a ring shift or a pipeline's chain of coalesced sends and recvs (batch_isend_irecv:
rank r sends to r + 1 and receives from r - 1 in one NCCL kernel) waits pairwise. NCCL 2.32.3's
nccl.h (nvidia-nccl-cu12) on ncclSend and ncclRecv: the peer "needs to call ncclRecv [ncclSend]
with the same datatype and the same count", the operation "is blocking for the GPU", and sends
and recvs fused in one ncclGroupStart/ncclGroupEnd progress concurrently. So rank r's batch
starts moving data once r - 1 and r + 1 have reached theirs, and no other rank holds it up.
The chain had been one collective: every batch started when its last rank arrived.

The traces below are written as NCCL would run them: batch r is ready at READY_US[r] (its
kernel's measured start), starts at the latest of its own and its peers' readiness and moves its
data in T_US, so its kernel ends at max(READY_US[r], READY_US[peers]) + T_US. An all-reduce of all
the ranks first, ending together, ties their clocks (offsets 0). The replay must give back those
ends; by hand, for READY_US = 120, 170, 220, 270 and T_US = 300:
  chain 0 -> 1 -> 2 -> 3: max(120, 170), max(120, 170, 220), max(170, 220, 270), max(220, 270)
                          + 300 = 470, 520, 570, 570 us
  ring (3 -> 0 too):      max(120, 170, 270), max(170, 120, 220), max(220, 170, 270),
                          max(270, 220, 120) + 300 = 570, 520, 570, 570 us
As one collective every batch had started at 270 and ended at 570. With the first stage last,
READY_US = 270, 120, 170, 220 (LATE_FIRST_US):
  chain:                  max(270, 120), max(270, 120, 170), max(120, 170, 220), max(170, 220)
                          + 300 = 570, 570, 520, 520 us
  ring:                   max(270, 120, 220), max(120, 270, 170), max(170, 120, 220),
                          max(220, 170, 270) + 300 = 570, 570, 520, 570 us
There a rank's pair waits queued one after the other (on one queue a rank) would pass rank 0's
lateness along the chain: rank 1's wait with 2 ready after its wait with 0 (270), 2's and 3's
batches at 270 too, every chain end 570."""
import pytest

from kit.trace import replay
from tests.test_replay_coalesced_p2p import KERNEL, _fields
from tests.test_replay_mismatched_inputs import write_job
from tests.test_replay_process_groups import A100, ev

WORLD, T_US, STEP_TAIL_US = 4, 300, 10
READY_US = {0: 120, 1: 170, 2: 220, 3: 270}
CHAIN_END_US = {0: 470, 1: 520, 2: 570, 3: 570}
RING_END_US = {0: 570, 1: 520, 2: 570, 3: 570}
LATE_FIRST_US = {0: 270, 1: 120, 2: 170, 3: 220}
LATE_FIRST_CHAIN_END_US = {0: 570, 1: 570, 2: 520, 3: 520}
LATE_FIRST_RING_END_US = {0: 570, 1: 570, 2: 520, 3: 570}


def _rank(r, ends, ring, ready=READY_US):
    def fields(name, key, peer, group_name="0"):
        out = {**_fields(name, key, peer), "Process Group Ranks": str(list(range(WORLD))),
               "Group size": WORLD, "Process Group Name": group_name}
        out.pop(None, None)
        return out
    at, end = ready[r] - 20, ends[r]
    send_to = (r + 1) % WORLD if ring or r + 1 < WORLD else None
    recv_from = (r - 1) % WORLD if ring or r > 0 else None
    events = [ev("ProfilerStep#1", 0, end + STEP_TAIL_US, "cpu_op"),
              ev("record_param_comms", 2, 10, "cpu_op", **fields("allreduce", None, None, "1")),
              ev("cudaLaunchKernel", 4, 5, "cuda_runtime", correlation=5),
              ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 10, 50, "kernel", tid=7, correlation=5, stream=7)]
    if send_to is not None:
        events.append(ev("record_param_comms", at - 12, 4, "cpu_op", **fields("send", "Dst Rank", send_to)))
    if recv_from is not None:
        events.append(ev("record_param_comms", at - 6, 4, "cpu_op", **fields("recv", "Src Rank", recv_from)))
    events += [ev("nccl:coalesced", at, 12, "user_annotation"),
               ev("cudaLaunchKernel", at + 4, 5, "cuda_runtime", correlation=7),
               ev(KERNEL, ready[r], end - ready[r], "kernel", tid=7, correlation=7, stream=7),
               ev("cudaStreamSynchronize", at + 13, end + 2 - (at + 13), "cuda_runtime", correlation=8)]
    return {"distributedInfo": {"rank": r, "world_size": WORLD}, "deviceProperties": [{"name": A100}],
            "traceEvents": events}


@pytest.mark.parametrize("ring, ends, ready", [(False, CHAIN_END_US, READY_US), (True, RING_END_US, READY_US),
                                              (False, LATE_FIRST_CHAIN_END_US, LATE_FIRST_US),
                                              (True, LATE_FIRST_RING_END_US, LATE_FIRST_US)])
def test_a_ring_shift_waits_pairwise_and_replays_as_measured(tmp_path, ring, ends, ready):
    r = replay(write_job(tmp_path, [_rank(x, ends, ring, ready) for x in range(WORLD)]))
    res = r.result
    batch = {rank: op for rank, ops in r.tg.gpu_ops.items() for op, ge, *_ in ops if ge.name == KERNEL}
    assert r.tg.offsets_us == {x: 0.0 for x in range(WORLD)}
    assert {x: 1e3 * float(res.start_ms[op]) for x, op in batch.items()} == pytest.approx(
        {x: ends[x] - T_US for x in range(WORLD)}, abs=1e-6)
    assert {x: 1e3 * float(res.end_ms[op]) for x, op in batch.items()} == pytest.approx(ends, abs=1e-6)
    d = r.to_dict()
    assert [x["predicted_ms"] for x in d["ranks"]] == pytest.approx(
        [(ends[x] + STEP_TAIL_US) / 1e3 for x in range(WORLD)], abs=1e-9)
    assert d["mean_abs_error_pct"] == pytest.approx(0.0, abs=1e-9)
    assert any("4 coalesced send/recv batch(es) of ring shifts or chains wait only for their own peers" in n
               for n in d["notes"]), d["notes"]


def test_a_two_rank_exchange_is_still_one_collective(tmp_path):
    # a batch with one peer (0 <-> 1): its pair is its whole set, as before
    from tests.test_replay_coalesced_p2p import pipeline_exchange

    r = replay(pipeline_exchange(tmp_path))
    g = r.tg.graph
    group = {rank: g.group[op] for rank, ops in r.tg.gpu_ops.items() for op, *_ in ops}
    assert group[0] == group[1] and group[2] == group[3] and group[0] != group[2], group
    assert not any(lbl.startswith("p2p wait") for lbl in g.label)


def test_the_pair_waits_keep_the_graph_in_dependency_order(tmp_path):
    # ExecGraph's ids are its dependency order (each op's deps and the op before it on its queue are
    # earlier ops; ExecGraph refuses others as they are added): the pair waits, added once the
    # batches are matched, had come after the batches that depend on them. The TraceGraph's op ids
    # follow the move: each rank's kernels, step marks and start offset name the same ops
    r = replay(write_job(tmp_path, [_rank(x, RING_END_US, True) for x in range(WORLD)]))
    g, tg = r.tg.graph, r.tg
    waits = [i for i, lbl in enumerate(g.label) if lbl.startswith("p2p wait")]
    assert len(waits) == 8  # 4 pairs of the ring, a wait on each of their 2 ranks
    assert all(d < i for i, ds in enumerate(g.deps) for d in ds)
    assert all(p < i for i, p in enumerate(g.prev))
    for rank, ops in tg.gpu_ops.items():
        assert [g.label[op] for op, *_ in ops] == [ge.name for _, ge, *_ in ops]
        assert all(g.rank[op] == rank for op, *_ in ops)
        batch = next(op for op, ge, *_ in ops if ge.name == KERNEL)
        own = [w for w in waits if g.rank[w] == rank]
        assert sorted(d for d in g.deps[batch] if d in waits) == own and max(own) < batch
    assert all(g.label[op] == "start offset" for op in tg.idle_op.values())
    assert all(g.rank[a] == g.rank[b] == rank and g.kind[a] == g.kind[b] == "cpu" and a < b
               for rank, marks in tg.markers.items() for a, b in marks)
    assert sorted(g.order[0] + g.order[1] + g.order[2] + g.order[3]) == list(range(len(g)))
