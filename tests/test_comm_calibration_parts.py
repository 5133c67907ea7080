"""A calibrated collective's parts, its curve between measured sizes, sizes past its range, and
one-rank collectives: `kit comm fit` on vTrain's measured 8-GPU all-reduce, then `kit comm predict`."""
import os
import re
from pathlib import Path

import numpy as np
import pytest

from cli_json import cli_json
from kit.cli import main
from kit.comm import BandwidthCurve, Calibration, collective_table, fit_curve, predict_collective
from kit.comm.curves import _switch
from kit.comm.parsers import format_nccl_tests
from kit.errors import KitError

SHARED = Path(os.environ.get("KIT_SHARED", Path(__file__).resolve().parents[2] / "shared"))
VTRAIN = SHARED / "data/vtrain/allreduce_lut_a100.csv"
needs_vtrain = pytest.mark.skipif(not VTRAIN.exists(), reason="shared vTrain data not present")
MIB = 2.0 ** 20


def _vtrain_8gpu():
    """vTrain's 8-GPU all-reduce at powers of two, 1 MiB .. 1 GiB: (sizes, times in us)."""
    import pandas as pd

    d = pd.read_csv(VTRAIN)
    d = d[(d.n_gpus == 8) & (np.log2(d.size_bytes) % 1 == 0)]
    return d.size_bytes.to_numpy(float), d.time_ns_out_of_place.to_numpy() / 1e3


