"""Fixes from the data/evaluate/train/validate audit: weights carry their sha256 and are refused
when changed, damaged (NaN/inf) or described by a manifest of the wrong types; evaluate() on a
caller's frame checks its rows as the CSV path does; rows without a GPU and bad kernel times are
reported, not dropped in silence; a kit CSV of some columns keeps a last row without its
newline; GPU aliases in a kit CSV are catalog keys; a BOM is accepted; fetch refuses a folder in
a file's place; validate says so for an unreadable label and scores a label once."""
import hashlib
import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest

from cli_json import cli_error
from kit.cli import main
from kit.errors import KitError
from kit.predict.evaluate import evaluate, load_test, with_target
from kit.predict.training import train_bundle
from kit.predict.weights import (MANIFEST_FILE, SHIPPED_DIR, TENSORS_FILE, has_shipped,
                                 load_bundle, save_bundle)
from predict_synthetic import synthetic_frame

TINY = {"members": 1, "epochs": 1, "hidden": 8, "chooser_epochs": 1, "min_steps": 10}
KIT_HEAD = "op,latency_ms,gpu,device_name,b,m,n,k"
ROWS = ["linear,1.13,l4,NVIDIA L4,1,1024,2560,2560", "linear,26.5,l4,NVIDIA L4,1,32768,1024,4096",
        "bmm,0.40,l4,NVIDIA L4,4,512,512,512", "bmm,2.10,l4,NVIDIA L4,8,1024,1024,1024"]
NS_HEAD = "OPName,Latency,Device,B,M,N,K"
NS_ROWS = ["bmm,0.40,NVIDIA L4,4,512,512,512", "bmm,2.10,NVIDIA L4,8,1024,1024,1024",
           "bmm,0.90,NVIDIA L4,8,512,512,1024"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))


def _bundle(seed=0):
    return train_bundle(synthetic_frame(("t4", "p4"), n=15), ["t4", "p4"], seed=seed, threads=1,
                        settings=TINY, info={"command": "test", "data_source": "synthetic",
                                             "test_rows_trained_on": 0})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("w")
    save_bundle(_bundle(), out)
    return out


def _copy(src, dst, manifest_edit=None):
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / TENSORS_FILE, dst / TENSORS_FILE)
    m = json.loads((src / MANIFEST_FILE).read_text())
    if manifest_edit is not None:
        manifest_edit(m)
    (dst / MANIFEST_FILE).write_text(json.dumps(m))
    return dst


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write(path, head, rows, end="\n"):
    path.write_text("\n".join([head, *rows]) + end)
    return path


# -- 1. weights integrity --------------------------------------------------------------------
def test_train_writes_the_tensor_files_sha256_and_a_retrain_reproduces_it(saved, tmp_path):
    m = json.loads((saved / MANIFEST_FILE).read_text())
    assert m["sha256"] == {TENSORS_FILE: _sha(saved / TENSORS_FILE)}
    save_bundle(_bundle(), tmp_path / "again")  # the same seed: the same file, the same hash
    again = json.loads((tmp_path / "again" / MANIFEST_FILE).read_text())
    assert again["sha256"] == m["sha256"]
    assert (tmp_path / "again" / TENSORS_FILE).read_bytes() == (saved / TENSORS_FILE).read_bytes()
    load_bundle(saved)  # its own hash passes


@pytest.mark.skipif(not has_shipped(), reason="no shipped weights in this checkout")
def test_the_shipped_manifest_records_the_shipped_files_hash():
    m = json.loads((SHIPPED_DIR / MANIFEST_FILE).read_text())
    assert m["sha256"] == {TENSORS_FILE: _sha(SHIPPED_DIR / TENSORS_FILE)}
    load_bundle(SHIPPED_DIR)


def test_a_tensor_file_changed_after_training_is_refused(saved, tmp_path):
    # a same-shaped swap (another seed's file under this manifest) loaded and scored silently
    other = tmp_path / "other"
    save_bundle(_bundle(seed=1), other)
    w = _copy(saved, tmp_path / "w")
    shutil.copy(other / TENSORS_FILE, w / TENSORS_FILE)
    with pytest.raises(KitError, match=f"{TENSORS_FILE}: its sha256 .* is not the .* "
                                       f"{MANIFEST_FILE} records"):
        load_bundle(w)
    data = bytearray((saved / TENSORS_FILE).read_bytes())  # one byte of the data flipped
    data[-5] ^= 0x40
    (w / TENSORS_FILE).write_bytes(bytes(data))
    with pytest.raises(KitError, match="sha256"):
        load_bundle(w)


