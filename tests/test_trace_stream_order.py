"""kit replay: a GPU op whose launch the profiler missed keeps its place on its stream, and rank
ids or world sizes past any job are one KitError (not an OverflowError, nor minutes of listing
missing ranks)."""
import json

import pytest

from kit.errors import KitError
from kit.trace import replay
from tests.test_replay_audit import ev
from tests.test_replay_malformed import write_job as write




def tail_of_last_step():
    """The step starts at 0; the previous step's kernel (its launch before the capture) runs
    20-120 on stream 7; the step's first kernel, launched 10-15 on that stream, waits for it and
    runs 120-150; the host syncs 200-260 and the step ends at 300."""
    return {"deviceProperties": [{"name": "NVIDIA A100-SXM4-40GB"}], "traceEvents": [
        ev("ProfilerStep#1", 0, 300, "cpu_op"),
        ev("cudaLaunchKernel", 10, 5, "cuda_runtime", correlation=1),
        ev("previous_step_kernel", 20, 100, "kernel", tid=7, correlation=99, stream=7),
        ev("sgemm", 120, 30, "kernel", tid=7, correlation=1, stream=7),
        ev("cudaStreamSynchronize", 200, 60, "cuda_runtime", correlation=3)]}


def test_an_unlaunched_kernel_runs_before_the_kernels_queued_behind_it(tmp_path):
    r = replay(write(tmp_path, [tail_of_last_step()]))
    tl = r.timeline().set_index("name")
    # it had been queued after sgemm (launched before it started): 150-250, sgemm 120-150, the
    # step 0.350 ms against 0.300 measured
    assert tl.loc["previous_step_kernel", "start_ms"] == pytest.approx(0.020)
    assert tl.loc["sgemm", "start_ms"] == pytest.approx(0.120)
    assert r.ranks[0]["predicted_ms"] == pytest.approx(r.ranks[0]["measured_ms"])
    g = r.tg.graph
    stream = [i for i in range(len(g)) if g.resource[i] == "stream 7"]
    assert [g.label[i] for i in stream] == ["previous_step_kernel", "sgemm"]


def test_a_faster_gpu_still_runs_the_stream_in_launch_order(tmp_path):
    # under --on the kernels shorten; the one queued first must still end before the other starts
    r = replay(write(tmp_path, [tail_of_last_step()]), on="h100-sxm")
    tl = r.timeline().set_index("name")
    assert tl.loc["previous_step_kernel", "end_ms"] <= tl.loc["sgemm", "start_ms"] + 1e-12


def test_an_unlaunched_kernel_does_not_wait_on_another_streams_kernel(tmp_path):
    # a kernel of stream 8 ran 5-18, between the unlaunched kernel's anchor (sgemm's launch at
    # 10) and its start (20): it had become that kernel's event dependency, so on a T4 (stream
    # 8's kernel 4 times as long) the previous step's kernel started at 0.061 ms, not 0.020
    doc = tail_of_last_step()
    doc["traceEvents"][1:1] = [ev("cudaLaunchKernel", 2, 2, "cuda_runtime", correlation=5),
                               ev("other_stream_kernel", 5, 13, "kernel", tid=8, correlation=5, stream=8)]
    r = replay(write(tmp_path, [doc]), on="t4")
    tl = r.timeline().set_index("name")
    assert tl.loc["other_stream_kernel", "end_ms"] > 0.020  # slower, past the kernel's start
    assert tl.loc["previous_step_kernel", "start_ms"] == pytest.approx(0.020)
    g = r.tg.graph
    (k,) = [i for i in range(len(g)) if g.label[i] == "previous_step_kernel"]
    (o,) = [i for i in range(len(g)) if g.label[i] == "other_stream_kernel"]
    assert o not in g.deps[k] and "timing" not in r.tg.gpu_waits


def with_rank(rank=None, world=None):
    doc = tail_of_last_step()
    doc["distributedInfo"] = {k: v for k, v in (("rank", rank), ("world_size", world)) if v is not None}
    return doc


