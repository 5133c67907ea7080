"""Transfer a trace to another GPU or system: keep the graph and the host's CPU times, swap each
GPU op's measured duration for a prediction on the target.

The measured duration is the calibration; the datasheets give the ratio (as in Habitat's wave
scaling, Yu et al., ATC 2021):

    GEMM-like kernel    t' = f + (t − f) · peak_src / peak_dst
                                          (GEMM peaks, dtype read from the kernel name; where a
                                          GPU lacks that dtype, FP8 takes its FP16 peak, the
                                          others its FP32 one: gemm_peak_tflops; int8 the
                                          INT8 tensor peaks, or both FP32 ones: int8_ratio)
    other kernels       t' = f + (t − f) · bw_src / bw_dst    (memory-bound)
                        f = min(t, 2 µs), the floor: above_floor_ms
    memcpy H2D/D2H      t' = t · pcie_src / pcie_dst          (PCIe generation bandwidth), for a
                                                              copy that ran near link speed
    host-bound copy     t' = t                                (pageable, or under half the link's
                                                              rate: see host_bound_copy)
    device copy, memset t' = f + (t − f) · bw_src / bw_dst    (DtoD, Memset)
    peer copy (PtoP)    t' = f + (t − f) · peer_src / peer_dst  (the GPU-to-GPU path, NVLink or
                                                              PCIe, of the source's preset node and
                                                              the target system: peer_link_gbs),
                                                              and no less than its bytes over the
                                                              target pair's line rate;
                        t' = t with a GPU as target, or no preset node for the source, as the
                        collectives (no fabric to scale it by)
    collective          t' = t · comm(dst) / comm(src)        (kit.comm on both systems, with the
                                                               kind and nccl-tests size from the
                                                               nccl:* annotation, the job's ranks
                                                               as its group), and no less than its
                                                               bandwidth bound on dst (bytes x the
                                                               factor / line rate of the algorithm
                                                               that moves them fastest, no
                                                               latency: collective_ms), a physical
                                                               bound, so on its own system a
                                                               collective keeps its measured time

Where the trace names a collective's process group (newer PyTorch: record_param_comms' "Process
Group Ranks", "Src Rank"/"Dst Rank", "In msg nelems", "dtype"; kit.trace.comm_meta), kit.comm
prices it on that group's ranks as each system places them, a send or recv with its peer as one
transfer between the two ranks, a coalesced batch of sends and recvs (batch_isend_irecv's one
kernel) among its rank and their peers (kit.trace.comm_meta.coalesced_meta: a sendrecv, an
all-to-all where it sends to several), and at the size those fields give. Without them (the shared
PARAM and HTA traces have none) a collective runs over all the job's ranks and a send/recv is a
ring shift across them, as a note says.

With a GPU as target the collectives keep their measured times (no system to predict them on).
"""
from __future__ import annotations

import math
import re
from functools import lru_cache

from kit.errors import KitError
from kit.predict.roofline import host_link_gbs
from kit.trace.build import TraceGraph, job_world_size, rank_list
from kit.trace.comm_meta import enclosing, op_comm_metas, trace_group
from kit.trace.kineto import _gpu_key, int_or_none

# the CLI's and kit.api.replay_trace's spellings of the target and the source system, for messages
ON, FROM = "--on/on=", "--from/source="
KERNEL_FLOOR_MS = 0.002  # launch-to-retire floor of a tiny kernel on any recent GPU
# a GEMM-like kernel by its own name (before its template arguments: cuBLAS's gemv, dot, reduce,
# split-K reduce and cuBLASLt epilogue kernels carry "cublasGemvTensorStridedBatched" or
# "cublasLtEpilogue_t" there, and had been priced as GEMMs). "[a-z0-9]cudnn_<tile>" is cuDNN's
# implicit-GEMM convolution (cudnn_volta_scudnn_128x64_relu_..., h884cudnn_256x64_...): these had
# read as memory-bound, though AlexNet's conv1 on one (1,035 us on an A100, the step's longest
# kernel) does ~100 FLOP a byte of its input and output, 8x the A100's FP32 ridge (12.5), and
# they are 17% of the kernel time of PARAM's ResNet trace on an RTX 2080 Ti
# FlashAttention-2's kernels (flash_fwd_kernel, flash_fwd_splitkv_kernel,
# flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel; PyTorch's SDPA under pytorch_flash::) do their
# two GEMMs on the tensor cores: they had been GEMMs through the "cutlass::half_t" of their
# template arguments, and by their own name had read as memory-bound (an H100's 1 ms FP16
# attention on an A100-40GB: 2.15 ms by bandwidth, 3352 vs 1555 GB/s; 3.17 ms by the FP16 peaks,
# 989.4 vs 312 TFLOP/s)
# cuBLAS 12.8's Hopper/Blackwell GEMMs are nvjet_<types>_<tile>_... (no "gemm" in the name);
# rocBLAS/hipBLASLt's Tensile GEMMs are Cijk_<A layout>_<B layout>_<types>_MT<tile>_...; "conv"
# is a convolution, not "convert" (convert_indices_from_coo_to_csr, a sparse index pass, had
# read as a GEMM)
_GEMM = re.compile(r"gemm|cutlass|xmma|cublas|wgrad|dgrad|conv(?!ert)|mma"
                   r"|[a-z0-9]cudnn_(?:winograd_)?\d+x\d+|flash_(?:fwd|bwd)|nvjet_|Cijk_", re.I)
# ... less the kernels a GEMM's name covers that do no GEMM work: Winograd's data, filter, delta
# and output transforms (the sgemm between them is the GEMM; winogradWgradData4x4 and
# winogradWgradDelta4x4, 8% of that ResNet trace's kernel time, had been GEMMs where their
# forward twins winogradForwardData4x4 are not) and cuDNN's offset tables
# (cask_cudnn::computeWgradBOffsetsKernel)
# FlashAttention's helpers beside its GEMM kernels are element-wise passes: the backward's dO·O
# row sums (flash_bwd_dot_do_o_kernel) and dQ's FP32-to-16-bit conversion
# (flash_bwd_convert_dq_kernel), and the split-KV forward's combine (flash_fwd_splitkv_combine_kernel)
# cuBLAS's split-K reduction: the bare splitKreduce_kernel reads as none by its own name, but
# cuBLASLt's, void cublasLt::splitKreduce_kernel<...> (its FP16/BF16 GEMMs' split-K), has "cublas"
# in its namespace, and had stayed a GEMM
_NOT_GEMM = re.compile(r"winograd(?:Forward|Wgrad)(?:Data|Filter|Delta|Output)|Offsets"
                       r"|flash_bwd_(?:dot_do_o|convert_dq)|splitkv_combine|splitKreduce", re.I)