@pytest.mark.parametrize("rehash", [False, True])
def test_weights_holding_nan_or_inf_are_refused_naming_the_file(saved, tmp_path, rehash):
    from safetensors.numpy import load_file, save_file

    # no sha256 (weights written before it was recorded), or one that matches the damaged file
    w = _copy(saved, tmp_path / "w", lambda m: m.pop("sha256"))
    tensors = load_file(str(saved / TENSORS_FILE))
    name = sorted(k for k in tensors if k.startswith("tile."))[0]
    tensors[name] = tensors[name].copy()
    tensors[name].flat[0] = np.nan if rehash else np.inf
    save_file(tensors, str(w / TENSORS_FILE))
    if rehash:
        m = json.loads((w / MANIFEST_FILE).read_text())
        m["sha256"] = {TENSORS_FILE: _sha(w / TENSORS_FILE)}
        (w / MANIFEST_FILE).write_text(json.dumps(m))
    with pytest.raises(KitError, match=f"{TENSORS_FILE}: tensor '{name}' holds 1 NaN or infinite"):
        load_bundle(w)


@pytest.mark.parametrize("edit, match", [
    (lambda m: m.__setitem__("test_rows_trained_on", "abc"), "test_rows_trained_on must be a whole number"),
    (lambda m: m.__setitem__("test_rows_trained_on", [1]), "test_rows_trained_on must be a whole number"),
    (lambda m: m.__setitem__("test_rows_trained_on", -3), "test_rows_trained_on must be a whole number"),
    (lambda m: m["parts"]["tile"].__setitem__("band", "x"), "parts.tile.band must be an object"),
    (lambda m: m["parts"]["tile"].__setitem__("band", {"near_distance": "far"}),
     "parts.tile.band.near_distance must be a number"),
    (lambda m: m["parts"]["tile"].__setitem__("band", {"sigma_at_0": {"gemm": "x"}}),
     "parts.tile.band.sigma_at_0 must be"),
    (lambda m: m["parts"].__setitem__("tile", []), "parts.tile must be an object"),
    (lambda m: m["parts"]["tile"].__setitem__("classes", [1]), "do not match their manifest"),
    (lambda m: m.__setitem__("sha256", "abc"), "sha256 must be"),
    (lambda m: m.__setitem__("sha256", {TENSORS_FILE: "z" * 64}), "sha256 must be"),
])
def test_manifest_values_of_the_wrong_type_are_one_error(saved, tmp_path, capsys, edit, match):
    w = _copy(saved, tmp_path / "w", edit)
    with pytest.raises(KitError, match=match):
        load_bundle(w)
    test = _write(tmp_path / "t.csv", KIT_HEAD, ROWS)
    assert match.split(" ")[0] in cli_error(capsys, "evaluate", "--test", test, "--predictors", "tile",
                                            "--weights", w)


def test_evaluate_refuses_to_score_non_finite_predictions(tmp_path, monkeypatch):
    # damaged weights that load gave `mape inf/nan` with exit 0
    from kit.predict import get_predictor
    import kit.predict.evaluate as ev

    class Overflowing:
        name = "roofline"

        def predict(self, ops, gpu):
            out = get_predictor("roofline").predict(ops, gpu)
            out["latency_ms"] = np.inf
            return out

    monkeypatch.setattr(ev, "build_predictors", lambda *a, **k: {"roofline": Overflowing()})
    with pytest.raises(KitError, match=r"roofline gave no finite, positive latency \(or band\) "
                                       r"for 4 of its 4 test rows .*got inf"):
        evaluate(_write(tmp_path / "t.csv", KIT_HEAD, ROWS), ["roofline"])


