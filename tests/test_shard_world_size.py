"""`kit shard` on a world too large for the planner's cost model: one line and exit 2, before
any of it is built. Its (tables, placements, features) arrays grow as GPUs squared: 26 tables
on 128 DGX-H100 nodes (1,024 GPUs, Mudigere et al.'s scale) had asked numpy for 8.9 GiB for the
first of them (a MemoryError traceback), and 6 tables on 1,000 nodes were killed by the OOM
killer after a minute, with no word."""
import time

import pytest

pytest.importorskip("kit.comm")

from kit.cli import main  # noqa: E402


def test_a_world_too_large_to_model_is_one_line(tmp_path, capsys):
    f = tmp_path / "t.csv"
    f.write_text("name,rows,dim,pooling\n" + "".join(f"t{i},1000000,64,20\n" for i in range(26)))
    t0 = time.perf_counter()
    assert main(["shard", "--tables", str(f), "--system", "dgx-h100", "--nodes", "128"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1024 GPUs" in err and "--nodes" in err, err
    assert time.perf_counter() - t0 < 30  # refused before the all-to-all fit, not after it
