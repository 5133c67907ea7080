"""kit replay --on: which kernels scale as GEMMs (by the matrix peak of their dtype) and which as
memory-bound ones, from kernel names found in the shared traces; FP8 GEMMs by the FP8 peaks."""
import json
import re
from pathlib import Path

import pytest

from kit.hardware import get_gpu
from kit.trace import replay
from kit.trace.transfer import KERNEL_FLOOR_MS, gemm_dtype, gemm_peak_tflops, is_gemm
from tests.test_replay_mismatched_inputs import sgemm_rank

# kernels of the shared traces (HTA, PARAM) that are no GEMMs, though a GEMM's words are in them
NOT_GEMMS = [
    # cuBLAS's helpers: "cublas..." is only in their template arguments
    "void gemvNSP_kernel<float, float, float, float, 1, 16, 4, 1024, false, cublasGemvParams<"
    "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
    "cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParams<cublasGemvTensorStridedBatched"
    "<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float>)",
    "void dot_kernel<float, 128, 0, cublasDotParams<cublasGemvTensorStridedBatched<float const>, "
    "cublasGemvTensorStridedBatched<float> > >(cublasDotParams<cublasGemvTensorStridedBatched<float "
    "const>, cublasGemvTensorStridedBatched<float> >)",
    "void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>("
    "cublasSplitKParams<float>, float const*, float const*, float*, float const*, float const*, "
    "float const*, float const*, float*, void*, long, float*, int*)",
    "void epilogue::impl::globalKernel<float, float, float, true, true>(int, int, long, float*, "
    "cublasLtEpilogue_t, int, float*, long, void*, long, long, long, float*, long, int*)",
    # Winograd's transforms (the sgemm between them is the GEMM), as their forward twins
    "void cudnn::winograd_nonfused::winogradWgradData4x4<float, float>(cudnn::winograd_nonfused::"
    "WinogradDataParams<float, float>)",
    "void cudnn::winograd_nonfused::winogradWgradDelta4x4<float, float>(cudnn::winograd_nonfused::"
    "WinogradDeltaParams<float, float>)",
    "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::"
    "WinogradDataParams<float, float>)",
    "cask_cudnn::computeWgradBOffsetsKernel(cask_cudnn::ComputeWgradBOffsetsParams)",
    "void fbgemm_gpu::split_embedding_codegen_forward_unweighted_kernel<float, float>",
]
# (kernel, dtype) GEMMs and convolutions of the shared traces, and FP8 ones cuBLASLt and CUTLASS name
GEMMS = [
    ("cudnn_volta_scudnn_128x64_relu_xregs_large_nn_v1", "fp32"),  # cuDNN implicit-GEMM convolution
    ("cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1", "fp32"),
    ("cudnn_volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", "fp32"),
    ("volta_sgemm_128x64_nn", "fp32"),
    ("void cudnn::detail::dgrad_engine<float, 128, 6, 7, 3, 3, 5, false>(int, int, int, float const*)", "fp32"),
    # an FP32 aten::mm on tensor cores: TF32 (2048x2048x256 in 45 us, 47.7 TFLOP/s > 19.5 FP32)
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>", "tf32"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16", "tf32"),
    ("void cutlass::Kernel<cutlass_70_wmma_tensorop_f16_s161616gemm_f16_32x32_64x2_tn_align8>", "fp16"),
    ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn", "fp16"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn", "bf16"),
    ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
     "segment_k_off_kernel__5x_cublas", "fp8"),
    # the output's type (bf16) is in the name too
    ("void cutlass::device_kernel<cutlass3x_sm90_tensorop_gemm_e4m3_e4m3_f32_bf16_bf16_128x128x128_"
     "1x1x1_0_tnn_align16_warpspecialized_cooperative_fp8_fastaccum_epi_tma>", "fp8"),
]


@pytest.mark.parametrize("name", NOT_GEMMS)
def test_helpers_and_transforms_are_not_gemms(name):
    assert not is_gemm(name)


@pytest.mark.parametrize("name,dtype", GEMMS)
def test_gemms_and_their_dtype(name, dtype):
    assert is_gemm(name) and gemm_dtype(name) == dtype


def replay_one_kernel(tmp_path, src, kernel, dst, us):
    """(the replay on dst, its one kernel's op) of a step whose one kernel ran us on src."""
    doc = sgemm_rank(gpu=src)
    doc["traceEvents"][2]["name"] = kernel
    doc["traceEvents"][2]["dur"] = us
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    r = replay(p, on=dst)
    (op,) = [op for op, *_ in r.tg.gpu_ops[0]]
    return r, op


def _scaled_us(tmp_path, src, kernel, dst, us):
    """The target's time of one kernel that ran us on src."""
    r, op = replay_one_kernel(tmp_path, src, kernel, dst, us)
    return r.tg.graph.dur_ms[op] * 1e3