_FBGEMM = re.compile(r"fbgemm", re.I)  # the library's name says nothing of the kernel's kind
# FP8 (E4M3/E5M2) ones, checked first: their names also give the output's type
# (sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_..., cutlass3x_sm90_tensorop_gemm_e4m3_e4m3_f32_bf16_bf16_...)
_FP8 = re.compile(r"e4m3|e5m2|fp8|float8", re.I)
_TF32 = re.compile(r"tf32", re.I)  # cuBLAS/cuDNN TF32 tensor-core kernels (sm80_xmma_..._tf32f32_...)
# a tensor-op GEMM with the m16n8k8 (or k4) instruction and no 16-bit type in its name takes FP32
# data: TF32. HTA's call-stack trace runs a 2048x2048x256 FP32 aten::mm on
# cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4 in 45 us, 47.7 TFLOP/s, over an A100's
# 19.5 FP32 peak; it had read as FP16 ("tensorop", "1688"). FP16 ones name their type
# (turing_fp16_s1688gemm_fp16_..., cutlass_tensorop_s1688gemm_f16_...)
_TF32_MMA = re.compile(r"s168[48]gemm", re.I)
_16BIT = re.compile(r"fp16|f16|half|h\d{3,5}", re.I)
# BF16 ones (ampere_bf16_s16816gemm_bf16_..., cutlass_80_tensorop_bf16_...): a peak of their own,
# absent on Volta/Turing (which run them on the FP32 path) and half the FP16 one on an MI100
_BF16 = re.compile(r"bf16|bfloat16", re.I)
_HALF = re.compile(r"h884|h1688|h16816|hmma|fp16|half|bf16|f16|s1688|s16816|tensorop|884|1688", re.I)
# a Tensile kernel's types follow its layouts: input, output and compute type letters, then B
# for a beta term (Cijk_Ailk_Bljk_SB_MT64x64x8_...: FP32 with beta; HHS_BH: FP16 in and out,
# FP32 compute; BBS_BH: BF16; DB: FP64; F8..: FP8). Its name holds no "fp16" or "half"
_TENSILE_TYPES = re.compile(r"Cijk_A[a-z]+_B[a-z]+_([A-Z][A-Za-z0-9]*)_")
# an nvjet kernel's types (nvjet_[sm90_]<types>_<tile>_...) are letters, input first: h __half,
# t __nv_bfloat16, s float, q/r the two FP8 formats (one letter each for A and B). libcublasLt.so.12
# of nvidia-cublas-cu12 12.8.4.1 builds the names from a table of these codes (hss, tss, qqhsh,
# qqtst, qqsss, qrhsh, ..., rqtsr; hsh, tst and sss are tail-merged into qqhsh, qqtst, qqsss),
# beside the suffixes (_splitK, _coopA, _coopB, bz) the names carry, and instantiates
# nvjet_matmulAlgo for exactly these inputs: __half, __nv_bfloat16, and TypeList<__nv_fp8_e4m3,
# __nv_fp8_e5m2> for A and B (whose pairs qq, qr, rq leave out rr: cuBLASLt runs no E5M2 x E5M2
# GEMM). The table's one other entry, bsb, pairs with its one other instantiation (signed char
# inputs, CUBLAS_COMPUTE_32I): "b" is int8, priced by the catalog's dense INT8 tensor peaks
# (int8_tops). It had read as FP32: an H100 SXM int8 GEMM kept the FP32 ratio to an A100
# (66.9 / 19.5 = 3.43x slower), not the 1978.9 / 624 = 3.17x of their INT8 tensor peaks, and to an
# L4 66.9 / 30.3 = 2.21x, not 1978.9 / 242.5 = 8.16x.
# The kit's own H200 runs (measurements/h200-2026-12-04*/, torch 2.11.0+cu130: cuBLAS 13.0) use
# the same names: nvjet_sm90_tst_* in the bf16 runs, nvjet_sm90_hsh_* in the fp16 ones, and no nvjet
# kernel in the TF32 and FP32 ones (sm90_xmma_gemm_f32f32_tf32f32_*,
# cutlass_80_tensorop_s1688gemm_*, sm80_xmma_gemm_f32f32_f32f32_*, cutlass_80_simt_sgemm_*):
# "t" is BF16, not TF32. None of these letters is a dtype the other patterns read: "tst" and
# "hsh" had read as FP32, so a bf16 GEMM took the FP32 peaks' ratio (H100 to B200: 0.892x, not
# the 0.440x of 989.4 vs 2250 TFLOP/s)
_NVJET_TYPES = re.compile(r"nvjet_(?:sm\d+_)?([a-z]+)_\d")
_NVJET_DTYPE = {"h": "fp16", "t": "bf16", "q": "fp8", "r": "fp8", "b": "int8"}
# CUTLASS's int8 GEMMs. Its generator names a 2.x kernel cutlass_<opcode>_[<C type>_]<core>[_<A
# type>...]_<tile>..., the core being the accumulator's letter ("i": int32), the MMA shape and
# "gemm" ("spgemm" sparse); a 3.x one cutlass3x_sm<arch>_<opcode>_gemm_<A>_<B>_<accumulator>_<C>_
# <D>_...
# (nvidia-cutlass 4.2.0.0, cutlass_library/library.py ShortDataTypeNames and DataTypeNames,
# gemm_operation.py GemmOperation.core_name, extended_name, extended_name_3x, procedural_name).
# Its int8 GEMMs: cutlass_tensorop_i8816gemm_s8_256x128_64x2_tn_align16 (Turing, m8n8k16),
# cutlass_tensorop_s8_i16832gemm_s8_256x128_64x3_tn_align16 (Ampere, int8 out),
# cutlass_tensorop_i16864spgemm_s8_..., cutlass_tensorop_i16832gemm_s4_s8_... (an int4 A widened to
# the int8 MMA), cutlass3x_sm90_tensorop_gemm_s8_s8_s32_s8_s8_128x128x128_1x2x1_0_tnt_align16_...
# All had read as FP16 ("tensorop", "8816"), which gives the INT8 ratio only where both GPUs run
# INT8 at twice FP16 (H100 SXM to A100: 3.17 ms either way for 1 ms): an H100 SXM's 1 ms int8
# GEMM went to 5.98 ms on an RTX 4090 (989.4 / 165.2, its FP32-accumulate FP16), not the 2.99 of
# 1978.9 / 660.6 INT8 TOPS, and to 5.16 ms on an MI250X GCD, not 10.32 (its INT8 runs at its FP16
# rate, 191.5). Not int8: an int8 weight widened for a 16-bit MMA
# (cutlass_tensorop_h16816gemm_s8_f16_..., bf16_s16816gemm_s8_bf16_..., which run at the 16-bit
# peak), and the int4 and 1-bit ones (i16864gemm_s4, i168256xorgemm_b1), which read as before
_CUTLASS_INT8 = re.compile(r"_i\d+(?:sp)?gemm(?:_[su][48])*_[su]8(?!\d)|gemm_[su]8_[su]8_s32", re.I)


