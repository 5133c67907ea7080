"""kit replay --on a system: a collective whose trace names its process group is priced on that
group's ranks as the target places them, and a send/recv with its peer as one transfer between
the two ranks; without those fields it is priced over all the job's ranks, as before.

The synthetic traces carry the fields as torch 2.13's profiler writes them on its
record_param_comms cpu_op: the keys of torch/include/torch/csrc/profiler/util.h:190-206
(kCommsName "Collective name" ... kP2pDst "Dst Rank"); "Process Group Ranks" a string of a JSON
list (torch/_inductor/fx_passes/profile_guided_estimation.py:208,226-231 json.loads it), the counts
and ranks numbers (torch/testing/_internal/distributed/distributed_test.py:697-712), dtype c10's
ScalarType name ("Float": distributed_test.py:7107)."""
import json

import pytest

from kit.comm import predict_collective
from kit.trace import replay
from kit.trace.comm_meta import DTYPE_BYTES, comm_meta

A100, V100 = "NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-32GB"
TARGET = "a100x4-nvlink-x2"  # two nodes of 4 A100s on NVLink, InfiniBand HDR between them
MEASURED_US = 200


def ev(name, ts, dur, cat, tid=1, **a):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": 1, "tid": tid, "args": a}


def job(tmp_path, gpu, fields_of, kernel, annotation=None, world=8, on_kernel=False):
    """world ranks, one step each: one collective, its launch under a record_param_comms carrying
    fields_of(rank) (and an nccl:* annotation when given, float inputs of its In msg nelems), its
    kernel MEASURED_US long, then a stream sync. on_kernel: the kernel's event carries the fields
    instead, as newer Kineto writes them (profile_guided_estimation.py:198-216 reads them there)."""
    d = tmp_path / "job"
    d.mkdir()
    end = 30 + MEASURED_US
    for r in range(world):
        fields = fields_of(r)
        events = [ev("ProfilerStep#1", 0, end + 10, "cpu_op"),
                  ev("record_param_comms", 8, 24, "cpu_op", **({} if on_kernel else fields)),
                  ev("cudaLaunchKernel", 15, 5, "cuda_runtime", correlation=7),
                  ev(kernel, 30, MEASURED_US, "kernel", tid=7, correlation=7, stream=7,
                     **(fields if on_kernel else {})),
                  ev("cudaStreamSynchronize", 20, end + 2 - 20, "cuda_runtime", correlation=8)]
        if annotation:
            events.append(ev(annotation, 10, 20, "user_annotation",
                             **{"Input Dims": [[fields["In msg nelems"]]], "Input type": ["float"]}))
        (d / f"rank{r}.json").write_text(json.dumps({
            "distributedInfo": {"rank": r, "world_size": world}, "deviceProperties": [{"name": gpu}],
            "traceEvents": events}))
    return d


def comm_us(d, on=TARGET):
    """rank -> the replayed duration (us) of its one collective, and the replay's notes."""
    r = replay(d, on=on)
    g = r.tg.graph
    durs = {rank: 1e3 * g.dur_ms[op] for rank, ops in r.tg.gpu_ops.items() for op, *_ in ops
            if g.kind[op] == "comm"}
    return durs, r.to_dict()["notes"]


def pairs_of_two(nelems, name="allreduce", dtype="Float"):
    """Ranks in groups of two (0-1, 2-3, ...), as a tensor-parallel group of 2 is."""
    def fields(r):
        lo = r - r % 2
        return {"Collective name": name, "dtype": dtype, "In msg nelems": nelems,
                "Out msg nelems": nelems * (2 if "gather" in name else 1), "Group size": 2,
                "Global rank start": lo, "Global rank stride": 1, "Process Group Name": "1",
                "Process Group Description": "tp", "Process Group Ranks": f"[{lo}, {lo + 1}]",
                "Rank": r % 2}
    return fields


