"""Parsers for nccl-tests and PARAM comms output, the nccl-tests writer, and size specs."""
import pytest

from kit.comm.measure import parse_sizes
from kit.comm.parsers import format_nccl_tests, parse_nccl_tests, parse_param, read_measurements
from kit.errors import KitError

RANKS8 = "\n".join(f"#  Rank {i:2d} Group  0 Pid  4242 on     node1 device {i:2d} [0x07] NVIDIA A100-SXM4-40GB"
                   for i in range(8))
# the layout nccl-tests prints (all_reduce_perf -b 1M -e 4M -f 2 -g 8); busbw = algbw x 1.75
NCCL_TESTS = f"""# nThread 1 nGpus 8 minBytes 1048576 maxBytes 4194304 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
{RANKS8}
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576        262144     float     sum      -1    92.79   11.30   19.78      0    93.10   11.26   19.71      0
     2097152        524288     float     sum      -1    93.25   22.49   39.36      0    92.80   22.60   39.55      0
     4194304       1048576     float     sum      -1    95.80   43.78   76.62      0    96.00   43.69   76.46      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 45.25
#
"""

PARAM = """\tCOMMS-RES-all_reduce-float32          size (B)      num-elements     Latency(us):p50       p75       p95       Min       Max    algBW(GB/s)    busBW(GB/s)
\tCOMMS-RES-all_reduce-float32              1024               256          30.90      32.50      36.10      29.00      40.00        0.03        0.06
\tCOMMS-RES-all_reduce-float32           1048576            262144          60.00      61.00      63.00      59.00      70.00       17.48       30.58
"""


def test_parse_nccl_tests_counts_ranks_and_reads_out_of_place(tmp_path):
    f = tmp_path / "ar.txt"
    f.write_text(NCCL_TESTS)
    with pytest.raises(KitError, match="kind="):
        parse_nccl_tests(f)  # no "Collective test starting" line: the file does not say which
    t = parse_nccl_tests(f, kind="all_reduce_perf")
    assert list(t.size_bytes) == [1048576, 2097152, 4194304]
    assert set(t.ranks) == {8} and set(t.kind) == {"allreduce"}
    assert list(t.time_us) == [92.79, 93.25, 95.80]
    assert list(t.time_us_in_place) == [93.10, 92.80, 96.00]
    assert list(t.busbw_gbs) == [19.78, 39.36, 76.62]


def test_parse_nccl_tests_errors(tmp_path):
    with pytest.raises(KitError, match="not found"):
        parse_nccl_tests(tmp_path / "missing.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text(NCCL_TESTS.replace("4194304       1048576     float     sum      -1    95.80",
                                      "4194304       1048576     float     sum"))
    with pytest.raises(KitError, match="line"):
        parse_nccl_tests(bad, kind="allreduce")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing here\n")
    with pytest.raises(KitError, match="no nccl-tests result rows"):
        parse_nccl_tests(empty, kind="allreduce")


def test_parse_param_infers_ranks_from_bus_over_alg(tmp_path):
    f = tmp_path / "param.log"
    f.write_text("some chatter\n" + PARAM)
    t = parse_param(f)
    # busBW/algBW = 30.58/17.48 = 1.749 = 2(n-1)/n -> n = 8
    assert set(t.ranks) == {8} and set(t.kind) == {"allreduce"}
    assert list(t.size_bytes) == [1024, 1048576] and list(t.time_us) == [30.90, 60.00]
    assert read_measurements(f).equals(t)  # auto-detects the format
    assert set(parse_param(f, ranks=4).ranks) == {4}


