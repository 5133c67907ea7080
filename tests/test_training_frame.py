"""What the learned predictors train on (kit.predict.training.training_frame), on a hand-made
NeuSight layout: the training GPUs' softmax and layer-norm test rows join their training rows;
a GPU without train-collect rows of a modelled op (a held-out one) never enters, even with test
rows or large-shape training rows; a malformed extra file is an error, not a silent skip."""
import json
from pathlib import Path

import pytest

from kit import api
from kit.errors import KitError
from kit.predict.training import training_frame

HEAD = ("OPName,Latency,Device,Torch Version,CUDNN Version,Kernel Name,Warps per SM,Blocks per SM,"
        "Grid x,Grid y,Grid z,Block x,Block y,Block z,CUDA Version,B,H")
KERNEL = '"void at::native::cunn_SoftMaxForward<4, float, float, float>(float*, float const*, int)"'
LN_KERNEL = '"void at::native::vectorized_layer_norm_kernel<float, float>(int, float, float const*)"'
GEMM_HEAD = HEAD.rsplit(",", 2)[0] + ",Kernels,B,M,N,K"
CONV_HEAD = HEAD.rsplit(",", 2)[0] + ",Kernels,B,Input_Channel,Output_Channel,Kernel_Szie,Input_Size,Stride,Padding"


def row(op, latency, device, kernel, b, h):
    return f"{op},{latency},{device},p2.1.0,8902,{kernel},8,1,{b},1,1,256,1,1,cu121,{b},{h}"


