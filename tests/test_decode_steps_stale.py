"""Measured decode steps of a program the kit no longer predicts are stale
(benchmarks/decode_steps.py's stale_reason), and benchmarks/h200_measured.py scores none of them.
The H200 session of 2026-12-04 timed gpt2's and opt-1.3b's zoo steps with HF 4's eager attention
(its rows' own kernels: a softmax_warp_forward a layer); the zoo's steps now run HF 5.25's SDPA
(no softmax op), so those rows measured another program."""
import json
import shutil
from pathlib import Path

from benchmark_modules import load_benchmark

from kit.workload import zoo

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "measurements" / "h200-2026-12-04"
SESSION = "2026-12-04T15:02:58Z"  # FOLDER's provenance.json


def _rows(name="decode_steps.jsonl"):
    lines = (FOLDER / "session" / name).read_text().splitlines()
    return [r for r in map(json.loads, lines) if "measured_ms" in r]


def _softmax_kernels(row) -> int:
    return sum(k["count"] for k in row["top_kernels"] if "softmax_warp_forward" in k["name"])


def test_rows_that_timed_the_eager_step_are_stale():
    bench = load_benchmark("decode_steps")
    h200 = load_benchmark("h200_measured")
    assert h200.session_date(FOLDER) == SESSION
    for model, layers in (("gpt2", 12), ("opt-1.3b", 24)):
        rows = [r for r in _rows() if r["model"] == model]
        assert rows
        now = zoo.graph_for(model, 8, 512, "decode", "bf16", kv_cache="static", disk=False)
        assert not any("softmax" in n.aten for n in now.nodes)  # the step predicted now: SDPA
        for r in rows:
            assert _softmax_kernels(r) == layers  # the step measured: eager softmax, a layer each
            reason = bench.stale_reason(r, SESSION)
            assert reason and "83bfdaa" in reason and SESSION in reason
    # llama3-8b's static step was masked after the session (80b931a), its dynamic one was not
    assert all("80b931a" in bench.stale_reason(r, SESSION) for r in _rows() if r["model"] == "llama3-8b")
    assert not any(bench.stale_reason(r, SESSION) for r in _rows("decode_steps_dynamic.jsonl"))
    # measured after the change (its own measured_at, over the session's date): current
    fresh = dict(_rows()[0], measured_at="2026-12-08T10:00:00Z")
    assert bench.stale_reason(fresh, SESSION) is None
    assert bench.stale_reason(dict(_rows()[0]), None)  # no date at all: before every change


def test_the_h200_benchmark_scores_no_stale_row(tmp_path):
    h200 = load_benchmark("h200_measured")
    small = tmp_path / "h200"
    (small / "session" / "provenance").mkdir(parents=True)
    shutil.copy(FOLDER / "session" / "provenance" / "provenance.json", small / "session" / "provenance")
    gpt2 = [r for r in _rows() if r["model"] == "gpt2"][:2]
    llama = [r for r in _rows("decode_steps_dynamic.jsonl")][:1]
    fresh = dict(gpt2[1], measured_at="2026-12-08T10:00:00Z", measured_ms=7.0)
    lines = [json.dumps(r) for r in (*gpt2, *llama, fresh)]
    (small / "session" / "decode_steps.jsonl").write_text("\n".join(lines) + "\n")
    dec = h200.decode(small)
    assert [(s["model"], s["batch"]) for s in dec["stale"]] == [("gpt2", r["batch"]) for r in gpt2]
    assert all("measure it again" in s["reason"] for s in dec["stale"])
    assert [(r["model"], r["measured_ms"]) for r in dec["rows"]] == [("llama3-8b", llama[0]["measured_ms"]),
                                                                      ("gpt2", 7.0)]
    gpt2_summary = [s for s in dec["summary"] if s["model"] == "gpt2"]
    assert [s["n"] for s in gpt2_summary] == [1]  # the fresh row alone


def test_a_rerun_measures_a_stale_row_again(tmp_path):
    bench = load_benchmark("decode_steps")
    path = tmp_path / "rows.jsonl"
    old = [r for r in _rows() if r["model"] == "gpt2"][0]  # no measured_at: from before the change
    fresh = dict(old, batch=99, measured_at="2026-12-08T10:00:00Z")
    path.write_text(json.dumps(old) + "\n" + json.dumps(fresh) + "\n")
    rows = bench.Rows(str(path))
    assert rows.done == {bench.Rows.key(fresh)} and rows.rows == [fresh]