def _scaled_ms(tmp_path, src, kernel, dst):
    return _scaled_us(tmp_path, src, kernel, dst, 1000) / 1e3  # the kernel ran 1 ms on src


def floored(ratio, measured_ms=1.0):
    """A kernel of measured_ms on the target: its first 2 us kept, the rest times ratio."""
    f = min(measured_ms, KERNEL_FLOOR_MS)
    return f + (measured_ms - f) * ratio


FP8 = GEMMS[-2][0]


@pytest.mark.parametrize("dst,want_dtype", [
    ("h200", "fp8"), ("mi300x", "fp8"), ("l4", "fp8"),
    ("a100-sxm4-40gb", "fp16"),  # no FP8 tensor cores: the FP16 path
    ("v100-sxm2-32gb", "fp16"),
    ("p4", "fp32"),  # no FP16 peak either
])
def test_an_fp8_gemm_scales_by_fp8_peaks(tmp_path, dst, want_dtype):
    # it had scaled by the FP32 peaks: 66.9 -> 19.5 TFLOP/s, 3.4x slower on an A100, where its
    # FP16 path runs 6.3x slower than the H100's FP8 (1978.9 -> 312)
    h, d = get_gpu("h100-sxm"), get_gpu(dst)
    got = _scaled_ms(tmp_path, "NVIDIA H100 80GB HBM3", FP8, dst)
    assert got == pytest.approx(floored(h.fp8_tflops / d.peak_tflops(want_dtype)))
    assert gemm_peak_tflops(d, "fp8") == d.peak_tflops(want_dtype)


@pytest.mark.parametrize("kernel,scaled_by", [
    ("cudnn_volta_scudnn_128x64_relu_xregs_large_nn_v1", "fp32 peak"),
    (NOT_GEMMS[4], "bandwidth"),
    (NOT_GEMMS[0], "bandwidth"),
    (GEMMS[5][0], "tf32 peak"),
])
def test_a_misfiled_kernel_now_scales_by_what_bounds_it(tmp_path, kernel, scaled_by):
    # an RTX 2080 Ti trace replayed on an A100: by FP32 peak 13.4 -> 19.5 (0.69x), by bandwidth
    # 616 -> 1555 GB/s (0.40x). ResNet's scudnn convolutions (17% of its kernel time) had taken
    # 0.40x; its winogradWgrad transforms (8%) 0.69x
    src, dst = get_gpu("rtx-2080-ti"), get_gpu("a100-sxm4-40gb")
    if scaled_by == "tf32 peak":  # an A100's TF32 GEMM on a V100 (no TF32: its FP32 path)
        src, dst = get_gpu("a100-sxm4-40gb"), get_gpu("v100-sxm2-32gb")
        want = floored(src.tf32_tflops / dst.fp32_tflops)
    elif scaled_by == "fp32 peak":
        want = floored(src.fp32_tflops / dst.fp32_tflops)
    else:
        want = floored(src.mem_bw_gbs / dst.mem_bw_gbs)
    assert _scaled_ms(tmp_path, src.name, kernel, dst.key) == pytest.approx(want)


# FlashAttention-2 (the standalone library, and PyTorch's SDPA as pytorch_flash::): the main
# kernels do their two GEMMs on the tensor cores; their names say "cutlass" only in the template
# arguments, so by the own name alone they had read as memory-bound. Their helpers are
# element-wise ("convert" had matched the GEMM word "conv")
FLASH_GEMMS = [
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::half_t, "
     "Flash_kernel_traits<128, 128, 64, 4, cutlass::half_t> >, false, false, false, false, false, true, "
     "false, false>(Flash_fwd_params)", "fp16"),
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, "
     "false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, "
     "false, true, false, false, false, true, false, false>(pytorch_flash::Flash_fwd_params)", "bf16"),
    ("void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
     "cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, false, true, false, "
     "false, true, false, false, false>(flash::Flash_fwd_params)", "bf16"),
    ("void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, "
     "false, false, cutlass::half_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::half_t> >, true, false, "
     "false, false, false, false, false>(Flash_bwd_params)", "fp16"),
]
FLASH_HELPERS = [
    "void flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, "
    "cutlass::half_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::half_t> > >(Flash_bwd_params, int)",
    "void flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, "
    "cutlass::half_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::half_t> > >(Flash_bwd_params)",
    "void flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
    "cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, 4, 3, true>"
    "(flash::Flash_fwd_params)",
]


@pytest.mark.parametrize("name,dtype", FLASH_GEMMS)
def test_flash_attention_kernels_are_gemms(name, dtype):
    assert is_gemm(name) and gemm_dtype(name) == dtype


@pytest.mark.parametrize("name", FLASH_HELPERS)
def test_flash_attention_helpers_are_not_gemms(name):
    assert not is_gemm(name)


