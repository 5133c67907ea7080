"""A table too big for one GPU under kinds that keep tables whole (tw, dp): the error says to
allow a kind that splits tables. It had said "raise the cap (--memory-gib) or use more GPUs",
and no number of GPUs holds a whole 48 GiB table on a 40 GiB A100."""
import pytest

pytest.importorskip("kit.comm")

from kit.cli import main  # noqa: E402


@pytest.mark.parametrize("kinds", ["tw", "dp", "tw,dp"])
def test_whole_table_kinds_say_to_allow_a_splitting_kind(tmp_path, capsys, kinds):
    f = tmp_path / "t.csv"
    f.write_text("name,rows,dim,pooling\nbig,100000000,128,10\nsmall,1000,16,1\n")
    assert main(["shard", "--tables", str(f), "--system", "dgx-a100", "--kinds", kinds,
                 "--budget-s", "0.2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--kinds with cw, rw or twrw" in err, err
    assert "use more GPUs" not in err
