"""The embedding collector on the CPU, with tiny sizes: rows, resume, and what it refuses."""
import csv

import numpy as np
import pytest

from kit.cli import main
from kit.embedding import Zipf, parse_distribution
from kit.embedding.collect import COLUMNS, collect, grid, load
from kit.embedding.correction import fit_correction
from kit.errors import KitError


def tiny(**kw):
    args = dict(batch=[16], rows=[500], dim=[8], pooling=[3], distributions=["uniform", "zipf:1.2"])
    args.update(kw)
    return grid(**args)


def test_rows_are_written_with_measured_unique_counts(tmp_path):
    out = tmp_path / "e.csv"
    r = collect(tiny(passes=("forward", "backward")), out, repeats=2, warmup=0)
    assert r["written"] == 4 and not r["failed"]
    df = load(out)
    assert list(df.columns) == COLUMNS and len(df) == 4
    assert set(df["pass"]) == {"forward", "backward"}
    assert (df["latency_ms"] > 0).all() and (df["lookups"] == 48).all()
    # the measured unique count is the sampled stream's own: at most the lookups, and for
    # Zipf(1.2) close to the model's expectation for 48 draws from 500 rows
    z = df[df["distribution"] == "zipf:1.2"]["unique_rows"].iloc[0]
    assert 1 <= z <= 48
    assert z == pytest.approx(Zipf(1.2).expected_unique(48, 500), abs=8)
    assert (df[df["distribution"] == "uniform"]["unique_rows"] > z).all()


def test_resume_skips_done_rows_and_repairs_a_cut_line(tmp_path):
    out = tmp_path / "e.csv"
    collect(tiny(), out, repeats=1, warmup=0)
    with open(out, "a") as f:
        f.write("torch,cpu,cpu,forw")  # a writer killed mid-line
    with pytest.raises(KitError, match="--resume"):
        collect(tiny(), out, repeats=1, warmup=0)
    r = collect(tiny(rows=[500, 700]), out, repeats=1, warmup=0, resume=True)
    assert r["skipped"] == 2 and r["written"] == 2
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and sorted({x["rows"] for x in rows}) == ["500", "700"]


