"""One GPU's datasheet numbers, as a frozen dataclass with units in every name.

The numbers live in the catalog data file (gpus.json beside this module), never in code; an
operator asks a GPU for its numbers and never hard-codes them.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, fields

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")

# Fields every catalog entry must give, with the type each must have. Peaks may be null.
REQUIRED_FIELDS: dict[str, type] = {
    "key": str,
    "name": str,
    "vendor": str,
    "arch": str,
    "sm_count": int,
    "fp32_lanes_per_sm": int,
    "boost_clock_mhz": float,
    "memory_gib": float,
    "mem_bw_gbs": float,
    "l2_cache_mib": float,
    "smem_per_sm_kib": float,
    "registers_per_sm": int,
    "max_threads_per_sm": int,
    "max_blocks_per_sm": int,
    "interconnect_bw_gbs": float,
    "pcie_gen": int,
    "tdp_w": float,
    "source": str,
}
# What a GPU spec can plausibly be: far wider than any catalog GPU (33 of them span 20-304 SMs,
# 1.06-2.52 GHz, 192-8,000 GB/s, 1,024-2,560 threads per SM, 5.5-4,500 TFLOP/s: P4 fp32 to B200
# fp8), so a real future GPU passes and a unit slip (a clock in GHz, bandwidth in B/s, sm_count
# 1e30) does not.
PLAUSIBLE: dict[str, tuple[float, float]] = {
    "sm_count": (1, 4096), "fp32_lanes_per_sm": (8, 1024), "boost_clock_mhz": (100, 10000),
    "memory_gib": (0.25, 65536), "mem_bw_gbs": (1, 200000), "l2_cache_mib": (0.0625, 16384),
    "smem_per_sm_kib": (1, 4096), "registers_per_sm": (1024, 1 << 22),
    "max_threads_per_sm": (32, 65536), "max_blocks_per_sm": (1, 1024),
    "interconnect_bw_gbs": (0, 100000), "pcie_gen": (1, 8), "tdp_w": (1, 100000),
}
PLAUSIBLE_TFLOPS = (1e-3, 1e6)
# How far fp32_tflops may sit from 2 x SMs x lanes x clock (the catalog's 33: within 1%; a
# packed/dual-issue FP32 peak, as MI300X's datasheet quotes, is 2x), and the highest FP32 ridge
# point (FLOP per DRAM byte) a GPU may have (the catalog's: 9.4 on B200 to 106 on L40S). Past them
# a field is off by a unit (a clock in 0.1 GHz steps, a bandwidth in TB/s, 10x the SMs) or the
# fields disagree: the roofline takes fp32_tflops and mem_bw_gbs, the tile features and element
# rates the SMs and clock.
FP32_PEAK_RATIO = (0.4, 2.5)
MAX_FP32_RIDGE = 1000.0
PEAK_FIELDS = tuple(f"{d}_tflops" for d in DTYPES)
# Optional peaks: null (or absent, for a user's GPU) where the GPU has no such unit.
# int8_tops is in TOPS (integer ops), the others in TFLOP/s
OPTIONAL_PEAK_FIELDS = ("fp32_matrix_tflops", "int8_tops")
# The architectures the kit's rules know, per vendor (tile slicing, tensor-core curves, FP8,
# AMD's wavefronts key on them); a GPU of a newer one takes the nearest of these.
KNOWN_ARCHS = {"nvidia": ("pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"),
               "amd": ("cdna", "cdna2", "cdna3")}
# Other optional numbers: null (or absent, for a user's GPU) where they do not apply;
# ecc_reserved_fraction absent is 0 (the built-in catalog states it for every GPU).
OPTIONAL_FIELDS = ("host_link_gbs", "l1_cache_kib_per_sm", "ecc_reserved_fraction")


@dataclass(frozen=True)
class GPU:
    """Datasheet numbers of one GPU. Peaks are dense (no sparsity), in TFLOP/s; None = unsupported."""

    key: str  # catalog key, lower-case with dashes: "h100-sxm"
    name: str  # marketing name: "NVIDIA H100 SXM5 80GB"
    vendor: str  # "nvidia" | "amd"
    arch: str  # "hopper", "ampere", "cdna3", ...
    sm_count: int  # SMs (NVIDIA) or CUs (AMD)
    fp32_lanes_per_sm: int  # FP32 ALUs per SM/CU
    boost_clock_mhz: float
    memory_gib: float
    mem_bw_gbs: float  # DRAM bandwidth, GB/s (1e9 B/s)
    l2_cache_mib: float  # last-level on-chip cache (L2; MI300X: counts its 256 MiB Infinity Cache)
    smem_per_sm_kib: float  # max shared memory (LDS) one SM/CU can give its blocks
    registers_per_sm: int  # 32-bit registers
    max_threads_per_sm: int
    max_blocks_per_sm: int
    fp32_tflops: float | None
    tf32_tflops: float | None
    fp16_tflops: float | None
    bf16_tflops: float | None
    fp8_tflops: float | None
    interconnect_bw_gbs: float  # NVLink / Infinity Fabric per GPU, total both directions; 0 = none
    pcie_gen: int
    tdp_w: float
    source: str  # where the numbers come from (datasheet, whitepaper URL)
    # FP32 matrix-core peak at full FP32 precision (AMD CDNA MFMA FP32: rocBLAS/hipBLASLt sgemm
    # issue these instructions); None where the GPU has none (NVIDIA: its tensor cores take FP32
    # only as TF32, which PyTorch leaves off, so FP32 GEMMs run on the SIMT lanes).
    fp32_matrix_tflops: float | None = None
    # dense INT8 tensor/matrix-core peak, TOPS (10^12 integer ops a second; the datasheets' figure
    # without sparsity, as every *_tflops here): cuBLAS's int8 GEMMs (CUBLAS_COMPUTE_32I) run at
    # it. None where the GPU has no INT8 tensor unit or its datasheet gives none
    int8_tops: float | None = None
    # the CPU<->GPU link per direction, GB/s, where it is not PCIe x16 of pcie_gen (GH200: the
    # NVLink-C2C to its Grace CPU); None: PCIe
    host_link_gbs: float | None = None
    # the per-SM cache that global loads go through (NVIDIA: the unified L1/texture/shared-memory
    # block; AMD: the vector L1 per CU, beside its LDS), KiB. Every catalog entry gives it (CUDA C++
    # Programming Guide, compute-capability sections: 24 KB L1/texture on 6.0, 48 on 6.1, 128 on
    # 7.0, 96 on 7.5, 192 on 8.0, 128 on 8.6 and 8.9, 256 on 9.0 and 10.0; AMD CDNA, CDNA 2 and
    # CDNA 3 whitepapers: 16 KB, 16 KB, 32 KB). None (a user's GPU without it): see l1_cache_bytes
    l1_cache_kib_per_sm: float | None = None
    # the share of memory_gib that ECC, on by default, keeps for itself: GDDR cards store the
    # check bits in-band, in the DRAM itself, 1/16 of it (nvidia-smi: T4 15,360 MiB of 16,384; L4
    # 23,034 and A10 23,028 of 24,576; A40, L40, L40S 46,068 of 49,152; P4 7,611 of 8,192: each
    # 15/16 of the chip, less a few MiB the driver keeps). HBM cards (P100 to B200, every MI*)
    # keep ECC in sideband bits and lose nothing; GeForce cards have no ECC, and the RTX A6000
    # ships with it off (49,140 MiB shown). 0: nothing reserved (a user's GPU without the field)
    ecc_reserved_fraction: float = 0.0
    aliases: tuple[str, ...] = field(default=())
    notes: str = ""

    def peak_tflops(self, dtype: str) -> float | None:
        """Dense peak for dtype ("fp32", "tf32", "fp16", "bf16", "fp8"); None if unsupported."""
        from kit.errors import KitError

        if dtype not in DTYPES:
            raise KitError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        return getattr(self, f"{dtype}_tflops")

    def gemm_peak_tflops(self, dtype: str) -> float | None:
        """The peak a GEMM (or attention) of dtype runs against. fp32: the FP32 matrix-core peak
        where the GPU has one, else the vector peak; other dtypes: their tensor/matrix peak.
        Elementwise and reduction ops always run against the vector peak (peak_tflops)."""
        if dtype == "fp32" and self.fp32_matrix_tflops is not None:
            return self.fp32_matrix_tflops
        return self.peak_tflops(dtype)

    def gemm_peak_flops_per_s(self, dtype: str) -> float:
        """gemm_peak_tflops in FLOP/s; raises KitError when the GPU does not support dtype."""
        if dtype == "fp32" and self.fp32_matrix_tflops is not None:
            return self.fp32_matrix_tflops * 1e12
        return self.peak_flops_per_s(dtype)

    def peak_flops_per_s(self, dtype: str) -> float:
        """Peak in FLOP/s; raises KitError when the GPU does not support dtype."""
        from kit.errors import KitError

        peak = self.peak_tflops(dtype)
        if peak is None:
            raise KitError(f"{self.key} has no {dtype} support; it supports " + ", ".join(self.dtypes))
        return peak * 1e12

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes this GPU has a peak for, in DTYPES order."""
        return tuple(d for d in DTYPES if self.peak_tflops(d))

    @property
    def mem_bw_bytes_per_s(self) -> float:
        return self.mem_bw_gbs * 1e9

    @property
    def l2_cache_bytes(self) -> float:
        return self.l2_cache_mib * 2**20

    @property
    def l1_cache_bytes(self) -> float:
        """The per-SM L1 in bytes. Where the entry does not give it: an AMD CU's 16 KiB vector L1
        (CDNA 1 and 2; its LDS is apart), else the shared memory's size (NVIDIA carves shared
        memory out of the L1 since Volta)."""
        if self.l1_cache_kib_per_sm:
            return self.l1_cache_kib_per_sm * 1024
        return (16 if self.vendor == "amd" else self.smem_per_sm_kib) * 1024

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30

    @property
    def usable_memory_bytes(self) -> float:
        """What a program can allocate at most: memory_bytes less the in-band ECC share (a T4's
        16 GiB is 15 GiB with its ECC on). The CUDA context and the allocator take more still
        (a few hundred MiB), which the kit does not model."""
        return self.memory_bytes * (1 - self.ecc_reserved_fraction)

    @property
    def usable_memory_gib(self) -> float:
        return self.memory_gib * (1 - self.ecc_reserved_fraction)

    def memory_text(self) -> str:
        """The memory a step can use, in words: "80 GiB", or "15 GiB usable (16 GiB less the
        1/16 its ECC keeps in-band)"."""
        if not self.ecc_reserved_fraction:
            return f"{self.memory_gib:g} GiB"
        f = self.ecc_reserved_fraction
        share = f"1/{round(1 / f)}" if abs(1 / f - round(1 / f)) < 1e-9 else f"{100 * f:.3g}%"
        return (f"{self.usable_memory_gib:g} GiB usable ({self.memory_gib:g} GiB less the "
                f"{share} its ECC keeps in-band)")

    @property
    def smem_per_sm_bytes(self) -> float:
        return self.smem_per_sm_kib * 1024

    @property
    def simt_fp32_tflops(self) -> float:
        """2 FLOPs (one FMA) per lane per clock: 2 · SMs · lanes · clock."""
        return 2 * self.sm_count * self.fp32_lanes_per_sm * self.boost_clock_mhz * 1e6 / 1e12

    def ridge_flops_per_byte(self, dtype: str) -> float:
        """Roofline ridge point: the arithmetic intensity (FLOP/byte) where compute and memory meet."""
        return self.peak_flops_per_s(dtype) / self.mem_bw_bytes_per_s

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["aliases"] = list(self.aliases)
        return d


