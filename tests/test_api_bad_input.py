"""The Python verbs (kit.api) answer bad input with one KitError that names it, as the CLI does."""
import numpy as np
import pandas as pd
import pytest

from kit import api
from kit.errors import KitError
from kit.ops import Dropout, Elementwise, Gemm, Softmax
from kit.parallel.layout import MAX_MICRO_BATCHES, Layout

BAD = [
    ("trace must be a path", lambda: api.replay_trace(None)),
    ("trace must be a path", lambda: api.replay_trace("")),
    ("trace must be a path", lambda: api.replay_trace(5)),
    ("et .* must be a path", lambda: api.replay_trace("x.json", et=True)),
    ("tables must be a CSV path or a list of kit.embedding.Table",
     lambda: api.shard_tables([{"rows": 10, "dim": 4, "pooling": 1}], "dgx-a100")),
    ("tables must be a CSV path or a list", lambda: api.shard_tables(5, "dgx-a100")),
    ("tables must be a path", lambda: api.shard_tables("", "dgx-a100")),
    ("predictor must be a name", lambda: api.predict_op(Gemm(8, 8, 8), "a100-pcie-40gb", ["tile"])),
    ("needs a kit.ops op", lambda: api.predict_op(Gemm, "a100-pcie-40gb")),
    ("test frame lacks the columns", lambda: api.evaluate_predictors(pd.DataFrame({"a": [1]}))),
    ("test .* must be a path", lambda: api.evaluate_predictors("")),
    ("test .* must be a path", lambda: api.evaluate_predictors(None)),
    ("predictors must be names", lambda: api.evaluate_predictors("x.csv", predictors=5)),
    ("weights .* must be a path", lambda: api.evaluate_predictors("x.csv", weights=5)),
    ("train_gpus must be GPU names", lambda: api.train_predictors(None, "/tmp/w")),
    ("train_gpus must be GPU names", lambda: api.train_predictors(5, "/tmp/w")),
    ("out .* must be a path", lambda: api.train_predictors("P4", "")),
    ("out .* must be a path", lambda: api.train_predictors("P4", None)),
    ("seed must be a whole number", lambda: api.train_predictors("P4", "/tmp/w", seed="x")),
    ("seed must be a whole number", lambda: api.train_predictors("P4", "/tmp/w", seed=2.5)),
    ("threads must be a whole number of at least 1",
     lambda: api.train_predictors("P4", "/tmp/w", threads=0)),
    ("seed must be a whole number from 0 to 2", lambda: api.train_predictors("P4", "/tmp/w", seed=2**70)),
    ("threads 1000000 is more than this machine's",
     lambda: api.train_predictors("P4", "/tmp/w", threads=10**6)),
    ("test_rows must be True or False",
     lambda: api.train_predictors("P4", "/tmp/w", test_rows="no")),
    ("micro-batches per replica", lambda: api.predict_multi_gpu(
        "gpt:layers=4,hidden=1024,heads=16,seq=512", "dgx-a100", dp=8, global_batch=10**9)),
]


@pytest.mark.parametrize("match, call", BAD, ids=[f"{i}-{m[:30]}" for i, (m, _) in enumerate(BAD)])
def test_bad_input_is_one_clear_error(match, call):
    with pytest.raises(KitError, match=match):
        call()


def test_numpy_integers_are_whole_numbers():
    g = Gemm(np.int64(64), np.int32(32), np.int64(16), b=np.int64(2))
    assert (g.m, g.n, g.k, g.b) == (64, 32, 16, 2) and all(type(v) is int for v in (g.m, g.b))
    assert g == Gemm(64, 32, 16, b=2)
    with pytest.raises(KitError, match="rows must be a positive whole number"):
        Softmax(np.float64(3.0), 4)
    with pytest.raises(KitError, match="rows must be a positive whole number"):
        Softmax(np.bool_(True), 4)
    lay = Layout(dp=np.int64(8), micro_batch=np.int32(2), global_batch=np.int64(64))
    assert lay.micro_batches == 4 and type(lay.dp) is int and type(lay.global_batch) is int


