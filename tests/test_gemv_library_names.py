"""A GEMV's text names the vendor's BLAS library: rocBLAS on AMD GPUs (PyTorch on ROCm runs
its gemv kernels), cuBLAS on NVIDIA's; an MI300X's had read "cuBLAS's gemv kernel"."""
import pytest

from kit.hardware import get_gpu, list_gpus

GEMV = dict(m=1, n=4096, k=4096)  # fp32: the GEMV rule's stream, not its two-row twin


def _op_text(gpu):
    from kit.api import predict_op
    from kit.cli.cmd_op import text
    from kit.ops import Gemm

    return text(predict_op(Gemm(**GEMV, dtype="fp32"), gpu))


@pytest.mark.parametrize("gpu", ["mi300x", "mi210", "h100-sxm", "a100-sxm4-80gb"])
def test_kit_op_names_the_vendors_library_for_a_gemv(gpu):
    text = _op_text(gpu)
    assert "gemv kernels" in text  # the line this is about is there
    vendor = get_gpu(gpu).vendor
    assert ("rocBLAS" in text and "cuBLAS" not in text) if vendor == "amd" else \
        ("cuBLAS" in text and "rocBLAS" not in text)


@pytest.mark.parametrize("gpu", ["mi300x", "h100-sxm"])
def test_the_gemm_panel_names_the_vendors_library_for_a_gemv(gpu):
    from widgets.gemm import GemmPanel

    summary = GemmPanel(**GEMV, gpu=gpu, compare=()).summary_text()
    assert "gemv kernel" in summary
    wrong = "cuBLAS" if get_gpu(gpu).vendor == "amd" else "rocBLAS"
    assert wrong not in summary and ("rocBLAS" if wrong == "cuBLAS" else "cuBLAS") in summary


def test_every_catalog_vendor_has_its_library():
    from kit.predict.gemv import blas_library

    assert {blas_library(g) for g in list_gpus()} == {"cuBLAS", "rocBLAS"}
