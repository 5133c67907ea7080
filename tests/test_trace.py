"""kit.trace: Kineto import, replay, clock offsets, transfer, Perfetto export, bad input."""
import gzip
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from kit.errors import KitError
from kit.trace import load_kineto, replay
from kit.trace.perfetto import to_perfetto, write_perfetto
from kit.trace.transfer import KERNEL_FLOOR_MS

SHARED = Path(os.environ.get("KIT_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
DLRM = SHARED / "data/traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz"
HTA = SHARED / "data/traces/HolisticTraceAnalysis/tests/data"


def ev(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1 if cat not in ("kernel", "gpu_memcpy")
            else 0, "tid": tid, "ts": ts, "dur": dur, "args": args}


def rank_trace(rank, t0=1000, comm_dur=50, work=100, gpu="Tesla V100-SXM2-32GB"):
    """One step: launch a kernel (work µs), an NCCL all-reduce, then sync and end.

    CPU: launch 0-10, launch nccl 10-20, cudaStreamSynchronize 20-..., 5 µs CPU, step end."""
    e = [ev("user_annotation", "ProfilerStep#3", t0, 0)]
    e.append(ev("cuda_runtime", "cudaLaunchKernel", t0 + 0, 10, correlation=1))
    e.append(ev("kernel", "volta_sgemm_128x64_nn", t0 + 5, work, tid=7, stream=7, correlation=1))
    e.append(ev("cuda_runtime", "cudaLaunchKernel", t0 + 10, 10, correlation=2))
    k_end = t0 + 5 + work
    e.append(ev("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float", k_end, comm_dur, tid=20,
                stream=20, correlation=2))
    c_end = k_end + comm_dur
    e.append(ev("cuda_runtime", "cudaStreamSynchronize", t0 + 20, c_end + 2 - (t0 + 20),
                correlation=3))
    end = c_end + 2 + 5
    e[0]["dur"] = end - t0
    return {"distributedInfo": {"rank": rank, "world_size": 2},
            "deviceProperties": [{"name": gpu}], "traceEvents": e}


def write(tmp_path, name, doc, gz=False):
    p = tmp_path / name
    if gz:
        p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    else:
        p.write_text(json.dumps(doc))
    return p


def test_single_rank_replay_reproduces_its_step(tmp_path):
    p = write(tmp_path, "r0.json", rank_trace(0))
    r = replay(p)
    row = r.ranks[0]
    assert row["measured_ms"] == pytest.approx((5 + 100 + 50 + 2 + 5) / 1e3)
    assert row["predicted_ms"] == pytest.approx(row["measured_ms"], abs=1e-9)
    b = r.to_dict()["critical_path"]
    # path: launch part (5 µs) -> sgemm 100 -> all-reduce 50 -> sync 2 -> cpu 5
    assert b["compute"] == pytest.approx(0.100) and b["communication"] == pytest.approx(0.050)
    assert b["cpu"] == pytest.approx(0.012)


def test_two_ranks_sync_at_the_collective_and_clock_offset_is_estimated(tmp_path):
    # rank 1 has 40 µs more work, so rank 0's measured all-reduce lasts 40 µs longer (it waited);
    # rank 1's clock is 1 s ahead.
    a = rank_trace(0, t0=1000, comm_dur=90, work=100)
    b = rank_trace(1, t0=1000 + 1_000_000, comm_dur=50, work=140)
    d = tmp_path / "job"
    d.mkdir()
    write(d, "rank0.json", a, gz=True)
    write(d, "rank1.json.gz", b, gz=True)
    r = replay(d)
    assert r.tg.collectives_synced
    assert r.tg.offsets_us[1] == pytest.approx(1_000_000, abs=1)
    for row in r.ranks:
        assert row["predicted_ms"] == pytest.approx(row["measured_ms"], abs=1e-6)
    tl = r.timeline()
    ar = tl[tl.kind == "comm"]
    assert ar.start_ms.nunique() == 1 and list(ar.end_ms - ar.start_ms) == pytest.approx([0.05, 0.05])
    assert r.result.breakdown(0)["wait"] == pytest.approx(0.040)


def test_one_rank_of_a_larger_job_keeps_measured_collectives(tmp_path):
    doc = rank_trace(3, comm_dur=90)
    doc["distributedInfo"]["world_size"] = 4  # rank 3 of four; only its file is given
    r = replay(write(tmp_path, "w.json", doc))
    tl = r.timeline()
    assert (tl[tl.kind == "comm"].end_ms - tl[tl.kind == "comm"].start_ms).iloc[0] == pytest.approx(0.09)
    assert any("larger job" in n for n in r.to_dict()["notes"])


def test_tarball_and_several_steps(tmp_path):
    doc = rank_trace(0)
    second = rank_trace(0, t0=5000)["traceEvents"]
    for e in second:
        if e["name"].startswith("ProfilerStep"):
            e["name"] = "ProfilerStep#4"
        if "correlation" in e["args"]:
            e["args"]["correlation"] += 10
    doc["traceEvents"] += second
    raw = json.dumps(doc).encode()
    tar = tmp_path / "t.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        info = tarfile.TarInfo("job/rank0.json")
        info.size = len(raw)
        tf.addfile(info, io.BytesIO(raw))
    r = replay(tar)
    assert r.ranks[0]["steps"] == 2
    assert r.ranks[0]["predicted_ms"] == pytest.approx(0.162)


def test_transfer_scales_gemm_by_peak_and_keeps_cpu(tmp_path):
    from kit.hardware import get_gpu

    p = write(tmp_path, "r0.json", rank_trace(0, comm_dur=50, work=1000))
    base = replay(p)
    on = replay(p, on="h100-sxm")
    v, h = get_gpu("v100-sxm2-32gb"), get_gpu("h100-sxm")
    tl = on.timeline()
    k = tl[tl.name.str.contains("sgemm")].iloc[0]
    f = KERNEL_FLOOR_MS  # the kernel's first 2 us stay: kit.trace.transfer.above_floor_ms
    assert k.end_ms - k.start_ms == pytest.approx(f + (1.0 - f) * v.fp32_tflops / h.fp32_tflops)
    # a GPU target keeps the collective at its measured time; the step shrinks by the GEMM saving
    saved = (1.0 - f) * (1.0 - v.fp32_tflops / h.fp32_tflops)
    assert on.ranks[0]["predicted_ms"] == pytest.approx(base.ranks[0]["predicted_ms"] - saved)


def test_transfer_scales_an_fbgemm_embedding_kernel_by_memory_bandwidth(tmp_path):
    # "fbgemm" holds "gemm": the embedding lookups were rescaled by the FP32 peak ratio
    from kit.hardware import get_gpu

    name = "void fbgemm_gpu::split_embedding_codegen_forward_unweighted_kernel<float, float>"
    doc = rank_trace(0, comm_dur=50, work=1000)
    for e in doc["traceEvents"]:
        if e["name"] == "volta_sgemm_128x64_nn":
            e["name"] = name
    p = write(tmp_path, "r0.json", doc)
    tl = replay(p, on="h100-sxm").timeline()
    k = tl[tl.name.str.contains("split_embedding")].iloc[0]
    v, h = get_gpu("v100-sxm2-32gb"), get_gpu("h100-sxm")
    f = KERNEL_FLOOR_MS
    assert k.end_ms - k.start_ms == pytest.approx(f + (1.0 - f) * v.mem_bw_gbs / h.mem_bw_gbs)


def test_perfetto_export_has_one_process_per_rank(tmp_path):
    r = replay(write(tmp_path, "r0.json", rank_trace(0)))
    crit = r.critical_path().op
    doc = to_perfetto(r.timeline(), crit)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(r.timeline())
    assert any(e["args"]["critical"] for e in xs)
    k = next(e for e in xs if "sgemm" in e["name"])
    assert k["dur"] == pytest.approx(100.0)  # µs
    out = write_perfetto(r.timeline(), tmp_path / "o.json")
    assert json.loads(Path(out).read_text())["traceEvents"]


@pytest.mark.parametrize("content,match", [
    (b"not json at all", "not valid JSON"),
    (b'{"foo": 1}', "not a Kineto trace"),
    (b'{"traceEvents": [{"ph": "X"}]}', "no complete"),
    (b"\x1f\x8b garbage", "corrupt gzip"),
])
def test_unreadable_traces_are_kit_errors(tmp_path, content, match):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(KitError, match=match):
        load_kineto(p)


@pytest.mark.parametrize("name,content,match", [
    ("rank0.json.gz", b'{"traceEvents": []}', "named .gz but not gzip data"),
    ("ranks.tar.gz", b"not a tarball", "not a tar archive"),
    ("ranks.tgz", gzip.compress(b'{"traceEvents": []}'), "not a tar archive"),   # gzip, but no tar inside
])
def test_misnamed_archives_say_what_they_are_not(tmp_path, name, content, match):
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(KitError, match=match):
        load_kineto(p)


def test_missing_path_and_empty_folder(tmp_path):
    with pytest.raises(KitError, match="no such file"):
        load_kineto(tmp_path / "nope.json")
    with pytest.raises(KitError, match="no Kineto JSON"):
        load_kineto(tmp_path)


def test_events_with_missing_fields_are_skipped(tmp_path):
    doc = rank_trace(0)
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "broken"})
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "ts": "x", "dur": 1, "name": "a"})
    r = replay(write(tmp_path, "r.json", doc))
    assert r.ranks[0]["predicted_ms"] == pytest.approx(r.ranks[0]["measured_ms"])
    assert any("skipped 2" in n for n in r.to_dict()["notes"])