def _tensile_dtype(code: str) -> str:
    """The dtype of a Tensile kernel's type code (_TENSILE_TYPES): its input type's letter(s)."""
    if code.startswith(("F8", "B8")):
        return "fp8"
    return {"H": "fp16", "B": "bf16"}.get(code[0], "fp32")


_KIND = (("allreduce", "allreduce"), ("all_reduce", "allreduce"), ("allgather", "allgather"),
         ("all_gather", "allgather"), ("reducescatter", "reducescatter"),
         ("reduce_scatter", "reducescatter"), ("alltoall", "alltoall"), ("all_to_all", "alltoall"),
         ("sendrecv", "alltoall"), ("broadcast", "broadcast"))
# what an nccl:* annotation (ProcessGroupNCCL's profiling title: nccl:all_gather, nccl:_allgather_base,
# nccl:_reduce_scatter_base, nccl:send, nccl:recv, nccl:reduce, ...) runs, checked before the
# kernel's name, which cannot say: NCCL runs all-to-all and send/recv alike as SendRecv kernels
# (a pipeline's nccl:send of 16 MiB had been priced as an 8-rank all-to-all), and NCCL 2.19+'s
# ncclDevKernel_Generic any collective (read as an all-reduce: an 8-rank 8 MiB reduce-scatter
# measured 200 us on a DGX A100 went to 441 us on two a100x4-nvlink nodes, 384 as one). Spellings
# not listed (nccl:barrier, nccl:gather) leave the kernel's name to say
_ANNOTATION_KIND = _KIND[:-2] + (("send", "sendrecv"), ("recv", "sendrecv"),
                                 ("broadcast", "broadcast"), ("reduce", "reduce"))
_TYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "half": 2, "long": 8,
               "long int": 8, "int": 4, "bool": 1, "unsigned char": 1, "signed char": 1,
               "short int": 2, "short": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
               "c10::complex<float>": 8, "c10::complex<double>": 16}
# a host<->device copy measured under this fraction of its link's rate was paced by the host
# (staging, or per-copy latency), not by the link: host_bound_copy
HOST_BOUND_LINK_FRACTION = 0.5


def _own_name(name: str) -> str:
    """A kernel's own name: its demangled name before the template arguments and parameters
    ("void gemvNSP_kernel<float, ...>(...)" -> "gemvNSP_kernel")."""
    n = re.sub(r"^void\s+", "", name.replace("(anonymous namespace)", "").strip())
    return re.split(r"[<(]", n, maxsplit=1)[0]


def is_gemm(name: str) -> bool:
    """Whether a kernel is GEMM-like (its time set by the matrix peak), by its own name.
    fbgemm's embedding kernels are no GEMMs: the library's name holds "gemm"."""
    own = _FBGEMM.sub("", _own_name(name))
    return bool(_GEMM.search(own)) and not _NOT_GEMM.search(own)


def gemm_dtype(name: str) -> str:
    """The dtype whose peak a GEMM kernel ran at, read from its whole name (the types are often
    in its template arguments: cutlass::Kernel<cutlass_80_tensorop_s1688gemm_...>)."""
    tensile = _TENSILE_TYPES.search(name)
    if tensile:
        return _tensile_dtype(tensile.group(1))
    nvjet = _NVJET_TYPES.search(name)
    if nvjet and nvjet.group(1)[0] in _NVJET_DTYPE:  # an "s" (FP32 input) one: as before
        return _NVJET_DTYPE[nvjet.group(1)[0]]
    if _CUTLASS_INT8.search(name):
        return "int8"
    if _FP8.search(name):
        return "fp8"
    if _TF32.search(name):
        return "tf32"
    if _BF16.search(name):
        return "bf16"
    if _TF32_MMA.search(name) and not _16BIT.search(name):
        return "tf32"
    return "fp16" if _HALF.search(name) else "fp32"


def gemm_peak_tflops(gpu, dtype: str) -> float:
    """The peak a GEMM of dtype runs at on gpu, or on the path it takes there where the GPU lacks
    that dtype's peak: FP8 on its FP16 units (an FP8 model on a GPU without FP8 tensor cores keeps
    its weights in FP8 and does the math in FP16 after upcasting, as vLLM's weight-only FP8 Marlin
    kernels on Ampere do), anything else (and FP8 without FP16) on its FP32 path. int8: its dense
    INT8 tensor peak in TOPS (the catalog's int8_tops); where a GPU has none, its FP32 path, which
    transfer takes for both GPUs and says (int8_ratio)."""
    if dtype == "int8":
        return gpu.int8_tops or gpu.gemm_peak_tflops("fp32")
    for d in (dtype, "fp16") if dtype == "fp8" else (dtype,):
        peak = gpu.gemm_peak_tflops(d)
        if peak:
            return peak
    return gpu.gemm_peak_tflops("fp32")


def int8_ratio(src_gpu, dst_gpu) -> tuple[float, bool]:
    """(source over target peak for an int8 GEMM, whether both GPUs have an INT8 tensor peak).
    Where one lacks it (the Pascal and Volta GPUs: null int8_tops) the two are compared by
    their FP32 peaks, as cuBLAS's int8 GEMMs had been: a mixed INT8-over-FP32 ratio would credit the
    one GPU's tensor cores against the other's vector lanes."""
    if src_gpu.int8_tops and dst_gpu.int8_tops:
        return src_gpu.int8_tops / dst_gpu.int8_tops, True
    return gemm_peak_tflops(src_gpu, "fp32") / gemm_peak_tflops(dst_gpu, "fp32"), False


def above_floor_ms(measured_ms: float, ratio: float) -> float:
    """A kernel's time on the target: its first KERNEL_FLOOR_MS (launch to retire, which no
    target's bandwidth or peak shortens) kept, the rest scaled by ratio (source over target).
    GEMMs take it as the memory-bound kernels do: the smallest GEMMs measured are no faster
    than the floor (the shared DLRM trace's gemmk1_kernel, 3 us on a V100; the kit's H200 bf16
    decode runs, nvjet_sm90_tst_64x8_64x16_4x1_v_bz_bias_NNT, 152.1 us over 36 calls, 4.2 us
    each). Scaled whole by the peaks, an H100's 3 us bf16 GEMM had gone to 1.32 us on a
    B200 (x 989.4 / 2250), under the floor; now 2.44."""
    f = min(measured_ms, KERNEL_FLOOR_MS)
    return f + (measured_ms - f) * ratio


