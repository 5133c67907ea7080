"""kit.predict.tensor_core: the measured kernel-time curves of aligned tensor-core GEMMs and fused
attention on Hopper, how the tile predictor applies them, and the script that fits them."""
from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kit.hardware import get_gpu
from kit.ops import Attention, Gemm
from kit.predict import get_predictor
from kit.predict.tensor_core import (FUSED_ATTENTION, TENSOR_CORE_GEMM, applies, attention_params_for,
                                     kernel_ms_of, params_for)
from kit.predict.roofline import roofline
from kit.workload.iteration import KERNEL_MIN_US, in_stream_ms, isolation_floor_ms

ROOT = Path(__file__).resolve().parents[1]
MEAS = ROOT / "measurements" / "h200-2026-12-04-b"
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_curve_never_beats_the_roofline_and_the_band_holds_the_centre():
    r = np.logspace(-4, 2, 200)
    for params in (*TENSOR_CORE_GEMM["hopper"].values(), *FUSED_ATTENTION["hopper"].values()):
        t, lo, hi = kernel_ms_of(r, params)
        assert (t >= r).all() and (lo >= r).all()
        assert (lo <= t).all() and (t <= hi).all()
        assert (np.diff(t) > 0).all()  # a bigger roofline time is never faster
        # the share of the peak never passes eff_max, and a tiny kernel costs about c0
        assert (r / (t - params["c0_us"] / 1e3) <= params["eff_max"] + 1e-9).all()
        assert t[0] == pytest.approx(params["c0_us"] / 1e3, rel=0.2)


def test_attention_factors_scale_the_curve():
    p = FUSED_ATTENTION["hopper"]["bf16"]
    base = kernel_ms_of([1.0], p)[0][0] - p["c0_us"] / 1e3
    causal = kernel_ms_of([1.0], p, [True], [False])[0][0] - p["c0_us"] / 1e3
    small = kernel_ms_of([1.0], p, [False], [True])[0][0] - p["c0_us"] / 1e3
    assert causal == pytest.approx(base * p["causal_factor"])
    assert small == pytest.approx(base * p["small_head_factor"])


def test_which_gpus_dtypes_and_alignments_take_the_curve():
    h200, a100 = get_gpu("h200"), get_gpu("a100-pcie-40gb")
    assert params_for(h200, "bf16") is not None and params_for(h200, "fp16") is not None
    assert params_for(h200, "fp32") is None  # SIMT sgemm: the tile-MLP's own ground
    # GEMMs: measured on Hopper, carried to NVIDIA's other tensor-core GPUs with a wider band;
    # FP32 (SIMT) keeps the tile-MLP; FP8 takes the bf16 curve where tensor cores have it; AMD's
    # 16-bit and FP8 take the curve of AMD's FP32 matrix-core GEMMs, AMD's FP32 the tile-MLP
    assert params_for(a100, "bf16")["carried_from"] and "carried_from" not in params_for(h200, "bf16")
    assert params_for(a100, "bf16")["band_log"][1] > params_for(h200, "bf16")["band_log"][1]
    assert params_for(a100, "fp32") is None
    for gpu in ("h100-sxm", "l4", "b200"):
        assert params_for(get_gpu(gpu), "fp8")["carried_from"] == "h200 bf16"
    for gpu, dtype in (("mi300x", "bf16"), ("mi300x", "fp8"), ("mi210", "fp16"), ("mi100", "bf16")):
        assert params_for(get_gpu(gpu), dtype)["carried_from"] == "amd fp32 matrix-core"
    for gpu, dtype in (("mi300x", "fp32"), ("mi210", "fp32"), ("mi300x", "tf32")):
        assert params_for(get_gpu(gpu), dtype) is None
    assert params_for(get_gpu("v100-sxm2-32gb"), "fp8") is None  # no fp8 tensor cores
    # FP8 kernels run only on 16-byte aligned operands: the most alignment the kit tracks is it
    h100 = get_gpu("h100-sxm")
    assert applies(h100, "fp8", [8, 4]).tolist() == [True, False]
    # attention has a curve everywhere: measured on Hopper in 16-bit, carried elsewhere, wider
    measured, carried = attention_params_for(h200, "bf16"), attention_params_for(a100, "bf16")
    assert "carried_from" not in measured and carried["carried_from"]
    assert attention_params_for(h200, "fp32") is carried
    for key in ("band_log", "band_log_short"):
        assert carried[key][0] < measured[key][0] and carried[key][1] > measured[key][1]
    assert {k: carried[k] for k in ("a", "beta", "c0_us", "eff_max")} == \
        {k: measured[k] for k in ("a", "beta", "c0_us", "eff_max")}
    assert applies(h200, "bf16", [8, 4, 2, 1]).tolist() == [True, False, False, False]
    assert applies(h200, "tf32", [4, 2, 1]).tolist() == [True, False, False]  # 4 x 4 bytes = 16
    assert applies(a100, "bf16", [8, 1]).tolist() == [True, False]


