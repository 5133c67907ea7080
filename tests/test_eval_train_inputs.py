"""`kit evaluate` and `kit train` on bad input: a damaged NeuSight test file, an --out in another
copy of the kit, --extra given relative to the current folder."""
import gzip
import json
import shutil

import pytest

from cli_json import cli_error
from kit.cli import main
from kit.errors import KitError

HEAD = "OPName,Latency,Device,Kernel Name,B,M,N,K"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))


def _neusight_gz(path, damage):
    """A NeuSight-format linear test file, gzipped, of which only the tail is damaged: the
    header line still reads, as load_measurements reads it first to tell the format."""
    lines = [HEAD] + [f"linear,{0.1 + i / 997:.6f},Tesla T4,sgemm_{i * 7919 % 1000},1,{64 + i},"
                      f"{128 + 3 * i},{256 + 5 * i}" for i in range(40000)]
    data = bytearray(gzip.compress(("\n".join(lines) + "\n").encode()))
    if damage == "cut":
        data = data[: len(data) // 2]
    else:  # the CRC in the gzip trailer
        data[-6] ^= 0xFF
    path.write_bytes(bytes(data))
    with gzip.open(path, "rt") as f:  # the case: the header line is readable
        assert f.readline().strip() == HEAD
    return path


@pytest.mark.parametrize("damage", ["cut", "crc"])
def test_a_damaged_gzipped_neusight_test_file_is_one_error(tmp_path, capsys, damage):
    # the kit's own format said "cannot read"; NeuSight's ended in an EOFError or a BadGzipFile
    # traceback from pandas
    from kit.data import load_measurements

    path = _neusight_gz(tmp_path / "linear.csv.gz", damage)
    with pytest.raises(KitError, match="cannot read"):
        load_measurements(path)
    err = cli_error(capsys, "evaluate", "--test", path, "--predictors", "roofline")
    assert "linear.csv.gz" in err


def test_train_out_in_another_copy_of_the_kit_is_refused(tmp_path):
    """A second checkout's kit/predict/weights holds kit weights alone, so it passed as a folder to
    replace; `kit train --out /work/main/kit/predict/weights` from a clone wrote over them."""
    from kit.predict.weights import SHIPPED_DIR, check_weights_folder

    other = tmp_path / "checkout" / "kit"
    (other / "predict").mkdir(parents=True)
    (other / "__init__.py").write_text("")
    (other / "predict" / "weights.py").write_text("")
    shutil.copytree(SHIPPED_DIR, other / "predict" / "weights")
    mine = tmp_path / "mine"
    shutil.copytree(SHIPPED_DIR, mine)
    assert check_weights_folder(mine) == mine  # kit weights outside any package: replaced
    for out in (other / "predict" / "weights", other / "new"):
        with pytest.raises(KitError, match="another copy of the kit"):
            check_weights_folder(out)
    with pytest.raises(KitError, match="is for the shipped weights folder"):
        check_weights_folder(other / "predict" / "weights", replace_shipped=True)


def test_train_names_extra_files_by_their_full_path(tmp_path, monkeypatch, capsys):
    """The manifest's command is the rerun: --data was made absolute for it, --extra was kept as
    typed (../own.csv), which a rerun from another folder does not find."""
    import kit.api

    seen = {}

    def fake_train(train_gpus, out, **kw):
        seen.update(kw)
        return {"out": str(out)}

    monkeypatch.setattr(kit.api, "train_predictors", fake_train)
    (tmp_path / "data" / "data").mkdir(parents=True)
    (tmp_path / "own.csv").write_text("op,latency_ms\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["train", "--data", "../data", "--train-gpus", "T4", "--out", "w", "--quick",
                 "--extra", "../own.csv", "--json"]) == 0
    capsys.readouterr()
    own = str((tmp_path / "own.csv").resolve())
    assert seen["extra"] == [own]  # what the manifest's extra_data names
    words = seen["command"].split()
    assert words[words.index("--extra") + 1] == own


def test_data_summary_takes_the_gpu_file_its_error_asks_for(tmp_path, capsys):
    """A NeuSight CSV of one's own GPU: the error says "give the command --gpu-file FILE", and
    `kit data summary` had no such option (argparse's "unrecognized arguments")."""
    from kit.hardware import get_gpu, unregister_gpu

    entry = {**json.loads(json.dumps(get_gpu("p4").__dict__, default=str)), "key": "my-p4x",
             "name": "My P4X", "aliases": ["My P4X"]}
    gpu_file = tmp_path / "gpu.json"
    gpu_file.write_text(json.dumps(entry))
    csv = tmp_path / "mine.csv"
    csv.write_text(f"{HEAD}\nlinear,0.5,My P4X,k,1,64,128,256\nbmm,0.25,My P4X,k,2,64,128,256\n")
    try:
        assert "--gpu-file" in cli_error(capsys, "data", "summary", "--file", csv)
        assert main(["data", "summary", "--file", str(csv), "--gpu-file", str(gpu_file), "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)["rows"]
        assert sorted((r["op"], r["gpu"], r["n"]) for r in rows) == [("bmm", "my-p4x", 1),
                                                                     ("linear", "my-p4x", 1)]
    finally:
        unregister_gpu("my-p4x")


def test_validate_twin_of_a_skipped_label_is_skipped_for_its_own_reason(tmp_path):
    """One configuration under two folder names of a GPU (T4/ and Tesla_T4/) is scored once; a
    twin of a label that was skipped (a model not in the zoo) had been listed as "the same
    configuration as T4/...: counted once", when neither was counted."""
    from kit.cli.cmd_validate import validate

    for folder, ms in (("T4", 100.0), ("Tesla_T4", 120.0)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "nosuchmodel-inf-512-8.json").write_text(json.dumps({"e2e_latency": ms}))
    r = validate(tmp_path)
    assert r["configs"] == []
    reasons = {s["label"]: s["reason"] for s in r["skipped"]}
    assert set(reasons) == {"T4/nosuchmodel-inf-512-8.json", "Tesla_T4/nosuchmodel-inf-512-8.json"}
    assert all("not in the zoo" in why and "counted once" not in why for why in reasons.values())
