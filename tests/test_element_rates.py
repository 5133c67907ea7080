"""kit.predict.element_rates (kinds whose elements set their speed) and the cheap pow exponents
kit.workload.mapping sends to their own kinds."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kit.hardware import get_gpu
from kit.ops import Elementwise, Softmax
from kit.predict import get_predictor
from kit.predict.element_rates import CDNA_ELEMS_PER_CU_CLOCK, ELEMS_PER_SM_CLOCK, element_bound_ms
from kit.workload.iteration import isolation_floor_ms
from kit.workload.kernels import leaf_ops
from kit.workload.mapping import POW_FAST, map_op

ROOT = Path(__file__).resolve().parents[1]
NEUSIGHT = Path(os.environ.get("KIT_DATA", ROOT.parent / "shared" / "data" / "neusight"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_a_bound_kind_is_no_faster_than_its_elements_at_its_vendors_rate():
    tile = get_predictor("tile")
    h200 = get_gpu("h200")
    n = 1 << 26
    ops = [Elementwise("pow", n, "bf16", inputs=2), Elementwise("gelu", n, "bf16"), Elementwise("add", n, "bf16", inputs=2)]
    pred = tile.predict(ops, h200)
    floor = isolation_floor_ms(tile, h200)
    for op, row in zip(ops[:2], pred.itertuples()):
        bound = n / (ELEMS_PER_SM_CLOCK[op.kind] * h200.sm_count * h200.boost_clock_mhz * 1e6) * 1e3
        assert row.latency_ms >= bound + floor - 1e-12 and row.latency_p10_ms >= bound + floor - 1e-12
    assert element_bound_ms(["add"], [n], h200)[0] == 0
    mi = get_gpu("mi210")
    assert element_bound_ms(["gelu"], [n], mi)[0] == 0  # NVIDIA's rates stay on NVIDIA
    # AMD's pow has its own rate per CU and clock (ROCm's powf), and the predictor keeps it
    amd = n / (CDNA_ELEMS_PER_CU_CLOCK["pow"] * mi.sm_count * mi.boost_clock_mhz * 1e6) * 1e3
    assert element_bound_ms(["pow"], [n], mi)[0] == pytest.approx(amd)
    row = tile.predict([Elementwise("pow", n, "fp32", inputs=2)], mi).iloc[0]
    assert row.latency_ms >= amd + isolation_floor_ms(tile, mi) - 1e-12
    assert element_bound_ms(["pow"], [n], get_gpu("mi300x"))[0] < element_bound_ms(["pow"], [n], mi)[0]
    # in bf16 the bound binds: pow costs about what it does in fp32, not half
    p16 = tile.predict([ops[0]], h200).latency_ms.iloc[0]
    p32 = tile.predict([Elementwise("pow", n, "fp32", inputs=2)], h200).latency_ms.iloc[0]
    assert p16 > 0.8 * p32


@pytest.mark.parametrize("exp, kind", sorted(POW_FAST.items()))
def test_a_cheap_exponent_runs_its_cheap_kernel(exp, kind):
    x = torch.empty(64, 1024, device="meta")
    op, _, _ = map_op("pow", (x, exp), {}, x)
    (part, _), = leaf_ops(op)
    assert part.kind == kind and part.numel == 64 * 1024


def test_a_general_exponent_or_a_tensor_one_stays_pow():
    x = torch.empty(64, 1024, device="meta")
    for exp in (2.5, x, 7):
        op, _, _ = map_op("pow", (x, exp), {}, x)
        assert leaf_ops(op)[0][0].kind == "pow"


def test_the_script_reads_the_shipped_rates_off_the_sweeps(capsys):
    import element_rates

    folder = ROOT / "measurements" / "h200-2026-12-04"
    if not folder.is_dir():
        pytest.skip("the measurements folder is not here")
    assert element_rates.main([]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bounds"] == ELEMS_PER_SM_CLOCK
    from kit.predict.element_rates import SOFTMAX_ELEMS_PER_SM_CLOCK

    assert {int(k): v for k, v in out["softmax_bounds"].items()} == SOFTMAX_ELEMS_PER_SM_CLOCK
    from kit.predict.element_rates import SOFTMAX_ROW_CLOCKS

    assert {k: tuple(v["fit"]) for k, v in out["softmax_row_latency"].items()} == SOFTMAX_ROW_CLOCKS
    assert all(v["check"]["mape"] < 12 for v in out["softmax_row_latency"].values())
    assert element_rates.main(["--dir", str(folder / "nope")]) == 2


def test_a_lifted_op_keeps_its_band_and_a_small_one_is_not_lifted_to_the_floor():
    tile = get_predictor("tile")
    h200 = get_gpu("h200")
    big = tile.predict([Elementwise("pow", 1 << 24, "bf16", inputs=2)], h200).iloc[0]
    assert big.latency_p10_ms <= big.latency_ms < big.latency_p90_ms  # not collapsed to a point
    # a small op: the bound adds its (tiny) element time, not a jump to the dispatch floor
    small = Elementwise("gelu", 1000, "bf16")
    a100 = get_gpu("a100-pcie-80gb")
    with_bound = tile.predict([small], a100).latency_ms.iloc[0]
    without = tile.predict([Elementwise("relu", 1000, "bf16")], a100).latency_ms.iloc[0]
    assert with_bound < 3 * without


def test_exponents_zero_and_one_and_a_cpu_scalar_tensor():
    x = torch.empty(64, 1024, device="meta")
    assert leaf_ops(map_op("pow", (x, 0), {}, x)[0])[0][0].kind == "fill"
    assert leaf_ops(map_op("pow", (x, 1.0), {}, x)[0])[0][0].kind == "copy"
    assert leaf_ops(map_op("pow", (x, torch.tensor(2.0)), {}, x)[0])[0][0].kind == "square"
    assert leaf_ops(map_op("pow", (2.0, x), {}, x)[0])[0][0].kind == "pow"  # scalar ** tensor


def _softmax_ms(tile, rows, cols, dtype, gpu):
    from kit.ops import Softmax

    return tile.predict([Softmax(r, c, dtype) for r, c in zip(rows, cols)], gpu).latency_ms.to_numpy()


def test_a_16bit_softmax_is_no_faster_than_its_rows_band_allows_on_nvidia_only():
    from kit.predict.element_rates import SOFTMAX_ELEMS_PER_SM_CLOCK, softmax_bound_ms

    tile = get_predictor("tile")
    h200 = get_gpu("h200")
    floor = isolation_floor_ms(tile, h200)
    rows = [256 * 2048, 256 * 1024, 512 * 512]
    cols = [2048, 1024, 512]
    got = _softmax_ms(tile, rows, cols, "bf16", h200)
    for r, c, ms in zip(rows, cols, got):
        rate = SOFTMAX_ELEMS_PER_SM_CLOCK[c] * h200.sm_count * h200.boost_clock_mhz * 1e6
        assert ms >= r * c / rate * 1e3 + floor - 1e-12
    # bf16 no longer halves the time on rows of 1,025-2,048: the elements, not the bytes, set it
    # (rows of 512 in fp32 are bound by their bytes: there bf16 ran 0.75 of fp32's time)
    fp32 = _softmax_ms(tile, rows, cols, "fp32", h200)
    assert (got[:2] > 0.8 * fp32[:2]).all()
    assert softmax_bound_ms([1 << 20], [256], h200)[0] == 0  # short rows: not measured, not bound
    assert softmax_bound_ms([1 << 20], [2048], get_gpu("mi300x"))[0] == 0  # not applied off NVIDIA


def test_the_softmax_bound_grows_with_the_row_across_every_band_edge():
    from kit.predict.element_rates import softmax_bound_ms

    h200 = get_gpu("h200")
    cols = np.arange(200, 6000)
    per_row = softmax_bound_ms(np.ones_like(cols), cols, h200)
    assert (np.diff(per_row) >= 0).all()
    assert per_row[cols == 6000 - 1][0] == per_row[cols == 2048][0]  # a longer row: a row of 2,048
    tile = get_predictor("tile")
    edges = [256, 257, 512, 513, 1024, 1025, 2048, 2049, 4096]
    t = _softmax_ms(tile, [1 << 15] * len(edges), edges, "bf16", h200)
    assert (np.diff(t) >= -1e-12).all(), dict(zip(edges, t))


def test_no_h200_softmax_row_the_rates_were_not_read_from_runs_faster_than_the_bound():
    """The rates were read off the inference passes' softmax and the sweep rows of 20 us or more;
    the training steps' attention softmax (the same kernels in other runs) and the sweep rows
    under 20 us were not used, and none of them ran faster than its band's rate."""
    import element_rates

    folders = [f for f in element_rates.DEFAULT_DIRS if f.is_dir()]
    if len(folders) < 2:
        pytest.skip("the measurement folders are not here")
    held = element_rates.softmax_rows(folders, held_out=True)
    assert (held.source == "model_steps").sum() >= 8 and (held.source == "sweep").sum() >= 50
    out = element_rates.softmax_held_out(held)
    assert all(v["fastest_share_of_bound"] <= 1.0 for v in out.values()), out


