"""Disk caches of the whole-model path: a capture per model and shape, predictions per GPU."""
import os
import subprocess
import sys

import pytest

from kit import source_digest
from kit.hardware import get_gpu
from kit.workload import latency_cache, zoo
from kit.workload import iteration as iteration_mod
from kit.workload.iteration import CpuOverhead, iteration

TINY = {"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 2, "vocab_size": 100,
        "n_positions": 16}
NONE = CpuOverhead(0.0, 0.0, 0.0)


def _new_process(monkeypatch):
    """As in a process started now: no stamp memoised, none taken, the kit imported now."""
    import time

    monkeypatch.setattr(source_digest, "_MEMO", {})
    monkeypatch.setattr(source_digest, "_FIRST", {})
    monkeypatch.setattr(source_digest, "_STARTED_NS", time.time_ns())


@pytest.fixture(autouse=True)
def _no_label_warned(monkeypatch):
    """process_stamp warns once a label for the whole process: each test starts with none warned,
    so whether a test sees its label's warning does not depend on the tests run before it."""
    monkeypatch.setattr(source_digest, "_WARNED", set())


OFF = "cache is off until the process restarts"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path))
    zoo._LRU.clear()
    yield tmp_path
    zoo._LRU.clear()


def test_capture_goes_to_disk_by_default(cache):
    g = zoo.graph_for(TINY, batch=1, seq=8, mode="inference")
    assert len(list((cache / "workload").glob("*.pkl"))) == 1
    assert g.meta["cache_key"]
    zoo._LRU.clear()
    assert zoo.graph_for(TINY, batch=1, seq=8, mode="inference", disk=False) is not g


def test_predictions_are_reused_from_disk(cache, monkeypatch):
    g = zoo.graph_for(TINY, batch=2, seq=8, mode="train")
    first = iteration(g, "v100-pcie-32gb", predictor="wave", overhead=NONE)
    assert len(list((cache / "latency").glob("*.npz"))) == 1
    zoo._LRU.clear()  # a new process: graph from disk, no in-process memo

    def refuse(*a, **k):
        raise AssertionError("the predictor ran although the prediction was cached")

    monkeypatch.setattr(iteration_mod, "predict_latencies", refuse)
    again = iteration(zoo.graph_for(TINY, batch=2, seq=8, mode="train"), "v100-pcie-32gb",
                      predictor="wave", overhead=NONE)
    assert again.total_ms == pytest.approx(first.total_ms)
    assert again.timeline["latency_ms"].tolist() == pytest.approx(first.timeline["latency_ms"].tolist())
    with pytest.raises(AssertionError, match="predictor ran"):  # another GPU is another key
        iteration(g, "t4", predictor="wave", overhead=NONE)


def test_key_changes_with_gpu_fusion_and_predictor(cache):
    from kit.hardware import get_gpu

    g = zoo.graph_for(TINY, batch=1, seq=8, mode="inference")
    v100, t4 = get_gpu("v100-pcie-32gb"), get_gpu("t4")
    keys = {latency_cache.key_for(g, "eager", v100, "wave"), latency_cache.key_for(g, "eager", t4, "wave"),
            latency_cache.key_for(g, "compiled", v100, "wave"), latency_cache.key_for(g, "eager", v100, "roofline")}
    assert len(keys) == 4 and None not in keys
    no_key = g.with_nodes(g.nodes)
    no_key.meta.pop("cache_key")
    assert latency_cache.key_for(no_key, "eager", v100, "wave") is None


def test_cached_configuration_runs_without_torch(cache):
    env = {**os.environ, "KIT_CACHE": str(cache)}
    code = ("import sys; from kit.api import predict_model; "
            "it = predict_model({cfg!r}, 'v100-pcie-32gb', mode='inference', batch=1, seq=8, "
            "predictor='wave'); it.to_dict(); print('torch' in sys.modules, it.total_ms, "
            "'importlib.metadata' in sys.modules)").format(cfg=TINY)
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=120) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-800:]
    first, second = (r.stdout.split() for r in runs)
    assert first[0] == "True"  # the first run captured (torch)
    assert second[0] == "False" and float(second[1]) == pytest.approx(float(first[1]))
    # nor importlib.metadata, which the capture stamp had imported to read torch's version: ~30 ms
    # of a ~100 ms warm prediction
    assert second[2] == "False"


