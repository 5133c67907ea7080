"""FP32/TF32 GEMMs with m or n of 1 stream their matrix (kit.predict.gemv): the tile-MLP priced
them as a padded GEMM tile, 2.3-5x slow on the H200 and 726x the roofline for a 1x1x1e7 dot
product on an A100."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kit.hardware import get_gpu
from kit.ops import Gemm
from kit.predict.gemv import PARAMS, applies
from kit.predict.tile_mlp import TilePredictor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.fixture(scope="module")
def tile():
    return TilePredictor.shipped()


def test_which_gemms_are_gemvs():
    ops = [Gemm(m=1, n=4096, k=4096), Gemm(m=4096, n=1, k=4096, b=3), Gemm(m=2, n=4096, k=4096),
           Gemm(m=1, n=4096, k=4096, dtype="bf16"), Gemm(m=1, n=4096, k=4096, dtype="tf32"),
           Gemm(m=1, n=4095, k=4095, dtype="bf16", align=1)]
    # an aligned 16-bit GEMV takes the tensor-core curve carried from the H200
    assert applies(get_gpu("a100-sxm4-80gb"), ops).tolist() == [True, True, False, False, True, True]
    assert applies(get_gpu("p100-pcie-16gb"), [Gemm(m=1, n=4096, k=4096, dtype="fp16")]).all()  # no tensor cores
    # rocBLAS's gemv kernels stream too; no tensor-core curve covers AMD, so 16-bit ones stream
    assert applies(get_gpu("mi300x"), ops).tolist() == [True, True, False, True, True, True]
    # on Hopper an aligned 16-bit GEMV keeps the measured tensor-core curve; an unaligned one streams
    hopper = [Gemm(m=1, n=4096, k=4096, dtype="bf16", align=8), Gemm(m=1, n=4095, k=4095, dtype="bf16", align=1),
              Gemm(m=1, n=4096, k=4096, dtype="tf32", align=8)]
    assert applies(get_gpu("h100-sxm"), hopper).tolist() == [False, True, True]


@pytest.mark.parametrize("gpu", ["a100-sxm4-80gb", "l4", "rtx-4090"])
def test_a_16_bit_gemv_is_never_slower_than_the_same_fp32_one(tile, gpu):
    """It was: the tile-MLP priced a bf16 GEMV as a padded tile at the unaligned 16-bit share of
    the peak (1x512x4096 on an A100: 62 us, the fp32 one 37 us). An unaligned one streams half the
    bytes; an aligned one takes the tensor-core curve carried from the H200."""
    for shape in ({"m": 1, "n": 512, "k": 4096}, {"m": 4096, "n": 1, "k": 14336},
                  {"m": 1, "n": 511, "k": 4095, "align": 1}):
        rows = tile.predict([Gemm(**shape, dtype=d) for d in ("fp32", "bf16", "fp16")], gpu)
        assert rows.tile.iloc[0] == "gemv"
        assert (rows.tile.iloc[1:] == "gemv").all() == (shape.get("align") == 1), rows.tile.tolist()
        fp32, bf16, fp16 = rows.latency_ms.tolist()
        assert bf16 == fp16 < fp32, (gpu, shape, rows.latency_ms.tolist())


@pytest.mark.parametrize("gpu", ["a100-sxm4-80gb", "h100-sxm", "t4", "l4", "mi300x", "mi210"])
def test_a_gemv_streams_its_bytes(tile, gpu):
    g = get_gpu(gpu)
    ops = [Gemm(m=1, n=1, k=10**7), Gemm(m=1, n=8192, k=8192), Gemm(m=8192, n=1, k=8192)]
    pred = tile.predict(ops, g)
    assert (pred.tile == "gemv").all() and (pred.split_k == 1).all()
    assert (pred.latency_ms >= pred.roofline_ms).all()
    # a streaming kernel: within a few times its DRAM time plus the floor, never 100s of times
    assert (pred.latency_ms < 4 * pred.roofline_ms + 0.05).all(), pred.latency_ms.tolist()
    assert (pred.latency_p10_ms <= pred.latency_ms).all() and (pred.latency_ms <= pred.latency_p90_ms).all()
    # a faster memory streams it faster: the DRAM time, not a tile's FLOPs, sets it
    big = tile.predict([Gemm(m=1, n=16384, k=16384)], g).latency_ms.iloc[0]
    assert big > 3 * pred.latency_ms.iloc[1] - 2 * 0.05


def test_the_rule_off_gives_the_tile_mlp_and_two_rows_keep_it(tile):
    g = get_gpu("a100-sxm4-80gb")
    op = Gemm(m=1, n=1, k=10**7)
    tile._gemv_rule = False
    try:
        raw = tile.predict([op], g).latency_ms.iloc[0]
    finally:
        tile._gemv_rule = True
    # what the rule replaced: ~28 ms on a 128x128 tile, ~2 ms on the sliced 32x32 one
    # (kit.predict.tile_choice.SLICED_ARCHS), still 18x the stream
    assert raw > 10 * tile.predict([op], g).latency_ms.iloc[0]
    assert tile.predict([Gemm(m=2, n=4096, k=4096)], g).tile.iloc[0] != "gemv"


def test_fit_script_reproduces_the_shipped_constants(capsys):
    import gemv_fit

    assert gemv_fit.main([]) == 0
    out = json.loads(capsys.readouterr().out)
    fitted = out["params"]
    assert fitted["c0_us"] == pytest.approx(PARAMS["c0_us"], abs=1e-9)
    assert fitted["eff"] == pytest.approx(PARAMS["eff"], abs=1e-9)
    assert fitted["band_log"] == pytest.approx(PARAMS["band_log"], abs=2e-3)
    every = {r["bytes"]: r for r in out["check_rows"]}["all"]
    assert every["n"] > 40 and every["mape"] < out["tile_mlp_mape"]["check_rows"]
    half = {r["bytes"]: r for r in out["check_16bit"]}["all"]  # the 16-bit GEMVs it takes
    assert half["n"] > 300 and half["mape"] < out["tile_mlp_mape"]["check_16bit"]


def test_fit_script_names_a_missing_folder(tmp_path, capsys):
    import gemv_fit

    assert gemv_fit.main(["--root", str(tmp_path / "nope")]) == 2
    assert "not found" in capsys.readouterr().err


def test_a_depthwise_convolution_is_no_gemv(tile):
    # a grouped convolution's implicit GEMM (b = groups, no shared weight) has n = 1 forward and
    # m = 1 in its weight gradient; cuDNN runs it on its own kernels, not cuBLAS's gemv
    g = get_gpu("a100-sxm4-80gb")
    conv = Gemm(m=32 * 56 * 56, n=1, k=9, b=256, kind="linear", shared_rhs=False)
    wgrad = Gemm(m=1, n=9, k=32 * 56 * 56, b=256, kind="linear")
    assert not applies(g, [conv, wgrad]).any()
    assert (tile.predict([conv, wgrad], g).tile != "gemv").all()


@pytest.mark.parametrize("gpu,dtype", [("mi300x", "bf16"), ("mi300x", "fp32"), ("mi210", "bf16"), ("mi210", "fp32"),
                                       ("h100-sxm", "fp32"), ("t4", "fp16")])
def test_a_thin_gemm_is_never_slower_than_as_many_one_row_calls(tile, gpu, dtype):
    """r rows could run as r GEMVs. On an MI300X, where AMD GEMVs stream now and the tile-MLP was
    off its data for thin 16-bit GEMMs (AMD's curve prices them since; FP32 keeps the tile-MLP,
    which the fp32 cases check), 8192 x 8192 weights took 0.067 ms at one row and 0.25 ms
    at two."""
    g = get_gpu(gpu)
    ms = [1, 2, 3, 4, 8, 16]
    rows = tile.predict([Gemm(m=m, n=8192, k=8192, dtype=dtype, kind="linear", shared_rhs=True)
                         for m in ms], g)
    one = rows.latency_ms.iloc[0]
    for m, lat in zip(ms[1:], rows.latency_ms.iloc[1:]):
        assert lat <= m * one * (1 + 1e-9), (gpu, dtype, m, rows.latency_ms.tolist())
    assert (rows.latency_p10_ms >= rows.roofline_ms - 1e-12).all()
    assert (rows.latency_p10_ms <= rows.latency_ms).all() and (rows.latency_ms <= rows.latency_p90_ms).all()


def test_kit_op_says_when_the_one_row_calls_set_a_thin_gemm(capsys):
    from kit.api import predict_op
    from kit.cli import main

    # FP32 on an MI300X: the tile-MLP's, off its data (16-bit takes AMD's matrix-core curve)
    # (the shape is the weights': where the one-row calls bind, 4096 x 4096 with the shipped ones)
    op = Gemm(m=2, n=4096, k=4096, dtype="fp32", kind="linear", shared_rhs=True)
    from kit.predict import get_predictor
    from kit.workload.iteration import isolation_floor_ms

    r = predict_op(op, "mi300x")
    one = predict_op(replace(op, m=1), "mi300x")
    floor = isolation_floor_ms(get_predictor("tile"), get_gpu("mi300x"))
    assert floor > 0  # two kernel times and one floor, not two whole isolated calls
    assert r["latency_ms"] == pytest.approx(2 * (one["latency_ms"] - floor) + floor)
    assert r["source"].startswith("2 back-to-back calls of its one-row twin")
    assert "source" not in predict_op(replace(op, m=64), "mi300x")  # too thick for the bound
    assert main(["op", "gemm", "--m", "2", "--n", "4096", "--k", "4096", "--gpu", "mi300x",
                 "--dtype", "fp32"]) == 0
    assert "source    2 back-to-back calls of its one-row twin" in capsys.readouterr().out


@pytest.mark.parametrize("gpu", ["l4", "a10", "a100-sxm4-80gb", "v100-sxm2-32gb", "h100-sxm", "mi300x"])
@pytest.mark.parametrize("dtype", ["fp32", "tf32", "bf16"])
def test_no_gemm_streams_faster_than_the_h200_measured_share(tile, gpu, dtype):
    """A few-row Linear split k ways shared the weight over its split batch, so the tile-MLP saw
    a k / S slice of it and the roofline alone held it: 2 x 4096 x 4096 in FP32 on an L4 came out
    at 100% of the bandwidth, half its one-row twin's time. No GEMM the H200 ran went over 73%
    (FP32), 81% (TF32) or 93% (bf16) of its bandwidth."""
    from kit.predict.gemv import STREAM_SHARE_MAX
    from kit.workload.iteration import isolation_floor_ms

    g = get_gpu(gpu)
    if dtype == "tf32" and not g.gemm_peak_tflops("tf32"):
        dtype = "fp32"  # TF32 needs Ampere or newer: the bound is FP32's there
    if dtype == "bf16" and gpu.startswith("v100"):
        dtype = "fp16"
    ops = [Gemm(m=m, n=n, k=k, dtype=dtype, kind="linear", shared_rhs=True)
           for m in (2, 3, 8, 16, 64) for n, k in ((4096, 4096), (1024, 16384), (8192, 2048))]
    rows = tile.predict(ops, g)
    floor = isolation_floor_ms(tile, g)
    kernel_s = (rows.latency_ms.to_numpy() - floor) / 1e3
    share = [op.bytes / t / (g.mem_bw_gbs * 1e9) for op, t in zip(ops, kernel_s)]
    assert max(share) <= STREAM_SHARE_MAX[dtype] * (1 + 1e-9), (gpu, dtype, max(share))
    assert (rows.latency_p10_ms <= rows.latency_ms).all() and (rows.latency_ms <= rows.latency_p90_ms).all()
    assert (rows.latency_p10_ms >= rows.roofline_ms - 1e-12).all()


def test_kit_op_says_when_the_stream_bound_set_a_gemm(capsys):
    from kit.cli import main

    assert main(["op", "linear", "--tokens", "2", "--in-features", "4096", "--out-features", "4096",
                 "--gpu", "l4"]) == 0
    out = capsys.readouterr().out
    assert "source    its bytes at 73% of the memory bandwidth" in out


@pytest.mark.parametrize("gpu,dtype", [("h100-sxm", "fp32"), ("a30", "fp32"), ("a100-sxm4-80gb", "bf16"),
                                       ("l4", "fp16"), ("mi250x", "bf16")])
def test_a_small_batch_is_never_slower_than_as_many_unbatched_calls(tile, gpu, dtype):
    """Split-K is open to unbatched GEMMs only, so b = 2 of a small output over a long k walked
    all of k on a couple of SMs: 24 x 24 outputs over k = 16384 on an H100 took 0.053 ms at
    b = 1 and 1.07 ms at b = 2 (20-55x across GPUs)."""
    from kit.workload.iteration import isolation_floor_ms

    g = get_gpu(gpu)
    floor = isolation_floor_ms(tile, g)
    for m, n, k in ((24, 24, 16384), (24, 8, 16384), (64, 48, 32768), (512, 512, 512)):
        ops = [Gemm(m=m, n=n, k=k, b=b, dtype=dtype, kind="bmm") for b in (1, 2, 3, 8, 16)]
        rows = tile.predict(ops, g)
        one = rows.latency_ms.iloc[0]
        for op, lat in zip(ops[1:], rows.latency_ms.iloc[1:]):
            assert lat <= op.b * (one - floor) + floor + 1e-12, (gpu, dtype, m, n, k, op.b, rows.latency_ms.tolist())
        assert (rows.latency_p10_ms <= rows.latency_ms).all() and (rows.latency_ms <= rows.latency_p90_ms).all()
        assert (rows.latency_p10_ms >= rows.roofline_ms - 1e-12).all()
        assert ((rows.utilisation > 0) & (rows.utilisation <= 1)).all(), rows.utilisation.tolist()


def test_utilisation_is_a_share_at_most_one_whatever_path_set_the_time(tile):
    """The wave bound may exceed a time a curve or a bound set: a b = 2 GEMM of 24 x 8 outputs
    over k = 16384 on an H100 had reported 744% of its wave bound."""
    ops = [Gemm(m=m, n=n, k=k, b=b, dtype=d, kind=kind, shared_rhs=kind == "linear")
           for m in (1, 2, 24, 512, 4096) for n in (8, 4096) for k in (64, 16384)
           for b in (1, 2) for d in ("fp32", "bf16") for kind in ("bmm", "linear") if not (kind == "linear" and b > 1)]
    for gpu in ("h100-sxm", "a100-sxm4-80gb", "l4", "mi300x"):
        u = tile.predict(ops, gpu).utilisation.to_numpy()
        assert ((u > 0) & (u <= 1 + 1e-12)).all(), (gpu, u.max())


def test_kit_op_says_when_the_unbatched_calls_set_a_small_batch(capsys):
    from kit.cli import main

    # 64 x 64: past the padding ladder, whose twins set 24 x 24 once the power share was learned
    assert main(["op", "gemm", "--m", "64", "--n", "64", "--k", "16384", "--b", "2", "--gpu", "h100-sxm"]) == 0
    assert "source    2 back-to-back calls of its b = 1 twin" in capsys.readouterr().out


@pytest.mark.parametrize("gpu,dtype", [("l40s", "fp32"), ("mi300x", "fp8"), ("h100-sxm", "bf16"), ("t4", "fp16")])
def test_a_tiny_gemm_takes_the_least_isolated_time_a_vector_kernel_does(tile, gpu, dtype):
    """Only the vector and row classes were floored: a 2 x 1 x 2 Linear on an L40S took 2.6 us
    against 29 us for its GEMV twin, an fp8 32 x 2 x 1 GEMM on an MI300X 0.7 us (the stream
    bound, _stream_bound, adds the whole dispatch floor to its bytes' time now, as the GEMV
    and curve paths do)."""
    from kit.predict.small_op_bounds import FLOOR_SHARE
    from kit.workload.iteration import isolation_floor_ms

    g = get_gpu(gpu)
    if dtype == "fp8" and not g.gemm_peak_tflops("fp8"):
        pytest.skip(f"{gpu} has no fp8")
    low = FLOOR_SHARE * isolation_floor_ms(tile, g)
    ops = [Gemm(m=m, n=n, k=k, dtype=dtype, kind=kind, shared_rhs=kind == "linear")
           for m in (2, 32) for n in (2, 16) for k in (1, 8, 24) for kind in ("linear", "bmm")]
    lat = tile.predict(ops, g).latency_ms.to_numpy(float)
    assert (lat >= low * (1 - 1e-9)).all(), (gpu, dtype, lat.min(), low)


def test_the_unbatched_cap_holds_over_the_aligned_lift(tile):
    """The aligned-twin lift ran after the cap and pushed unaligned tf32 batches up to 3.7% past
    b calls of their unbatched twin (review)."""
    ops = [Gemm(m=m, n=n, k=k, b=b, dtype="tf32", kind="linear", align=1)
           for m, n, k in ((1024, 1, 4096), (512, 3, 8192), (2048, 7, 1024)) for b in (2, 3, 8)]
    for gpu in ("a100-sxm4-80gb", "h100-sxm", "l4"):
        cap = tile.few_batches_ms(ops, gpu)
        lat = tile.predict(ops, gpu).latency_ms.to_numpy(float)
        assert (lat <= cap * (1 + 1e-9)).all(), (gpu, (lat / cap).max())


def test_the_stream_bound_says_when_a_dtype_was_not_timed(capsys, tmp_path):
    from kit.cli import main
    from kit.hardware import unregister_gpu
    from kit.hardware.catalog import _builtin_entries

    # every catalog GPU with FP8 has a curve for it now (NVIDIA's from the H200, AMD's CDNA from
    # AMD's matrix cores); another vendor's FP8 GPU, from a GPU file, keeps the tile-MLP
    entry = {**_builtin_entries()["mi300x"], "key": "fp8-other", "name": "FP8 Other", "aliases": [],
             "vendor": "other", "arch": "other"}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(entry))
    try:
        assert main(["op", "gemm", "--m", "32", "--n", "2", "--k", "1", "--gpu", "fp8-other", "--dtype", "fp8",
                     "--gpu-file", str(path)]) == 0
    finally:
        unregister_gpu("fp8-other")
    out = capsys.readouterr().out
    assert "source    its bytes at 93% of the memory bandwidth" in out and "(fp8 was not timed)" in out


@pytest.mark.parametrize("gpu", ["l4", "t4", "v100-sxm2-32gb", "a10", "h200", "mi300x"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_a_gemv_is_never_slower_than_its_two_row_twin(tile, gpu, dtype):
    """The twin's kernel could run one row with a row of padding. The rule's 0.51 of the
    bandwidth (a large FP32 GEMV on the H200 streamed at 0.65-0.70) had put a 1 x 8192 x 2048
    fp32 GEMV on an L4 at 1.4x its two-row twin, and an fp32 decode step at batch 1 over the
    same step at batch 2."""
    ops = [Gemm(m=m, n=n, k=k, dtype=dtype, kind="linear", shared_rhs=True)
           for n, k in ((8192, 2048), (4096, 4096), (50257, 768), (1024, 256)) for m in (1, 2)]
    lat = tile.predict(ops, get_gpu(gpu)).latency_ms.to_numpy()
    assert (lat[0::2] <= lat[1::2] * (1 + 1e-9)).all(), (gpu, dtype, lat.tolist())


def test_kit_op_says_when_the_two_row_twin_sets_a_gemv(capsys):
    from kit.api import predict_op
    from kit.cli import main

    op = Gemm(m=1, n=8192, k=2048, dtype="fp32", kind="linear", shared_rhs=True)
    r = predict_op(op, "l4")
    assert r["latency_ms"] == pytest.approx(predict_op(replace(op, m=2), "l4")["latency_ms"])
    assert r["source"].startswith("its two-row twin's time")
    assert not str(predict_op(op, "h200").get("source", "")).startswith("its two")  # its rule holds there
    assert main(["op", "linear", "--tokens", "1", "--in-features", "2048", "--out-features", "8192",
                 "--gpu", "l4"]) == 0
    assert "source    its two-row twin's time" in capsys.readouterr().out


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-pcie-40gb", "mi300x"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_gemv_rule_never_beats_the_roofline(tile, gpu, dtype):
    # one row in each of 2,048 batches over one shared weight is compute-bound: its bytes alone
    # had put it at a tenth of its roofline (an H100 in FP32: 0.094 ms against 1.03)
    ops = [Gemm(m=1, n=4096, k=4096, b=b, dtype=dtype, kind="linear", shared_rhs=True) for b in (1, 64, 2048)]
    rows = tile.predict(ops, gpu)
    assert (rows.latency_ms >= rows.roofline_ms).all() and (rows.latency_p10_ms >= rows.roofline_ms).all()
    assert (rows.latency_p10_ms <= rows.latency_ms).all() and (rows.latency_ms <= rows.latency_p90_ms).all()
