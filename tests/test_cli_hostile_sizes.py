"""Hostile sizes and damaged files on the command line (shard, collect, collect-embedding, demo,
models): one `kit: error:` line and exit 2, or a failed config said, never a traceback, a
300-digit time, or minutes of work (or the OOM killer) before the answer."""
import json
import os
import pickle
import time

import pytest

from cli_json import cli_error
from kit.cli import main
from kit.errors import KitError

pytest.importorskip("kit.comm")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))


def _tables(tmp_path, rows="name,rows,dim,pooling\nu,1000,128,1\n"):
    f = tmp_path / "t.csv"
    f.write_text(rows)
    return f


# -- kit shard ---------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", ["1e300", "1e13"])
def test_shard_batch_past_any_gpu_is_one_error(tmp_path, capsys, batch):
    # 1e300 had priced each rank at 1.2e294 ms (numpy "overflow encountered in cast"), exit 0
    err = cli_error(capsys, "shard", "--tables", _tables(tmp_path), "--system", "dgx-a100",
                    "--batch", batch, "--budget-s", "0.2")
    assert "samples per rank is more than any GPU looks up" in err and len(err) < 300


def test_shard_batch_at_the_cap_gives_finite_strict_json(tmp_path, capsys):
    # the largest batch allowed, with the largest pooling a table may have: finite numbers
    f = _tables(tmp_path, "name,rows,dim,pooling\nu,1000000,1024,1000000\n")
    assert main(["shard", "--tables", str(f), "--system", "dgx-a100", "--batch", str(2**40),
                 "--budget-s", "0.2", "--json"]) == 0
    out = capsys.readouterr()
    r = json.loads(out.out, parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    assert r["cost_ms"] > 0 and "overflow" not in out.err


def test_shard_too_many_gpus_is_refused_before_building_placements(tmp_path, capsys):
    # dgx-a100 x 100,000 nodes: 2.5 million placements were built (15-35 s) before the refusal
    t0 = time.perf_counter()
    err = cli_error(capsys, "shard", "--tables", _tables(tmp_path), "--system", "dgx-a100",
                    "--nodes", "100000")
    assert "2,500,002 placements" in err and "over the planner's limit of 8 GiB" in err
    assert time.perf_counter() - t0 < 5


def test_count_options_is_the_number_of_options():
    from kit.embedding import Table
    from kit.sharding.plans import count_options, options_for

    for dim in (1, 16, 24, 32, 64, 128):
        table = Table(rows=1000, dim=dim, pooling=1)
        for world, per_node in ((1, 1), (8, 8), (4, 4), (16, 8), (32, 8), (3, 1)):
            for kinds in (("tw", "cw", "rw", "twrw", "dp"), ("cw",), ("twrw", "dp"), ("rw",), ("tw", "tw")):
                assert count_options(table, world, per_node, kinds) == \
                    len(options_for(table, world, per_node, kinds)), (dim, world, per_node, kinds)


# -- kit collect ---------------------------------------------------------------------------------
def test_collect_threads_past_the_cpus_is_one_error(tmp_path, capsys):
    # 100,000 threads: torch started them until a MemoryError traceback, mid-run
    out = tmp_path / "x.csv"
    err = cli_error(capsys, "collect", "--device", "cpu", "--ops", "gemm", "--shapes", "tiny-gemm:1",
                    "--out", out, "--threads", str(100 * (os.cpu_count() or 1)))
    assert f"more than this machine's {os.cpu_count()} CPUs" in err
    assert not out.exists()


# -- kit collect-embedding ---------------------------------------------------------------------
def test_collect_embedding_too_many_tables_is_refused_at_once(tmp_path, capsys):
    # 1e8 tables ran past 90 s building one EmbeddingBag each, toward ~2 TB of modules
    from kit.embedding.collect import MAX_TABLES

    out = tmp_path / "e.csv"
    t0 = time.perf_counter()
    err = cli_error(capsys, "collect-embedding", "--out", out, "--tables", str(MAX_TABLES + 1),
                    "--rows", "10", "--repeats", "1", "--warmup", "0", "--dist", "uniform")
    assert "more than the collector builds" in err and time.perf_counter() - t0 < 10
    assert not out.exists()


def test_collect_embedding_tables_past_memory_fail_without_building(tmp_path, capsys, monkeypatch):
    # 1,000 tables of 1e9 rows were allocated one by one, toward the OOM killer; now the config
    # is a failed one (nothing built) and the one that fits is measured
    from kit.embedding import collect as ec

    built = []
    real = ec._torch_call

    def spy(cfg, device):
        built.append(cfg["rows"])
        return real(cfg, device)

    monkeypatch.setattr(ec, "_torch_call", spy)
    monkeypatch.setattr(ec, "_memory_bytes", lambda device: 2**30)  # a 1 GiB device
    r = ec.collect(ec.grid([4], [10**7, 10], [64], [1], ["uniform"], tables=[2]), tmp_path / "e.csv",
                   repeats=1, warmup=0, warmup_ms=1)
    assert r["written"] == 1 and len(r["failed"]) == 1
    assert "hold 4.768 GiB, more than the device's 1 GiB" in r["failed"][0]["error"]
    assert 10**7 not in built  # neither measured nor warmed up
    with pytest.raises(KitError, match="every measurement failed"):
        ec.collect(ec.grid([4], [10**7], [64], [1], ["uniform"], tables=[2]), tmp_path / "f.csv",
                   repeats=1, warmup=0)
    assert not (tmp_path / "f.csv").exists()


# -- kit demo, kit models ------------------------------------------------------------------------
def test_demo_unknown_system_fails_before_any_prediction(capsys, monkeypatch):
    import kit.api

    def no(*a, **k):
        raise AssertionError("predicted before the system was checked")

    monkeypatch.setattr(kit.api, "predict_model", no)
    monkeypatch.setattr(kit.api, "predict_op", no)
    assert "unknown system 'nosuch'" in cli_error(capsys, "demo", "--system", "nosuch")


@pytest.mark.parametrize("damage", [pickle.dumps(5), pickle.dumps([{"x": 1}]), pickle.dumps([]),
                                    b"garbage"])
def test_models_rebuilds_a_damaged_cache(tmp_path, capsys, damage):
    assert main(["models", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    (cached,) = (tmp_path / "cache" / "workload").glob("models-*.pkl")
    cached.write_bytes(damage)  # 5 and [{"x": 1}] were TypeError and KeyError tracebacks
    assert main(["models"]) == 0
    assert f"{len(first)} zoo models" in capsys.readouterr().out
    assert main(["models", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == first


# -- a device given as an input file -----------------------------------------------------------
@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
@pytest.mark.parametrize("argv, what", [
    (["gpus", "--add", "{dev}"], "GPU file"),  # read until the OOM killer ended it at 23 GB
    (["op", "gemm", "--m", "8", "--n", "8", "--k", "8", "--gpu", "h100-sxm", "--gpu-file", "{dev}"], "GPU file"),
    (["comm", "predict", "allreduce", "--bytes", "1e9", "--calibration", "{dev}"], "calibration file"),
    (["comm", "fit", "{dev}", "--system", "dgx-h100"], "benchmark file"),
    (["replay", "{dev}"], "trace"),
    (["shard", "--tables", "{dev}", "--system", "dgx-a100"], "tables file"),
    (["collect", "--ops", "gemm", "--shapes", "{dev}", "--device", "cpu", "--out", "{tmp}/x.csv"], "shapes file"),
])
def test_a_device_as_an_input_file_is_one_error(tmp_path, capsys, argv, what):
    import resource

    dev = tmp_path / "zero.json"
    dev.symlink_to("/dev/zero")  # under a file's name too
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = 8 * 2**30 if hard == resource.RLIM_INFINITY else min(hard, 8 * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))  # a failure is a MemoryError, not the OOM killer
    try:
        for path in ("/dev/zero", dev):
            err = cli_error(capsys, *[a.format(dev=path, tmp=tmp_path) for a in argv])
            assert f"{what} {path} is a device, not a file" in err
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
