"""Catalog lookup, close matches, and user-added GPUs."""
import json

import pytest

from kit.errors import KitError
from kit.hardware import get_gpu, list_gpus, load_gpu_file, register_gpu, unregister_gpu


def _entry(**over):
    base = get_gpu("a100-pcie-40gb").to_dict()
    base.update(key="my-gpu", name="My GPU", aliases=["My Accelerator 9000"])
    base.update(over)
    return base


def test_lookup_ignores_case_and_punctuation():
    assert get_gpu("NVIDIA H100 80GB HBM3").key == "h100-sxm"
    assert get_gpu("tesla v100-pcie-32gb").key == "v100-pcie-32gb"
    assert get_gpu("NVIDIA_A100_80GB_PCIe").key == "a100-pcie-80gb"


def test_unknown_gpu_names_close_matches():
    with pytest.raises(KitError) as e:
        get_gpu("a100-pcie-40")
    msg = str(e.value)
    assert "a100-pcie-40" in msg and "a100-pcie-40gb" in msg


def test_register_from_dict_and_file(tmp_path):
    try:
        gpu = register_gpu(_entry())
        assert get_gpu("my accelerator 9000") is gpu
        path = tmp_path / "gpus.json"
        path.write_text(json.dumps({"gpus": [_entry(key="other-gpu", name="Other", aliases=[])]}))
        (other,) = load_gpu_file(path)
        assert other.key in {g.key for g in list_gpus()}
    finally:
        unregister_gpu("my-gpu")
        unregister_gpu("other-gpu")
    with pytest.raises(KitError):
        get_gpu("my-gpu")


def test_a_name_or_alias_of_another_gpu_is_refused():
    builtin = get_gpu("h100-sxm")
    for clash in ({"aliases": ["H100"]}, {"name": builtin.name}, {"aliases": ["a100_pcie_40gb"]}):
        with pytest.raises(KitError, match="already names '(h100-sxm|a100-pcie-40gb)'"):
            register_gpu(_entry(**clash))
        with pytest.raises(KitError):
            get_gpu("my-gpu")  # nothing was registered
    try:  # a built-in key replaces that GPU, its own name and aliases included
        fixed = register_gpu({**builtin.to_dict(), "mem_bw_gbs": 3000.0})
        assert get_gpu("H100").mem_bw_gbs == 3000.0 and get_gpu("h100-sxm") is fixed
        again = register_gpu(_entry())
        assert register_gpu(_entry()).key == again.key  # registering the same GPU twice is fine
    finally:
        unregister_gpu("h100-sxm")
        unregister_gpu("my-gpu")
    assert get_gpu("h100-sxm").mem_bw_gbs == builtin.mem_bw_gbs


def test_a_key_that_names_another_gpu_is_refused(tmp_path):
    # 'a100' is an alias of a100-sxm4-40gb and 't-4' reads as t4's key: get_gpu of such a key had
    # given the other GPU, so the user's own GPU could not be looked up by its key at all
    for key, other in (("a100", "a100-sxm4-40gb"), ("t-4", "t4"), ("h100sxm", "h100-sxm")):
        with pytest.raises(KitError, match=f"key '{key}' already names '{other}'"):
            register_gpu(_entry(key=key, aliases=[]))
        with pytest.raises(KitError, match="unknown GPU"):
            get_gpu("my accelerator 9000")  # nothing was registered under that name
    try:  # nor by a file, and a clash with an earlier entry of the same file registers neither
        path = tmp_path / "gpus.json"
        path.write_text(json.dumps([_entry(key="gpu-a", name="GPU A", aliases=["Shared"]),
                                    _entry(key="shared", name="GPU B", aliases=[])]))
        with pytest.raises(KitError, match="key 'shared' already names 'gpu-a'"):
            load_gpu_file(path)
        with pytest.raises(KitError):
            get_gpu("gpu-a")
        ok = register_gpu(_entry(key="my-a100", aliases=[]))
        assert get_gpu("my-a100") is ok and get_gpu("a100").key == "a100-sxm4-40gb"
    finally:
        unregister_gpu("gpu-a")
        unregister_gpu("my-a100")


