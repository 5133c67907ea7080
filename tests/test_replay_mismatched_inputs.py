"""kit replay on jobs whose files disagree or break: a rank whose every event is malformed, ranks
whose k-th collective is not the same collective (or a rank with kernels but none), a rank that
names no GPU under --on, and nccl:* annotations whose sizes cannot be read."""
import json

import pytest

from kit.errors import KitError
from kit.hardware import get_gpu
from kit.trace import replay
from kit.trace.transfer import KERNEL_FLOOR_MS
from tests.test_replay_audit import ev, nccl_rank


def write_job(tmp_path, docs, name="job"):
    d = tmp_path / name
    d.mkdir()
    for k, doc in enumerate(docs):
        (d / f"rank{k}.json").write_text(json.dumps(doc))
    return d


def comm_starts(r):
    g, res = r.tg.graph, r.result
    return {rank: [float(res.start_ms[op]) for op, *_ in ops if g.kind[op] == "comm"]
            for rank, ops in r.tg.gpu_ops.items()}


@pytest.mark.parametrize("field,value", [("dur", -5), ("ts", None), ("name", None)])
def test_a_rank_whose_every_event_is_malformed_is_an_error_not_a_skipped_file(tmp_path, field, value):
    # rank 1's events all had dur -5: the file read as "no Kineto trace" and was skipped with a
    # note, and the 2-rank job replayed as rank 0 alone
    docs = [nccl_rank(0, 2, 100), nccl_rank(1, 2, 60)]
    for e in docs[1]["traceEvents"]:
        e[field] = value
    with pytest.raises(KitError, match=r"rank1\.json: no complete \('X'\) event is usable: all 5 have"):
        replay(write_job(tmp_path, docs))


def test_a_broken_event_beside_other_categories_is_not_called_all_of_them(tmp_path):
    # one broken event among three of a category the replay does not read had raised "all 1
    # have a missing ... ts/dur": the file is not a trace the replay reads, as without it
    other = {"traceEvents": [ev("x", 0, 5, "mtia_kernel"), ev("y", 5, 5, "mtia_kernel"),
                             ev("z", 10, 5, "mtia_kernel"), ev("w", 0, -5, "cpu_op")]}
    r = replay(write_job(tmp_path, [nccl_rank(0, 1, 100), other]))
    assert [row["rank"] for row in r.ranks] == [0]
    assert any("skipped 1 JSON file(s) that are no Kineto trace" in n for n in r.to_dict()["notes"])


def test_a_folder_still_skips_a_json_without_profiler_events(tmp_path):
    docs = [nccl_rank(0, 1, 100), {"traceEvents": [ev("x", 0, 5, "compute")]}]  # e.g. kit's own output
    r = replay(write_job(tmp_path, docs))
    assert [row["rank"] for row in r.ranks] == [0]
    assert any("skipped 1 JSON file(s) that are no Kineto trace" in n for n in r.to_dict()["notes"])


def test_the_kth_collectives_of_different_kinds_are_not_synchronised(tmp_path):
    # an all-reduce on rank 0 met an all-gather on rank 1 at the same position: they were started
    # together and both cut to 60 us, the shorter one's time
    docs = [nccl_rank(0, 2, 100), nccl_rank(1, 2, 60)]
    docs[1]["traceEvents"][3]["name"] = "ncclKernel_AllGather_RING_LL_Sum_float"
    r = replay(write_job(tmp_path, docs))
    d = r.to_dict()
    assert d["collectives_synced"] is False
    assert any("not the same collective on every rank" in n and "AllGather" in n for n in d["notes"])
    for row in d["ranks"]:
        assert row["predicted_ms"] == pytest.approx(row["measured_ms"], abs=1e-9)
    # the same kind is still synchronised: both start together
    same = replay(write_job(tmp_path, [nccl_rank(0, 2, 100), nccl_rank(1, 2, 60)], "same"))
    starts = comm_starts(same)
    assert same.tg.collectives_synced and starts[0] == pytest.approx(starts[1])