def test_a_flash_attention_forward_scales_by_the_fp16_peaks(tmp_path):
    # an H100's 1 ms FP16 attention on an A100-40GB: 3.17 ms (989.4 vs 312 FP16 TFLOP/s), where
    # by bandwidth (3352 vs 1555 GB/s) it had come out 2.15 ms
    h, a = get_gpu("h100-sxm"), get_gpu("a100-sxm4-40gb")
    got = _scaled_ms(tmp_path, "NVIDIA H100 80GB HBM3", FLASH_GEMMS[0][0], "a100-sxm4-40gb")
    assert got == pytest.approx(floored(h.fp16_tflops / a.fp16_tflops))


def test_cublaslt_split_k_reduce_is_not_a_gemm(tmp_path):
    # cuBLASLt's split-K reduction names its namespace, cublasLt::, in its own name: "cublas" had
    # kept it a GEMM where the bare splitKreduce_kernel of the shared DLRM trace is not one
    name = ("void cublasLt::splitKreduce_kernel<32, 16, int, __half, __half, float, __half, true, false, "
            "false, false>(cublasLt::cublasSplitKParams<float>, __half const*, __half const*, __half*, "
            "float const*, float const*, __half const*, __half const*, __half*, void*, long, float*, int*)")
    assert not is_gemm(name)
    src, dst = get_gpu("a100-sxm4-40gb"), get_gpu("h100-sxm")
    f = KERNEL_FLOOR_MS
    assert _scaled_ms(tmp_path, src.name, name, dst.key) == pytest.approx(
        f + (1.0 - f) * src.mem_bw_gbs / dst.mem_bw_gbs)


# nvjet's type letters (kit.trace.transfer._NVJET_TYPES): the input's first. Names from the kit's
# own bf16 runs on an H200 (measurements/h200-2026-12-04/session/decode_steps.jsonl,
# h200-2026-12-04-b/session/model_steps_bf16.jsonl: dtype "bf16", every nvjet one "tst"); the
# fp16 and FP8 ones carry codes of cuBLAS 12.8.4.1's table (libcublasLt.so.12: hss, tss, qqhsh,
# qqtst, qrhsr, rqsss, ...) in the same structure. They had all read as FP32
NVJET_GEMMS = [
    ("nvjet_tst_192x192_64x3_2x1_v_bz_coopB_TNT", "bf16"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "bf16"),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_bias_TNT", "bf16"),
    ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", "bf16"),
    ("nvjet_tss_64x8_64x16_1x1_v_bz_TNT", "bf16"),
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNT", "fp16"),
    ("nvjet_sm90_hss_192x192_64x3_2x1_v_bz_coopB_NNN", "fp16"),
    ("nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_coopA_TNT", "fp8"),
    ("nvjet_sm90_qrhsr_64x8_128x8_2x1_v_bz_TNT", "fp8"),
    ("nvjet_sm90_rqsss_128x128_128x6_1x2_h_bz_TNT", "fp8"),
]
# GEMM libraries whose kernels carry no "gemm" in their own names: cuBLAS 12.8's nvjet kernels
# (above) and rocBLAS/hipBLASLt's Tensile kernels, whose type code gives the dtype
OTHER_LIBRARY_GEMMS = NVJET_GEMMS + [
    ("Cijk_Ailk_Bljk_SB_MT64x64x8_SN_1LDSB0_APM1_AF0EM1_AF1EM1_AMAS3_ASE_ASGT_ASAE01_ASCE01", "fp32"),
    ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_APM1_ABV0_ACED0_AF0EM1", "fp16"),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HAS_SAV_UserArgs_MT256x256x64_MI16x16x1_SN_LDSB1_AFC1", "bf16"),
]


@pytest.mark.parametrize("name,dtype", OTHER_LIBRARY_GEMMS)
def test_nvjet_and_tensile_kernels_are_gemms_of_their_dtype(name, dtype):
    assert is_gemm(name) and gemm_dtype(name) == dtype


def test_an_nvjet_letter_outside_the_table_reads_as_before():
    # "s" (an FP32 input; cuBLAS 12.8.4.1 instantiates no FP32-input nvjet kernel) keeps what the
    # other patterns say. "bsb" is in cuBLAS's table: its one int8 entry, beside its one int8
    # instantiation (nvjet_matmulAlgo<signed char x 4, CUBLAS_COMPUTE_32I>): int8
    # (tests/test_replay_int8_gemms.py prices it)
    assert gemm_dtype("nvjet_sm90_sss_128x128_64x4_1x2_h_bz_TNT") == "fp32"
    assert gemm_dtype("nvjet_sm90_bsb_128x128_64x4_1x2_h_bz_TNT") == "int8"


