"""Sliding-window attention in the multi-GPU layer: Mistral's sliding_window (every layer),
Qwen2's under use_sliding_window (from max_window_layers on). Megatron-core hands the window to
Transformer Engine (TransformerConfig.window_size; extensions/transformer_engine.py), whose flash
and cuDNN kernels skip the key blocks outside the band, so a windowed layer's attention does
about seq x window pairs, not the causal triangle's seq^2 / 2. The layer had read no window and
priced full causal attention past it. Expected values here come from counting the band's pairs
by hand (a loop over queries and keys), not from the code under test."""
import json
import warnings

import pytest

from kit import ops
from kit.errors import KitError
from kit.parallel import Layout, parse_model
from kit.parallel.costs import AnalyticSource
from kit.parallel.gpt import layer_forward
from kit.workload.kernels import ATTENTION_BWD_SCALE

MISTRAL = {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096,
           "tie_word_embeddings": False, "name": "mistral-7b"}
QWEN2 = {"model_type": "qwen2", "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
         "num_key_value_heads": 4, "intermediate_size": 2816, "vocab_size": 32000,
         "max_position_embeddings": 32768, "sliding_window": 512, "use_sliding_window": True,
         "max_window_layers": 5, "name": "qwen2-toy"}


def _file(tmp_path, c, **extra):
    path = tmp_path / f"{c['name']}.json"
    path.write_text(json.dumps({**c, **extra}))
    return str(path)


def _band_pairs(seq: int, window: int) -> int:
    """(query i, key j) pairs with i - window < j <= i, counted one by one."""
    return sum(1 for i in range(seq) for j in range(seq) if i - window < j <= i)


@pytest.mark.parametrize("seq, window", [(8, 3), (16, 16), (16, 20), (33, 1), (40, 7)])
def test_a_windowed_attentions_flops_are_its_bands_pairs(seq, window):
    op = ops.Attention(2, 3, seq, seq, 64, "bf16", causal=True, window=window)
    # Q·K^T and P·V: 2 FLOPs a multiply-add, head_dim each, for every pair in the band
    assert op.flops == pytest.approx(2 * 2 * 3 * _band_pairs(seq, window) * (64 + 64), rel=1e-12)
    # its tensors are read and written once, window or not
    assert op.bytes == ops.Attention(2, 3, seq, seq, 64, "bf16", causal=True).bytes