def test_the_kind_mismatch_note_shows_the_rank_that_differs(tmp_path):
    # the note had listed ranks 0-3, all AllReduce, when rank 5 ran the AllGather
    docs = [nccl_rank(r, 6, 100) for r in range(6)]
    docs[5]["traceEvents"][3]["name"] = "ncclKernel_AllGather_RING_LL_Sum_float"
    notes = replay(write_job(tmp_path, docs)).to_dict()["notes"]
    (note,) = [n for n in notes if "not the same collective on every rank" in n]
    assert "rank 5: ncclKernel_AllGather" in note and "rank 0: ncclKernel_AllReduce" in note


def test_a_rank_with_kernels_but_no_collective_is_a_mismatch(tmp_path):
    # ranks 0 and 1 synchronised their all-reduce as if they were the whole group, rank 2 (with
    # GPU work, no collective) left out without a word
    docs = [nccl_rank(0, 3, 100), nccl_rank(1, 3, 60), nccl_rank(2, 3, 80)]
    k = docs[2]["traceEvents"][3]
    k["name"] = "volta_sgemm_128x64_nn"
    r = replay(write_job(tmp_path, docs))
    d = r.to_dict()
    assert d["collectives_synced"] is False
    assert any("collective counts per stream differ" in n for n in d["notes"])


@pytest.mark.parametrize("name,family", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", "allreduce"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "reducescatter"),
    ("ncclAllGatherRingLLKernel_copy_i8", "allgather"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "p2p"),
    ("ncclSendKernel_copy_i8", "p2p"), ("ncclRecvKernel_copy_i8", "p2p"),
    ("ncclKernel_Reduce_RING_LL_Sum_half", "reduce"),
    ("ncclDevKernel_Generic", None)])
def test_collective_family_reads_the_kernel_name(name, family):
    from kit.trace.build import collective_family

    assert collective_family(name) == family


def sgemm_rank(gpu="NVIDIA A100-SXM4-40GB"):
    """One step of 1.22 ms: a 1 ms sgemm the host waits for with cudaDeviceSynchronize."""
    doc = {"traceEvents": [
        ev("ProfilerStep#1", 0, 1220, "cpu_op"),
        ev("cudaLaunchKernel", 190, 5, "cuda_runtime", correlation=9),
        ev("volta_sgemm_128x64_nn", 200, 1000, "kernel", tid=7, correlation=9, stream=7),
        ev("cudaDeviceSynchronize", 196, 1014, "cuda_runtime", correlation=10)]}
    if gpu:
        doc["deviceProperties"] = [{"name": gpu}]
    return doc


def test_a_rank_without_a_gpu_name_is_an_error_under_on(tmp_path):
    # it had been skipped by the transfer: 1.22 ms "on h100-sxm", its measured time, no note
    p = tmp_path / "r.json"
    p.write_text(json.dumps(sgemm_rank(gpu=None)))
    assert replay(p).ranks[0]["predicted_ms"] == pytest.approx(1.22)  # no --on: fine
    with pytest.raises(KitError, match="rank 0 ran GPU work but its trace names no GPU"):
        replay(p, on="h100-sxm")


def test_a_rank_without_a_gpu_name_takes_the_one_its_job_names(tmp_path):
    docs = [sgemm_rank(), sgemm_rank(gpu=None)]
    for k, doc in enumerate(docs):
        doc["distributedInfo"] = {"rank": k, "world_size": 2}
    r = replay(write_job(tmp_path, docs), on="h100-sxm")
    a, h = get_gpu("a100-sxm4-40gb"), get_gpu("h100-sxm")
    f = KERNEL_FLOOR_MS  # the kernel's first 2 us stay: kit.trace.transfer.above_floor_ms
    want = 0.22 + f + (1.0 - f) * a.gemm_peak_tflops("fp32") / h.gemm_peak_tflops("fp32")
    assert [row["predicted_ms"] for row in r.ranks] == [pytest.approx(want)] * 2
    assert any("rank 1 name no GPU" in n and "NVIDIA A100-SXM4-40GB" in n for n in r.to_dict()["notes"])


