"""The warm path's faster forms give exactly what the slower ones gave (the speed goal of a warm
prediction: benchmarks/whole_model.py): carried_nodes asks each distinct op once and walks only
the ways a carried curve can count, the small-op bounds read their rungs' arrays without a frame
around them, and the band's transfer scale is found once per GPU within a call. Each is checked
against an independent slow reference over varied inputs, to the last bit."""
from dataclasses import replace

import numpy as np
import pytest

from kit.hardware import get_gpu
from kit.ops import Attention, Elementwise, Gemm, LayerNorm, Softmax
from kit.predict import get_predictor
from kit.predict.base import dedupe, expand
from kit.predict.features import gpu_distance
from kit.predict.small_op_bounds import _raw_predictions
from kit.predict.tensor_core import attention_curve_weight
from kit.workload.carried import carried_nodes, curve_tag


def carried_nodes_leaf_by_leaf(leaves, gpu, fallbacks=()):
    """The reference: every leaf in turn, its tag and weight asked afresh."""
    ops, owner, scale, option = leaves
    way_tag, weight = {}, {}
    for op, node, s, k in zip(ops, owner, scale, option):
        tag = None if type(op).__name__ in fallbacks else curve_tag(op, gpu)
        key = (int(node), int(k))
        way_tag[key] = tag if way_tag.get(key, tag) == tag else None
        w = weight.setdefault(key, [0.0, 0.0])
        share = float(attention_curve_weight(op.seq_q)) if isinstance(op, Attention) else 1.0
        w[0] += float(s) * share
        w[1] += float(s)
    return {key: (tag, weight[key][0] / weight[key][1] if weight[key][1] > 0 else 1.0)
            for key, tag in way_tag.items() if tag is not None}


# GEMMs on a carried curve (bf16 aligned off the H200), FP32 GEMMs and adds on none, attention
# of 2 to 1024 queries (a share under 1 below 128), one query (its roofline: no curve)
POOL = ([Gemm(m=4096, n=4096, k=4096, dtype="bf16"), Gemm(m=512, n=1024, k=2048, b=4, dtype="bf16"),
         Gemm(m=4096, n=4096, k=4096), Elementwise("add", 1 << 20, "bf16"), Elementwise("gelu", 4096)]
        + [Attention(b=2, heads=8, seq_q=q, seq_kv=1024, head_dim=64, dtype="bf16", causal=True)
           for q in (1, 2, 5, 64, 1024)])


def random_leaves(rng, n_nodes):
    ops, owner, scale, option = [], [], [], []
    for node in range(n_nodes):
        for k in range(int(rng.integers(1, 4))):
            for _ in range(int(rng.integers(1, 4))):
                ops.append(POOL[int(rng.integers(len(POOL)))])
                owner.append(node)
                scale.append(float(rng.choice([1.0, 2.0, 0.5, rng.uniform(0.1, 3.0)])))
                option.append(k)
    return ops, np.array(owner), np.array(scale), np.array(option)


@pytest.mark.parametrize("gpu", ["a100-pcie-80gb", "mi300x", "h200", "l4"])
@pytest.mark.parametrize("fallbacks", [{}, {"Gemm": "tile failed"}, {"Attention": "tile failed"}])
def test_carried_nodes_are_the_leaf_by_leaf_ones(gpu, fallbacks):
    gpu = get_gpu(gpu)
    rng = np.random.default_rng(7)
    counted = 0
    for n_nodes in (0, 1, 3, 40, 120):
        leaves = random_leaves(rng, n_nodes)
        want = carried_nodes_leaf_by_leaf(leaves, gpu, fallbacks)
        got = carried_nodes(leaves, gpu, fallbacks)
        # in the same order too: carried_ms sums by it
        assert list(got.items()) == list(want.items())
        counted += len(want)
    if gpu.key == "a100-pcie-80gb" and not fallbacks:
        assert counted > 20  # the inputs reach the counted ways, mixed ones among them


def test_a_way_mixing_a_carried_leaf_with_another_counts_nowhere():
    gpu = get_gpu("a100-pcie-80gb")
    g, e = POOL[0], POOL[3]
    # node 0 option 0 mixes: its add's leaf comes after the GEMM's, far from it in the list
    leaves = ([g, g, e, g, e], np.array([0, 1, 2, 0, 1]), np.ones(5), np.array([0, 0, 0, 0, 1]))
    assert carried_nodes(leaves, gpu) == {(0, 0): ("h200 bf16", 1.0), (1, 0): ("h200 bf16", 1.0)}
    leaves = ([g, e, g], np.array([0, 1, 0]), np.ones(3), np.array([0, 0, 0]))
    assert carried_nodes(leaves, gpu) == {(0, 0): ("h200 bf16", 1.0)}
    leaves = ([g, g, e], np.array([0, 1, 0]), np.ones(3), np.array([0, 0, 0]))
    assert carried_nodes(leaves, gpu) == {(1, 0): ("h200 bf16", 1.0)}


