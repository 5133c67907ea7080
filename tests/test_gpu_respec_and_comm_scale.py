"""The hardware catalog and the comm model: an even all-to-all on a huge system is
priced node by node (no n x n matrix), a replaced GPU spec reaches the comm and multi-GPU caches,
a GPU object is validated when registered, every PCIe generation a GPU may give has a rate, a
GPU file whose fields disagree is noted, and `kit demo` names the ranks it reduced over."""
import dataclasses
import warnings

import numpy as np
import pytest

from kit.errors import KitError
from kit.hardware import get_gpu, get_system, register_gpu, unregister_gpu


# -- the even all-to-all ---------------------------------------------------------------------
def test_uniform_alltoall_matches_the_dense_matrix():
    from kit.comm.algorithms import alltoallv_us, uniform_alltoall_us
    from kit.comm.topology import resolve_group

    for name, groups in {"dgx1-v100-x2": [None, 5, [0, 3, 4, 9, 12]], "pcie8-x2": [None, 13, [1, 2, 9]],
                         "dgx-h100-x4": [None, 9, 26], "a100x4-nvlink": [3, None]}.items():
        system = get_system(name)
        for ranks in groups:
            group = resolve_group(system, ranks)
            n = group.size
            dense = np.full((n, n), 1.0 / n)
            np.fill_diagonal(dense, 0.0)
            assert uniform_alltoall_us(system, group) == pytest.approx(alltoallv_us(system, group, dense),
                                                                        rel=1e-12), (name, ranks)


def test_alltoall_on_the_largest_system_is_priced_not_a_memory_error():
    from kit.comm import predict_collective

    # 131,072 nodes x 8: its 1M x 1M matrix had asked numpy for 8 TiB (a traceback)
    r = predict_collective("alltoall", 1e9, get_system("dgx-h100", nodes=2**17))
    assert r.ranks == 2**20 and np.isfinite(r.time_ms) and r.time_ms > 0


# -- a replaced spec reaches every cache -----------------------------------------------------
@pytest.fixture
def slow_h100():
    """h100-sxm replaced by a spec with a tenth of its bandwidth and compute (then restored)."""
    spec = get_gpu("h100-sxm").to_dict()
    spec.update(mem_bw_gbs=335.2, fp32_tflops=6.69, tf32_tflops=49.5, fp16_tflops=98.9,
                bf16_tflops=98.9, fp8_tflops=197.9, sm_count=13)
    yield spec
    unregister_gpu("h100-sxm")


def test_a_replaced_gpu_spec_reaches_the_collective_model(slow_h100):
    from kit.comm import predict_collective

    before = predict_collective("allreduce", 1e9, "dgx-h100", 1).time_ms  # a local copy: HBM-bound
    register_gpu(slow_h100)
    after = predict_collective("allreduce", 1e9, "dgx-h100", 1).time_ms
    assert after > 5 * before  # a tenth of the bandwidth; was: the cached plan, unchanged


def test_a_replaced_gpu_spec_reaches_the_multi_gpu_kernel_times(slow_h100):
    from kit.api import predict_multi_gpu

    kw = dict(dp=8, micro_batch=1, global_batch=8, dtype="bf16", graph=False)
    model = "gpt:layers=2,hidden=512,heads=8,seq=256,vocab=1024"
    before = predict_multi_gpu(model, "dgx-h100", **kw)["iteration_ms"]
    register_gpu(slow_h100)
    after = predict_multi_gpu(model, "dgx-h100", **kw)["iteration_ms"]
    assert after > 2 * before  # was: the same number, kernel times cached under the key


def test_a_replaced_gpu_spec_reaches_the_dispatch_floor(slow_h100):
    # the learned predictor's dispatch floor (kit.workload.kernel_times.isolation_floor_ms) feeds
    # every kernel time, one GPU's and the multi-GPU layer's; it had been cached by the GPU's key,
    # so the old spec's 12.7 us stayed after register_gpu (a fresh process: 29.7 us)
    from kit.predict import get_predictor
    from kit.workload.kernel_times import isolation_floor_ms

    tile = get_predictor("tile")
    before = isolation_floor_ms(tile, get_gpu("h100-sxm"))
    register_gpu(dict(slow_h100, key="review1-slow-h100", name="Review1 slow H100", aliases=[]))
    try:
        fresh = isolation_floor_ms(tile, get_gpu("review1-slow-h100"))  # the same spec, a new key
    finally:
        unregister_gpu("review1-slow-h100")
    assert fresh != pytest.approx(before)
    register_gpu(slow_h100)
    assert isolation_floor_ms(tile, get_gpu("h100-sxm")) == pytest.approx(fresh)


# -- a GPU object registered ------------------------------------------------------------------
def test_a_gpu_object_is_validated_when_registered():
    bad = dataclasses.replace(get_gpu("h100-sxm"), key="review3-bad", name="Review3 bad", aliases=(),
                              sm_count=0)
    with pytest.raises(KitError, match="sm_count must be positive"):
        register_gpu(bad)  # was: registered, then a ZeroDivisionError when priced by its key
    with pytest.raises(KitError, match="unknown GPU"):
        get_gpu("review3-bad")


# -- PCIe generations -------------------------------------------------------------------------
def test_every_pcie_generation_a_gpu_may_give_has_its_own_rate():
    from kit.hardware.gpu import PLAUSIBLE
    from kit.ops import Memcpy
    from kit.predict.roofline import roofline

    lo, hi = PLAUSIBLE["pcie_gen"]
    base = get_gpu("h100-sxm")
    times = [roofline(Memcpy(10**9, "h2d"), dataclasses.replace(base, pcie_gen=gen)).time_ms
             for gen in range(int(lo), int(hi) + 1)]
    assert all(a > b for a, b in zip(times, times[1:]))  # gen 7 had copied at gen 4's rate


# -- fields that disagree ---------------------------------------------------------------------
@pytest.mark.parametrize("change,word", [({"sm_count": 1320}, "fp32_tflops 66.9 is 0.1x"),
                                         ({"boost_clock_mhz": 198}, "fp32_tflops 66.9 is 10x"),
                                         ({"mem_bw_gbs": 3.352}, "is mem_bw_gbs in GB/s")])
def test_a_gpu_whose_fields_disagree_is_noted(change, word):
    from kit.hardware.gpu import gpu_from_dict

    spec = dict(get_gpu("h100-sxm").to_dict(), key="review3-x", **change)
    with pytest.warns(UserWarning, match=word):
        gpu_from_dict(spec, origin="test")


def test_no_catalog_gpu_is_noted():
    from kit.hardware.catalog import CATALOG_PATH, _read_entries
    from kit.hardware.gpu import gpu_from_dict

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for entry in _read_entries(CATALOG_PATH):
            gpu_from_dict(entry, origin="catalog")


# -- kit demo's text ---------------------------------------------------------------------------
def test_demo_names_the_ranks_of_its_all_reduce(monkeypatch):
    import kit.cli.cmd_op as cmd_op
    import kit.cli.cmd_predict as cmd_predict
    from kit.cli.cmd_demo import text

    monkeypatch.setattr(cmd_op, "text", lambda r: "")
    monkeypatch.setattr(cmd_predict, "text", lambda r: "")
    r = {"gpu": "h100-sxm", "system": "a100x4-nvlink", "dtype": "bf16", "gemm": {}, "gpt2_train_step": {},
         "allreduce_1gb": {"ranks": 4, "time_ms": 7.0, "algorithm": "ring", "busbw_gbs": 216.0,
                           "bound": "bandwidth"}}
    assert "over the 4 GPUs of a a100x4-nvlink" in text(r)  # had said 8 whatever the system
