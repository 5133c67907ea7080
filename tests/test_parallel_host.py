"""HostModel terms of kit.parallel (per-micro-batch host work, per-rank collective cost, the
unsplit LM head's scale) against hand computations, and the shipped megatron-a100 profile on
vTrain's held-out rows."""
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from kit import ops
from kit.hardware.system import get_system
from kit.parallel import GPTSpec, HostModel, Layout, predict_parallel
from kit.parallel.costs import Coster, Phase
from kit.parallel.gpt import Block
from kit.predict import get_predictor

torch.set_num_threads(1)
TINY = GPTSpec(layers=2, hidden=256, heads=4, seq=128, vocab=1000, name="tiny")
SHARED = Path(os.environ.get("KIT_SHARED", Path(__file__).resolve().parents[2] / "shared"))
VTRAIN = SHARED / "data/vtrain/ground_truth_single.csv"


def test_microbatch_host_work_adds_once_per_forward_when_host_bound():
    """Host-bound (1 ms per kernel): each of the m forward passes pays microbatch_ms more."""
    lay = Layout(micro_batch=1, global_batch=4, optimizer_step=False)
    base = HostModel(launch_us=1000.0, p2p_sync=False)
    extra = HostModel(launch_us=1000.0, p2p_sync=False, microbatch_ms=3.0)
    t0 = predict_parallel(TINY, "dgx-a100", lay, host=base)["iteration_ms"]
    t1 = predict_parallel(TINY, "dgx-a100", lay, host=extra)["iteration_ms"]
    assert t1 - t0 == pytest.approx(4 * 3.0, rel=1e-9)


def test_collective_host_cost_grows_with_its_group():
    host = HostModel(launch_us=5.0, collective_us=2.0, collective_rank_us=10.0)
    lay = Layout(tp=4)
    c = Coster(lay, get_system("dgx-a100"), "roofline", None, host)
    ph = Phase()
    blocks = [Block("x", [ops.Elementwise("add", 1 << 20, "fp16")]),
              Block("ar", comm=("allreduce", 1 << 20, "tp"))]
    c.predict_ops(blocks[0].ops)
    c.add(ph, blocks, 0)
    assert ph.seq_host_ms == pytest.approx([5e-3, (2.0 + 10.0 * 3) * 1e-3])
    assert ph.host_total_ms == pytest.approx((5.0 + 32.0) * 1e-3)


def test_full_vocab_scale_slows_only_the_unsplit_lm_head():
    """At TP = 1 the head's three GEMMs (logits, data and weight gradient) take scale x their
    predicted time; at TP = 2 nothing changes."""
    lay = Layout(micro_batch=2)
    tok, h, v = 2 * TINY.seq, TINY.hidden, 1024  # vocab 1000 padded to a multiple of 128
    gemms = [ops.linear(tok, h, v, "fp16"), ops.Gemm(m=tok, n=h, k=v, dtype="fp16", kind="linear",
                                                     shared_rhs=True),
             ops.Gemm(m=h, n=v, k=tok, dtype="fp16", kind="linear", shared_rhs=True)]
    gpu = get_system("dgx-a100").gpu
    gemm_ms = float(get_predictor("roofline").predict(gemms, gpu).latency_ms.sum())
    runs = {}
    for scale in (1.0, 3.0):
        host = HostModel(launch_us=0.0, p2p_sync=False, full_vocab_scale=scale)
        for tp in (1, 2):
            r = predict_parallel(TINY, "dgx-a100", lay.with_(tp=tp), predictor="roofline", host=host,
                                 graph=False)
            mb = r["per_microbatch_ms"][-1]
            runs[scale, tp] = mb["fwd_ms"] + mb["bwd_ms"]
    assert runs[3.0, 1] - runs[1.0, 1] == pytest.approx(2.0 * gemm_ms, rel=1e-6)
    assert runs[3.0, 2] == pytest.approx(runs[1.0, 2], rel=1e-12)


@pytest.mark.skipif(not VTRAIN.exists(), reason="shared vTrain data not present")
def test_shipped_megatron_profile_on_held_out_vtrain_rows():
    """The fitted profile predicts a seeded sample of the test half (rows it was not fitted on)
    within a mean APE of 8% (the full test half: see benchmarks/vtrain_megatron.py)."""
    from benchmark_modules import load_benchmark

    vm = load_benchmark("vtrain_megatron")
    import pandas as pd

    from kit.parallel.profiles import get_profile

    _, test = vm.split(pd.read_csv(VTRAIN))
    rows = test.sample(60, random_state=1)
    pred = vm.predict_rows(rows, get_profile("megatron-a100"))
    ape = np.abs(pred - rows.iter_time_ms.to_numpy()) / rows.iter_time_ms.to_numpy()
    assert ape.mean() < 0.08
