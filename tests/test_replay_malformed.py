"""kit replay on malformed Kineto files: steps that frame none of the events, launches without a
correlation, ids written as strings or infinities, deviceProperties that is no list, ranks past
the world size, steps of different numbers, and events of categories the replay does not read."""
import json

import pytest

from kit.errors import KitError
from kit.trace import replay
from tests.test_replay_audit import ev, nccl_rank


def write_job(tmp_path, docs):
    d = tmp_path / "job"
    d.mkdir()
    for k, doc in enumerate(docs):
        (d / f"rank{k}.json").write_text(json.dumps(doc))
    return d


def two_ranks():
    return [nccl_rank(0, 2, 100), nccl_rank(1, 2, 60)]


def events(doc, cat=None, name=None):
    return [e for e in doc["traceEvents"] if (cat is None or e["cat"] == cat)
            and (name is None or e["name"].startswith(name))]


def test_a_step_that_holds_none_of_the_events_is_an_error(tmp_path):
    # rank 0's step had moved 1000 s past its events: 0.00% error, its kernels and collectives dropped
    docs = two_ranks()
    events(docs[0], name="ProfilerStep")[0]["ts"] += 10 ** 9
    with pytest.raises(KitError, match="rank 0's ProfilerStep annotations hold none of its 4 events"):
        replay(write_job(tmp_path, docs))


def test_a_step_far_longer_than_every_event_is_an_error(tmp_path):
    docs = two_ranks()
    events(docs[1], name="ProfilerStep")[0]["dur"] = 1e12  # events span 160 us
    with pytest.raises(KitError, match="rank 1's ProfilerStep annotations span 1e\\+12 µs"):
        replay(write_job(tmp_path, docs))
    events(docs[1], name="ProfilerStep")[0]["dur"] = 5e6  # 5 s: replayed, with a note
    (tmp_path / "b").mkdir()
    notes = replay(write_job(tmp_path / "b", docs)).to_dict()["notes"]
    assert any("rank 1: its ProfilerStep(s) span 5000 ms" in n and "host idle" in n for n in notes)


@pytest.mark.parametrize("how", ["launch without one", "strings"])
def test_gpu_ops_are_kept_whatever_the_launches_correlations(tmp_path, how):
    # a runtime call without a correlation put None among the launched ones, so every GPU op
    # without one vanished (its collective too); ids written as strings had done the same
    docs = two_ranks()
    for doc in docs:
        if how == "strings":
            for e in doc["traceEvents"]:
                if "correlation" in e["args"]:
                    e["args"]["correlation"] = str(e["args"]["correlation"])
        else:
            events(doc, "kernel")[0]["args"].pop("correlation")
            events(doc, name="cudaStreamSynchronize")[0]["args"].pop("correlation")
    r = replay(write_job(tmp_path, docs))
    comm = {rank: [op for op, *_ in ops if r.tg.graph.kind[op] == "comm"] for rank, ops in r.tg.gpu_ops.items()}
    assert {k: len(v) for k, v in comm.items()} == {0: 1, 1: 1}
    orphans = [n for n in r.to_dict()["notes"] if "without a recorded launch" in n]
    assert len(orphans) == (2 if how != "strings" else 0)


def test_an_infinite_id_and_a_dict_of_device_properties_read_as_missing(tmp_path):
    docs = two_ranks()
    events(docs[0], "kernel")[0]["args"]["correlation"] = float("inf")  # json writes Infinity
    docs[1]["deviceProperties"] = {"name": "x"}  # was KeyError: 0
    r = replay(write_job(tmp_path, docs))
    d = r.to_dict()
    assert len(d["ranks"]) == 2 and any("rank 0: 1 GPU ops without a recorded launch" in n for n in d["notes"])


def test_a_rank_past_the_world_size_is_an_error(tmp_path):
    docs = two_ranks()
    docs[1]["distributedInfo"]["rank"] = 42
    with pytest.raises(KitError, match="rank 42 is not below the world size .* \\(2\\)"):
        replay(write_job(tmp_path, docs))


def test_ranks_on_different_steps_are_noted(tmp_path):
    docs = two_ranks()
    events(docs[1], name="ProfilerStep")[0]["name"] = "ProfilerStep#99"
    notes = replay(write_job(tmp_path, docs)).to_dict()["notes"]
    (note,) = [n for n in notes if "different ProfilerSteps" in n]
    assert "rank 0: #1" in note and "rank 1: #99" in note


def test_events_of_other_categories_are_counted_not_lost(tmp_path):
    # an MTIA trace had replayed as "CPU-only" without a word about its 29,000 device events
    docs = two_ranks()
    docs[0]["traceEvents"] += [ev("mtia_op", 40, 5, "mtia_ccp_events") for _ in range(3)]
    docs[0]["traceEvents"] += [ev("k", 40, 5, None), ev("py", 40, 5, "python_function")]
    notes = replay(write_job(tmp_path, docs)).to_dict()["notes"]
    (note,) = [n for n in notes if "categories the replay does not read" in n]
    assert "rank 0: skipped 4 complete events" in note and "mtia_ccp_events 3" in note \
        and "(no category) 1" in note and "python_function" not in note


def test_a_long_step_the_profiler_filled_with_python_events_is_replayed(tmp_path):
    # a step of 2 s whose first 1.9 s are Python alone (data preparation): its events span 50 ms,
    # its python_function event the whole step; it was refused as "ten times longer than its events"
    docs = two_ranks()
    for doc in docs:
        events(doc, name="ProfilerStep")[0]["dur"] = 2e6
        for e in doc["traceEvents"]:
            if e["name"] != "ProfilerStep#1":
                e["ts"] += 1.9e6
        doc["traceEvents"].append(ev("dataloader.py(12): next", 0, 1.9e6, "python_function"))
    r = replay(write_job(tmp_path, docs))
    assert [row["measured_ms"] for row in r.to_dict()["ranks"]] == [pytest.approx(2000.0)] * 2


def test_ids_that_are_no_whole_number_read_as_missing(tmp_path):
    docs = two_ranks()
    events(docs[0], "cuda_runtime")[0]["args"]["correlation"] = "--5"  # int() had raised ValueError
    events(docs[1], "cuda_runtime")[0]["args"]["correlation"] = "²"
    assert len(replay(write_job(tmp_path, docs)).to_dict()["ranks"]) == 2


def test_a_rank_read_from_the_file_name_is_not_held_to_the_world_size(tmp_path):
    # files without a rank, named worker-5 and worker-6, of a world size of 2: the names are hosts
    d = tmp_path / "job"
    d.mkdir()
    for k, doc in zip((5, 6), two_ranks()):
        del doc["distributedInfo"]["rank"]
        (d / f"job-worker-{k}.json").write_text(json.dumps(doc))
    assert len(replay(d).to_dict()["ranks"]) == 2


def test_a_category_or_pid_that_is_a_list_or_object_is_no_traceback(tmp_path):
    # "cat": [...] raised TypeError (unhashable) at the category check, a cpu_op's "pid": {...}
    # at the process-id count
    docs = two_ranks()
    events(docs[0], "kernel")[0]["cat"] = ["kernel"]
    events(docs[1], name="nccl:")[0]["pid"] = {"host": 1}
    r = replay(write_job(tmp_path, docs))
    notes = r.to_dict()["notes"]
    assert any("rank 0: skipped 1 complete events of categories" in n and "(no category) 1" in n
               for n in notes)
    assert len(r.ranks) == 2