def test_tile_predictor_uses_the_curve_on_hopper_only():
    tile = get_predictor("tile")
    g = Gemm(m=4096, n=4096, k=4096, dtype="bf16")
    h200 = get_gpu("h200")
    row = tile.predict([g], h200).iloc[0]
    floor = isolation_floor_ms(tile, h200)
    t, lo, hi = kernel_ms_of([roofline(g, h200).time_ms], params_for(h200, "bf16"))
    assert row.latency_ms == pytest.approx(t[0] + floor)
    assert row.latency_p10_ms == pytest.approx(lo[0] + floor) and row.latency_p90_ms == pytest.approx(hi[0] + floor)
    # in a model the dispatch floor comes out again: the curve's kernel time
    assert in_stream_ms(row.latency_ms, row.roofline_ms, floor) == pytest.approx(t[0])
    # unaligned: the tile-MLP against the unaligned share of the peak, far slower than the curve
    odd = tile.predict([replace(g, align=1)], h200).iloc[0]
    assert odd.latency_ms > 3 * row.latency_ms
    # fp32 on the same GPU keeps the tile-MLP (not the curve)
    f32 = tile.predict([replace(g, dtype="fp32")], h200).iloc[0]
    t32 = kernel_ms_of([f32.roofline_ms], params_for(h200, "bf16"))[0][0]
    assert abs(f32.latency_ms - floor - t32) / t32 > 0.05


def test_tile_predictor_uses_the_attention_curve():
    tile = get_predictor("tile")
    h200 = get_gpu("h200")
    ops = [Attention(b=4, heads=32, seq_q=2048, seq_kv=2048, head_dim=128, dtype="bf16", causal=True),
           Attention(b=4, heads=32, seq_q=2048, seq_kv=2048, head_dim=64, dtype="bf16", causal=False)]
    pred = tile.predict(ops, h200)
    floor = isolation_floor_ms(tile, h200)
    p = attention_params_for(h200, "bf16")
    for op, row in zip(ops, pred.itertuples()):
        t = kernel_ms_of([roofline(op, h200).time_ms], p, [op.causal], [op.head_dim < 128])[0][0]
        assert row.latency_ms == pytest.approx(t + floor)
        assert row.utilisation == pytest.approx(row.roofline_ms / row.latency_ms)
    # fp32 attention, and bf16 attention on an Ampere GPU, take the carried curve against their
    # own peak: no longer the bare roofline (100% of it) of the wave model
    for op, gpu in ((replace(ops[0], dtype="fp32"), h200), (ops[0], get_gpu("a100-sxm4-80gb"))):
        row = tile.predict([op], gpu).iloc[0]
        t = kernel_ms_of([roofline(op, gpu).time_ms], attention_params_for(gpu, op.dtype), [True], [False])[0][0]
        assert row.latency_ms == pytest.approx(t + isolation_floor_ms(tile, gpu))
        assert row.latency_ms > 1.5 * get_predictor("wave").predict([op], gpu).latency_ms.iloc[0]


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-sxm4-80gb"])
def test_a_causal_mask_never_makes_attention_slower(gpu):
    """The causal factor was fitted on square shapes (the mask keeps half the pairs); where the
    mask keeps nearly all (queries far fewer than keys) or the kernel is memory-bound, it had
    made a masked attention 23% slower than the unmasked one."""
    tile = get_predictor("tile")
    for q, kv in ((128, 32768), (2048, 2048), (4096, 8192), (8192, 1024)):
        ops = [Attention(b=8, heads=32, seq_q=q, seq_kv=kv, head_dim=128, dtype="bf16", causal=c)
               for c in (False, True)]
        full, masked = tile.predict(ops, gpu).itertuples()
        assert masked.latency_ms <= full.latency_ms * (1 + 1e-9), (q, kv)
        assert masked.latency_p90_ms <= full.latency_p90_ms * (1 + 1e-9), (q, kv)
    # on the square shapes the curve was fitted on, the mask still saves about 0.62x (its fit)
    sq = [Attention(b=8, heads=32, seq_q=4096, seq_kv=4096, head_dim=128, dtype="bf16", causal=c)
          for c in (False, True)]
    full, masked = tile.predict(sq, gpu).latency_ms
    assert 0.55 < masked / full < 0.7


