"""The project's own H200 measurements (measurements/h200-2026-12-04): every file loads as the
schema says, gzipped CSVs read like plain ones, `kit evaluate --target kernel` scores kernel
times, and benchmarks/h200_measured.py recomputes its figures from the rows."""
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from benchmark_modules import load_benchmark

from kit.data.records import load_measurements
from kit.errors import KitError
from kit.predict.evaluate import evaluate, load_test, with_target

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "measurements" / "h200-2026-12-04"
CSVS = sorted(FOLDER.glob("*/*.csv.gz"))


def test_every_measurement_file_loads_as_h200_rows():
    assert len(CSVS) >= 10
    total = 0
    for path in CSVS:
        rows = load_measurements(path)
        meta = json.loads(Path(str(path).replace(".csv.gz", ".meta.json")).read_text())
        assert meta["runs"][-1]["device_name"] == "NVIDIA H200"
        assert set(rows.gpu) == {"h200"}
        assert (rows.latency_ms > 0).all() and (rows.kernel_ms > 0).all()
        assert set(rows.dtype) == {meta["runs"][-1]["settings"]["dtype"]}
        total += len(rows)
    assert total == 11303  # the README's count
    steps = [json.loads(line) for f in sorted((FOLDER / "model_steps").glob("*.jsonl"))
             for line in f.read_text().splitlines()]
    assert len(steps) == 48 and all(r["measured_ms"] > 0 and r["measured_kernel_ms"] > 0 for r in steps)


def test_a_gzipped_csv_reads_as_the_plain_one(tmp_path):
    src = CSVS[0]
    plain = tmp_path / "rows.csv"
    plain.write_bytes(gzip.decompress(src.read_bytes()))
    pd.testing.assert_frame_equal(load_measurements(src), load_measurements(plain))
    folder = tmp_path / "tests"
    folder.mkdir()
    shutil.copy(src, folder / "a.csv.gz")
    assert len(load_test(folder)) == len(load_test(src))


def test_a_broken_gzip_is_one_clear_error(tmp_path):
    bad = tmp_path / "rows.csv.gz"
    bad.write_bytes(b"op,latency_ms\nadd,1\n")  # plain text under a .gz name
    with pytest.raises(KitError, match="cannot read .*rows.csv.gz"):
        load_measurements(bad)
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(gzip.compress(CSVS[0].read_bytes())[:40])
    with pytest.raises(KitError, match="cut.csv.gz"):
        load_measurements(cut)


def test_the_kernel_target_scores_kernel_ms(tmp_path):
    rows = load_test(FOLDER / "session" / "decode_bmm_bf16.csv.gz")
    kernel = with_target(rows, "kernel")
    assert np.allclose(kernel.latency_ms, rows.kernel_ms)
    assert (rows.latency_ms != rows.kernel_ms).any()  # a different target, not a relabelling
    by_latency = evaluate(rows, ["roofline"])
    by_kernel = evaluate(rows, ["roofline"], target="kernel")
    assert by_latency[0]["n"] == by_kernel[0]["n"] == len(rows)
    assert by_latency[0]["mape"] != by_kernel[0]["mape"]
    neusight = rows.copy()
    neusight["kernel_ms"] = np.nan  # as NeuSight's rows load
    with pytest.raises(KitError, match="kernel time"):
        with_target(neusight, "kernel")
    with pytest.raises(KitError, match="unknown target"):
        evaluate(rows, ["roofline"], target="wall")