# -- 2. evaluate() on a frame: the CSV path's checks --------------------------------------------
@pytest.mark.parametrize("value", [-1.0, 0.0, np.nan, np.inf])
def test_evaluate_on_a_frame_refuses_a_latency_the_csv_path_refuses(tmp_path, value):
    frame = load_test(_write(tmp_path / "t.csv", KIT_HEAD, ROWS))
    frame.loc[1, "latency_ms"] = value  # gave a negative MAPE, inf or nan
    with pytest.raises(KitError, match="the test frame: latency_ms must be a positive number; "
                                       "the row at index 1"):
        evaluate(frame, ["roofline"])
    csv = tmp_path / "bad.csv"
    frame.to_csv(csv, index=False)
    with pytest.raises(KitError, match="latency_ms must be a positive number|must hold finite"):
        load_test(csv)


def test_evaluate_on_a_frame_takes_rows_as_the_csv_path_does(tmp_path):
    path = _write(tmp_path / "t.csv", KIT_HEAD, ROWS)
    frame = load_test(path)
    by_file = evaluate(path, ["roofline"])
    # an exact repeat is kept once, as load_test keeps it (the frame path counted it twice)
    assert evaluate(pd.concat([frame, frame]), ["roofline"]) == by_file
    # a GPU alias is the catalog key
    assert evaluate(frame.assign(gpu="L4"), ["roofline"]) == by_file
    # a row without a GPU (and no device to look up) is left out with a note, not in silence
    gpuless = frame.copy()
    gpuless.loc[0, ["gpu", "device_name"]] = np.nan
    with pytest.warns(UserWarning, match="the test frame: 1 of the 4 test rows has no GPU"):
        rows = evaluate(gpuless, ["roofline"])
    assert sum(r["n"] for r in rows) == 3
    bad = frame.copy()
    bad.loc[2, "m"] = -4
    with pytest.raises(KitError, match="the test frame, the row at index 2: a bmm row needs m"):
        evaluate(bad, ["roofline"])


# -- 3. rows without a GPU ------------------------------------------------------------------
def test_rows_without_a_gpu_are_noted_and_none_on_a_gpu_is_one_error(tmp_path, capsys):
    path = _write(tmp_path / "ns.csv", NS_HEAD, [*NS_ROWS, "bmm,5.0,cpu,8,2048,2048,2048"])
    assert main(["evaluate", "--test", str(path), "--predictors", "roofline", "--json"]) == 0
    out, err = capsys.readouterr()
    assert sum(r["n"] for r in json.loads(out)) == 3
    assert "kit: note: " in err and "1 of the 4 test rows has no GPU" in err
    kit = _write(tmp_path / "kit.csv", KIT_HEAD, [*ROWS[:3], "linear,3.0,,,1,2048,1024,1024"])
    with pytest.warns(UserWarning, match="1 of the 4 test rows has no GPU"):
        assert sum(r["n"] for r in evaluate(kit, ["roofline"])) == 3
    cpu = _write(tmp_path / "cpu.csv", KIT_HEAD, ["linear,3.0,,cpu,1,2048,1024,1024",
                                                  "bmm,1.0,,cpu: x86,2,64,64,64"])
    err = cli_error(capsys, "evaluate", "--test", cpu)  # it named 'no modelled op class'
    assert "none of the 2 test row(s) is on a GPU" in err and "modelled op class" not in err


# -- 4. the kernel target ---------------------------------------------------------------------
@pytest.mark.parametrize("kernel", ["-5", "0", "inf"])
def test_a_bad_kernel_time_is_an_error_like_a_bad_latency(tmp_path, capsys, kernel):
    rows = [r + ",0.9" for r in ROWS]
    rows[1] = ROWS[1] + f",{kernel}"
    path = _write(tmp_path / "k.csv", KIT_HEAD + ",kernel_ms", rows)
    err = cli_error(capsys, "evaluate", "--test", path, "--target", "kernel", "--predictors", "roofline")
    assert "k.csv: kernel_ms must be a positive number; row 3 has" in err
    frame = load_test(_write(tmp_path / "ok.csv", KIT_HEAD + ",kernel_ms", [r + ",0.9" for r in ROWS]))
    frame.loc[1, "kernel_ms"] = float(kernel)
    with pytest.raises(KitError, match="kernel_ms must be a positive number"):
        with_target(frame, "kernel")


