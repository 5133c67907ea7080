"""Which collector runs make `kit train --extra` leave a file's linear rows out as timed without a
bias: only runs that timed linear with --no-bias and may have written rows (FILE.meta.json)."""
import json

import pandas as pd

from kit.data.collect import collect
from kit.predict.own_measurements import own_rows

GEMMS = [(2, 3, 4, 5), (1, 6, 7, 8)]


def _on_a_gpu(csv):
    """The CPU rows as rows of a catalog GPU, so that own_rows keeps what it keeps of a GPU's."""
    d = pd.read_csv(csv)
    d["gpu"], d["device_name"] = "h100-sxm", "NVIDIA H100 80GB HBM3"
    d.to_csv(csv, index=False)


def _runs(meta):
    return json.loads(meta.read_text())["runs"]


def _kept(csv):
    frame, (rec,) = own_rows([csv], ["gemm"])
    return frame.op.value_counts().to_dict(), rec["left_out"]["linear without a bias"]


def test_linear_rows_with_a_bias_are_kept_whatever_other_runs_skipped(tmp_path):
    out, meta = tmp_path / "m.csv", tmp_path / "m.meta.json"
    kw = dict(device="cpu", warmup=0, repeats=1, progress=False)
    collect("bmm", GEMMS, out, bias=False, **kw)  # --no-bias, but no linear timed
    collect("linear", GEMMS, out, resume=True, **kw)  # with a bias
    assert [(r["settings"]["ops"], r["settings"]["linear_bias"]) for r in _runs(meta)] == \
        [(["bmm"], False), (["linear"], True)]
    _on_a_gpu(out)
    assert _kept(out) == ({"bmm": 2, "linear": 2}, 0)  # the linear rows had been left out: 2

    # a --no-bias linear run that measured nothing wrote no row
    doc = json.loads(meta.read_text())
    doc["runs"].insert(0, {"settings": {"ops": ["linear"], "linear_bias": False}, "measured": 0})
    meta.write_text(json.dumps(doc))
    assert _kept(out) == ({"bmm": 2, "linear": 2}, 0)

    # one that may have (killed: no count) makes the file's linear rows unknown: left out
    doc["runs"][0].pop("measured")
    meta.write_text(json.dumps(doc))
    assert _kept(out) == ({"bmm": 2}, 2)
