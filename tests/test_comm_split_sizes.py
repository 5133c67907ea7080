"""`kit comm predict` and `kit collect-comm` size a collective as nccl-tests runs it:
count = size // 4 (float words, src/common.cu setupArgs), then each collective's
GetCollByteCount: all of it for all-reduce, broadcast, reduce and send/recv (size = count x 4 B),
count / nranks a rank for all-gather and reduce-scatter, (count / nranks) & -(16 / 4) for
all-to-all (16-byte aligned); the size run is nranks parts. An all-to-all of 3 B on 8 ranks had
been priced as 3 B, and one of 1,000 B as 992 B where nccl-tests runs 896 B; an all-reduce of
1,001 B was priced as 1,001 B (nccl-tests: 250 words, 1,000 B), and collect-comm measured an
all-to-all of 1,000 B on 2 ranks as 1,000 B (nccl-tests: 992 B)."""
import json

import pytest

from kit.cli import main
from kit.comm.conventions import nccl_tests_size_bytes
from kit.comm.measure import collect

SYSTEM = ["--system", "dgx-h100"]  # one node of 8 H100s: 8 ranks


def _run(capsys, *argv):
    rc = main(["comm", "predict", *argv, *SYSTEM])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _nccl_tests_bytes(kind, size, nranks):
    """nccl-tests' own arithmetic, its C expressions spelled in Python (float: eltSize 4)."""
    count = size // 4
    if kind not in ("allgather", "reducescatter", "alltoall"):  # paramcount = count
        return count * 4
    param = {"allgather": count // nranks, "reducescatter": count // nranks,
             "alltoall": (count // nranks) & -(16 // 4)}[kind]
    return nranks * param * 4


def test_the_rule():
    assert nccl_tests_size_bytes("alltoall", 100, 8) == 0  # 25 words, 3 a rank: 0 once 16-byte aligned
    assert nccl_tests_size_bytes("alltoall", 1000, 8) == 896  # 250 words, 31 a rank -> 28, x 8 x 4 B
    assert nccl_tests_size_bytes("allgather", 31, 8) == 0  # 7 words: under one a rank
    assert nccl_tests_size_bytes("reducescatter", 12, 2) == 8  # 3 words -> 2
    assert nccl_tests_size_bytes("allreduce", 3, 8) == 0  # not split, but under one word
    assert nccl_tests_size_bytes("allreduce", 1001, 8) == 1000  # 250 words
    assert nccl_tests_size_bytes("broadcast", 7, 2) == 4
    for kind in ("allgather", "reducescatter", "alltoall", "allreduce", "broadcast", "reduce", "sendrecv"):
        for n in (1, 2, 3, 8, 16, 24):
            for size in (*range(0, 700), 1000, 4096 * 3 + 20, 10**9 + 7):
                assert nccl_tests_size_bytes(kind, size, n) == _nccl_tests_bytes(kind, size, n), (kind, n, size)


def test_under_one_word_a_rank_is_one_error(capsys):
    rc, out, err = _run(capsys, "alltoall", "--bytes", "3")
    assert rc == 2 and not out and len(err.strip().splitlines()) == 1
    assert "less than 16 B a rank" in err and "at least 128 B" in err  # 16 B x 8 ranks
    rc, out, err = _run(capsys, "alltoall", "--bytes", "100")  # 3 words a rank: under 4
    assert rc == 2 and not out and "at least 128 B" in err
    rc, out, err = _run(capsys, "allgather", "--bytes", "31")
    assert rc == 2 and "less than 4 B a rank" in err and "at least 32 B" in err  # 4 B x 8 ranks


def test_a_size_not_divisible_is_rounded_down_and_said(capsys):
    rc, out, _ = _run(capsys, "alltoall", "--bytes", "1000", "--json")
    r = json.loads(out)
    assert rc == 0 and r["size_bytes"] == 896 and r["ranks"] == 8
    assert any("1,000 B -> 896 B" in n for n in r["notes"])
    rc, out, _ = _run(capsys, "alltoall", "--bytes", "1000")
    assert rc == 0 and "alltoall of 896 B" in out and "note: alltoall on 8 ranks" in out
    rc, out, _ = _run(capsys, "allgather", "--bytes", "100", "--json")  # 25 words, 3 a rank
    assert json.loads(out)["size_bytes"] == 96
    rc, out, _ = _run(capsys, "reducescatter", "--bytes", "12", "--ranks", "2", "--json")
    assert json.loads(out)["size_bytes"] == 8
    rc, out, _ = _run(capsys, "allreduce", "--bytes", "100", "--json")  # 25 whole words: unchanged
    r = json.loads(out)
    assert r["size_bytes"] == 100 and not any("words" in n for n in r["notes"])


def test_an_all_reduce_runs_whole_words(capsys):
    # nccl-tests' all-reduce: count = size / 4 B, size run = count x 4 B (AllReduceGetCollByteCount)
    rc, out, _ = _run(capsys, "allreduce", "--bytes", "1001", "--json")
    r = json.loads(out)
    assert rc == 0 and r["size_bytes"] == 1000
    assert any("whole 4-byte words" in n and "1,001 B -> 1,000 B" in n for n in r["notes"])
    rc, out, _ = _run(capsys, "allreduce", "--sizes", "1,6,8", "--json")
    r = json.loads(out)
    assert [x["size_bytes"] for x in r["table"]] == [4, 8] and any("1 B -> none (under 4 B)" in n for n in r["notes"])
    rc, out, err = _run(capsys, "allreduce", "--bytes", "3")
    assert rc == 2 and not out and len(err.strip().splitlines()) == 1
    assert "less than one 4-byte word" in err and "at least 4 B" in err


def test_collect_comm_measures_the_sizes_nccl_tests_runs():
    # 1,000 B on 2 ranks: 250 words, 125 a rank, 124 once 16-byte aligned: 992 B for all-to-all;
    # all-gather keeps 125 words a rank (1,000 B); all-reduce of 1,002 B runs 250 words (1,000 B)
    with pytest.warns(UserWarning, match="16 B a rank"):
        _, t = collect("gloo", 2, "1000,1002", kinds=["alltoall", "allgather", "allreduce"], iters=1,
                       warmup=0, repeats=1, start_method="fork")
    got = {(k, int(s)) for k, s in zip(t.kind, t.size_bytes)}
    want = {(k, _nccl_tests_bytes(k, s, 2)) for k in ("alltoall", "allgather", "allreduce") for s in (1000, 1002)}
    assert got == want == {("alltoall", 992), ("allgather", 1000), ("allreduce", 1000)}
    assert len(t) == 3  # 1,000 and 1,002 B run the same size: measured once, one row
    assert (t.wrong == 0).all()
    assert list(t["count"][t.kind == "alltoall"]) == [124]  # a rank's part, as nccl-tests prints it


def test_a_sweep_keeps_the_sizes_nccl_tests_runs(capsys):
    rc, out, _ = _run(capsys, "allgather", "--sizes", "1:64", "--json")
    r = json.loads(out)
    assert rc == 0 and [x["size_bytes"] for x in r["table"]] == [32, 64]  # 1..16 B: under 32
    assert any("1 B -> none (under 32 B)" in n for n in r["notes"])
    rc, out, err = _run(capsys, "allgather", "--sizes", "1:16")
    assert rc == 2 and "at least 32 B" in err
