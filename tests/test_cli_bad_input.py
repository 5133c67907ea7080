"""Bad input on the command line: one `kit: error: ...` line and exit 2, never a traceback, a
silent exit 0, a silently wrong number, or an input file destroyed by an output."""
import gzip
import json
import shutil
import sys

import pytest

from cli_json import cli_error
from kit.cli import main
from kit.errors import KitError

TINY = {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1, "n_positions": 64, "vocab_size": 128}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))


_err = cli_error  # the one `kit: error:` line of a command that must fail


def _kit_csv(path, **change):
    """A one-row kit-format (collector) CSV, with some fields changed."""
    from kit.data.records import HEADER

    row = {"op": "bmm", "op_class": "gemm", "scalar": "false", "gpu": "h100-sxm", "device_name": "x",
           "dtype": "fp32", "b": "2", "m": "8", "n": "8", "k": "8", "latency_ms": "0.5",
           "source": "collector", "split": "test", **change}
    path.write_text(",".join(HEADER) + "\n" + ",".join(str(row.get(c, "")) for c in HEADER) + "\n")
    return path


# -- unreadable input files --------------------------------------------------------------------
def test_truncated_or_folder_overhead_trace_is_one_error(tmp_path, capsys):
    good = gzip.compress(json.dumps({"traceEvents": []}).encode())
    (tmp_path / "t.json.gz").write_bytes(good[: len(good) // 2])  # was an EOFError traceback
    assert "corrupt gzip" in _err(capsys, "predict", "gpt2", "--gpu", "h100-sxm", "--overhead-trace",
                                  tmp_path / "t.json.gz")
    assert "is a folder" in _err(capsys, "predict", "gpt2", "--gpu", "h100-sxm", "--overhead-trace", tmp_path)


def test_binary_or_folder_calibration_is_one_error(tmp_path, capsys):
    (tmp_path / "c.json").write_bytes(b"\x80\x81\xfe" * 20)  # was a UnicodeDecodeError traceback
    argv = ["comm", "predict", "allreduce", "--bytes", "64M", "--system", "dgx-h100", "--calibration"]
    assert "binary data" in _err(capsys, *argv, tmp_path / "c.json")
    assert "is a folder" in _err(capsys, *argv, tmp_path)


def test_fetch_dest_that_is_a_file_or_fails_leaves_nothing_behind(tmp_path, capsys, monkeypatch):
    from kit.data import fetch

    keep = tmp_path / "keep.txt"
    keep.write_text("mine")
    assert "is a file" in _err(capsys, "data", "fetch", "neusight", "--dest", keep)  # was FileExistsError
    with pytest.raises(KitError, match="is a file, not a folder"):
        fetch.fetch_neusight(dest=keep)
    assert keep.read_text() == "mine"

    def offline(url):
        raise OSError("network is unreachable")

    monkeypatch.setattr(fetch, "_urlopen", offline)
    assert "could not download" in _err(capsys, "data", "fetch", "neusight", "--dest", tmp_path / "new")
    assert not (tmp_path / "new").exists()  # the folder it made for the download is gone again


def test_validate_label_that_is_a_folder_is_an_error_when_nothing_is_readable(tmp_path, capsys):
    (tmp_path / "Tesla_T4" / "gpt2-inf-8-1.json").mkdir(parents=True)  # was IsADirectoryError
    err = _err(capsys, "validate", "--labels", tmp_path)
    assert "none of the 1 label file(s)" in err and "a folder, not a JSON file" in err
    (tmp_path / "Tesla_T4" / "gpt2-inf-8-1.json").rmdir()
    (tmp_path / "Tesla_T4" / "gpt2-inf-8-2.json").write_bytes(b"\xb7\x00\xff")
    assert "binary data" in _err(capsys, "validate", "--labels", tmp_path)


# -- numbers and names that make no sense --------------------------------------------------------
def test_grid_seed_must_not_be_negative(capsys, tmp_path):
    err = _err(capsys, "collect", "--device", "cpu", "--ops", "gemm", "--shapes", "tiny-gemm:1:-5",
               "--out", tmp_path / "x.csv")  # was a numpy ValueError traceback
    assert "SEED >= 0" in err and not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("coef", ["x", float("nan"), -5.0])
def test_weights_with_bad_li_coefficients_are_refused(tmp_path, capsys, coef):
    from kit.predict.weights import SHIPPED_DIR

    weights = tmp_path / "w"
    shutil.copytree(SHIPPED_DIR, weights)
    manifest = json.loads((weights / "manifest.json").read_text())
    for table in manifest["parts"]["li"]["coefs"].values():
        for gpu in table:
            table[gpu] = [coef] * 3
    (weights / "manifest.json").write_text(json.dumps(manifest))
    test = _kit_csv(tmp_path / "t.csv")
    # strings were a TypeError traceback; NaN printed "MAPE nan" (and invalid JSON) with exit 0
    err = _err(capsys, "evaluate", "--test", test, "--predictors", "li", "--weights", weights)
    assert "must be 3 finite numbers >= 0" in err


def test_weights_given_as_some_other_file_name_that_file(tmp_path, capsys):
    keep = tmp_path / "keep.txt"
    keep.write_text("")
    err = _err(capsys, "evaluate", "--test", _kit_csv(tmp_path / "t.csv"), "--weights", keep)
    assert f"{keep} is a file, not a predictor weights folder" in err


@pytest.mark.parametrize("change,word", [
    ({"n_layer": -2}, "n_layer must be a positive whole number, got -2"),
    ({"n_layer": True}, "n_layer must be a positive whole number, got True"),
    ({"n_head": 4.5}, "n_head must be a positive whole number"),
    ({"n_positions": -5}, "n_positions must be a positive whole number"),
])
def test_config_sizes_must_be_positive_whole_numbers(tmp_path, capsys, change, word):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**TINY, **change}))  # -2 layers built an empty model, exit 0
    assert word in _err(capsys, "predict", path, "--gpu", "h100-sxm")


