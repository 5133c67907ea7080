"""kit replay --on a system: a collective is priced as the one its nccl:* annotation says, at its
nccl-tests size (kit.comm.conventions), not as what its kernel's name suggests."""
import json

import pytest

from kit.trace import replay

A100 = "NVIDIA A100-SXM4-40GB"
TARGET = "a100x4-nvlink-x2"  # 8 ranks on two nodes: sizes and kinds price differently there


def ev(name, ts, dur, cat, tid=1, **a):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": 1, "tid": tid, "args": a}


def job(tmp_path, annotation, kernel, elements, world=8, comm_us=200):
    """world ranks, one step each: one collective under its nccl:* annotation (float inputs of
    `elements`, a count or a list of one a tensor), its kernel comm_us long, then a stream sync."""
    inputs = elements if isinstance(elements, list) else [elements]
    tmp_path.mkdir(exist_ok=True)
    d = tmp_path / f"{annotation.replace(':', '_')}_{kernel}_{'_'.join(map(str, inputs))}"
    d.mkdir()
    end = 30 + comm_us
    for r in range(world):
        (d / f"rank{r}.json").write_text(json.dumps({
            "distributedInfo": {"rank": r, "world_size": world}, "deviceProperties": [{"name": A100}],
            "traceEvents": [
                ev("ProfilerStep#1", 0, end + 10, "cpu_op"),
                ev(annotation, 10, 20, "cpu_op", **{"Input Dims": [[n] for n in inputs],
                                                       "Input type": ["float"] * len(inputs)}),
                ev("cudaLaunchKernel", 15, 5, "cuda_runtime", correlation=7),
                ev(kernel, 30, comm_us, "kernel", tid=7, correlation=7, stream=7),
                ev("cudaStreamSynchronize", 20, end + 2 - 20, "cuda_runtime", correlation=8)]}))
    return d


def comm_us(tmp_path, annotation, kernel, elements, on=TARGET):
    r = replay(job(tmp_path, annotation, kernel, elements), on=on)
    g = r.tg.graph
    durs = {g.dur_ms[op] for ops in r.tg.gpu_ops.values() for op, *_ in ops if g.kind[op] == "comm"}
    assert len(durs) == 1  # one collective, synchronised across the ranks
    return 1e3 * durs.pop()


@pytest.mark.parametrize("on", ["dgx-h100", TARGET])
def test_an_all_gather_of_shards_moves_what_the_reduce_scatter_of_the_whole_does(tmp_path, on):
    # all-gather's annotation holds each rank's 1 MiB shard; the mirror reduce-scatter's the
    # whole 8 MiB: the same nccl-tests size, the same traffic. The all-gather had been priced at
    # 1 MiB (on two a100x4 nodes 179 us, the reduce-scatter 384)
    shard = 1 << 18
    ag = comm_us(tmp_path, "nccl:_allgather_base", "ncclKernel_AllGather_RING_LL_Sum_float", shard, on)
    rs = comm_us(tmp_path, "nccl:_reduce_scatter_base", "ncclKernel_ReduceScatter_RING_LL_Sum_float",
                 8 * shard, on)
    assert ag == pytest.approx(rs, rel=1e-9)


def test_a_generic_kernel_is_the_collective_its_annotation_names(tmp_path):
    # NCCL 2.19+ runs any collective as ncclDevKernel_Generic: it had read as an all-reduce
    named = comm_us(tmp_path, "nccl:reduce_scatter", "ncclKernel_ReduceScatter_RING_LL_Sum_float", 1 << 21)
    generic = comm_us(tmp_path, "nccl:reduce_scatter", "ncclDevKernel_Generic", 1 << 21)
    assert generic == pytest.approx(named, rel=1e-9)


def test_a_send_is_priced_as_a_send_not_as_an_all_to_all(tmp_path):
    from kit.comm import predict_collective
    from kit.hardware import get_gpu
    from kit.trace.transfer import source_system

    # send/recv and all-to-all both run as SendRecv kernels; only the annotation tells them apart
    kernel, n = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", 1 << 22
    send = comm_us(tmp_path, "nccl:send", kernel, n)
    a, b = (predict_collective("sendrecv", 4 * n, s, ranks=list(range(8))).time_ms
            for s in (source_system(get_gpu("a100-sxm4-40gb"), 8), TARGET))
    assert send == pytest.approx(200 * b / a, rel=1e-9)
    assert comm_us(tmp_path, "nccl:all_to_all", kernel, n) != pytest.approx(send, rel=0.01)


def test_a_coalesced_collective_moves_all_its_tensors(tmp_path):
    # all_reduce_coalesced lists each tensor as an input: three 1 MiB gradients are 3 MiB, not
    # the first one's 1 MiB
    kernel = "ncclKernel_AllReduce_RING_LL_Sum_float"
    three = comm_us(tmp_path, "nccl:all_reduce_coalesced", kernel, [1 << 18] * 3)
    assert three == pytest.approx(comm_us(tmp_path, "nccl:all_reduce", kernel, 3 << 18), rel=1e-9)
    assert three != pytest.approx(comm_us(tmp_path, "nccl:all_reduce", kernel, 1 << 18), rel=0.01)


def test_a_send_and_recv_pair_is_one_kind_for_a_member_without_its_annotation(tmp_path):
    # even ranks send, odd ranks receive; rank 1 lost its annotation and takes its group's size
    # and kind: send and recv are both sendrecv, so it is priced as the others are. The titles
    # are ProcessGroupNCCL's own ("nccl:send 0->1", "nccl:recv 1<-0": c10::str("nccl:send ",
    # rank_, "->", dstRank)), not the bare "nccl:send"
    kernel = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"
    alike = comm_us(tmp_path, "nccl:send", kernel, 1 << 22)
    d = job(tmp_path / "pair", "nccl:send", kernel, 1 << 22)
    for r in range(8):
        f = d / f"rank{r}.json"
        doc = json.loads(f.read_text())
        for e in doc["traceEvents"]:
            if e["name"] == "nccl:send":  # ProcessGroupNCCL's titles name the peer
                e["name"] = f"nccl:recv {r}<-{r - 1}" if r % 2 else f"nccl:send {r}->{r + 1}"
        if r == 1:
            doc["traceEvents"] = [e for e in doc["traceEvents"] if not e["name"].startswith("nccl:")]
        f.write_text(json.dumps(doc))
    g = (r := replay(d, on=TARGET)).tg.graph
    durs = {g.dur_ms[op] for ops in r.tg.gpu_ops.values() for op, *_ in ops if g.kind[op] == "comm"}
    assert len(durs) == 1 and durs.pop() == pytest.approx(alike / 1e3)