@pytest.mark.skipif(not MEAS.is_dir(), reason="the measurements folder is not here")
def test_fit_script_reproduces_the_shipped_constants(capsys):
    import tensor_core_fit

    assert tensor_core_fit.main([]) == 0
    out = json.loads(capsys.readouterr().out)
    fits = out["fits"]
    shipped = {"bf16": TENSOR_CORE_GEMM["hopper"]["bf16"], "tf32": TENSOR_CORE_GEMM["hopper"]["tf32"],
               "attention_bf16": FUSED_ATTENTION["hopper"]["bf16"]}
    for name, params in shipped.items():
        fitted = fits[name]["fit"]
        for k, v in params.items():
            if k == "band_log":
                assert fitted[k] == pytest.approx(v, abs=2e-3), (name, k)
            else:
                assert fitted[k] == pytest.approx(v, rel=2e-3, abs=2e-3), (name, k)
    # the checks are on rows the fit never saw, and report every bucket they have
    bf16 = {r["kernel_time"]: r for r in fits["bf16"]["checks"]["other_shapes_bf16"]}
    assert bf16[">=20us"]["n"] > 100 and math.isfinite(bf16[">=20us"]["mape"])
    assert 0 <= bf16[">=20us"]["band_coverage"] <= 1


def test_fit_script_names_a_missing_folder(tmp_path, capsys):
    import tensor_core_fit

    assert tensor_core_fit.main(["--dir", str(tmp_path / "nope")]) == 2
    assert "not found" in capsys.readouterr().err


def test_a_curve_gemm_is_never_split_and_others_still_are():
    """The curve holds cuBLAS's own split-K; the kit's rule must not split such a GEMM again
    (a decode down-projection at batch 8: split 4 ways it came out at its roofline, 40% fast)."""
    tile = get_predictor("tile")
    h200 = get_gpu("h200")
    down = Gemm(m=8, n=4096, k=14336, dtype="bf16", kind="linear", shared_rhs=True)
    row = tile.predict([down], h200).iloc[0]
    assert row.split_k == 1
    t = kernel_ms_of([roofline(down, h200).time_ms], params_for(h200, "bf16"))[0][0]
    assert row.latency_ms == pytest.approx(t + isolation_floor_ms(tile, h200))
    # the same GEMM unaligned, or in fp32, may still split (the tile-MLP's rule)
    mixed = tile.predict([down, replace(down, dtype="fp32"), replace(down, align=2)], h200)
    assert mixed.split_k.iloc[0] == 1 and (mixed.split_k.iloc[1:] > 1).any()