def test_vgg_markers_still_pass_the_size_check():
    from kit.workload import zoo

    zoo._check_sizes("vgg", zoo.config("vgg16"))
    with pytest.raises(KitError, match="layers must be a list of positive whole numbers"):
        zoo._check_sizes("vgg", {"layers": [64, "M", 0]})


@pytest.mark.parametrize("argv,word", [
    (["compare", "gpt2", "--gpus", "h100-sxm", "--price-per-hour", "h100-sxm=2,h100-sxm=3"], "twice"),
    (["compare", "gpt2", "--gpus", "h100-sxm", "--price-per-hour", "h100-sxm=1e308"], "from 0 to 1000"),
    (["compare", "gpt2", "--gpus", "h100-sxm", "--price-per-hour", "h100-sxm=-1"], "from 0 to 1000"),
    (["compare", "gpt2", "--gpus", "h100-sxm,H100"], "names h100-sxm twice"),
    (["compare", "gpt2", "--gpus", "h100-sxm,,a100"], "empty item"),
    (["comm", "predict", "allreduce", "--sizes", "1K:1M:nan"], "finite FACTOR"),
    (["comm", "predict", "allreduce", "--bytes", "0.5"], "positive whole size"),
    (["comm", "predict", "allreduce", "--bytes", "inf"], "positive whole size"),
    (["collect-comm", "--out", "{tmp}/c.txt", "--stat", "p0"], "p1..p99"),
    (["collect-comm", "--out", "{tmp}/c.txt", "--sizes", "1e30"], "more than any device holds"),
    (["collect-embedding", "--out", "{tmp}/e.csv", "--dist", "zipf:"], "nothing after ':'"),
])
def test_nonsense_values_are_refused(tmp_path, capsys, argv, word):
    assert word in _err(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert not list(tmp_path.glob("*.txt")) + list(tmp_path.glob("*.csv"))


def test_gpu_file_vendor_must_be_given_and_any_other_launches_as_cuda(tmp_path, capsys):
    from kit.cli import main
    from kit.hardware import get_gpu, unregister_gpu

    entry = {**get_gpu("h100-sxm").to_dict(), "key": "my-gpu", "name": "My GPU", "aliases": [],
             "vendor": " "}
    (tmp_path / "g.json").write_text(json.dumps(entry))
    assert "field vendor must be a non-empty string" in _err(capsys, "gpus", "--add", tmp_path / "g.json")
    (tmp_path / "g.json").write_text(json.dumps({**entry, "vendor": "Intel"}))  # tiling: as CUDA
    try:
        assert main(["op", "softmax", "--rows", "64", "--cols", "512", "--gpu", "my-gpu",
                     "--gpu-file", str(tmp_path / "g.json")]) == 0
    finally:  # the GPU file registers in-process: leave the catalog as the other tests find it
        unregister_gpu("my-gpu")
    capsys.readouterr()


def test_a_collect_on_a_users_own_gpu_summarises_and_evaluate_names_the_gpu(tmp_path, capsys):
    from kit.cli import main

    path = _kit_csv(tmp_path / "t.csv", gpu="own-gpu-7")  # as kit collect --gpu-file writes it
    assert main(["data", "summary", "--file", str(path)]) == 0
    capsys.readouterr()
    assert "gpu 'own-gpu-7'" in _err(capsys, "evaluate", "--test", path, "--predictors", "roofline")


@pytest.mark.parametrize("change,word", [
    ({"m": "-4"}, "t.csv:2: a bmm row needs m to be a positive whole number, got -4"),
    ({"dtype": "int3"}, "t.csv:2: unknown dtype 'int3'"),
    ({"op_class": "softmax"}, "t.csv:2: op bmm is in op class gemm"),
    ({"latency_ms": "nan"}, "t.csv:2: column 'latency_ms' must hold finite numbers, got 'nan'"),
])
def test_data_summary_checks_a_kit_csv_as_evaluate_does(tmp_path, capsys, change, word):
    path = _kit_csv(tmp_path / "t.csv", **change)  # summary accepted these with exit 0
    assert word in _err(capsys, "data", "summary", "--file", path)
    assert word in _err(capsys, "evaluate", "--test", path, "--predictors", "roofline")


def test_neusight_csv_errors_name_the_real_problem(tmp_path, capsys):
    head = "OPName,Latency,Device,B,M,N,K"
    (tmp_path / "nodev.csv").write_text("OPName,Latency,B,M,N,K\nbmm,0.5,2,8,8,8\n")
    assert "missing column(s) Device" in _err(capsys, "data", "summary", "--file", tmp_path / "nodev.csv")
    (tmp_path / "empty.csv").write_text(f"{head}\nbmm,,Tesla T4,2,8,8,8\n")
    assert "empty.csv:2: Latency must be a positive number of ms, got an empty cell" in _err(
        capsys, "data", "summary", "--file", tmp_path / "empty.csv")
    assert "is a folder" in _err(capsys, "data", "summary", "--file", tmp_path)


# -- outputs -----------------------------------------------------------------------------------
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tmp_path, capsys):
    files = {n: tmp_path / n for n in ("lk.json.gz", "c.json", "g.json", "k.json.gz", "nb.txt")}
    for p in files.values():
        p.write_bytes(b"precious")
    f = {n: str(p) for n, p in files.items()}
    for argv in (["replay", f["lk.json.gz"], "--trace", f["lk.json.gz"]],
                 ["predict", f["c.json"], "--gpu", "h100-sxm", "--trace", f["c.json"]],
                 ["predict", "gpt2", "--gpu-file", f["g.json"], "--gpu", "h100-sxm", "--trace", f["g.json"]],
                 ["predict", "gpt2", "--overhead-trace", f["k.json.gz"], "--gpu", "h100-sxm",
                  "--trace", str(tmp_path / "." / "k.json.gz")],
                 ["predict", "gpt2", "--gpu", "h100-sxm", "--system", "dgx-h100", "--trace", f["c.json"],
                  "--gpu-file", f["c.json"]],
                 ["comm", "fit", f["nb.txt"], "--system", "dgx-a100", "--out", f["nb.txt"]]):
        assert "would destroy the input" in _err(capsys, *argv)
    assert all(p.read_bytes() == b"precious" for p in files.values())