@pytest.mark.parametrize("bad, word", [
    ({"sm_count": -4}, "sm_count"),
    ({"mem_bw_gbs": "fast"}, "mem_bw_gbs"),
    ({"fp8_tflops": 0}, "fp8_tflops"),
    ({"key": "My GPU"}, "lower-case"),
    ({"warp_size": 32}, "warp_size"),
    # unit slips: a clock in GHz, bandwidth in B/s, a peak in FLOP/s, absurd sizes
    ({"boost_clock_mhz": 1.41}, "boost_clock_mhz = 1.41 is outside.*check its unit"),
    ({"mem_bw_gbs": 1.555e12}, "mem_bw_gbs .* outside"),
    ({"fp32_tflops": 19.5e12}, "fp32_tflops .* outside"),
    ({"sm_count": 10**30}, "sm_count .* outside"),
    ({"max_threads_per_sm": 16}, "max_threads_per_sm .* outside"),
    ({"max_threads_per_sm": 2000}, "multiple of the 32-thread warp"),
    # notes as lines (a list) had made the GPU unhashable: a TypeError in kit op / kit predict
    ({"notes": ["GA100", "PCIe"]}, "notes must be a string"),
    ({"notes": 5}, "notes must be a string"),
    # 0 is a GPU without NVLink: the error had said "must be positive", as if 0 were refused
    ({"interconnect_bw_gbs": -600}, r"interconnect_bw_gbs must be 0 \(none\) or more"),
])
def test_invalid_user_gpu_is_a_clear_error(bad, word):
    with pytest.raises(KitError, match=word):
        register_gpu(_entry(**bad))


@pytest.mark.parametrize("bad", [0, -1.0, "fast", True, 10.0])
def test_invalid_fp32_matrix_peak_is_a_clear_error(bad):
    # 10.0 lies below the A100 base entry's 19.5 vector peak: no library would pick a slower unit
    with pytest.raises(KitError, match="fp32_matrix_tflops"):
        register_gpu(_entry(fp32_matrix_tflops=bad))


def test_fp32_matrix_peak_is_optional_for_a_user_gpu():
    try:
        entry = _entry()
        del entry["fp32_matrix_tflops"]
        plain = register_gpu(entry)
        assert plain.fp32_matrix_tflops is None and plain.gemm_peak_tflops("fp32") == 19.5
        matrix = register_gpu(_entry(key="my-gpu-2", name="My GPU 2", aliases=[],
                                     fp32_matrix_tflops=39))
        assert matrix.gemm_peak_tflops("fp32") == 39.0 and matrix.gemm_peak_flops_per_s("fp32") == 39e12
        assert matrix.peak_tflops("fp32") == 19.5  # the vector peak is untouched
        assert matrix.gemm_peak_tflops("fp16") == 312.0
    finally:
        unregister_gpu("my-gpu")
        unregister_gpu("my-gpu-2")


def test_missing_field_and_bad_file(tmp_path):
    entry = _entry()
    del entry["tdp_w"]
    with pytest.raises(KitError, match="tdp_w"):
        register_gpu(entry)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(KitError, match="not valid JSON"):
        load_gpu_file(bad)
    with pytest.raises(KitError, match="not found"):
        load_gpu_file(tmp_path / "missing.json")


def test_null_notes_are_no_notes_and_a_gpu_with_them_predicts():
    from kit.api import predict_op
    from kit.ops import Gemm

    try:
        gpu = register_gpu(_entry(notes=None))
        assert gpu.notes == "" and hash(gpu)
        assert predict_op(Gemm(256, 256, 256), "my-gpu", "roofline")["latency_ms"] > 0
    finally:
        unregister_gpu("my-gpu")