@pytest.mark.skipif(not (Path(__import__("os").environ.get("KIT_DATA", ROOT.parent / "shared" / "data" / "neusight"))
                         / "data" / "dataset").is_dir(), reason="NeuSight shared data not present")
def test_no_measured_neusight_softmax_runs_faster_than_the_bound():
    """A consistency check, not a test of the rates: NeuSight's softmax rows are all fp32, and on
    its GPUs their bytes bind before any band's rate could (at full bandwidth 0.3-1.6 elements per
    SM per clock, against 1.64-2.64), so a row could only beat the bound by beating the DRAM. On
    every NVIDIA GPU of NeuSight's softmax rows (training and test) each row took at least it."""
    from kit.predict.element_rates import softmax_bound_ms
    from kit.predict.evaluate import load_neusight_test
    from kit.predict.training import DEFAULT_TRAIN_GPUS, training_frame
    from kit.data import resolve_data_dir
    import pandas as pd

    frame = training_frame(resolve_data_dir(None), DEFAULT_TRAIN_GPUS)
    rows = pd.concat([frame[frame.op_class == "softmax"], (t := load_neusight_test())[t.op_class == "softmax"]])
    assert len(rows) > 1000 and rows.gpu.nunique() >= 6
    for gpu, part in rows.groupby("gpu"):
        bound = softmax_bound_ms(part.rows, part.cols, get_gpu(gpu))
        assert (bound > 0).any()
        assert (part.latency_ms.to_numpy() >= bound).all(), gpu


