"""A GPU that outdoes a training GPU in every resource, with the same SM design, is never
predicted slower than it (kit.predict.sibling_bound)."""
from dataclasses import replace

import numpy as np
import pytest

from kit.hardware import get_gpu
from kit.ops import Elementwise, Gemm, LayerNorm, Softmax
from kit.predict.sibling_bound import dominated_training_gpus, dominates

TRAIN = ["p4", "p100-pcie-16gb", "t4", "v100-pcie-32gb", "a100-pcie-40gb"]


def test_dominance_needs_the_same_sm_design_and_at_least_every_resource():
    pcie = get_gpu("a100-pcie-40gb")
    assert dominates(get_gpu("a100-sxm4-40gb"), pcie) and not dominates(pcie, get_gpu("a100-sxm4-40gb"))
    assert not dominates(pcie, pcie)  # itself: its own rows set it
    assert not dominates(get_gpu("h100-sxm"), pcie)  # another SM design
    assert not dominates(replace(get_gpu("a100-sxm4-40gb"), key="x", mem_bw_gbs=1000.0), pcie)
    assert not dominates(replace(get_gpu("a100-sxm4-40gb"), key="x", tdp_w=200.0), pcie)
    assert not dominates(replace(get_gpu("a100-sxm4-40gb"), key="x", bf16_tflops=None), pcie)
    assert [g.key for g in dominated_training_gpus("a100-pcie-80gb", TRAIN)] == ["a100-pcie-40gb"]
    assert dominated_training_gpus("a100-pcie-40gb", TRAIN) == []
    assert dominated_training_gpus("l4", TRAIN) == []


def _ops():
    rng = np.random.default_rng(0)
    ops = []
    for _ in range(50):  # 250 ops: each predicted on two GPUs, with their padded twins
        m, n, k = (int(2 ** rng.uniform(0, 13)) for _ in range(3))
        b = int(2 ** rng.uniform(0, 5))
        ops.append(Gemm(m, n, k, b=b, kind="bmm"))
        ops.append(Gemm(m, n, k, kind="linear", shared_rhs=True, dtype=["fp32", "fp16"][_ % 2]))
        ops.append(Elementwise("add", int(2 ** rng.uniform(8, 26)), "fp32", inputs=2))
        rows, cols = int(2 ** rng.uniform(4, 16)), int(2 ** rng.uniform(4, 13))
        ops += [Softmax(rows, cols, "fp32"), LayerNorm(rows, cols, "fp32")]
    return ops


@pytest.mark.parametrize("gpu, sibling", [("a100-sxm4-40gb", "a100-pcie-40gb"),
                                          ("a100-pcie-80gb", "a100-pcie-40gb"),
                                          ("v100-sxm2-32gb", "v100-pcie-32gb")])
def test_a_dominating_gpu_is_never_predicted_slower_than_its_training_sibling(gpu, sibling):
    """An A100-SXM4-40GB (400 W) had come out 31% slower than the A100-PCIe-40GB (250 W) on a
    Linear of 8 tokens, 512 -> 2048, the power features flipping the tile the chooser picks."""
    from kit.predict.tile_mlp import TilePredictor

    tp = TilePredictor.shipped()
    ops = _ops()
    mine = tp.predict(ops, gpu)
    theirs = tp.predict(ops, sibling)
    assert (mine.latency_ms.to_numpy() <= theirs.latency_ms.to_numpy() * (1 + 1e-9)).all()
    assert (mine.latency_ms >= mine.roofline_ms * (1 - 1e-9)).all()
    assert ((mine.utilisation > 0) & (mine.utilisation <= 1 + 1e-9)).all()
    assert (mine.latency_p10_ms <= mine.latency_ms * (1 + 1e-9)).all()
    assert (mine.latency_p90_ms >= mine.latency_ms * (1 - 1e-9)).all()
    # the bound binds somewhere, or this test would not test it
    raw = tp.predict_unbounded(ops, gpu)
    assert (raw.latency_ms.to_numpy() > theirs.latency_ms.to_numpy() * (1 + 1e-6)).any()