def test_decode_attention_keeps_its_roofline_in_the_stream():
    from kit.workload.iteration import in_stream_ms

    tile = get_predictor("tile")
    h200 = get_gpu("h200")
    dec = Attention(b=8, heads=32, seq_q=1, seq_kv=4096, head_dim=128, dtype="bf16", kv_heads=8)
    row = tile.predict([dec], h200).iloc[0]
    floor = isolation_floor_ms(tile, h200)
    assert row.latency_ms == pytest.approx(roofline(dec, h200).time_ms + floor)  # isolated: + the floor
    # in the stream: its roofline plus one kernel's start (kit.workload.kernel_times.KERNEL_MIN_US);
    # the H200's decode attention kernels ran 5-12 us over their roofline
    assert in_stream_ms(row.latency_ms, row.roofline_ms, floor) == \
        pytest.approx(roofline(dec, h200).time_ms + KERNEL_MIN_US / 1e3)
    from kit.api import predict_op

    assert predict_op(dec, h200)["source"].startswith("roofline (one query")
    assert "blended" in predict_op(replace(dec, seq_q=2), h200)["source"]


def test_fp8_gemms_take_the_carried_curve_like_bf16_at_half_the_bytes():
    """The tile-MLP had priced them alone: a 1x1x1 FP8 GEMM on an H100 at 0.7 us (no floor;
    bf16 16 us), a 1x1x2^31 GEMV split 128 ways at 30x its roofline (bf16 streamed it)."""
    tile = get_predictor("tile")
    for gpu in ("h100-sxm", "b200", "l4"):
        g = get_gpu(gpu)
        floor = isolation_floor_ms(tile, g)
        shapes = [dict(m=1, n=1, k=1), dict(m=1, n=1, k=2**31), dict(m=16, n=8192, k=8192),
                  dict(m=8192, n=8192, k=8192)]
        for shape in shapes:
            f8, bf = (tile.predict([Gemm(**shape, dtype=d)], g).iloc[0] for d in ("fp8", "bf16"))
            assert f8.latency_ms >= floor and f8.split_k == 1
            assert f8.latency_ms <= bf.latency_ms * (1 + 1e-9), (gpu, shape)
            assert f8.latency_ms >= f8.roofline_ms
            t = kernel_ms_of([roofline(Gemm(**shape, dtype="fp8"), g).time_ms], params_for(g, "fp8"))[0][0]
            assert f8.latency_ms == pytest.approx(t + floor)


def test_a_decode_attention_band_has_the_curves_width():
    """One query keeps its roofline as the centre, but not a zero-width band: the band is the
    curve's relative width around the blended centre, p10 never under the roofline."""
    tile = get_predictor("tile")
    for gpu in ("h200", "a100-pcie-40gb"):
        g = get_gpu(gpu)
        floor = isolation_floor_ms(tile, g)
        for q in (1, 2, 16, 127, 128, 512):
            att = Attention(b=8, heads=32, seq_q=q, seq_kv=4096, head_dim=128, dtype="bf16", kv_heads=8)
            row = tile.predict([att], g).iloc[0]
            full = tile.predict([replace(att, seq_q=4096)], g).iloc[0]
            k = row.latency_ms - floor
            width = np.log((row.latency_p90_ms - floor) / k)
            full_width = np.log((full.latency_p90_ms - floor) / (full.latency_ms - floor))
            assert width == pytest.approx(full_width, rel=0.2), (gpu, q)
            assert row.latency_p10_ms >= row.roofline_ms + floor - 1e-12
            assert row.latency_p10_ms <= row.latency_ms <= row.latency_p90_ms


def test_a_scaled_kernel_takes_its_floor_out_scaled():
    """attention backward = 2.8 x forward: in a model it costs 2.8 x the forward's kernel time,
    not 2.8 x (kernel + floor) less one floor."""
    from kit.workload.graph import Node
    from kit.workload.iteration import predict_latencies
    from kit.workload.kernels import ATTENTION_BWD_SCALE, Derived

    h200 = get_gpu("h200")
    fwd = Attention(b=8, heads=12, seq_q=1024, seq_kv=1024, head_dim=64, dtype="bf16", causal=True)
    bwd = Derived("attention", (fwd,), ATTENTION_BWD_SCALE, "attention backward")
    nodes = [Node(id=0, aten="a", op=fwd, op_class="attention", phase="fwd"),
             Node(id=1, aten="b", op=bwd, op_class="attention", phase="bwd")]
    lat = predict_latencies(nodes, h200, "tile")[0]
    assert lat[1] == pytest.approx(ATTENTION_BWD_SCALE * lat[0], rel=1e-6)