@pytest.fixture(scope="module")
def vtrain_cal(tmp_path_factory):
    """The calibration `kit comm fit` writes from an nccl-tests file of those measurements."""
    s, t = _vtrain_8gpu()
    rows = [{"size_bytes": int(x), "count": int(x) // 4, "dtype": "float", "time_us": float(y)} for x, y in zip(s, t)]
    folder = tmp_path_factory.mktemp("vtrain")
    src = folder / "ar8.txt"
    src.write_text(format_nccl_tests(rows, "allreduce", 8, ["NVIDIA A100-SXM4-80GB"] * 8))
    out = folder / "cal.json"
    assert main(["comm", "fit", str(src), "--system", "dgx-a100", "--out", str(out)]) == 0
    return out


def _predict(capsys, cal, size):
    return cli_json(capsys, ["comm", "predict", "allreduce", "--bytes", size, "--system", "dgx-a100",
                             "--ranks", "8", "--calibration", str(cal)])


@needs_vtrain
@pytest.mark.parametrize("size", ["64M", "1G"])
def test_calibrated_parts_add_up_to_the_time(capsys, vtrain_cal, size):
    # was 0.358 + 0.466 = 0.825 ms against 0.590 at 64 MiB (the upper regime's floor as latency)
    r = _predict(capsys, vtrain_cal, size)
    assert r["time_ms"] > r["floor_ms"]
    assert r["latency_ms"] + r["bandwidth_ms"] == pytest.approx(r["time_ms"], rel=1e-9)


def test_parts_of_a_fitted_curve_add_up_at_any_steepness():
    for k in (0.4, 1.0, 3.0):
        c = BandwidthCurve("allreduce", 8, floor_us=20.0, busbw_max_gbs=200.0, half_bytes=4e6, steepness=k,
                           n_points=10, min_bytes=1e6, max_bytes=1e9)
        r = predict_collective("allreduce", 3e8, "dgx-a100", ranks=8, calibration=Calibration("dgx-a100", (c,)))
        assert r.latency_ms + r.bandwidth_ms == pytest.approx(r.time_ms, rel=1e-12)
        assert r.bandwidth_ms == pytest.approx(1.75 * 3e8 / 200e6)  # the size at the plateau busbw


@needs_vtrain
def test_calibrated_curve_rises_between_measured_sizes(capsys, vtrain_cal):
    # was 358.1 us from 26 MiB to 32 MiB: the upper regime's floor pinned at its 32 MiB measurement
    sweep = cli_json(capsys, ["comm", "predict", "allreduce", "--sizes", "4M:1G:1.02", "--system", "dgx-a100",
                              "--ranks", "8", "--calibration", str(vtrain_cal)])["table"]
    t = np.array([row["time_ms"] for row in sweep])
    assert (np.diff(t) > 0).all()
    s, measured = _vtrain_8gpu()
    fitted = np.array([_predict(capsys, vtrain_cal, str(int(x)))["time_ms"] * 1e3 for x in s])
    assert np.mean(np.abs(fitted / measured - 1)) < 0.03  # still a close fit of the measurements


def _switch_data():
    # a latency-bound algorithm up to 1 MiB, then one with twice the plateau (as in test_comm_curves)
    low = BandwidthCurve("allreduce", 4, floor_us=300.0, busbw_max_gbs=1.5, half_bytes=4e5, steepness=1.0)
    high = BandwidthCurve("allreduce", 4, floor_us=0.0, busbw_max_gbs=3.0, half_bytes=6e6, steepness=1.0)
    s = 2.0 ** np.arange(10, 25)
    return low, high, s, np.where(s < MIB, low.time_us(s), high.time_us(s))


def test_an_upper_regime_keeps_the_calls_floor():
    """The host floor is the call's; an upper regime's sizes cannot tell it, and fitting it had
    pinned it at the regime's smallest measurement (a flat stretch after the switch)."""
    *_, s, t = _switch_data()
    c = fit_curve("allreduce", 4, s, t)
    assert c.upper is not None and c.upper.floor_us == c.floor_us


def test_no_switch_to_a_regime_faster_across_the_whole_gap():
    """A switch there would make a larger message faster than a smaller one: no break there."""
    low, high, *_ = _switch_data()
    faster = BandwidthCurve("allreduce", 4, floor_us=0.0, busbw_max_gbs=30.0, half_bytes=1e3, steepness=1.0)
    assert _switch(low, faster, MIB / 2, MIB) is None
    assert MIB / 2 < _switch(low, high, MIB / 2, MIB) < MIB  # slower across the gap: a jump up, kept


@needs_vtrain
def test_a_size_past_the_calibrated_range_is_noted(capsys, vtrain_cal):
    assert _predict(capsys, vtrain_cal, "1G")["notes"] == []
    r = _predict(capsys, vtrain_cal, "8G")
    assert len(r["notes"]) == 1 and "past the calibrated range" in r["notes"][0] and "1,024 MiB" in r["notes"][0]
    assert "extrapolated along the fitted curve" in r["notes"][0]
    assert main(["comm", "predict", "allreduce", "--bytes", "8G", "--system", "dgx-a100", "--ranks", "8",
                 "--calibration", str(vtrain_cal)]) == 0
    assert "note: 8,192 MiB is past the calibrated range" in capsys.readouterr().out
    sweep = cli_json(capsys, ["comm", "predict", "allreduce", "--sizes", "512M:4G", "--system", "dgx-a100",
                              "--ranks", "8", "--calibration", str(vtrain_cal)])
    assert "2 sizes, 2,048 to 4,096 MiB, are past" in sweep["notes"][0]


@pytest.mark.parametrize("kind", ["allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall"])
def test_one_rank_collectives_report_no_bus_traffic(capsys, kind):
    # broadcast and reduce had reported busbw 1569 GB/s (plateau 1676): the local copy's speed
    r = predict_collective(kind, 2**30, "dgx-h100", ranks=1)
    assert r.busbw_gbs == 0 and r.plateau_busbw_gbs == 0 and r.algbw_gbs > 0
    assert any("one rank" in n for n in r.notes)
    assert (collective_table(kind, [2**20, 2**30], "dgx-h100", ranks=1).busbw_gbs == 0).all()
    assert main(["comm", "predict", kind, "--bytes", "1G", "--ranks", "1", "--system", "dgx-h100"]) == 0
    out = capsys.readouterr().out
    assert "busbw 0.0 GB/s (plateau 0)" in out and "note: one rank" in out
    assert predict_collective(kind, 2**30, "dgx-h100", ranks=8).notes == ()


def test_a_one_rank_run_fits_and_predicts_at_its_memory_copy_rate(tmp_path, capsys):
    """A one-rank nccl-tests run (all_reduce_perf -g 1) copies its buffer in HBM: on an H100
    the preset's own one-rank times plateau at 1,676 GB/s. `kit comm fit` had refused them as
    more than 2 x the 450 GB/s of the GPU's NVLink, which a one-rank collective never uses;
    held to the copy rate instead, a plateau ten times that is still refused."""
    sizes = [2**i for i in range(10, 31)]
    t = collective_table("allreduce", sizes, "dgx-h100", ranks=1)
    rows = [{"size_bytes": int(s), "count": int(s) // 4, "dtype": "float", "time_us": ms * 1e3}
            for s, ms in zip(t.size_bytes, t.time_ms)]
    src = tmp_path / "ar1.txt"
    src.write_text(format_nccl_tests(rows, "allreduce", 1, ["NVIDIA H100 80GB HBM3"]))
    out = tmp_path / "cal1.json"
    assert main(["comm", "fit", str(src), "--system", "dgx-h100", "--out", str(out)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    fitted = predict_collective("allreduce", 3e8, "dgx-h100", ranks=1, calibration=out)
    preset = predict_collective("allreduce", 3e8, "dgx-h100", ranks=1)
    assert fitted.source.startswith("calibration") and fitted.time_ms == pytest.approx(preset.time_ms, rel=0.02)
    copy_gbs = 3e8 / (preset.time_ms * 1e6)  # the preset's own rate, over the 900 GB/s of 2 x NVLink
    assert copy_gbs > 900
    fast = BandwidthCurve("allreduce", 1, 40.0, 10 * 3350.0, 1e5, 1.0)
    with pytest.raises(KitError, match="one-rank copy"):
        predict_collective("allreduce", 3e8, "dgx-h100", ranks=1, calibration=Calibration("dgx-h100", (fast,)))


def test_a_size_below_the_calibrated_range_is_noted():
    """Measured only from 64 MiB up (20 us + S / 200 GB/s), the fit never sees the floor and keeps
    the smallest size's time as it: 1 MiB was predicted in 355 us, as long as 64 MiB takes (the
    line gives 25 us), and only sizes past the range were noted."""
    s = 2.0 ** np.arange(26, 31, 0.5)
    curve = fit_curve("allreduce", 8, s, 20 + s / 200e3)
    cal = Calibration(system="dgx-a100", curves=(curve,), source="big-only.json")
    inside = predict_collective("allreduce", 2.0**28, "dgx-a100", ranks=8, calibration=cal)
    assert inside.source.startswith("calibration") and inside.notes == ()
    small = predict_collective("allreduce", MIB, "dgx-a100", ranks=8, calibration=cal)
    assert len(small.notes) == 1 and "1 MiB is below the calibrated range" in small.notes[0]
    assert "measured from 64 MiB" in small.notes[0] and f"{small.time_ms * 1e3:,.4g} us" in small.notes[0]
    sweep = collective_table("allreduce", [MIB, 2.0**28, 2.0**33], "dgx-a100", ranks=8, calibration=cal)
    (both,) = sweep.attrs["notes"]  # one note naming each side
    assert "8,192 MiB is past" in both and "1 MiB is below" in both


def test_the_below_range_note_gives_the_time_small_sizes_take_not_the_floor():
    """A curve whose latency term (f*S_half/B, 20 us) stands above its floor (1 us): a fit from
    1 KiB with a sharp knee gave a 0.96 us floor under a 19.9 us latency. Below its range every
    size takes about the latency, and the note had named the floor, a time no size is given."""
    half = 20.0 * 200e3 / 1.75  # f = 2 * 7/8 on 8 ranks: latency f * S_half / B = 20 us
    curve = BandwidthCurve("allreduce", 8, 1.0, 200.0, half, 1.0, n_points=12, min_bytes=MIB, max_bytes=2.0**30)
    cal = Calibration(system="dgx-a100", curves=(curve,), source="latency-above-floor.json")
    tiny = predict_collective("allreduce", 1.0, "dgx-a100", ranks=8, calibration=cal)
    (note,) = tiny.notes
    said = {float(x.replace(",", "")) for x in re.findall(r"([0-9][0-9.,]*) us\b", note)}
    assert said == {float(f"{tiny.time_ms * 1e3:.4g}")}  # the time the size is given, no other
    assert tiny.time_ms * 1e3 > 10 * curve.floor_us
