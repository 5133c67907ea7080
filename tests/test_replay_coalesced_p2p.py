"""kit replay: a coalesced batch of sends and recvs (dist.batch_isend_irecv: torch 2.13's
distributed_c10d.py runs them under _coalescing_manager(group, device), one NCCL kernel launched
at the group's end under "nccl:coalesced") keeps its process group: its ranks are its own and the
peers of the sends and recvs recorded before its launch, each with its record_param_comms fields
("Collective name" send/recv, "Dst Rank"/"Src Rank", as torch 2.13's profiler writes them:
tests/test_replay_process_groups.py). It had had no fields: kept at its measured time on
--on, and matched with every rank's first collective by stream position."""
import pytest

from kit.comm import predict_collective
from kit.trace import replay
from kit.trace.comm_meta import op_comm_metas
from tests.test_replay_mismatched_inputs import write_job
from tests.test_replay_process_groups import A100, ev

WORLD, NELEMS, MEASURED_US = 4, 1 << 20, 300
KERNEL = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def _fields(name, peer_key, peer):
    return {"Collective name": name, peer_key: peer, "Process Group Ranks": "[0, 1, 2, 3]",
            "Group size": WORLD, "In msg nelems": NELEMS, "Out msg nelems": NELEMS, "dtype": "Float",
            "Process Group Name": "0", "Seq": 1}


def _rank(r):
    """Rank r's step: it sends 4 MiB to its peer r ^ 1 and receives 4 MiB from it in one
    batch_isend_irecv (the send's and the recv's record_param_comms, then the one kernel's launch
    under nccl:coalesced), then waits for it."""
    peer, end = r ^ 1, 40 + MEASURED_US
    return {"distributedInfo": {"rank": r, "world_size": WORLD}, "deviceProperties": [{"name": A100}],
            "traceEvents": [
                ev("ProfilerStep#1", 0, end + 10, "cpu_op"),
                ev("record_param_comms", 8, 4, "cpu_op", **_fields("send", "Dst Rank", peer)),
                ev("record_param_comms", 14, 4, "cpu_op", **_fields("recv", "Src Rank", peer)),
                ev("nccl:coalesced", 20, 12, "user_annotation"),
                ev("cudaLaunchKernel", 24, 5, "cuda_runtime", correlation=7),
                ev(KERNEL, 40, MEASURED_US, "kernel", tid=7, correlation=7, stream=7),
                ev("cudaStreamSynchronize", 33, end + 2 - 33, "cuda_runtime", correlation=8)]}


def pipeline_exchange(tmp_path):
    """4 ranks: 0 and 1, 2 and 3 each exchange 4 MiB in one coalesced batch (_rank)."""
    return write_job(tmp_path, [_rank(r) for r in range(WORLD)])


def test_a_coalesced_kernel_takes_its_sends_and_recvs_fields(tmp_path):
    r = replay(pipeline_exchange(tmp_path))
    metas = op_comm_metas(r.tg)
    by_rank = {rank: metas.get(op) for rank, ops in r.tg.gpu_ops.items() for op, *_ in ops}
    assert all(m is not None for m in by_rank.values()), by_rank
    assert {rank: sorted(x.peer for x in m.members) for rank, m in by_rank.items()} == {
        0: [1, 1], 1: [0, 0], 2: [3, 3], 3: [2, 2]}
    assert {m.group_ranks for m in by_rank.values()} == {(0, 1, 2, 3)}
    # it synchronises its pair only: 0 with 1, 2 with 3
    g = r.tg.graph
    group = {rank: g.group[op] for rank, ops in r.tg.gpu_ops.items() for op, *_ in ops}
    assert group[0] == group[1] and group[2] == group[3] and group[0] != group[2], group


