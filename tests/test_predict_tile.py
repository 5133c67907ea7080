"""Tile-MLP and friends on a tiny synthetic table: seeded reproducibility, the roofline bound,
dedupe, and the learned utilisation carrying over to a GPU outside the training set."""
import numpy as np
import pandas as pd
import pytest

from kit.hardware import get_gpu, register_gpu, unregister_gpu
from kit.ops import Elementwise, Gemm, LayerNorm, Memcpy, Softmax, linear
from kit.predict.base import COLUMNS
from kit.predict.features import op_from_row
from kit.predict.training import fingerprint, train_bundle
from predict_synthetic import synthetic_frame

TINY = {"members": 2, "epochs": 1, "hidden": 16, "chooser_epochs": 1, "min_steps": 30}
GPUS = ["t4", "v100-pcie-32gb"]


@pytest.fixture(scope="module")
def frame():
    return synthetic_frame(GPUS, n=25, seed=0)


@pytest.fixture(scope="module")
def bundle(frame):
    return train_bundle(frame, GPUS, seed=3, threads=1, settings=TINY)


OPS = [Gemm(m=512, n=512, k=512), linear(1024, 768, 3072), Gemm(m=3, n=5, k=7, b=9),
       Elementwise("add", 10**6), Elementwise("gelu", 12345), Softmax(4096, 1000),
       LayerNorm(64, 4096), Softmax(1, 1)]


def test_same_seed_same_weights_other_seed_other_weights(frame, bundle):
    again = train_bundle(frame, GPUS, seed=3, threads=1, settings=TINY, direct=False)
    assert fingerprint(again) == fingerprint(bundle)
    p1 = bundle.tile.predict(OPS, "a100-pcie-40gb").latency_ms.to_numpy()
    p2 = again.tile.predict(OPS, "a100-pcie-40gb").latency_ms.to_numpy()
    assert np.array_equal(p1, p2)
    other = train_bundle(frame, GPUS, seed=4, threads=1, settings=TINY, direct=False)
    assert fingerprint(other) != fingerprint(bundle)


@pytest.mark.parametrize("gpu", ["t4", "l4", "h100-sxm", "a100-pcie-80gb"])
def test_never_below_roofline_and_band_brackets_the_prediction(bundle, gpu):
    for model in (bundle.tile, bundle.li, bundle.mlp):
        out = model.predict(OPS, gpu)
        assert list(out.columns) == COLUMNS and len(out) == len(OPS)
        assert (out.latency_ms >= out.roofline_ms * (1 - 1e-9)).all(), model.name
        assert (out.latency_p10_ms <= out.latency_ms * (1 + 1e-9)).all()
        assert (out.latency_p90_ms >= out.latency_ms * (1 - 1e-9)).all()
        assert ((out.utilisation > 0) & (out.utilisation <= 1 + 1e-9)).all()


def test_bound_holds_on_a_gpu_far_outside_the_data(bundle):
    # 100x the peak and bandwidth of a T4: utilisation is still in (0, 1], so the latency
    # stays at or above the (tiny) roofline whatever the network makes of the features
    entry = {**get_gpu("t4").to_dict(), "key": "fast-test-gpu", "name": "Fast test GPU",
             "aliases": [], "fp32_tflops": 810.0, "mem_bw_gbs": 32000.0}
    gpu = register_gpu(entry)
    try:
        out = bundle.tile.predict(OPS, gpu)
        assert (out.latency_ms >= out.roofline_ms).all()
        # the utilisation-1 time is the floor; the learned part only slows it down
        assert (out.utilisation <= 1).all()
    finally:
        unregister_gpu("fast-test-gpu")


def test_tile_reported_for_gemms_and_dedupe(bundle):
    ops = [OPS[0], OPS[3], OPS[0], OPS[0]]
    out = bundle.tile.predict(ops, "l4")
    assert out.tile[0] in {f"{m}x{n}" for m, n, _, _ in bundle.tile.chooser.vocab}
    assert out.tiles[0] > 0 and out.waves[0] >= 1
    pd.testing.assert_series_equal(out.iloc[0], out.iloc[2], check_names=False)
    assert out.latency_ms[2] == out.latency_ms[3]


def test_row_ops_report_the_launch_pytorch_makes(bundle):
    """The features keep their own row blocking; the tiles and waves reported are kit.tiling's."""
    from kit.tiling import vector_tiling

    ops = [LayerNorm(1000, 512), Softmax(4096, 1000), Softmax(300, 4096), LayerNorm(64, 4096)]
    out = bundle.tile.predict(ops, "a100-pcie-80gb")
    for i, op in enumerate(ops):
        t = vector_tiling(op, "a100-pcie-80gb")
        assert (out.tiles[i], out.waves[i], out.tile[i]) == (t.tiles, t.waves, t.tile)


