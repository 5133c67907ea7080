"""kit.parallel keeps its kernel times on disk between processes (kit.parallel.op_cache), and a
prediction's p10/p90 band reuses the times of its point prediction instead of predicting every
kernel again under the predictor object's own cache key."""
import inspect
import os
from pathlib import Path
from dataclasses import dataclass

import pytest

import kit.parallel.costs as costs
from kit import ops
from kit.hardware.system import get_system
from kit.parallel import Layout, op_cache, predict_parallel
from kit.parallel.costs import Coster
from kit.predict.tile_mlp import TilePredictor

MODEL = "gpt:layers=2,hidden=512,heads=8,seq=256,vocab=1000"
LAYOUT = dict(dp=2, tp=2, pp=2, micro_batch=1, global_batch=4, dtype="bf16")


@pytest.fixture
def empty_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path))
    monkeypatch.setattr(costs, "_OP_CACHE", {})
    monkeypatch.setattr(costs, "_OP_DISK", {}, raising=False)
    return tmp_path


def _run():
    r = predict_parallel(MODEL, "dgx-a100", Layout(**LAYOUT), predictor="tile")
    return r["iteration_ms"], r["band_ms"], r["per_stage_ms"]


def _calls(monkeypatch) -> list:
    seen = []
    real = TilePredictor.predict

    def counting(self, ops, gpu, *a, **k):
        ops = list(ops)
        seen.append(len(ops))
        return real(self, ops, gpu, *a, **k)

    monkeypatch.setattr(TilePredictor, "predict", counting)
    return seen


def test_the_band_predicts_no_kernel_again(empty_caches, monkeypatch):
    seen = _calls(monkeypatch)
    _run()
    assert seen
    # one cache for the point prediction and both ends of the band: keyed by the name only
    assert [k[0] for k in costs._OP_CACHE] == ["tile"]


def test_a_second_process_takes_the_kernel_times_from_disk(empty_caches, monkeypatch):
    want = _run()
    files = list((empty_caches / "parallel_ops").glob("*.jsonl"))
    assert len(files) == 1 and files[0].stat().st_size > 0
    # a new process: empty memory, the same disk; the predictor is never asked
    monkeypatch.setattr(costs, "_OP_CACHE", {})
    monkeypatch.setattr(costs, "_OP_DISK", {}, raising=False)
    seen = _calls(monkeypatch)
    assert _run() == want
    assert seen == []


