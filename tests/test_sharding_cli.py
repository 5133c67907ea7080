"""`kit shard` end to end on a real System preset and the real collective model."""
import json

import pytest

pytest.importorskip("kit.comm")
pytest.importorskip("kit.hardware.system")

from kit.cli import main  # noqa: E402

CSV = "name,rows,dim,pooling,zipf_alpha\nuser,10000000,128,1,1.1\nitem,5000000,128,30,0.9\n" \
      "cat,1000,32,3,\nquery,20000000,64,20,1.2\nad,2000000,64,5,\n"


def test_shard_json(tmp_path, capsys):
    f = tmp_path / "t.csv"
    f.write_text(CSV)
    assert main(["shard", "--tables", str(f), "--system", "dgx-a100", "--batch", "1024",
                 "--budget-s", "0.5", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert {"plan", "cost_ms", "per_rank_ms", "baselines", "plans_evaluated", "search_s"} <= set(r)
    assert [p["table"] for p in r["plan"]] == ["user", "item", "cat", "query", "ad"]
    assert len(r["per_rank_ms"]) == 8
    assert set(r["baselines"]) == {"greedy_size", "greedy_dim_pooling", "greedy_dim_pooling_log_rows"}
    assert r["cost_ms"] <= min(v for v in r["baselines"].values() if v is not None) + 1e-9
    assert r["plans_evaluated"] > 100


def test_shard_text_and_errors(tmp_path, capsys):
    f = tmp_path / "t.csv"
    f.write_text(CSV)
    assert main(["shard", "--tables", str(f), "--system", "pcie8", "--budget-s", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "rank   7" in out and "greedy_size" in out
    bad = tmp_path / "bad.csv"
    bad.write_text("name,rows\nx,3\n")
    assert main(["shard", "--tables", str(bad), "--system", "dgx-a100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing column(s) dim, pooling" in err
    assert main(["shard", "--tables", str(f), "--system", "no-such"]) == 2
    assert "unknown system" in capsys.readouterr().err


@pytest.mark.parametrize("name,tol", [("dgx-a100", 0.01), ("a100x4-nvlink", 0.01),
                                      ("dgx-h100-roce-400g-x2", 0.05), ("pcie8", 0.15)])
def test_a2a_surrogate_tracks_kit_comm_on_plan_like_matrices(name, tol):
    import numpy as np

    import kit.comm as comm
    from kit.hardware.system import get_system
    from kit.sharding.a2a import A2ASurrogate

    s = get_system(name)
    a = A2ASurrogate(s, comm)
    W, rng = s.world_size, np.random.default_rng(11)
    for _ in range(10):  # table-wise-like traffic: a few owners send slices to everyone
        m = np.zeros((W, W))
        for owner in rng.choice(W, size=3):
            m[owner] += rng.uniform(1e5, 5e7)
        np.fill_diagonal(m, 0)
        truth = comm.predict_alltoallv(m, s).time_ms
        assert a.time_ms(a.block(m)[None])[0] == pytest.approx(truth, rel=tol)
