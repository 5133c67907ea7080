"""Third audit of the single-GPU surface: the shipped weights are never written over by
accident, a predictor that has no model of an op says so, a fill moves its output alone, GPU
objects given directly are checked, and predictors read any iterable of kit ops."""
import dataclasses
import json

import pytest

from kit.api import predict_op
from kit.errors import KitError
from kit.hardware import get_gpu
from kit.ops import Dropout, Elementwise, Gemm
from kit.predict import get_predictor
from kit.predict.weights import SHIPPED_DIR, check_weights_folder, files_identity
from test_audit_single import _cache, _kit  # noqa: F401  (_cache: autouse, a fresh KIT_CACHE)


# -- kit train --out: the shipped folder -------------------------------------------------------
def test_the_shipped_weights_folder_is_refused_without_replace_shipped():
    before = files_identity(SHIPPED_DIR)
    with pytest.raises(KitError, match="shipped weights folder.*--replace-shipped"):
        check_weights_folder(SHIPPED_DIR)
    with pytest.raises(KitError, match="shipped weights folder"):  # however it is spelled
        check_weights_folder(SHIPPED_DIR / ".." / SHIPPED_DIR.name)
    assert check_weights_folder(SHIPPED_DIR, replace_shipped=True) == SHIPPED_DIR
    assert files_identity(SHIPPED_DIR) == before  # the check writes nothing there


def test_save_bundle_from_python_keeps_the_same_rules(tmp_path):
    from kit.predict.weights import save_bundle, shipped_bundle

    before = files_identity(SHIPPED_DIR)
    with pytest.raises(KitError, match="shipped weights folder"):
        save_bundle(shipped_bundle(), SHIPPED_DIR)
    with pytest.raises(KitError, match="in the kit package"):
        save_bundle(shipped_bundle(), SHIPPED_DIR.parent / "elsewhere")
    assert files_identity(SHIPPED_DIR) == before and not (SHIPPED_DIR.parent / "elsewhere").exists()
    assert (save_bundle(shipped_bundle(), tmp_path / "w") / "manifest.json").is_file()


def test_a_folder_inside_the_package_is_refused():
    with pytest.raises(KitError, match="in the kit package"):
        check_weights_folder(SHIPPED_DIR.parent / "my-weights")


