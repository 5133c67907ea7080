"""Bad-input audit of the multi-GPU surface's readers (nccl-tests and PARAM files, kit comm fit's
nodes, the tables CSV, kit collect-* arguments): bad input is one KitError line, never a
traceback or a measurement read under the wrong rank count."""
import json

import pytest

from cli_support import one_error_line as _err
from kit.cli import main
from kit.comm.parsers import parse_nccl_tests

SIZES = [1024 * 4**i for i in range(6)]


def _run(ranks: int, floor_us: float, starting: bool = False, host=lambda i: "n") -> str:
    """One nccl-tests run of all_reduce_perf on `ranks` A100s; older nccl-tests print no
    "# Collective test starting" line (starting False)."""
    out = "# Collective test starting: all_reduce_perf\n" if starting else ""
    out += f"# nThread 1 nGpus 1 minBytes {SIZES[0]} maxBytes {SIZES[-1]}\n#\n# Using devices\n"
    out += "".join(f"#  Rank {i:2d} Group  0 Pid 1 on {host(i)} device {i} [0x07] A100\n" for i in range(ranks))
    for s in SIZES:
        t = floor_us + s / 1e5
        alg = s / t / 1e3
        cells = f"{t:.2f}  {alg:.2f}  {alg * 1.75:.2f}  0"
        out += f"  {s}  {s // 4}  float  sum  -1  {cells}  {cells}\n"
    return out


@pytest.mark.parametrize("starting", [False, True])
def test_concatenated_runs_keep_their_own_rank_counts(tmp_path, starting):
    # without a "Collective test starting" line, a 4-rank run after an 8-rank one had been read
    # as 8 ranks, and one curve fitted over both
    f = tmp_path / "two.txt"
    f.write_text(_run(8, 30, starting) + _run(4, 15, starting))
    t = parse_nccl_tests(f, kind="allreduce")
    assert t.groupby("ranks").size().to_dict() == {4: len(SIZES), 8: len(SIZES)}
    assert t[t.ranks == 4].time_us.min() < t[t.ranks == 8].time_us.min()


def test_a_rank_listed_twice_is_an_error(tmp_path, capsys):
    text = _run(8, 30).replace("#  Rank  7", "#  Rank  3")
    f = tmp_path / "dup.txt"
    f.write_text(text)
    assert "rank 3 is listed twice" in _err(capsys, ["comm", "fit", str(f), "--kind", "allreduce",
                                                     "--system", "dgx-a100"])


PARAM_HEAD = ("\tCOMMS-RES-all_reduce-float32 size (B) num-elements Latency(us):p50 p75 p95 Min Max "
              "algBW(GB/s) busBW(GB/s)\n")


@pytest.mark.parametrize("cells, needle", [
    ("inf 256 30.9 32 36 29 40 0.03 0.06", "the size must be a whole number"),  # was OverflowError
    ("nan 256 30.9 32 36 29 40 0.03 0.06", "the size must be a whole number"),  # was ValueError
    ("1024 nan 30.9 32 36 29 40 0.03 0.06", "num-elements must be a whole number"),
    ("1024 -5 30.9 32 36 29 40 0.03 0.06", "num-elements must be a whole number"),
    ("1024 256 30.9 32 36 29 40 -0.03 0.06", "a bandwidth must be a finite number >= 0"),
    ("1024 256 30.9 32 36 29 40 0.03 nan", "a bandwidth must be a finite number >= 0"),
])
def test_param_cells_that_are_no_measurement_are_errors(tmp_path, capsys, cells, needle):
    f = tmp_path / "param.log"
    f.write_text(PARAM_HEAD + f"\tCOMMS-RES-all_reduce-float32 {cells}\n")
    assert needle in _err(capsys, ["comm", "fit", str(f), "--ranks", "8", "--system", "dgx-a100"])


def test_nccl_tests_bandwidth_that_is_negative_is_an_error(tmp_path, capsys):
    text = _run(8, 30)
    last = text.splitlines()[-1]
    f = tmp_path / "neg.txt"
    f.write_text(text.replace(last, last.replace(last.split()[7], "-1.43", 1)))
    assert "a bandwidth must be a finite number >= 0" in _err(
        capsys, ["comm", "fit", str(f), "--kind", "allreduce", "--system", "dgx-a100"])


def test_comm_fit_of_ranks_on_more_hosts_than_the_system_has_nodes(tmp_path, capsys):
    # written with nodes 2 on a one-node system: its curve could never be used, and nothing said so
    f = tmp_path / "two_hosts.txt"
    f.write_text(_run(8, 30, host=lambda i: f"node{i // 4}"))
    assert "ran on 2 hosts, but dgx-a100 is 1 node(s)" in _err(
        capsys, ["comm", "fit", str(f), "--kind", "allreduce", "--system", "dgx-a100"])
    assert main(["comm", "fit", str(f), "--kind", "allreduce", "--system", "dgx-a100", "--nodes", "2",
                 "--json"]) == 0
    assert [c["nodes"] for c in json.loads(capsys.readouterr().out)["curves"]] == [2]


def test_network_none_over_nodes_names_what_was_asked(capsys):
    # said "system pcie8 has no network", which has one (roce-100g): none was asked for
    line = _err(capsys, ["comm", "predict", "allreduce", "--bytes", "1M", "--system", "pcie8-none-x2"])
    assert "network none was asked for" in line and "roce-100g" in line


def test_tables_csv_with_a_column_twice_is_an_error(tmp_path, capsys):
    f = tmp_path / "dup.csv"
    f.write_text("name,rows,dim,pooling,rows\nuser,10000000,128,1,5\nitem,5000000,128,20,7\n")
    assert "column(s) rows appear twice" in _err(capsys, ["shard", "--tables", str(f), "--system", "dgx-a100"])


@pytest.mark.parametrize("flag", ["--rows", "--dim", "--pooling", "--tables", "--batch"])
def test_collect_embedding_names_the_option_it_refuses(tmp_path, capsys, flag):
    line = _err(capsys, ["collect-embedding", "--out", str(tmp_path / "e.csv"), flag, "0"])
    assert line.startswith("kit: error: " + flag) or f"{flag}: expected positive" in line


def test_collect_comm_refuses_bad_counts_before_looking_at_its_output(tmp_path, capsys):
    out = tmp_path / "c.txt"
    out.write_text("earlier measurements\n")
    # a usage error naming --ranks, not "c.txt already exists"
    assert "argument --ranks: expected a positive whole number" in _err(
        capsys, ["collect-comm", "--out", str(out), "--ranks", "0"])
    assert out.read_text() == "earlier measurements\n"


def test_collect_comm_refuses_a_negative_warmup_before_looking_at_its_output(tmp_path, capsys):
    out = tmp_path / "c.txt"
    out.write_text("earlier measurements\n")
    assert "argument --warmup: expected a whole number >= 0" in _err(
        capsys, ["collect-comm", "--out", str(out), "--warmup", "-1"])
