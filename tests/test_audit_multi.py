"""Audit of the multi-GPU user surface: bad inputs give one KitError line, never a traceback,
a silently dropped row, or a number that contradicts itself."""
import pytest

from cli_support import one_error_line as _err
from kit.cli import main
from kit.errors import KitError




# ---- kit comm ---------------------------------------------------------------------------------

def _nccl(rows) -> str:
    """A minimal 8-rank all_reduce_perf section; rows are token lists after size/count/type/redop/root."""
    head = "# Collective test starting: all_reduce_perf\n" + "".join(
        f"#  Rank {i:2d} Group  0 Pid 1 on n device {i} [0x07] A100\n" for i in range(8))
    return head + "".join("  ".join(r) + "\n" for r in rows)


def _row(size, time="30.00"):
    return [str(size), str(max(int(size) // 4, 0) if str(size).lstrip("-").isdigit() else 1), "float",
            "sum", "-1", time, "1.0", "1.75", "0", time, "1.0", "1.75", "0"]


SIZES = [1024, 4096, 16384, 65536, 262144, 1048576]


def _fit_error(tmp_path, capsys, row, col, value) -> str:
    """`kit comm fit` on a good file with one cell replaced; the one error line."""
    rows = [_row(s) for s in SIZES]
    rows[row][col] = value
    f = tmp_path / "ar.txt"
    f.write_text(_nccl(rows))
    return _err(capsys, ["comm", "fit", str(f), "--system", "dgx-a100"])


@pytest.mark.parametrize("bad", ["nan", "inf", "-5.0"])
def test_comm_fit_rejects_a_corrupt_time_instead_of_dropping_the_row(tmp_path, capsys, bad):
    line = _fit_error(tmp_path, capsys, 2, 5, bad)
    assert "line 12" in line and repr(bad) in line  # 1 header + 8 rank lines + the third row


def test_comm_fit_rejects_a_negative_size_row_instead_of_skipping_it(tmp_path, capsys):
    assert "'-1024'" in _fit_error(tmp_path, capsys, 0, 0, "-1024")


def test_comm_fit_non_numeric_count_is_one_line(tmp_path, capsys):
    assert "'abc'" in _fit_error(tmp_path, capsys, 1, 1, "abc")


def test_comm_fit_out_to_a_directory_is_one_line(tmp_path, capsys):
    f = tmp_path / "ar.txt"
    f.write_text(_nccl([_row(s, f"{20 + s / 1e5:.2f}") for s in SIZES]))
    assert main(["comm", "fit", str(f), "--system", "dgx-a100", "--json"]) == 0  # the file is fine
    capsys.readouterr()
    assert "is a directory" in _err(capsys, ["comm", "fit", str(f), "--system", "dgx-a100",
                                          "--out", str(tmp_path)])


@pytest.mark.parametrize("argv, needle", [
    (["--bytes", "1,000"], "'1,000'"),
    (["--bytes", "1.5.5M"], "'1.5.5M'"),
    (["--bytes", "inf"], "'inf'"),  # the message quotes what was typed, not 'NF'
    (["--sizes", "1K:1M:abc"], "FACTOR"),
])
def test_comm_predict_bad_sizes_are_one_line(capsys, argv, needle):
    assert needle in _err(capsys, ["comm", "predict", "allreduce", *argv])


def test_parse_sizes_decimal_and_binary_units():
    from kit.comm.measure import parse_sizes

    assert parse_sizes(".5M,1.5K,2") == [2, 1536, 524288]  # 0.5 x 2^20, 1.5 x 2^10
    assert parse_sizes("64KiB:256KiB") == [65536, 131072, 262144]


# ---- kit predict --system: model shapes and layouts --------------------------------------------

BASE = "gpt:layers=4,hidden=1024,heads=16,seq=512,vocab=50257"


@pytest.mark.parametrize("extra, needle", [
    ("ffn=0", "ffn"),  # was silently the default 4 x hidden
    ("kv_heads=0", "kv_heads"),  # was silently the heads
    ("kv_heads=5", "divide heads 16"),
    ("experts=-1", "experts"),  # was silently dense
    ("experts=8,moe_every=0", "moe_every"),  # was ZeroDivisionError
    ("experts=8,topk=9", "topk 9"),
    ("experts=8,topk=0", "topk"),
])
def test_inline_model_rejects_impossible_shapes(capsys, extra, needle):
    assert needle in _err(capsys, ["predict", f"{BASE},{extra}", "--system", "dgx-a100"])


def test_analytic_tp_must_divide_kv_heads(capsys):
    # 16 query heads in 4 groups: tp 8 cannot split 4 key/value heads (Megatron asserts the same)
    assert "key/value heads 4" in _err(capsys, ["predict", f"{BASE},kv_heads=4", "--system", "dgx-a100",
                                                "--tp", "8"])


def test_ep_needs_experts_it_can_divide(capsys):
    assert "no experts" in _err(capsys, ["predict", "gpt2", "--system", "dgx-h100", "--dp", "2", "--ep", "2"])
    assert "3 experts" in _err(capsys, ["predict", f"{BASE},experts=3", "--system", "dgx-h100",
                                        "--dp", "2", "--ep", "2"])


def test_moe_active_params_and_mfu_count_only_the_routed_experts():
    from kit.api import predict_multi_gpu
    from kit.parallel import parse_model

    spec = parse_model("gpt:layers=2,hidden=64,heads=4,seq=32,vocab=1000,experts=4,topk=1,moe_every=1")
    expert = 2 * 64 * 256 + 256 + 64  # two matrices and their biases, ffn 4 x 64
    assert spec.active_params == spec.params - 2 * 3 * expert  # 3 idle experts in each of 2 layers
    # Mixtral 8x7B: 46.7B parameters, 12.9B active (Jiang et al. 2024)
    mixtral = parse_model("mixtral-8x7b")
    assert abs(mixtral.active_params / 1e9 - 12.9) < 0.05
    r = predict_multi_gpu(spec, "dgx-h100", dp=2, ep=2, dtype="bf16", graph=False)
    from kit.hardware import get_gpu

    peak = get_gpu("h100-sxm").gemm_peak_tflops("bf16")
    tokens = 2 * 32
    want = 6 * spec.active_params * tokens / (r["iteration_ms"] / 1e3) / (peak * 1e12 * 2)
    assert r["mfu"] == pytest.approx(want, rel=1e-9)


def test_predict_multi_gpu_unknown_layout_field_is_a_kit_error():
    from kit.api import predict_multi_gpu

    with pytest.raises(KitError, match="tpp"):
        predict_multi_gpu("gpt2", "dgx-a100", tpp=2)


# ---- kit shard ---------------------------------------------------------------------------------

TABLES = "name,rows,dim,pooling\nt0,1000000,64,20\nt1,500000,128,10\nt2,20000,32,1\n"


def _tables(tmp_path, text=TABLES, bom=False):
    f = tmp_path / "tables.csv"
    f.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return str(f)


def test_shard_reads_a_csv_with_a_byte_order_mark(tmp_path):
    from kit.sharding import read_tables

    plain, marked = read_tables(_tables(tmp_path)), read_tables(_tables(tmp_path, bom=True))
    assert [t.name for t in marked] == ["t0", "t1", "t2"] and [t.rows for t in marked] == [t.rows for t in plain]


@pytest.mark.parametrize("kinds", [["dp"], ["rw"], ["cw", "dp"]])
def test_shard_without_table_wise_plans_with_the_kinds_allowed(tmp_path, kinds):
    from kit.api import shard_tables

    r = shard_tables(_tables(tmp_path), "dgx-a100", time_budget_s=0.2, kinds=kinds)
    assert {p["kind"] for p in r["plan"]} <= set(kinds)
    # the cost: the slowest forward, the slowest backward (the all-to-alls sync the ranks between
    # them) and the collectives
    parts = r["parts"]
    comm = sum(parts[k] for k in ("input_alltoall_ms", "output_alltoall_ms", "grad_alltoall_ms", "allreduce_ms"))
    assert r["cost_ms"] == pytest.approx(max(parts["fwd_ms"]) + max(parts["bwd_ms"]) + comm, rel=1e-6)


def test_shard_kinds_with_no_placement_is_one_line(tmp_path, capsys):
    # twrw needs several nodes; dgx-a100 is one
    line = _err(capsys, ["shard", "--tables", _tables(tmp_path), "--system", "dgx-a100", "--kinds", "twrw"])
    assert "twrw" in line and "t0" in line
    assert "empty" in _err(capsys, ["shard", "--tables", _tables(tmp_path), "--system", "dgx-a100",
                                    "--kinds", ","])
    assert "directory" in _err(capsys, ["shard", "--tables", str(tmp_path), "--system", "dgx-a100"])


def test_shard_tiny_memory_cap_is_printed_as_given(tmp_path, capsys):
    line = _err(capsys, ["shard", "--tables", _tables(tmp_path), "--system", "dgx-a100",
                         "--memory-gib", "0.0001", "--budget-s", "0.2"])
    assert "0.0001 GiB" in line  # was "0.0 GiB"


def test_replay_et_and_no_et_conflict(capsys):
    assert "not allowed" in _err(capsys, ["replay", "x.json", "--et", "y.json", "--no-et"])


# ---- kit collect, collect-comm, collect-embedding: error paths (no GPU needed) ----------------

@pytest.mark.parametrize("argv", [
    ["collect", "--ops", "gemm", "--shapes", "tiny-gemm:1", "--device", "cpu"],
    ["collect-embedding"],
    ["collect-comm", "--sizes", "1K:2K"],
])
def test_collect_out_directory_is_one_line_before_measuring(tmp_path, capsys, argv):
    assert "directory" in _err(capsys, [*argv, "--out", str(tmp_path)])


@pytest.mark.parametrize("flag, value", [("--cooldown-ms", "-5"), ("--cooldown-ms", "nan"),
                                         ("--threads", "-3"), ("--threads", "0")])
def test_collect_rejects_bad_cooldown_and_threads(tmp_path, capsys, flag, value):
    out = tmp_path / "c.csv"
    line = _err(capsys, ["collect", "--ops", "gemm", "--shapes", "tiny-gemm:1", "--device", "cpu",
                         "--out", str(out), flag, value])
    assert flag in line and not out.exists()  # nothing measured first


@pytest.mark.parametrize("flag, value, needle", [("--dist", ";", "empty"), ("--mode", ",", "empty"),
                                                 ("--mode", "max", "'max'")])
def test_collect_embedding_empty_grid_or_unknown_mode_is_an_error(tmp_path, capsys, flag, value, needle):
    out = tmp_path / "e.csv"
    assert needle in _err(capsys, ["collect-embedding", "--out", str(out), flag, value])
    assert not out.exists()  # was: a header-only file and "0 rows written" (or a row failure per config)


# ---- the Python verbs --------------------------------------------------------------------------

def test_shard_tables_verb_checks_nodes_budget_and_takes_a_kinds_string(tmp_path):
    from kit.api import shard_tables

    with pytest.raises(KitError, match="nodes"):
        shard_tables(_tables(tmp_path), "dgx-a100", nodes=0)  # was silently one node
    with pytest.raises(KitError, match="time budget"):
        shard_tables(_tables(tmp_path), "dgx-a100", time_budget_s=-1)
    r = shard_tables(_tables(tmp_path), "dgx-a100", kinds="rw,dp", time_budget_s=0.1)  # was 'r', 'w'
    assert {p["kind"] for p in r["plan"]} <= {"rw", "dp"}


@pytest.mark.parametrize("kw, needle", [({"graph": "maybe"}, "graph"), ({"system": None}, "system"),
                                        ({"model": 123}, "model")])
def test_predict_multi_gpu_bad_arguments_are_kit_errors(kw, needle):
    from kit.api import predict_multi_gpu

    args = {"model": "gpt2", "system": "dgx-a100", **kw}
    with pytest.raises(KitError, match=needle):
        predict_multi_gpu(args.pop("model"), args.pop("system"), **args)


# ---- systems -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["dgx-h100-x0", "dgx-h100-x99999999999"])
def test_system_node_suffix_out_of_range_is_one_line(capsys, name):
    # x0 was ValueError (max of no nodes), a huge count a MemoryError building the rank list
    assert "nodes must be" in _err(capsys, ["comm", "predict", "allreduce", "--bytes", "1e6", "--system", name])


def test_system_node_limit_is_inclusive():
    from kit.hardware.system import MAX_NODES, get_system

    assert get_system("dgx-h100", nodes=MAX_NODES).world_size == 8 * MAX_NODES
    with pytest.raises(KitError, match="nodes"):
        get_system("dgx-h100", nodes=MAX_NODES + 1)


def test_comm_fit_ranks_hint_checked_against_the_file_and_the_system(tmp_path, capsys):
    rows = [_row(s, f"{20 + s / 1e5:.2f}") for s in SIZES]
    f = tmp_path / "ar.txt"
    f.write_text(_nccl(rows))  # 8 '#  Rank' lines
    assert "8 '#  Rank'" in _err(capsys, ["comm", "fit", str(f), "--system", "dgx-a100", "--ranks", "64"])
    assert "positive" in _err(capsys, ["comm", "fit", str(f), "--system", "dgx-a100", "--ranks=-4"])
    bare = tmp_path / "bare.txt"  # no device lines: the hint is the rank count
    bare.write_text("\n".join(ln for ln in _nccl(rows).splitlines() if "Rank" not in ln) + "\n")
    assert "has 8 GPUs" in _err(capsys, ["comm", "fit", str(bare), "--system", "dgx-a100", "--ranks", "64"])
    assert main(["comm", "fit", str(bare), "--system", "dgx-a100", "--nodes", "8", "--ranks", "64", "--json"]) == 0
    assert '"ranks": 64' in capsys.readouterr().out


PARAM_HEAD = ("\tCOMMS-RES-all_reduce-float32  size (B)  num-elements  Latency(us):p50  p75  p95  Min  Max  "
              "algBW(GB/s)  busBW(GB/s)\n")


@pytest.mark.parametrize("col, bad, needle", [(2, "nan", "'nan'"), (2, "-3", "'-3'"), (0, "-4096", "-4096"),
                                              (0, "4096.5", "4096.5")])
def test_param_corrupt_latency_or_size_is_named_not_dropped(tmp_path, capsys, col, bad, needle):
    lines = []
    for s in SIZES:
        t = 20 + s / 1e5
        alg = s / t / 1e3
        vals = [str(s), str(s // 4)] + [f"{t:.2f}"] * 5 + [f"{alg:.2f}", f"{alg * 1.75:.2f}"]
        lines.append(vals)
    lines[1][col] = bad
    f = tmp_path / "param.txt"
    f.write_text(PARAM_HEAD + "".join("\tCOMMS-RES-all_reduce-float32  " + "  ".join(v) + "\n" for v in lines))
    line = _err(capsys, ["comm", "fit", str(f), "--system", "dgx-a100"])
    assert "line 3" in line and needle in line


# ---- kit replay --------------------------------------------------------------------------------

def _kineto(tmp_path, kernel_dur=40.0, rank=None):
    import json

    ev = lambda name, ts, dur, cat, tid=1, **a: {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat,
                                                  "pid": 1, "tid": tid, "args": a}
    doc = {"traceEvents": [ev("ProfilerStep#1", 0, 100, "cpu_op"), ev("aten::mm", 10, 20, "cpu_op"),
                           ev("cudaLaunchKernel", 15, 5, "cuda_runtime", correlation=7),
                           ev("sgemm", 30, kernel_dur, "kernel", tid=7, correlation=7, stream=7)],
           "deviceProperties": [{"name": "NVIDIA A100-SXM4-40GB"}]}
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank}
    f = tmp_path / "trace.json"
    f.write_text(json.dumps(doc))  # json writes inf as Infinity, as a broken exporter could
    return str(f)


def test_replay_skips_an_infinite_duration_instead_of_printing_inf(tmp_path):
    import math

    from kit.api import replay_trace

    r = replay_trace(_kineto(tmp_path, kernel_dur=float("inf")))
    (rank,) = r["ranks"]
    assert math.isfinite(rank["predicted_ms"]) and rank["predicted_ms"] == pytest.approx(0.100)
    assert any("skipped 1 event" in n for n in r["notes"])


def test_replay_negative_rank_in_distributed_info_is_not_a_rank(tmp_path):
    from kit.api import replay_trace

    r = replay_trace(_kineto(tmp_path, rank=-3))
    assert [x["rank"] for x in r["ranks"]] == [0]


def test_virtual_stages_with_an_explicit_non_interleaved_schedule_is_an_error(capsys):
    from kit.parallel import Layout

    with pytest.raises(KitError, match="gpipe"):  # was silently turned into interleaved
        Layout(pp=2, virtual_stages=2, schedule="gpipe")
    assert Layout(pp=2, virtual_stages=2).schedule == "interleaved"  # the default still switches
    assert "--schedule 1f1b" in _err(capsys, ["predict", BASE, "--system", "dgx-a100", "--pp", "2",
                                              "--virtual-stages", "2", "--schedule", "1f1b"])


def test_sequence_parallel_needs_seq_divisible_by_tp(capsys):
    line = _err(capsys, ["predict", "gpt:layers=2,hidden=256,heads=4,seq=511,vocab=1000", "--system",
                         "dgx-a100", "--tp", "2", "--sequence-parallel"])
    assert "seq 511" in line


def test_parallel_text_says_where_the_kernels_come_from(capsys):
    assert main(["predict", "gpt:layers=2,hidden=256,heads=4,seq=128,vocab=1000", "--system", "dgx-a100",
                 "--tp", "2", "--sequence-parallel"]) == 0
    assert "kernels from the analytic GPT layer" in capsys.readouterr().out


def test_moe_inline_shape_needs_experts():
    from kit.parallel import parse_model

    with pytest.raises(KitError, match="experts"):  # was silently a dense model
        parse_model("moe:layers=2,hidden=64,heads=4")
    assert parse_model("moe:layers=2,hidden=64,heads=4,experts=4").experts == 4


def test_shard_unknown_column_is_named_not_ignored(tmp_path, capsys):
    # 'zipf' instead of 'zipf_alpha' made every table uniform without a word
    f = _tables(tmp_path, "name,rows,dim,pooling,zipf\nt0,1000,16,4,1.2\n")
    assert "'zipf'" in _err(capsys, ["shard", "--tables", f, "--system", "dgx-a100"])


@pytest.mark.parametrize("flag", [["--tp", "2"], ["--sequence-parallel"], ["--zero", "1"], ["--nodes", "2"]])
def test_layout_flag_without_system_is_an_error_not_one_gpu(capsys, flag):
    line = _err(capsys, ["predict", "gpt2", "--gpu", "a100-sxm4-40gb", "--seq", "64", *flag])
    assert flag[0] in line and "--system" in line


def test_gpu_and_system_together_is_an_error(capsys):
    # the system's own GPU was used and --gpu silently dropped
    assert "--gpu" in _err(capsys, ["predict", BASE, "--gpu", "a100-sxm4-40gb", "--system", "dgx-h100"])


def test_sim_graph_refuses_an_infinite_duration():
    from kit.sim.graph import ExecGraph

    g = ExecGraph()
    with pytest.raises(KitError, match="finite"):  # an inf op made the makespan and errors inf
        g.cpu(0, float("inf"), "launch")
    op = g.cpu(0, 1.0, "launch")
    with pytest.raises(KitError, match="finite"):
        g.set_duration(op, float("inf"))


# ---- DLRM hybrid -------------------------------------------------------------------------------

def _dlrm_spec(**kw):
    from kit.embedding import Table
    from kit.parallel.dlrm import DLRMSpec

    return DLRMSpec(tables=tuple(Table(rows=10000, dim=128, pooling=4) for _ in range(8)), **kw)


@pytest.mark.parametrize("kw, needle", [({"bottom": ()}, "bottom"),  # was IndexError
                                        ({"bottom": (512, 0, 128)}, "bottom"),
                                        ({"dense_features": 0}, "dense_features"),
                                        ({"dtype": "int8"}, "dtype")])
def test_dlrm_spec_rejects_impossible_mlps(kw, needle):
    with pytest.raises(KitError, match=needle):
        _dlrm_spec(**kw)


def test_dlrm_placement_must_be_whole_ranks_and_numpy_ints_work():
    import numpy as np

    from kit.parallel.dlrm import predict_dlrm

    with pytest.raises(KitError, match="placement"):  # 0.5 was taken as a rank
        predict_dlrm(_dlrm_spec(), "dgx-a100", 64, placement=[0.5] * 8)
    with pytest.raises(KitError, match="launch_us"):
        predict_dlrm(_dlrm_spec(), "dgx-a100", 64, launch_us=-5)
    a = predict_dlrm(_dlrm_spec(), "dgx-a100", np.int64(64), placement=list(np.arange(8)))
    b = predict_dlrm(_dlrm_spec(), "dgx-a100", 64, placement=list(range(8)))
    assert a["iteration_ms"] == b["iteration_ms"]


def test_python_path_on_a_system_says_it_runs_on_one_gpu(capsys):
    # the zoo's error listed 'module:callable' as an option while refusing exactly that
    err = _err(capsys, ["predict", "os.path:join", "--system", "dgx-a100", "--dp", "2"])
    assert "one GPU (--gpu)" in err and "choose a zoo model" not in err


@pytest.mark.parametrize("value", ["1e300", "1e12", "3600001"])
def test_collect_refuses_a_cooldown_past_an_hour_before_measuring(tmp_path, capsys, value):
    # 1e300 ms had passed the finite check and reached time.sleep(1e297) after the first row: an
    # OverflowError traceback with a one-row --out left behind; 1e12 ms sleeps 31 years between rows
    out = tmp_path / "c.csv"
    line = _err(capsys, ["collect", "--ops", "gemm", "--shapes", "tiny-gemm:1", "--device", "cpu",
                         "--out", str(out), "--cooldown-ms", value])
    assert "--cooldown-ms" in line and "3,600,000" in line and not out.exists()
