"""kit.parallel keeps its kernel times on disk between processes (kit.parallel.op_cache), and a
prediction's p10/p90 band reuses the times of its point prediction instead of predicting every
kernel again under the predictor object's own cache key."""
import pytest

import kit.parallel.costs as costs
from kit.parallel import Layout, predict_parallel
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