def test_a_model_on_the_sxm4_card_is_not_slower_than_on_the_pcie_card():
    """A 2-layer LSTM (hidden 512, batch 8, 64 steps) in inference had taken 6.45 ms on the
    A100-SXM4-40GB against 4.88 ms on the A100-PCIe-40GB."""
    import torch.nn as nn

    from kit.api import predict_model

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(512, 512, num_layers=2, batch_first=True)

        def forward(self, x):
            return self.rnn(x)[0]

    def step(gpu):
        import torch

        return predict_model(Net(), gpu, mode="inference", inputs=(torch.randn(8, 64, 512),)).total_ms

    assert step("a100-sxm4-40gb") <= step("a100-pcie-40gb") * (1 + 1e-9)


@pytest.mark.parametrize("mode", ["train", "inference"])
def test_a_zoo_model_in_the_stream_is_not_slower_on_the_dominating_gpu(mode):
    """In the stream each kernel sheds the dispatch floor (kit.workload.kernel_times): the
    dominating GPU sheds its training sibling's, so no kernel of it is slower there in the
    stream than on the sibling."""
    from kit.api import predict_model

    for gpu, sibling in (("a100-sxm4-40gb", "a100-pcie-40gb"), ("v100-sxm2-32gb", "v100-pcie-32gb")):
        mine = predict_model("gpt2", gpu, mode=mode, batch=2, seq=256)
        theirs = predict_model("gpt2", sibling, mode=mode, batch=2, seq=256)
        assert mine.kernel_ms <= theirs.kernel_ms * (1 + 1e-9), (gpu, mine.kernel_ms, theirs.kernel_ms)


def test_the_dominating_gpu_sheds_its_training_siblings_floor():
    """In the stream a kernel sheds the dispatch floor its isolated time carries: a bounded one
    carries its sibling's, an unbounded one at most its sibling's time, so shedding the
    sibling's floor keeps every kernel no slower than there in the stream too. Read off the
    bounded predictions, the probe had come out between the two floors: llama3-8b's decode
    elementwise time on an A100-SXM4-80GB rose 2.24 -> 2.32 ms when the bound came in."""
    from kit.ops import Elementwise
    from kit.predict.tile_mlp import TilePredictor
    from kit.workload.kernel_times import FLOOR_PROBE_NUMEL, in_stream_ms, isolation_floor_ms

    tp = TilePredictor.shipped()
    probe = [Elementwise("add", FLOOR_PROBE_NUMEL, "fp32", inputs=2)]
    for gpu, sibling in (("a100-sxm4-80gb", "a100-pcie-40gb"), ("v100-sxm2-32gb", "v100-pcie-32gb"),
                         ("a100-sxm4-40gb", "a100-pcie-40gb")):
        row = tp.predict_unbounded(probe, sibling).iloc[0]
        assert isolation_floor_ms(tp, get_gpu(gpu)) == pytest.approx(row.latency_ms - row.roofline_ms, rel=1e-12)
        ops = _ops()
        mine, theirs = tp.predict(ops, gpu), tp.predict(ops, sibling)
        stream = [in_stream_ms(p.latency_ms.to_numpy(), p.roofline_ms.to_numpy(), isolation_floor_ms(tp, get_gpu(g)))
                  for p, g in ((mine, gpu), (theirs, sibling))]
        assert (stream[0] <= stream[1] * (1 + 1e-9)).all()


def test_the_band_is_bounded_too():
    """Capped, an op had kept its own wider band: gpt2's step the same 5.7 ms on both A100s, its
    p90 7.7 ms on the SXM4 against 5.8 on the PCIe card."""
    from kit.predict.tile_mlp import TilePredictor

    tp = TilePredictor.shipped()
    ops = _ops()
    mine, theirs = tp.predict(ops, "a100-sxm4-40gb"), tp.predict(ops, "a100-pcie-40gb")
    assert (mine.latency_p90_ms.to_numpy() <= theirs.latency_p90_ms.to_numpy() * (1 + 1e-9)).all()
    assert (mine.latency_p10_ms.to_numpy() <= theirs.latency_p10_ms.to_numpy() * (1 + 1e-9)).all()


