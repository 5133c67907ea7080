"""kit replay: a collective whose trace names its process group (torch 2.13's record_param_comms
'Process Group Ranks', kit.trace.comm_meta) synchronises its group's ranks only. Matched by their
position on each rank's NCCL stream across the whole job, disjoint groups had been tied to each
other: each took the shortest measured duration of all the job's ranks (another group's) and
waited for the other group's ranks to arrive."""
import json

import pytest

from kit.trace import replay

A100 = "NVIDIA A100-SXM4-40GB"
N = 1 << 22


def ev(name, ts, dur, cat, tid=1, **a):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": 1, "tid": tid, "args": a}


def write_job(d, ranks, group_of, compute_us, comm_us, world):
    """One step a rank: a GEMM of compute_us[r], then an all-reduce of comm_us[r] on the group
    group_of(r) names (launched under record_param_comms with its fields), then a sync."""
    d.mkdir()
    for r in ranks:
        grp = group_of(r)
        fields = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": N,
                  "Out msg nelems": N, "Group size": len(grp), "Global rank start": grp[0],
                  "Global rank stride": 1, "Process Group Ranks": json.dumps(list(grp)),
                  "Rank": grp.index(r)}
        t_comm = 20 + compute_us[r]
        end = t_comm + comm_us[r]
        events = [ev("ProfilerStep#1", 0, end + 10, "cpu_op"),
                  ev("aten::mm", 2, 4, "cpu_op"),
                  ev("cudaLaunchKernel", 3, 2, "cuda_runtime", correlation=5),
                  ev("ampere_sgemm_128x64_nn", 10, compute_us[r], "kernel", tid=7, correlation=5, stream=7),
                  ev("record_param_comms", 8, 24, "cpu_op", **fields),
                  ev("cudaLaunchKernel", 15, 5, "cuda_runtime", correlation=7),
                  ev("ncclKernel_AllReduce_RING_LL_Sum_float", t_comm, comm_us[r], "kernel", tid=8,
                     correlation=7, stream=8),
                  ev("cudaStreamSynchronize", 20, end + 2 - 20, "cuda_runtime", correlation=8)]
        (d / f"rank{r}.json").write_text(json.dumps({
            "distributedInfo": {"rank": r, "world_size": world}, "deviceProperties": [{"name": A100}],
            "traceEvents": events}))
    return d


def halves(r):
    return (0, 1, 2, 3) if r < 4 else (4, 5, 6, 7)


def comm_and_steps(d, on=None):
    r = replay(d, on=on) if on else replay(d)
    g = r.tg.graph
    durs = {rank: 1e3 * g.dur_ms[op] for rank, ops in r.tg.gpu_ops.items() for op, *_ in ops
            if g.kind[op] == "comm"}
    return durs, {x["rank"]: x["predicted_ms"] for x in r.to_dict()["ranks"]}, r.to_dict()["notes"]


def test_each_group_keeps_its_own_measured_duration(tmp_path):
    # ranks 0-3 all-reduce among themselves in 200 us, ranks 4-7 among themselves in 50 us. Tied
    # as one 8-rank collective, ranks 0-3 had taken 50 us (ranks 4-7's) and waited the rest
    comp = {r: 100 if r < 4 else 1000 for r in range(8)}
    comm = {r: 200 if r < 4 else 50 for r in range(8)}
    durs, _, notes = comm_and_steps(write_job(tmp_path / "j", range(8), halves, comp, comm, 8))
    assert durs == pytest.approx(comm, abs=1e-9)
    assert any(x.startswith("8 collective(s) synchronised within the process groups") for x in notes)


@pytest.mark.parametrize("on", [None, "h100-sxm"])
def test_each_group_replays_as_if_the_other_group_were_not_there(tmp_path, on):
    # ranks 0-3 run a 100 us GEMM, ranks 4-7 one of 1000 us, then each half all-reduces among
    # itself. Each rank's step is what a 4-rank job of its half's traces alone replays to. Tied
    # to ranks 0-3 (whose clocks the end-aligned collective had put 750 us later), on an H100
    # ranks 4-7 had waited for them: 1.161 ms, where their own GEMM and all-reduce take 0.523
    comm = {r: 200 for r in range(8)}
    comp = {r: 100 if r < 4 else 1000 for r in range(8)}
    _, steps, _ = comm_and_steps(write_job(tmp_path / "j", range(8), halves, comp, comm, 8), on)
    for half in (0, 1):
        own = {r: comp[4 * half] for r in range(4)}
        _, alone, _ = comm_and_steps(write_job(tmp_path / f"alone{half}", range(4), halves, own,
                                               comm, 4), on)
        for r in range(4):
            assert steps[4 * half + r] == pytest.approx(alone[r], rel=1e-9), (half, r)


def test_groups_that_do_not_partition_the_ranks_stay_tied_to_the_job(tmp_path):
    # rank 0 names (0, 1), rank 1 names (0, 1, 2, 3): no consistent split, so all 8 stay one
    # collective (the shortest measured duration of all), as without the fields
    def group_of(r):
        return (0, 1) if r == 0 else halves(r)
    comp = {r: 100 for r in range(8)}
    comm = {r: 200 if r < 4 else 50 for r in range(8)}
    durs, _, notes = comm_and_steps(write_job(tmp_path / "j", range(8), group_of, comp, comm, 8))
    assert durs == pytest.approx({r: 50 for r in range(8)}, abs=1e-9)
    assert not any("synchronised within the process groups" in x for x in notes)


def test_a_shortened_group_with_an_absurd_size_is_refused_not_built():
    # a 'Group size' of 10**9 with a shortened 'Process Group Ranks' had built a tuple of 10**9
    # ranks (the replay hung); the shown ranks must also be the rebuilt ones
    from kit.trace.comm_meta import comm_meta

    f = {"Collective name": "allreduce", "Process Group Ranks": "[0, 1, ..., 7]",
         "Global rank start": 0, "Global rank stride": 1, "Group size": 10 ** 9}
    assert "past any job's" in comm_meta(f).problem
    assert comm_meta({**f, "Group size": 8}).group_ranks == tuple(range(8))
    assert "are not 'Global rank start' 0 + i x 'Global rank stride' 2" in comm_meta(
        {**f, "Group size": 8, "Global rank stride": 2}).problem


@pytest.mark.parametrize("key, value", [("In msg nelems", -5), ("dtype", 7), ("dtype", "Quaternion")])
def test_an_unreadable_size_in_the_fields_is_named(tmp_path, key, value):
    # rank 0's record_param_comms gives no usable size and the job has no nccl:* annotation: its
    # all-reduce keeps its measured time, and the note names the fields, not only the annotation
    d = write_job(tmp_path / "j", range(8), halves, {r: 100 for r in range(8)}, {r: 200 for r in range(8)}, 8)
    doc = json.loads((d / "rank0.json").read_text())
    for e in doc["traceEvents"]:
        if e["name"] == "record_param_comms":
            e["args"][key] = value
    (d / "rank0.json").write_text(json.dumps(doc))
    durs, _, notes = comm_and_steps(d, "a100x4-nvlink-x2")
    assert durs[0] == 200
    assert ("1 collective(s) keep their measured times: no readable size: its 'In msg nelems'/"
            "'Out msg nelems' x 'dtype' give none, nor does an nccl:* annotation") in notes
