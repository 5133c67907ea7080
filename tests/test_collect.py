"""The collector: shapes, durable rows, resume without duplicates (kill -9: test_collect_kill.py)."""
import pandas as pd
import pytest

from kit.data import load_measurements, schema
from kit.data.collect import collect, expand_ops, plan, shape_columns
from kit.data.records import HEADER, Appender, repair
from kit.data.shapes import model_layer_shapes, read_dims_file, resolve_shapes
from kit.data.timing import kernels_from_trace, summarise_ms
from kit.errors import KitError


# ---- shapes ---------------------------------------------------------------------------------

def test_dims_file(tmp_path):
    f = tmp_path / "dims.csv"
    f.write_text("# comment\n8;2;18;16\n\n127;168\n8;2;18;16\n4;64;64;3;56;1;1\n")
    assert read_dims_file(f) == [(8, 2, 18, 16), (127, 168), (4, 64, 64, 3, 56, 1, 1)]


@pytest.mark.parametrize("text,message", [("1;2;3\n", r":1: '1;2;3' has 3 dims"),
                                          ("4;x\n", r":1: '4;x' is not whole numbers"),
                                          ("4;0\n", "must be positive"), ("\n# none\n", "has no shapes"),
                                          ("1;3;8;3;8;0;1\n", r":1: '1;3;8;3;8;0;1': dims must be positive"),
                                          ("1;3;8;3;8;1;-1\n", "must be positive")])
def test_bad_dims_files(tmp_path, text, message):
    f = tmp_path / "dims.csv"
    f.write_text(text)
    with pytest.raises(KitError, match=message):
        read_dims_file(f)


def test_named_grids_are_seeded():
    a, b = resolve_shapes("random-bmm:50:1"), resolve_shapes("random-bmm:50:1")
    assert a == b and len(set(a)) == 50 and a != resolve_shapes("random-bmm:50:2")
    assert all(1 <= d <= 1024 for s in a for d in s)
    lin = resolve_shapes("random-linear:30")
    assert all(s[0] == 1 and 4 * (s[1] * s[2] + s[2] * s[3] + s[1] * s[3]) <= 2**30 for s in lin)
    assert all(len(s) == 2 for s in resolve_shapes("random-vec:20"))
    with pytest.raises(KitError, match="unknown shapes 'nope'.*gpt2-layers"):
        resolve_shapes("nope")
    with pytest.raises(KitError, match="COUNT"):
        resolve_shapes("random-bmm:lots")


def test_gpt2_layer_shapes_by_hand():
    shapes = model_layer_shapes("gpt2", batches=(2,))
    # GPT-2 small: hidden 768, 12 heads of 64, ffn 3072, vocab 50257, context 1024; 2·1024 tokens
    for expected in [(1, 2048, 768, 2304), (1, 2048, 768, 768), (1, 2048, 768, 3072),
                     (1, 2048, 3072, 768), (1, 2048, 768, 50257),
                     (24, 1024, 64, 1024), (24, 1024, 1024, 64),
                     (24 * 1024, 1024), (2048, 768), (2048, 3072)]:
        assert expected in shapes
    assert resolve_shapes("gpt2-layers") == model_layer_shapes("gpt2")


def test_shape_columns_follow_the_kit_convention():
    # NeuSight bmm (B×M×N)·(B×N×K): kit k (reduction) = N
    assert shape_columns("bmm", (6, 27, 21, 390)) == {"b": 6, "m": 27, "k": 21, "n": 390}
    assert shape_columns("linear", (2, 58, 13, 141)) == {"b": 1, "m": 116, "k": 13, "n": 141}
    assert shape_columns("softmax", (127, 168)) == {"rows": 127, "cols": 168}