def test_a_coalesced_exchange_is_priced_as_one_transfer_between_its_pair(tmp_path):
    # it had kept its measured 300 us ("no nccl:* annotation with a readable size")
    r = replay(pipeline_exchange(tmp_path), on="dgx-h100")
    g = r.tg.graph
    nbytes = NELEMS * 4  # Float; what each rank sends
    want = MEASURED_US * (predict_collective("sendrecv", nbytes, "dgx-h100", ranks=[0, 1]).time_ms /
                          predict_collective("sendrecv", nbytes, "a100x4-nvlink", ranks=[0, 1]).time_ms)
    durs = [1e3 * g.dur_ms[op] for ops in r.tg.gpu_ops.values() for op, *_ in ops]
    assert durs == [pytest.approx(want)] * WORLD and want < MEASURED_US * 0.9
    notes = r.to_dict()["notes"]
    assert any("4 coalesced send/recv batch(es)" in n for n in notes), notes
    assert not any("keep their measured times" in n for n in notes), notes


def test_a_coalesced_batch_whose_peer_is_outside_the_job_is_priced_over_the_job_and_says_why(tmp_path):
    docs = [_rank(r) for r in range(WORLD)]
    for e in docs[0]["traceEvents"]:
        if e["args"].get("Collective name") == "send":
            e["args"]["Dst Rank"] = 9  # past the job's 4 ranks
    r = replay(write_job(tmp_path, docs), on="dgx-h100")
    notes = r.to_dict()["notes"]
    assert any("do not use their process-group fields" in n and "outside the job's 4 ranks" in n
               for n in notes), notes


# A pipeline's ring shift: each rank sends to r + 1 and receives from r - 1 in one batch
# (Megatron's send_forward_recv_backward etc. post both through batch_isend_irecv), so each rank's
# batch has its own peer set and no key by the peer set matches two ranks.
RING_NELEMS = 2 << 20  # 8 MiB of Float a transfer: 172 us over a DGX-1 pair's 2 NVLinks (48.75 GB/s),
# under the 300 us measured (64 MiB, 1.38 ms of bytes there, had been physically impossible)


def _chain_rank(r, world, gpu, allreduce_group=None):
    """Rank r of a pipeline of world stages: one coalesced batch of a send to r + 1 (not on the
    last stage) and a recv from r - 1 (not on the first), its launch 50 us later on each rank;
    on allreduce_group's ranks an all-reduce in that group first (a TP group)."""
    def fields(name, key, peer, group=tuple(range(world)), group_name="0"):
        out = {**_fields(name, key, peer), "In msg nelems": RING_NELEMS, "Out msg nelems": RING_NELEMS,
               "Process Group Ranks": str(list(group)), "Group size": len(group),
               "Process Group Name": group_name}
        if key is None:
            del out[None]
        return out
    at = 100 + 50 * r
    events = [ev("ProfilerStep#1", 0, 2000, "cpu_op")]
    if allreduce_group and r in allreduce_group:
        events += [ev("record_param_comms", 2, 10, "cpu_op", **fields("allreduce", None, None,
                                                                       allreduce_group, "1")),
                   ev("cudaLaunchKernel", 4, 5, "cuda_runtime", correlation=5),
                   ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 10, 50,
                      "kernel", tid=7, correlation=5, stream=7)]
    if r + 1 < world:
        events.append(ev("record_param_comms", at - 12, 4, "cpu_op", **fields("send", "Dst Rank", r + 1)))
    if r > 0:
        events.append(ev("record_param_comms", at - 6, 4, "cpu_op", **fields("recv", "Src Rank", r - 1)))
    events += [ev("nccl:coalesced", at, 12, "user_annotation"),
               ev("cudaLaunchKernel", at + 4, 5, "cuda_runtime", correlation=7),
               ev(KERNEL, at + 20, MEASURED_US, "kernel", tid=7, correlation=7, stream=7),
               ev("cudaStreamSynchronize", at + 13, 1900 - at, "cuda_runtime", correlation=8)]
    return {"distributedInfo": {"rank": r, "world_size": world}, "deviceProperties": [{"name": gpu}],
            "traceEvents": events}