@pytest.mark.parametrize("on_kernel", [False, True])
def test_a_group_of_two_on_one_node_is_priced_on_nvlink_not_across_the_job(tmp_path, on_kernel):
    # an 8-rank A100 job (recorded on a DGX A100) replayed on two a100x4 nodes: its all-reduce of
    # 16 MiB runs in pairs 0-1, 2-3, ...; each pair sits on one node, so NVLink carries it. As
    # an 8-rank all-reduce across the two nodes (InfiniBand), it had been 535 us, not 370
    n = 1 << 22
    durs, notes = comm_us(job(tmp_path, A100, pairs_of_two(n), "ncclKernel_AllReduce_RING_LL_Sum_float",
                              "nccl:all_reduce", on_kernel=on_kernel))
    on_nvlink = {}
    for lo in (0, 2, 4, 6):
        # the same pair on a single a100x4 node (no network at all) over the same pair of the DGX A100
        node = 0 if lo < 4 else 4
        one_node = predict_collective("allreduce", 4 * n, "a100x4-nvlink", ranks=[lo - node, lo + 1 - node])
        assert one_node.nodes_spanned == 1
        src = predict_collective("allreduce", 4 * n, "dgx-a100", ranks=[lo, lo + 1])
        on_nvlink[lo] = on_nvlink[lo + 1] = MEASURED_US * one_node.time_ms / src.time_ms
    assert durs == pytest.approx(on_nvlink, rel=1e-9)
    whole = MEASURED_US * (predict_collective("allreduce", 4 * n, TARGET, ranks=list(range(8))).time_ms
                           / predict_collective("allreduce", 4 * n, "dgx-a100", ranks=list(range(8))).time_ms)
    assert durs[0] < 0.8 * whole
    assert any("8 collective(s) priced on the process group their trace names" in x for x in notes)


def test_a_send_between_nodes_is_one_transfer_on_the_nic_not_a_ring_shift(tmp_path):
    # ranks 0-3 send 4 MiB to ranks 4-7 (a pipeline's stage boundary); recorded on a DGX-1
    # (V100, hybrid cube-mesh NVLink). On two a100x4 nodes each send crosses the nodes: one
    # transfer on the NIC. As an 8-rank ring shift it had been priced over the ring's slowest
    # pair on the DGX-1 (GPU 3 -> 4: no NVLink between them, PCIe across the sockets), so its
    # measured 200 us had scaled by 0.57 (113 us) where the pair's scales by 1.91 (382 us), at 16 MiB
    # (at 4 MiB: 0.61, 123 us, against 1.71, 342 us).
    # 4 MiB a send: 16 MiB in 200 us (84 GB/s) beats the DGX-1 pairs' own links (0.37-0.71 ms of
    # bytes), a trace not recorded there; 4 MiB takes 0.09-0.18 ms of bytes
    n = 1 << 20
    full = "[" + ", ".join(map(str, range(8))) + "]"

    def fields(r):
        send = r < 4
        f = {"Collective name": "send" if send else "recv", "dtype": "Float", "In msg nelems": n,
             "Out msg nelems": n, "Group size": 8, "Global rank start": 0, "Global rank stride": 1,
             "Process Group Name": "0", "Process Group Description": "default_pg",
             "Process Group Ranks": full, "Rank": r + 4 if send else r - 4}
        f["Dst Rank" if send else "Src Rank"] = r + 4 if send else r - 4
        return f
    durs, notes = comm_us(job(tmp_path, V100, fields, "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t",
                              "nccl:send"))
    want = {}
    for r in range(8):
        pair = [r % 4, r % 4 + 4]
        dst = predict_collective("sendrecv", 4 * n, TARGET, ranks=pair)
        # on the NIC: its latency, then the bytes at InfiniBand HDR's 25 GB/s x 0.92 (the
        # preset's ib-hdr: ConnectX-6), the HBM copies at either end aside (within 3%)
        assert dst.nodes_spanned == 2
        assert dst.time_ms == pytest.approx(dst.latency_ms + 4 * n / (25e9 * 0.92) * 1e3, rel=0.03)
        want[r] = MEASURED_US * dst.time_ms / predict_collective("sendrecv", 4 * n, "dgx1-v100",
                                                                 ranks=pair).time_ms
    assert durs == pytest.approx(want, rel=1e-9)
    ring = MEASURED_US * (predict_collective("sendrecv", 4 * n, TARGET, ranks=list(range(8))).time_ms
                          / predict_collective("sendrecv", 4 * n, "dgx1-v100", ranks=list(range(8))).time_ms)
    assert durs[0] > 2 * ring
    assert any("8 send/recv as one transfer between their two ranks" in x for x in notes)