# the kit's own H200 runs (torch 2.11.0+cu130: cuBLAS 13.0), each CSV's rows timed in the dtype
# its "dtype" column names: the kernels cuBLAS ran for them
H200_RUNS = sorted((Path(__file__).resolve().parents[1] / "measurements").glob("h200-*/*/*.csv.gz"))
# FP32 SIMT kernels cuBLAS picks for some shapes of a TF32 run (their names say f32 compute:
# sm80_xmma_gemm_f32f32_f32f32_..., not f32f32_tf32f32; cuBLAS's small-N gemmSN<float>)
_FP32_IN_A_TF32_RUN = re.compile(r"f32f32_f32f32|gemmSN_")


@pytest.mark.skipif(not H200_RUNS, reason="the kit's H200 measurements are not present")
def test_every_gemm_kernel_of_the_kits_h200_runs_reads_as_its_runs_dtype():
    # 5,983 bf16, 1,398 fp16, 1,744 fp32 and 669 tf32 GEMM kernels in 21 CSVs: the bf16 runs'
    # nvjet_sm90_tst_* and the fp16 runs' nvjet_sm90_hsh_* had read as FP32; the TF32 runs name
    # no nvjet kernel (sm90_xmma_gemm_f32f32_tf32f32_*, cutlass_80_tensorop_s1688gemm_*), so "t"
    # is no TF32
    import pandas as pd

    wrong, seen = [], {}
    for path in H200_RUNS:
        rows = pd.read_csv(path, usecols=lambda c: c in ("op_class", "dtype", "kernels"))
        if "kernels" not in rows or "op_class" not in rows:
            continue
        gemms = rows[rows.op_class == "gemm"]
        for dtype, kernels in zip(gemms.dtype, gemms.kernels):
            for name in str(kernels).split(";"):
                if not is_gemm(name):
                    continue
                want = "fp32" if dtype == "tf32" and _FP32_IN_A_TF32_RUN.search(name) else dtype
                seen[dtype] = seen.get(dtype, 0) + 1
                if gemm_dtype(name) != want:
                    wrong.append((path.name, name[:60], gemm_dtype(name), want))
    assert set(seen) == {"bf16", "fp16", "fp32", "tf32"} and min(seen.values()) > 500
    assert not wrong, wrong[:5]


def test_an_nvjet_bf16_gemm_scales_by_the_bf16_peaks(tmp_path):
    # an H200's 1 ms bf16 GEMM on a B200: 0.44 ms (989.4 vs 2250 BF16 TFLOP/s); read as FP32 it
    # had come out 0.89 ms (66.9 vs 75)
    src, dst = get_gpu("h200"), get_gpu("b200")
    got = _scaled_ms(tmp_path, "NVIDIA H200", NVJET_GEMMS[1][0], "b200")
    assert got == pytest.approx(floored(src.bf16_tflops / dst.bf16_tflops))
    assert got == pytest.approx(0.002 + 0.998 * 989.4 / 2250)


@pytest.mark.parametrize("src,kernel,dst,us,want_us", [
    # an H100's 3 us bf16 GEMM on a B200: 2 us kept, 1 us x 989.4 / 2250; by the peaks alone it
    # had gone to 1.32 us, under the launch-to-retire floor of any kernel
    ("NVIDIA H100 80GB HBM3", "ampere_bf16_s16816gemm_bf16_64x64_ldg8_f2f_stages_64x5_tn", "b200", 3.0,
     2.0 + 1.0 * 989.4 / 2250),
    # the shared DLRM trace's smallest GEMM (gemmk1_kernel, 3 us on a V100) on an H100:
    # 2 + 1 x 15.7 / 66.9 (FP32), where it had gone to 0.70 us
    ("Tesla V100-SXM2-32GB", "void gemmk1_kernel<int, float, 256, 5, false, false, false, false, "
     "cublasGemvTensorStridedBatched<float const>, float, 0>", "h100-sxm", 3.0, 2.0 + 15.7 / 66.9),
    # a GEMM under the floor keeps its time
    ("NVIDIA H100 80GB HBM3", "ampere_bf16_s16816gemm_bf16_64x64_ldg8_f2f_stages_64x5_tn", "b200", 1.5, 1.5),
])
def test_a_small_gemm_keeps_the_kernel_floor(tmp_path, src, kernel, dst, us, want_us):
    assert _scaled_us(tmp_path, src, kernel, dst, us) == pytest.approx(want_us)


def test_a_convert_kernel_is_no_convolution():
    # "conv" had matched "convert": a sparse index pass scaled as a GEMM
    assert not is_gemm("void at::native::(anonymous namespace)::convert_indices_from_coo_to_csr_cuda_kernel<int>")
    assert is_gemm("void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5>")
    assert is_gemm("sm80_xmma_fprop_implicit_gemm_conv_nhwc")
