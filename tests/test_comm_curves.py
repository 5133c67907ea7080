"""The bandwidth curve (latency floor, sigmoid rise in log size, plateau), its fit and calibrations."""
import json

import numpy as np
import pytest

from kit.comm import BandwidthCurve, Calibration, fit_curve, fit_table, load_calibration, predict_collective
from kit.errors import KitError


def test_k1_is_the_alpha_beta_model_and_large_k_is_max():
    c = BandwidthCurve("allreduce", 8, floor_us=0.0, busbw_max_gbs=175.0, half_bytes=1e6, steepness=1.0)
    s = np.array([1e3, 1e6, 1e9])
    # f = 1.75, algbw plateau = 100 GB/s = 1e5 B/us: time = (S + S_half) / 1e5
    assert c.time_us(s) == pytest.approx((s + 1e6) / 1e5)
    sharp = BandwidthCurve("allreduce", 8, 0.0, 175.0, 1e6, steepness=40.0)
    assert sharp.time_us(s) == pytest.approx(np.maximum(s, 1e6) / 1e5, rel=0.02)
    assert c.busbw_gbs(1e12) == pytest.approx(175.0, rel=1e-5)
    assert c.busbw_gbs(1e6) == pytest.approx(175.0 / 2)  # half the plateau at S_half (k = 1)
    floored = BandwidthCurve("allreduce", 8, floor_us=50.0, busbw_max_gbs=175.0, half_bytes=1e6, steepness=1.0)
    assert floored.time_us(1.0) == 50.0 and floored.latency_us() == 50.0
    assert floored.crossover_bytes() == pytest.approx(50.0 * 1e5)


def test_fit_recovers_known_parameters_from_noisy_samples():
    rng = np.random.default_rng(0)
    truth = BandwidthCurve("allgather", 4, floor_us=30.0, busbw_max_gbs=120.0, half_bytes=2e6, steepness=1.6)
    s = np.logspace(10, 31, 40, base=2)
    t = truth.time_us(s) * np.exp(rng.normal(0, 0.01, s.size))
    c = fit_curve("allgather", 4, s, t)
    assert c.busbw_max_gbs == pytest.approx(120.0, rel=0.05)
    # floor and f*S_half/B both flatten small sizes (not separately identifiable): check their max
    assert c.latency_us() == pytest.approx(30.0, rel=0.05)
    assert c.fit_mape < 0.02 and c.n_points == 40
    held = np.logspace(10.5, 30.5, 20, base=2)
    assert np.abs(c.time_us(held) / truth.time_us(held) - 1).max() < 0.05


def test_fit_needs_four_sizes():
    with pytest.raises(KitError, match="at least 4"):
        fit_curve("allreduce", 2, [1, 2, 3], [1.0, 2.0, 3.0])


def test_calibration_round_trip_and_use(tmp_path):
    import pandas as pd

    truth = BandwidthCurve("allreduce", 8, 20.0, 200.0, 4e6, 1.3)
    s = np.logspace(12, 30, 12, base=2)
    table = pd.DataFrame({"kind": "allreduce", "ranks": 8, "size_bytes": s, "time_us": truth.time_us(s)})
    cal = fit_table(table, system="dgx-a100", source="synthetic")
    path = cal.save(tmp_path / "cal.json")
    back = load_calibration(path)
    assert back.curve("allreduce", 8) == cal.curve("allreduce", 8)
    r = predict_collective("allreduce", 2**25, "dgx-a100", calibration=path)
    assert r.source.startswith("calibration") and r.algorithm == "ring"
    assert r.time_ms * 1e3 == pytest.approx(float(truth.time_us(2**25)), rel=0.01)
    # no curve for 4 ranks: the preset answers
    assert predict_collective("allreduce", 2**25, "dgx-a100", ranks=4, calibration=path).source == "preset"
    assert isinstance(back, Calibration)


def test_bad_calibration_files(tmp_path):
    with pytest.raises(KitError, match="not found"):
        load_calibration(tmp_path / "nope.json")
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"hello": 1}))
    with pytest.raises(KitError, match="kit comm fit"):
        load_calibration(f)
    f.write_text(json.dumps({"format": "kit-comm-calibration", "curves": [{"kind": "allreduce"}]}))
    with pytest.raises(KitError, match="missing field"):
        load_calibration(f)


def test_a_calibration_only_applies_to_its_own_system(tmp_path):
    import pandas as pd

    truth = BandwidthCurve("allreduce", 8, 20.0, 200.0, 4e6, 1.0)
    s = np.logspace(12, 30, 8, base=2)
    table = pd.DataFrame({"kind": "allreduce", "ranks": 8, "size_bytes": s, "time_us": truth.time_us(s)})
    path = fit_table(table, system="dgx-h100", source="synthetic").save(tmp_path / "h100.json")
    assert predict_collective("allreduce", 2**25, "hgx-h100", calibration=path).source.startswith("calibration")
    with pytest.raises(KitError, match="fitted on system 'dgx-h100'"):
        predict_collective("allreduce", 2**25, "dgx-a100", calibration=path)