def peer_link_gbs(system, devices) -> tuple[float, bool]:
    """(the rate of one copy between two GPUs of the system's node, GB/s; whether it is the
    copy's own pair). A peer copy runs over the link between its two GPUs (kit.comm.topology's
    p2p_gbs: NVSwitch, the NVLink mesh's links of that pair, else the PCIe tree), not through
    HBM: devices is its Kineto (fromDevice, toDevice). Where the trace names no pair, or one
    past the node's GPUs, the mean over the node's pairs (on a DGX-1's hybrid cube mesh 1 or 2
    NVLinks, or PCIe)."""
    from kit.comm.topology import p2p_gbs

    n = system.gpus_per_node
    if devices is not None and max(devices) < n:
        return p2p_gbs(system, *devices), True
    pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
    return sum(p2p_gbs(system, a, b) for a, b in pairs) / len(pairs), False


def host_bound_copy(ge, link_gbs: float) -> bool:
    """Whether a host<->device copy's time was set by the host rather than by the PCIe link, so
    that a faster link (--on) leaves it unchanged.

    * Pageable memory ("Pageable" in Kineto's name, e.g. "Memcpy HtoD (Pageable -> Device)")
      cannot be DMA'd directly: the driver copies it through a pinned staging buffer with the
      CPU, chunk by chunk, and the DMA waits on that copy (CUDA C++ Best Practices Guide,
      "Pinned Memory"; the CUDA Runtime API's "API synchronization behavior": a pageable copy is
      staged and returns once the data is in the staging buffer). Its rate is the host's memcpy
      rate: PARAM's ResNet trace on an RTX 2080 Ti (PCIe 3, 16 GB/s) copies 77 MB pageable
      batches at 2.5-6 GB/s.
    * Any copy whose measured rate (Kineto's bytes / duration) is under HOST_BOUND_LINK_FRACTION
      of the source link's rate did not run at link speed either: staged, or so small that the
      copy's fixed latency (~1-2 µs) is its time, which a faster link does not shorten.

    A copy without a byte count, not named pageable, is taken as link-bound (as before)."""
    if "pageable" in ge.name.lower():
        return True
    nbytes = int_or_none(ge.bytes)
    if not nbytes or nbytes <= 0 or not ge.dur_us or ge.dur_us <= 0:
        return False
    return nbytes / ge.dur_us / 1e3 < HOST_BOUND_LINK_FRACTION * link_gbs  # bytes/µs -> GB/s


def coalesced_links(meta, rank: int) -> dict | None:
    """A coalesced batch's transfers by link: {(rank, peer) sorted: bytes}, the larger of what it
    sends to the peer and what it receives from it, or None where a send or recv has no
    readable size. The batch runs them concurrently (one NCCL kernel; NVLink, PCIe and NICs are
    full duplex), so it takes the longest, each priced as a 2-rank sendrecv over its pair's link.
    A ring shift's send to r + 1 and recv from r - 1 had been priced as a 3-rank ring shift,
    whose third hop (r + 1 -> r - 1) the batch does not run: on a DGX-1 V100, rank 2's 64 MiB
    send to 3 and recv from 1 (2 NVLinks each) took the 1-NVLink hop 3 -> 1, 2.90 ms, not 1.52."""
    by: dict = {}
    for m in meta.members:
        n = m.nbytes("sendrecv")
        if not n:
            return None
        key = (m.collective, tuple(sorted((rank, m.peer))))
        by[key] = by.get(key, 0) + n
    out: dict = {}  # a pair's two directions run at once: the larger prices it
    for (_, pair), n in sorted(by.items()):
        out[pair] = max(out.get(pair, 0), n)
    return out or None


def collective_ms(kind: str, nbytes, system, ranks, links=None) -> tuple[float, float]:
    """(kit.comm's time for a collective on system, its bandwidth bound: the time of its bytes
    alone, bytes x the algorithm's factor over the links' line rate (_least_bytes_ms), no latency,
    efficiency or floor; a collective
    cannot run faster than that on the system). links: a coalesced batch's transfers
    (coalesced_links), run at once: the longest of them prices it, and bounds it. The bound is
    the least of every algorithm kit.comm could run it with (kit.comm.algorithms.plans), not the
    one it picks for the time: across nodes a tree or hier-ring wins on latency yet moves more
    bytes than the ring, and its bytes alone had floored a 32-rank 16 MiB all-gather on
    dgx-h100-ib-ndr-x4 at 0.0745 ms, where the ring's bytes take 0.0511."""
    from kit.comm import predict_collective

    if links:
        rs = [(predict_collective("sendrecv", n, system, ranks=pair).time_ms,
               _least_bytes_ms("sendrecv", n, system, pair)) for pair, n in links.items()]
        return max(t for t, _ in rs), max(b for _, b in rs)
    return (predict_collective(kind, nbytes, system, ranks=ranks).time_ms,
            _least_bytes_ms(kind, nbytes, system, ranks))


def _least_bytes_ms(kind: str, nbytes, system, ranks) -> float:
    """The time of a collective's bytes alone over the algorithm that moves them fastest, at the
    links' line rates: nbytes x the least cost per byte of kit.comm's plans for it on
    line_rate_system(system) (no latency, no efficiency, no HBM term). A physical bound, which no
    run on the system beats: at kit.comm's achieved rates (its links' efficiency, 0.975 of an
    NVLink's 25 GB/s, and the HBM bytes it does not overlap) the bound sat above what the links
    can carry, so a trace replayed on its own system was clamped up from a time it measured there
    (a DGX-1 pair's 64 MiB sendrecv in 1.36 ms, 49.3 GB/s of its two NVLinks' 50 GB/s, to 1.48 ms:
    the derated 48.75 GB/s plus 1.375 HBM bytes a byte at 900 GB/s), and said to have run
    elsewhere. At line rate it is 1.34 ms (64 MiB / 50 GB/s), and the 1.36 ms is kept."""
    from kit.comm.algorithms import plans
    from kit.comm.conventions import canonical_kind
    from kit.comm.topology import resolve_group
    from kit.hardware.system import get_system

    s = line_rate_system(get_system(system))
    return min(p.us_per_byte for p in plans(s, canonical_kind(kind), resolve_group(s, ranks))) * nbytes / 1e3


