"""predict_collective / collective_table(nccl_tests=True) size a collective as `kit comm predict`
does (one rule, kit.comm.conventions.nccl_tests_sizes); by default they price the bytes given."""
import json

import pytest

from kit.cli import main
from kit.comm import collective_table, predict_collective
from kit.errors import KitError

# (kind, requested B, ranks, B nccl-tests runs), by hand from nccl-tests' setupArgs
# (count = size / 4 B) and each kind's GetCollByteCount:
CASES = [
    ("allreduce", 1001, 8, 1000),  # 250 words
    ("broadcast", 7, 2, 4),  # 1 word
    ("allgather", 100, 8, 96),  # 25 words, 3 a rank: 3 x 8 x 4 B
    ("reducescatter", 12, 2, 8),  # 3 words, 1 a rank: 1 x 2 x 4 B
    ("alltoall", 1000, 8, 896),  # 250 words, 31 a rank, 28 once 16-byte aligned: 28 x 8 x 4 B
]


def _cli(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("kind,asked,n,runs", CASES)
def test_api_and_cli_give_the_same_number(capsys, kind, asked, n, runs):
    cli = _cli(capsys, ["comm", "predict", kind, "--bytes", str(asked), "--system", "dgx-h100",
                        "--ranks", str(n), "--json"])
    api = predict_collective(kind, asked, "dgx-h100", ranks=n, nccl_tests=True)
    assert api.nbytes == cli["nbytes"] == runs
    assert api.time_ms == cli["time_ms"] and api.algbw_gbs == cli["algbw_gbs"]
    assert list(api.notes) == cli["notes"] and f"{asked:,} B -> {runs:,} B" in api.notes[0]
    same = predict_collective(kind, runs, "dgx-h100", ranks=n)  # the size it runs, as given
    assert api.algbw_gbs == pytest.approx(same.algbw_gbs) and api.time_ms == pytest.approx(same.time_ms)


def test_a_table_is_the_cli_sweep(capsys):
    cli = _cli(capsys, ["comm", "predict", "alltoall", "--sizes", "100,1000,2048", "--system", "dgx-h100",
                        "--ranks", "8", "--json"])
    t = collective_table("alltoall", [100, 1000, 2048], "dgx-h100", ranks=8, nccl_tests=True)
    assert list(t.size_bytes) == [row["size_bytes"] for row in cli["table"]] == [896, 2048]  # 100 B runs 0 B
    assert list(t.time_ms) == [row["time_ms"] for row in cli["table"]]
    assert t.attrs["notes"] == cli["notes"] and "100 B -> none (under 128 B)" in t.attrs["notes"][0]


@pytest.mark.parametrize("kind,asked", [("allreduce", 3), ("alltoall", 100)])
def test_under_one_word_is_one_error_in_both(capsys, kind, asked):
    assert main(["comm", "predict", kind, "--bytes", str(asked), "--system", "dgx-h100", "--ranks", "8"]) != 0
    cli_err = capsys.readouterr().err.strip()
    with pytest.raises(KitError) as api:
        predict_collective(kind, asked, "dgx-h100", ranks=8, nccl_tests=True)
    with pytest.raises(KitError) as table:
        collective_table(kind, [asked], "dgx-h100", ranks=8, nccl_tests=True)
    assert str(api.value) == str(table.value) and cli_err == f"kit: error: {api.value}"
    assert "would run 0 B" in str(api.value)


def test_by_default_the_bytes_given_are_priced():
    """A tensor's bytes (kit.parallel's buckets, a bf16 scalar) are not nccl-tests sweeps."""
    assert predict_collective("allreduce", 1001, "dgx-h100").nbytes == 1001
    assert predict_collective("allreduce", 2, "dgx-h100").notes == ()
    assert list(collective_table("allreduce", [1001, 3], "dgx-h100").size_bytes) == [1001, 3]