def test_the_benchmark_recomputes_its_figures(tmp_path):
    bench = load_benchmark("h200_measured")
    # a small copy of the folder: one op file, the decode rows, two model rows
    small = tmp_path / "h200"
    (small / "session").mkdir(parents=True)
    (small / "model_steps").mkdir()
    shutil.copy(FOLDER / "session" / "decode_bmm_bf16.csv.gz", small / "session")
    shutil.copy(FOLDER / "session" / "decode_steps_dynamic.jsonl", small / "session")  # current
    shutil.copy(FOLDER / "session" / "decode_steps.jsonl", small / "session")  # stale (see below)
    lines = (FOLDER / "model_steps" / "model_steps_1.jsonl").read_text().splitlines()
    gpt2 = [line for line in lines if '"model": "gpt2"' in line][:1]
    (small / "model_steps" / "a.jsonl").write_text("\n".join(gpt2) + "\n")
    frame = bench.op_rows(small)
    assert len(frame) == 24 and (frame.in_stream_ms <= frame.isolated_ms + 1e-12).all()
    assert (frame.in_stream_ms >= frame.roofline_ms - 1e-12).all()
    out = bench.ops(frame)
    ape = (frame.in_stream_ms - frame.kernel_ms).abs() / frame.kernel_ms * 100
    n = sum(r["n"] for r in out["in_stream_vs_kernel_ms"])
    mean = sum(r["n"] * r["mape"] for r in out["in_stream_vs_kernel_ms"]) / n
    assert n == 24 and mean == pytest.approx(ape.mean(), abs=0.05)
    dec = bench.decode(small)
    measured = [sum(1 for line in (small / "session" / f).read_text().splitlines() if "measured_ms" in line)
                for f in ("decode_steps_dynamic.jsonl", "decode_steps.jsonl")]
    # every static row timed a step that has changed since (tests/test_decode_steps_stale.py)
    assert [len(dec["rows"]), len(dec["stale"])] == measured
    r = dec["rows"][0]
    assert r["ape"] == pytest.approx(abs(r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"] * 100, abs=0.05)
    from kit.api import predict_model

    now = predict_model(r["model"], "h200", mode="decode", batch=r["batch"], seq=r["context"], dtype="bf16",
                        kv_cache=r["kv_cache"])
    assert r["predicted_kernel_ms"] == pytest.approx(now.kernel_ms, abs=1e-3)
    whole = bench.whole_model(small)

    row = json.loads(gpt2[0])
    it = predict_model("gpt2", "h200", mode=row["mode"], batch=row["batch"], seq=row["seq"], dtype=row["dtype"])
    assert whole["rows"][0]["predicted_ms"] == pytest.approx(it.total_ms, abs=1e-3)
    assert whole["summary"][0]["n"] == 1
    lo, hi = whole["rows"][0]["band_ms"]
    assert lo <= whole["rows"][0]["predicted_ms"] <= hi
    assert whole["summary"][0]["band_coverage"] == float(lo <= row["measured_ms"] <= hi)
    assert bench.main(["--dir", str(tmp_path / "missing")]) == 2


def test_the_kernel_target_meets_in_stream_times():
    """A kernel time carries no dispatch floor, so the learned predictors meet it without theirs:
    each prediction is kit.workload.iteration.in_stream_ms of the isolated one."""
    from kit.hardware import get_gpu
    from kit.predict import get_predictor
    from kit.predict.evaluate import predict_rows
    from kit.workload.iteration import in_stream_ms, isolation_floor_ms

    rows = with_target(load_test(FOLDER / "sweeps" / "vector_fp32_c.csv.gz"), "kernel").head(40)
    tile = get_predictor("tile")
    isolated = predict_rows(rows, {"tile": tile})
    stream = predict_rows(rows, {"tile": tile}, in_stream=True)
    floor = isolation_floor_ms(tile, get_gpu("h200"))
    assert floor > 0
    from kit.predict.features import op_from_row

    ops = [op_from_row(r) for r in rows.to_dict("records")]
    roof = get_predictor("roofline").predict(ops, "h200").latency_ms.to_numpy()
    assert np.allclose(stream.predicted_ms, in_stream_ms(isolated.predicted_ms.to_numpy(), roof, floor))
    assert (stream.predicted_ms < isolated.predicted_ms).all()
    scored = {r["op"]: r for r in evaluate(rows, ["tile"], target="kernel")}
    ape = (stream.predicted_ms - stream.measured_ms).abs() / stream.measured_ms * 100
    mine = pd.DataFrame({"op": stream.op, "ape": ape}).groupby("op").ape.mean().round(2)
    assert {op: r["mape"] for op, r in scored.items()} == mine.to_dict()


def test_input_data_effect_pairs_configurations_and_splits_kernel_kinds(tmp_path):
    bench = load_benchmark("h200_measured")
    assert [bench.kernel_kind(n) for n in (
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7",
        "void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1>",
        "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<float>>")] == \
        ["gemm", "attention", "gemm", "other"]
    line = next(line for line in (FOLDER / "model_steps" / "model_steps_1.jsonl").read_text().splitlines()
                if '"model": "gpt2"' in line)
    row = json.loads(line)
    slower = json.loads(line)
    scale = {"gemm": 1.5, "other": 1.2}
    for k in slower["top_kernels"]:
        k["us"] *= scale.get(bench.kernel_kind(k["name"]), 1.0)
    slower["measured_kernel_ms"] *= 1.3
    slower["measured_ms"] *= 1.1
    lone = dict(row, batch=row["batch"] + 1)  # in one folder only: not paired
    for name, rows in (("a", [row, lone]), ("b", [slower])):
        (tmp_path / name / "model_steps").mkdir(parents=True)
        (tmp_path / name / "model_steps" / "s.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = bench.input_data_effect(tmp_path / "a", tmp_path / "b")
    assert len(out["rows"]) == 1
    r = out["rows"][0]
    assert r["kernel_ms_ratio"] == pytest.approx(1.3, abs=1e-3) and r["step_ms_ratio"] == pytest.approx(1.1, abs=1e-3)
    assert r["gemm_ratio"] == pytest.approx(1.5, abs=1e-3) and r["other_ratio"] == pytest.approx(1.2, abs=1e-3)
    assert "attention_ratio" not in r  # gpt2 runs no fused attention kernel
    assert out["by_model"] == [{"model": "gpt2", "configs": 1, "step_ms_ratio": [1.1, 1.1], "kernel_ms_ratio": [1.3, 1.3],
                                "gemm_ratio": [1.5, 1.5], "other_ratio": [1.2, 1.2]}]


def test_in_sample_list_names_constants_that_exist_and_cite_the_h200():
    """The benchmark's in_sample list (the constants read off these folders) names real module
    attributes, and each of them says in its source that the H200's rows set it: a list that
    named a constant since renamed, or one read elsewhere, would misstate what is in-sample."""
    import importlib
    import inspect

    bench = load_benchmark("h200_measured")
    assert bench.IN_SAMPLE
    for name in bench.IN_SAMPLE:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            path, attr = name.rsplit(".", 1)
            module = importlib.import_module(path)
            assert hasattr(module, attr), name
        assert "H200" in inspect.getsource(module), name
