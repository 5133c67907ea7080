"""Elementwise aten ops as kit ops: the read streams of their inputs, whether PyTorch can take
its vectorized kernel (TensorIterator's rules), and the cheap kernels some pow exponents run.
kit.workload.mapping.map_op calls these for every op in its ELEMENTWISE table."""
from __future__ import annotations

import torch

from kit.ops import Elementwise
from kit.workload.kernels import Derived


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def unique_numel(t: torch.Tensor) -> int:
    """The elements of memory t reads: its numel less the repeats of its expanded dims (stride
    0: x.expand(...), a broadcast view), each of which holds one element's worth of memory."""
    if t.numel() == 0:
        return 0
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= int(size)
    return n


def unique_nbytes(t: torch.Tensor) -> int:
    """The bytes of memory t reads (unique_numel: an expanded view is the tensor it was
    expanded from)."""
    return unique_numel(t) * t.element_size()


# pow with these scalar exponents does not run powf: PyTorch's CUDA pow kernel takes sqrt, rsqrt
# and reciprocal for 0.5, -0.5 and -1, and multiplies for 2, 3 and -2 (x*x, x*x*x, 1/(x*x):
# aten/src/ATen/native/cuda/PowKernel.cu); GPT-2's GELU cubes its input so
# (exponents 0 and 1 are a fill and a copy: aten/src/ATen/native/Pow.cpp)
POW_FAST = {2.0: "square", 3.0: "mul", -2.0: "div", 0.5: "sqrt", -0.5: "rsqrt", -1.0: "reciprocal",
            0.0: "fill", 1.0: "copy"}


def _pow_kind(args) -> str:
    """The kind of a pow(tensor, exponent): a cheap kernel for an exponent in POW_FAST given as a
    number or as a 0-dim CPU tensor (its value is known at capture; CUDA takes the scalar path)."""
    exp = args[1] if len(args) > 1 and isinstance(args[0], torch.Tensor) else None
    if isinstance(exp, torch.Tensor) and exp.dim() == 0 and exp.device.type == "cpu":
        exp = exp.item()
    if isinstance(exp, (int, float)) and not isinstance(exp, bool):
        return POW_FAST.get(float(exp), "pow")
    return "pow"


BROADCAST_STREAM_BYTES = 2 * 2**20  # a broadcast operand this large is re-read from DRAM


def input_streams(ins, lead) -> float:
    """How many output-sized read streams an elementwise kernel's inputs amount to.

    A full-size input is one stream, weighted by its element size against the output's (a bool
    mask read by a fp32 kernel is a quarter stream). A broadcast operand (smaller than the output,
    not a scalar) is re-read once per output element: it stays on chip when small (a bias, a
    BERT padding mask row) but streams from DRAM when it is larger than the L2 slice it competes
    for (GPT-2's position embeddings broadcast over the batch, OPT's (b, 1, s, s) mask broadcast
    over heads): NeuSight's per-node labels on P4, T4 and V100 time such adds like two-input adds.
    An expanded view (x.expand(...): stride 0) is the broadcast operand it was expanded from:
    its unique elements (unique_numel), not its numel, decide which.
    """
    out_size = max(lead.element_size(), 1)
    streams = 0.0
    for t in ins:
        n, size = unique_numel(t), unique_nbytes(t)
        if n <= 1:
            continue
        if n >= lead.numel() or size >= BROADCAST_STREAM_BYTES:
            streams += t.element_size() / out_size
        elif size >= 0.01 * nbytes(lead):  # kept on chip: read from DRAM once (a bias
            streams += size / max(nbytes(lead), 1)  # row is too small to count)
    return streams