@pytest.mark.parametrize("names", [["NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB", None],  # one GPU, two wordings
                                   ["NVIDIA A100-SXM4-40GB", "  "]])  # a blank name is none
def test_a_rank_without_a_gpu_name_takes_the_gpu_its_job_names_however_written(tmp_path, names):
    # the two wordings had read as two GPUs (an error); a blank name as a GPU "not in the catalog"
    docs = [sgemm_rank(gpu=n) for n in names]
    for k, doc in enumerate(docs):
        doc["distributedInfo"] = {"rank": k, "world_size": len(docs)}
    r = replay(write_job(tmp_path, docs), on="h100-sxm")
    a, h = get_gpu("a100-sxm4-40gb"), get_gpu("h100-sxm")
    f = KERNEL_FLOOR_MS  # the kernel's first 2 us stay: kit.trace.transfer.above_floor_ms
    want = 0.22 + f + (1.0 - f) * a.gemm_peak_tflops("fp32") / h.gemm_peak_tflops("fp32")
    assert [row["predicted_ms"] for row in r.ranks] == [pytest.approx(want)] * len(names)


@pytest.mark.parametrize("dims,types", [
    ({"a": 1}, ["float"]),  # KeyError: 0
    ([[float("inf")]], ["float"]),  # OverflowError
    ([[float("nan")]], ["float"]),  # ValueError
    ("garbage", ["float"]),  # had read as 1 element, 4 bytes
    ([[True]], ["float"]),  # the same
    ([[-5]], ["float"]),  # "message size must be a non-negative ..." without the trace's name
])
def test_an_unreadable_nccl_size_keeps_the_measured_collective(tmp_path, dims, types):
    docs = [nccl_rank(0, 2, 100), nccl_rank(1, 2, 60)]
    for doc in docs:
        doc["traceEvents"][1]["args"].update({"Input Dims": dims, "Input type": types})
    r = replay(write_job(tmp_path, docs), on="dgx-h100")
    g = r.tg.graph
    durs = [g.dur_ms[op] for ops in r.tg.gpu_ops.values() for op, *_ in ops if g.kind[op] == "comm"]
    assert durs == [pytest.approx(0.060)] * 2
    assert any("2 collective(s) keep their measured times: no nccl:* annotation with a readable size"
               in n for n in r.to_dict()["notes"])


@pytest.mark.parametrize("types", [[["float"]], {"x": 1}, "float"])
def test_an_unreadable_nccl_type_reads_as_float(tmp_path, types):
    # [["float"]] had raised TypeError (unhashable type: 'list'), {"x": 1} KeyError: 0
    def durs(types, name):
        docs = [nccl_rank(0, 2, 100), nccl_rank(1, 2, 60)]
        for doc in docs:
            doc["traceEvents"][1]["args"]["Input type"] = types
        r = replay(write_job(tmp_path, docs, name), on="dgx-h100")
        g = r.tg.graph
        return [g.dur_ms[op] for ops in r.tg.gpu_ops.values() for op, *_ in ops if g.kind[op] == "comm"]

    got, want = durs(types, "odd"), durs(["float"], "float")
    assert got == pytest.approx(want) and got != pytest.approx([0.060] * 2)  # rescaled, not kept


def tail_trace(gpu="NVIDIA A100-SXM4-40GB"):
    """Two 100 us steps with no sync: step 1's sgemm runs 20-150 us, 50 us past its step's end
    (the host had moved on); step 2's waits for it and ends within its step."""
    return {"deviceProperties": [{"name": gpu}], "traceEvents": [
        ev("ProfilerStep#1", 0, 100, "cpu_op"),
        ev("cudaLaunchKernel", 10, 5, "cuda_runtime", correlation=1),
        ev("volta_sgemm_128x64_nn", 20, 130, "kernel", tid=7, correlation=1, stream=7),
        ev("ProfilerStep#2", 100, 100, "cpu_op"),
        ev("cudaLaunchKernel", 110, 5, "cuda_runtime", correlation=2),
        ev("volta_sgemm_128x64_nn", 150, 40, "kernel", tid=7, correlation=2, stream=7)]}


