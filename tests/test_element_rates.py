"""kit.predict.element_rates (kinds whose elements set their speed) and the cheap pow exponents
kit.workload.mapping sends to their own kinds."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from kit.hardware import get_gpu
from kit.ops import Elementwise
from kit.predict import get_predictor
from kit.predict.element_rates import ELEMS_PER_SM_CLOCK, element_bound_ms
from kit.workload.iteration import isolation_floor_ms
from kit.workload.kernels import leaf_ops
from kit.workload.mapping import POW_FAST, map_op

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_a_bound_kind_is_no_faster_than_its_elements_on_nvidia_only():
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
    assert element_bound_ms(["pow"], [n], mi)[0] == 0  # not applied off NVIDIA
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
