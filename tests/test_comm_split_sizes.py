"""`kit comm predict` sizes an all-gather, reduce-scatter or all-to-all as nccl-tests runs it:
count = size // 4 (float words, src/common.cu setupArgs), then a rank's part by each collective's
GetCollByteCount: count / nranks for all-gather and reduce-scatter, (count / nranks) & -(16 / 4)
for all-to-all (16-byte aligned); the size run is nranks parts. An all-to-all of 3 B on 8 ranks
had been priced as 3 B, and one of 1,000 B as 992 B where nccl-tests runs 896 B."""
import json

from kit.cli import main
from kit.comm.conventions import split_size_bytes

SYSTEM = ["--system", "dgx-h100"]  # one node of 8 H100s: 8 ranks


def _run(capsys, *argv):
    rc = main(["comm", "predict", *argv, *SYSTEM])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _nccl_tests_bytes(kind, size, nranks):
    """nccl-tests' own arithmetic, its C expressions spelled in Python (float: eltSize 4)."""
    count = size // 4
    param = {"allgather": count // nranks, "reducescatter": count // nranks,
             "alltoall": (count // nranks) & -(16 // 4)}[kind]
    return nranks * param * 4


def test_the_rule():
    assert split_size_bytes("alltoall", 100, 8) == 0  # 25 words, 3 a rank: 0 once 16-byte aligned
    assert split_size_bytes("alltoall", 1000, 8) == 896  # 250 words, 31 a rank -> 28, x 8 x 4 B
    assert split_size_bytes("allgather", 31, 8) == 0  # 7 words: under one a rank
    assert split_size_bytes("reducescatter", 12, 2) == 8  # 3 words -> 2
    assert split_size_bytes("allreduce", 3, 8) == 3  # not split: as given
    for kind in ("allgather", "reducescatter", "alltoall"):
        for n in (1, 2, 3, 8, 16, 24):
            for size in (*range(0, 700), 1000, 4096 * 3 + 20, 10**9 + 7):
                assert split_size_bytes(kind, size, n) == _nccl_tests_bytes(kind, size, n), (kind, n, size)


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
    rc, out, _ = _run(capsys, "allreduce", "--bytes", "100", "--json")  # not split: unchanged
    r = json.loads(out)
    assert r["size_bytes"] == 100 and not any("words" in n for n in r["notes"])


def test_a_sweep_keeps_the_sizes_nccl_tests_runs(capsys):
    rc, out, _ = _run(capsys, "allgather", "--sizes", "1:64", "--json")
    r = json.loads(out)
    assert rc == 0 and [x["size_bytes"] for x in r["table"]] == [32, 64]  # 1..16 B: under 32
    assert any("1 B -> none (under 32 B)" in n for n in r["notes"])
    rc, out, err = _run(capsys, "allgather", "--sizes", "1:16")
    assert rc == 2 and "at least 32 B" in err