def test_rows_without_a_kernel_time_are_left_out_with_a_note(tmp_path):
    rows = [r + ",0.9" for r in ROWS]
    rows[1] = ROWS[1] + ","
    path = _write(tmp_path / "k.csv", KIT_HEAD + ",kernel_ms", rows)
    with pytest.warns(UserWarning, match="1 of the 4 test rows has no kernel time"):
        out = evaluate(path, ["roofline"], target="kernel")
    assert sum(r["n"] for r in out) == 3 and all(math.isfinite(r["mape"]) for r in out)


# -- 5. a kit CSV of some columns without its final newline ----------------------------------
def test_a_kit_csv_of_some_columns_keeps_its_last_row_without_a_newline(tmp_path):
    from kit.data import load_measurements

    path = _write(tmp_path / "t.csv", KIT_HEAD, ROWS[:2], end="")
    assert len(load_measurements(path)) == 2  # the last row was taken for an unfinished one
    cut = _write(tmp_path / "cut.csv", KIT_HEAD, [ROWS[0], "linear,26.5,l4"], end="")
    with pytest.warns(UserWarning, match="unfinished last line"):
        assert len(load_measurements(cut)) == 1  # a line cut short is still left out


# -- 6. GPU aliases in a kit CSV's gpu column -------------------------------------------------
def test_gpu_aliases_in_a_kit_csv_are_catalog_keys(tmp_path, capsys):
    from kit.data import load_measurements

    rows = ["softmax,0.05,t4,,,,,", "softmax,0.05,T4,,,,,", "softmax,0.09,Tesla T4,,,,,"]
    head = "op,latency_ms,gpu,device_name,b,m,n,k,rows,cols"
    path = _write(tmp_path / "t.csv", head, [r + ",64,1024" for r in rows[:2]]
                  + [rows[2] + ",128,4096"])
    assert load_measurements(path).gpu.tolist() == ["t4"] * 3
    out = evaluate(path, ["roofline"])
    assert [(r["gpu"], r["n"]) for r in out] == [("t4", 2)]  # the T4 repeat of the t4 row: once
    assert main(["data", "summary", "--file", str(path), "--json"]) == 0
    assert [(r["gpu"], r["n"]) for r in json.loads(capsys.readouterr().out)["rows"]] == [("t4", 3)]


# -- 7. lower ---------------------------------------------------------------------------------
def test_a_kit_csv_with_a_bom_is_read(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join([KIT_HEAD, *ROWS]).encode() + b"\n")
    assert sum(r["n"] for r in evaluate(path, ["roofline"])) == 4
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # and without its final newline
    assert sum(r["n"] for r in evaluate(path, ["roofline"])) == 4


def test_fetch_into_a_folder_where_a_file_belongs_is_one_error_and_leaves_no_part(tmp_path):
    from kit.data import fetch

    root = tmp_path / "mirror"
    (root / "scripts" / "asplos" / "data").mkdir(parents=True)
    body = b"OPName,Latency\n"
    (root / "scripts" / "asplos" / "data" / "bmm.csv").write_bytes(body)
    manifest = {"commit": fetch.NEUSIGHT_COMMIT, "folder": "scripts/asplos",
                "files": {"data/bmm.csv": {"sha256": hashlib.sha256(body).hexdigest(),
                                           "bytes": len(body)}}}
    dest = tmp_path / "dest"
    (dest / "data" / "bmm.csv").mkdir(parents=True)
    with pytest.raises(KitError, match="bmm.csv is a folder where the file bmm.csv belongs"):
        fetch.fetch_neusight(dest=dest, base_url=root.as_uri(), manifest=manifest, progress=False)
    assert not (dest / "data" / "bmm.csv.part").exists()
    # os.replace failing for another reason leaves no .part either
    (dest / "data" / "bmm.csv").rmdir()

    def refuse(src, dst):
        raise OSError(13, "Permission denied")
    import os
    real = os.replace
    os.replace = refuse
    try:
        with pytest.raises(KitError, match="cannot put the downloaded bmm.csv.*Permission denied"):
            fetch.fetch_neusight(dest=dest, base_url=root.as_uri(), manifest=manifest, progress=False)
    finally:
        os.replace = real
    assert not (dest / "data" / "bmm.csv.part").exists()


