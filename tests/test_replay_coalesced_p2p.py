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
