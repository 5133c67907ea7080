"""`kit comm fit` checks the GPU a benchmark file names against --system's; `kit comm predict
--json` names the message size size_bytes for one size as for a --sizes sweep."""
import json

import pytest

from kit.cli import main
from kit.comm import collective_table, predict_alltoallv, predict_collective
from kit.comm.parsers import format_nccl_tests, parse_nccl_tests, read_measurements
from kit.errors import KitError
from kit.hardware import get_system

# all_reduce_perf -b 1M -e 8M -f 2 -g 8 on a DGX A100, as nccl-tests prints it (busbw = algbw x 1.75)
ROWS = """#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576        262144     float     sum      -1    92.79   11.30   19.78      0    93.10   11.26   19.71      0
     2097152        524288     float     sum      -1    93.25   22.49   39.36      0    92.80   22.60   39.55      0
     4194304       1048576     float     sum      -1    95.80   43.78   76.62      0    96.00   43.69   76.46      0
     8388608       2097152     float     sum      -1   150.00   55.92   97.86      0   150.00   55.92   97.86      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 58.40
#
"""


def _ranks(device: str, bus: str = " [0x07]", n: int = 8) -> str:
    return "\n".join(f"#  Rank {i:2d} Group  0 Pid  4242 on     node1 device {i:2d}{bus} {device}"
                     for i in range(n))


def _nccl(device="NVIDIA A100-SXM4-40GB", bus=" [0x07]", kind="all_reduce_perf") -> str:
    return (f"# Collective test starting: {kind}\n"
            "# nThread 1 nGpus 8 minBytes 1048576 maxBytes 8388608 step: 2(factor) warmup iters: 5 iters: 20 "
            "agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n" + _ranks(device, bus) + "\n" + ROWS)


def _file(tmp_path, text, name="ar.txt"):
    f = tmp_path / name
    f.write_text(text)
    return f


