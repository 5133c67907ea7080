"""kit replay audit: a job with some rank files missing, and host-bound (pageable) copies under --on."""
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from kit.trace import replay

SHARED = Path(os.environ.get("KIT_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
INPUTS = SHARED / "data/traces/param/et_replay/tests/inputs"
DLRM = INPUTS / "dlrm_kineto.tar.gz"
RESNET = INPUTS / "resnet_kineto.json.gz"
A100 = "NVIDIA A100-SXM4-40GB"


def ev(name, ts, dur, cat, tid=1, **a):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": 1, "tid": tid, "args": a}


def nccl_rank(rank, world, comm_us, gpu=A100):
    """One step: an all-reduce of 2^20 floats (4 MiB) launched at 15 us, its kernel comm_us long
    (a rank that arrived early waited inside it), then a stream sync."""
    end = 30 + comm_us
    return {"distributedInfo": {"rank": rank, "world_size": world}, "deviceProperties": [{"name": gpu}],
            "traceEvents": [
                ev("ProfilerStep#1", 0, end + 10, "cpu_op"),
                ev("nccl:all_reduce", 10, 20, "cpu_op", **{"Input Dims": [[1 << 20]], "Input type": ["float"]}),
                ev("cudaLaunchKernel", 15, 5, "cuda_runtime", correlation=7),
                ev("ncclKernel_AllReduce_RING_LL_Sum_float", 30, comm_us, "kernel", tid=7, correlation=7, stream=7),
                ev("cudaStreamSynchronize", 20, end + 2 - 20, "cuda_runtime", correlation=8)]}


def job(tmp_path, ranks, world, comm_us=(100, 60, 140, 80)):
    d = tmp_path / "job"
    d.mkdir()
    for r in ranks:
        (d / f"rank{r}.json").write_text(json.dumps(nccl_rank(r, world, comm_us[r % len(comm_us)])))
    return d


def comm_durs(r):
    g = r.tg.graph
    return {rank: [g.dur_ms[op] for op, *_ in ops if g.kind[op] == "comm"] for rank, ops in r.tg.gpu_ops.items()}


# ---- Bug A: some of the job's rank files missing ---------------------------------------------------

def test_three_of_four_ranks_are_not_synchronised_and_the_missing_rank_is_named(tmp_path):
    r = replay(job(tmp_path, [0, 1, 3], world=4))
    d = r.to_dict()
    # was: collectives_synced True, every all-reduce cut to the shortest of the 3 present (60 us), no note
    assert d["collectives_synced"] is False and d["missing_ranks"] == [2]
    assert d["clock_offsets_us"] == {}
    (note,) = [n for n in d["notes"] if "missing" in n]
    assert note.startswith("rank 2 missing") and "3 of the job's 4 ranks" in note and "not synchronised" in note
    # named as the other replay messages name it, for kit.api callers too (it had said "--on" alone)
    assert note.endswith("(each takes its measured duration, or the one --on/on= predicts for 4 ranks)"), note
    assert comm_durs(r) == {0: [pytest.approx(0.100)], 1: [pytest.approx(0.060)], 3: [pytest.approx(0.080)]}
    for row in d["ranks"]:
        assert row["predicted_ms"] == pytest.approx(row["measured_ms"], abs=1e-9)


def test_several_missing_ranks_are_listed_as_ranges(tmp_path):
    d = replay(job(tmp_path, [0, 4], world=8)).to_dict()
    assert d["missing_ranks"] == [1, 2, 3, 5, 6, 7]
    assert any(n.startswith("ranks 1-3, 5-7 missing: the files hold 2 of the job's 8 ranks") for n in d["notes"])


def test_the_whole_job_is_still_synchronised(tmp_path):
    r = replay(job(tmp_path, [0, 1, 2, 3], world=4))
    d = r.to_dict()
    assert d["collectives_synced"] is True and d["missing_ranks"] == []
    assert not any("missing" in n for n in d["notes"])
    assert all(v == [pytest.approx(0.060)] for v in comm_durs(r).values())  # the shortest of the group


def test_ranks_named_by_file_without_world_size_are_not_called_incomplete(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    for r in (0, 3):
        doc = nccl_rank(r, 2, 100)
        del doc["distributedInfo"]
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    out = replay(d).to_dict()
    assert out["missing_ranks"] == [] and out["collectives_synced"] is True


def test_incomplete_job_on_a_system_rescales_each_measured_collective_for_the_whole_job(tmp_path):
    from kit.comm import predict_collective
    from kit.hardware import get_gpu
    from kit.hardware.system import get_system
    from kit.trace.transfer import source_system

    r = replay(job(tmp_path, [0, 1, 3], world=4), on="dgx-h100")
    src = source_system(get_gpu("a100-sxm4-40gb"), 4)
    a, b = (predict_collective("allreduce", 4 << 20, s, ranks=list(range(4))).time_ms
            for s in (src, get_system("dgx-h100")))
    # the two halves agree: no 3-rank sync, and each rank's own all-reduce rescaled as a 4-rank one
    assert r.tg.collectives_synced is False
    assert comm_durs(r) == {0: [pytest.approx(0.100 * b / a)], 1: [pytest.approx(0.060 * b / a)],
                            3: [pytest.approx(0.080 * b / a)]}


@pytest.mark.skipif(not DLRM.exists(), reason="DLRM trace not present")
def test_dlrm_seven_of_eight_ranks(tmp_path):
    with tarfile.open(DLRM) as tf:
        tf.extractall(tmp_path / "all", filter="data")
    seven = tmp_path / "seven"
    seven.mkdir()
    files = sorted((tmp_path / "all").rglob("worker*.json"))
    assert len(files) == 8
    for f in files:
        if not f.name.startswith("worker7"):
            shutil.copy(f, seven / f.name)
    d = replay(seven, et=False).to_dict()
    assert [x["rank"] for x in d["ranks"]] == list(range(7))
    assert d["collectives_synced"] is False and d["missing_ranks"] == [7]
    assert any(n.startswith("rank 7 missing: the files hold 7 of the job's 8 ranks") for n in d["notes"])


# ---- Bug B: host-bound host<->device copies under --on --------------------------------------------

def copies_rank(copies, gpu="NVIDIA GeForce RTX 2080 Ti"):
    """One step of blocking cudaMemcpy calls: copies = [(name, bytes or None, dur_us)]."""
    e, t = [], 0
    for k, (name, nbytes, dur) in enumerate(copies):
        a = {"correlation": 10 + k, "stream": 7}
        if nbytes is not None:
            a["bytes"] = nbytes
        e.append(ev("cudaMemcpyAsync", t, 5, "cuda_runtime", correlation=10 + k))
        e.append({"ph": "X", "name": name, "ts": t + 5, "dur": dur, "cat": "gpu_memcpy", "pid": 0, "tid": 7,
                  "args": a})
        e.append(ev("cudaStreamSynchronize", t + 5, dur + 2, "cuda_runtime", correlation=100 + k))
        t += dur + 20
    return {"distributedInfo": {"rank": 0, "world_size": 1}, "deviceProperties": [{"name": gpu}],
            "traceEvents": [ev("ProfilerStep#1", 0, t, "cpu_op")] + e}


def test_host_bound_copies_keep_their_time_and_link_bound_ones_scale(tmp_path):
    from kit.hardware import get_gpu
    from kit.predict.roofline import host_link_gbs

    mb = 77_070_336
    copies = [("Memcpy HtoD (Pageable -> Device)", mb, 23_000),  # 3.4 GB/s: host-staged
              ("Memcpy DtoH (Device -> Pageable)", mb, 6_000),  # named pageable, whatever its rate
              ("Memcpy HtoD (Pinned -> Device)", mb, 6_000),  # 12.8 GB/s on PCIe 3 (16): link speed
              ("Memcpy HtoD (Pinned -> Device)", mb, 20_000),  # 3.9 GB/s pinned: under half the link
              ("Memcpy HtoD (Pinned -> Device)", 64, 1),  # 64 B in 1 us: latency, not bandwidth
              ("Memcpy HtoD (Pinned -> Device)", None, 500)]  # no byte count: taken as link-bound
    p = tmp_path / "r0.json"
    p.write_text(json.dumps(copies_rank(copies)))
    r = replay(p, on="h100-sxm")
    g = r.tg.graph
    durs = [g.dur_ms[op] for op, *_ in r.tg.gpu_ops[0]]
    ratio = host_link_gbs(get_gpu("rtx-2080-ti")) / host_link_gbs(get_gpu("h100-sxm"))
    # was: every one of them 4x faster (PCIe 3 -> 5)
    assert durs == [pytest.approx(23.0), pytest.approx(6.0), pytest.approx(6.0 * ratio), pytest.approx(20.0),
                    pytest.approx(0.001), pytest.approx(0.5 * ratio)]
    assert any("4 host-bound host<->device copies" in n for n in r.to_dict()["notes"])


def test_host_bound_rule():
    from kit.trace.kineto import GpuEvent
    from kit.trace.transfer import HOST_BOUND_LINK_FRACTION, host_bound_copy

    assert HOST_BOUND_LINK_FRACTION == 0.5
    copy = lambda name, nbytes, dur: GpuEvent(0.0, dur, name, "7", "memcpy", 1, nbytes)
    assert host_bound_copy(copy("Memcpy HtoD (Pageable -> Device)", None, 10), 16.0)
    assert host_bound_copy(copy("Memcpy HtoD (Pinned -> Device)", 7_900_000, 1000), 16.0)  # 7.9 < 8 GB/s
    assert not host_bound_copy(copy("Memcpy HtoD (Pinned -> Device)", 8_100_000, 1000), 16.0)
    assert not host_bound_copy(copy("Memcpy HtoD (Pinned -> Device)", 1000, 0), 16.0)  # no rate to read


def test_device_copies_and_memsets_keep_the_kernel_floor(tmp_path):
    # PARAM's ResNet trace (RTX 2080 Ti) copies 256 B to 147 KB DtoD in 2-3 us and sets 37,632
    # bytes in 2 us (~19 GB/s of the card's 616); its Linear trace sets 512 bytes in 1 us: their
    # time is the op's fixed cost. Scaled whole by the bandwidths (616 -> 3352 GB/s) they had gone
    # to 0.37 and 0.18 us on an H100; now the first 2 us stay, as a kernel's
    # (kit.trace.transfer.above_floor_ms)
    copies = [("Memcpy DtoD (Device -> Device)", 37_632, 2),
              ("Memcpy DtoD (Device -> Device)", 16 * 1024 * 1024, 30),
              ("Memset (Device)", 512, 1)]
    doc = copies_rank(copies)
    for e in doc["traceEvents"]:
        if e["name"].startswith("Memset"):
            e["cat"] = "gpu_memset"
    p = tmp_path / "r0.json"
    p.write_text(json.dumps(doc))
    r = replay(p, on="h100-sxm")
    durs_us = [r.tg.graph.dur_ms[op] * 1e3 for op, *_ in r.tg.gpu_ops[0]]
    assert durs_us == [pytest.approx(2.0), pytest.approx(2.0 + 28.0 * 616 / 3352), pytest.approx(1.0)]


@pytest.mark.skipif(not RESNET.exists(), reason="ResNet trace not present")
def test_resnet_pageable_batches_stay_on_the_critical_path_on_h100():
    base = replay(RESNET).to_dict()["critical_path"]
    on = replay(RESNET, on="h100-sxm").to_dict()
    # was: memcpy 629.8 -> 0.003 ms, the ~629 ms moved to cpu, each 77 MB pageable copy 4x faster
    assert base["memcpy"] == pytest.approx(629.76, abs=0.05)
    assert on["critical_path"]["memcpy"] == pytest.approx(base["memcpy"], abs=0.01)  # its DtoD copies scale
    assert on["critical_path"]["cpu"] == pytest.approx(base["cpu"], abs=0.01)
    assert any("61 host-bound host<->device copies" in n for n in on["notes"])


def test_a_host_bound_copy_is_never_faster_than_the_target_link(tmp_path):
    # a host-bound copy keeps its measured time, unless the target's link cannot carry its bytes
    # that fast: a 77 MB pageable copy at 3.4 GB/s on PCIe 3 stays 23 ms on an H100 (PCIe 5), but
    # a 28 GB/s pinned-but-slow copy measured on PCIe 5 cannot run at 28 GB/s over PCIe 3
    from kit.hardware import get_gpu
    from kit.predict.roofline import host_link_gbs

    mb = 77_070_336
    p = tmp_path / "r0.json"
    p.write_text(json.dumps(copies_rank([("Memcpy HtoD (Pageable -> Device)", mb, 2_750)], gpu="NVIDIA H100 PCIe")))
    r = replay(p, on="p100-pcie-16gb")
    d = [r.tg.graph.dur_ms[op] for op, *_ in r.tg.gpu_ops[0]][0]
    link = host_link_gbs(get_gpu("p100-pcie-16gb"))
    assert d == pytest.approx(mb / (link * 1e9) * 1e3)
    assert d > 2.75


def test_copies_replayed_on_a_gpu_with_its_own_host_link_take_that_link(tmp_path):
    # GH200's host link is NVLink-C2C (the catalog's host_link_gbs), not PCIe: a link-bound copy
    # measured on PCIe 3 scales by that link, as kit op prices it (the replay had read PCIe 5)
    from kit.hardware import get_gpu
    from kit.predict.roofline import PCIE_X16_GBS

    gh200 = get_gpu("gh200")
    assert gh200.host_link_gbs and gh200.host_link_gbs > PCIE_X16_GBS[gh200.pcie_gen]
    p = tmp_path / "r0.json"
    p.write_text(json.dumps(copies_rank([("Memcpy HtoD (Pinned -> Device)", 77_070_336, 6_000)])))
    r = replay(p, on="gh200")
    d = [r.tg.graph.dur_ms[op] for op, *_ in r.tg.gpu_ops[0]][0]
    assert d == pytest.approx(6.0 * PCIE_X16_GBS[get_gpu("rtx-2080-ti").pcie_gen] / gh200.host_link_gbs)


def test_a_synchronised_collective_ends_together_where_one_rank_lacks_its_size(tmp_path):
    # rank 1's all-reduce has no nccl:* annotation: it had kept its measured 0.060 ms while rank
    # 0's was rescaled to the DGX H100 (0.037 ms), so the one all-reduce ended at 0.107 ms on
    # rank 0 and 0.130 ms on rank 1
    d = tmp_path / "job"
    d.mkdir()
    docs = [nccl_rank(0, 2, 100), nccl_rank(1, 2, 60)]
    docs[1]["traceEvents"] = [e for e in docs[1]["traceEvents"] if not e["name"].startswith("nccl:")]
    for r, doc in enumerate(docs):
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    r = replay(d, on="dgx-h100")
    g = r.tg.graph
    comm = [op for op in range(len(g)) if g.kind[op] == "comm"]
    assert r.tg.collectives_synced and len(comm) == 2
    assert r.result.end_ms[comm[0]] == pytest.approx(r.result.end_ms[comm[1]])
    assert g.dur_ms[comm[0]] < 0.060  # rescaled, on both
    assert any("take the size the other ranks of their group give" in n for n in r.to_dict()["notes"])


def test_one_rank_of_a_job_names_on_as_the_other_messages_do(tmp_path):
    # one file, its NCCL all-reduce unmatched: the note had said "--on" alone
    doc = nccl_rank(0, 2, 100)
    del doc["distributedInfo"]
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc))
    notes = replay(p).to_dict()["notes"]
    assert any(n.startswith("one rank of a larger job") and n.endswith(
        "(they take their measured durations, or those --on/on= predicts)") for n in notes), notes