def test_split_k_false_is_kept_by_the_padding_cap():
    """predict(split_k=False) had returned split rows, the padded twins predicted with it on."""
    from kit.predict.tile_mlp import TilePredictor

    tp = TilePredictor.shipped()
    rows = tp.predict([Gemm(8, 576, 100352), Gemm(2, 1024, 65536)], "a100-pcie-80gb", split_k=False)
    assert (rows.split_k == 1).all()


def test_the_latency_cache_key_holds_the_spec_of_the_gpu_that_bounds(tmp_path, monkeypatch):
    """A --gpu-file that changed the A100-PCIe-40GB had left the SXM4's cached step stale."""
    from kit.hardware.catalog import register_gpu
    from kit.workload import latency_cache as L

    class Graph:
        meta = {"cache_key": "x"}

    before = L.key_for(Graph(), "eager", get_gpu("a100-sxm4-40gb"), "tile")
    mine = replace(get_gpu("a100-pcie-40gb"), tdp_w=300.0)
    monkeypatch.setattr("kit.hardware.catalog._user_gpus", {})
    register_gpu(mine)
    assert L.key_for(Graph(), "eager", get_gpu("a100-sxm4-40gb"), "tile") != before


def test_kit_op_says_when_a_cap_set_the_time(capsys):
    """kit op's source line had never said when the training-GPU or the padding cap set the time."""
    from kit.api import predict_op
    from kit.cli import main

    # (a shape where the cap binds with the shipped weights: 8 x 2048 x 512 before the P4's
    # Linear training rows were left out)
    sib = predict_op(Gemm(8, 2048, 2048, kind="linear", shared_rhs=True), "a100-sxm4-40gb")
    mine = predict_op(Gemm(8, 2048, 2048, kind="linear", shared_rhs=True), "a100-pcie-40gb")
    assert sib["latency_ms"] == pytest.approx(mine["latency_ms"], rel=1e-9)
    assert sib["source"].startswith("its time on the a100-pcie-40gb")
    padded = predict_op(Gemm(2, 2048, 8192, kind="linear", shared_rhs=True), "t4")
    assert padded["source"].startswith("the time of a twin with more rows")
    assert main(["op", "linear", "--tokens", "2", "--in-features", "8192", "--out-features", "2048",
                 "--gpu", "t4"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("source")]
    assert len(lines) == 1 and "twin with more rows" in lines[0]


def test_a_training_card_replaced_under_its_own_key_is_bounded_by_the_training_card():
    """A GPU object given directly (dataclasses.replace of a training card, not registered) keeps
    the card's key. Taken for the training card by its key, it was left unbounded: an
    A100-PCIe-40GB at 400 W came out slower than the 250 W card on 216 of 263 ops, up to 2.46x."""
    from kit.predict.tile_mlp import TilePredictor

    tp = TilePredictor.shipped()
    mine = replace(get_gpu("a100-pcie-40gb"), tdp_w=400.0)
    assert [g.key for g in tp.dominated_training_gpus(mine)] == ["a100-pcie-40gb"]
    assert tp.dominated_training_gpus(replace(get_gpu("a100-pcie-40gb"))) == []  # the same spec is the card
    ops = _ops()[:60]
    got, theirs = tp.predict(ops, mine), tp.predict(ops, "a100-pcie-40gb")
    for col in ("latency_ms", "latency_p10_ms", "latency_p90_ms"):
        assert (got[col].to_numpy() <= theirs[col].to_numpy() * (1 + 1e-9)).all(), col
    assert (tp.predict_unbounded(ops, mine).latency_ms.to_numpy() > theirs.latency_ms.to_numpy() * 1.01).any()


def test_a_card_over_a_training_gpu_runs_the_dtypes_that_gpu_lacks():
    """A --gpu-file Turing card with bf16 dominates the T4 (a peak the weaker card lacks is
    free), and the T4's answers bound its final ones; every bf16 op on it had failed with 't4 has
    no bf16 support'. Now the T4 bounds the rows it can run and no others, in a mixed batch too."""
    from kit.api import predict_op
    from kit.hardware import register_gpu, unregister_gpu
    from kit.predict.tile_mlp import TilePredictor

    tp = TilePredictor.shipped()
    entry = get_gpu("t4").to_dict()
    entry.update(key="t4-bf16-test", name="T4 with bf16 (test)", aliases=[],
                 bf16_tflops=entry["fp16_tflops"], mem_bw_gbs=2 * entry["mem_bw_gbs"])
    ops = [Gemm(512, 512, 512, dtype="bf16"), Gemm(4096, 8, 4096, dtype="fp16"),
           Elementwise("add", 10**6, "bf16"), Elementwise("add", 10**7, "fp16"), Softmax(4096, 1024, "bf16")]
    try:
        card = register_gpu(entry)
        assert get_gpu("t4") in tp.dominated_training_gpus(card)
        out = tp.predict(ops, card)
        fp16 = [i for i, op in enumerate(ops) if op.dtype == "fp16"]
        on_t4 = tp.predict([ops[i] for i in fp16], "t4").latency_ms.to_numpy()
        assert (out.latency_ms.to_numpy()[fp16] <= on_t4 * (1 + 1e-9)).all()  # still bounded
        assert np.isfinite(out[["latency_ms", "latency_p10_ms", "latency_p90_ms"]].to_numpy(float)).all()
        assert (out.latency_p10_ms <= out.latency_ms).all() and (out.latency_ms <= out.latency_p90_ms).all()
        alone = tp.predict([ops[0]], card)  # a bf16 op alone: the T4 bounds nothing
        assert alone.latency_ms.iloc[0] == pytest.approx(tp.predict_unbounded([ops[0]], card).latency_ms.iloc[0])
        assert predict_op(ops[0], card.key, predictor="tile")["latency_ms"] > 0  # kit op's source line
    finally:
        unregister_gpu("t4-bf16-test")


def test_a_partial_reference_can_cap_every_row_it_runs():
    """_reference's frame for a mixed batch (rows of a dtype the training GPU lacks are NaN) had
    object columns, and where it bound a row cap_as wrote its tiles, waves and split into the
    answer's int64 columns: pandas raised "Invalid value ... for dtype 'int64'". Here the
    T4's times are scaled down so it binds every row it runs."""
    from kit.hardware import register_gpu, unregister_gpu
    from kit.ops import Memcpy
    from kit.predict.gemm_bounds import cap_as
    from kit.predict.tile_mlp import TilePredictor

    tp = TilePredictor.shipped()
    entry = get_gpu("t4").to_dict()
    entry.update(key="t4-bf16-cap-test", name="T4 with bf16 (cap test)", aliases=[],
                 bf16_tflops=entry["fp16_tflops"])
    ops = [Gemm(512, 512, 512, dtype="bf16"), Gemm(4096, 8, 4096, dtype="fp16"), Memcpy(10**7, "h2d"),
           Elementwise("add", 10**7, "fp16"), Softmax(4096, 1024, "bf16")]
    try:
        card = register_gpu(entry)
        ref = tp._reference(ops, get_gpu("t4"), True)
        runs = [getattr(op, "dtype", None) != "bf16" for op in ops]
        assert list(np.isnan(ref.latency_ms.to_numpy(float))) == [not r for r in runs]
        for c in ("latency_ms", "latency_p10_ms", "latency_p90_ms"):
            ref[c] = ref[c] * 0.01
        own = tp.predict_unbounded(ops, card, True).copy()
        out = cap_as(own, ref)
        lat = out.latency_ms.to_numpy(float)
        want = np.where(runs, ref.latency_ms.to_numpy(float), own.latency_ms.to_numpy(float))
        assert lat == pytest.approx(want)  # bound where the T4 runs the row, its own elsewhere
        bound = np.flatnonzero(runs)
        assert list(out.tile.iloc[bound]) == list(ref.tile.iloc[bound])
        assert (out.waves.to_numpy(float)[bound] == ref.waves.to_numpy(float)[bound]).all()
    finally:
        unregister_gpu("t4-bf16-cap-test")