def test_a_ring_shift_is_matched_pairwise_across_the_pipeline(tmp_path):
    # ranks 0 and 1 also run an all-reduce of their own: the match by stream position (1 vs 2
    # collectives a stream) cannot tie anything, so before the pairwise match the batches ran
    # unsynchronised at their own measured starts (100, 150, 200, 250 us plus 20)
    docs = [_chain_rank(r, WORLD, A100, allreduce_group=(0, 1)) for r in range(WORLD)]
    r = replay(write_job(tmp_path, docs))
    notes = r.to_dict()["notes"]
    assert not any("do not agree" in n or "differ across ranks" in n for n in notes), notes
    g, res = r.tg.graph, r.result
    batch = {rank: op for rank, ops in r.tg.gpu_ops.items() for op, ge, *_ in ops if ge.name == KERNEL}
    # the chain 0 -> 1 -> 2 -> 3 is tied pair by pair: each batch waits on a 0 ms collective with
    # each of its peers (tests/test_replay_ring_shift_pairwise.py)
    waits = {rank: sorted(g.label[d] for d in g.deps[op] if g.label[d].startswith("p2p wait"))
             for rank, op in batch.items()}
    assert waits == {0: ["p2p wait: ranks 0 and 1"], 1: ["p2p wait: ranks 0 and 1", "p2p wait: ranks 1 and 2"],
                     2: ["p2p wait: ranks 1 and 2", "p2p wait: ranks 2 and 3"], 3: ["p2p wait: ranks 2 and 3"]}
    # clock offsets: the all-reduce (0, 1) ends together, so rank 1 is 0 us on; the chain's
    # batches, which end as their own peers let them (not together), place only the ranks nothing
    # else ties: 2 and 3, 100 and 150 us on from rank 0's batch end (rank 1 had taken 25 us, the
    # median of the all-reduce's 0 and the chain's 50). Each rank's step starts 150 us minus its
    # offset into the replay, so the batches are ready at 120 + 150, 170 + 150, 220 + 50,
    # 270 + 0 us; each starts at its own and its peers' latest: 320, 320, 320 and 270 (rank 3's
    # one peer, 2, is ready at 270; as one collective it had waited for rank 1 too)
    assert r.tg.offsets_us == pytest.approx({0: 0, 1: 0, 2: 100, 3: 150}, abs=1e-9)
    starts = {rank: 1e3 * float(res.start_ms[op]) for rank, op in batch.items()}
    assert starts == pytest.approx({0: 320, 1: 320, 2: 320, 3: 270}, abs=1e-6)
    allreduce = [op for rank in (0, 1) for op, ge, *_ in r.tg.gpu_ops[rank] if "AllReduce" in ge.name]
    assert len(allreduce) == 2 and g.group[allreduce[0]] == g.group[allreduce[1]]


def test_a_ring_shift_batch_is_priced_on_its_two_links_at_once(tmp_path):
    # 8 V100 stages on a DGX-1 (the default source preset for 8 x v100-sxm2-32gb): rank 2 sends
    # 8 MiB to 3 and receives 8 MiB from 1, both pairs 2 NVLinks in the hybrid cube mesh; the
    # 3-rank ring shift (1, 2, 3) it had been priced as adds the hop 3 -> 1, 1 NVLink
    from kit.comm.topology import p2p_gbs
    from kit.hardware.system import get_system

    v = get_system("dgx1-v100")
    assert p2p_gbs(v, 1, 2) == p2p_gbs(v, 2, 3) == 2 * p2p_gbs(v, 1, 3)
    docs = [_chain_rank(r, 8, "Tesla V100-SXM2-32GB") for r in range(8)]
    r = replay(write_job(tmp_path, docs), on="dgx-h100")
    g = r.tg.graph
    nbytes = RING_NELEMS * 4

    def pair_ms(system, a, b):
        return predict_collective("sendrecv", nbytes, system, ranks=[a, b]).time_ms
    links = [(1, 2), (2, 3)]
    want = MEASURED_US * (max(pair_ms("dgx-h100", *p) for p in links) /
                          max(pair_ms("dgx1-v100", *p) for p in links))
    ring = MEASURED_US * (predict_collective("sendrecv", nbytes, "dgx-h100", ranks=[1, 2, 3]).time_ms /
                          predict_collective("sendrecv", nbytes, "dgx1-v100", ranks=[1, 2, 3]).time_ms)
    op = next(op for op, ge, *_ in r.tg.gpu_ops[2] if ge.name == KERNEL)
    assert 1e3 * g.dur_ms[op] == pytest.approx(want)
    assert abs(want - ring) > 0.3 * ring  # the two prices differ: the test tells them apart