def test_a_world_size_past_any_job_is_an_error(tmp_path):
    # 2**21 ranks: two files had listed 2,097,150 missing ranks (a world_size of 1e9 ran out of memory)
    docs = [with_rank(0, 1 << 21), with_rank(1, 1 << 21)]
    with pytest.raises(KitError, match="world_size 2,097,152 is past any job"):
        replay(write(tmp_path, docs))


def test_a_world_size_of_a_large_job_is_read(tmp_path):
    d = replay(write(tmp_path, [with_rank(0, 65536), with_rank(1, 65536)])).to_dict()
    assert d["missing_ranks"][:2] == [2, 3] and len(d["missing_ranks"]) == 65534


@pytest.mark.parametrize("rank", [2 ** 64, 2 ** 21])
def test_a_rank_past_any_job_is_an_error_not_an_overflow(tmp_path, rank):
    # 2**64 had replayed, then raised "OverflowError: Python int too large to convert to C long"
    # building the timeline (kit replay --trace)
    with pytest.raises(KitError, match=f"rank {rank:,} .*is past any job"):
        replay(write(tmp_path, [with_rank(rank)])).timeline()


def test_a_number_past_any_job_in_a_file_name_is_no_rank(tmp_path):
    # PyTorch's default name {host}_{pid}.{ms}.pt.trace.json on host "gpu-worker", pid 3,000,000:
    # it had been refused as "rank 3,000,000 (from its file name) ... the trace is malformed"
    d = tmp_path / "job"
    d.mkdir()
    (d / "gpu-worker_3000000.1694128201554.pt.trace.json").write_text(json.dumps(tail_of_last_step()))
    r = replay(d)
    assert [x["rank"] for x in r.ranks] == [0]  # its position among the files
    assert r.ranks[0]["predicted_ms"] == pytest.approx(r.ranks[0]["measured_ms"])


def test_ranks_of_one_pid_each_take_the_execution_trace_their_file_names_say(tmp_path):
    # each rank in its own container runs as pid 42: rank 1 had taken rank 0's ET, and rank 1's
    # own was "not used: no Kineto rank with its pid 42"
    from tests.test_trace_et import et_doc, kineto_doc

    d = tmp_path / "job"
    d.mkdir()
    for r in (0, 1):
        k = kineto_doc()
        k["distributedInfo"] = {"rank": r, "world_size": 2}
        (d / f"rank{r}_kineto.json").write_text(json.dumps(k))
        (d / f"rank{r}_et.json").write_text(json.dumps(et_doc(pid=42)))
    out = replay(d).to_dict()
    assert sorted((x["rank"], x["et"].rsplit("/", 1)[-1]) for x in out["execution_traces"]) == [
        (0, "rank0_et.json"), (1, "rank1_et.json")]
    assert not any("not used" in n for n in out["notes"])


def test_an_async_memset_does_not_hold_the_host_for_the_gpu(tmp_path):
    # kernel A runs 20-120; a cudaMemsetAsync at 150 with no GPU event of its own (a 0-byte
    # memset) had been a host sync on A; the host's stream sync at 350 is the step's only wait
    from kit.sim import simulate
    from kit.trace.build import build_graph
    from kit.trace.kineto import load_kineto
    from kit.trace.replay import step_times_ms

    doc = {"traceEvents": [
        ev("ProfilerStep#1", 0, 400, "cpu_op"),
        ev("cudaLaunchKernel", 10, 5, "cuda_runtime", correlation=1),
        ev("sgemm", 20, 100, "kernel", tid=7, correlation=1, stream=7),
        ev("cudaMemsetAsync", 150, 1, "cuda_runtime", correlation=2),
        ev("cudaStreamSynchronize", 350, 5, "cuda_runtime", correlation=3)]}
    tg = build_graph(load_kineto(write(tmp_path, [doc])))
    g = tg.graph
    (a,) = [i for i in range(len(g)) if g.label[i] == "sgemm"]
    g.dur_ms[a] = 0.300  # a GPU 3x slower: A ends at 0.320, before the host syncs at 0.350
    assert step_times_ms(tg, simulate(g), 0) == [pytest.approx(0.400)]  # had been 0.570
    assert tg.syncs == {"timing": 1}  # the stream sync alone