def test_ops_without_a_model_fall_back_to_the_wave_model(bundle):
    from kit.hardware.system import pcie_efficiency
    from kit.predict.small_op_bounds import FLOOR_SHARE
    from kit.workload.iteration import isolation_floor_ms

    PCIE_EFFICIENCY = pcie_efficiency(get_gpu("t4").pcie_gen)
    out = bundle.tile.predict([Memcpy(2**20, "h2d"), OPS[0]], "t4")
    # the link's achievable share of its rate, plus half the dispatch floor
    low = FLOOR_SHARE * isolation_floor_ms(bundle.tile, get_gpu("t4"))
    assert out.latency_ms[0] == pytest.approx(low + out.roofline_ms[0] / PCIE_EFFICIENCY)
    assert out.latency_p10_ms[0] == pytest.approx(low + out.roofline_ms[0])
    assert out.latency_p10_ms[0] < out.latency_ms[0] < out.latency_p90_ms[0]
    assert out.tile[0] == ""


def test_an_embedding_or_host_copy_takes_the_least_isolated_time(bundle):
    """They had no floor: a one-row lookup at 5 fs, a one-byte host-to-device copy at 16 fs."""
    from kit.ops import EmbeddingBag
    from kit.hardware.system import pcie_efficiency
    from kit.predict.small_op_bounds import FLOOR_SHARE
    from kit.workload.iteration import isolation_floor_ms

    PCIE_EFFICIENCY = pcie_efficiency(get_gpu("t4").pcie_gen)
    floor = isolation_floor_ms(bundle.tile, get_gpu("t4"))
    assert floor > 0
    tiny = [EmbeddingBag(1, 1, 1, 1), Memcpy(1, "h2d"), Memcpy(1, "d2h")]
    out = bundle.tile.predict(tiny, "t4")
    assert (out.latency_ms >= FLOOR_SHARE * floor).all() and (out.latency_ms > out.roofline_ms).all()
    big = bundle.tile.predict([Memcpy(2**30, "h2d")], "t4").iloc[0]
    # a long copy: its bytes at the link's achievable share set it
    assert big.latency_ms == pytest.approx(big.roofline_ms / PCIE_EFFICIENCY, rel=1e-3)


@pytest.mark.parametrize("gpu", ["t4", "v100-sxm2-16gb", "a100-sxm4-80gb", "h100-sxm"])
def test_an_embedding_lookup_or_host_copy_never_gets_faster_as_it_grows(bundle, gpu):
    """The floor only lifted a prediction under it, so a lookup of 128 rows a bag came out 1.6x
    faster than one of 100 on a V100 (fp16), and a 262,144-byte host copy 1.4x faster than a
    131,072-byte one; above the floor both ran at the full bandwidth, with a zero-width band."""
    from kit.ops import EmbeddingBag

    lookups = [EmbeddingBag(64, 100_000, 128, p, "fp16" if gpu != "t4" else "fp32")
               for p in (1, 10, 50, 100, 128, 1000, 10_000)]
    copies = [Memcpy(n, "h2d") for n in (1, 1024, 65_536, 131_072, 262_144, 2**24, 2**30)]
    for ops in (lookups, copies):
        out = bundle.tile.predict(ops, gpu)
        lat = out.latency_ms.to_numpy(float)
        assert (np.diff(lat) >= -1e-12).all(), (gpu, lat.tolist())
        big = out.iloc[-1]
        assert big.roofline_ms / big.latency_ms < 0.95  # no stream at the full bandwidth
        assert big.latency_p10_ms < big.latency_ms < big.latency_p90_ms


def test_a_device_copy_never_gets_faster_as_it_grows(bundle):
    """Scaled to its exact bytes, the proxy copy's rounding to whole fp32 elements had made a
    9-byte copy faster than an 8-byte one, and a 1-byte one a quarter of the floor."""
    sizes = [1, 2, 4, 7, 8, 9, 15, 16, 17, 1000, 4096, 10**6]
    lat = bundle.tile.predict([Memcpy(n, "d2d") for n in sizes], "t4").latency_ms.to_numpy(float)
    assert (np.diff(lat) >= -1e-12).all(), lat.tolist()


@pytest.mark.parametrize("numel", [1, 1024, 10**8])
def test_dropout_and_a_device_copy_take_their_learned_elementwise_pass(bundle, numel):
    """As a captured model costs them (kit.ops.elementwise_proxy): the learned pass times the
    bytes they move, with its band and floor, never under their roofline. A 1,024-element
    dropout had come out at 3 ns, with a zero-width band (the bare wave model)."""
    from kit.ops import Dropout, elementwise_proxy
    from kit.workload.mapping import _dropout

    ops = [Dropout(numel, "fp16", 0.1), Memcpy(4 * numel, "d2d")]
    out = bundle.tile.predict(ops, "t4")
    for i, op in enumerate(ops):
        base, scale = elementwise_proxy(op)
        assert scale * base.bytes == pytest.approx(op.bytes)
        row = bundle.tile.predict([base], "t4").iloc[0]
        assert out.latency_ms[i] == pytest.approx(scale * row.latency_ms)
        assert out.latency_p90_ms[i] == pytest.approx(scale * row.latency_p90_ms)
        assert out.latency_ms[i] >= out.roofline_ms[i]
        assert out.latency_p10_ms[i] <= out.latency_ms[i] < out.latency_p90_ms[i]
    import torch

    derived = _dropout([torch.empty(numel, dtype=torch.float16, device="meta"), 0.1], "fp16", 1.0)
    assert derived.parts == (elementwise_proxy(ops[0])[0],)
    assert derived.scale == pytest.approx(elementwise_proxy(ops[0])[1])


