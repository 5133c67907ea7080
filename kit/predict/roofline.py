"""The roofline: an op can go no faster than its FLOPs at peak compute or its bytes at peak bandwidth.

    time ≥ max(FLOPs / peak_FLOP/s(dtype), bytes / bandwidth)

The ridge point peak / bandwidth (FLOP/byte) splits ops into memory-bound (intensity below it)
and compute-bound (above it).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from kit.hardware import GPU, get_gpu
from kit.ops import Attention, Gemm, Memcpy

# PCIe x16 bandwidth per direction, GB/s, by generation (PCI-SIG: 2.5/5 GT/s per lane with
# 8b/10b encoding for gens 1-2, 8/16/32/64 GT/s with 128b/130b for 3-6; gen6 PAM4 FLIT; 7 and 8
# double it again). Used for host<->device copies, unless the GPU's host_link_gbs names another
# link (GH200's NVLink-C2C). Every pcie_gen a GPU entry may give (1-8) is here: gens 1, 2, 7 and
# 8 had taken gen 4's 31.5 GB/s, so a gen-7 GPU copied at half a gen-5 one's rate.
PCIE_X16_GBS = {1: 4.0, 2: 8.0, 3: 15.75, 4: 31.5, 5: 63.0, 6: 126.0, 7: 252.0, 8: 504.0}


@dataclass(frozen=True)
class Roofline:
    time_ms: float
    compute_ms: float
    memory_ms: float
    bound: str  # "compute" | "memory"
    intensity_flops_per_byte: float
    ridge_flops_per_byte: float
    peak_tflops: float
    bw_gbs: float

    def to_dict(self) -> dict:
        return asdict(self)


def compute_peak_flops_per_s(op, gpu: GPU) -> float:
    """The peak an op runs against. GEMMs and attention: the GPU's GEMM peak of their dtype
    (GPU.gemm_peak_flops_per_s: tensor cores; for fp32, AMD CDNA's FP32 matrix cores, else the
    SIMT lanes); everything else: the fp32 vector peak (elementwise math runs on the lanes)."""
    if isinstance(op, (Gemm, Attention)):
        return gpu.gemm_peak_flops_per_s(op.dtype)
    return gpu.peak_flops_per_s("fp32")


def host_link_gbs(gpu: GPU) -> float:
    """The GPU's host<->device link per direction, GB/s: host_link_gbs where the catalog gives
    one (GH200's NVLink-C2C), else its PCIe generation's x16 rate."""
    return gpu.host_link_gbs or PCIE_X16_GBS.get(gpu.pcie_gen, PCIE_X16_GBS[4])


def roofline(op, gpu: GPU | str) -> Roofline:
    gpu = get_gpu(gpu)
    peak = compute_peak_flops_per_s(op, gpu)
    bw = gpu.mem_bw_bytes_per_s
    if isinstance(op, Memcpy) and op.direction != "d2d":
        bw = host_link_gbs(gpu) * 1e9
    compute_ms = op.flops / peak * 1e3
    memory_ms = op.bytes / bw * 1e3
    bound = "compute" if compute_ms >= memory_ms else "memory"
    intensity = op.flops / op.bytes if op.bytes else float("inf")
    return Roofline(max(compute_ms, memory_ms), compute_ms, memory_ms, bound, intensity,
                    peak / bw, peak / 1e12, bw / 1e9)