def gpu_from_dict(entry: dict, origin: str = "entry") -> GPU:
    """Validate one catalog entry and build a GPU; every problem is a KitError naming the field."""
    from kit.errors import KitError

    if not isinstance(entry, dict):
        raise KitError(f"{origin}: a GPU entry must be a JSON object, got {type(entry).__name__}")
    label = f"{origin} ({entry.get('key', '?')})"
    known = {f.name for f in fields(GPU)}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise KitError(f"{label}: unknown field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(known))}")
    missing = [f for f in (*REQUIRED_FIELDS, *PEAK_FIELDS) if f not in entry]
    if missing:
        raise KitError(f"{label}: missing field(s) {', '.join(missing)}")
    clean = dict(entry)
    for name, typ in REQUIRED_FIELDS.items():
        value = entry[name]
        if typ is str:
            if not isinstance(value, str) or not value.strip():
                raise KitError(f"{label}: field {name} must be a non-empty string, got {value!r}")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise KitError(f"{label}: field {name} must be a number, got {value!r}")
        allow_zero = name == "interconnect_bw_gbs"
        if value < 0 or (value == 0 and not allow_zero):
            raise KitError(f"{label}: field {name} must be "
                           f"{'0 (none) or more' if allow_zero else 'positive'}, got {value!r}")
        lo, hi = PLAUSIBLE[name]
        if not lo <= value <= hi:
            raise KitError(f"{label}: field {name} = {value!r} is outside what a GPU can have "
                           f"({lo:g} to {hi:g}); check its unit")
        if typ is int and float(value) != int(value):
            raise KitError(f"{label}: field {name} must be a whole number, got {value!r}")
        clean[name] = typ(value)
    if clean["max_threads_per_sm"] % 32:
        raise KitError(f"{label}: max_threads_per_sm must be a multiple of the 32-thread warp, "
                       f"got {clean['max_threads_per_sm']}")
    for name in (*PEAK_FIELDS, *OPTIONAL_PEAK_FIELDS):
        value = entry.get(name)
        if value is None:
            continue
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
                or not math.isfinite(value)):
            raise KitError(f"{label}: field {name} must be a positive number or null, got {value!r}")
        if not PLAUSIBLE_TFLOPS[0] <= value <= PLAUSIBLE_TFLOPS[1]:
            unit = "TOPS" if name == "int8_tops" else "TFLOP/s"
            raise KitError(f"{label}: field {name} = {value!r} {unit} is outside what a GPU can "
                           f"have ({PLAUSIBLE_TFLOPS[0]:g} to {PLAUSIBLE_TFLOPS[1]:g}); check its unit")
        clean[name] = float(value)
    if clean["fp32_tflops"] is None:
        raise KitError(f"{label}: fp32_tflops is required (every GPU does fp32)")
    simt = 2 * clean["sm_count"] * clean["fp32_lanes_per_sm"] * clean["boost_clock_mhz"] / 1e6
    if not FP32_PEAK_RATIO[0] <= clean["fp32_tflops"] / simt <= FP32_PEAK_RATIO[1]:
        warnings.warn(f"{label}: fp32_tflops {clean['fp32_tflops']:g} is "
                      f"{clean['fp32_tflops'] / simt:.3g}x the {simt:.3g} TFLOP/s its sm_count, "
                      "fp32_lanes_per_sm and boost_clock_mhz (MHz) give (2 x SMs x lanes x clock): "
                      "one of them is off (a unit?); the kit uses both, so its times disagree")
    ridge = clean["fp32_tflops"] * 1e3 / clean["mem_bw_gbs"]
    if ridge > MAX_FP32_RIDGE:
        warnings.warn(f"{label}: fp32_tflops over mem_bw_gbs is {ridge:.4g} FLOP per DRAM byte, "
                      f"past any GPU's (at most {MAX_FP32_RIDGE:g}): is mem_bw_gbs in GB/s "
                      f"({clean['mem_bw_gbs']:g} GB/s reads as {clean['mem_bw_gbs'] / 1e3:g} TB/s)?")
    matrix = clean.get("fp32_matrix_tflops")
    if matrix is not None and matrix < clean["fp32_tflops"]:
        raise KitError(f"{label}: fp32_matrix_tflops ({matrix:g}) is below fp32_tflops "
                       f"({clean['fp32_tflops']:g}); give the FP32 matrix-core peak, or null if none")
    # optional numbers: (the plausible range they share, their unit)
    for name, (like, unit) in {"host_link_gbs": ("mem_bw_gbs", "GB/s"),
                               "l1_cache_kib_per_sm": ("smem_per_sm_kib", "KiB")}.items():
        value = entry.get(name)
        if value is None:
            continue
        lo, hi = PLAUSIBLE[like]
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or not lo <= value <= hi):
            raise KitError(f"{label}: field {name} must be a number of {unit} ({lo:g} to "
                           f"{hi:g}) or null, got {value!r}")
        clean[name] = float(value)
    ecc = entry.get("ecc_reserved_fraction")
    if ecc is not None:
        # in-band ECC keeps 1/16 (0.0625) on every GDDR card; half or more is a unit slip (a %)
        if (isinstance(ecc, bool) or not isinstance(ecc, (int, float)) or not math.isfinite(ecc)
                or not 0 <= ecc < 0.5):
            raise KitError(f"{label}: field ecc_reserved_fraction must be the share of memory_gib "
                           f"ECC keeps, 0 to 0.5 (in-band ECC on GDDR: 0.0625), got {ecc!r}")
        clean["ecc_reserved_fraction"] = float(ecc)
    else:
        clean.pop("ecc_reserved_fraction", None)
    clean["vendor"] = clean["vendor"].strip().lower()  # amd: 64-lane wavefronts; any other as CUDA
    clean["arch"] = clean["arch"].strip().lower()  # "Hopper" is hopper (the rules key on it)
    if clean["vendor"] not in KNOWN_ARCHS:  # another vendor's GPU, or a typo: say so
        warnings.warn(f"{label}: vendor {entry['vendor']!r} is not one the kit models "
                      f"({' or '.join(KNOWN_ARCHS)}): it is priced as CUDA (32-thread warps)")
    known = KNOWN_ARCHS.get(clean["vendor"], KNOWN_ARCHS["nvidia"])
    if clean["arch"] not in known:  # a newer GPU, or a typo: the rules that lapse
        warnings.warn(f"{label}: arch {entry['arch']!r} is not one the kit knows "
                      f"({', '.join(known)}): no architecture's own rule applies to it "
                      "(tensor-core curves, tile slicing, FP8); check the spelling, or give the "
                      "nearest known one")
    if clean["key"] != clean["key"].lower() or " " in clean["key"]:
        raise KitError(f"{label}: key must be lower-case with dashes, e.g. 'h100-sxm'")
    aliases = entry.get("aliases", [])
    if not isinstance(aliases, (list, tuple)) or not all(isinstance(a, str) for a in aliases):
        raise KitError(f"{label}: aliases must be a list of strings")
    clean["aliases"] = tuple(aliases)
    # notes as a list of lines had made the GPU unhashable: a TypeError traceback in the
    # predictors' caches (kit op, kit predict) instead of an error naming the field
    notes = entry.get("notes")
    if notes is not None and not isinstance(notes, str):
        raise KitError(f"{label}: field notes must be a string (one text) or null, got {notes!r}")
    clean["notes"] = notes or ""
    return GPU(**clean)