def test_utilisation_carries_to_an_unseen_gpu():
    # the synthetic rule has one utilisation (0.6) on every GPU plus a 6 µs overhead: a model
    # fitted on T4 + V100 should carry it to an A100 it never saw far better than the roofline
    train = synthetic_frame(GPUS, n=80, seed=1)
    b = train_bundle(train, GPUS, seed=0, threads=1, direct=False,
                     settings={**TINY, "members": 1, "hidden": 32, "min_steps": 400})
    test = synthetic_frame(("a100-pcie-40gb",), n=30, seed=9)
    ops = [op_from_row(r) for r in test.to_dict("records")]
    pred = b.tile.predict(ops, "a100-pcie-40gb")
    ape = np.abs(pred.latency_ms.to_numpy() / test.latency_ms.to_numpy() - 1)
    roof = np.abs(pred.roofline_ms.to_numpy() / test.latency_ms.to_numpy() - 1)
    assert np.median(ape) < 0.3
    assert np.median(ape) < 0.5 * np.median(roof)


def test_mixed_dtypes_keep_their_order(bundle):
    ops = [Gemm(m=256, n=256, k=256, dtype="fp16"), Gemm(m=256, n=256, k=256), OPS[3]]
    out = bundle.tile.predict(ops, "a100-pcie-40gb")
    # fp16 runs against the tensor-core peak, so its roofline is far below the fp32 one
    assert out.roofline_ms[0] < out.roofline_ms[1] / 5
    assert (out.latency_ms >= out.roofline_ms).all()


def test_training_leaves_torch_deterministic_mode_as_it_found_it(frame):
    # train_bundle turned deterministic algorithms on for the rest of the process, which changes
    # how torch records some ops later (bilinear upsampling became _unsafe_index)
    import torch

    before = torch.are_deterministic_algorithms_enabled()
    try:
        for state in (False, True):
            torch.use_deterministic_algorithms(state)
            train_bundle(frame, GPUS, seed=3, threads=1, settings=TINY, direct=False)
            assert torch.are_deterministic_algorithms_enabled() is state
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("gpu,dtype", [("t4", "fp32"), ("h100-sxm", "bf16"), ("a100-sxm4-80gb", "fp16")])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_never_gets_faster_as_the_head_grows(bundle, gpu, dtype, causal):
    """The small-head factor (heads under 128, fitted on the H200) scaled the curve of the head's
    own roofline, so a head of 127 came out 1.21x slower than one of 128, which the kernels pad
    it to."""
    from kit.ops import Attention

    heads = (32, 64, 80, 96, 112, 120, 127, 128, 160, 256)
    ops = [Attention(8, 32, 2048, 2048, h, dtype=dtype, causal=causal) for h in heads]
    lat = bundle.tile.predict(ops, gpu).latency_ms.to_numpy(float)
    assert (np.diff(lat) >= -1e-12).all(), (gpu, dtype, causal, lat.tolist())


@pytest.mark.parametrize("gpu,dtype,seq", [("h100-sxm", "bf16", (128, 32768)), ("l4", "fp32", (512, 8192)),
                                           ("h100-sxm", "bf16", (4096, 4096))])
def test_a_narrow_causal_head_is_never_slower_than_its_padded_twin(bundle, gpu, dtype, seq):
    """The padded cap took the twin's causal time alone, not capped by its unmasked one as the
    twin itself is: a causal head of 127 over 32,768 keys came out 1.20x a head of 128 (review)."""
    from kit.ops import Attention

    ops = [Attention(2, 16, seq[0], seq[1], h, dtype=dtype, causal=True) for h in (64, 120, 127, 128)]
    lat = bundle.tile.predict(ops, gpu).latency_ms.to_numpy(float)
    assert (np.diff(lat) >= -1e-12).all(), lat.tolist()


def test_a_gh200_host_copy_has_a_band(bundle):
    """Its C2C link had no efficiency, so its band was zero-width (review)."""
    out = bundle.tile.predict([Memcpy(n, "h2d") for n in (262_144, 10**10)], "gh200")
    assert (out.latency_p90_ms > out.latency_ms).all() and (out.latency_p10_ms <= out.latency_ms).all()
