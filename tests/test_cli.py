"""The CLI: --help and --json on every subcommand, one-line errors with exit code 2."""
import json
import subprocess
import sys

import pytest

from kit.cli import build_parser, main
from kit.hardware import get_gpu


def _subcommands():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)


def run_cli(*argv):
    p = subprocess.run([sys.executable, "-m", "kit", *argv], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def test_every_subcommand_has_help_and_json():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    for name, sub in action.choices.items():
        opts = {o for a in sub._actions for o in a.option_strings}
        nested = [a for a in sub._actions if a.__class__.__name__ == "_SubParsersAction"]
        if nested:  # e.g. `kit op gemm`: every leaf has --json
            for leaf in nested[0].choices.values():
                assert "--json" in {o for a in leaf._actions for o in a.option_strings}, name
        else:
            assert "--json" in opts and "-h" in opts, name


@pytest.mark.parametrize("name", ["gpus", "op", "demo"])
def test_help_exits_zero(name):
    rc, out, _ = run_cli(name, "--help")
    assert rc == 0 and "usage" in out


def test_gpus_json_lists_the_catalog():
    rc, out, _ = run_cli("gpus", "--json")
    gpus = json.loads(out)
    assert rc == 0 and len(gpus) >= 24
    for field in ("sm_count", "mem_bw_gbs", "bf16_tflops", "source", "aliases", "tdp_w"):
        assert all(field in g for g in gpus)


def test_models_lists_the_zoo_with_what_each_can_do(capsys, tmp_path, monkeypatch):
    from kit.workload import zoo

    monkeypatch.setenv("KIT_CACHE", str(tmp_path))
    assert main(["models", "--json"]) == 0
    first = capsys.readouterr().out
    cached = list(tmp_path.glob("workload/models-*.pkl"))
    assert len(cached) == 1  # counted once, then read back
    cached[0].write_bytes(b"not a pickle")  # a broken cache is counted again
    assert main(["models", "--json"]) == 0
    again = capsys.readouterr().out
    assert again == first
    rows = {r["model"]: r for r in json.loads(again)}
    assert list(rows) == zoo.zoo_names()
    assert rows["gpt2"]["params"] == 124_439_808  # HF's count
    assert "decode" in rows["qwen3-8b"]["modes"] and "generate" in rows["llama3-8b"]["modes"]
    assert rows["bert-base"]["modes"] == ["train", "inference"]  # an encoder: no KV-cache step
    assert rows["resnet50"]["default_seq"] is None and rows["resnet50"]["reads"].startswith("images")
    assert rows["gpt2"]["max_seq"] == 1024 and rows["llama3-8b"]["max_seq"] is None
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(rows) + 2 and lines[1].split()[:3] == ["gpt2", "gpt2", "124.4M"]


def test_op_gemm_h100_bf16_matches_the_roofline_by_hand(capsys):
    assert main(["op", "gemm", "--m", "8192", "--n", "8192", "--k", "8192", "--gpu", "h100-sxm",
                 "--dtype", "bf16", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    by_hand_ms = 2 * 8192**3 / (get_gpu("h100-sxm").bf16_tflops * 1e12) * 1e3
    assert abs(r["roofline_ms"] - by_hand_ms) / by_hand_ms < 0.01
    assert r["latency_ms"] >= r["roofline_ms"]
    for key in ("latency_ms", "roofline_ms", "bound", "tiles", "waves", "flops", "bytes"):
        assert key in r
    assert r["flops"] == 2 * 8192**3


@pytest.mark.parametrize("argv, words", [
    (["op", "gemm", "--m", "64", "--n", "64", "--k", "64", "--gpu", "no-such-gpu"], ["no-such-gpu", "close matches"]),
    (["op", "gemm", "--m", "0", "--n", "64", "--k", "64", "--gpu", "t4"], ["--m"]),
    (["op", "gemm", "--m", "inf", "--n", "64", "--k", "64", "--gpu", "t4"], ["--m", "inf"]),
    (["op", "gemm", "--m", "64.5", "--n", "64", "--k", "64", "--gpu", "t4"], ["--m", "64.5"]),
    (["op", "gemm", "--m", "64", "--n", "64", "--k", "64", "--gpu", "t4", "--dtype", "fp8"], ["t4", "fp8"]),
    # three fp32 49152² matrices are 27 GiB: more than a T4's 16 GiB (an H100's 80 GiB holds them)
    (["op", "gemm", "--m", "49152", "--n", "49152", "--k", "49152", "--gpu", "t4"], ["27 GiB", "16 GiB"]),
    (["predict", "bert-base", "--gpu", "t4", "--mode", "inference", "--seq", "1024"],
     ["seq 1024", "512 learned positions"]),
    (["gpus", "--add", "/no/such/file.json"], ["not found"]),
    (["frobnicate"], ["invalid choice"]),
])
def test_user_errors_exit_2_with_one_line(argv, words):
    rc, out, err = run_cli(*argv)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    for w in words:
        assert w in lines[0]


def test_an_op_that_fits_the_gpu_memory_is_predicted():
    rc, out, err = run_cli("op", "gemm", "--m", "49152", "--n", "49152", "--k", "49152", "--gpu", "h100-sxm")
    assert rc == 0 and "latency" in out, err


def test_op_dropout_and_a_device_copy_say_they_are_the_learned_elementwise_pass(capsys):
    """They had printed their bare roofline (a 1,024-element dropout: 3 ns) with a zero-width
    band; now the learned pass a model costs them as, and a line that says so."""
    from kit.api import predict_op
    from kit.ops import Dropout, Elementwise, Memcpy

    assert main(["op", "dropout", "--numel", "1024", "--gpu", "h100-sxm"]) == 0
    assert "source    the learned elementwise mul pass over 1024 elements" in capsys.readouterr().out
    assert main(["op", "memcpy", "--bytes", "1e9", "--gpu", "a100-pcie-40gb"]) == 0
    assert "learned elementwise copy pass" in capsys.readouterr().out
    drop = predict_op(Dropout(1024), "h100-sxm")
    mul = predict_op(Elementwise("mul", 1024, inputs=1), "h100-sxm")
    assert drop["latency_ms"] > mul["latency_ms"] > 100 * drop["roofline_ms"]
    assert drop["latency_p90_ms"] > drop["latency_ms"]
    assert "source" not in predict_op(Memcpy(10**9, "h2d"), "h100-sxm")


def test_demo_prints_a_real_prediction():
    rc, out, _ = run_cli("demo", "--json")
    r = json.loads(out)
    assert rc == 0 and r["gemm"]["latency_ms"] >= r["gemm"]["roofline_ms"] > 0