@lru_cache(maxsize=64)
def line_rate_system(system):
    """The system with its links at line rate: the fabric's, PCIe's and network's efficiency 1,
    no HBM bytes charged beside the wire (software hbm_bytes_per_byte 0), and NVLS at the NVLink
    rate. kit.comm's NVLS rate is gpu_bw x nvls_efficiency over nvls_wire(n) = (1 + 1/n) /
    (1 + 1/8) (NVLS_CALIBRATED_RANKS), so line rate, (1 + 1/n) bytes a byte each way at gpu_bw, is
    nvls_efficiency = 1 / (1 + 1/8). Memoised: asked twice for every collective and peer copy of a
    trace, it had built a new System each time, which kit.comm then vetted and hashed afresh."""
    from dataclasses import replace

    from kit.comm.algorithms import NVLS_CALIBRATED_RANKS

    f = system.fabric
    nvls = 1.0 / (1.0 + 1.0 / NVLS_CALIBRATED_RANKS) if f.nvls else f.nvls_efficiency
    return replace(system, fabric=replace(f, efficiency=1.0, nvls_efficiency=nvls),
                   pcie=replace(system.pcie, efficiency=1.0),
                   network=replace(system.network, efficiency=1.0),
                   software=tuple((k, 0.0 if k == "hbm_bytes_per_byte" else v) for k, v in system.software))


def resolve_target(on):
    """(gpu, system or None) for a GPU or System name."""
    from kit.hardware import get_gpu
    from kit.hardware.system import get_system

    try:
        sys_ = get_system(on)
        return sys_.gpu, sys_
    except KitError as e:
        system_error = str(e)
    try:
        return get_gpu(on), None
    except KitError:
        from kit.hardware.system import list_systems

        if not system_error.startswith("unknown system"):  # a system name with a bad part (x0 nodes)
            raise KitError(f"{ON} {on!r}: {system_error}") from None
        raise KitError(f"{ON} {on!r}: not a GPU (see `kit gpus`; --gpu-file adds your own) nor a "
                       f"system (one of {', '.join(list_systems())})") from None


def source_system(gpu, world: int):
    """The default preset node for the trace's own GPU (e.g. V100 -> dgx1-v100), or None."""
    return pick_source_system(gpu, world)[0]


def pick_source_system(gpu, world: int, name: str | None = None):
    """(the preset node the trace ran on, how it was chosen), or (None, why none): the
    system named (--from), checked against the trace's GPU and ranks, else the first single-node
    preset with world x the trace's GPU. That default is a guess the trace does not settle: an A100
    job of 4 ranks or fewer reads as a100x4-nvlink (97.5 GB/s a GPU pair) whether it ran there or
    on a DGX A100 (292.5), so the choice, and the others that fit, are said (transfer's note). The
    trace's NCCL kernel names are not read for the topology; a peer copy faster than the source's
    link is said in transfer (peer_fast), not used to pick another."""
    from kit.hardware.system import get_system

    if name is not None:
        s = named_source(name, world, gpu)
        return s, f"named with {FROM}"
    fits = [x for x in _fits(gpu, world) if get_system(x).nodes == 1]
    if not fits:
        return None, None
    others = f"; also {', '.join(fits[1:])}: name the one it ran on with {FROM}" if fits[1:] else ""
    return get_system(fits[0]), (f"the first single-node preset with {world} x {gpu.key} (not read "
                                 f"from the trace{others})")


def named_source(name: str, world: int = 0, gpu=None):
    """The system --from names (KitError where it is none), checked against the job where world
    is given: that it holds world x the trace's GPU where gpu is given (pick_source_system, per
    rank), else world GPUs. transfer looks it up before any rank is read, and checks its size
    itself where no rank ran GPU work on a GPU to check it against (CPU-only ranks), so a
    misspelt or too small --from is not taken in silence; a rank's GPU, where there is one, is
    checked first (the message names that GPU and the presets that fit it: checked for size
    first, an 8-rank V100 job had been told "at least 8 GPUs" of a100x4-nvlink, not "8 x
    v100-sxm2-32gb (dgx1-v100)")."""
    from kit.hardware.system import get_system

    try:
        s = get_system(name)
    except KitError as e:
        raise KitError(f"{FROM} {name!r}: {e}") from None
    if gpu is not None and (s.gpu_key != gpu.key or s.world_size < world):
        fits = _fits(gpu, world)
        # with none that fits it had said "name a system of that GPU with at least 1 GPUs (no
        # preset has them)", as though one could be named
        how = (f"name a preset system with at least {world} x {gpu.key} ({', '.join(fits)})" if fits
               else f"no preset system has {world} or more x {gpu.key} (`kit systems` lists them; "
               f"the kit reads no system file): replay with a GPU as {ON} instead, where the "
               "collectives and peer copies keep their measured times")
        raise KitError(f"{FROM} {name!r}: {s.key} has {s.world_size} x {s.gpu_key}, but the trace "
                       f"ran {world} rank(s) on {gpu.key}; {how}")
    if s.world_size < world:
        raise KitError(f"{FROM} {name!r}: {s.key} has {s.world_size} x {s.gpu_key}, but the trace ran "
                       f"{world} rank(s); name a preset system with at least {world} GPUs (`kit "
                       "systems` lists them)")
    return s


def _not_recorded_on(source: str | None) -> str:
    """What a measured time faster than the source system's links says: the trace ran elsewhere.
    With --from given the system is the one it names, and naming it again is no remedy (the note
    had said "name its system with --from" to a user who had)."""
    if source is None:
        return f"the trace was not recorded there; name its system with {FROM}"
    return (f"the trace was not recorded there, though {FROM} {source!r} names it; name the system "
            "it ran on")


def _fits(gpu, world: int) -> list:
    """The presets of gpu with at least world GPUs."""
    from kit.hardware.system import get_system, list_systems

    return [n for n in list_systems() if (s := get_system(n)).gpu_key == gpu.key and s.world_size >= world]


def annotation_kind(annotation: str) -> str | None:
    """The kit.comm kind an nccl:* annotation names, or None where it names none of them."""
    a = annotation.lower().removeprefix("nccl:")
    return next((kind for needle, kind in _ANNOTATION_KIND if needle in a), None)


def _collective_kind(name: str, annotated: str | None = None) -> str:
    """The kit.comm kind of an NCCL kernel: annotated (its nccl:* annotation's kind) where given,
    else its name's, else all-reduce."""
    if annotated:
        return annotated
    n = name.lower()
    for needle, kind in _KIND:
        if needle in n:
            return kind
    return "allreduce"


def nccl_tests_bytes(kind: str, first_input_bytes: int, ranks: int) -> int:
    """The nccl-tests size (kit.comm.conventions) of a collective whose nccl:* annotation's first
    input is first_input_bytes: an all-gather's input is each rank's shard, its nccl-tests size
    the gathered total (x ranks); the others' first input is their size (a reduce-scatter's the
    whole input). An 8-rank all-gather of 1 MiB shards had been priced as one of 1 MiB in all,
    at 8x too few bytes: from a DGX A100, a 200 us one kept 200 us on a DGX H100 (both at the
    latency floor) and went to 179 on two a100x4-nvlink nodes, 175 and 384 for the 8 MiB it moves"""
    return first_input_bytes * ranks if kind == "allgather" else first_input_bytes