def test_ops_and_plan():
    assert expand_ops("gemm") == ["bmm", "linear"]
    assert expand_ops("layernorm,ln,softmax") == ["ln", "softmax"]
    assert len(expand_ops("elementwise")) == 11
    with pytest.raises(KitError, match="unknown op 'matmul'"):
        expand_ops("gemm,matmul")
    tasks, unmatched = plan(["bmm", "relu"], [(1, 2, 3, 4), (5, 6)])
    assert tasks == [("bmm", (1, 2, 3, 4)), ("relu", (5, 6))] and unmatched == []
    tasks, unmatched = plan(["bmm", "relu"], [(1, 2, 3, 4)])
    assert unmatched == ["relu"]
    with pytest.raises(KitError, match="no shape fits.*B;H"):
        plan(["relu"], [(1, 2, 3, 4)])


def test_summary_statistic_is_the_fastest_fifth():
    times = [5.0, 1.0, 2.0, 9.0, 3.0, 4.0, 8.0, 7.0, 6.0, 10.0]
    assert summarise_ms(times) == pytest.approx((1.0 + 2.0) / 2)
    assert summarise_ms([3.0, 2.0, 4.0]) == 2.0


def test_kernels_from_a_kineto_trace():
    # events in the shape torch.profiler's chrome trace writes (cf. HTA's Kineto fixtures)
    events = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5, "dur": 3},
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "ts": 20, "dur": 40,
         "args": {"grid": [32, 1, 2], "block": [128, 1, 1], "blocks per SM": 0.59, "warps per SM": 2.37}},
        {"ph": "X", "cat": "kernel", "name": "splitKreduce_kernel", "ts": 70, "dur": 4,
         "args": {"grid": [4, 1, 1], "block": [256, 1, 1]}},
        {"ph": "X", "cat": "kernel", "name": "memset", "ts": 10, "dur": 1, "args": {}},
    ]
    k = kernels_from_trace(events)
    assert k["kernel_name"] == "ampere_sgemm_128x64_tn"
    assert k["kernels"] == "memset;ampere_sgemm_128x64_tn;splitKreduce_kernel" and k["n_kernels"] == 3
    assert (k["grid_x"], k["grid_y"], k["grid_z"], k["block_x"]) == (32, 1, 2, 128)
    assert (k["blocks_per_sm"], k["warps_per_sm"]) == (0.59, 2.37)
    assert kernels_from_trace([]) == {}


# ---- durable rows -----------------------------------------------------------------------------

def _row(m, latency=0.5):
    return {"op": "bmm", "op_class": "gemm", "dtype": "fp32", "device_name": "cpu: test", "b": 1,
            "m": m, "n": 2, "k": 3, "latency_ms": latency, "source": "collector", "split": "train"}


def test_appender_writes_header_once_and_skips_known_rows(tmp_path):
    out = tmp_path / "m.csv"
    with Appender(out) as a:
        a.append(_row(1))
        a.append(_row(2))
        a.append(_row(1))  # same op+shape+dtype+device: not written twice
    with pytest.raises(KitError, match="already exists; pass --resume"):
        Appender(out)
    with Appender(out, resume=True) as a:
        assert len(a.keys) == 2
        a.append(_row(2))
        a.append(_row(3))
    lines = out.read_text().splitlines()
    assert lines[0] == ",".join(HEADER) and lines.count(lines[0]) == 1 and len(lines) == 4
    d = load_measurements(out)
    schema.check(d)
    assert d.m.tolist() == [1, 2, 3] and pd.isna(d.gpu).all()


def test_unfinished_last_line_is_repaired_on_resume_and_ignored_on_read(tmp_path):
    out = tmp_path / "m.csv"
    with Appender(out) as a:
        a.append(_row(1))
        a.append(_row(2))
    good = out.read_bytes()
    with open(out, "ab") as f:
        f.write(b"bmm,gemm,,false,,cpu: test,fp32,1,3,")  # what a kill mid-write could leave
    with pytest.warns(UserWarning, match="unfinished last line"):
        assert load_measurements(out).m.tolist() == [1, 2]
    assert repair(out) > 0 and out.read_bytes() == good and repair(out) == 0
    with open(out, "ab") as f:
        f.write(b"bmm,gemm")
    with pytest.warns(UserWarning, match="dropped an unfinished"):
        with Appender(out, resume=True) as a:
            a.append(_row(3))
    assert load_measurements(out).m.tolist() == [1, 2, 3]
    # a last row with every field but no newline is unfinished too (a kill can cut its last field
    # short: 0.0123 to 0.0): resume drops it, with the note, and it is measured again
    out.write_bytes(out.read_bytes().rstrip(b"\n"))
    with pytest.warns(UserWarning, match="dropped an unfinished"):
        with Appender(out, resume=True) as a:
            assert len(a.keys) == 2
            a.append(_row(4))
    assert load_measurements(out).m.tolist() == [1, 2, 4]