def write(path: Path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def layout(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "neusight"
    collect = root / "data" / "dataset" / "train" / "collect"
    write(collect / "softmax" / "p2.1.0" / "Tesla T4.csv",
          [HEAD, row("softmax", 0.05, "Tesla T4", KERNEL, 64, 1024),
           row("softmax", 0.09, "Tesla T4", KERNEL, 128, 4096)])
    write(collect / "bmm" / "p2.1.0" / "Tesla T4.csv",
          [GEMM_HEAD, "bmm,0.0355,Tesla T4,p2.1.0,8902,volta_sgemm_64x64_nn,0.65,0.325,1,1,13,64,1,1,"
                      "cu121,;volta_sgemm_64x64_nn,13,27,15,29",
           "bmm,0.0345,Tesla T4,p2.1.0,8902,volta_sgemm_64x64_nn,1.1,0.55,1,1,22,64,1,1,"
           "cu121,;volta_sgemm_64x64_nn,22,18,10,14"])
    # NeuSight's collect has conv rows of the held-out A100 80GB: it is still not trained on
    write(collect / "conv" / "p2.1.0" / "NVIDIA A100 80GB PCIe.csv",
          [CONV_HEAD, 'conv,0.96,NVIDIA A100 80GB PCIe,p2.1.0,8902,"void implicit_convolve_sgemm<float>()",'
                      '6.1,3.05,30,11,1,8,8,1,cu121,";void implicit_convolve_sgemm<float>()",38,893,326,3,5,1,1'])
    test = root / "data" / "dataset" / "test"
    write(test / "softmax.csv",
          [HEAD, row("softmax", 0.70, "Tesla T4", KERNEL, 32768, 1600),
           row("softmax", 0.052, "Tesla T4", KERNEL, 64, 1024),  # a shape train-collect measured
           row("softmax", 0.30, "NVIDIA A100 80GB PCIe", KERNEL, 32768, 1600)])
    write(test / "ln.csv",
          [HEAD, row("ln", 0.80, "Tesla T4", LN_KERNEL, 32768, 1600),
           row("ln", 0.40, "NVIDIA L4", LN_KERNEL, 32768, 1600)])
    large = root / "data" / "dataset" / "train"  # the large-shape subsets: L4's row is not taken
    write(large / "softmax.csv", [HEAD, row("softmax", 0.40, "Tesla T4", KERNEL, 8192, 2048),
                                  row("softmax", 0.20, "NVIDIA L4", KERNEL, 8192, 2048)])
    write(test / "linear.csv",
          [GEMM_HEAD, "linear,5.0,Tesla T4,p2.1.0,8902,sgemm_128x128x8_NT_vec,8,1,40,1,1,256,1,1,"
                      "cu121,;sgemm_128x128x8_NT_vec,1,2048,2048,2048"])
    return root


def test_the_training_gpus_softmax_and_norm_test_rows_join_their_training_rows(layout):
    frame = training_frame(layout)
    assert set(frame.gpu) == {"t4"}  # no held-out GPU, whatever its test rows
    soft = frame[frame.op == "softmax"].set_index(["rows", "cols"]).latency_ms
    assert soft[(32768, 1600)] == pytest.approx(0.70)
    assert soft[(64, 1024)] == pytest.approx(0.05)  # the training row is kept, the repeat dropped
    assert soft[(8192, 2048)] == pytest.approx(0.40)
    assert len(soft) == 4
    assert (frame.op_class == "layernorm").sum() == 1
    assert (frame.op_class == "gemm").sum() == 2  # the training rows: GEMM test rows are not taken
    assert sorted(frame.split) == ["test"] * 2 + ["train"] * 5


def test_without_test_rows_only_the_training_parts(layout):
    frame = training_frame(layout, test_rows=False)
    assert set(frame.gpu) == {"t4"}
    assert sorted(frame[frame.op == "softmax"].cols) == [1024, 2048, 4096]
    assert (frame.split == "train").all()


def test_a_gpu_without_training_rows_is_refused_even_with_test_rows(layout):
    with pytest.raises(KitError, match="no training rows for GPU"):
        training_frame(layout, ["a100-pcie-80gb"])
    with pytest.raises(KitError, match="no training rows for GPU"):
        training_frame(layout, ["l4"])


def test_a_malformed_test_file_is_an_error_and_a_missing_one_is_skipped(layout):
    soft = layout / "data" / "dataset" / "test" / "softmax.csv"
    text = soft.read_text()
    soft.write_text(text.replace("0.7,Tesla T4", "fast,Tesla T4"))  # a latency that is no number
    with pytest.raises(KitError, match="softmax.csv"):
        training_frame(layout)
    assert len(training_frame(layout, test_rows=False)) == 5  # not read without test rows
    soft.unlink()
    soft.mkdir()  # a folder in the file's place is no missing file
    with pytest.raises(KitError, match="softmax.csv is a folder"):
        training_frame(layout)
    soft.rmdir()
    (layout / "data" / "dataset" / "test" / "ln.csv").unlink()
    assert (training_frame(layout).split == "train").all()


def test_the_manifest_counts_the_test_rows_trained_on(layout, tmp_path):
    # the layout's softmax rows: 2 collect + 1 large-shape, + 1 test row (and 1 layer-norm one)
    for test_rows, n, softmax in ((True, 2, 4), (False, 0, 3)):
        out = tmp_path / f"w{n}"
        r = api.train_predictors("T4", str(out), data_dir=str(layout), quick=True, direct=False,
                                 test_rows=test_rows)
        m = json.loads((out / "manifest.json").read_text())
        assert m["test_rows_trained_on"] == n and r["rows"]["softmax"] == softmax
        assert ("2 softmax and layer-norm rows of part test" in m["data_source"]) == test_rows


# -- where the weights go: kit train --out ---------------------------------------------------
def _train(layout, out, gpus="T4"):
    return api.train_predictors(gpus, str(out), data_dir=str(layout), quick=True, direct=False)


@pytest.mark.parametrize("name, content", [("manifest.json", '{"name": "my-web-app"}'),
                                           ("model.safetensors", "not weights"),
                                           ("notes.txt", "my notes")])
def test_a_folder_holding_someone_elses_files_is_not_written_over(layout, tmp_path, name, content):
    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_text(content)
    with pytest.raises(KitError, match="not written over|holds other files"):
        _train(layout, out)
    assert [p.name for p in out.iterdir()] == [name] and (out / name).read_text() == content


def test_the_data_folder_is_no_weights_folder(layout):
    with pytest.raises(KitError, match="holds other files"):
        _train(layout, layout)


def test_kit_weights_are_replaced_and_a_failed_training_leaves_no_folder(layout, tmp_path):
    out = tmp_path / "w"
    _train(layout, out)
    first = json.loads((out / "manifest.json").read_text())
    _train(layout, out)  # how the shipped weights are reproduced: the same folder again
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.safetensors"]
    assert json.loads((out / "manifest.json").read_text())["rows"] == first["rows"]
    deep = tmp_path / "new" / "deep" / "w"
    with pytest.raises(KitError, match="no training rows for GPU"):
        _train(layout, deep, gpus="L4")
    assert not (tmp_path / "new").exists()


def test_a_target_that_cannot_be_written_is_found_before_training(layout, tmp_path, monkeypatch):
    out = tmp_path / "w"
    (out / "manifest.json").mkdir(parents=True)
    monkeypatch.setattr("kit.predict.training.train_bundle",
                        lambda *a, **k: pytest.fail("trained before checking --out"))
    with pytest.raises(KitError, match="manifest.json is a folder"):
        _train(layout, out)


def test_a_failed_write_keeps_the_old_weights_whole(layout, tmp_path, monkeypatch):
    out = tmp_path / "w"
    _train(layout, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    # the files are written into a sibling folder that takes out's place only once both are on
    # disk (save_bundle); a disk that fills while they are flushed must leave the old pair whole
    def refuse(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("os.fsync", refuse)
    with pytest.raises(KitError, match="cannot write the weights into .*No space left"):
        _train(layout, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no partial files either
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []  # nor a temporary


# -- kit evaluate on such weights ---------------------------------------------------------------
ADDU = ('addu,0.0245,Tesla T4,p2.1.0,8902,"void at::native::vectorized_elementwise_kernel<4>(int)",'
        '1.55,0.38,42,1,1,128,1,1,cu121,127,168')


def test_evaluate_marks_classes_the_weights_lack_and_rows_they_trained_on(layout, tmp_path, recwarn):
    out = tmp_path / "w"
    api.train_predictors("T4", str(out), data_dir=str(layout), quick=True, direct=False)
    elem = tmp_path / "elem.csv"
    write(elem, [HEAD, ADDU])  # no elementwise rows were trained on
    rows = api.evaluate_predictors(str(elem), None, weights=str(out))  # default list: mlp left out
    assert {r["predictor"] for r in rows} == {"roofline", "habitat", "li", "tile"}
    by = {r["predictor"]: r for r in rows}
    wave = api.evaluate_predictors(str(elem), "wave")[0]
    assert by["tile"]["fallback"] == "wave" and by["tile"]["mape"] == wave["mape"]
    assert by["li"]["fallback"] == "roofline" and by["li"]["mape"] == by["roofline"]["mape"]
    assert "fallback" not in by["roofline"]
    notes = [str(w.message) for w in recwarn]
    assert any("no direct MLP" in n for n in notes)
    assert any("no tile model for elementwise" in n for n in notes)
    assert not any("in-sample" in n for n in notes)
    with pytest.raises(KitError, match="no direct MLP"):  # asked for by name: an error
        api.evaluate_predictors(str(elem), "mlp", weights=str(out))
    recwarn.clear()
    rows = api.evaluate_predictors(str(layout / "data" / "dataset" / "test" / "softmax.csv"),
                                   "tile", weights=str(out))
    assert all("fallback" not in r for r in rows)
    assert any("2 softmax and layer-norm rows of NeuSight's test files, of t4" in str(w.message)
               and "in-sample" in str(w.message) for w in recwarn)


def test_threads_default_to_two_or_the_cores_and_never_exceed_them(layout, tmp_path, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 1)  # a one-core Binder
    out = tmp_path / "w"
    api.train_predictors("T4", str(out), data_dir=str(layout), quick=True, direct=False)
    assert json.loads((out / "manifest.json").read_text())["threads"] == 1
    with pytest.raises(KitError, match="threads 2 is more than this machine's 1 cores"):
        api.train_predictors("T4", str(out), data_dir=str(layout), quick=True, threads=2)


# -- one's own measurements: kit train --extra ----------------------------------------------------
def _own_csv(path: Path, rows):
    """A kit-format (collector) CSV of softmax rows: (gpu, dtype, rows, cols, latency_ms)."""
    from kit.data.records import HEADER

    lines = [",".join(HEADER)]
    for gpu, dtype, r, c, lat in rows:
        row = {"op": "softmax", "op_class": "softmax", "gpu": gpu, "device_name": gpu, "dtype": dtype,
               "rows": r, "cols": c, "latency_ms": lat, "source": "collector", "split": "train"}
        lines.append(",".join(str(row.get(k, "")) for k in HEADER))
    write(path, lines)
    return path


def test_own_fp32_rows_join_and_others_are_left_out_with_the_count(layout, tmp_path):
    own = _own_csv(tmp_path / "own" / "h100.csv",
                   [("h100-sxm", "fp32", 512, 1024, 0.02), ("h100-sxm", "fp32", 4096, 4096, 0.11),
                    ("h100-sxm", "bf16", 4096, 4096, 0.06)])
    # a folder's other CSVs (nvidia-smi samples) are skipped, a file named outright is not
    write(tmp_path / "own" / "provenance" / "smi.csv", ["timestamp,clocks.sm", "1,1980"])
    frame = training_frame(layout, ["t4", "h100-sxm"], extra=[tmp_path / "own"])
    with pytest.raises(KitError, match="not a measurement CSV"):
        training_frame(layout, ["t4", "h100-sxm"], extra=[tmp_path / "own" / "provenance" / "smi.csv"])
    h100 = frame[frame.gpu == "h100-sxm"]
    assert sorted(h100.latency_ms) == [0.02, 0.11] and set(h100.dtype) == {"fp32"}
    assert len(frame[frame.gpu == "t4"]) == len(training_frame(layout, ["t4"]))
    out = tmp_path / "w"
    api.train_predictors("T4,H100-SXM", str(out), data_dir=str(layout), quick=True, direct=False,
                         extra=[str(own)])
    m = json.loads((out / "manifest.json").read_text())
    (rec,) = m["extra_data"]
    assert rec["rows"] == 2 and rec["left_out"]["not fp32"] == 1 and len(rec["sha256"]) == 64
    assert rec["rows_trained_on"] == 2 and rec["left_out"]["shape already measured"] == 0
    assert "h100-sxm" in m["train_gpus"] and "2 FP32 rows of the user's own" in m["data_source"]


def test_own_rows_of_a_shape_already_measured_are_not_counted_as_trained_on(layout, tmp_path):
    # a shape NeuSight (or the file itself) already holds keeps one row; the manifest had counted
    # every own row as trained on
    own = _own_csv(tmp_path / "h100.csv", [("h100-sxm", "fp32", 512, 1024, 0.02),
                                          ("h100-sxm", "fp32", 512, 1024, 0.03),
                                          ("h100-sxm", "fp32", 4096, 4096, 0.11)])
    frame = training_frame(layout, ["t4", "h100-sxm"], extra=[own])
    assert frame.attrs["extra_rows_kept"] == {str(own): 2} and "_extra_file" not in frame
    t4 = training_frame(layout, ["t4"])
    shape = t4[t4.op_class == "softmax"].iloc[0]
    again = _own_csv(tmp_path / "t4.csv", [("t4", "fp32", int(shape["rows"]), int(shape["cols"]), 9.0)])
    frame = training_frame(layout, ["t4"], extra=[again])
    assert frame.attrs["extra_rows_kept"] == {} and 9.0 not in set(frame.latency_ms)


def test_own_rows_of_a_gpu_the_catalog_lacks_are_counted_as_such(layout, tmp_path):
    from kit.predict.own_measurements import own_rows
    from kit.predict.training import MODELLED

    own = _own_csv(tmp_path / "mine.csv", [("mygpu", "fp32", 512, 1024, 0.02), ("t4", "fp32", 512, 1024, 0.03)])
    _, (rec,) = own_rows([own], MODELLED)  # "add it to train on them" had said one thing, --train-gpus another
    assert rec["rows"] == 1 and rec["left_out"]["not on a catalog GPU"] == 1


def test_own_rows_of_a_gpu_not_trained_on_or_none_usable_are_refused(layout, tmp_path):
    own = _own_csv(tmp_path / "h100.csv", [("h100-sxm", "fp32", 512, 1024, 0.02)])
    with pytest.raises(KitError, match="h100-sxm, which --train-gpus does not name"):
        training_frame(layout, ["t4"], extra=[own])
    half = _own_csv(tmp_path / "bf16.csv", [("h100-sxm", "bf16", 512, 1024, 0.02)])
    with pytest.raises(KitError, match="FP32"):
        training_frame(layout, ["t4", "h100-sxm"], extra=[half])
    (tmp_path / "empty").mkdir()
    with pytest.raises(KitError, match="no measurement CSVs"):
        training_frame(layout, ["t4"], extra=[tmp_path / "empty"])
    with pytest.raises(KitError, match="not found"):
        training_frame(layout, ["t4"], extra=[tmp_path / "nowhere.csv"])


def test_kit_train_names_its_extra_data_in_the_command(layout, tmp_path, capsys):
    from kit.cli import main

    own = _own_csv(tmp_path / "h100.csv", [("h100-sxm", "fp32", 512, 1024, 0.02)])
    out = tmp_path / "w"
    assert main(["train", "--data", str(layout), "--train-gpus", "T4,H100-SXM", "--out", str(out),
                 "--quick", "--no-direct", "--extra", str(own), "--json"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert f"--extra {own}" in m["command"]


def test_own_linear_rows_timed_without_a_bias_are_left_out(layout, tmp_path):
    """NeuSight's Linear rows have a bias; a `kit collect --no-bias` file's (its meta says so)
    would teach the model another op under the same name."""
    from kit.data.records import HEADER

    def linear_csv(path, bias):
        row = {"op": "linear", "op_class": "gemm", "gpu": "h100-sxm", "device_name": "h100-sxm",
               "dtype": "fp32", "b": 1, "m": 512, "n": 1024, "k": 1024, "latency_ms": 0.05,
               "source": "collector", "split": "train"}
        write(path, [",".join(HEADER), ",".join(str(row.get(k, "")) for k in HEADER)])
        meta = {"csv": path.name, "runs": [{"settings": {"device": "cuda", "linear_bias": bias}}]}
        path.with_name(path.name[:-4] + ".meta.json").write_text(json.dumps(meta))
        return path

    with_bias, without = linear_csv(tmp_path / "a.csv", True), linear_csv(tmp_path / "b.csv", False)
    frame = training_frame(layout, ["t4", "h100-sxm"], extra=[with_bias])
    assert (frame.gpu == "h100-sxm").sum() == 1
    with pytest.raises(KitError, match="FP32"):  # nothing usable left
        training_frame(layout, ["t4", "h100-sxm"], extra=[without])
