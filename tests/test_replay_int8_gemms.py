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


# --- CUTLASS's int8 GEMM names, and the catalog's INT8 peaks against its other tensor peaks ---

# Names as CUTLASS's generator writes them (nvidia-cutlass 4.2.0.0, cutlass_library: generator.py's
# GenerateSM75 / GenerateSM80 / GenerateSM90_TensorOp_int8_WGMMA_gemm, named by gemm_operation.py's
# procedural_name: the 2.x core name is the accumulator's letter, "i" for int32 (library.py
# ShortDataTypeNames), the MMA shape and "gemm"; the operand types follow). Each int8 x int8
# product with int32 accumulation is an int8 GEMM, whatever its output type.
CUTLASS_INT8 = [
    "cutlass_tensorop_i8816gemm_s8_256x128_64x2_tn_align16",  # Turing mma m8n8k16
    "cutlass_tensorop_s8_i8816gemm_s8_256x128_64x2_tn_align16",  # int8 out
    "cutlass_tensorop_u8_i8816gemm_u8_256x128_64x2_tn_align16",
    "cutlass_tensorop_i16832gemm_s8_256x128_64x3_tn_align16",  # Ampere mma m16n8k32
    "cutlass_tensorop_s8_i16832gemm_s8_256x128_64x3_tn_align16",
    "cutlass_tensorop_i16864spgemm_s8_128x128_128x3_tn_align16",  # 2:4 sparse
    "cutlass_tensorop_s8_i16832gemm_s4_s8_128x128_64x4_tn_align32",  # int4 A widened to int8
    "void cutlass::Kernel2<cutlass_80_tensorop_i16832gemm_s8_128x256_64x3_tn_align16>(...)",
    "cutlass3x_sm90_tensorop_gemm_s8_s8_s32_s8_s8_128x128x128_1x2x1_0_tnt_align16_warpspecialized",
    "cutlass3x_sm90_tensorop_gemm_u8_u8_s32_s32_s32_128x128x128_1x2x1_0_tnn_align16",
]
# ... and their neighbours that are not int8 GEMMs: int8 weights widened for a 16-bit MMA (the
# accumulator letter "h" or "s": FP16/FP32), int4 and 1-bit MMAs
CUTLASS_NOT_INT8 = [
    ("cutlass_tensorop_h16816gemm_s8_f16_128x128_64x4_tn_align16", "fp16"),
    ("cutlass_tensorop_bf16_s16816gemm_s8_bf16_128x128_64x4_tn_align16", "bf16"),
    ("cutlass_tensorop_f16_s16816gemm_u8_f16_128x128_64x4_tn_align16", "fp16"),
    ("cutlass_tensorop_i16864gemm_s4_256x128_128x3_tn_align32", "fp16"),  # int4: as before
    ("cutlass_tensorop_i168256xorgemm_b1_256x128_512x3_tn_align128", "fp16"),  # 1-bit: as before
    ("cutlass3x_sm90_tensorop_gemm_f16_f16_f32_f16_f16_128x128x64_1x2x1_0_nnn_align8", "fp16"),
    ("cutlass_tensorop_s1688gemm_tf32_256x128_16x3_nn_align4", "tf32"),
]


@pytest.mark.parametrize("name", CUTLASS_INT8)
def test_cutlass_int8_gemms_read_as_int8(name):
    from kit.trace.transfer import gemm_dtype, is_gemm

    assert is_gemm(name) and gemm_dtype(name) == "int8"  # they had read as FP16 ("tensorop")


@pytest.mark.parametrize("name,dtype", CUTLASS_NOT_INT8)
def test_cutlass_gemms_beside_them_keep_their_dtype(name, dtype):
    from kit.trace.transfer import gemm_dtype

    assert gemm_dtype(name) == dtype


@pytest.mark.parametrize("dst,dense_tops", [("rtx-4090", 660.6), ("mi250x", 383 / 2)])
def test_a_cutlass_int8_gemm_scales_by_the_int8_peaks(tmp_path, dst, dense_tops):
    # Ada whitepaper: RTX 4090 Peak INT8 Tensor 660.6 TOPS dense; MI250X datasheet: 383 TOPS for
    # its two GCDs. By the FP16 peaks the H100's 1 ms went to 5.99 ms on the 4090 (989.4 / 165.2,
    # its FP32-accumulate rate) and 5.17 ms on an MI250X GCD (989.4 / 191.5)
    ms, notes = _replayed(tmp_path, "NVIDIA H100 80GB HBM3", CUTLASS_INT8[3], dst)
    f = KERNEL_FLOOR_MS
    assert ms == pytest.approx(f + (1.0 - f) * (3958 / 2) / dense_tops, rel=1e-3)
    assert not any("int8" in n for n in notes)


# The datasheets' INT8 tensor rate against the same GPU's other tensor rates, per architecture:
# Hopper, Ada, Blackwell and CDNA 3 run INT8 at their FP8 rate (H100, L4, L40S, B200 and MI300X
# datasheets list the two alike); Turing and Ampere tensor cores at twice FP16 with FP16
# accumulate (A100: 624 vs 312), which GeForce cards run at twice their FP32-accumulate rate (the
# catalog's fp16 there: INT8 4x it); Ada's at twice FP16 too, but the L40S datasheet's own figures
# are 362.05 FP16 and 733 INT8 (1.2% off twice); CDNA 1 and 2 run INT8 at their FP16 rate.
def _geforce(g):
    return "GeForce tensor cores run" in g.notes


def test_int8_peaks_agree_with_the_catalogs_fp8_and_fp16_peaks():
    from kit.hardware.catalog import _builtin  # the shipped catalog, not a test's own GPUs

    checked = 0
    for g in _builtin().values():
        if g.arch in ("pascal", "volta"):
            assert g.int8_tops is None, g.key  # no INT8 tensor unit
            continue
        assert g.int8_tops, f"{g.key}: {g.arch} has INT8 tensor units but no int8_tops"
        fp16_rate = 4 * g.fp16_tflops if _geforce(g) else 2 * g.fp16_tflops
        if g.arch in ("hopper", "blackwell", "cdna3") or (g.arch == "ada" and not _geforce(g)):
            assert g.int8_tops == pytest.approx(g.fp8_tflops, rel=1e-3), g.key
        if g.arch in ("turing", "ampere") or _geforce(g):
            assert g.int8_tops == pytest.approx(fp16_rate, rel=1e-3), g.key
        elif g.arch == "ada":
            assert g.int8_tops == pytest.approx(fp16_rate, rel=0.015), g.key
        elif g.arch in ("cdna", "cdna2"):
            assert g.int8_tops == pytest.approx(g.fp16_tflops, rel=1e-3), g.key
        checked += 1
    assert checked >= 26
