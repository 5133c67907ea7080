"""kit replay --on: cuBLAS's int8 GEMMs (nvjet "b", CUBLAS_COMPUTE_32I) scale by the catalog's
dense INT8 tensor peaks (int8_tops); where a GPU has none, by the FP32 peaks, said in a note.

The expected peaks are typed from the datasheets, not read from the catalog: A100 INT8 Tensor
Core 624 TOPS (1,248 with sparsity), H100 SXM 3,958 with sparsity (1,979 dense), L4 485 with
sparsity (242.5 dense); V100 has no INT8 tensor figure, its FP32 is 15.7 TFLOP/s."""
import pytest

from kit.hardware import get_gpu
from kit.trace.transfer import KERNEL_FLOOR_MS
from tests.test_replay_gemm_kinds import replay_one_kernel

INT8_NVJET = "nvjet_sm90_bsb_128x128_64x4_1x2_h_bz_TNT"  # cuBLASLt's one int8 type code


def _replayed(tmp_path, src, kernel, dst, us=1000):
    r, op = replay_one_kernel(tmp_path, src, kernel, dst, us)
    return r.tg.graph.dur_ms[op], r.to_dict()["notes"]


@pytest.mark.parametrize("dst,dense_tops", [("a100-sxm4-40gb", 624.0), ("l4", 485 / 2)])
def test_an_int8_gemm_scales_by_the_int8_tensor_peaks(tmp_path, dst, dense_tops):
    # it had scaled by FP32: 66.9 / 19.5 (3.43x) to an A100, 66.9 / 30.3 (2.21x) to an L4
    ms, notes = _replayed(tmp_path, "NVIDIA H100 80GB HBM3", INT8_NVJET, dst)
    f = KERNEL_FLOOR_MS
    assert ms == pytest.approx(f + (1.0 - f) * (3958 / 2) / dense_tops, rel=1e-3)
    assert not any("int8" in n for n in notes)


def test_the_catalog_gives_dense_int8_peaks_from_the_datasheets():
    # dense = the datasheets' sparse figure halved (A100's datasheet gives both)
    for key, sparse_tops in [("a100-sxm4-40gb", 1248), ("a100-pcie-80gb", 1248), ("h100-sxm", 3958),
                             ("h200", 3958), ("h100-pcie", 3026), ("l4", 485), ("l40s", 1466)]:
        assert get_gpu(key).int8_tops == pytest.approx(sparse_tops / 2, rel=1e-3), key
    assert get_gpu("v100-sxm2-32gb").int8_tops is None  # Volta: no INT8 tensor cores


def test_an_int8_gemm_on_a_gpu_without_an_int8_peak_takes_fp32_and_says_so(tmp_path):
    ms, notes = _replayed(tmp_path, "NVIDIA H100 80GB HBM3", INT8_NVJET, "v100-sxm2-32gb")
    f = KERNEL_FLOOR_MS
    assert ms == pytest.approx(f + (1.0 - f) * 66.9 / 15.7, rel=1e-3)
    assert any("1 int8 GEMM(s) (h100-sxm to v100-sxm2-32gb) scaled by the FP32 peaks" in n
               and "v100-sxm2-32gb no INT8 tensor peak" in n for n in notes), notes


def test_a_bad_int8_peak_in_a_gpu_file_is_one_clear_error():
    from kit.errors import KitError
    from kit.hardware.gpu import gpu_from_dict

    entry = get_gpu("a100-sxm4-40gb").to_dict()
    entry["int8_tops"] = 6.24e8  # in ops/s, not TOPS
    with pytest.raises(KitError, match="int8_tops = .* TOPS is outside"):
        gpu_from_dict(entry)
    entry["int8_tops"] = "624"
    with pytest.raises(KitError, match="int8_tops must be a positive number or null"):
        gpu_from_dict(entry)