def _layout(t: torch.Tensor) -> tuple:
    """t's (size, stride) pairs, leaving out dims of size 1 (their stride is never used)."""
    return tuple((int(s), int(st)) for s, st in zip(t.shape, t.stride()) if s != 1)


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill one block of memory with no gap or overlap, in some order of
    its dims (contiguous, or a permutation of a contiguous tensor: a transpose, channels-last)."""
    expect = 1
    for size, stride in sorted(_layout(t), key=lambda d: d[1]):
        if stride != expect:
            return False
        expect *= size
    return True


def vectorizable(ins, lead, cpu_scalars: bool = True) -> bool:
    """Whether PyTorch's CUDA elementwise loop can take its vectorized kernel. TensorIterator
    orders and merges the dims of the output and every input it reads; the loop is vectorized
    when they merge into one run every operand walks with unit stride: each input has the
    output's shape and the output's strides, and the output is dense (contiguous, or a
    transpose or channels-last layout that all of them share). A broadcast input (a bias, a
    mask over heads, a 0-dim tensor on the device such as HF's torch.tensor(min, device=...))
    or one laid out otherwise (a permute's copy) sends it to the generic kernel, which
    computes each element's offsets. A 0-dim CPU tensor is passed as a scalar and does not
    (cpu_scalars; torch.where copies one to the device, where it is a broadcast input)."""
    if not _dense(lead):
        return False
    layout = _layout(lead)
    for t in ins:
        if cpu_scalars and t.dim() == 0 and t.device.type == "cpu":
            continue
        if tuple(t.shape) != tuple(lead.shape) or _layout(t) != layout:
            return False
    return True


# Copies CUDA runs with a kernel of their own that computes each element's source offset, one
# element a thread, never TensorIterator's vectorized loop, however contiguous the tensor: a
# one-dim roll (torch.roll on CUDA, aten/src/ATen/native/cuda/TensorTransformations.cu:
# roll_cuda_kernel takes each linear index's roll-dim index with a 64-bit % and / and loads
# from the shifted offset; the CPU kernel, by contrast, is a cat of two narrow()s). Priced at
# the generic loop's rate (kit.workload.kernel_times.GENERIC_LOOP_ELEMS_PER_SM_CLOCK), the
# kernel nearest it the kit has measured: a lower bound, as its two 64-bit divisions an
# element cost more than the generic loop's offset arithmetic (not timed on a GPU here).
OFFSET_COPIES = {"roll"}


def _elementwise(kind: str, ins, outs, lead, dtype: str, mult: float, cpu_scalars: bool = True,
                 generic: bool = False):
    """One elementwise pass over lead's elements. An element wider than the kit dtype (mult:
    int64 or float64 as 2 fp32 words) counts as mult elements, so the learned predictors see
    the bytes as one pass over them (a Derived of mult passes would carry mult fixed costs).
    The generic loop's element count then counts such an element mult times: an overestimate
    kept for these rare ops (position ids, masks). generic: a kernel that computes every
    element's offset whatever the layout (OFFSET_COPIES), never vectorized."""
    numel = max(1, int(lead.numel() * mult))
    if kind == "copy" and len(ins) > 1:  # cat/stack: read every input once, write the output
        # PyTorch's cat kernel streams contiguous inputs; a strided one (rotate_half's halves
        # of q and k) takes its strided variant (CatArrayBatchedCopy with stride metadata, or
        # a copy_ per input past 4 dims), which computes each element's offsets: on the H200
        # llama3-8b's ran at ~225 G elements/s (measurements/h200-2026-12-04, model_steps)
        return Elementwise("copy", numel, dtype, inputs=1, vectorized=all(t.is_contiguous() for t in ins))
    if kind in ("copy", "cast") and len(ins) == 1 and unique_numel(ins[0]) < ins[0].numel():
        # a copy of an expanded view (expand(...).contiguous(), HF's repeat_kv): it writes the
        # output and reads the source's own elements once, each repeat of one close behind the
        # last (in L2), not an output-sized read
        streams, vectorized = unique_nbytes(ins[0]) / max(nbytes(lead), 1), False
    elif kind == "fill":  # a fill reads nothing: vectorized when its output is dense, as any
        # TensorIterator loop (fill_ on a strided view, y[:, ::2], takes the generic loop); a
        # 0-dim value on the device is copied in (fill_(Tensor) calls self.copy_(value), Fill.cpp)
        streams, vectorized = 0.0, vectorizable([t for t in ins if t.dim() == 0], lead, cpu_scalars)
    else:
        streams, vectorized = input_streams(ins, lead), vectorizable(ins, lead, cpu_scalars)
    n = max(1, round(streams))
    op = Elementwise(kind, numel, dtype, inputs=n, vectorized=vectorized and not generic)
    if abs(streams - n) < 1e-6:
        return op
    # narrower inputs (a bool mask), or none read from DRAM (a fill, scalar or on-chip inputs:
    # a write alone, half a one-input pass): the learned n-input pass scaled by the bytes moved
    return Derived("elementwise", (op,), pass_share(streams, n), f"{kind} ({streams:g} input streams)")


def pass_share(streams: float, inputs: int) -> float:
    """The share of a learned `inputs`-input elementwise pass (inputs read, one output written)
    that an op reading `streams` input streams moves: a fill (0 streams) is half a one-input pass."""
    return (streams + 1) / (inputs + 1)


# torch's _foreach_* ops and fused optimizers run multi_tensor_apply
# (aten/src/ATen/native/cuda/MultiTensorApply.cuh): each tensor is cut into chunks of 65,536
# elements, one thread block a chunk, and a kernel is launched whenever its metadata is full: at
# MTA_MAX_BLOCKS chunks, or at MTA_MAX_TENSORS[depth - 1] tensors (depth: the tensor lists the
# kernel walks, an out-of-place op's output list among them). The limits are those of a build for
# CUDA 13, the project's measured stack (torch 2.11.0+cu130; a CUDA 12 build takes 320 blocks and
# 110, 64, 48, 36, 30 tensors). Counted as a kernel per 110 tensors, llama3-8b's 291 parameters
# (8.03 B elements, 122,593 chunks) had made 3 kernels of each AdamW foreach op where torch
# launches 55, and GPT-2's 148 (124 M elements) 2 where it launches 1. The table is a compile-time
# choice (CUDART_VERSION >= 13000, not ROCm) and the graph is captured once for every GPU, so
# GPUs no CUDA 13 build runs on (CUDA 13 dropped Pascal and Volta: the P4, P100, V100) and AMD's
# (ROCm builds) had been given these counts too, where their builds launch the 4 KB table's:
# 384 for llama3-8b, 7 for GPT-2. So a foreach node whose count differs between the two tables
# carries both (kernels.PerBuild), and the single-GPU pricing takes the one of the GPU's build
# (kernels.mta_build; kit.workload.iteration): llama3-8b's fp32 AdamW step on a V100, 440 ->
# 3,072 launches, 827 -> 794 ms (each launch at its own size, its own floor shed). Each launch is priced at its share of the elements
# (mapping._one_launch), so the count moves such a step's time by the rate at a launch's size
# and the host's issue of each launch, not by a dispatch floor shed a launch.
MTA_CHUNK_ELEMS = 65536
MTA_MAX_BLOCKS = 2240
MTA_MAX_TENSORS = (770, 448, 336, 252, 210)
MTA_MAX_TENSORS_SCALARLIST = (672, 448, 336, 252, 210)  # a list of scalars, one a tensor, too
# the other branch of that #if (CUDA < 13, and every ROCm build: `!defined(USE_ROCM)` keeps HIP
# off the larger table), as torch 2.13's header has it
MTA_LEGACY_MAX_BLOCKS = 320
MTA_LEGACY_MAX_TENSORS = (110, 64, 48, 36, 30)
MTA_LEGACY_MAX_TENSORS_SCALARLIST = (96, 64, 48, 36, 30)


def mta_launches(numels, depth: int, scalar_list: bool = False, build: str = "cuda13") -> int:
    """The kernels multi_tensor_apply launches over tensors of `numels` elements (its loop, one
    tensor at a time: the chunks of a tensor fill the blocks, and a launch mid-tensor carries the
    tensor into the next launch; an empty tensor is skipped), with a build's table (kernels.mta_build)."""
    legacy = build == "legacy"
    if legacy:
        table = MTA_LEGACY_MAX_TENSORS_SCALARLIST if scalar_list else MTA_LEGACY_MAX_TENSORS
    else:
        table = MTA_MAX_TENSORS_SCALARLIST if scalar_list else MTA_MAX_TENSORS
    max_blocks = MTA_LEGACY_MAX_BLOCKS if legacy else MTA_MAX_BLOCKS
    max_tensors = table[min(max(depth, 1), len(table)) - 1]
    launches = blocks = held = 0
    for n in numels:
        if n <= 0:
            continue
        held += 1
        chunks = -(-int(n) // MTA_CHUNK_ELEMS)
        full, blocks = divmod(blocks + chunks, max_blocks)
        launches += full
        if full and blocks == 0:  # the last chunk filled a launch: the tensor is done with it
            held = 0
            continue
        if full:  # the tensor's remaining chunks go on in a new launch
            held = 1
        if held == max_tensors:  # its last chunk filled the tensor slots
            launches, blocks, held = launches + 1, 0, 0
    return launches + (blocks > 0)