def _elements(shape):
    """The element count of one input of an nccl:* annotation ("Input Dims" [[d0, d1, ...], ...]),
    or None when it is no list of whole non-negative sizes: a malformed one had raised (a dict:
    KeyError; an Infinity: OverflowError) or read as one element, 4 bytes (a string)."""
    if not isinstance(shape, list):
        return None
    n = 1
    for d in shape:
        k = int_or_none(d)
        if k is None or k < 0 or (isinstance(d, float) and d != k):
            return None
        n *= k
    return n


def _input_bytes(dims, types):
    """The bytes of an nccl:* annotation's inputs, all of them: a coalesced collective
    (nccl:all_reduce_coalesced, nccl:all_gather_into_tensor_coalesced) lists each of its tensors
    as an input, and moves them all (its first alone had been its size: 3 gradients of 4 MiB
    read as one); the others have one input. None where one is malformed."""
    if not isinstance(dims, list) or not dims:
        return None
    types = types if isinstance(types, list) else []
    total = 0
    for k, shape in enumerate(dims):
        n = _elements(shape)
        if n is None:
            return None
        t = types[k] if k < len(types) and isinstance(types[k], str) else "float"
        total += n * _TYPE_BYTES.get(t, 4)
    return total


def _nccl_sizes(trace):
    """Sorted nccl:* annotations (start, end, tid, bytes or None, name) of a rank."""
    out = []
    for op in trace.cpu_ops:
        if op.name.startswith("nccl:") and op.dims:
            out.append((op.ts_us, op.ts_us + op.dur_us, op.tid, _input_bytes(op.dims, op.types), op.name))
    return out


def _size_of(sizes, starts, call):
    x = enclosing(sizes, starts, call)
    return (x[3], x[4]) if x else (None, None)


def _names_no_gpu(t) -> bool:
    return t.gpu_name is None or (isinstance(t.gpu_name, str) and not t.gpu_name.strip())


def _unnamed_gpu(traces) -> str | None:
    """The GPU for ranks that ran GPU work but name no GPU (no deviceProperties, as older
    profilers write): the one GPU the job's other ranks name, else KitError. Such a rank had
    been skipped, its kernels kept at their measured times under --on: an A100 rank's 1 ms
    sgemm step read 1.22 ms on an H100 (0.51 ms with the name)."""
    blind = [t for t in traces if t.gpu and _names_no_gpu(t)]
    if not blind:
        return None
    # by catalog key: 'Tesla V100-SXM2-32GB' and 'NVIDIA V100-SXM2-32GB ' are one GPU (as
    # load_kineto reads them); as two strings they had made this an error
    named = {_gpu_key(t.gpu_name): t.gpu_name.strip() for t in traces
             if isinstance(t.gpu_name, str) and t.gpu_name.strip()}
    if len(named) != 1:
        seen = f" (the others name {', '.join(sorted(named.values()))})" if named else ""
        raise KitError(f"{blind[0].source}: rank {blind[0].rank} ran GPU work but its trace names no "
                       f"GPU (no deviceProperties){seen}; {ON} needs the GPU it was recorded on to "
                       "rescale its kernels")
    return next(iter(named.values()))


