"""Reading real traces robustly: HTA's fixtures (CPU-only ranks, missing rank / distributedInfo,
mixed folders) and real traces altered the way real collections go wrong (clock offsets between
ranks, several steps, missing fields, truncation). Each is read correctly or is one KitError."""
import copy
import gzip
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from kit.errors import KitError
from kit.trace import load_kineto, replay
from kit.trace.kineto import parse_events

SHARED = Path(os.environ.get("KIT_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
HTA = SHARED / "data/traces/HolisticTraceAnalysis/tests/data"
DLRM = SHARED / "data/traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz"
need_hta = pytest.mark.skipif(not HTA.exists(), reason="HTA fixtures not present")
need_dlrm = pytest.mark.skipif(not DLRM.exists(), reason="DLRM trace not present")


def raw(folder):
    (f,) = sorted((HTA / folder).glob("*.json.gz"))
    return f, json.loads(gzip.decompress(f.read_bytes()))


def step_ms(doc):
    """The ProfilerStep durations, read straight from the file (ms)."""
    return [e["dur"] / 1e3 for e in doc["traceEvents"]
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]


@need_hta
@pytest.mark.parametrize("folder,rank", [("cpu_only", 34), ("rank_non_gpu", 0), ("mixed_files", 0)])
def test_cpu_only_ranks_replay_on_their_host_thread(folder, rank):
    _, doc = raw(folder)
    r = replay(HTA / folder)
    row = r.ranks[0]
    assert row["rank"] == rank
    assert row["measured_ms"] == pytest.approx(sum(step_ms(doc)) / len(step_ms(doc)))
    assert row["predicted_ms"] == pytest.approx(row["measured_ms"], rel=1e-9)
    assert any("CPU-only" in n for n in r.to_dict()["notes"])
    assert r.result.breakdown(rank)["cpu"] == pytest.approx(row["measured_ms"], rel=1e-9)


@need_hta
@pytest.mark.parametrize("folder,why", [("rank_unavailable", "distributedInfo has no rank"),
                                        ("distributed_info_unavailable", "no distributedInfo")])
def test_rank_missing_is_taken_from_position_with_a_note(folder, why):
    _, doc = raw(folder)
    r = replay(HTA / folder)
    assert r.ranks[0]["rank"] == 0
    assert r.ranks[0]["measured_ms"] == pytest.approx(step_ms(doc)[0])
    assert any(why in n and "position" in n for n in r.to_dict()["notes"])


@need_hta
def test_a_folder_mixing_known_and_unknown_ranks_numbers_them_apart(tmp_path):
    for folder in ("rank_non_gpu", "rank_unavailable", "distributed_info_unavailable"):
        shutil.copy(raw(folder)[0], tmp_path)
    traces = load_kineto(tmp_path)
    assert [t.rank for t in traces] == [0, 1, 2]  # rank 0 is claimed by distributedInfo
    assert traces[0].rank_from == "distributedInfo"
    assert {t.rank_from for t in traces[1:]} == {"its position among the files"}


@need_hta
def test_a_folder_without_any_trace_is_one_error():
    with pytest.raises(KitError, match="no Kineto JSON"):
        load_kineto(HTA / "memory_analysis")


@need_hta
def test_missing_fields_in_a_real_trace(tmp_path):
    f, doc = raw("critical_path/cuda_event_sync")
    measured = step_ms(doc)[0]
    doc = copy.deepcopy(doc)
    del doc["deviceProperties"], doc["distributedInfo"]
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    for e in xs:
        if e.get("cat") == "cpu_op":
            e.pop("args", None)  # cpu ops without args
    broken = [e for e in xs if e.get("cat") == "cuda_runtime" and e["name"] == "cudaEventQuery"]
    for e in broken:
        del e["dur"]  # non-launch calls without a duration: skipped, with a note
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    r = replay(p)
    notes = r.to_dict()["notes"]
    assert any(f"skipped {len(broken)} events" in n for n in notes)
    assert any("no distributedInfo" in n for n in notes)
    assert r.ranks[0]["gpu"] is None
    assert r.ranks[0]["predicted_ms"] == pytest.approx(measured, rel=0.01)


@need_hta
def test_truncated_real_trace_is_one_error(tmp_path):
    f, _ = raw("critical_path/cuda_event_sync")
    text = gzip.decompress(f.read_bytes())
    p = tmp_path / "cut.json"
    p.write_bytes(text[: len(text) // 2])
    with pytest.raises(KitError, match="not valid JSON"):
        load_kineto(p)
    g = tmp_path / "cut.json.gz"
    g.write_bytes(f.read_bytes()[:200])
    with pytest.raises(KitError, match="corrupt gzip"):
        load_kineto(g)


def _dlrm_docs():
    with tarfile.open(DLRM) as tf:
        return [(m.name, json.load(tf.extractfile(m))) for m in sorted(tf.getmembers(),
                                                                      key=lambda m: m.name)
                if m.isfile() and m.name.endswith(".json")]


def _shift(doc, us):
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += us
    return doc


@need_dlrm
def test_clock_offsets_between_ranks_are_found_and_removed():
    docs = _dlrm_docs()
    base = replay([parse_events(d, n, i) for i, (n, d) in enumerate(docs)]).to_dict()
    shifts = {1: 5_000_000, 4: -2_500_000}  # rank 1's clock 5 s ahead, rank 4's 2.5 s behind
    traces = []
    for i, (n, d) in enumerate(docs):
        t = parse_events(_shift(copy.deepcopy(d), shifts.get(d["distributedInfo"]["rank"], 0)), n, i)
        traces.append(t)
    d = replay(traces).to_dict()
    for r, s in shifts.items():
        assert d["clock_offsets_us"][r] - base["clock_offsets_us"][r] == pytest.approx(s, abs=1)
    for a, b in zip(base["ranks"], d["ranks"]):
        assert b["predicted_ms"] == pytest.approx(a["predicted_ms"], abs=1e-6)
        assert abs(b["error_pct"]) < 3.0


@need_dlrm
def test_several_steps_of_a_real_rank():
    name, doc = _dlrm_docs()[0]
    step = step_ms(doc)[0]
    second = _shift(copy.deepcopy(doc), 30_000)  # the same step again 30 ms later
    for e in second["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["name"] = "ProfilerStep#11"
        a = e.get("args")
        if isinstance(a, dict):
            for k in ("correlation", "External id"):
                if isinstance(a.get(k), int):
                    a[k] += 1_000_000
    doc = copy.deepcopy(doc)
    doc["traceEvents"] += second["traceEvents"]
    t = parse_events(doc, name, 0)
    assert [s[0] for s in t.steps] == [10, 11]
    r = replay([t])  # one rank of an 8-rank job: its collectives keep their measured times
    row = r.ranks[0]
    assert row["steps"] == 2 and row["measured_ms"] == pytest.approx(step)
    assert abs(row["error_pct"]) < 3.0


def test_gpu_work_without_a_recorded_launch_still_occupies_its_stream(tmp_path):
    def ev(cat, name, ts, dur, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                "args": args}

    # an orphan kernel (no cudaLaunchKernel with its correlation) runs 1050-1080 on stream 7;
    # k2, launched 1055-1065 on the same stream, can only start at 1080
    e = [ev("user_annotation", "ProfilerStep#1", 1000, 100),
         ev("kernel", "orphan", 1050, 30, stream=7, correlation=99),
         ev("cuda_runtime", "cudaLaunchKernel", 1055, 10, correlation=2),
         ev("kernel", "k2", 1080, 10, stream=7, correlation=2)]
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"traceEvents": e}))
    r = replay(p)
    tl = r.timeline().set_index("name")
    assert tl.loc["orphan", "start_ms"] == pytest.approx(0.050)
    assert tl.loc["k2", "start_ms"] == pytest.approx(0.080)
    assert any("1 GPU ops without a recorded launch" in n for n in r.to_dict()["notes"])
    assert r.ranks[0]["predicted_ms"] == pytest.approx(0.100)


@need_hta
def test_a_range_profiled_trace_says_its_host_times_are_the_profilers():
    """HTA's cupti_profiler trace was recorded under CUPTI's range profiler: no kernel events,
    and each cudaLaunchKernel replays its kernel to read counters (median 52.9 ms). It replays
    as recorded (its host thread), and says why those host times are no step's."""
    _, doc = raw("cupti_profiler")
    ranges = sum(1 for e in doc["traceEvents"] if e.get("cat") == "cuda_profiler_range")
    assert ranges > 0
    notes = replay(HTA / "cupti_profiler").to_dict()["notes"]
    assert [n for n in notes if "range profiler" in n and f"{ranges:,} cuda_profiler_range" in n]
    # a trace without such events says nothing of it
    assert not [n for n in replay(HTA / "cpu_only").to_dict()["notes"] if "range profiler" in n]