def test_prediction_runs_on_one_torch_thread_and_restores_the_callers(cache, monkeypatch):
    import torch

    from kit.predict import base

    seen = []
    real = base.WavePredictor.predict

    def spy(self, ops, gpu):
        seen.append(torch.get_num_threads())
        return real(self, ops, gpu)

    monkeypatch.setattr(base.WavePredictor, "predict", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        iteration(zoo.graph_for(TINY, batch=1, seq=8, mode="inference"), "l4", predictor="wave")
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_prediction_runs_on_one_openblas_thread_and_restores_the_callers(cache, monkeypatch):
    """The shipped networks run in numpy (kit.predict.array_mlp), whose OpenBLAS pool spun as
    torch's had: a warm new GPU 0.09-0.11 s on two threads with another job running, 0.036 s on one."""
    from kit.predict import base
    from kit.workload.kernel_times import openblas_threads

    blas = openblas_threads()
    if blas is None:
        pytest.skip("numpy's BLAS here is not an OpenBLAS the kit finds")
    seen = []
    real = base.WavePredictor.predict

    def spy(self, ops, gpu):
        seen.append(blas[0]())
        return real(self, ops, gpu)

    monkeypatch.setattr(base.WavePredictor, "predict", spy)
    before = blas[0]()
    blas[1](2)
    try:
        iteration(zoo.graph_for(TINY, batch=1, seq=7, mode="inference"), "l4", predictor="wave")
        assert seen and set(seen) == {1}
        assert blas[0]() == 2
    finally:
        blas[1](before)


@pytest.mark.parametrize("name", ["rnn.py", "mapping.py", "ops.py"])
def test_the_capture_stamp_follows_each_modules_contents(monkeypatch, name):
    """The zoo's disk cache key changes when any capture module's text does, whatever its mtime:
    it had been the whole-second mtimes of a named list, so two checkouts written in the same
    second shared their cached graphs, and rnn.py (which prices a recurrent node) was left out."""
    from pathlib import Path

    before = zoo._code_stamp()
    real = Path.read_bytes

    def edited(self):
        data = real(self)
        return data + b"\n# edited\n" if self.name == name else data

    monkeypatch.setattr(Path, "read_bytes", edited)
    _new_process(monkeypatch)  # nothing memoised, nothing imported before
    after = zoo._code_stamp()
    assert after is not None and after != before


def test_the_capture_stamp_is_hashed_again_only_when_a_file_changes(monkeypatch):
    """A warm prediction asks for the stamp several times (a decode prediction 7): the contents
    are hashed once while no file's size or mtime changes."""
    from pathlib import Path

    zoo._code_stamp()
    reads = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self) or real(self))
    first = zoo._code_stamp()
    assert zoo._code_stamp() == first and not reads


def test_the_capture_stamp_follows_the_installed_torch(monkeypatch, tmp_path):
    """torch's decompositions decide the aten ops a capture records: a graph captured under one
    torch is not served under another (the key had no torch version). Another torch installed
    (found on sys.path, not imported) gives another stamp; the same one, imported or not, the same."""
    import torch  # imported: the stamp must not differ from a process without it

    assert sys.modules["torch"] is torch

    before = zoo._code_stamp()
    _new_process(monkeypatch)
    monkeypatch.delitem(sys.modules, "torch")
    assert zoo._code_stamp() == before
    other = tmp_path / "torch"
    other.mkdir()
    (other / "__init__.py").write_text("")
    (other / "version.py").write_text("__version__ = '0.0.1'\ngit_version = 'other'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _new_process(monkeypatch)
    after = zoo._code_stamp()
    assert after is not None and after != before


def test_the_models_table_cache_follows_its_own_codes_contents(cache, monkeypatch):
    """`kit models`' cached table is keyed by cmd_models.py's contents: its whole-second mtime
    let an edit within the same second (or a checkout with its mtime kept) serve the old table."""
    from pathlib import Path

    from kit.cli import cmd_models

    monkeypatch.setattr(cmd_models, "_rows", lambda: [{"model": "m", "family": "f", "params": 1,
                                                       "default_seq": 8, "modes": "inference",
                                                       "aliases": ""}])
    cmd_models.run(None)
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: real(self) + (
        b"\n# edited\n" if self.name == "cmd_models.py" else b""))
    monkeypatch.setattr(source_digest, "_MEMO", {})  # as after the file's size or mtime changed
    with pytest.warns(UserWarning, match=f"models table {OFF}"):
        cmd_models.run(None)  # this process runs the old cmd_models.py: its table is not stored
    assert len(list(zoo.cache_dir().glob("models-*.pkl"))) == 1
    _new_process(monkeypatch)  # a process started after the edit stores its own
    cmd_models.run(None)
    assert len(list(zoo.cache_dir().glob("models-*.pkl"))) == 2