@pytest.mark.skipif(not HTA.exists(), reason="HTA fixtures not present")
def test_hta_cpu_only_and_event_sync_fixtures():
    cpu = replay(HTA / "cpu_only")
    assert cpu.ranks[0]["predicted_ms"] == pytest.approx(cpu.ranks[0]["measured_ms"], rel=1e-6)
    sync = replay(HTA / "critical_path/cuda_event_sync")
    assert sync.ranks[0]["predicted_ms"] == pytest.approx(sync.ranks[0]["measured_ms"], rel=0.03)


@pytest.mark.skipif(not DLRM.exists(), reason="DLRM trace not present")
def test_dlrm_eight_ranks_replay_within_3_percent():
    r = replay(DLRM)
    d = r.to_dict()
    assert len(d["ranks"]) == 8 and d["collectives_synced"]
    for row in d["ranks"]:
        assert abs(row["error_pct"]) < 3.0, row
    assert all(abs(o) < 50 for o in d["clock_offsets_us"].values())  # one host, one clock
    # the ranks started the step up to 7.5 ms apart; the early ones wait at the first collective
    assert d["critical_path"]["wait"] > 1.0


def test_cli_replay_json_and_errors(tmp_path, capsys):
    from kit.cli import main

    p = write(tmp_path, "r0.json", rank_trace(0))
    assert main(["replay", str(p), "--json", "--trace", str(tmp_path / "p.json")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ranks"][0]["rank"] == 0
    assert out["ranks"][0]["predicted_ms"] == pytest.approx(out["ranks"][0]["measured_ms"])
    assert set(out["critical_path"]) >= {"compute", "communication", "cpu", "wait", "total_ms"}
    assert (tmp_path / "p.json").exists()
    assert main(["replay", str(p), "--on", "no-such-gpu"]) == 2
    assert "not a GPU" in capsys.readouterr().err


def test_api_replay_verb(tmp_path):
    from kit.api import replay_trace

    d = replay_trace(write(tmp_path, "r0.json", rank_trace(0)))
    assert d["ranks"][0]["predicted_ms"] == pytest.approx(d["ranks"][0]["measured_ms"])


def test_transfer_to_a_system_rescales_collectives_by_the_comm_model(tmp_path):
    from kit.comm import predict_collective

    docs = []
    for r in range(2):
        doc = rank_trace(r, comm_dur=200)
        # the all-reduce's launch (t0+10 .. t0+20) runs inside its nccl:all_reduce annotation
        doc["traceEvents"].append(ev("user_annotation", "nccl:all_reduce", 1000 + 9, 12,
                                     **{"Input Dims": [[1 << 20]], "Input type": ["float"]}))
        docs.append(write(tmp_path, f"rank{r}.json", doc))
    on = replay([t for p in docs for t in load_kineto(p)], on="dgx-h100")
    tl = on.timeline()
    ar = tl[tl.kind == "comm"].iloc[0]
    nbytes = 4 << 20
    a = predict_collective("allreduce", nbytes, "dgx1-v100", ranks=[0, 1]).time_ms
    b = predict_collective("allreduce", nbytes, "dgx-h100", ranks=[0, 1]).time_ms
    assert ar.end_ms - ar.start_ms == pytest.approx(0.200 * b / a)
    assert on.to_dict()["on"] == "dgx-h100"