def test_the_multi_gpu_coster_scales_the_floor_the_same_way():
    from kit.hardware.system import get_system
    from kit.parallel import Layout
    from kit.parallel.costs import Coster

    system = get_system("hgx-h200")
    fwd = Attention(b=8, heads=12, seq_q=1024, seq_kv=1024, head_dim=64, dtype="bf16", causal=True)
    coster = Coster(Layout(), system, "tile")
    coster.predict_ops([fwd])
    assert coster.floor_ms > 0
    assert coster.op_ms(fwd, scale=2.8) == pytest.approx(2.8 * coster.op_ms(fwd), rel=1e-6)


def test_kit_op_says_when_the_curve_answered(capsys):
    from kit.api import predict_op
    from kit.cli import main

    g = Gemm(m=4096, n=4096, k=4096, dtype="bf16")
    assert predict_op(g, "h200")["source"] == "kit.predict.tensor_core"
    assert predict_op(g, "a100-pcie-40gb")["source"] == "kit.predict.tensor_core (carried from the h200 bf16 curve)"
    assert predict_op(g, "mi300x")["source"] == "kit.predict.tensor_core (carried from the amd fp32 matrix-core curve)"
    # FP32 takes no tensor-core curve (on the H200 its time is the long-reduction cap's: its own
    # source line, kit.predict.op_source)
    for gpu in ("mi300x", "h200"):
        assert not str(predict_op(replace(g, dtype="fp32"), gpu).get("source", "")).startswith("kit.predict.tensor_core")
    assert "source" not in predict_op(g, "h200", "wave")
    main(["op", "gemm", "--m", "4096", "--n", "4096", "--k", "4096", "--gpu", "h200", "--dtype", "bf16"])
    assert "measured on an H200" in capsys.readouterr().out
    main(["op", "gemm", "--m", "4096", "--n", "4096", "--k", "4096", "--gpu", "mi300x", "--dtype", "bf16"])
    out = capsys.readouterr().out
    assert "AMD's matrix-core GEMMs" in out and "H200" not in out


def test_kit_op_reads_the_alignment_off_the_dims(capsys):
    from kit.cli import main

    main(["op", "gemm", "--m", "4096", "--n", "4095", "--k", "4096", "--gpu", "h200", "--dtype", "bf16", "--json"])
    odd = json.loads(capsys.readouterr().out)
    main(["op", "gemm", "--m", "4096", "--n", "4096", "--k", "4096", "--gpu", "h200", "--dtype", "bf16", "--json"])
    even = json.loads(capsys.readouterr().out)
    assert "source" not in odd and even["source"] == "kit.predict.tensor_core"
    assert odd["latency_ms"] > 3 * even["latency_ms"]  # the legacy kernels, at 13% of the peak


def test_a_short_prefill_blends_the_curve_and_its_roofline():
    """Under 128 queries (the fitted shapes had 128-8192): exp((1 - w) ln roofline + w ln curve),
    w = log2(queries) / 7, plus the floor."""
    tile = get_predictor("tile")
    h200 = get_gpu("h200")
    p = attention_params_for(h200, "bf16")
    short = Attention(b=1, heads=12, seq_q=64, seq_kv=64, head_dim=64, dtype="bf16")
    r = roofline(short, h200).time_ms
    t = kernel_ms_of([r], p, [False], [True])[0][0]
    w = 6 / 7
    assert tile.predict([short], h200).latency_ms.iloc[0] == pytest.approx(
        r ** (1 - w) * t ** w + isolation_floor_ms(tile, h200))
    assert r ** (1 - w) * t ** w > 0.5 * p["c0_us"] / 1e3  # most of the curve's fixed cost, not 0.1 us


def test_a_kernel_shedding_floors_never_sheds_more_than_it_carries():
    """An RNN's Derived (leaf scales 1, t, t; kernels = their sum) sheds one floor a kernel, as
    before; a scaled single kernel sheds every floor it carries."""
    import torch
    from kit.api import predict_model

    lstm = predict_model(torch.nn.LSTM(256, 512, num_layers=2, batch_first=True), "h200",
                         mode="inference", inputs=(torch.empty(8, 64, 256),))
    # 258 kernels: far above 258 x the 2 us kernel minimum they collapsed to when floors were
    # shed per scale unit
    assert lstm.kernel_ms > 3 * 258 * 2e-3