def test_a_process_whose_code_changed_on_disk_caches_nothing(cache, monkeypatch):
    """A process runs the code it imported: once the capture code on disk differs (an edit or a
    git pull under an open Jupyter kernel), it neither reads nor writes the disk caches. It had
    stored its old code's results under the new code's key, which fresh processes then served."""
    from pathlib import Path

    zoo.graph_for(TINY, batch=1, seq=8, mode="inference")  # this process's stamp is taken
    written = set(zoo.cache_dir().glob("*.pkl"))
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: real(self) + (
        b"\n# edited\n" if self.name == "mapping.py" else b""))
    monkeypatch.setattr(source_digest, "_MEMO", {})  # as after the file's size or mtime changed
    with pytest.warns(UserWarning, match=f"capture {OFF}"):
        assert zoo._code_stamp() is None
    zoo._LRU.clear()
    g = zoo.graph_for(TINY, batch=1, seq=16, mode="inference")
    assert set(zoo.cache_dir().glob("*.pkl")) == written and "cache_key" not in g.meta
    assert latency_cache.key_for(g, "eager", "v100-pcie-32gb", "wave") is None
    _new_process(monkeypatch)  # a process started after the change caches again, by the new code
    assert zoo._code_stamp() is not None


def _costing_copy(tmp_path, monkeypatch):
    """The costing modules copied with their mtimes (as a checkout older than the process)."""
    import shutil

    copy = tmp_path / "workload"
    shutil.copytree(latency_cache.HERE, copy)
    monkeypatch.setattr(latency_cache, "HERE", copy)
    return copy


class _Keyed:
    meta = {"cache_key": "a-capture"}


def test_a_file_written_between_the_import_and_the_first_stamp_caches_nothing(tmp_path, monkeypatch):
    """The first stamp is taken at first use: a costing module written after the kit's import
    and before the process's first prediction (a kernel opened, a git pull, then a prediction)
    had given the new code's stamp to the old code in memory, and its latencies were stored
    under the new code's key. A process started after the write caches again."""
    import time

    copy = _costing_copy(tmp_path, monkeypatch)
    _new_process(monkeypatch)  # the kit imported now, nothing stamped yet
    f = copy / "generation.py"
    f.write_text(f.read_text() + "\n# pulled\n")
    assert f.stat().st_mtime_ns > source_digest._STARTED_NS
    with pytest.warns(UserWarning, match=f"latency {OFF}") as seen:
        assert latency_cache._predictor_stamp() is None
        assert latency_cache.key_for(_Keyed(), "eager", get_gpu("l4"), "wave") is None
        assert latency_cache._predictor_stamp() is None  # for the whole process
    assert len(seen) == 1  # once a label, not once a call
    monkeypatch.setattr(source_digest, "_FIRST", {})
    monkeypatch.setattr(source_digest, "_STARTED_NS", time.time_ns())  # a process started after
    assert latency_cache._predictor_stamp() is not None
    assert latency_cache.key_for(_Keyed(), "eager", get_gpu("l4"), "wave") is not None


def test_a_checkout_dated_in_the_future_still_caches(tmp_path, monkeypatch):
    """An archive unpacked from a machine whose clock ran ahead has mtimes after the import that
    say nothing of an edit: such a checkout is cached (it would never have been)."""
    import os
    import time

    copy = _costing_copy(tmp_path, monkeypatch)
    _new_process(monkeypatch)
    ahead = time.time_ns() + 3600 * 10**9
    os.utime(copy / "kernels.py", ns=(ahead, ahead))
    assert latency_cache._predictor_stamp() is not None


def test_the_latency_key_is_none_once_the_predictor_code_changes_under_the_process(tmp_path, monkeypatch):
    """A keyed capture's latencies are not cached once a costing module on disk is no longer
    the one this process stamped first (the capture test's graph had no key, so it did not
    show it)."""
    copy = _costing_copy(tmp_path, monkeypatch)
    _new_process(monkeypatch)
    assert latency_cache.key_for(_Keyed(), "eager", get_gpu("l4"), "wave") is not None
    f = copy / "kernels.py"
    f.write_text(f.read_text() + "\n# edited\n")
    with pytest.warns(UserWarning, match=f"latency {OFF}"):
        assert latency_cache.key_for(_Keyed(), "eager", get_gpu("l4"), "wave") is None


def test_a_graph_without_a_key_stamps_no_predictor_files(monkeypatch):
    """A user's module's step has no cache key: its latency key is None without stating every
    predictor file (a few ms a prediction)."""
    def boom():
        raise AssertionError("stamped the predictor files for a graph without a key")

    monkeypatch.setattr(latency_cache, "_predictor_stamp", boom)

    class Bare:
        meta = {}

    assert latency_cache.key_for(Bare(), "eager", get_gpu("l4"), "wave") is None