def test_gpu_work_measured_past_its_step_does_not_read_as_an_error(tmp_path):
    # the replay on its own GPU reproduces every op, yet read 0.125 ms against 0.100 (+25%): the
    # 50 us step 1's kernel ran past its ProfilerStep had been counted on top of the step
    p = tmp_path / "r.json"
    p.write_text(json.dumps(tail_trace()))
    row = replay(p).ranks[0]
    assert row["predicted_ms"] == pytest.approx(row["measured_ms"]) == pytest.approx(0.100)
    # on a slower GPU the tail grows, and what it grows by counts; a faster one is no slower
    slow = replay(p, on="t4").ranks[0]["predicted_ms"]
    fast = replay(p, on="h100-sxm").ranks[0]["predicted_ms"]
    assert slow > 0.100 + 0.05 and fast <= row["predicted_ms"] + 1e-12


@pytest.mark.parametrize("src,kernel,dst,dtype", [
    ("NVIDIA A100-SXM4-40GB", "sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4", "v100-sxm2-32gb", "tf32"),
    ("NVIDIA A100-SXM4-40GB", "sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4", "h100-sxm", "tf32"),
    ("Tesla V100-SXM2-32GB", "volta_h884gemm_64x64_ldg8_nn", "p4", "fp16"),
    # BF16 had read as FP16: 312/125 = 2.5x slower on a V100 (no BF16 units: its FP32 path,
    # 19.9x), and 312/184.6 on an MI100 (BF16 92.3 TFLOP/s: 3.4x)
    ("NVIDIA A100-SXM4-40GB", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn", "v100-sxm2-32gb", "bf16"),
    ("NVIDIA A100-SXM4-40GB", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn", "mi100", "bf16"),
    ("NVIDIA A100-SXM4-40GB", "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_64x3_nn", "mi100", "fp16"),
])
def test_a_gemm_scales_from_its_dtype_peak_to_the_targets_path_for_it(tmp_path, src, kernel, dst, dtype):
    # the A100's TF32 GEMM was read as FP32 (19.5 -> 15.7 TFLOP/s: 1.24x on a V100, which has no
    # TF32 and runs it at 15.7 from 156); an FP16 one onto a GPU without FP16 took both FP32 peaks
    doc = sgemm_rank(gpu=src)
    doc["traceEvents"][2]["name"] = kernel
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    r = replay(p, on=dst)
    s, d = get_gpu(src), get_gpu(dst)
    want = s.gemm_peak_tflops(dtype) / (d.gemm_peak_tflops(dtype) or d.gemm_peak_tflops("fp32"))
    g = r.tg.graph
    (op,) = [op for op, *_ in r.tg.gpu_ops[0]]
    f = KERNEL_FLOOR_MS  # the kernel's first 2 us stay: kit.trace.transfer.above_floor_ms
    assert g.dur_ms[op] == pytest.approx(f + (1.0 - f) * want)


def test_a_rank_written_as_a_string_is_that_rank(tmp_path):
    # a.json holds rank "1", b.json rank "0": they had been taken from the file order, swapped
    docs = [nccl_rank(1, 2, 100), nccl_rank(0, 2, 60)]
    d = tmp_path / "job"
    d.mkdir()
    for name, doc in zip("ab", docs):
        doc["distributedInfo"] = {k: str(v) for k, v in doc["distributedInfo"].items()}
        doc["traceEvents"][0]["dur"] += 10 * (name == "a")  # rank 1's step is 10 us longer
        (d / f"{name}.json").write_text(json.dumps(doc))
    r = replay(d)
    assert {row["rank"]: row["measured_ms"] for row in r.ranks} == {0: pytest.approx(0.100),
                                                                     1: pytest.approx(0.150)}
    assert not any("taken from" in n for n in r.to_dict()["notes"])
    docs[0]["distributedInfo"]["world_size"] = "1"  # and a string world size is held to as well
    (d / "a.json").write_text(json.dumps(docs[0]))
    with pytest.raises(KitError, match="rank 1 is not below the world size"):
        replay(d)