@pytest.mark.parametrize("gpu,dtype", [("a100-sxm4-80gb", "tf32"), ("b200", "tf32"), ("v100-sxm2-32gb", "fp16"),
                                       ("h100-sxm", "tf32"), ("a100-sxm4-80gb", "bf16"), ("l4", "fp16")])
def test_an_unaligned_gemm_is_never_faster_than_its_aligned_twin(gpu, dtype):
    """Padding would be a way to run it. TF32 and Volta's fp16, which no unaligned share slows,
    had come out 15-20% under their aligned twins on the curve (found by a review)."""
    tile = get_predictor("tile")
    for n in (512, 4096, 8192):
        g = Gemm(m=n, n=n, k=n, dtype=dtype)
        aligned, odd = tile.predict([g, replace(g, align=1)], gpu).itertuples()
        assert odd.latency_ms >= aligned.latency_ms * (1 - 1e-9), (n, odd.latency_ms, aligned.latency_ms)
        assert odd.latency_p10_ms <= odd.latency_ms <= odd.latency_p90_ms
    # and kit op names the curve a carried GEMM took, by its dtype
    from kit.api import predict_op

    src = predict_op(Gemm(m=4096, n=4096, k=4096, dtype=dtype), gpu).get("source", "")
    if "carried" in src:
        assert ("tf32" in src) == (dtype == "tf32")
    # and says when an unaligned GEMM took its aligned twin's time
    odd = predict_op(Gemm(m=4096, n=4096, k=4096, dtype=dtype, align=1), gpu)
    twin = predict_op(Gemm(m=4096, n=4096, k=4096, dtype=dtype), gpu)
    lifted = odd["latency_ms"] == pytest.approx(twin["latency_ms"])
    assert ("aligned twin" in odd.get("source", "")) == lifted


@pytest.mark.parametrize("gpu", ["a100-sxm4-80gb", "h200", "mi300x"])
def test_attention_grows_smoothly_from_a_decode_step_to_a_prefill(gpu):
    """One query keeps the decode roofline (in the stream, plus one kernel's start), 128 take the
    curve; in between a log-linear blend. It had jumped 1.8x from 127 queries to 128 (A100,
    4,096 keys: 0.27 -> 0.48 ms, found by a review)."""
    from kit.workload.iteration import in_stream_ms

    tile = get_predictor("tile")
    g = get_gpu(gpu)
    qs = [1, 2, 4, 16, 64, 127, 128, 129]
    pred = tile.predict([Attention(b=8, heads=32, seq_q=q, seq_kv=4096, head_dim=128, dtype="bf16")
                         for q in qs], g)
    kernel = in_stream_ms(pred.latency_ms.to_numpy(), pred.roofline_ms.to_numpy(), isolation_floor_ms(tile, g))
    assert kernel[0] == pytest.approx(pred.roofline_ms.iloc[0] + KERNEL_MIN_US / 1e3)  # one query
    assert all(b >= a * (1 - 1e-9) for a, b in zip(kernel, kernel[1:]))  # more queries, never faster
    assert kernel[6] / kernel[5] < 1.05  # 127 -> 128 queries: no step
    assert kernel[1] / kernel[0] < 1.2  # 1 -> 2 queries: no step either
    assert ((pred.latency_p10_ms <= pred.latency_ms) & (pred.latency_ms <= pred.latency_p90_ms)).all()
    # more keys never make it faster: at 16 queries, 17 keys had come out 45% under 16
    for q in (16, 64):
        keys = [q, q + 1, 2 * q, 4096]
        more = tile.predict([Attention(b=8, heads=32, seq_q=q, seq_kv=kv, head_dim=128, dtype="bf16")
                             for kv in keys], g)
        t = in_stream_ms(more.latency_ms.to_numpy(), more.roofline_ms.to_numpy(), isolation_floor_ms(tile, g))
        assert all(b >= a * (1 - 1e-9) for a, b in zip(t, t[1:])), (q, t)