def test_refusals(tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(KitError, match="not an embedding measurement CSV"):
        collect(tiny(), other, resume=True)
    with pytest.raises(KitError, match="fbgemm"):
        collect(tiny(passes=("backward",), optimizer="rowwise_adagrad"), tmp_path / "x.csv")
    with pytest.raises(KitError, match="device"):
        collect(tiny(), tmp_path / "y.csv", device="tpu")
    try:
        import fbgemm_gpu  # noqa: F401
    except ImportError:
        with pytest.raises(KitError, match="fbgemm_gpu installed"):
            collect(tiny(), tmp_path / "z.csv", backend="fbgemm")
        # nothing was measured, so nothing was written: a header-only file refused the next run
        assert not (tmp_path / "z.csv").exists()
        collect(tiny(), tmp_path / "z.csv", repeats=1)
        assert len((tmp_path / "z.csv").read_text().splitlines()) > 1


def test_cli(tmp_path, capsys):
    out = tmp_path / "c.csv"
    assert main(["collect-embedding", "--out", str(out), "--rows", "300", "--dim", "4",
                 "--pooling", "2", "--batch", "8", "--dist", "uniform", "--repeats", "1"]) == 0
    assert "1 rows written" in capsys.readouterr().out
    assert main(["collect-embedding", "--out", str(out), "--rows", "x"]) == 2
    assert "whole numbers" in capsys.readouterr().err
    assert main(["collect-embedding", "--out", str(tmp_path / "d.csv"), "--dist", "bogus"]) == 2


def test_distinct_distributions_get_distinct_rows_and_keys(tmp_path):
    specs = ["reuse:0.3,0.2", "reuse:0.05,0.45", "zipf:1.2000001", "zipf:1.2"]
    cfgs = tiny(distributions=specs)
    assert [c["distribution"] for c in cfgs] == specs  # describe() made two pairs of equal labels
    out = tmp_path / "e.csv"
    assert collect(cfgs, out, repeats=1, warmup=0)["written"] == 4
    r = collect(cfgs, out, repeats=1, warmup=0, resume=True)
    assert (r["written"], r["skipped"]) == (0, 4)
    assert list(load(out)["distribution"]) == specs


def test_resume_reads_an_older_files_zipf_labels(tmp_path):
    out = tmp_path / "old.csv"
    collect(tiny(), out, repeats=1, warmup=0)
    out.write_text(out.read_text().replace("zipf:1.2", "zipf(1.2)"))  # as written before specs
    r = collect(tiny(), out, repeats=1, warmup=0, resume=True)
    assert (r["written"], r["skipped"]) == (0, 2)


def test_collect_then_fit_a_correction_with_a_reuse_histogram(tmp_path):
    out = tmp_path / "reuse.csv"
    cfgs = tiny(batch=[8, 32], distributions=["reuse:0.3,0.2", "uniform"], passes=("forward", "backward"))
    assert collect(cfgs, out, repeats=1, warmup=0)["written"] == 8
    c = fit_correction(out, gpu="v100-sxm2-32gb")  # was: unknown distribution 'reuse(2 bins, ...)'
    assert c.trained_on["rows"] == 8 and all(np.isfinite(c.weights))
    # an older file's reuse label cannot be read back: one clear error naming the row
    out.write_text(out.read_text().replace("reuse:0.3,0.2", "reuse(2 bins, cold 0.500)"))
    with pytest.raises(KitError, match=r"row \d+: .*label, not its spec"):
        fit_correction(out, gpu="v100-sxm2-32gb")


# ---- timing methodology (CPU) ----------------------------------------------------------------

def test_fbgemm_tables_take_the_rows_dtype():
    from enum import Enum

    from kit.embedding.collect import _precision

    class SparseType(Enum):  # fbgemm_gpu.split_embedding_configs.SparseType's members used
        FP32 = 0
        FP16 = 1
        BF16 = 2

    assert _precision("bf16", SparseType) == {"weights_precision": SparseType.BF16,
                                              "output_dtype": SparseType.BF16}
    assert _precision("fp16", SparseType)["weights_precision"] is SparseType.FP16
    assert _precision("fp32", SparseType)["output_dtype"] is SparseType.FP32


def test_backward_rows_time_backward_only_and_indices_rotate(monkeypatch):
    import torch

    from kit.embedding import collect as E

    forwards, inputs = [], []
    real = torch.nn.EmbeddingBag.forward

    def spy(self, input, offsets=None, *a, **k):
        forwards.append(1)
        inputs.append(input.clone())
        return real(self, input, offsets, *a, **k)

    monkeypatch.setattr(torch.nn.EmbeddingBag, "forward", spy)
    cfg = {**tiny(passes=("backward",))[0], "_sets": 3}
    call, unique, before = E._torch_call(cfg, "cpu")
    before()
    n = len(forwards)
    call()
    assert len(forwards) == n == 1  # the timed call ran no forward
    cfg = {**tiny()[0], "_sets": 3}
    call, unique, before = E._torch_call(cfg, "cpu")
    inputs.clear()
    for _ in range(4):
        before()
        call()
    assert not torch.equal(inputs[0], inputs[1]) and torch.equal(inputs[0], inputs[3])  # 3 sets, cycled
    assert E.n_index_sets({"batch": 16, "pooling": 3, "tables": 1}, 12) == 12
    assert E.n_index_sets({"batch": 1 << 20, "pooling": 100, "tables": 8}, 12) == 1  # budget


def test_collect_writes_its_metadata(tmp_path):
    import json

    out = tmp_path / "e.csv"
    collect(tiny(), out, repeats=2, warmup=1)
    run = json.loads((tmp_path / "e.meta.json").read_text())["runs"][0]
    assert run["status"] == "done" and run["settings"]["repeats"] == 2 and run["written"] == 2


@pytest.mark.parametrize("field,value", [("batch", 0), ("dim", 0), ("pooling", 0), ("pooling", 2.5),
                                         ("rows", -3), ("tables", 1.5)])
def test_a_grid_size_that_is_not_a_whole_number_of_at_least_1_is_refused(tmp_path, field, value):
    # batch 0 had been measured and written, a row the file's own reader refuses (the file could
    # then be neither loaded nor resumed); pooling 2.5 had been measured, and recorded, as 2
    args = {"batch": [16], "rows": [500], "dim": [8], "pooling": [3], "tables": [1], field: [value]}
    with pytest.raises(KitError, match=f"{field} values must be whole numbers"):
        grid(distributions=["uniform"], **args)
    cfg = {**tiny(distributions=["uniform"])[0], field: value}  # a config built by hand
    with pytest.raises(KitError, match=f"config {field} must be a whole number"):
        collect([cfg], tmp_path / "e.csv", repeats=1, warmup=0)
    assert not (tmp_path / "e.csv").exists()
    assert grid(batch=[16.0], rows=[1e3], dim=[8], pooling=[3], distributions=["uniform"])[0]["rows"] == 1000


def test_an_index_tensor_naming_rows_past_the_table_is_refused_before_measuring(tmp_path):
    # its ids had been looked up out of range: a torch error per row on the CPU, a device-side
    # assert (which ends the run) on CUDA
    out = tmp_path / "e.csv"
    with pytest.raises(KitError, match="row id 99 but the table has 50 rows"):
        collect(tiny(rows=[50], distributions=[np.array([0, 5, 99, 99])]), out, repeats=1, warmup=0)
    assert not out.exists()


def test_a_config_built_by_hand_without_grids_private_fields_is_measured(tmp_path):
    # collect() takes config dicts; one holding the documented fields alone (no grid's "_dist")
    # had ended in a KeyError traceback
    cfg = {k: v for k, v in tiny(distributions=["zipf:1.05"])[0].items() if not k.startswith("_")}
    out = tmp_path / "e.csv"
    assert collect([cfg], out, repeats=1, warmup=0)["written"] == 1
    assert load(out)["distribution"].tolist() == ["zipf:1.05"]


def test_a_hand_built_config_is_written_with_its_distributions_spec(tmp_path):
    # written as given, a Zipf(1.2) had been 'Zipf(alpha=1.2)', an alpha 1.05 the number 1.05 and
    # an index tensor '[0 5 9 9]': specs neither the fitter nor resume can read back
    base = {k: v for k, v in tiny(distributions=["uniform"])[0].items() if not k.startswith("_")}
    idx = np.array([0, 5, 9, 9])
    dists = [Zipf(1.2), 1.05, idx]
    out = tmp_path / "e.csv"
    assert collect([{**base, "distribution": d} for d in dists], out, repeats=1, warmup=0)["written"] == 3
    assert load(out)["distribution"].tolist() == [parse_distribution(d).spec() for d in dists]
    assert parse_distribution(load(out)["distribution"][0]) == Zipf(1.2)


def test_a_hand_built_backward_config_with_no_optimizer_is_timed_as_sgd(tmp_path):
    # the torch backend had refused optimizer '' ("needs the fbgemm backend; torch does sgd")
    # after collect let it through, and a config with no optimizer ended in KeyError 'optimizer'
    base = {k: v for k, v in tiny(distributions=["uniform"], passes=("backward",))[0].items()
            if not k.startswith("_") and k != "optimizer"}
    out = tmp_path / "e.csv"
    r = collect([base, {**base, "dim": 4, "optimizer": ""}], out, repeats=1, warmup=0)
    assert r["written"] == 2 and not r["failed"]
    assert load(out)["optimizer"].fillna("").tolist() == ["sgd", ""]


@pytest.mark.parametrize("change,word", [({"pass": "Forward"}, "pass"), ({"tables": None}, "tables"),
                                         ("list", "dict")])
def test_a_hand_built_config_the_collector_cannot_write_is_refused_before_measuring(tmp_path, change, word):
    # pass 'Forward' had been timed as a backward and written as a row the CSV's reader refuses
    # (the file could be neither loaded nor resumed); a config without tables had ended in
    # KeyError 'tables', one given as a list of pairs in a TypeError
    base = {k: v for k, v in tiny(distributions=["uniform"])[0].items() if not k.startswith("_")}
    cfg = list(base.items()) if change == "list" else \
        {k: v for k, v in {**base, **change}.items() if v is not None}
    out = tmp_path / "e.csv"
    with pytest.raises(KitError, match=word):
        collect([cfg], out, repeats=1, warmup=0)
    assert not out.exists()