@pytest.fixture(scope="module")
def tile():
    return get_predictor("tile")


# small and large vector ops (under one wave, past several: the bounds' rungs), mixed dtypes in
# one batch (one batch per dtype, put back in order), repeats, and GEMMs
VECTOR = {"elementwise": [Elementwise("gelu", 37), Elementwise("add", 4096, "fp16", inputs=2),
                          Elementwise("gelu", 37), Elementwise("mul", 3_000_001), Elementwise("relu", 683_261, "fp16"),
                          Elementwise("add", 1 << 24, "fp16", inputs=2)],
          "softmax": [Softmax(13, 1025), Softmax(4096, 1024, "fp16"), Softmax(1, 50257), Softmax(13, 1025)],
          "layernorm": [LayerNorm(4, 768), LayerNorm(17, 128, "fp16"), LayerNorm(8192, 1600), LayerNorm(4, 768)],
          "gemm": [Gemm(m=300, n=700, k=900, b=3), Gemm(m=64, n=4096, k=4096, dtype="fp16"),
                   Gemm(m=1, n=4096, k=1024)]}


@pytest.mark.parametrize("gpu", ["a100-pcie-40gb", "t4", "l4", "mi210", "h100-sxm"])
@pytest.mark.parametrize("cls", sorted(VECTOR))
def test_a_class_batch_as_arrays_is_its_frame_columns(tile, gpu, cls):
    gpu = get_gpu(gpu)
    ops = VECTOR[cls]
    frame = tile._predict_class(cls, ops, gpu)
    arrays = tile._predict_class(cls, ops, gpu, frame=False)
    assert sorted(arrays) == ["latency_ms", "latency_p10_ms", "latency_p90_ms"]
    for c, values in arrays.items():
        assert np.array_equal(np.asarray(values, dtype=float), frame[c].to_numpy(dtype=float)), c


@pytest.mark.parametrize("flag", ["_raw_ladder", "_raw_rows", "_raw_waves"])
@pytest.mark.parametrize("gpu", ["a100-pcie-40gb", "mi210", "h100-sxm"])
def test_raw_predictions_are_the_framed_ones(tile, gpu, flag):
    gpu = get_gpu(gpu)
    for cls in ("elementwise", "softmax", "layernorm"):
        ops = VECTOR[cls] + VECTOR[cls][::-1]
        got = _raw_predictions(tile, flag, cls, ops, gpu)
        assert getattr(tile, flag) is False
        # the reference: the frame of the distinct ops, spread back over ops, with the flag set
        unique, where = dedupe(ops)
        setattr(tile, flag, True)
        try:
            want = expand(tile._predict_class(cls, unique, gpu), where)
        finally:
            setattr(tile, flag, False)
        for c in ("latency_ms", "latency_p10_ms", "latency_p90_ms"):
            assert np.array_equal(got[c], want[c].to_numpy(dtype=float)), (cls, c)


def test_the_transfer_scale_within_a_call_is_each_gpus_own(tile):
    near, train = tile.band["near_distance"], tile.band["train_gpus"]
    gpus = [get_gpu(g) for g in ("a100-pcie-40gb", "a100-pcie-80gb", "mi210", "p100-sxm2-16gb", "l4", "a100-pcie-80gb")]
    want = [min(1.0, gpu_distance(g, train) / near) for g in gpus]
    assert want[0] == 0.0 and want[4] == 1.0 and len(set(want)) == 5  # a training GPU, a far one, three between
    with tile._call_scope():  # one call: each GPU's scale found once, never another's
        got = [tile.transfer_scale(g) for g in gpus]
        again = [tile.transfer_scale(g.key) for g in gpus]
    assert got == want and again == want
    assert [tile.transfer_scale(g) for g in gpus] == want  # outside a call: computed


def test_the_transfer_scale_within_a_call_keys_a_gpu_by_its_spec_not_its_key(tile):
    """One call asks both a training card and a GPU object that replaces it under its own key (a
    --gpu-file card, or dataclasses.replace: kit.predict.sibling_bound bounds it by the card in
    the same call): each gets its own scale. Keyed on the GPU's key, the card's 0 had been served
    for the replacement, or the replacement's for the card, whichever came first."""
    near, train = tile.band["near_distance"], tile.band["train_gpus"]
    card = get_gpu("a100-pcie-40gb")
    mine = replace(card, tdp_w=300.0)  # the same key and name, 50 W more
    twin = replace(get_gpu("h100-sxm"), key="r1-twin", name="R1 Twin", aliases=())  # another name, same spec
    gpus = [mine, card, twin, get_gpu("h100-sxm"), mine]
    want = [min(1.0, gpu_distance(g, train) / near) for g in gpus]
    assert want[1] == 0.0 and 0.0 < want[0] < 1.0  # a training card; a card between it and the far ones
    with tile._call_scope():
        assert [tile.transfer_scale(g) for g in gpus] == want
    with tile._call_scope():  # the other order
        assert [tile.transfer_scale(g) for g in gpus[::-1]] == want[::-1]
