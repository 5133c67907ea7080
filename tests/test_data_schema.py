"""The measurement schema: kernel-name tile parsing, op classes, dtype conformance."""
import numpy as np
import pandas as pd
import pytest

from kit.data import schema
from kit.errors import KitError

# (kernel name, tile read off the name by hand)
TILES = [
    ("ampere_sgemm_128x64_tn", (128, 64, None)),
    ("volta_sgemm_32x128_nn", (32, 128, None)),
    ("maxwell_sgemm_128x64_nn", (128, 64, None)),
    ("ampere_sgemm_32x32_sliced1x4_tn", (32, 32, None)),
    ("sgemm_128x128x8_NT_vec", (128, 128, 8)),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize2x2x1_ffma_aligna4",
     (64, 64, 8)),
    ("void cutlass::Kernel<cutlass_80_simt_sgemm_128x256_8x4_tn_align1>(cutlass_80_simt_sgemm_128x256_8x4_tn_align1::Params)",
     (128, 256, 8)),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>", (128, 128, 32)),
    # measured on an H200 (measurements/h200-2026-12-04): unaligned bf16 GEMMs fall back to these
    ("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_tn_align1>(cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_tn_align1::Params)",
     (256, 128, None)),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align2>", (16, 16, 128)),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_bias_TNT", (64, 8, 64)),
    ("Cijk_Ailk_Bljk_SB_MT128x64x16_MI32x32x2x1_SE_1LDSB0_APM1", (128, 64, 16)),
    ("cudnn_infer_volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", (128, 128, None)),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >", (None, None, None)),
    ("void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>", (None, None, None)),
]


@pytest.mark.parametrize("name,tile", TILES)
def test_parse_tile(name, tile):
    assert schema.parse_tile(name) == tile


def test_parse_tile_of_missing_name():
    assert schema.parse_tile(None) == (None, None, None)
    assert schema.parse_tile(np.nan) == (None, None, None)


def test_tile_columns_are_nullable_ints():
    names = pd.Series(["ampere_sgemm_128x64_tn", np.nan, "relu_kernel", "ampere_sgemm_128x64_tn"])
    t = schema.tile_columns(names)
    assert str(t["tile_m"].dtype) == "Int64"
    assert t["tile_m"].tolist()[0] == 128 and t["tile_n"].tolist()[3] == 64
    assert t["tile_m"].isna().tolist() == [False, True, True, False]
    assert t["tile_k"].isna().all()


def test_op_classes():
    ops = pd.Series(["bmm", "linear", "addu", "pow", "gelu", "softmax", "ln", "conv"])
    info = schema.op_columns(ops)
    assert info["op_class"].tolist() == ["gemm", "gemm", "elementwise", "elementwise",
                                         "elementwise", "softmax", "layernorm", "conv"]
    assert info["elem_kind"].tolist()[2:5] == ["add", "pow", "gelu"]
    assert info["elem_kind"].isna().tolist() == [True, True, False, False, False, True, True, True]
    assert info["scalar"].tolist() == [False, False, True, False, False, False, False, False]


def test_elem_kinds_are_kit_ops_kinds():
    from kit.ops import ELEMENTWISE_FLOPS

    kinds = {v[1] for v in schema.OPS.values() if v[0] == "elementwise"}
    assert kinds <= set(ELEMENTWISE_FLOPS)


def test_unknown_op_is_named():
    with pytest.raises(KitError, match="'matmul'"):
        schema.op_columns(pd.Series(["bmm", "matmul"]))


def test_conform_orders_columns_and_dtypes():
    frame = pd.DataFrame({"latency_ms": ["0.5"], "op": ["bmm"], "m": [3.0], "extra": [1],
                          "cudnn_version": [8902.0]})
    out = schema.conform(frame)
    schema.check(out)
    assert list(out.columns) == list(schema.COLUMNS)
    assert out["m"].iloc[0] == 3 and out["latency_ms"].iloc[0] == 0.5
    assert out["cudnn_version"].iloc[0] == "8902"
    assert pd.isna(out["n"].iloc[0]) and pd.isna(out["kernel_name"].iloc[0])


def test_conform_rejects_bad_values_naming_the_column():
    with pytest.raises(KitError, match="'m'.*2.5"):
        schema.conform(pd.DataFrame({"m": [2.5]}))
    with pytest.raises(KitError, match="'latency_ms'.*fast"):
        schema.conform(pd.DataFrame({"latency_ms": ["fast"]}))


def test_unknown_device_is_named():
    with pytest.raises(KitError, match="'NVIDIA Imaginary X9'"):
        schema.gpu_keys_for(pd.Series(["Tesla T4", "NVIDIA Imaginary X9"]))
    keys = schema.gpu_keys_for(pd.Series(["Tesla T4", "cpu: AMD EPYC"]))
    assert keys.iloc[0] == "t4" and pd.isna(keys.iloc[1])
