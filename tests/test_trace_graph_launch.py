"""Kineto events the replay must neither lose nor count twice: the kernels of a CUDA graph (one
cudaGraphLaunch correlation for all of them), exact duplicates of events (a trace written twice),
and GPU work launched outside the replayed steps (said in a note)."""
import json

import pytest

from kit.trace import replay
from tests.test_trace import ev, rank_trace

KERNEL_US, GAP_US = 40, 10


def graph_step(launched=True, n=3):
    """One step: a cudaGraphLaunch at 10-30 us whose n kernels (KERNEL_US each, GAP_US apart) all
    carry its correlation, then a stream sync and 15 us of host work."""
    t0 = 1000
    first = t0 + 30
    last_end = first + n * KERNEL_US + (n - 1) * GAP_US
    e = [ev("user_annotation", "ProfilerStep#1", t0, last_end + 5 + 15 - t0)]
    if launched:
        e.append(ev("cuda_runtime", "cudaGraphLaunch", t0 + 10, 20, correlation=5))
    for k in range(n):
        e.append(ev("kernel", f"graph_kernel_{k}", first + k * (KERNEL_US + GAP_US), KERNEL_US,
                    tid=7, stream=7, correlation=5))
    e.append(ev("cuda_runtime", "cudaStreamSynchronize", t0 + 30, last_end + 5 - (t0 + 30),
                correlation=6))
    return {"distributedInfo": {"rank": 0, "world_size": 1},
            "deviceProperties": [{"name": "NVIDIA A100-SXM4-40GB"}], "traceEvents": e}


def write(tmp_path, doc, name="rank0.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize("launched", [True, False])
def test_every_kernel_of_a_cuda_graph_launch_is_replayed(tmp_path, launched):
    # kernels were keyed by correlation, one each: the graph's first two kernels vanished (their
    # 80 us became "launch delay" before the third); unlaunched (orphan) ones replayed the last twice
    r = replay(write(tmp_path, graph_step(launched)))
    names = sorted(ge.name for _, ge, _, _ in r.tg.gpu_ops[0])
    assert names == [f"graph_kernel_{k}" for k in range(3)]
    row = r.ranks[0]
    assert row["predicted_ms"] == pytest.approx(row["measured_ms"], abs=1e-9)
    # the stream runs them one after the other and the sync waits for the last: all on the path
    assert r.to_dict()["critical_path"]["compute"] == pytest.approx(3 * KERNEL_US / 1e3)


def test_a_cuda_graph_on_a_faster_gpu_speeds_up_all_its_kernels(tmp_path):
    p = write(tmp_path, graph_step())
    base = replay(p).ranks[0]["predicted_ms"]
    fast = replay(p, on="h100-sxm").ranks[0]["predicted_ms"]
    one = replay(write(tmp_path, graph_step(n=1), "one.json"))
    one_fast = replay(tmp_path / "one.json", on="h100-sxm").ranks[0]["predicted_ms"]
    # three kernels save three times what one saves (their gaps are launch delay, kept)
    assert base - fast == pytest.approx(3 * (one.ranks[0]["predicted_ms"] - one_fast), rel=1e-6)


def test_a_trace_written_twice_replays_as_once(tmp_path):
    # every event of rank 0 twice: its step had replayed in 0.312 ms against 0.162 measured (each
    # kernel queued behind its copy) and its collectives were left unsynchronised
    a, b = rank_trace(0), rank_trace(1, t0=5000)
    a["traceEvents"] += json.loads(json.dumps(a["traceEvents"]))
    d = tmp_path / "job"
    d.mkdir()
    write(d, a, "rank0.json")
    write(d, b, "rank1.json")
    r = replay(d)
    assert r.tg.collectives_synced
    for row in r.ranks:
        assert row["steps"] == 1
        assert row["predicted_ms"] == pytest.approx(row["measured_ms"], abs=1e-9)
    notes = [n for n in r.to_dict()["notes"] if "duplicated" in n]
    assert len(notes) == 1 and "rank 0: dropped 6 duplicated events" in notes[0]


def test_a_duplicated_step_annotation_is_one_step(tmp_path):
    # the ProfilerStep twice had made two steps of the one, replayed at half its time (0.078 ms)
    doc = rank_trace(0)
    doc["traceEvents"].append(dict(doc["traceEvents"][0]))
    r = replay(write(tmp_path, doc))
    row = r.ranks[0]
    assert row["steps"] == 1 and row["predicted_ms"] == pytest.approx(row["measured_ms"], abs=1e-9)


def test_distinct_kernels_at_one_start_are_no_duplicates(tmp_path):
    doc = graph_step()
    k = next(e for e in doc["traceEvents"] if e["name"] == "graph_kernel_0")
    doc["traceEvents"].append(dict(k, args=dict(k["args"], stream=8)))  # same time, other stream
    r = replay(write(tmp_path, doc))
    assert len(r.tg.gpu_ops[0]) == 4
    assert not [n for n in r.to_dict()["notes"] if "duplicated" in n]


def test_gpu_work_launched_outside_the_steps_is_said(tmp_path):
    doc = rank_trace(0)  # its step: 1000-1162 us
    doc["traceEvents"] += [ev("cuda_runtime", "cudaLaunchKernel", 2000, 5, correlation=51),
                           ev("kernel", "after_the_step", 2010, 70, tid=7, stream=7, correlation=51)]
    r = replay(write(tmp_path, doc))
    assert r.ranks[0]["predicted_ms"] == pytest.approx(r.ranks[0]["measured_ms"], abs=1e-9)
    notes = [n for n in r.to_dict()["notes"] if "not replayed" in n]
    assert len(notes) == 1 and notes[0].startswith("rank 0: 1 GPU op(s) launched outside")


def test_launches_sharing_an_external_id_each_replay_their_own_kernel(tmp_path):
    # no "correlation" args: launches and kernels carry the op's External id, one for both of
    # its launches. Every launch had taken every kernel of the id: four kernels replayed, the
    # 0.2 ms step in 0.28 ms
    ext = {"External id": 5}
    e = [ev("user_annotation", "ProfilerStep#1", 1000, 200),
         ev("cuda_runtime", "cudaLaunchKernel", 1000, 10, **ext),
         ev("kernel", "k_a", 1005, 40, tid=7, stream=7, **ext),
         ev("cuda_runtime", "cudaLaunchKernel", 1010, 10, **ext),
         ev("kernel", "k_b", 1045, 40, tid=7, stream=7, **ext),
         ev("cuda_runtime", "cudaStreamSynchronize", 1020, 70, **{"External id": 6})]
    doc = {"distributedInfo": {"rank": 0, "world_size": 1},
           "deviceProperties": [{"name": "NVIDIA A100-SXM4-40GB"}], "traceEvents": e}
    r = replay(write(tmp_path, doc))
    assert [(ge.name, c.ts_us) for _, ge, _, c in r.tg.gpu_ops[0]] == [("k_a", 1000), ("k_b", 1010)]
    row = r.ranks[0]
    assert row["predicted_ms"] == pytest.approx(row["measured_ms"], abs=1e-9)