LABEL = {"num_layer": 24, "e2e_latency": 694.46, "fw_latency": 694.46, "bwall_latency": 0}


def test_validate_notes_an_unreadable_label_and_scores_a_label_under_two_gpu_names_once(tmp_path):
    from kit.cli.cmd_validate import validate

    for folder in ("T4", "Tesla_T4"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "bert_large-inf-512-8.json").write_text(json.dumps(LABEL))
    (tmp_path / "Tesla_T4" / "bert_large-inf-512-16.json").write_text('{"e2e_latency": 12,')
    with pytest.warns(UserWarning) as notes:
        r = validate(tmp_path)
    assert r["overall"]["configs"] == 1  # it was scored twice, as 2 configs
    reasons = {s.get("label"): s["reason"] for s in r["skipped"]}
    assert "unreadable label" in reasons["Tesla_T4/bert_large-inf-512-16.json"]
    assert "the same configuration as T4/bert_large-inf-512-8.json" in \
        reasons["Tesla_T4/bert_large-inf-512-8.json"]
    text = [str(w.message) for w in notes]
    assert any("bert_large-inf-512-16.json: skipped, unreadable label" in t for t in text)


def test_gpu_keys_keep_a_missing_gpu_missing():
    # on pandas 2, astype("str") wrote a missing GPU as the text "nan", which evaluate then
    # refused as an unknown GPU instead of leaving the row out with a note (pyproject allows 2.1+)
    import numpy as np
    import pandas as pd

    from kit.data.records import gpu_keys

    frame = pd.DataFrame({"gpu": ["T4", "cpu", np.nan], "device_name": [np.nan, np.nan, np.nan]})
    out = gpu_keys(frame)["gpu"]
    assert out.iloc[0] == "t4" and out.iloc[1:].isna().all()


def test_a_foreign_parquet_under_the_caches_name_is_rebuilt(tmp_path, monkeypatch):
    # a valid parquet file of another table under the cache's name was trusted (1 row)
    import pandas as pd

    from kit.data.cache import cache_dir, cache_key, cached_table
    from kit.data.schema import COLUMNS

    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "in.csv"
    src.write_text("x\n1\n")
    path = cache_dir() / f"t--{cache_key('t', [src])}.parquet"
    path.parent.mkdir(parents=True)
    pd.DataFrame({"a": [1]}).to_parquet(path, index=False)
    built = pd.DataFrame({c: pd.Series([], dtype="object") for c in COLUMNS})
    with pytest.warns(UserWarning, match="not the measurement schema"):
        out = cached_table("t", [src], lambda: built)
    assert list(out.columns) == list(COLUMNS)
    assert list(pd.read_parquet(path).columns) == list(COLUMNS)  # rewritten


def test_a_process_whose_loader_changed_on_disk_caches_no_table(tmp_path, monkeypatch):
    """A process runs the loader it imported: once the loader's code on disk differs (an edit or
    a git pull under an open Jupyter kernel), its tables are built and neither read from nor
    written to the cache, with one warning. It had stored its old loader's table under the new
    loader's key, which fresh processes then served."""
    from pathlib import Path

    import pandas as pd

    from kit import source_digest
    from kit.data.cache import cache_dir, cached_table
    from kit.data.schema import COLUMNS

    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(source_digest, "_FIRST", {})
    monkeypatch.setattr(source_digest, "_WARNED", set())
    src = tmp_path / "in.csv"
    src.write_text("x\n1\n")
    built = pd.DataFrame({c: pd.Series([], dtype="object") for c in COLUMNS})
    builds = []

    def build():
        builds.append(1)
        return built

    cached_table("t", [src], build)
    cached_table("t", [src], build)
    assert len(builds) == 1  # cached while the loader is the one imported
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: real(self) + (
        b"\n# edited\n" if self.name == "schema.py" else b""))
    monkeypatch.setattr(source_digest, "_MEMO", {})  # as after the file's size or mtime changed
    before = sorted(cache_dir().glob("*"))
    with pytest.warns(UserWarning, match="loader cache is off"):
        cached_table("t", [src], build)
    cached_table("t", [src], build)  # warned once
    assert len(builds) == 3 and sorted(cache_dir().glob("*")) == before