def test_the_cli_refuses_the_shipped_folder_before_training(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("KIT_DATA", str(tmp_path))  # no data is read: the folder is refused first
    from kit.api import train_predictors

    with pytest.raises(KitError, match="shipped weights folder"):
        train_predictors("P4", str(SHIPPED_DIR), data_dir=str(tmp_path))
    rc, out, err = _kit(capsys, "train", "--train-gpus", "P4", "--out", str(SHIPPED_DIR),
                        "--data", str(tmp_path), "--quick")
    assert rc == 2 and "shipped weights folder" in err and "Traceback" not in err


def test_replace_shipped_is_for_the_shipped_folder_alone(tmp_path):
    with pytest.raises(KitError, match="is for the shipped weights folder"):
        check_weights_folder(tmp_path / "w", replace_shipped=True)
    with pytest.raises(KitError, match="in the kit package"):
        check_weights_folder(SHIPPED_DIR.parent.parent)  # the package itself


@pytest.mark.parametrize("flag", ["quick", "direct", "test_rows", "replace_shipped", "progress"])
def test_train_predictors_flags_must_be_booleans(tmp_path, flag):
    from kit.api import train_predictors

    with pytest.raises(KitError, match=f"{flag} must be True or False"):
        train_predictors("P4", str(tmp_path / "w"), **{flag: "False"})


def test_the_shipped_manifest_command_names_the_flag():
    m = json.loads((SHIPPED_DIR / "manifest.json").read_text())
    assert "--out kit/predict/weights" in m["command"] and "--replace-shipped" in m["command"]


# -- a learned predictor without a model of the op's class -------------------------------------
@pytest.mark.parametrize("name", ["mlp", "li"])
def test_a_predictor_without_a_model_of_the_class_says_it_took_the_roofline(name):
    r = predict_op(Dropout(100_000), "l4", name)
    assert r["latency_ms"] == pytest.approx(r["roofline_ms"])
    assert "has no model of dropout" in r["source"] and name in r["source"]
    assert "--predictor tile gives it a learned price" in r["source"]
    g = predict_op(Gemm(m=512, n=512, k=512), "l4", name)  # a class it learned: no such line
    assert "no model of" not in str(g.get("source", ""))


# -- a fill reads nothing ----------------------------------------------------------------------
def test_a_fill_moves_its_output_alone_as_kit_predict_costs_it():
    from kit.workload.mapping_elementwise import pass_share

    n = 100_000_000
    fill, copy = predict_op(Elementwise("fill", n), "l4"), predict_op(Elementwise("copy", n), "l4")
    assert fill["bytes"] == pytest.approx(copy["bytes"] / 2)
    assert fill["roofline_ms"] == pytest.approx(copy["roofline_ms"] / 2)
    raw = get_predictor("tile").predict([Elementwise("fill", n)], "l4").iloc[0]
    share = pass_share(0, 1)
    assert share == 0.5
    assert fill["latency_ms"] == pytest.approx(share * raw.latency_ms)
    assert fill["latency_p90_ms"] == pytest.approx(share * raw.latency_p90_ms)
    assert "reads nothing" in fill["fill_note"] and "fill_note" not in copy


def test_a_fill_is_checked_against_memory_by_what_it_writes():
    from kit.api import memory_problem

    gpu = get_gpu("h100-sxm")
    n = int(gpu.memory_bytes / 4 * 0.9)  # its output fits; a read and a write would not
    assert memory_problem(Elementwise("fill", n), gpu) is None
    assert "moves" in memory_problem(Elementwise("copy", n), gpu)


def test_the_fill_line_is_printed(capsys):
    rc, out, _ = _kit(capsys, "op", "elementwise", "--kind", "fill", "--numel", "1000000", "--gpu", "a10")
    assert rc == 0 and "fill      a fill reads nothing" in out


# -- GPU objects given directly ----------------------------------------------------------------
@pytest.mark.parametrize("change,word", [
    ({"mem_bw_gbs": float("nan")}, "mem_bw_gbs"), ({"sm_count": 0}, "sm_count"),
    ({"fp32_tflops": -1.0}, "fp32_tflops"), ({"mem_bw_gbs": 0.0}, "mem_bw_gbs"),
    ({"boost_clock_mhz": 0.0}, "boost_clock_mhz"),
])
def test_a_gpu_object_is_checked_as_a_catalog_entry_is(change, word):
    gpu = dataclasses.replace(get_gpu("a10"), **change)
    with pytest.raises(KitError, match=word):
        predict_op(Gemm(m=1024, n=1024, k=1024), gpu)


@pytest.mark.parametrize("change,word", [({"arch": "hoper"}, "arch 'hoper' is not one the kit knows \\(pascal"),
                                         ({"vendor": "intel"}, "vendor 'intel' is not one")])
def test_an_unknown_arch_or_vendor_is_priced_with_a_note(change, word):
    gpu = dataclasses.replace(get_gpu("h100-sxm"), key="my-gpu-" + next(iter(change.values())), **change)
    with pytest.warns(UserWarning, match=word):
        r = predict_op(Gemm(m=8192, n=8192, k=8192, dtype="bf16"), gpu)
    assert r["latency_ms"] > 0
    if "arch" in change:  # no Hopper rule for it
        assert "tensor_core" not in str(r.get("source", ""))


def test_a_normalised_gpu_object_is_checked_and_noted_once(recwarn):
    import warnings

    from kit.hardware.catalog import _checked_gpus

    _checked_gpus.clear()
    given = dataclasses.replace(get_gpu("h100-sxm"), arch="Hoper", key="my-hoper-once")
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # a repeat would show
        first = get_gpu(given)
        again = [get_gpu(given) for _ in range(5)]
    assert first.arch == "hoper" and all(g is first for g in again)
    assert sum("arch 'Hoper'" in str(w.message) for w in recwarn) == 1
    catalog = get_gpu("a10")
    assert get_gpu(catalog) is catalog  # a catalog GPU comes back as itself


def test_an_arch_in_capitals_is_the_same_arch():
    h = get_gpu("h100-sxm")
    upper = dataclasses.replace(h, arch="Hopper", key="my-h100")
    lower = dataclasses.replace(h, arch="hopper", key="my-h100")
    op = Gemm(m=8192, n=8192, k=8192, dtype="bf16")
    a, b = predict_op(op, upper), predict_op(op, lower)
    assert a["latency_ms"] == b["latency_ms"] and a.get("source") == b.get("source")
    assert "tensor_core" in a["source"]  # the Hopper curve, which "Hopper" had missed


def test_a_gpu_file_with_an_unknown_arch_says_so(tmp_path, capsys):
    from kit.hardware import unregister_gpu

    entry = get_gpu("h100-sxm").to_dict()
    entry.update(key="my-gpu", name="My GPU", aliases=[], arch="hoper")
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([entry]))
    try:
        rc, out, err = _kit(capsys, "op", "gemm", "--m", "64", "--n", "64", "--k", "64", "--gpu",
                            "my-gpu", "--gpu-file", str(path))
    finally:
        unregister_gpu("my-gpu")
    assert rc == 0 and "arch 'hoper'" in err and "hopper" in err and "Traceback" not in err
    assert err.count("arch 'hoper'") == 1, err  # noted when the file is read, not again


