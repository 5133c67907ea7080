"""One's own weights (`kit train --out DIR`) for predictions: --weights DIR on kit op, predict,
compare and validate, and KIT_WEIGHTS=DIR, read by every learned predictor; the output names
them; cached predictions are keyed by them. And the FP32-only baselines (li, mlp) refuse ops of
another dtype rather than give their FP32 time."""
import json
import os
from pathlib import Path

import pytest

from kit.cli import main
from kit.errors import KitError
from kit.predict.training import train_bundle
from kit.predict.weights import SHIPPED_DIR, load_bundle, save_bundle
from predict_synthetic import synthetic_frame

TINY = {"members": 1, "epochs": 1, "hidden": 8, "chooser_epochs": 1, "min_steps": 10}
TRAIN_GPUS = ["t4", "v100-pcie-32gb"]
LEARNED = ("habitat", "li", "mlp", "tile")  # every predictor that reads weights
GEMM = ["op", "gemm", "--m", "1024", "--n", "1024", "--k", "1024", "--gpu", "a100-pcie-80gb"]
NEUSIGHT = Path(os.environ.get("KIT_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"
                               / "neusight"))


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """Tiny weights, every learned part (tile, chooser, li, direct MLP), as `kit train` saves them."""
    bundle = train_bundle(synthetic_frame(tuple(TRAIN_GPUS), n=15), TRAIN_GPUS, seed=0, threads=1,
                          settings=TINY)
    return save_bundle(bundle, tmp_path_factory.mktemp("own-weights")).resolve()


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))  # a latency cache of this test alone
    monkeypatch.delenv("KIT_WEIGHTS", raising=False)


