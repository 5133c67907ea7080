"""Checks on the GPU catalog data file, kit/hardware/gpus.json.

Conventions the data follows (and these tests hold it to):

* memory_gib is the nominal capacity the datasheet quotes (80 for H100 80GB, 141 for H200,
  192 for MI300X, 16 for T4 even though nvidia-smi shows ~15 GiB usable), not a GB->GiB conversion.
* mem_bw_gbs is DRAM bandwidth in GB/s (1e9 B/s) as the datasheet quotes it.
* Peaks are dense (no structured sparsity) in TFLOP/s. fp32_tflops is the SIMT/vector FP32 peak
  (2 FLOPs per lane per clock; AMD: non-packed vector FP32); tf32/fp16/bf16/fp8 are tensor/matrix-core
  peaks, null where the GPU's tensor/matrix cores do not support the type (Pascal has no tensor cores:
  P100 fp16 is its 2x-rate half2 SIMT peak, P4's 1/64-rate fp16 is null).
* fp32_matrix_tflops is the FP32 matrix-core peak at full FP32 precision (AMD CDNA MFMA FP32, the
  unit rocBLAS/hipBLASLt sgemm runs on), null where there is none (every NVIDIA GPU: its tensor
  cores take FP32 only as TF32, which PyTorch leaves off). GPU.gemm_peak_tflops picks it for fp32.
* GeForce cards quote the FP32-accumulate tensor rate (what PyTorch uses).
* interconnect_bw_gbs is NVLink / Infinity Fabric per GPU, both directions added, 0 = none.

Checks compare against reference computations (2·SM·lanes·clock, the CUDA compute-capability
table, NeuSight's device configs) rather than restating the data file.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest

from kit.errors import KitError
from kit.hardware import get_gpu, gpu_from_dict, list_gpus
from kit.hardware.catalog import CATALOG_PATH
from kit.hardware.gpu import OPTIONAL_FIELDS, OPTIONAL_PEAK_FIELDS, PEAK_FIELDS, REQUIRED_FIELDS

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KIT_SHARED", REPO.parent / "shared"))
NEUSIGHT = SHARED / "data" / "neusight"

REQUIRED_KEYS = [
    "p4", "p100-pcie-16gb", "v100-pcie-32gb", "v100-sxm2-32gb", "t4", "a10", "a100-pcie-40gb",
    "a100-sxm4-40gb", "a100-pcie-80gb", "a100-sxm4-80gb", "l4", "l40s", "rtx-4090", "h100-pcie",
    "h100-sxm", "h200", "b200", "mi100", "mi210", "mi250", "mi250x", "mi300x",
]

# What torch.cuda.get_device_name() returns on each GPU -> the catalog key it must resolve to.
TORCH_DEVICE_NAMES = {
    "Tesla P4": "p4",
    "Tesla P100-PCIE-16GB": "p100-pcie-16gb",
    "Tesla P100-SXM2-16GB": "p100-sxm2-16gb",
    "Tesla V100-PCIE-16GB": "v100-pcie-16gb",
    "Tesla V100-PCIE-32GB": "v100-pcie-32gb",
    "Tesla V100-SXM2-16GB": "v100-sxm2-16gb",
    "Tesla V100-SXM2-32GB": "v100-sxm2-32gb",
    "Tesla T4": "t4",
    "NVIDIA GeForce RTX 2080 Ti": "rtx-2080-ti",
    "NVIDIA A10": "a10",
    "NVIDIA A30": "a30",
    "NVIDIA A40": "a40",
    "NVIDIA RTX A6000": "rtx-a6000",
    "NVIDIA GeForce RTX 3090": "rtx-3090",
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb",
    "NVIDIA A100-SXM4-40GB": "a100-sxm4-40gb",
    "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "NVIDIA A100-SXM4-80GB": "a100-sxm4-80gb",
    "NVIDIA L4": "l4",
    "NVIDIA L40": "l40",
    "NVIDIA L40S": "l40s",
    "NVIDIA GeForce RTX 4090": "rtx-4090",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "NVIDIA H100 NVL": "h100-nvl",
    "NVIDIA H200": "h200",
    "NVIDIA GH200 480GB": "gh200",
    "NVIDIA B200": "b200",
    "AMD Instinct MI100": "mi100",
    "AMD Instinct MI210": "mi210",
    "AMD Instinct MI250": "mi250",
    "AMD Instinct MI250X": "mi250x",
    "AMD Instinct MI300X": "mi300x",
}

# Short forms people type -> the variant they most often mean.
SHORT_NAMES = {
    "P100": "p100-pcie-16gb", "V100": "v100-pcie-32gb", "T4": "t4", "A100": "a100-sxm4-40gb",
    "A100-80GB": "a100-sxm4-80gb", "A100-80GB-PCIe": "a100-pcie-80gb", "H100": "h100-sxm",
    "H100 PCIe": "h100-pcie", "RTX 4090": "rtx-4090", "MI300X": "mi300x", "mi250x": "mi250x",
    "NVIDIA_A100_80GB_PCIe": "a100-pcie-80gb", "Tesla_P100-PCIE-16GB": "p100-pcie-16gb",
}

# CUDA programming guide: per-SM limits by compute capability -> (smem KiB, threads, blocks).
CC_LIMITS = {
    "6.0": (64, 2048, 32), "6.1": (96, 2048, 32), "7.0": (96, 2048, 32), "7.5": (64, 1024, 16),
    "8.0": (164, 2048, 32), "8.6": (100, 1536, 16), "8.9": (100, 1536, 24), "9.0": (228, 2048, 32),
    "10.0": (228, 2048, 32),
}
COMPUTE_CAPABILITY = {
    "p4": "6.1", "p100-pcie-16gb": "6.0", "p100-sxm2-16gb": "6.0", "v100-pcie-16gb": "7.0",
    "v100-pcie-32gb": "7.0", "v100-sxm2-16gb": "7.0", "v100-sxm2-32gb": "7.0", "t4": "7.5",
    "rtx-2080-ti": "7.5", "a10": "8.6", "a40": "8.6", "rtx-a6000": "8.6", "rtx-3090": "8.6",
    "a30": "8.0", "a100-pcie-40gb": "8.0", "a100-sxm4-40gb": "8.0", "a100-pcie-80gb": "8.0",
    "a100-sxm4-80gb": "8.0", "l4": "8.9", "l40": "8.9", "l40s": "8.9", "rtx-4090": "8.9",
    "h100-pcie": "9.0", "h100-sxm": "9.0", "h100-nvl": "9.0", "h200": "9.0", "gh200": "9.0",
    "b200": "10.0",
}

ARCHS = {"nvidia": {"pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"},
         "amd": {"cdna", "cdna2", "cdna3"}}
TENSOR_TF32_BF16 = {"ampere", "ada", "hopper", "blackwell", "cdna3"}  # archs with tf32 matrix support
FP8_ARCHS = {"ada", "hopper", "blackwell", "cdna3"}


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@pytest.fixture(scope="module")
def entries() -> list[dict]:
    return json.loads(CATALOG_PATH.read_text())


@pytest.fixture(scope="module")
def gpus():
    return {g.key: g for g in list_gpus()}


def test_catalog_size_and_required_keys(entries):
    assert len(entries) >= 24
    keys = [e["key"] for e in entries]
    assert len(keys) == len(set(keys)), "duplicate keys"
    missing = sorted(set(REQUIRED_KEYS) - set(keys))
    assert not missing, f"catalog lacks {missing}"


def test_entries_have_exactly_the_schema_fields(entries):
    # the built-in catalog states every optional peak too (null where the unit does not exist)
    expected = (set(REQUIRED_FIELDS) | set(PEAK_FIELDS) | set(OPTIONAL_PEAK_FIELDS) | set(OPTIONAL_FIELDS)
                | {"aliases", "notes"})
    for e in entries:
        assert set(e) == expected, f"{e.get('key')}: {sorted(set(e) ^ expected)}"


def test_entries_validate(entries):
    for e in entries:
        g = gpu_from_dict(e, origin="gpus.json")
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", g.key), g.key
        assert g.vendor in ARCHS and g.arch in ARCHS[g.vendor], (g.key, g.vendor, g.arch)


def test_fp32_peak_matches_lanes_times_clock(gpus):
    # 2 FLOPs (FMA) per FP32 lane per clock; AMD entries use the non-packed vector rate.
    for g in gpus.values():
        ref = 2 * g.sm_count * g.fp32_lanes_per_sm * g.boost_clock_mhz * 1e6 / 1e12
        assert g.fp32_tflops == pytest.approx(ref, rel=0.03), (g.key, g.fp32_tflops, ref)


def test_per_sm_limits_follow_compute_capability(gpus):
    for key, cc in COMPUTE_CAPABILITY.items():
        if key not in gpus:
            continue
        g = gpus[key]
        smem, threads, blocks = CC_LIMITS[cc]
        assert (g.smem_per_sm_kib, g.max_threads_per_sm, g.max_blocks_per_sm) == (smem, threads, blocks), key
        assert g.registers_per_sm == 65536, key
    for g in gpus.values():
        if g.vendor == "amd":
            assert g.smem_per_sm_kib == 64, g.key  # LDS per CU on CDNA 1-3
            assert g.max_threads_per_sm % 64 == 0, g.key  # whole wave64 slots


# the per-SM cache global loads go through, KiB, by compute capability (CUDA C++ Programming Guide)
CC_L1_KIB = {"6.0": 24, "6.1": 48, "7.0": 128, "7.5": 96, "8.0": 192, "8.6": 128, "8.9": 128,
             "9.0": 256, "10.0": 256}
CDNA_L1_KIB = {"cdna": 16, "cdna2": 16, "cdna3": 32}  # vector L1 per CU (AMD CDNA whitepapers)


def test_l1_cache_follows_architecture(gpus):
    for key, cc in COMPUTE_CAPABILITY.items():
        if key in gpus:
            assert gpus[key].l1_cache_kib_per_sm == CC_L1_KIB[cc], key
            if cc not in ("6.0", "6.1"):  # Volta on: shared memory is carved out of the same block
                assert gpus[key].l1_cache_kib_per_sm >= gpus[key].smem_per_sm_kib, key
    for g in gpus.values():
        if g.vendor == "amd":
            assert g.l1_cache_kib_per_sm == CDNA_L1_KIB[g.arch], g.key
        assert g.l1_cache_bytes == g.l1_cache_kib_per_sm * 1024, g.key


def test_l1_cache_is_optional_for_a_users_gpu(entries):
    e = dict(next(x for x in entries if x["key"] == "l4"), key="my-l4")
    del e["l1_cache_kib_per_sm"]
    g = gpu_from_dict(e)
    assert g.l1_cache_kib_per_sm is None and g.l1_cache_bytes == g.smem_per_sm_kib * 1024
    amd = dict(next(x for x in entries if x["key"] == "mi210"), key="my-mi210")
    del amd["l1_cache_kib_per_sm"]
    assert gpu_from_dict(amd).l1_cache_bytes == 16 * 1024  # the vector L1, not the 64 KiB LDS
    for bad in (0, -4, "128", True, float("nan"), 1e9):
        with pytest.raises(KitError, match="l1_cache_kib_per_sm"):
            gpu_from_dict({**e, "l1_cache_kib_per_sm": bad})


def test_dtype_support_by_architecture(gpus):
    for g in gpus.values():
        if g.arch in TENSOR_TF32_BF16:
            assert g.tf32_tflops and g.bf16_tflops, g.key
        if g.arch in {"pascal", "volta", "turing"}:
            assert g.tf32_tflops is None and g.bf16_tflops is None, g.key
        if g.arch in FP8_ARCHS:
            assert g.fp8_tflops, g.key
        else:
            assert g.fp8_tflops is None, g.key


def test_tensor_peaks_are_consistent(gpus):
    for g in gpus.values():
        if g.arch in TENSOR_TF32_BF16 | {"cdna2"}:
            assert g.bf16_tflops >= g.fp32_tflops, g.key
        if g.fp16_tflops is not None and g.key != "p4":
            assert g.fp16_tflops >= g.fp32_tflops, g.key
        # Tensor-core throughput doubles each time the operand width halves.
        if g.tf32_tflops and g.fp16_tflops:
            assert g.fp16_tflops == pytest.approx(2 * g.tf32_tflops, rel=0.03), g.key
        if g.fp8_tflops and g.fp16_tflops:
            assert g.fp8_tflops == pytest.approx(2 * g.fp16_tflops, rel=0.03), g.key
    # Pascal P100 fp16 is its 2x half2 SIMT rate.
    for key in ("p100-pcie-16gb", "p100-sxm2-16gb"):
        if key in gpus:
            assert gpus[key].fp16_tflops == pytest.approx(2 * gpus[key].fp32_tflops, rel=0.02)


# Dense FP16 matrix FLOPs per clock per SM (CU), FP32 accumulate, from the architecture
# whitepapers: Pascal GP100's half2 lanes 64 x 2 x 2; Volta and Turing 8 tensor cores x 64 FMA;
# GA100 4 x 256 FMA, GA10x and Ada 4 x 128; Hopper 4 x 512; Blackwell twice Hopper; CDNA 1-2 MFMA
# 1024, CDNA 3 2048. GeForce boards (and the L40) quote FP32 accumulate at half that rate.
DENSE_FP16_FLOPS_PER_CLOCK_PER_SM = {
    "pascal": 256, "volta": 1024, "turing": 1024, "ampere": 1024, "ada": 1024, "hopper": 4096,
    "blackwell": 8192, "cdna": 1024, "cdna2": 1024, "cdna3": 2048,
}
GA100 = {"a100-pcie-40gb", "a100-sxm4-40gb", "a100-pcie-80gb", "a100-sxm4-80gb", "a30"}
HALF_RATE_FP32_ACCUMULATE = {"rtx-2080-ti", "rtx-3090", "rtx-4090", "l40"}


def test_tensor_peaks_are_dense_per_sm_rates(gpus):
    """fp16 = SMs x the architecture's dense FLOPs per clock x the boost clock: a datasheet's
    'with sparsity' figure (2x) or a whole-package one (MI250: 2 GCDs) fails. NVIDIA computes
    tensor peaks at a lower clock than boost_clock_mhz on some boards (H100 SXM: 1830 of 1980 MHz,
    H100 NVL about 1545 of 1785), hence the 0.85 floor."""
    for g in gpus.values():
        if g.fp16_tflops is None:
            continue
        rate = 2048 if g.key in GA100 else DENSE_FP16_FLOPS_PER_CLOCK_PER_SM[g.arch]
        if g.key in HALF_RATE_FP32_ACCUMULATE:
            rate /= 2
        ref = rate * g.sm_count * g.boost_clock_mhz * 1e6 / 1e12
        assert 0.85 <= g.fp16_tflops / ref <= 1.02, (g.key, g.fp16_tflops, ref)


# AMD CDNA 1-3 whitepapers: an MFMA FP32 (v_mfma_f32_*_f32) compute unit does 256 FP32 FLOPs per
# clock per CU, twice the 128 of its 64 non-packed vector lanes.
CDNA_MFMA_FP32_FLOPS_PER_CLOCK_PER_CU = 256


def test_fp32_matrix_peak_is_amd_mfma_only(gpus):
    for g in gpus.values():
        if g.vendor == "amd":
            ref = CDNA_MFMA_FP32_FLOPS_PER_CLOCK_PER_CU * g.sm_count * g.boost_clock_mhz * 1e6 / 1e12
            assert g.fp32_matrix_tflops == pytest.approx(ref, rel=0.01), (g.key, g.fp32_matrix_tflops, ref)
            assert g.fp32_matrix_tflops == pytest.approx(2 * g.simt_fp32_tflops, rel=0.01), g.key
            assert g.gemm_peak_tflops("fp32") == g.fp32_matrix_tflops
        else:
            # NVIDIA FP32 GEMMs (TF32 off) run on the SIMT lanes: the GEMM peak is the vector peak
            assert g.fp32_matrix_tflops is None, g.key
            assert g.gemm_peak_tflops("fp32") == g.fp32_tflops, g.key
        for d in ("tf32", "fp16", "bf16", "fp8"):
            assert g.gemm_peak_tflops(d) == g.peak_tflops(d), (g.key, d)
        assert g.peak_tflops("fp32") == g.fp32_tflops  # elementwise ops keep the vector peak


def test_variants_share_their_chip(gpus):
    # Same silicon, different memory: compute must match.
    for a, b in [("a100-pcie-40gb", "a100-sxm4-40gb"), ("a100-sxm4-40gb", "a100-sxm4-80gb"),
                 ("a100-pcie-40gb", "a100-pcie-80gb"), ("v100-sxm2-16gb", "v100-sxm2-32gb"),
                 ("v100-pcie-16gb", "v100-pcie-32gb"), ("h100-sxm", "h200")]:
        if a in gpus and b in gpus:
            for f in ("sm_count", "boost_clock_mhz", *PEAK_FIELDS, *OPTIONAL_PEAK_FIELDS):
                assert getattr(gpus[a], f) == getattr(gpus[b], f), (a, b, f)
    assert gpus["a100-sxm4-80gb"].mem_bw_gbs > gpus["a100-pcie-80gb"].mem_bw_gbs > gpus["a100-sxm4-40gb"].mem_bw_gbs
    assert gpus["h200"].mem_bw_gbs > gpus["h100-sxm"].mem_bw_gbs > gpus["h100-pcie"].mem_bw_gbs


def test_aliases_unique_after_normalisation(gpus):
    owner: dict[str, str] = {}
    for g in gpus.values():
        for name in {_norm(n) for n in (g.key, g.name, *g.aliases)}:
            assert name, g.key
            assert owner.setdefault(name, g.key) == g.key, f"{name!r} names both {owner[name]} and {g.key}"


@pytest.mark.parametrize("device_name,key", sorted(TORCH_DEVICE_NAMES.items()))
def test_torch_device_names_resolve(device_name, key):
    assert get_gpu(device_name).key == key


@pytest.mark.parametrize("name,key", sorted(SHORT_NAMES.items()))
def test_short_names_resolve(name, key):
    assert get_gpu(name).key == key


def test_every_gpu_resolves_by_key_and_name(gpus):
    for g in gpus.values():
        assert get_gpu(g.key) is g and get_gpu(g.name) is g
        for a in g.aliases:
            assert get_gpu(a) is g, a


def test_sources_cite_urls(gpus):
    for g in gpus.values():
        assert g.source.strip() and "http" in g.source, g.key


def _neusight_configs() -> list[Path]:
    root = NEUSIGHT / "data"
    if not root.is_dir():
        pytest.skip(f"NeuSight data not found under {root} (set KIT_SHARED)")
    files = sorted(root.rglob("device_configs/*.json"))
    if not files:
        pytest.skip("no NeuSight device_configs found")
    return files


def test_neusight_device_configs_agree(gpus):
    for path in _neusight_configs():
        cfg = json.loads(path.read_text())
        g = get_gpu(cfg["Device"])
        sms, bw = cfg["Num_Sm"], cfg["Mem_Bw"]
        if path.stem.endswith("_TP"):
            # A 2-way tensor-parallel pair of H100s: bandwidth (and memory, L2) are summed over 2 GPUs.
            bw = bw / 2
        if cfg["Device"] == "Tesla P4":
            # NeuSight counts 40 units of 64 lanes; GP104 has 20 SMs of 128 lanes. Same 2560 lanes.
            assert sms * cfg["Core_Per_SM"] == g.sm_count * g.fp32_lanes_per_sm, path.name
        elif cfg["Device"] == "NVIDIA L4":
            # NeuSight says 60 SMs; the datasheet's 7424 CUDA cores and 30.3 TFLOP/s at 2040 MHz
            # mean 58 SMs. Prefer the datasheet, but NeuSight must stay within 5%.
            assert g.sm_count == 58 and sms == pytest.approx(g.sm_count, rel=0.05), path.name
        else:
            assert sms == g.sm_count, (path.name, sms, g.sm_count)
        assert bw == pytest.approx(g.mem_bw_gbs, rel=0.10), (path.name, bw, g.mem_bw_gbs)


def test_neusight_label_folders_resolve():
    label = NEUSIGHT / "label"
    if not label.is_dir():
        pytest.skip(f"NeuSight labels not found under {label}")
    for folder in sorted(p for p in label.iterdir() if p.is_dir()):
        assert get_gpu(folder.name), folder.name


def test_numbers_are_finite_and_plausible(gpus):
    for g in gpus.values():
        for f in (*PEAK_FIELDS, *OPTIONAL_PEAK_FIELDS):
            v = getattr(g, f)
            assert v is None or (math.isfinite(v) and 0 < v < 20000), (g.key, f, v)
        assert 1 <= g.memory_gib <= 512 and 100 <= g.mem_bw_gbs <= 20000, g.key
        assert 500 <= g.boost_clock_mhz <= 3000 and 3 <= g.pcie_gen <= 6, g.key
        assert 0.5 <= g.l2_cache_mib <= 512 and 30 <= g.tdp_w <= 1500, g.key
        # Ridge point (FLOP/byte) for fp32 sits between 1 and 200 on every GPU here (L4: ~101).
        assert 1 < g.ridge_flops_per_byte("fp32") < 200, g.key


def test_measured_amd_sgemm_lies_between_the_vector_and_the_matrix_peak():
    """NeuSight's MI100/MI210 FP32 GEMMs (PyTorch 2.4.1; rocBLAS MFMA kernels, 'MI32x32x2x1' or
    'MI16x16x4x1' in the kernel names) run faster than the vector peak allows and never faster
    than the matrix peak: the matrix peak is the one a GEMM roofline must use."""
    import pandas as pd

    root = NEUSIGHT / "data" / "dataset_amd" / "test" / "collect"
    files = sorted(root.glob("*/*/AMD Instinct MI*.csv")) if root.is_dir() else []
    if not files:
        pytest.skip(f"NeuSight AMD GEMM data not found under {root}")
    for f in files:
        d = pd.read_csv(f)
        g = get_gpu(d.Device.iloc[0])
        tflops = 2 * d.B * d.M * d.N * d.K / (d.Latency * 1e-3) / 1e12
        assert tflops.max() > 1.2 * g.fp32_tflops, (f.name, tflops.max(), g.fp32_tflops)
        assert tflops.max() < g.gemm_peak_tflops("fp32"), (f.name, tflops.max())
        # Tensile names an MFMA kernel by its instruction: _MI32x32x2x1_ = v_mfma_f32_32x32x2f32
        assert d["Kernel Name"].str.contains(r"_MI(?:32x32x2|16x16x4|16x16x1)x\d+_").mean() > 0.8, f.name