def _two_regimes():
    # an algorithm switch at 1 MiB: below it a latency-bound algorithm (floor 300 us, 1.5 GB/s
    # plateau), above it one with a higher latency and twice the plateau
    low = BandwidthCurve("allreduce", 4, floor_us=300.0, busbw_max_gbs=1.5, half_bytes=4e5, steepness=1.0)
    high = BandwidthCurve("allreduce", 4, floor_us=0.0, busbw_max_gbs=3.0, half_bytes=6e6, steepness=1.0)
    return low, high


def test_piecewise_curve_switches_at_the_break_and_round_trips(tmp_path):
    low, high = _two_regimes()
    from dataclasses import replace

    c = replace(low, switch_bytes=2**20, upper=replace(high, fit_mape=0.02), fit_mape=0.01)  # NaN != NaN
    high = c.upper
    s = np.array([2.0**19, 2.0**20, 2.0**23])
    assert c.time_us(s) == pytest.approx([float(low.time_us(2.0**19)), float(high.time_us(2.0**20)),
                                          float(high.time_us(2.0**23))])
    assert c.time_us(2.0**19) == pytest.approx(float(low.time_us(2.0**19)))  # scalar path agrees
    assert c.plateau_gbs() == 3.0 and c.regime(1e3) is c and c.regime(1e9) is high
    assert c.breaks_bytes == (2**20,)
    cal = Calibration("dgx-a100", (c,), "synthetic")
    back = load_calibration(cal.save(tmp_path / "pw.json"))
    assert back.curves[0] == c
    # the preset path reports the regime's own plateau
    r = predict_collective("allreduce", 2.0**24, "dgx-a100", ranks=4, calibration=tmp_path / "pw.json")
    assert r.plateau_busbw_gbs == 3.0 and r.time_ms * 1e3 == pytest.approx(float(high.time_us(2.0**24)))


def test_fit_finds_an_algorithm_switch_and_keeps_one_regime_without_one():
    low, high = _two_regimes()
    rng = np.random.default_rng(1)
    s = 2.0 ** np.arange(10, 25)  # 1 KiB .. 16 MiB
    t = np.where(s < 2**20, low.time_us(s), high.time_us(s)) * np.exp(rng.normal(0, 0.01, s.size))
    c = fit_curve("allreduce", 4, s, t)
    assert len(c.breaks_bytes) == 1 and 2**19 < c.breaks_bytes[0] < 2**20 * 1.0001
    assert np.abs(c.time_us(s) / t - 1).max() < 0.05
    one = fit_curve("allreduce", 4, s, t, breaks=0)
    assert one.breaks_bytes == () and one.fit_mape > 2 * c.fit_mape  # one sigmoid cannot follow the switch
    # data from a single regime: no break is worth its parameters
    t1 = low.time_us(s) * np.exp(rng.normal(0, 0.01, s.size))
    assert fit_curve("allreduce", 4, s, t1).breaks_bytes == ()
    with pytest.raises(KitError, match="breaks"):
        fit_curve("allreduce", 4, s, t1, breaks=3)


def test_a_curve_applies_only_to_groups_spanning_its_nodes(tmp_path):
    from kit.comm.parsers import format_nccl_tests, parse_nccl_tests

    truth = BandwidthCurve("allreduce", 8, 20.0, 200.0, 4e6, 1.0)
    rows = [{"size_bytes": int(s), "count": int(s) // 4, "dtype": "float", "time_us": float(truth.time_us(s))}
            for s in 2 ** np.arange(12, 30, 2)]
    f = tmp_path / "one_node.txt"
    f.write_text(format_nccl_tests(rows, "allreduce", 8, [f"Pid 1 on node1 device {i} X" for i in range(8)]))
    table = parse_nccl_tests(f)
    assert set(table.nodes) == {1}
    path = fit_table(table, system="dgx-h100-x2", source="one node").save(tmp_path / "cal.json")
    assert load_calibration(path).curves[0].nodes == 1
    inside = predict_collective("allreduce", 2**25, "dgx-h100-x2", ranks=8, calibration=path)
    assert inside.source.startswith("calibration")
    # the same 8 ranks over two nodes: the one-node curve does not apply, the preset answers
    split = [0, 1, 2, 3, 8, 9, 10, 11]
    across = predict_collective("allreduce", 2**25, "dgx-h100-x2", ranks=split, calibration=path)
    assert across.source == "preset" and across.nodes_spanned == 2
    assert across.time_ms == predict_collective("allreduce", 2**25, "dgx-h100-x2", ranks=split).time_ms
    # a file naming two hosts records two nodes, and a curve from it answers for the split group
    f.write_text(format_nccl_tests(rows, "allreduce", 8, [f"Pid 1 on node{i // 4} device {i % 4} X"
                                                          for i in range(8)]))
    two = fit_table(parse_nccl_tests(f), system="dgx-h100-x2", source="two nodes")
    assert two.curve("allreduce", 8, 2).nodes == 2 and two.curve("allreduce", 8, 1) is None
    assert predict_collective("allreduce", 2**25, "dgx-h100-x2", ranks=split,
                              calibration=two).source.startswith("calibration")
    # a source that does not say (no nodes column, PARAM): as before, any group of 8 ranks
    unknown = fit_table(table.drop(columns="nodes"), system="dgx-h100-x2")
    assert unknown.curves[0].nodes == 0 and "nodes" not in unknown.curves[0].to_dict()
    assert predict_collective("allreduce", 2**25, "dgx-h100-x2", ranks=split,
                              calibration=unknown).source.startswith("calibration")