def test_a_softmax_of_a_few_rows_takes_one_rows_latency_in_the_stream():
    """The warp kernel walks a row in one warp; with a few rows nothing hides that. On the H200 a
    bf16 row of 1,537 ran 8.8 us, where the kit had its 2 us minimum (the tile-MLP's time for it
    sits under the dispatch floor). Longer rows take longer, fp32 less than bf16 per column."""
    from kit.predict.element_rates import SOFTMAX_WARP_MAX_COLS, softmax_row_ms
    from kit.workload.iteration import in_stream_ms

    tile = get_predictor("tile")
    h200 = get_gpu("h200")
    cols = [256, 700, 1537, 2048]
    floor = isolation_floor_ms(tile, h200)
    for dtype in ("bf16", "fp32"):
        pred = tile.predict([Softmax(1, c, dtype) for c in cols], h200)
        stream = in_stream_ms(pred.latency_ms.to_numpy(), pred.roofline_ms.to_numpy(), floor)
        row = softmax_row_ms(cols, h200, dtype)
        assert (stream >= row * (1 - 1e-9)).all(), (dtype, stream, row)
        assert (np.diff(stream) > 0).all()
    assert softmax_row_ms([1537], h200, "bf16")[0] == pytest.approx(8.8e-3, rel=0.05)
    assert softmax_row_ms([1537], h200, "bf16")[0] > softmax_row_ms([1537], h200, "fp32")[0]
    assert softmax_row_ms([SOFTMAX_WARP_MAX_COLS + 1], h200, "bf16")[0] == 0  # another kernel
    assert softmax_row_ms([1024], get_gpu("mi300x"), "bf16")[0] == 0  # NVIDIA's kernel only
    # carried per clock: an A100 (1,410 MHz) takes 1.4x the H200's (1,980) time for the row
    a100 = get_gpu("a100-sxm4-80gb")
    assert softmax_row_ms([1024], a100, "fp32")[0] == pytest.approx(
        softmax_row_ms([1024], h200, "fp32")[0] * 1980 / 1410)


@pytest.mark.skipif(not (NEUSIGHT / "data" / "dataset_amd" / "train" / "elem.csv").is_file(),
                    reason="NeuSight's AMD elementwise rows absent")
def test_pow_rate_script_reads_the_shipped_rate_and_carries_across_generations(capsys):
    """AMD's pow (kit.predict.element_rates.CDNA_ELEMS_PER_CU_CLOCK): the fastest of both GPUs'
    rows, and each GPU's fastest scored on the other's rows far better than the tile-MLP had."""
    import cdna_pow_rate

    assert cdna_pow_rate.main(["--data", str(NEUSIGHT)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["shipped"] == CDNA_ELEMS_PER_CU_CLOCK["pow"]
    assert out["shipped"] == max(r["fastest"] for r in out["rates"].values())
    for r in out["rates"].values():
        assert r["rows"] >= 100 and r["median"] <= r["p90"] <= r["fastest"]
    for c in out["cross_generation"]:
        assert c["rate"]["n"] == c["tile_predictor"]["n"] >= 100
        assert c["rate"]["mape"] < 25 and c["rate"]["geo_bias"] >= 1.0, c  # a bound: never fast
        assert c["tile_predictor"]["mape"] < 25, c
    assert cdna_pow_rate.main(["--data", str(NEUSIGHT / "missing")]) == 2
    assert "not found" in capsys.readouterr().err