def test_the_size_comes_from_the_fields_without_an_nccl_annotation(tmp_path):
    # an all-gather of 2**21 BFloat16 elements a rank over a pair: it gathers 2 x 2**21 x 2 bytes
    # ("Out msg nelems" x 2 bytes), the nccl-tests size. Without an nccl:* annotation it had
    # kept its measured 200 us
    n = 1 << 21
    durs, _ = comm_us(job(tmp_path, A100, pairs_of_two(n, "_allgather_base", "BFloat16"),
                          "ncclKernel_AllGather_RING_LL_Sum_bf16"))
    size = 2 * n * 2
    want = MEASURED_US * (predict_collective("allgather", size, TARGET, ranks=[0, 1]).time_ms
                          / predict_collective("allgather", size, "dgx-a100", ranks=[0, 1]).time_ms)
    assert durs[0] == pytest.approx(want, rel=1e-9)
    assert durs[0] != pytest.approx(MEASURED_US, rel=0.01)


def test_shortened_group_ranks_are_rebuilt_from_start_and_stride(tmp_path):
    # past a length torch writes "[a, b, ..., z]" (libtorch_cpu.so's format "[{}, ..., {}]"); the
    # ranks are then start + i * stride: here 0, 4 (two ranks, one a node) of an 8-rank job
    meta = comm_meta({"Collective name": "allreduce", "Process Group Ranks": "[0, ..., 4]",
                      "Global rank start": 0, "Global rank stride": 4, "Group size": 2})
    assert meta.group_ranks == (0, 4)
    bad = comm_meta({"Collective name": "allreduce", "Process Group Ranks": "[0, ..., 4]",
                     "Global rank stride": -1, "Group size": 2})
    assert bad.group_ranks is None and "shortened" in bad.problem


@pytest.mark.parametrize("ranks, why", [("[0, 1, 2]", "lists 3 ranks and its 'Group size' is 2"),
                                        ("zero and one", "no list of distinct ranks"),
                                        ("[2, 3]", "leave out rank 0"), ("[]", "is empty")])
def test_unusable_group_fields_fall_back_to_the_job_and_say_why(tmp_path, ranks, why):
    n = 1 << 22

    def fields(r):
        f = pairs_of_two(n)(r)
        if r == 0:
            f["Process Group Ranks"] = ranks
        return f
    durs, notes = comm_us(job(tmp_path, A100, fields, "ncclKernel_AllReduce_RING_LL_Sum_float",
                              "nccl:all_reduce"))
    whole = MEASURED_US * (predict_collective("allreduce", 4 * n, TARGET, ranks=list(range(8))).time_ms
                           / predict_collective("allreduce", 4 * n, "dgx-a100", ranks=list(range(8))).time_ms)
    assert durs[0] == pytest.approx(whole, rel=1e-9)
    assert any(why in x and x.startswith("1 collective(s) do not use") for x in notes)
    assert any(x.startswith("1 collective(s) priced over all the job's 8 ranks") for x in notes)


def test_a_peer_is_a_global_rank_of_its_group():
    from kit.trace.transfer import trace_group

    # a pipeline group of ranks 2 and 6: rank 2's send to global rank 6 is the pair (2, 6); a
    # "Dst Rank" of 1 (a rank within the group, not a global one) is in no pair of this group
    send = {"Collective name": "send", "Process Group Ranks": "[2, 6]", "Group size": 2}
    assert trace_group(comm_meta({**send, "Dst Rank": 6}), 2, 8) == ([2, 6], None)
    ranks, why = trace_group(comm_meta({**send, "Dst Rank": 1}), 2, 8)
    assert ranks is None and "not both in its 'Process Group Ranks' (2, 6)" in why
    assert trace_group(comm_meta({**send, "Dst Rank": 9}), 2, 8)[1] == "its peer rank 9 is outside the job's 8 ranks"


def test_the_dtype_sizes_are_torchs():
    torch = pytest.importorskip("torch")
    seen = 0
    for dt in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
               torch.float32, torch.float64, torch.complex64, torch.complex128, torch.bool,
               torch.bfloat16, torch.float8_e5m2, torch.float8_e4m3fn):
        name = torch.empty(0, dtype=dt).type().removeprefix("torch.").removesuffix("Tensor")
        assert DTYPE_BYTES[name] == dt.itemsize, name  # c10's ScalarType name, as dtype is written
        seen += 1
    assert seen == 14