def test_a_line_cut_short_is_predicted_again(empty_caches, monkeypatch):
    want = _run()
    (f,) = (empty_caches / "parallel_ops").glob("*.jsonl")
    lines = f.read_text().splitlines(keepends=True)
    f.write_text(lines[0][: len(lines[0]) // 2] + "".join(lines[1:]))  # the first write cut short
    monkeypatch.setattr(costs, "_OP_CACHE", {})
    monkeypatch.setattr(costs, "_OP_DISK", {}, raising=False)
    seen = _calls(monkeypatch)
    assert _run() == want
    assert seen  # the first line's kernels were predicted again


def test_a_write_cut_short_at_the_end_loses_no_later_line(empty_caches, monkeypatch):
    # a full disk cut the last write: the file ends inside a line, with no newline. The next
    # process predicts that line's kernels again and appends them; that line must start on a
    # line of its own, or it joins the cut one and the process after predicts them once more
    _run()
    (f,) = (empty_caches / "parallel_ops").glob("*.jsonl")
    text = f.read_text()
    last = text.splitlines(keepends=True)[-1]
    f.write_text(text[: len(text) - len(last)] + last[: len(last) // 2])
    for process in ("the one after the cut", "the next"):
        monkeypatch.setattr(costs, "_OP_CACHE", {})
        monkeypatch.setattr(costs, "_OP_DISK", {})
        seen = _calls(monkeypatch)
        _run()
        if process == "the next":
            assert seen == [], "the kernels appended after the cut line were lost"
        size = f.stat().st_size
    monkeypatch.setattr(costs, "_OP_CACHE", {})
    monkeypatch.setattr(costs, "_OP_DISK", {})
    _run()
    assert f.stat().st_size == size  # nothing appended again: the file does not grow


def test_an_append_after_a_cut_line_starts_a_line_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(op_cache, "_stamp", lambda: "stamp")
    f = tmp_path / "ops.jsonl"
    f.write_text('{"a": [1.0, 1.0, 1.0, 1.0]}\n{"b": [2.0, 2.')  # the second write cut short
    op_cache.append(f, {"c": (3.0, 3.0, 3.0, 3.0)})
    op_cache.append(f, {"d": (4.0, 4.0, 4.0, 4.0)})
    assert op_cache.load(f) == {k: (x,) * 4 for k, x in (("a", 1.0), ("c", 3.0), ("d", 4.0))}
    # a whole file gets no blank line: one line per append
    assert f.read_text().count("\n") == 4


def _scaled(factor: float):
    """An op class whose bytes are factor x an elementwise copy's: its repr does not hold it."""

    @dataclass(frozen=True)
    class Scaled(ops.Elementwise):
        @property
        def bytes(self) -> float:
            return factor * ops.dtype_bytes(self.dtype) * self.numel

    return Scaled


def test_an_op_class_outside_the_key_is_not_served_from_disk(empty_caches, monkeypatch):
    # two processes' op classes of one name (a notebook's, edited between runs): the same repr,
    # other code; the key holds no file of theirs, so the second must not get the first's time
    one, ten = _scaled(1.0)("copy", 1 << 26, "bf16"), _scaled(10.0)("copy", 1 << 26, "bf16")
    assert repr(one) == repr(ten)
    got = []
    for op in (one, ten):
        monkeypatch.setattr(costs, "_OP_CACHE", {})
        monkeypatch.setattr(costs, "_OP_DISK", {})
        c = Coster(Layout(dtype="bf16"), get_system("dgx-a100"), "roofline")
        c.predict_ops([op])
        got.append(c._op_ms[op][0])
    # the roofline of 128 MiB against 1.28 GiB moved: memory-bound, ~10x the time
    assert got[1] > 5 * got[0]


def test_nothing_is_written_once_the_code_changed(empty_caches, monkeypatch):
    _run()
    (f,) = (empty_caches / "parallel_ops").glob("*.jsonl")
    size = f.stat().st_size
    # the code on disk changes (process_stamp turns None); this process predicts new shapes
    monkeypatch.setattr(op_cache, "_stamp", lambda: None)
    predict_parallel("gpt:layers=2,hidden=768,heads=12,seq=128,vocab=1000", "dgx-a100",
                     Layout(**LAYOUT), predictor="tile")
    assert f.stat().st_size == size


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_cache_file_that_is_no_file_is_a_miss(empty_caches, monkeypatch):
    # a full disk, and a cache file that is a link to a device: reading /dev/full never ends
    # (it had been a MemoryError), writing to it fails (ENOSPC); the prediction is as uncached
    want = _run()
    (f,) = (empty_caches / "parallel_ops").glob("*.jsonl")
    f.unlink()
    f.symlink_to("/dev/full")
    monkeypatch.setattr(costs, "_OP_CACHE", {})
    monkeypatch.setattr(costs, "_OP_DISK", {})
    seen = _calls(monkeypatch)
    assert _run() == want
    assert seen


def test_a_fifo_in_place_of_the_cache_file_does_not_block(empty_caches, monkeypatch):
    want = _run()
    (f,) = (empty_caches / "parallel_ops").glob("*.jsonl")
    f.unlink()
    os.mkfifo(f)
    monkeypatch.setattr(costs, "_OP_CACHE", {})
    monkeypatch.setattr(costs, "_OP_DISK", {})
    assert _run() == want


def test_the_gpus_code_is_in_the_key():
    # the predictors read a GPU's derived figures (its class's properties, not its spec's
    # fields): the file defining its class must be hashed into both disk caches' keys
    from kit.workload.latency_cache import predictor_files

    gpu = get_system("dgx-a100").gpu
    assert Path(inspect.getfile(type(gpu))).resolve() in {f.resolve() for f in predictor_files()}
    assert op_cache.stamped_class(type(gpu))