def test_mistral_at_8k_and_32k_does_seq_x_window_less_the_first_windows_triangle():
    # by hand: query i sees min(i + 1, w) keys; summed, L·w - w(w - 1)/2
    for seq, pairs in ((8192, 8192 * 4096 - 4096 * 4095 // 2), (32768, 32768 * 4096 - 4096 * 4095 // 2)):
        op = ops.Attention(1, 4, seq, seq, 128, "bf16", causal=True, window=4096)
        assert op.flops == 2 * 4 * pairs * 256
    # 8192: 25,167,872 pairs of the triangle's 33,558,528; 32768: 125,829,120 of 536,887,296
    assert 8192 * 4096 - 4096 * 4095 // 2 == 25_167_872


def test_a_window_needs_a_causal_band_and_a_whole_number():
    with pytest.raises(KitError, match="causal"):
        ops.Attention(1, 1, 64, 64, 64, "bf16", window=16)
    with pytest.raises(KitError, match="window"):
        ops.Attention(1, 1, 64, 64, 64, "bf16", causal=True, window=-1)


def test_mistrals_config_windows_every_layer_forward_and_backward(tmp_path):
    spec = parse_model(_file(tmp_path, MISTRAL), seq=8192)
    assert (spec.window, spec.window_from) == (4096, 0)
    assert spec.to_dict()["window"] == 4096
    lay = Layout(tp=8, dtype="bf16")
    src = AnalyticSource(spec, lay)
    for layer in (0, 31):
        fwd, bwd = src.layer(layer)
        attn = [op for blk in fwd for op in blk.ops if isinstance(op, ops.Attention)]
        assert len(attn) == 1 and attn[0].window == 4096
        # this rank's 32 / 8 = 4 heads of 128 over the band
        assert attn[0].flops == 2 * 4 * (8192 * 4096 - 4096 * 4095 // 2) * 256
        back = [(op, f) for blk in bwd for op, f in zip(blk.ops, blk.bwd_factor) if isinstance(op, ops.Attention)]
        # the backward is the windowed kernel's too, ATTENTION_BWD_SCALE times its forward
        assert back == [(attn[0], ATTENTION_BWD_SCALE)]


def test_qwen2_windows_the_layers_from_max_window_layers_on(tmp_path):
    spec = parse_model(_file(tmp_path, QWEN2), seq=2048)
    assert (spec.window, spec.window_from) == (512, 5)
    full = 2048 * 2049 // 2
    for layer, pairs in ((0, full), (4, full), (5, _band_pairs_closed(2048, 512)), (7, _band_pairs_closed(2048, 512))):
        attn = [op for blk in layer_forward(spec, 1, 2, 1, False, "bf16", layer) for op in blk.ops
                if isinstance(op, ops.Attention)]
        assert attn[0].flops == 2 * 8 * pairs * 128, layer
    src = AnalyticSource(spec, Layout(tp=2, dtype="bf16"))
    assert src.layer_key(4) != src.layer_key(5)  # the two kinds of layer are costed apart
    # without use_sliding_window HF's Qwen2 nulls the window: every layer full
    off = parse_model(_file(tmp_path, QWEN2, use_sliding_window=False), seq=2048)
    assert off.window == 0 and "window" not in off.to_dict()


def _band_pairs_closed(seq, w):
    return seq * w - w * (w - 1) // 2


def test_a_window_no_shorter_than_seq_is_the_causal_op_and_full_specs_are_unchanged(tmp_path):
    spec = parse_model(_file(tmp_path, MISTRAL), seq=4096)
    attn = [op for blk in layer_forward(spec, 1, 8, 1, False, "bf16") for op in blk.ops
            if isinstance(op, ops.Attention)]
    assert attn == [ops.Attention(1, 4, 4096, 4096, 128, "bf16", causal=True)]
    plain = parse_model("llama:layers=2,hidden=256,heads=4,seq=128")
    assert "window" not in plain.to_dict() and "window_from" not in plain.to_dict()


def test_inline_shapes_take_a_window_and_refuse_a_stray_one():
    spec = parse_model("llama:layers=4,hidden=256,heads=4,seq=256,window=64,window_from=2")
    assert [spec.window_of(i) for i in range(4)] == [0, 0, 64, 64]
    with pytest.raises(KitError, match="window_from applies"):
        parse_model("llama:layers=4,hidden=256,heads=4,window_from=2")
    with pytest.raises(KitError, match="window_from 4 leaves none"):
        parse_model("llama:layers=4,hidden=256,heads=4,window=64,window_from=4")
    with pytest.raises(KitError, match="window must be"):
        parse_model("llama:layers=4,hidden=256,heads=4,window=-3")


def test_a_config_whose_windowed_layers_interleave_is_refused(tmp_path):
    types = ["sliding_attention" if i % 2 else "full_attention" for i in range(8)]
    with pytest.raises(KitError, match="not every layer from one on"):
        parse_model(_file(tmp_path, QWEN2, layer_types=types), seq=1024)
    with pytest.raises(KitError, match="sliding_window must be a whole number"):
        parse_model(_file(tmp_path, MISTRAL, sliding_window=-4), seq=1024)


def test_windowed_layers_cut_mistrals_step_at_32k(tmp_path):
    from kit.parallel import predict_parallel

    spec = parse_model(_file(tmp_path, MISTRAL), seq=32768)
    full = parse_model(_file(tmp_path, MISTRAL, sliding_window=None), seq=32768)
    assert full.window == 0
    lay = Layout(tp=8, micro_batch=1, global_batch=1, dtype="bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = [predict_parallel(s, "dgx-h100", lay, nodes=1, graph=False, predictor="roofline")["iteration_ms"]
             for s in (spec, full)]
    assert t[0] < 0.8 * t[1]  # the attention is most of a 32k step: the band is 23% of its pairs


@pytest.mark.parametrize("gpu", ["H100-SXM", "A100-SXM4-80GB"])
def test_the_tile_predictor_prices_a_window_under_its_causal_op(gpu):
    """The default predictor's fused-attention path caps a masked op by its unmasked twin
    (small_op_bounds); that twin must drop the window too (an Attention refuses a window without
    causal=True). Work only leaves with the window: at 32k x 4096 the band keeps 23% of the causal
    pairs (125,829,120 of 536,887,296, by hand), a compute-bound kernel, so well under half the
    causal op's time; and never more than it at any window."""
    from kit.predict import get_predictor

    p = get_predictor("tile")
    base = dict(b=1, heads=4, seq_q=32768, seq_kv=32768, head_dim=128, dtype="bf16")
    windows = (64, 512, 4096, 16384, 32767)
    ops_ = [ops.Attention(**base, causal=True, window=w) for w in windows] + [ops.Attention(**base, causal=True)]
    t = p.predict(ops_, gpu)["latency_ms"].tolist()
    causal = t[-1]
    assert all(a <= b for a, b in zip(t[:-1], t[1:]))  # a wider band is no faster
    assert t[windows.index(4096)] < 0.5 * causal


def test_window_keys_a_config_cannot_hold_are_refused(tmp_path):
    """HF reads sliding_window and max_window_layers as whole numbers, and refuses a layer_types
    list of another length than num_hidden_layers (PreTrainedConfig.validate_layer_type,
    transformers 5.25): each had failed with a TypeError traceback (a list window: unhashable;
    a string or null max_window_layers: '>=' against an int), or a short layer_types list had
    windowed the model's layers past its end as its last."""
    with pytest.raises(KitError, match="sliding_window must be a whole number"):
        parse_model(_file(tmp_path, MISTRAL, sliding_window=[4096]), seq=1024)
    for bad in ("5", None, -1):
        with pytest.raises(KitError, match="max_window_layers must be a whole number"):
            parse_model(_file(tmp_path, QWEN2, max_window_layers=bad), seq=1024)
    short = ["full_attention"] + ["sliding_attention"] * 2  # 3 of the 8 layers
    with pytest.raises(KitError, match=r"layer_types must be a list of num_hidden_layers \(8\)"):
        parse_model(_file(tmp_path, QWEN2, layer_types=short), seq=1024)
    with pytest.raises(KitError, match="layer_types must be a list"):
        parse_model(_file(tmp_path, QWEN2, layer_types="sliding_attention"), seq=1024)
    # the one-GPU zoo reads the same list (its decode cache, its masks): refused there too
    from kit.workload.modes import sliding_windows

    with pytest.raises(KitError, match="layer_types must be a list"):
        sliding_windows({**QWEN2, "layer_types": short})


def _visited_key_tiles(query_tile: int, window: int, tq: int = 64, tk: int = 128) -> int:
    """Key tiles holding at least one pair of the band for one query tile, found pair by pair."""
    rows = range(query_tile * tq, (query_tile + 1) * tq)
    return len({j // tk for i in rows for j in range(i - window + 1, i + 1)})


@pytest.mark.parametrize("window", [64, 200, 512, 4096])
def test_a_band_query_tile_visits_the_key_tiles_flash_skips_to(window):
    """Past the first window, every query tile of cuDNN's 64 x 128 flash kernel visits the same
    key tiles on average: about ceil(window / 128) + 1 (33 at 4096), counted here pair by pair
    over the query tiles of one 128-key period, not by ops.band_tiles' floor formula."""
    first = -(-window // 64) + 2  # a query tile wholly past the first window
    counts = [_visited_key_tiles(t, window) for t in range(first, first + 2)]
    assert ops.band_tiles(window) == pytest.approx(sum(counts) / 2)
    if window == 4096:
        assert counts == [33, 33]


def test_a_bands_causal_factor_is_its_triangles_alone():
    """The curve's causal factor (fitted on square causal shapes) is for the causal triangle; a
    band's rows from the window on are a non-causal attention over 33 key tiles of 128. By hand,
    Mistral at 32k x 4096: triangle 4096 x 4097 / 2 = 8,390,656 pairs, rows 28,672 x 4096 =
    117,440,512 pairs at 33 x 128 / 4096 = 1.03125 tiles a pair."""
    f = 1.2361
    band = ops.Attention(1, 4, 32768, 32768, 128, "bf16", causal=True, window=4096)
    expect = (8_390_656 * f + 117_440_512 * 1.03125) / (8_390_656 + 117_440_512)
    assert band.causal_scale(f) == pytest.approx(expect, rel=1e-12)
    whole = ops.Attention(1, 4, 32768, 32768, 128, "bf16", causal=True)
    assert whole.causal_scale(f) == f and ops.Attention(1, 4, 64, 64, 128).causal_scale(f) == 1.0


@pytest.mark.parametrize("gpu", ["H100-SXM", "A100-SXM4-80GB"])
def test_the_tile_predictor_prices_a_band_as_its_triangle_and_equal_rows(gpu):
    """A 32k x 4096 band is the causal attention of its first 4096 queries plus 28,672 queries
    over 33 key tiles of 128 each (4,224 keys, non-causal): priced apart, those two ops take
    what the band takes, within 5% (the curve is not quite linear, each op has its own start).
    With the whole causal factor on the band it had been 14% (H100) and 16% (A100) over them."""
    from kit.predict import get_predictor

    base = dict(b=1, heads=4, head_dim=128, dtype="bf16", kv_heads=1)
    t = get_predictor("tile").predict([
        ops.Attention(seq_q=32768, seq_kv=32768, causal=True, window=4096, **base),
        ops.Attention(seq_q=28672, seq_kv=33 * 128, **base),
        ops.Attention(seq_q=4096, seq_kv=4096, causal=True, **base)], gpu)["latency_ms"].tolist()
    assert 0.95 < t[0] / (t[1] + t[2]) < 1.05