def test_resume_refuses_a_foreign_csv(tmp_path):
    out = tmp_path / "other.csv"
    out.write_text("a,b\n1,2\n")
    with pytest.raises(KitError, match="not a kit measurement CSV"):
        Appender(out, resume=True)


def test_bad_collector_csv_is_a_clear_error(tmp_path):
    out = tmp_path / "m.csv"
    with Appender(out) as a:
        a.append(_row(1, latency=0.5))
    text = out.read_text().replace(",0.5,", ",-1.0,")
    out.write_text(text)
    with pytest.raises(KitError, match="latency_ms must be a positive"):
        load_measurements(out)


# ---- measuring on the CPU -------------------------------------------------------------------

def test_collect_tiny_shapes_on_cpu(tmp_path):
    out = tmp_path / "m.csv"
    shapes = [(2, 3, 4, 5), (1, 8, 8, 8), (3, 5), (16, 7)]
    r = collect("gemm,elementwise,softmax,layernorm", shapes, out, device="cpu", warmup=1,
                repeats=3, progress=False, threads=1)
    assert r["measured"] == 2 * 2 + 13 * 2 and r["failed"] == [] and r["skipped"] == 0
    d = load_measurements(out)
    schema.check(d)
    assert len(d) == 30 and (d.latency_ms > 0).all()
    assert set(d.source) == {"collector"} and set(d["dtype"]) == {"fp32"}
    assert d.device_name.str.startswith("cpu: ").all() and d.torch_version.notna().all()
    bmm = d[d.op == "bmm"].sort_values("m")
    assert bmm[["b", "m", "k", "n"]].values.tolist() == [[2, 3, 4, 5], [1, 8, 8, 8]]
    lin = d[(d.op == "linear") & (d.m == 6)].iloc[0]
    assert (lin.b, lin.k, lin.n) == (1, 4, 5)
    conv = collect("conv", [(1, 2, 3, 3, 6, 2, 1)], out, device="cpu", warmup=1, repeats=3,
                   resume=True, progress=False)
    assert conv["measured"] == 1
    c = load_measurements(out).query("op == 'conv'").iloc[0]
    assert (c.b, c.in_channels, c.out_channels, c.kernel_size, c.input_size, c.stride, c.padding) == (
        1, 2, 3, 3, 6, 2, 1) and c.latency_ms > 0
    again = collect("gemm,elementwise,softmax,layernorm", shapes, out, device="cpu", warmup=1,
                    repeats=3, resume=True, progress=False)
    assert (again["measured"], again["skipped"], again["rows_in_file"]) == (0, 30, 31)


def test_the_same_gemm_twice_is_measured_once(tmp_path):
    # linear on (2, 3, 4) and on (1, 6, 4) inputs is the same 6x4 @ 4x5 GEMM
    r = collect("linear", [(2, 3, 4, 5), (1, 6, 4, 5)], tmp_path / "m.csv", device="cpu", warmup=0,
                repeats=1, progress=False)
    assert (r["measured"], r["rows_in_file"]) == (1, 1)