# -- what predictors take ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tile", "auto", "roofline", "mlp"])
def test_predictors_take_a_generator_of_ops(name):
    ops = [Gemm(m=1024, n=1024, k=1024), Elementwise("add", 10**6)]
    model = get_predictor(name)
    as_list = model.predict(ops, "a100-pcie-80gb")  # above a training GPU: read twice
    as_gen = model.predict((o for o in ops), "a100-pcie-80gb")
    assert as_gen.latency_ms.tolist() == as_list.latency_ms.tolist() and len(as_gen) == 2


@pytest.mark.parametrize("name", ["tile", "roofline"])
@pytest.mark.parametrize("alone", [Gemm(m=8, n=8, k=8), "gemm", 5])
def test_predictors_refuse_an_op_or_a_name_in_place_of_a_list(name, alone):
    with pytest.raises(KitError, match="takes a list of kit.ops ops"):
        get_predictor(name).predict(alone, "l4")


@pytest.mark.parametrize("bad", [None, "gemm", [1, 2], Gemm])
@pytest.mark.parametrize("name", ["tile", "roofline", "li"])
def test_predictors_name_what_is_not_an_op(name, bad):
    with pytest.raises(KitError, match="takes kit.ops ops"):
        get_predictor(name).predict([Gemm(m=8, n=8, k=8), bad], "l4")


# -- kit evaluate --------------------------------------------------------------------------------
def test_evaluate_reads_a_folder_with_its_subfolders(tmp_path, capsys):
    from test_predict_cli import write_csv

    (tmp_path / "sub").mkdir()
    lines = write_csv(tmp_path / "a.csv").read_text().splitlines()
    slower = [lines[0]] + [",".join([f[0], str(2 * float(f[1])), *f[2:]])
                           for f in (r.split(",") for r in lines[1:])]  # other latencies
    (tmp_path / "sub" / "b.csv").write_text("\n".join(slower) + "\n")
    from kit.predict.evaluate import load_test

    both = load_test(tmp_path)
    assert len(both) == len(load_test(tmp_path / "a.csv")) * 2
    (tmp_path / "a.csv").unlink()
    assert len(load_test(tmp_path)) == len(both) // 2  # the subfolder's file alone is read


def test_evaluate_names_weights_that_are_not_the_shipped_ones(tmp_path, capsys):
    from test_predict_cli import TINY, write_csv

    from kit.predict.training import train_bundle
    from kit.predict.weights import save_bundle
    from predict_synthetic import synthetic_frame

    b = train_bundle(synthetic_frame(("t4", "v100-pcie-32gb"), n=15), ["t4", "v100-pcie-32gb"],
                     seed=0, threads=1, settings=TINY)
    w = save_bundle(b, tmp_path / "w")
    test = write_csv(tmp_path / "t.csv")
    rc, out, err = _kit(capsys, "evaluate", "--test", str(test), "--predictors", "roofline,tile",
                        "--weights", str(w), "--json")
    assert rc == 0 and isinstance(json.loads(out), list)
    assert "predictor weights" in err and str(w) in err and "t4" in err
    rc, out, err = _kit(capsys, "evaluate", "--test", str(test), "--predictors", "roofline", "--json")
    assert rc == 0 and "predictor weights" not in err  # no learned predictor: no note
