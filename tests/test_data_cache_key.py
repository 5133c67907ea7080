"""The parquet cache of NeuSight parts (kit.data.cache) is reread when what built it changes: an
input file replaced with its size and mtime kept, or the loader's own code."""
import os

import pytest

from kit.data import cache, load_neusight

HEAD = "OPName,Latency,Device,B,H"


@pytest.fixture
def layout(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "neusight"
    f = root / "data/dataset/train/collect/addu/p2.1.0/Tesla T4.csv"
    f.parent.mkdir(parents=True)
    f.write_text(f"{HEAD}\naddu,0.0245,Tesla T4,127,168\n")
    return root, f


def test_a_file_replaced_with_its_size_and_mtime_kept_is_read_again(layout):
    root, f = layout
    assert load_neusight(data_dir=root).latency_ms.tolist() == [0.0245]
    st = f.stat()
    # a corrected copy of the same size put in place with its timestamps kept (cp -p, rsync -t, tar)
    f.write_text(f"{HEAD}\naddu,0.0425,Tesla T4,127,168\n")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    assert load_neusight(data_dir=root).latency_ms.tolist() == [0.0425]


def test_a_change_to_the_loader_code_rebuilds_the_table(layout, tmp_path, monkeypatch):
    root, _ = layout
    code = tmp_path / "kit_like" / "data" / "loader.py"
    code.parent.mkdir(parents=True)
    code.write_text("VERSION = 1\n")
    # the stamp reads LOADER_FILES relative to kit/: point one entry at a file the test edits
    kit_dir = cache.Path(cache.__file__).resolve().parents[1]
    monkeypatch.setattr(cache, "LOADER_FILES", (*cache.LOADER_FILES, os.path.relpath(code, kit_dir)))
    builds = []

    def build():
        builds.append(1)
        return load_neusight(data_dir=root, cache=False)

    from kit import source_digest

    def new_process():  # a process started now, with the loader code as it is on disk
        os.utime(code, ns=(0, 0))  # written before the process imported the kit
        monkeypatch.setattr(source_digest, "_FIRST", {})
        monkeypatch.setattr(source_digest, "_MEMO", {})

    files = sorted(root.rglob("*.csv"))
    new_process()
    cache.cached_table("t", files, build)
    cache.cached_table("t", files, build)
    assert len(builds) == 1  # the cache serves the second read
    code.write_text("VERSION = 2\n")  # same inputs, other loader code
    new_process()
    cache.cached_table("t", files, build)
    assert len(builds) == 2