def test_writer_round_trips_through_the_parser(tmp_path):
    rows = [{"size_bytes": 4096 * 2**i, "count": 1024 * 2**i, "dtype": "float", "time_us": 10.0 + i, "wrong": 0}
            for i in range(4)]
    text = format_nccl_tests(rows, "allgather", 4, [f"device {i}" for i in range(4)])
    text += format_nccl_tests(rows[:2], "broadcast", 4, [f"device {i}" for i in range(4)])
    f = tmp_path / "mix.txt"
    f.write_text(text)
    t = parse_nccl_tests(f)
    assert list(t.kind) == ["allgather"] * 4 + ["broadcast"] * 2
    assert list(t.time_us) == [10.0, 11.0, 12.0, 13.0, 10.0, 11.0]
    ag = t[t.kind == "allgather"]
    # algbw = size / time; busbw = algbw x (n-1)/n, to the 2 decimals nccl-tests prints
    assert ag.algbw_gbs.tolist() == pytest.approx([round(r["size_bytes"] / r["time_us"] / 1e3, 2) for r in rows])
    assert ag.busbw_gbs.tolist() == pytest.approx([round(r["size_bytes"] / r["time_us"] / 1e3 * 0.75, 2)
                                                   for r in rows], abs=0.006)


def test_parse_sizes():
    assert parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1K:64K:4") == [1024, 4096, 16384, 65536]
    assert parse_sizes("1M,4K,1e3") == [1000, 4096, 1 << 20]
    assert parse_sizes("1GiB") == [1 << 30]
    for bad in ["", "abc", "8K:1K", "1K:8K:1"]:
        with pytest.raises(KitError):
            parse_sizes(bad)


def test_an_older_kits_total_count_reads_as_nccl_tests_per_rank_count(tmp_path):
    """`kit collect-comm` before 2026-12-07 wrote the total count for all-gather, reduce-scatter and
    all-to-all (4096 for a 16 KiB all-gather on 4 ranks) where nccl-tests and the kit now print a
    rank's (1024): read back, both kinds of file give the count nccl-tests would."""
    meta = "step: list warmup iters: 1 iters: 2 # kit collect-comm backend=gloo torch=2.5 stat=p10;"
    devices = [f"Pid {100 + i} on host device {i:2d} [cpu] gloo process" for i in range(4)]
    sizes = [4096 * 2**i for i in range(3)]

    def rows(per_rank):
        return [{"size_bytes": s, "count": s // 4 // (4 if per_rank else 1), "dtype": "float",
                 "time_us": 10.0, "wrong": 0} for s in sizes]

    for name, per_rank in (("older.txt", False), ("newer.txt", True)):
        f = tmp_path / name
        f.write_text("".join(format_nccl_tests(rows(per_rank), k, 4, devices, meta)
                             for k in ("allgather", "reducescatter", "alltoall"))
                     + format_nccl_tests(rows(False), "allreduce", 4, devices, meta))
        t = parse_nccl_tests(f)
        split = t.kind != "allreduce"
        assert (t["count"][split] * 4 * 4 == t.size_bytes[split]).all(), name
        assert (t["count"][~split] * 4 == t.size_bytes[~split]).all(), name


def test_a_wrong_count_nccl_tests_prints_with_g_reads_and_fit_refuses_it(tmp_path):
    """nccl-tests prints #wrong with %g: 1,048,576 wrong elements read "1.04858e+06". Such a
    row had been refused as malformed ("expected a whole number"); it is a run that failed
    its own check, which the table keeps and `fit_table` names."""
    from kit.comm import fit_table

    row = "4194304       1048576     float     sum      -1    95.80   43.78   76.62      0    96.00   43.69   76.46      0"
    assert row in NCCL_TESTS
    f = tmp_path / "wrong.txt"
    f.write_text(NCCL_TESTS.replace(row, row[:-1] + "1.04858e+06").replace("76.62      0", "76.62  1e+06"))
    t = parse_nccl_tests(f, kind="allreduce")
    assert list(t.wrong) == [0, 0, 1_000_000 + 1_048_580]
    with pytest.raises(KitError, match="wrong results"):
        fit_table(t)
    for bad in ("1e+400", "-1e+06", "1.5"):  # not a count: still a clear error
        f.write_text(NCCL_TESTS.replace(row, row[:-1] + bad))
        with pytest.raises(KitError, match="whole number"):
            parse_nccl_tests(f, kind="allreduce")
