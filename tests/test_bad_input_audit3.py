"""Third bad-input audit: each problem found is one KitError (one `kit: error:` line on the CLI),
never a traceback, a wrong number or silently lost data."""
import json
import os
import warnings

import numpy as np
import pytest

from kit import api, ops
from cli_support import one_error_line as _err
from kit.cli import main
from kit.errors import KitError
from test_audit_single import _cache  # noqa: F401  (autouse: a fresh KIT_CACHE)

TINY_GPT = {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 2, "n_positions": 128,
            "vocab_size": 1000}




# a folder that says it can be written (os.access, as root) but takes no new entry
PROC = "/proc"
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")


# -- 1. an optimizer given as a callable ------------------------------------------------------
@pytest.mark.parametrize("model", ["gpt2", TINY_GPT])
def test_a_lambda_optimizer_predicts_and_is_cached_nowhere(model):
    import torch

    from kit.workload import zoo

    # was: TypeError, the lambda is not JSON serializable (the cache key)
    it = api.predict_model(model, "h100-sxm", seq=16, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    assert it.total_ms > 0
    assert zoo._optimizer_name(lambda p: None) is None
    before = len(list(zoo.cache_dir().glob("*.pkl"))) if zoo.cache_dir().is_dir() else 0
    g = zoo.graph_for(TINY_GPT, 1, 16, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    assert "cache_key" not in g.meta  # two lambdas share a name: no cached capture, no latency cache
    after = len(list(zoo.cache_dir().glob("*.pkl"))) if zoo.cache_dir().is_dir() else 0
    assert after == before


def test_a_named_optimizer_class_is_keyed_by_its_qualified_name():
    import torch

    from kit.workload import zoo

    assert zoo._optimizer_name(torch.optim.SGD) == "torch.optim.sgd:SGD"
    keys = {zoo._key(TINY_GPT, 1, 16, "train", "fp32", o)
            for o in (torch.optim.SGD, torch.optim.Adam, "sgd", None)}
    assert len(keys) == 4
    g = zoo.graph_for(TINY_GPT, 1, 16, optimizer=torch.optim.SGD)
    assert g.meta["cache_key"] == zoo._key(TINY_GPT, 1, 16, "train:loss", "fp32", torch.optim.SGD)


# -- 2. collectors with an unwritable or binary --out ------------------------------------------
@needs_proc
def test_collect_unwritable_out_is_one_line(capsys):
    out = f"{PROC}/kit-audit3.csv"  # was FileNotFoundError from open()
    line = _err(capsys, ["collect", "--ops", "gemm", "--shapes", "tiny-gemm:1", "--device", "cpu",
                         "--out", str(out)])
    assert "cannot write" in line and "--out" in line


@needs_proc
def test_collect_embedding_unwritable_out_is_one_line(capsys):
    out = f"{PROC}/kit-audit3.csv"  # was FileNotFoundError writing FILE.meta.json
    line = _err(capsys, ["collect-embedding", "--batch", "2", "--rows", "10", "--dim", "4",
                         "--pooling", "2", "--out", str(out)])
    assert "cannot write" in line and "--out" in line


@needs_proc
def test_collect_comm_unwritable_out_is_one_line_before_any_rank_starts(capsys):
    out = f"{PROC}/kit-audit3.txt"  # was a worker's crash and torch's log line
    line = _err(capsys, ["collect-comm", "--sizes", "1K:2K", "--out", str(out)])
    assert "cannot write" in line and "--out" in line


@pytest.mark.parametrize("argv", [
    ["collect", "--ops", "gemm", "--shapes", "tiny-gemm:1", "--device", "cpu"],
    ["collect-embedding", "--batch", "2", "--rows", "10", "--dim", "4", "--pooling", "2"],
])
def test_collect_resume_of_a_binary_file_is_one_line(tmp_path, capsys, argv):
    out = tmp_path / "bin.csv"
    out.write_bytes(b"op,\xff\xfe\xd0abc\n1,2\n")
    line = _err(capsys, [*argv, "--out", str(out), "--resume"])
    assert "not UTF-8" in line
    assert out.read_bytes() == b"op,\xff\xfe\xd0abc\n1,2\n"  # left as it was


# -- 3. a corrupt latency-cache file is a miss --------------------------------------------------
@pytest.mark.parametrize("content", [b"", b"PK\x03\x04garbage", b"\x7fELF\x02\x01"])
def test_a_corrupt_latency_cache_file_is_a_miss(content):
    from kit.workload import latency_cache

    lat = np.array([1.0, 2.0])
    latency_cache.save("k" * 24, lat, lat, lat, "roofline", {})
    assert latency_cache.load("k" * 24, 2) is not None
    (latency_cache.cache_dir() / f"{'k' * 24}.npz").write_bytes(content)
    assert latency_cache.load("k" * 24, 2) is None  # an empty file was EOFError, a bad zip BadZipFile


def test_predict_carries_on_over_an_empty_latency_cache(monkeypatch):
    from kit.workload import latency_cache, zoo

    first = api.predict_model(TINY_GPT, "h100-sxm", seq=16).total_ms
    files = list(latency_cache.cache_dir().glob("*.npz"))
    assert files
    for f in files:
        f.write_bytes(b"")
    monkeypatch.setattr(zoo, "_LRU", type(zoo._LRU)())  # as a new process: the graph from disk
    assert api.predict_model(TINY_GPT, "h100-sxm", seq=16).total_ms == pytest.approx(first)


# -- 4. kit train: a folder that cannot be made fails before training -----------------------------
@needs_proc
def test_weights_folder_check_makes_a_real_entry(tmp_path):
    from kit.predict.weights import check_weights_folder

    with pytest.raises(KitError, match="not a writable folder"):  # os.access said yes (as root)
        check_weights_folder(f"{PROC}/kit-weights-audit3")
    assert check_weights_folder(tmp_path / "w") == tmp_path / "w"
    assert list(tmp_path.iterdir()) == []  # the trial entry is gone, and no folder made


def test_kit_train_fails_on_its_out_folder_before_training(capsys):
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux /proc")
    line = _err(capsys, ["train", "--train-gpus", "P4", "--out", f"{PROC}/kit-weights-audit3", "--quick"])
    assert "not a writable folder" in line


# -- 5. a path argument that is not a path --------------------------------------------------------
def _loaders():
    import kit.comm
    import kit.data
    import kit.hardware
    import kit.trace

    return {"load_gpu_file": kit.hardware.load_gpu_file, "load_measurements": kit.data.load_measurements,
            "resolve_data_dir": kit.data.resolve_data_dir, "load_kineto": kit.trace.load_kineto,
            "replay": kit.trace.replay, "load_calibration": kit.comm.load_calibration}


@pytest.mark.parametrize("name, value", [
    (name, value) for name in ("load_gpu_file", "load_measurements", "resolve_data_dir", "load_kineto",
                               "replay", "load_calibration")
    for value in (None, 5, 2.5) if (name, value) != ("resolve_data_dir", None)])  # None: the default
def test_loaders_need_a_path(name, value):
    with pytest.raises(KitError, match="must be a path"):  # was TypeError from Path()
        _loaders()[name](value)


# -- 6. alltoallv with a ragged or non-numeric matrix -------------------------------------------
@pytest.mark.parametrize("m", [[[1, 2], [3]], [["a", 1], [1, 1]], [[1, None], [1, 1]]])
def test_alltoallv_bad_matrix(m):
    from kit.comm import predict_alltoallv

    with pytest.raises(KitError, match="square ranks x ranks matrix"):
        predict_alltoallv(m, "dgx-h100")


# -- 7. a table's distribution ------------------------------------------------------------------
def test_table_distribution_is_read_or_refused_at_construction():
    from kit.embedding import Table, Zipf, lookup_cost

    t = Table(1000, 64, 10, distribution="zipf:1.2")
    assert t.distribution == Zipf(1.2)
    assert lookup_cost([t], 128, "h100-sxm").time_ms == \
        lookup_cost([Table(1000, 64, 10, distribution=Zipf(1.2))], 128, "h100-sxm").time_ms
    with pytest.raises(KitError, match="table t: unknown distribution"):
        Table(1000, 64, 10, name="t", distribution="zipff")
    with pytest.raises(KitError, match="cannot read a distribution"):
        Table(1000, 64, 10, distribution=object())


# -- 8. a list where a dtype or fusion name goes --------------------------------------------------
def test_a_list_dtype_or_fusion_is_a_kit_error():
    with pytest.raises(KitError, match="unknown dtype"):
        ops.Gemm(4, 4, 4, dtype=["fp32"])
    with pytest.raises(KitError, match="unknown dtype"):
        api.predict_model(TINY_GPT, "h100-sxm", seq=16, dtype=["fp32"])
    with pytest.raises(KitError, match="unknown fusion"):
        api.predict_model(TINY_GPT, "h100-sxm", seq=16, fusion=["eager"])
    with pytest.raises(KitError, match="unknown fusion"):
        api.predict_generation(TINY_GPT, "h100-sxm", prompt=16, new_tokens=2, fusion={"eager": 1})


# -- 9. booleans --------------------------------------------------------------------------------
def test_a_flag_must_be_a_bool():
    from kit.embedding import Table, lookup_cost

    with pytest.raises(KitError, match="loss must be True or False"):
        api.predict_model(TINY_GPT, "h100-sxm", seq=16, loss="no")
    with pytest.raises(KitError, match="causal must be True or False"):
        ops.Attention(1, 2, 4, 4, 8, causal="no")
    with pytest.raises(KitError, match="backward must be True or False"):
        lookup_cost([Table(10, 4, 2)], 8, "h100-sxm", backward="no")
    a = ops.Attention(1, 2, 4, 4, 8, causal=np.bool_(True))
    assert a.causal is True and a == ops.Attention(1, 2, 4, 4, 8, causal=True)


# -- 10. absurd sizes -----------------------------------------------------------------------------
def test_a_dimension_past_int64_is_refused_at_construction():
    with pytest.raises(KitError, match="more than any tensor holds"):
        ops.Gemm(10**400, 4, 4)  # was OverflowError from Gemm.bytes in predict_op
    with pytest.raises(KitError, match="more than any tensor holds"):
        ops.Memcpy(2**63)
    assert ops.Memcpy(2**63 - 1).nbytes == 2**63 - 1


# -- 11. a GPU file with a key twice ------------------------------------------------------------
def test_gpu_file_with_a_key_twice(tmp_path):
    from kit.hardware import get_gpu, load_gpu_file, unregister_gpu

    e = get_gpu("h100-sxm").to_dict()
    e.update(key="audit3-gpu", name="Audit3 GPU", aliases=[])
    f = tmp_path / "gpus.json"
    f.write_text(json.dumps([e, dict(e, name="Audit3 GPU two", sm_count=e["sm_count"] - 2)]))
    try:
        with pytest.raises(KitError, match="'audit3-gpu' is given twice"):
            load_gpu_file(f)
        with pytest.raises(KitError, match="unknown GPU"):
            get_gpu("audit3-gpu")  # nothing registered
    finally:
        unregister_gpu("audit3-gpu")


# -- 12. calibration files ----------------------------------------------------------------------
def _cal_curve(**kw):
    return {"kind": "allreduce", "ranks": 8, "floor_us": 20.0, "busbw_max_gbs": 200.0,
            "half_bytes": 4e6, "steepness": 1.0, "min_bytes": 1024, "max_bytes": 2**30, **kw}


@pytest.mark.parametrize("curves, needle", [
    ([_cal_curve(), _cal_curve(busbw_max_gbs=100.0)], "curves 0 and 1 are both for allreduce on 8 ranks"),
    ([_cal_curve(min_bytes=2**30, max_bytes=1024)], "min_bytes"),
    ([_cal_curve(ranks="8")], "ranks must be a whole number"),
    ([_cal_curve(ranks=8.5)], "ranks must be a whole number"),
])
def test_bad_calibration_contents(tmp_path, curves, needle):
    from kit.comm import load_calibration

    f = tmp_path / "cal.json"
    f.write_text(json.dumps({"format": "kit-comm-calibration", "system": "dgx-h100", "curves": curves}))
    with pytest.raises(KitError, match=needle):
        load_calibration(f)
    f.write_text(json.dumps({"format": "kit-comm-calibration", "system": "dgx-h100",
                             "curves": [_cal_curve(), _cal_curve(ranks=4)]}))
    assert len(load_calibration(f).curves) == 2


# -- 13. the API refuses what the CLI refuses ---------------------------------------------------
def test_collective_sizes_and_ranks_as_the_cli(tmp_path):
    from kit.comm import collective_table, predict_collective
    from kit.embedding import Table

    for size in (0, 0.5):
        with pytest.raises(KitError, match="at least 1 byte"):
            predict_collective("allreduce", size, "dgx-h100")
    with pytest.raises(KitError, match="at least 1 byte"):
        collective_table("allreduce", [0, 1024], "dgx-h100")
    with pytest.raises(KitError, match="whole rank ids"):
        predict_collective("allreduce", 2**20, "dgx-h100", ranks=[0.5, 1])
    assert predict_collective("allreduce", 2**20, "dgx-h100", ranks=[0, 1]).ranks == 2
    with pytest.raises(KitError, match="time budget must be a positive"):
        api.shard_tables([Table(1000, 8, 2)], "dgx-a100", time_budget_s=0)


# -- 14. a huge Zipf alpha ----------------------------------------------------------------------
def test_a_huge_zipf_alpha_puts_every_lookup_on_one_row_without_warnings(tmp_path, capsys):
    from kit.embedding import Table, Zipf, lookup_cost

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # was: RuntimeWarning overflow encountered in power
        p, c = Zipf(1e30).groups(100_000)
        t = lookup_cost([Table(100_000, 64, 10, distribution=Zipf(1e30))], 128, "h100-sxm").time_ms
    assert p[0] == 1.0 and (p[1:] == 0).all() and c[0] == 1
    f = tmp_path / "tables.csv"
    f.write_text("name,rows,dim,pooling,zipf_alpha\nt0,100000,64,10,1e30\nt1,2000000,128,20,1.05\n")
    assert main(["shard", "--tables", str(f), "--system", "dgx-a100", "--budget-s", "0.1"]) == 0
    assert "note" not in capsys.readouterr().err
    assert t > 0


# -- 15. minor messages -------------------------------------------------------------------------
def test_comm_fit_names_the_ranks_flag(tmp_path, capsys):
    rows = "".join(f"  {s}  {s // 4}  float  sum  -1  30.00  1.0  1.75  0  30.00  1.0  1.75  0\n"
                   for s in (1024, 4096, 16384, 65536, 262144, 1048576))
    f = tmp_path / "ar.txt"
    f.write_text("# Collective test starting: all_reduce_perf\n" + rows)  # no '#  Rank' lines
    assert "--ranks" in _err(capsys, ["comm", "fit", str(f), "--system", "dgx-a100"])


def test_a_header_only_test_file_says_it_has_no_rows(tmp_path, capsys):
    from kit.data.records import HEADER

    f = tmp_path / "t.csv"
    f.write_text(",".join(HEADER) + "\n")
    line = _err(capsys, ["evaluate", "--test", str(f)])
    assert "has no rows" in line and "0 test row" not in line


@pytest.mark.parametrize("cfg, needle", [
    ({**TINY_GPT, "n_embd": 100, "n_head": 3}, "n_embd 100 must be a multiple of n_head 3"),
    ({"model_type": "bert", "hidden_size": 100, "num_attention_heads": 3, "num_hidden_layers": 1,
      "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64},
     "hidden_size 100 must be a multiple of num_attention_heads 3"),
])
def test_a_config_whose_heads_do_not_split_the_width(cfg, needle):
    with pytest.raises(KitError, match=needle):  # was aten.view's shape error
        api.predict_model(cfg, "h100-sxm", seq=16)
