"""Weights on disk: a round trip gives the same predictions; anything else is refused clearly."""
import json

import numpy as np
import pytest

from kit.errors import KitError
from kit.ops import Elementwise, Gemm, Softmax
from kit.predict.training import train_bundle
from kit.predict.weights import (MANIFEST_FILE, SHIPPED_DIR, TENSORS_FILE, has_shipped,
                                 load_bundle, read_manifest, save_bundle)
from predict_synthetic import synthetic_frame

TINY = {"members": 1, "epochs": 1, "hidden": 8, "chooser_epochs": 1, "min_steps": 10}
OPS = [Gemm(m=256, n=512, k=128, b=2), Elementwise("relu", 4096), Softmax(128, 4096)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    bundle = train_bundle(synthetic_frame(("t4", "p4"), n=15), ["t4", "p4"], seed=0, threads=1,
                          settings=TINY, info={"command": "test", "data_source": "synthetic"})
    out = tmp_path_factory.mktemp("w")
    save_bundle(bundle, out)
    return bundle, out


def test_round_trip_predicts_the_same(saved):
    bundle, out = saved
    loaded = load_bundle(out)
    for a, b in [(bundle.tile, loaded.tile), (bundle.li, loaded.li), (bundle.mlp, loaded.mlp)]:
        pa, pb = a.predict(OPS, "l4"), b.predict(OPS, "l4")
        # the loaded networks run in numpy (float32), the trained ones in torch: equal to rounding
        np.testing.assert_allclose(pb.latency_ms.to_numpy(), pa.latency_ms.to_numpy(), rtol=1e-6)
        assert list(pa.tile) == list(pb.tile)
    m = read_manifest(out)
    assert m["train_gpus"] == ["p4", "t4"] and m["seed"] == 0 and m["command"] == "test"


def test_refuses_a_folder_without_manifest(tmp_path):
    with pytest.raises(KitError, match="no manifest.json"):
        load_bundle(tmp_path)


def test_refuses_a_foreign_manifest(saved, tmp_path):
    _, out = saved
    (tmp_path / TENSORS_FILE).write_bytes((out / TENSORS_FILE).read_bytes())
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"format": "something-else", "parts": {}}))
    with pytest.raises(KitError, match="not a gpu-perf-kit predictor manifest"):
        load_bundle(tmp_path)
    (tmp_path / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(KitError, match="not valid JSON"):
        load_bundle(tmp_path)


def test_refuses_a_file_that_is_not_safetensors(saved, tmp_path):
    import pickle

    _, out = saved
    (tmp_path / MANIFEST_FILE).write_text((out / MANIFEST_FILE).read_text())
    (tmp_path / TENSORS_FILE).write_bytes(pickle.dumps({"evil": object.__name__}))
    with pytest.raises(KitError, match="not a safetensors weights file"):
        load_bundle(tmp_path)


def test_refuses_tensors_that_do_not_fit_the_manifest(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    _, out = saved
    (tmp_path / MANIFEST_FILE).write_text((out / MANIFEST_FILE).read_text())
    tensors = load_file(str(out / TENSORS_FILE))
    dropped = {k: v for k, v in tensors.items() if not k.startswith("tile.gemm.")}
    save_file(dropped, str(tmp_path / TENSORS_FILE))
    # the manifest records the file's sha256 (tests/test_audit_data_fixes.py): that refuses first
    with pytest.raises(KitError, match="sha256 .* is not the .* manifest.json records"):
        load_bundle(tmp_path)
    # a manifest written before the hash was recorded: the tensors' shapes are still checked
    m = json.loads((out / MANIFEST_FILE).read_text())
    del m["sha256"]
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(m))
    with pytest.raises(KitError, match="do not match their manifest"):
        load_bundle(tmp_path)


@pytest.mark.skipif(not has_shipped(), reason="no shipped weights in this checkout")
def test_shipped_weights_are_small_and_say_what_they_were_trained_on():
    size = sum(p.stat().st_size for p in SHIPPED_DIR.iterdir())
    assert size < 2 * 2**20
    m = read_manifest(SHIPPED_DIR)
    assert set(m["train_gpus"]) == {"p4", "p100-pcie-16gb", "t4", "v100-pcie-32gb",
                                    "a100-pcie-40gb"}
    assert "kit train" in m["command"] and "seed" in m and m["data_source"]
    from kit.predict import get_predictor

    out = get_predictor("auto").predict(OPS, "a100-pcie-80gb")
    assert (out.latency_ms >= out.roofline_ms).all()


@pytest.mark.parametrize("edit, match", [
    (lambda m: m["parts"]["tile"].__setitem__("transfer_sigma", "wide"), "transfer_sigma must map"),
    (lambda m: m["parts"]["tile"]["transfer_sigma"].__setitem__("gemm", float("nan")),
     "transfer_sigma must map"),
    (lambda m: m["parts"]["tile"]["transfer_sigma"].__setitem__("gemm", -0.1), "transfer_sigma must map"),
    (lambda m: m.__setitem__("train_gpus", "t4"), "train_gpus must be a list of GPU names"),
])
def test_refuses_a_manifest_with_a_bad_band_or_gpu_list(saved, tmp_path, edit, match):
    _, out = saved
    m = json.loads((out / MANIFEST_FILE).read_text())
    m["parts"]["tile"].setdefault("transfer_sigma", {"gemm": 0.2})
    edit(m)
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(m))
    (tmp_path / TENSORS_FILE).write_bytes((out / TENSORS_FILE).read_bytes())
    with pytest.raises(KitError, match=match):
        load_bundle(tmp_path)


@pytest.mark.parametrize("edit, match", [
    (lambda m: m.pop("gpu_features"), "record no gpu_features.*log_w_per_tflops"),
    (lambda m: m.__setitem__("gpu_features", [f.replace("log_power_share", "log_w_per_tflops")
                                              for f in m["gpu_features"]]),
     "other GPU features.*log_w_per_tflops, log_power_share"),
    (lambda m: m.__setitem__("gpu_features", m["gpu_features"][::-1]), "their order differs"),
])
def test_refuses_weights_trained_on_other_gpu_features(saved, tmp_path, edit, match):
    """The same number of inputs in another meaning would be read without a word."""
    _, out = saved
    m = json.loads((out / MANIFEST_FILE).read_text())
    from kit.predict.features import GPU_FEATURES

    assert m["gpu_features"] == GPU_FEATURES  # what train_bundle records
    edit(m)
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(m))
    (tmp_path / TENSORS_FILE).write_bytes((out / TENSORS_FILE).read_bytes())
    with pytest.raises(KitError, match=match):
        load_bundle(tmp_path)


def test_refuses_weights_that_saw_the_power_share_at_another_rate(saved, tmp_path):
    from kit.predict.features import SUSTAINED_TFLOPS_PER_W

    _, out = saved
    m = json.loads((out / MANIFEST_FILE).read_text())
    assert m["sustained_tflops_per_w"] == SUSTAINED_TFLOPS_PER_W
    for rate in (0.065, None):
        if rate is None:
            m.pop("sustained_tflops_per_w")
        else:
            m["sustained_tflops_per_w"] = rate
        (tmp_path / MANIFEST_FILE).write_text(json.dumps(m))
        (tmp_path / TENSORS_FILE).write_bytes((out / TENSORS_FILE).read_bytes())
        want = (f"record no sustained_tflops_per_w.*{SUSTAINED_TFLOPS_PER_W}" if rate is None else
                f"power share at {rate}.*computes it at {SUSTAINED_TFLOPS_PER_W}")
        with pytest.raises(KitError, match=want):
            load_bundle(tmp_path)