def transfer(tg: TraceGraph, on, source: str | None = None) -> str:
    """Rescale the GPU op durations of tg.graph for the target; returns the target's description.
    source: the system the trace ran on (--from), else pick_source_system's default; which one and why
    go to tg.source_system and a note (pick_source_system)."""
    from kit.hardware import get_gpu

    dst_gpu, dst_sys = resolve_target(on)
    g = tg.graph
    # the job's size: its distributedInfo world_size when the files are some of its ranks (one
    # rank's trace of an 8-GPU job has 8-rank collectives, not a 1-rank local copy); build_graph
    # leaves the collectives of such an incomplete job unsynchronised, at the same size
    world = job_world_size(tg.traces)
    if dst_sys is not None and dst_sys.world_size < world:
        raise KitError(f"{ON} {on!r}: {dst_sys.world_size} GPUs, but the trace's job has {world} ranks")
    if source is not None and dst_sys is None:
        raise KitError(f"{FROM} {source!r} goes with a system as {ON}: with a GPU ({dst_gpu.key}) the "
                       "collectives and peer copies keep their measured times, and no source system is used")
    named = named_source(source) if source is not None else None  # a system at all
    kept = {}  # why collectives keep their measured times -> how many
    # a collective synchronised across ranks (kit.trace.build) moves one size on all of them:
    # a member without a readable nccl:* size takes the one its group's others give, where they
    # agree. It had kept its measured time while the others were rescaled, so one all-reduce
    # ended at different times on its ranks (on a DGX H100: 0.107 ms on rank 0, 0.130 on rank 1)
    own_bytes: dict = {}  # comm op -> its nccl:* size
    annotation: dict = {}  # comm op -> the kind its nccl:* annotation (or "Collective name") names
    metas = op_comm_metas(tg)  # comm op -> its process-group fields, where the trace has them
    for t in tg.traces:
        sizes = _nccl_sizes(t)
        starts = [x[0] for x in sizes]
        for op, ge, _, call in tg.gpu_ops.get(t.rank, []):
            if g.kind[op] != "comm":
                continue
            nbytes, name = _size_of(sizes, starts, call)
            meta = metas.get(op)
            kind = annotation_kind(name) if name else None
            if kind is None and meta is not None and meta.collective:
                kind = annotation_kind(meta.collective)
            if kind:
                annotation[op] = kind
            if nbytes:
                own_bytes[op] = nbytes
    group_bytes: dict = {}
    group_kind: dict = {}  # the kinds a synchronised group's annotations name (send and recv: one)
    for op, nbytes in own_bytes.items():
        if g.group[op] is not None:
            group_bytes.setdefault(g.group[op], set()).add(nbytes)
    for op, kind in annotation.items():
        if g.group[op] is not None:
            group_kind.setdefault(g.group[op], set()).add(kind)
    borrowed = 0
    placed = {"group": 0, "pair": 0, "coalesced": 0, "job": 0}  # collectives by the ranks priced on
    unread: dict = {}  # why a collective's process-group fields were not used -> how many
    host_bound = {}  # rank -> host<->device copies kept at their measured durations
    no_int8 = {}  # source GPU -> int8 GEMMs scaled by FP32 peaks (a GPU without an INT8 peak)
    peer_kept = {}  # why peer (PtoP) copies keep their measured durations -> how many
    peer_scaled = {}  # (source preset, whether by the copies' own GPU pair) -> peer copies scaled
    peer_fast = {}  # source preset -> (peer copies faster than its link, fastest GB/s, its link's)
    comm_fast = {}  # source preset -> (collectives faster than its bandwidth bound, worst bound / measured)
    unnamed = _unnamed_gpu(tg.traces)
    chosen: dict = {}  # (source preset, how it was chosen) -> ranks
    for t in tg.traces:
        name = unnamed if t.gpu and _names_no_gpu(t) else t.gpu_name
        if not name:
            continue
        try:
            src_gpu = get_gpu(name)
        except KitError as e:
            raise KitError(f"{t.source}: the trace's GPU is not in the catalog ({e}); give its "
                           "datasheet numbers with --gpu-file") from None
        src_sys, how = pick_source_system(src_gpu, world, source) if dst_sys is not None else (None, None)
        if src_sys is not None:
            chosen.setdefault((src_sys.key, how), []).append(t.rank)
        for op, ge, _, call in tg.gpu_ops.get(t.rank, []):
            d = g.dur_ms[op]
            kind = g.kind[op]
            if kind == "comm":
                why = (f"{ON} names a GPU, not a system to predict them on" if dst_sys is None else
                       f"no single-node preset has {world} x {src_gpu.key} to rescale them from"
                       if src_sys is None else None)
                kinds = group_kind.get(g.group[op], set())
                ck = _collective_kind(ge.name, annotation.get(op) or
                                      (next(iter(kinds)) if len(kinds) == 1 else None))
                meta = metas.get(op)
                ranks, not_used = trace_group(meta, t.rank, world)
                if ranks is not None and len(ranks) == 2 and meta.is_p2p:
                    ck = "sendrecv"  # one transfer between the two: a 2-rank ring shift
                elif ranks is not None and meta.members:
                    ck = meta.coalesced_kind
                where = ("job" if ranks is None else "coalesced" if meta.members
                         else "pair" if len(ranks) == 2 and meta.is_p2p else "group")
                ranks = ranks if ranks is not None else list(range(world))
                # the fields' size is already nccl-tests' (CommMeta.nbytes); an nccl:* input is not
                nbytes = None if why else meta.nbytes(ck) if meta is not None else None
                if why is None and not nbytes and own_bytes.get(op):
                    nbytes = nccl_tests_bytes(ck, own_bytes[op], len(ranks))
                if why is None and not nbytes:
                    shared = group_bytes.get(g.group[op], ())
                    if len(shared) == 1:
                        nbytes = nccl_tests_bytes(ck, next(iter(shared)), len(ranks))
                        borrowed += 1
                    elif meta is not None:  # it had said only "no nccl:* annotation", of a
                        # trace whose fields give a size, but an unreadable one
                        why = ("no readable size: its 'In msg nelems'/'Out msg nelems' x 'dtype' "
                               "give none, nor does an nccl:* annotation")
                    else:
                        why = "no nccl:* annotation with a readable size"
                if why:
                    kept[why] = kept.get(why, 0) + 1
                    continue
                placed[where] += 1
                if not_used:
                    unread[not_used] = unread.get(not_used, 0) + 1
                links = coalesced_links(meta, t.rank) if where == "coalesced" and ck == "sendrecv" else None
                (a, a_bound), (b, b_bound) = (collective_ms(ck, nbytes, x, ranks, links)
                                              for x in (src_sys, dst_sys))
                if d < a_bound:  # faster than the source's links carry its bytes: not recorded there
                    n, worst = comm_fast.get(src_sys.key, (0, 1.0))
                    comm_fast[src_sys.key] = (n + 1, max(worst, a_bound / d) if d > 0 else math.inf)
                # no faster than the target's links carry its bytes: a DGX-1's 64 MiB ring shift
                # measured in 0.3 ms (224 GB/s over 48.75 GB/s links) had kept 0.3 ms x b / a
                g.dur_ms[op] = max(d * b / a, b_bound)
            elif kind == "memcpy":
                if "HtoD" in ge.name or "DtoH" in ge.name:
                    # one table with kit op's copies (a gen past 6 had read as gen 3), and a
                    # GH200's NVLink-C2C where the catalog gives it, not PCIe
                    link_src, link_dst = host_link_gbs(src_gpu), host_link_gbs(dst_gpu)
                    if host_bound_copy(ge, link_src):  # the host is unchanged by --on ...
                        host_bound[t.rank] = host_bound.get(t.rank, 0) + 1
                        nbytes = int_or_none(ge.bytes)  # ... but a slower link still binds
                        if nbytes and nbytes > 0:
                            g.dur_ms[op] = max(d, nbytes / (link_dst * 1e9) * 1e3)
                        continue
                    g.dur_ms[op] = d * link_src / link_dst
                elif "PtoP" in ge.name:  # "Memcpy PtoP (Device -> Device)": over NVLink or PCIe.
                    # By HBM bandwidth, a DGX-1 V100's 1 ms copy between two GPUs with 2 NVLinks
                    # (48.75 GB/s) had gone to 0.27 ms on a DGX H100 (900 vs 3352 GB/s of HBM),
                    # not the 0.11 of its NVSwitch (438.75 GB/s)
                    if dst_sys is None or src_sys is None:
                        why = (f"{ON} names a GPU, not a system with a GPU-to-GPU fabric"
                               if dst_sys is None else f"no single-node preset has {world} x "
                               f"{src_gpu.key} to rescale them from")
                        peer_kept[why] = peer_kept.get(why, 0) + 1
                        continue
                    (a, own_a), (b, own_b) = (peer_link_gbs(x, ge.peer) for x in (src_sys, dst_sys))
                    how = (src_sys.key, own_a and own_b)  # by the copy's own pair on both, or the mean
                    peer_scaled[how] = peer_scaled.get(how, 0) + 1
                    g.dur_ms[op] = above_floor_ms(d, a / b)
                    nbytes = int_or_none(ge.bytes)
                    nbytes = nbytes if nbytes and nbytes > 0 and ge.dur_us and ge.dur_us > 0 else None
                    # the bounds at the links' line rate (as the collectives'): at the achieved
                    # rate (0.975 of NVLink's) a copy replayed on its own system had been clamped
                    # up from its measured time (a100x4-nvlink's pair 0-1, 64 MiB at 99 GB/s:
                    # 0.678 ms to 0.688) and said not to have run there
                    line_a, line_b = (peer_link_gbs(line_rate_system(x), ge.peer)[0] for x in (src_sys, dst_sys))
                    if own_a and nbytes and nbytes / ge.dur_us / 1e3 > line_a:  # bytes/us -> GB/s
                        # faster than the source's link carries: the trace did not run there (an
                        # A100's 64 MiB in 0.3 ms, 224 GB/s, over a100x4-nvlink's 100), and scaled
                        # by its link the copy had beaten the target's own (0.068 ms on a DGX H100,
                        # 984 GB/s over 450)
                        n, top, link = peer_fast.get(src_sys.key, (0, 0.0, line_a))
                        rate = nbytes / ge.dur_us / 1e3
                        peer_fast[src_sys.key] = (n + 1, *max((top, link), (rate, line_a)))
                    if own_b and nbytes:  # no faster than the target's own link
                        g.dur_ms[op] = max(g.dur_ms[op], nbytes / (line_b * 1e9) * 1e3)
                else:  # device-side copies and memsets: the floor as a kernel's (above_floor_ms).
                    # PARAM's ResNet trace (RTX 2080 Ti) copies 256 B to 147 KB DtoD in 2-3 us
                    # (48 of its 62 DtoD copies) and sets 128 B to 1.2 MB in 0-3 us (332 of its
                    # 362 memsets; 37,632 B in 2 us: 19 GB/s of its 616): the op's fixed cost.
                    # Scaled whole, a 2 us one had gone to 0.37 us on an H100; the V100 DLRM
                    # trace's 1 us memsets of 16 bytes to 0.27
                    g.dur_ms[op] = above_floor_ms(d, src_gpu.mem_bw_gbs / dst_gpu.mem_bw_gbs)
            elif is_gemm(ge.name):
                # it ran at the source's peak for its dtype; a target without that peak runs it on
                # the path gemm_peak_tflops says (TF32 taken as FP32 had made an A100 TF32 GEMM
                # 1.24x slower on a V100, not the 9.9x of 156 TF32 vs 15.7 FP32 TFLOP/s; FP8 taken
                # as FP32 had made an H100 FP8 GEMM 3.4x slower on an A100 (66.9 / 19.5 FP32),
                # not the 6.3x of 1978.9 FP8 vs 312 FP16)
                dtype = gemm_dtype(ge.name)
                if dtype == "int8":
                    ratio, both = int8_ratio(src_gpu, dst_gpu)
                    if not both:
                        no_int8[src_gpu] = no_int8.get(src_gpu, 0) + 1
                else:
                    ratio = gemm_peak_tflops(src_gpu, dtype) / gemm_peak_tflops(dst_gpu, dtype)
                g.dur_ms[op] = above_floor_ms(d, ratio)
            else:
                g.dur_ms[op] = above_floor_ms(d, src_gpu.mem_bw_gbs / dst_gpu.mem_bw_gbs)
    if named is not None and not chosen:  # no rank to check it against: it had gone unsaid
        named_source(source, world)  # its size, at least
        tg.notes.append(f"{FROM} {source!r} ({named.key}, {named.world_size} x {named.gpu_key}) is not "
                        "checked against the trace's GPU nor used: no rank ran GPU work on a GPU it "
                        "names, so nothing measured there is rescaled")
    tg.source_system = ([{"system": k, "ranks": r, "chosen": how} for (k, how), r in chosen.items()]
                        if dst_sys is not None else None)
    tg.notes += [f"source system {k} (rank{'s' if len(r) > 1 else ''} {rank_list(r)}): {how}; it prices "
                 "the collectives and peer copies measured there" for (k, how), r in chosen.items()]
    if unnamed:
        blind = [t.rank for t in tg.traces if t.gpu and _names_no_gpu(t)]
        tg.notes.append(f"rank{'s' if len(blind) > 1 else ''} {rank_list(blind)} name no GPU (no "
                        f"deviceProperties): taken as {unnamed}, the GPU the other ranks name")
    tg.notes += [f"{n} collective(s) keep their measured times: {why}" for why, n in kept.items()]
    named = [f"{placed['group']} collective(s) priced on the process group their trace names "
             "('Process Group Ranks')" if placed["group"] else "",
             f"{placed['pair']} send/recv as one transfer between their two ranks ('Src Rank', "
             "'Dst Rank')" if placed["pair"] else "",
             f"{placed['coalesced']} coalesced send/recv batch(es) (one kernel for several sends and "
             "recvs: batch_isend_irecv) among their rank and the peers of the sends and recvs "
             "recorded before their launch" if placed["coalesced"] else ""]
    if any(named):
        tg.notes.append("; ".join(x for x in named if x))
    if placed["job"] and world > 1:
        tg.notes.append(f"{placed['job']} collective(s) priced over all the job's {world} ranks as their "
                        "group (send/recv as a ring shift across them): the trace names no process "
                        "group for them (PyTorch's record_param_comms 'Process Group Ranks')")
    tg.notes += [f"{n} collective(s) do not use their process-group fields: {why}" for why, n in unread.items()]
    if borrowed:
        tg.notes.append(f"{borrowed} collective(s) without a readable nccl:* size take the size the "
                        "other ranks of their group give")
    if host_bound:
        n, where = sum(host_bound.values()), rank_list(host_bound)
        tg.notes.append(f"{n} host-bound host<->device cop{'ies' if n > 1 else 'y'} (pageable, or under "
                        f"{HOST_BOUND_LINK_FRACTION:.0%} of the PCIe link's rate; rank"
                        f"{'s' if len(host_bound) > 1 else ''} {where}) keep the measured duration: the "
                        "host sets it, not the link")
    tg.notes += [f"{n} peer-to-peer (PtoP) cop{'ies' if n > 1 else 'y'} keep their measured times: "
                 f"{why}" for why, n in peer_kept.items()]
    for (src_key, own), n in peer_scaled.items():
        tg.notes.append(f"{n} peer-to-peer (PtoP) cop{'ies' if n > 1 else 'y'} scaled by the GPU-to-GPU "
                        f"link of {src_key} to {dst_sys.key} ("
                        + ("each copy's own pair, Kineto's fromDevice/toDevice)" if own else
                           "the mean over each node's GPU pairs: the trace names no pair, or one "
                           "past a node's GPUs)"))
    for src_key, (n, top, link) in peer_fast.items():
        tg.notes.append(f"{n} peer-to-peer (PtoP) cop{'ies' if n > 1 else 'y'} ran faster than {src_key}'s "
                        f"link between their GPUs carries (up to {top:,.1f} GB/s over {link:,.2f}): "
                        f"{_not_recorded_on(source)}. On {dst_sys.key} no copy is faster than its own "
                        "pair's link")
    for src_key, (n, worst) in comm_fast.items():
        tg.notes.append(f"{n} collective(s) ran faster than {src_key}'s links carry their bytes (kit.comm's "
                        f"bandwidth bound, bytes x algorithm factor over the links' line rate, no latency: up to "
                        f"{worst:,.2f}x under it): {_not_recorded_on(source)}. On {dst_sys.key} none is "
                        "priced under its own bound")
    for src, n in no_int8.items():
        lacking = " and ".join(dict.fromkeys(x.key for x in (src, dst_gpu) if not x.int8_tops))
        tg.notes.append(f"{n} int8 GEMM(s) ({src.key} to {dst_gpu.key}) scaled by the FP32 peaks: the "
                        f"catalog gives {lacking} no INT8 tensor peak (int8_tops)")
    return dst_sys.key if dst_sys is not None else dst_gpu.key