def test_micro_batch_cap_is_the_simulators_limit():
    ok = Layout(dp=1, micro_batch=1, global_batch=MAX_MICRO_BATCHES)
    assert ok.micro_batches == MAX_MICRO_BATCHES
    with pytest.raises(KitError, match=f"{MAX_MICRO_BATCHES + 1:,} micro-batches"):
        Layout(dp=1, micro_batch=1, global_batch=MAX_MICRO_BATCHES + 1)


def test_pipeline_passes_cap_counts_every_stage_and_chunk():
    # each micro-batch runs on every stage (and chunk): at --pp 64 the micro-batch cap alone let
    # through 64 x 65,536 passes, about 20 minutes and 29 GB of simulation
    with pytest.raises(KitError, match="pipeline passes"):
        Layout(pp=64, global_batch=MAX_MICRO_BATCHES)
    from kit.parallel.layout import MAX_STAGE_PASSES

    m = MAX_STAGE_PASSES // 64
    assert Layout(pp=64, global_batch=m).micro_batches == m
    with pytest.raises(KitError, match="pipeline passes"):
        Layout(pp=64, global_batch=2 * m)
    with pytest.raises(KitError, match="pipeline passes"):
        Layout(pp=64, virtual_stages=2, schedule="interleaved", global_batch=m)
    # more stages and chunks than any model has layers: the remedy is fewer of them, not a
    # smaller batch (one micro-batch already passes the cap)
    with pytest.raises(KitError, match="lower --pp or --virtual-stages"):
        Layout(pp=2, virtual_stages=MAX_STAGE_PASSES, schedule="interleaved", global_batch=1)


def test_a_step_that_does_not_fit_says_so():
    big = api.predict_model("gpt2", "t4", mode="train", batch=64, seq=1024)
    small = api.predict_model("gpt2", "a100-pcie-40gb", mode="inference", batch=1, seq=128)
    assert big.fits is False and small.fits is True
    mem = big.to_dict()["memory"]
    assert mem["total_bytes"] > mem["gpu_memory_bytes"] == 16 * 2**30


@pytest.mark.parametrize("make, match", [
    (lambda: Dropout(1000, p="0.1"), "p must be a number"),
    (lambda: Dropout(1000, p=None), "p must be a number"),
    (lambda: Dropout(1000, p=True), "p must be a number"),
    (lambda: Elementwise(["add"], 10), "unknown elementwise kind"),
    (lambda: Gemm(256, 256, 256, shared_rhs="yes"), "shared_rhs must be True or False"),
    (lambda: Gemm(256, 256, 256, kind="matmul"), "gemm kind 'matmul'"),
    (lambda: Gemm(256, 256, 256, kind=None), "gemm kind None"),
])
def test_op_constructors_name_a_bad_field(make, match):
    with pytest.raises(KitError, match=match):
        make()
    assert Dropout(1000, p=np.float64(0.2)).p == 0.2 and Gemm(8, 8, 8, shared_rhs=np.True_).shared_rhs


def test_multi_gpu_graph_and_nodes_are_what_was_asked():
    from kit.hardware.system import get_system

    box = get_system("dgx-h100")
    with pytest.raises(KitError, match="graph must be True"):
        api.predict_multi_gpu("gpt2", box, dp=8, graph=1)  # 1 == True, but not a choice
    with pytest.raises(KitError, match="nodes must be a whole number"):
        api.predict_multi_gpu("gpt2", box, dp=8, nodes=0)  # was ignored for a System object
    two = api.predict_multi_gpu("gpt2", box, nodes=2, dp=16)  # a System on two of its nodes
    assert two["system"] == "dgx-h100-x2" and two["layout"]["world_size"] == 16
