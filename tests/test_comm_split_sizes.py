"""`kit comm predict` sizes an all-gather, reduce-scatter or all-to-all as nccl-tests runs it:
count = size // 4 (float words), rounded down to a multiple of the ranks (src/common.cu
setupArgs; each collective's GetCollByteCount takes count / nranks a rank). An all-to-all of
3 B on 8 ranks had been priced as 3 B; nccl-tests runs nothing there."""
import json

from kit.cli import main
from kit.comm.conventions import split_size_bytes

SYSTEM = ["--system", "dgx-h100"]  # one node of 8 H100s: 8 ranks


def _run(capsys, *argv):
    rc = main(["comm", "predict", *argv, *SYSTEM])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_the_rule():
    assert split_size_bytes("alltoall", 100, 8) == 96  # 25 words -> 24, 3 a rank
    assert split_size_bytes("allgather", 31, 8) == 0  # 7 words: under one a rank
    assert split_size_bytes("reducescatter", 12, 2) == 8  # 3 words -> 2
    assert split_size_bytes("allreduce", 3, 8) == 3  # not split: as given


def test_under_one_word_a_rank_is_one_error(capsys):
    rc, out, err = _run(capsys, "alltoall", "--bytes", "3")
    assert rc == 2 and not out and len(err.strip().splitlines()) == 1
    assert "less than one 4-byte word a rank" in err and "at least 32 B" in err  # 4 B x 8 ranks


def test_a_size_not_divisible_is_rounded_down_and_said(capsys):
    rc, out, _ = _run(capsys, "alltoall", "--bytes", "100", "--json")
    r = json.loads(out)
    assert rc == 0 and r["size_bytes"] == 96 and r["ranks"] == 8
    assert any("100 B -> 96 B" in n for n in r["notes"])
    rc, out, _ = _run(capsys, "alltoall", "--bytes", "100")
    assert rc == 0 and "alltoall of 96 B" in out and "note: alltoall on 8 ranks" in out
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