def _fit(capsys, *argv):
    rc = main(["comm", "fit", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---- the parser reads the device names ------------------------------------------------------------

@pytest.mark.parametrize("line, name", [
    ("#  Rank  0 Group  0 Pid  4242 on     node1 device  0 [0x07] NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"),
    ("#  Rank  3 Group  0 Pid  4242 on node1 device  3 [0000:07:00] NVIDIA H100 80GB HBM3  ", "NVIDIA H100 80GB HBM3"),
    ("#   Rank  0 Pid  1234 on dgx1 device  0 [0x1b] Tesla V100-SXM2-32GB", "Tesla V100-SXM2-32GB"),
    # `kit collect-comm`: no bus id; gloo ranks are CPU processes
    ("#  Rank  0 Group  0 Pid  4242 on host device  0 NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
    ("#  Rank  0 Group  0 Pid  4242 on host device  0 [cpu] gloo process", "[cpu] gloo process"),
    ("#  Rank  0 Group  0 gpu 0", None),
    ("#  Rank  0 Group  0 Pid  4242 on host device  0", None),
])
def test_device_name_of_a_rank_line(line, name):
    from kit.comm.parsers import device_name

    assert device_name(line) == name


def test_parsed_table_carries_the_device(tmp_path):
    from kit.comm.parsers import device_names

    t = parse_nccl_tests(_file(tmp_path, _nccl()))
    assert set(t.device) == {"NVIDIA A100-SXM4-40GB"} and device_names(t) == ["NVIDIA A100-SXM4-40GB"]
    # a second run on other GPUs, concatenated: each section keeps its own
    two = parse_nccl_tests(_file(tmp_path, _nccl() + _nccl("NVIDIA H100 80GB HBM3"), "two.txt"))
    assert list(two.device) == ["NVIDIA A100-SXM4-40GB"] * 4 + ["NVIDIA H100 80GB HBM3"] * 4
    assert device_names(two) == ["NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"]
    # ranks of one run on different GPUs: both names
    mixed = _nccl().replace("device  7 [0x07] NVIDIA A100-SXM4-40GB", "device  7 [0x07] NVIDIA A100-SXM4-80GB")
    assert device_names(parse_nccl_tests(_file(tmp_path, mixed, "mixed.txt"))) == [
        "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB"]
    # no device names: the column is empty
    bare = format_nccl_tests([{"size_bytes": 2**i, "count": 2**i // 4, "dtype": "float", "time_us": 10.0 + i}
                              for i in range(10, 14)], "allreduce", 8, [f"gpu {i}" for i in range(8)])
    t = parse_nccl_tests(_file(tmp_path, bare, "bare.txt"))
    assert t.device.isna().all() and device_names(t) == []


def test_param_logs_name_no_device(tmp_path):
    from kit.comm.parsers import device_names

    param = ("\tCOMMS-RES-all_reduce-float32  size (B)  num-elements  Latency(us):p50  p75  p95  algBW(GB/s)  busBW(GB/s)\n"
             + "".join(f"\tCOMMS-RES-all_reduce-float32  {s}  {s // 4}  {20 + s / 4e4:.2f}  30.0  31.0  "
                       f"{s / (20 + s / 4e4) / 1e3:.2f}  {1.75 * s / (20 + s / 4e4) / 1e3:.2f}\n"
                       for s in (2**20, 2**22, 2**24, 2**26)))
    t = read_measurements(_file(tmp_path, param, "param.log"), ranks=8)
    assert t.device.isna().all() and device_names(t) == []


# ---- kit comm fit refuses another GPU's measurements ----------------------------------------------

def test_fit_refuses_a_file_measured_on_another_gpu(tmp_path, capsys):
    f = _file(tmp_path, _nccl())  # A100s
    cal = tmp_path / "cal.json"
    rc, out, err = _fit(capsys, f, "--system", "dgx-h100", "--out", cal)
    assert rc == 2 and out == "" and not cal.exists()
    assert err.count("\n") == 1 and err.startswith("kit: error: ")
    for word in (str(f), "NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb", "dgx-h100", "h100-sxm",
                 "--system a100x4-nvlink or dgx-a100", "--any-gpu"):
        assert word in err, word


def test_fit_refuses_h100s_as_an_h200_system(tmp_path, capsys):
    f = _file(tmp_path, _nccl("NVIDIA H100 80GB HBM3", bus=""))  # as `kit collect-comm --backend nccl` writes
    rc, _, err = _fit(capsys, f, "--system", "hgx-h200")
    assert rc == 2 and "--system dgx-h100" in err and "h200" in err
    rc, out, err = _fit(capsys, f, "--system", "dgx-h100", "--json")
    assert rc == 0 and err == "" and json.loads(out)["system"] == "dgx-h100"


def test_a_variant_no_preset_has_says_to_pass_any_gpu(tmp_path, capsys):
    f = _file(tmp_path, _nccl("NVIDIA A100-SXM4-80GB"))
    rc, _, err = _fit(capsys, f, "--system", "dgx-a100")
    assert rc == 2 and "no preset is built of a100-sxm4-80gb" in err and "--any-gpu" in err
    rc, out, err = _fit(capsys, f, "--system", "dgx-a100", "--any-gpu", "--json")
    assert rc == 0 and json.loads(out)["curves"][0]["ranks"] == 8
    assert err.startswith("kit: note: ") and "a100-sxm4-80gb" in err and "--any-gpu" in err


def test_any_gpu_fits_anyway_with_a_note(tmp_path, capsys):
    f = _file(tmp_path, _nccl())
    cal = tmp_path / "cal.json"
    rc, _, err = _fit(capsys, f, "--system", "dgx-h100", "--any-gpu", "--out", cal)
    assert rc == 0 and cal.exists()
    assert err.startswith("kit: note: ") and "NVIDIA A100-SXM4-40GB" in err and "dgx-h100" in err


def test_the_right_system_fits_without_a_word(tmp_path, capsys):
    f = _file(tmp_path, _nccl())
    rc, out, err = _fit(capsys, f, "--system", "dgx-a100", "--json")
    assert rc == 0 and err == "" and json.loads(out)["curves"][0]["kind"] == "allreduce"
    rc, _, err = _fit(capsys, f, "--system", "dgx-a100", "--nodes", "2", "--network", "ib-hdr")
    assert rc == 0 and err == ""


def test_a_second_run_on_another_gpu_is_refused(tmp_path, capsys):
    f = _file(tmp_path, _nccl() + _nccl("NVIDIA H100 80GB HBM3", kind="all_gather_perf"))
    rc, _, err = _fit(capsys, f, "--system", "dgx-a100")
    assert rc == 2 and "NVIDIA H100 80GB HBM3" in err and "--system dgx-h100" in err


def test_names_the_catalog_cannot_map_still_fit_with_a_note(tmp_path, capsys):
    f = _file(tmp_path, _nccl("Mystery Accelerator 9000"))
    rc, _, err = _fit(capsys, f, "--system", "dgx-h100")
    assert rc == 0 and err.count("\n") == 1
    assert "kit: note:" in err and "'Mystery Accelerator 9000'" in err and "not checked" in err


def test_files_without_device_names_still_fit(tmp_path, capsys):
    bare = _nccl().replace(" [0x07] NVIDIA A100-SXM4-40GB", "")  # "... device  0": no name
    rc, _, err = _fit(capsys, _file(tmp_path, bare), "--system", "dgx-h100")
    assert rc == 0 and err == ""
    norank = "\n".join(line for line in _nccl().splitlines() if "Rank" not in line) + "\n"
    rc, _, err = _fit(capsys, _file(tmp_path, norank, "norank.txt"), "--system", "dgx-h100", "--ranks", "8")
    assert rc == 0 and err == ""


def test_check_measured_gpu_in_python(tmp_path):
    from kit.comm.calibration import check_measured_gpu

    t = parse_nccl_tests(_file(tmp_path, _nccl()))
    assert check_measured_gpu(t, get_system("dgx-a100")) == []
    with pytest.raises(KitError, match=r"measured on NVIDIA A100-SXM4-40GB .* dgx-h100 has h100-sxm"):
        check_measured_gpu(t, get_system("dgx-h100"), where="ar.txt")
    (note,) = check_measured_gpu(t, get_system("dgx-h100"), any_gpu=True)
    assert "a100-sxm4-40gb" in note
    assert check_measured_gpu(t.drop(columns="device"), get_system("dgx-h100")) == []  # a hand-made table


def test_collect_comm_table_names_the_device_its_file_does(tmp_path):
    pytest.importorskip("torch")
    from kit.comm.measure import collect

    text, t = collect("gloo", 2, "4K:16K:4", iters=2, warmup=0, repeats=1, out=tmp_path / "g.txt",
                      start_method="fork")
    assert set(t.device) == {"[cpu] gloo process"}
    assert list(parse_nccl_tests(tmp_path / "g.txt").device) == list(t.device)


# ---- kit comm predict --json: one size and a sweep use the same names -----------------------------

def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("argv", [
    ["allreduce", "--system", "dgx-h100"],
    ["allgather", "--system", "dgx-h100", "--nodes", "2", "--ranks", "0,1,8,9"],
])
def test_one_size_and_a_sweep_name_the_size_alike(capsys, argv):
    one = _json(capsys, ["comm", "predict", *argv, "--bytes", "64M", "--json"])
    (row,) = _json(capsys, ["comm", "predict", *argv, "--sizes", "64M", "--json"])["table"]
    assert one["size_bytes"] == row["size_bytes"] == 2**26
    assert one["nbytes"] == one["size_bytes"]  # kept: earlier readers of the single-size JSON
    assert set(row) <= set(one), set(row) - set(one)  # every sweep column is a single-size key
    for key in ("kind", "ranks", "algorithm", "system", "nodes_spanned"):
        assert one[key] == row[key], key
    for key in ("time_ms", "algbw_gbs", "busbw_gbs"):
        assert one[key] == pytest.approx(row[key]), key


def test_python_results_carry_size_bytes_too():
    r = predict_collective("allreduce", 2**20, "dgx-a100", ranks=8)
    assert r.size_bytes == r.nbytes == 2**20 and r.to_dict()["size_bytes"] == 2**20
    assert list(r.to_dict())[:3] == ["kind", "nbytes", "size_bytes"]
    a = predict_alltoallv([[0, 2**20], [2**20, 0]], "dgx-h100")
    assert a.to_dict()["size_bytes"] == a.nbytes == 2**20
    t = collective_table("allreduce", [2**20], "dgx-h100-x2")
    assert list(t.nodes_spanned) == [2]