def _kit(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _json(capsys, *argv) -> dict:
    rc, out, err = _kit(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


def _one_error(rc, out, err) -> str:
    """The CLI's answer to bad input: exit 2, nothing on stdout, one line on stderr."""
    assert rc == 2 and not out and "Traceback" not in err
    assert err.startswith("kit: error: ") and len(err.strip().splitlines()) == 1, err
    return err


def _says_own(info: dict, own: Path, origin: str) -> None:
    manifest = json.loads((own / "manifest.json").read_text())
    assert info == {"folder": str(own), "from": origin, "train_gpus": manifest["train_gpus"],
                    "sha256": manifest["sha256"]["model.safetensors"]}


# -- kit op --------------------------------------------------------------------------------------
@pytest.mark.parametrize("predictor", LEARNED)
def test_op_with_own_weights_predicts_from_them_and_says_so(capsys, own, predictor):
    shipped = _json(capsys, *GEMM, "--predictor", predictor)
    mine = _json(capsys, *GEMM, "--predictor", predictor, "--weights", str(own))
    assert "predictor_weights" not in shipped  # the shipped weights: as before
    assert mine["latency_ms"] != shipped["latency_ms"]
    _says_own(mine["predictor_weights"], own, "--weights")
    # the same as the weights' own predictor gives
    from kit.hardware import get_gpu
    from kit.ops import Gemm, lead_alignment
    from kit.predict.weights import predictor_of

    op = Gemm(1024, 1024, 1024, align=lead_alignment(1024, 1024))  # as kit op builds it
    expected = predictor_of(load_bundle(own), predictor).predict([op], get_gpu("a100-pcie-80gb"))
    assert mine["latency_ms"] == pytest.approx(float(expected.latency_ms[0]))
    rc, out, err = _kit(capsys, *GEMM, "--predictor", predictor, "--weights", str(own))
    assert rc == 0 and out.splitlines()[-1].startswith(f"predictor weights {own} (from --weights")
    assert "t4, v100-pcie-32gb" in out.splitlines()[-1]


def test_kit_weights_variable_and_the_option_wins(capsys, own, tmp_path, monkeypatch):
    by_option = _json(capsys, *GEMM, "--weights", str(own))
    monkeypatch.setenv("KIT_WEIGHTS", str(own))
    by_variable = _json(capsys, *GEMM)
    assert by_variable["latency_ms"] == by_option["latency_ms"]
    _says_own(by_variable["predictor_weights"], own, "KIT_WEIGHTS")
    monkeypatch.setenv("KIT_WEIGHTS", str(tmp_path / "not-there"))  # never read: the option wins
    assert _json(capsys, *GEMM, "--weights", str(own))["latency_ms"] == by_option["latency_ms"]
    monkeypatch.setenv("KIT_WEIGHTS", "")  # empty: unset
    assert "predictor_weights" not in _json(capsys, *GEMM)
    # the shipped folder itself, named: the shipped weights, and not called other ones
    assert "predictor_weights" not in _json(capsys, *GEMM, "--weights", str(SHIPPED_DIR))


def test_a_folder_that_is_not_weights_and_an_unknown_path_are_one_error(capsys, own, tmp_path,
                                                                        monkeypatch):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "readme.txt").write_text("not weights")
    err = _one_error(*_kit(capsys, *GEMM, "--weights", str(other)))
    assert "--weights" in err and str(other) in err and "not a predictor weights folder" in err
    err = _one_error(*_kit(capsys, *GEMM, "--weights", str(tmp_path / "nowhere")))
    assert "no such weights folder" in err and "nowhere" in err
    (other / "manifest.json").write_text('{"name": "my-web-app"}')  # another program's manifest
    err = _one_error(*_kit(capsys, *GEMM, "--weights", str(other)))
    assert "not a gpu-perf-kit predictor manifest" in err
    monkeypatch.setenv("KIT_WEIGHTS", str(tmp_path / "nowhere"))
    err = _one_error(*_kit(capsys, *GEMM))
    assert err.startswith(f"kit: error: KIT_WEIGHTS={tmp_path / 'nowhere'}: no such weights folder")
    monkeypatch.delenv("KIT_WEIGHTS")
    # weights no chosen predictor reads are a mistake, not silently unused
    err = _one_error(*_kit(capsys, *GEMM, "--weights", str(own), "--predictor", "roofline"))
    assert "--weights is for the learned predictors" in err


def test_weights_in_use_in_python_too(own):
    from kit.api import predict_op
    from kit.ops import Gemm
    from kit.predict import using_weights

    shipped = predict_op(Gemm(1024, 1024, 1024), "a100-pcie-80gb")["latency_ms"]
    with using_weights(own):
        mine = predict_op(Gemm(1024, 1024, 1024), "a100-pcie-80gb")["latency_ms"]
        with pytest.raises(KitError, match="no such weights folder"), using_weights(own / "x"):
            predict_op(Gemm(1024, 1024, 1024), "a100-pcie-80gb")
    assert mine != shipped
    assert predict_op(Gemm(1024, 1024, 1024), "a100-pcie-80gb")["latency_ms"] == shipped


# -- whole models: their caches are keyed by the weights ------------------------------------------
def test_cache_keys_name_the_weights(own, tmp_path):
    import shutil

    from kit.predict import predictor_name, using_weights

    assert predictor_name("tile") == "tile" and predictor_name("auto") == "tile"
    with using_weights(own):
        mine = predictor_name("auto")
        assert mine.startswith("tile@weights:") and predictor_name("roofline") == "roofline"
    copy = tmp_path / "copy"
    shutil.copytree(own, copy)
    with using_weights(copy):  # the same files elsewhere: the same predictions
        assert predictor_name("tile") == mine
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["parts"]["li"]["coefs"]["gemm"]["t4"][2] += 0.001  # the manifest is part of them
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with using_weights(copy):
        assert predictor_name("li") != mine.replace("tile", "li")


def test_predict_is_never_served_the_other_weights_cache(capsys, own, tmp_path):
    args = ["predict", "gpt2", "--gpu", "t4", "--mode", "inference", "--batch", "1", "--seq", "32"]
    shipped = _json(capsys, *args)  # written to the latency cache first
    entries = set((tmp_path / "cache" / "latency").glob("*.npz"))
    assert entries
    mine = _json(capsys, *args, "--weights", str(own))
    assert mine["total_ms"] != shipped["total_ms"]
    _says_own(mine["predictor_weights"], own, "--weights")
    assert set((tmp_path / "cache" / "latency").glob("*.npz")) > entries  # its own entry
    again = _json(capsys, *args)  # the shipped entry was not written over
    assert again["total_ms"] == shipped["total_ms"] and "predictor_weights" not in again
    rc, out, err = _kit(capsys, *args, "--weights", str(own))
    assert rc == 0 and out.splitlines()[-1].startswith(f"predictor weights {own}")


def test_multi_gpu_op_cache_is_not_shared_across_weights(own):
    from kit.api import predict_multi_gpu
    from kit.predict import using_weights

    model = "gpt:layers=2,hidden=256,heads=4,seq=128,vocab=1000"

    def step():
        return predict_multi_gpu(model, "dgx-a100", dp=8, tp=1, pp=1, micro_batch=1,
                                 global_batch=8)["iteration_ms"]

    shipped = step()
    with using_weights(own):
        mine = step()
    assert mine != shipped
    assert step() == shipped


def test_compare_and_validate_take_weights(capsys, own, tmp_path):
    args = ["compare", "gpt2", "--gpus", "t4,a100-pcie-80gb", "--mode", "inference", "--seq", "32"]
    shipped, mine = _json(capsys, *args), _json(capsys, *args, "--weights", str(own))
    assert "predictor_weights" not in shipped
    _says_own(mine["predictor_weights"], own, "--weights")
    assert all(a["step_ms"] != b["step_ms"] for a, b in zip(shipped["rows"], mine["rows"]))
    rc, out, err = _kit(capsys, *args, "--weights", str(own))
    assert rc == 0 and out.splitlines()[-1].startswith(f"predictor weights {own}")

    labels = tmp_path / "labels" / "Tesla_T4"
    labels.mkdir(parents=True)
    (labels / "gpt2-inf-32-1.json").write_text('{"e2e_latency": 20}')
    args = ["validate", "--labels", str(labels.parent)]
    shipped, mine = _json(capsys, *args), _json(capsys, *args, "--weights", str(own))
    assert mine["configs"][0]["predicted_ms"] != shipped["configs"][0]["predicted_ms"]
    _says_own(mine["predictor_weights"], own, "--weights")
    assert "predictor_weights" not in shipped
    _one_error(*_kit(capsys, *args, "--weights", str(tmp_path / "nowhere")))


# -- the FP32-only baselines and other dtypes -----------------------------------------------------
@pytest.mark.parametrize("predictor", ["mlp", "li"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "tf32"])
def test_fp32_baselines_refuse_other_dtypes_everywhere(capsys, predictor, dtype):
    from kit.api import predict_op
    from kit.ops import Gemm, Softmax
    from kit.predict import get_predictor

    words = (f"the {predictor} predictor", dtype, "tile predictor")
    err = _one_error(*_kit(capsys, "op", "gemm", "--m", "4096", "--n", "4096", "--k", "4096",
                           "--gpu", "h100-sxm", "--dtype", dtype, "--predictor", predictor))
    assert all(w in err for w in words)
    with pytest.raises(KitError) as e:
        predict_op(Gemm(4096, 4096, 4096, dtype=dtype), "h100-sxm", predictor)
    assert all(w in str(e.value) for w in words)
    with pytest.raises(KitError, match=f"cannot predict {dtype} ops"):  # the predictor itself
        get_predictor(predictor).predict([Gemm(64, 64, 64), Softmax(64, 64, dtype)], "a100-pcie-80gb")
    for argv in (["predict", "gpt2", "--gpu", "h100-sxm"], ["compare", "gpt2", "--gpus", "h100-sxm"]):
        err = _one_error(*_kit(capsys, *argv, "--batch", "8", "--dtype", dtype, "--predictor", predictor))
        assert all(w in err for w in words)


def test_fp32_baselines_still_predict_fp32_and_roofline_ops_of_any_dtype():
    from kit.ops import Attention, Gemm
    from kit.predict import get_predictor, roofline

    for name in ("mlp", "li"):
        model = get_predictor(name)
        fp32 = model.predict([Gemm(1024, 1024, 1024)], "a100-pcie-80gb").latency_ms[0]
        assert fp32 > roofline(Gemm(1024, 1024, 1024), "a100-pcie-80gb").time_ms
        # a class it has no model of takes the roofline, which reads the dtype
        att = Attention(b=1, heads=8, seq_q=512, seq_kv=512, head_dim=64, dtype="bf16")
        got = model.predict([att], "h100-sxm").latency_ms[0]
        assert got == pytest.approx(roofline(att, "h100-sxm").time_ms)


@pytest.mark.skipif(not (NEUSIGHT / "data" / "dataset" / "test").is_dir(),
                    reason="NeuSight data not found (set KIT_DATA)")
def test_evaluate_on_neusight_fp32_rows_still_runs_every_predictor(capsys, tmp_path):
    test = tmp_path / "test"
    test.mkdir()
    for name in ("bmm.csv", "linear.csv", "elem.csv", "softmax.csv", "ln.csv"):
        lines = (NEUSIGHT / "data" / "dataset" / "test" / name).read_text().splitlines()
        (test / name).write_text("\n".join(lines[:1] + lines[1:400:40]) + "\n")
    rows = json.loads(_kit(capsys, "evaluate", "--test", str(test), "--json")[1])
    assert {r["predictor"] for r in rows} == {"roofline", "habitat", "li", "mlp", "tile"}
    assert {r["op"] for r in rows if r["predictor"] in ("li", "mlp")} >= {"bmm", "linear", "softmax"}


def test_demo_names_the_weights_it_reads(capsys, own, monkeypatch):
    """kit demo had read KIT_WEIGHTS without a word."""
    monkeypatch.setenv("KIT_WEIGHTS", str(own))
    rc, out, err = _kit(capsys, "demo")
    assert rc == 0 and out.splitlines()[-1].startswith(f"predictor weights {own}")


def test_a_predictor_object_of_other_weights_gets_its_own_multi_gpu_cache(own):
    """Keyed by the name "tile", an object of other weights had been served the shipped weights'
    kernel times (11.93 ms alone, 9.39 after a run with predictor="tile")."""
    from kit.parallel import Layout, predict_parallel

    model = "gpt:layers=2,hidden=256,heads=4,seq=128,vocab=1000"

    def step(predictor):
        return predict_parallel(model, "dgx-a100", Layout(tp=2, dtype="fp32"), predictor=predictor,
                                graph=False)["iteration_ms"]

    shipped = step("tile")
    mine = step(load_bundle(own).tile)
    assert mine != shipped and step("tile") == shipped


def test_the_dispatch_floor_is_kept_per_predictor_object_not_per_id():
    """Keyed by id(model), a predictor built after another was freed could take its floor."""
    from kit.hardware import get_gpu
    from kit.workload import kernel_times as K

    class Probe:
        name = "tile"

        def __init__(self, floor_ms):
            self.floor_ms = floor_ms

        def predict(self, ops, gpu):
            import pandas as pd

            return pd.DataFrame({"latency_ms": [1e-3 + self.floor_ms], "roofline_ms": [1e-3]})

    gpu = get_gpu("l4")
    for i in range(20):  # ids get reused as the objects are freed (by reference count, at once)
        floor = 0.01 * (i + 1)
        assert K.isolation_floor_ms(Probe(floor), gpu) == pytest.approx(floor)
