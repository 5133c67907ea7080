"""kit replay of a trace with GPU events alone (no host events to hold them against): absurd
durations and timestamps, JSON booleans as times, and a deviceProperties name that is no text."""
import json

import pytest

from kit.errors import KitError
from kit.trace import replay
from kit.trace.kineto import read_json_text


def kernel(ts, dur, name="k"):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7,
            "args": {"stream": 7, "correlation": 1}}


def write(tmp_path, events, props=None):
    doc = {"traceEvents": events}
    if props is not None:
        doc["deviceProperties"] = props
    p = tmp_path / "gpu_only.json"
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize("events", [
    [kernel(0, 1e300)],  # had been measured as 1e297 ms
    [kernel(-1e300, 5), kernel(1e300, 5, "k2")],  # had spanned 2e297 ms
    [kernel(1e300, 5)],  # at that size a float has no µs left: it had been a step of 0 ms
])
def test_times_no_clock_reads_are_one_error(tmp_path, events):
    with pytest.raises(KitError, match="out-of-range"):
        replay(write(tmp_path, events))


@pytest.mark.parametrize("events", [
    [kernel(0, 1e15)],  # 31 years
    [kernel(-1e16, 5), kernel(1e16, 5, "k2")],
])
def test_gpu_events_alone_spanning_more_than_a_day_are_one_error(tmp_path, events):
    with pytest.raises(KitError, match="span .* more than a day"):
        replay(write(tmp_path, events))


def test_host_events_without_a_step_spanning_more_than_a_day_are_one_error(tmp_path):
    cpu = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1e16, "pid": 1, "tid": 1,
           "args": {}}  # had measured a step of 1e13 ms
    with pytest.raises(KitError, match="span .* no ProfilerStep .* more than a day"):
        replay(write(tmp_path, [kernel(0, 10), cpu]))


def test_measured_step_of_gpu_events_alone_stays_their_span(tmp_path):
    # the bound leaves real GPU-only captures alone: two kernels 10 us apart, 3 us each
    r = replay(write(tmp_path, [kernel(1.7e15, 3), kernel(1.7e15 + 10, 3, "k2")])).to_dict()
    assert r["ranks"][0]["measured_ms"] == pytest.approx(13e-3)


def test_a_json_boolean_is_no_time(tmp_path):
    # "dur": true had been read as 1 us; "ts": true as ts 1
    t = read_json_text(json.dumps({"traceEvents": [kernel(0, 10), kernel(5, True, "b"),
                                                   kernel(True, 4, "c")]}))
    assert [g.name for g in t.gpu] == ["k"]
    assert any("skipped 2 events" in n for n in t.notes)
    with pytest.raises(KitError, match="no complete .* is usable"):
        replay(write(tmp_path, [kernel(0, True)]))


@pytest.mark.parametrize("name", [5, 0, ["A100"], {"x": 1}, True])
def test_a_device_name_that_is_no_text_names_no_gpu(tmp_path, name):
    t = read_json_text(json.dumps({"traceEvents": [kernel(0, 10)], "deviceProperties": [{"name": name}]}))
    assert t.gpu_name is None
    assert any("deviceProperties[0].name is" in n and "not a GPU name" in n for n in t.notes)
    r = replay(write(tmp_path, [kernel(0, 10)], [{"name": name}])).to_dict()
    assert r["gpu"] is None  # it had been shown as the GPU 5
    with pytest.raises(KitError, match="names no GPU"):  # --on needs the GPU it ran on
        replay(write(tmp_path, [kernel(0, 10)], [{"name": name}]), on="h100-sxm")