def test_collect_rejects_bad_settings(tmp_path):
    with pytest.raises(KitError, match="tf32 needs --device cuda"):
        collect("bmm", [(1, 2, 3, 4)], tmp_path / "x.csv", device="cpu", dtype="tf32")
    with pytest.raises(KitError, match="--repeats >= 1"):
        collect("bmm", [(1, 2, 3, 4)], tmp_path / "x.csv", device="cpu", repeats=0)
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("ops", ["softmax", "bmm,gelu", "elementwise"])
def test_tf32_vector_ops_are_refused_before_any_work(tmp_path, ops):
    """TF32 is a tensor-core mode of GEMMs and convolutions: a vector op under --dtype tf32 runs
    its fp32 kernel, so the rows were fp32 timings labelled tf32, which own_rows drops (device
    time spent on nothing). Refused on any device, before a file is written."""
    out = tmp_path / "x.csv"
    with pytest.raises(KitError, match="tf32 is a tensor-core mode.*with --dtype fp32"):
        collect(ops, [(1, 64)], out, device="cuda", dtype="tf32")
    assert not out.exists()


@pytest.mark.parametrize("kw, word", [({"threads": -3}, "--threads"), ({"threads": 0}, "--threads"),
                                      ({"threads": 1.5}, "--threads"),
                                      ({"cooldown_ms": -5}, "--cooldown-ms"),
                                      ({"cooldown_ms": float("nan")}, "--cooldown-ms"),
                                      ({"repeats": 2.5}, "--repeats"), ({"repeats": "3"}, "--repeats"),
                                      ({"warmup": 1.5}, "--warmup"), ({"repeats": True}, "--repeats")])
def test_collect_refuses_bad_settings_before_measuring(tmp_path, kw, word):
    out = tmp_path / "m.csv"
    with pytest.raises(KitError, match=word):
        collect("add", "tiny-vec:2", out, **kw)
    assert not out.exists()


def test_decode_grids_hold_every_weight_a_zoo_decode_step_reads():
    """decode-linear against the capture itself: each weight GEMM of a decode step of the zoo's
    gpt2, opt-1.3b and llama3-8b (and llama3-70b's) is in the grid, at m = 1..64."""
    from kit.data.shapes import DECODE_TOKENS, decode_shapes
    from kit.workload import zoo

    linear = set(resolve_shapes("decode-linear"))
    assert linear == set(decode_shapes("decode-linear")) and {1, 64} <= set(DECODE_TOKENS)
    for model in ("gpt2", "opt-1.3b", "llama3-8b", "llama3-70b"):
        g = zoo.graph_for(model, batch=1, seq=16, mode="decode", dtype="bf16", disk=False)
        weights = {(n.op.k, n.op.n) for n in g if n.op_class == "gemm" and n.op.kind != "bmm"}
        assert weights, model
        for k, n in weights:
            assert {(1, m, k, n) for m in DECODE_TOKENS} <= linear, (model, k, n)
    bmm = resolve_shapes("decode-bmm")
    assert all(b > 1 and m == 1 for b, m, _, _ in bmm)
    assert {(b, n, k) for b, _, n, k in bmm} == {(b, k, n) for b, _, n, k in bmm}  # q·Kᵀ and p·V


def test_a_dims_file_shape_past_any_gpus_memory_is_refused_before_timing(tmp_path):
    """The readers refuse a row with an operand past 2^40 elements (kit.data.schema); timed from
    a dims file, it had made the whole CSV unloadable, --resume included. A long vector that a
    GPU holds (3e9 elements, 12 GB in fp32) is a shape."""
    f = tmp_path / "dims.txt"
    f.write_text("3000000000;1\n4;1024;1024;1024\n")
    assert read_dims_file(f) == [(3000000000, 1), (4, 1024, 1024, 1024)]
    f.write_text("4;1024;1024;1024\n1;2000000;1;2000000\n")
    with pytest.raises(KitError, match=r"dims\.txt:2: .*operand of 4e\+12 elements is past the 2\^40"):
        read_dims_file(f)
    f.write_text("2000000;600000\n")
    with pytest.raises(KitError, match=r"dims\.txt:1: .*past the 2\^40"):
        read_dims_file(f)


def test_a_grid_asked_for_more_shapes_than_it_holds_says_so():
    from kit.data.shapes import resolve_shapes

    assert len(resolve_shapes("tiny-vec:1024")) == 1024  # every (B, H) in [1, 32]^2
    with pytest.raises(KitError, match="tiny-vec gave 1024 distinct shapes, fewer than the 2000 asked"):
        resolve_shapes("tiny-vec:2000")