def test_user_module_file_is_an_input_too(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fixcli_mymodel.py").write_text("def make():\n    return None\n")
    assert "would destroy the input" in _err(capsys, "predict", "fixcli_mymodel:make", "--gpu",
                                             "h100-sxm", "--trace", "fixcli_mymodel.py")


def test_collect_comm_refuses_an_existing_output(tmp_path, capsys):
    keep = tmp_path / "keep.txt"
    keep.write_text("earlier measurements")
    assert "already exists; pass --force" in _err(capsys, "collect-comm", "--out", keep)  # was overwritten
    assert keep.read_text() == "earlier measurements"


def test_outputs_go_into_new_folders_and_a_zoo_name_is_no_input_file(tmp_path, capsys, monkeypatch):
    from kit.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").mkdir()  # a folder named like the zoo model is not the model's input
    assert main(["predict", "gpt2", "--gpu", "h100-sxm", "--batch", "1", "--seq", "16",
                 "--trace", "gpt2/t.json"]) == 0
    assert main(["predict", "gpt2", "--gpu", "h100-sxm", "--batch", "1", "--seq", "16",
                 "--trace", "new/deeper/t.json"]) == 0  # missing folders are made, as before
    assert (tmp_path / "gpt2" / "t.json").exists() and (tmp_path / "new" / "deeper" / "t.json").exists()
    (tmp_path / "afile").write_text("x")
    capsys.readouterr()
    assert "is a file, not a folder" in _err(capsys, "predict", "gpt2", "--gpu", "h100-sxm",
                                             "--trace", "afile/t.json")


def test_config_sizes_may_be_numpy_integers():
    import numpy as np

    from kit.workload import zoo

    cfg = {**zoo.config("gpt2"), "n_layer": np.int64(2)}
    assert zoo.graph_for(cfg, batch=1, seq=8, mode="inference", disk=False).meta["n_layers"] == 2


@pytest.mark.parametrize("argv,word", [
    (["predict", "gpt2", "--gpu", "h100-sxm", "--trace", ""], "--trace is empty"),
    (["replay", "x.json", "--trace", ""], "--trace is empty"),
    (["replay", "x.json", "--et", ""], "argument --et: expected a value"),
    (["train", "--train-gpus", "T4", "--out", ""], "--out is empty"),
    (["gpus", "--add", ""], "argument --add: expected a value"),
    (["compare", "gpt2", "--gpus", "h100-sxm", "--price-per-hour", ""], "expected a value"),
    (["collect", "--ops", "gemm", "--shapes", "", "--out", "{tmp}/x.csv"], "--shapes is empty"),
    (["collect", "--ops", "gemm", "--shapes", "tiny-gemm", "--out", ""], "--out is empty"),
])
def test_empty_values_and_missing_output_folders_are_refused(tmp_path, capsys, monkeypatch, argv, word):
    monkeypatch.chdir(tmp_path)  # an empty --out wrote into the current folder
    assert word in _err(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert {p.name for p in tmp_path.iterdir()} <= {"cache"}  # nothing written, no folder made


def test_trace_named_gz_is_gzipped(tmp_path, capsys):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    out = tmp_path / "t.json.gz"
    assert main(["predict", str(cfg), "--gpu", "h100-sxm", "--seq", "16", "--trace", str(out)]) == 0
    assert json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]  # was plain JSON


# -- runs that did nothing, or ended silently ----------------------------------------------------
def test_user_code_calling_sys_exit_is_an_error_not_a_silent_success(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "fixcli_exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    (tmp_path / "fixcli_exits.py").write_text(
        "def zero():\n    raise SystemExit(0)\n\ndef interrupted():\n    raise KeyboardInterrupt\n")
    assert "called sys.exit(0)" in _err(capsys, "predict", "fixcli_exits_on_import:f", "--gpu", "h100-sxm")
    assert "called sys.exit(0)" in _err(capsys, "compare", "fixcli_exits:zero", "--gpus", "h100-sxm")
    from kit.workload.models import graph_of

    with pytest.raises(KeyboardInterrupt):  # an interrupt stays one
        graph_of("fixcli_exits:interrupted", 1)
    for name in ("fixcli_exits", "fixcli_exits_on_import"):
        sys.modules.pop(name, None)


def test_collect_where_every_measurement_fails_is_an_error(tmp_path, capsys, monkeypatch):
    from kit.data import collect

    def broken(*a, **k):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(collect, "build_call", broken)
    out = tmp_path / "x.csv"
    err = _err(capsys, "collect", "--device", "cpu", "--ops", "gemm", "--shapes", "tiny-gemm:2",
               "--out", out)
    assert "every measurement failed (4)" in err and "no such kernel" in err
    assert not out.exists()  # a header alone would make the next run ask for --resume


def test_collect_embedding_where_every_measurement_fails_is_an_error(tmp_path, capsys, monkeypatch):
    from kit.embedding import collect

    def broken(cfg, device):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(collect, "_torch_call", broken)
    out = tmp_path / "e.csv"
    err = _err(capsys, "collect-embedding", "--out", out, "--rows", "100", "--dist", "uniform")
    assert "every measurement failed (1)" in err and "out of memory" in err and not out.exists()


def test_resume_after_a_truncated_line_is_a_one_line_note(tmp_path, capsys):
    out = tmp_path / "r.csv"
    argv = ["collect", "--device", "cpu", "--ops", "gemm", "--warmup", "0", "--repeats", "1", "--out", str(out)]
    assert main([*argv, "--shapes", "tiny-gemm:1"]) == 0
    with open(out, "a") as f:
        f.write("bmm,gemm")
    capsys.readouterr()
    assert main([*argv, "--shapes", "tiny-gemm:2", "--resume"]) == 0
    err = capsys.readouterr().err
    assert err == f"kit: note: {out}: dropped an unfinished last line (8 bytes)\n"


# -- messages that pointed the wrong way ----------------------------------------------------------
def test_decode_default_context_fits_and_new_tokens_alone_are_named():
    from kit.workload.generation import generation
    from kit.workload.models import graph_of

    graph = graph_of(dict(TINY), 1, None, "decode")  # the default context used to overflow
    assert graph.meta["seq"] == TINY["n_positions"] - 1
    with pytest.raises(KitError, match="100000 new tokens alone need more than .* 64 learned positions"):
        generation(dict(TINY), "h100-sxm", prompt=8, new_tokens=100000)
    with pytest.raises(KitError, match=r"seq of 5 or less \(--seq\)"):  # P + N - 1 <= 64
        generation(dict(TINY), "h100-sxm", prompt=8, new_tokens=60)
    assert generation(dict(TINY), "h100-sxm", prompt=5, new_tokens=60)["new_tokens"] == 60


def test_comm_fit_refuses_impossible_measurements(tmp_path, capsys):
    from kit.comm.parsers import format_nccl_tests

    sizes = [4**i for i in range(5, 16)]  # 1 KiB to 1 GiB, all in 50 µs: no transfer is that fast
    rows = [{"size_bytes": s, "count": s // 4, "dtype": "float", "time_us": 50.0, "wrong": 0} for s in sizes]
    bench = tmp_path / "nb.txt"
    bench.write_text(format_nccl_tests(rows, "allreduce", 8, [f"gpu {i}" for i in range(8)]))
    cal = tmp_path / "cal.json"
    err = _err(capsys, "comm", "fit", bench, "--system", "dgx-a100", "--out", cal)
    assert "busbw plateau" in err and "dgx-a100" in err and not cal.exists()


def test_comm_fit_saves_noisy_but_possible_measurements_with_a_note(tmp_path, capsys):
    from kit.cli import main
    from kit.comm.parsers import format_nccl_tests

    # times that grow with size at a plausible rate, every other point ten times slower (a loaded host)
    sizes = [4**i for i in range(5, 16)]
    rows = [{"size_bytes": s, "count": s // 4, "dtype": "float",
             "time_us": (20.0 + s / 50e3) * (10.0 if i % 2 else 1.0), "wrong": 0} for i, s in enumerate(sizes)]
    bench = tmp_path / "nb.txt"
    bench.write_text(format_nccl_tests(rows, "allreduce", 8, [f"gpu {i}" for i in range(8)]))
    cal = tmp_path / "cal.json"
    assert main(["comm", "fit", str(bench), "--system", "dgx-a100", "--out", str(cal)]) == 0
    err = capsys.readouterr().err
    assert cal.exists()  # the fit's error on its own points is above half: said, not refused
    assert err.startswith("kit: note: allreduce x8's curve is off by") and err.count("\n") == 1


def test_compare_takes_a_gpu_already_owned_and_a_trailing_comma():
    from kit.cli.cmd_compare import parse_gpus, parse_prices

    assert parse_prices("h100-sxm=0,a100=1.5,") == {"h100-sxm": 0.0, "a100-sxm4-40gb": 1.5}
    assert parse_gpus("h100-sxm,a100,") == ["h100-sxm", "a100"]
