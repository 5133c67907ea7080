"""Kernels that kit.ops has no class for, expressed through kit.ops so any predictor can cost them.

A `Derived` kernel is `scale × (sum of its parts)`: the parts are ordinary kit ops that a
predictor knows (Attention, Elementwise, Gemm, ...), the scale turns them into the kernel at hand.
Examples:
* attention backward = ATTENTION_BWD_SCALE (2.8) × attention forward (see below);
* a reduction, a softmax backward or an unknown op = a memory-bound copy moving the same bytes;
* a convolution backward = two GEMMs (grad input, grad weight).

A `Cheapest` kernel is one of several ways to compute the same result, as a library picks an
algorithm (cuDNN: an implicit GEMM or Winograd for a 3x3 convolution): it costs the fastest
option on the GPU at hand (kit.workload.iteration), and reports the FLOPs and bytes of the
first, nominal one. A `Slowest` kernel (a Cheapest subclass) is bound by each of its options
at once and costs the slowest; it may also sit among a Derived's parts (leaf_options).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from kit.ops import copy_of  # noqa: F401 (re-exported: the kit's mappings import it from here)

# A fused attention's backward takes this many times its forward. It does 5 matmuls to the
# forward's 2, 2.5x the FLOPs (FlashAttention-2, Dao 2023, sec. 3.2), and runs at a lower share
# of the peak than the forward (that paper's sec. 4.1 benchmarks). On the project's H200 (cuDNN's
# sm90 flash kernels, measurements/h200-2026-12-04-b/session/attention_bf16.jsonl) the backward
# took 2.79x the forward's kernel time, median over 113 shapes (2.7-3.0 by head size and mask).
ATTENTION_BWD_SCALE = 2.8
ATTENTION_BWD_FLOPS = 2.5  # its FLOPs, the 5 matmuls to the forward's 2 (not its time's 2.8)


@dataclass(frozen=True)
class Derived:
    """A kernel costed as scale × sum(parts). flops and bytes follow the same rule, or for
    FLOPs flops_scale where the work scales otherwise than the time (an attention backward)."""

    op_class: str
    parts: tuple
    scale: float = 1.0
    label: str = ""  # what it is, for reports ("attention backward", "aten.sort.default")
    flops_scale: float | None = None

    @property
    def dtype(self) -> str:
        return getattr(self.parts[0], "dtype", "fp32")

    @property
    def flops(self) -> float:
        scale = self.scale if self.flops_scale is None else self.flops_scale
        return scale * sum(p.flops for p in self.parts)

    @property
    def bytes(self) -> float:
        return self.scale * sum(p.bytes for p in self.parts)


@dataclass(frozen=True)
class PerBuild(Derived):
    """A Derived whose launches depend on the torch build the GPU runs (a _foreach_* op or fused
    optimizer: multi_tensor_apply's tables, mta_build): itself as a CUDA 13 build runs it, and
    legacy_op in legacy_kernels launches as a CUDA 12 or ROCm build does. The single-GPU
    pricing (kit.workload.iteration) takes the GPU's (for_build); elsewhere it is itself."""

    legacy_op: object = None
    legacy_kernels: int = 1


# NVIDIA architectures CUDA 13 no longer builds for (it supports compute capability 7.5 up)
PRE_CUDA13_ARCHS = frozenset({"kepler", "maxwell", "pascal", "volta"})


def mta_build(gpu) -> str:
    """Which multi_tensor_apply table the torch build a GPU runs uses: "legacy" (a ROCm build, or
    a CUDA 12 one on an architecture CUDA 13 dropped) or "cuda13" (every other NVIDIA GPU)."""
    vendor, arch = str(getattr(gpu, "vendor", "")).lower(), str(getattr(gpu, "arch", "")).lower()
    return "legacy" if vendor != "nvidia" or arch in PRE_CUDA13_ARCHS else "cuda13"


def for_build(op, kernels: int, build: str) -> tuple[object, int]:
    """(op, kernels) of a node's op as `build` ("cuda13" or "legacy") runs it."""
    if build == "legacy" and isinstance(op, PerBuild):
        return op.legacy_op, op.legacy_kernels
    return op, kernels


@dataclass(frozen=True)
class Cheapest:
    """The fastest of `options` (kit ops or Derived), each a complete way to run the kernel."""

    op_class: str
    options: tuple
    label: str = ""

    @property
    def dtype(self) -> str:
        return getattr(self.options[0], "dtype", "fp32")

    @property
    def flops(self) -> float:
        return self.options[0].flops

    @property
    def bytes(self) -> float:
        return self.options[0].bytes


@dataclass(frozen=True)
class Slowest(Cheapest):
    """One kernel bound by each of `options` at once, costed as the slowest of them: an unknown
    op that moves its bytes and does its FLOPs (torch's FLOP registry counts them) takes at
    least each, and a sum of the two had charged it up to twice its bound. It reports the
    largest FLOPs and bytes among them."""

    @property
    def flops(self) -> float:
        return max(o.flops for o in self.options)

    @property
    def bytes(self) -> float:
        return max(o.bytes for o in self.options)


def memory_bound(op_class: str, nbytes: float, dtype: str = "fp32", label: str = "") -> Derived:
    """A kernel limited by the bytes it moves: costed as a copy of those bytes (so it reports the
    copy's bytes and no FLOPs)."""
    return Derived(op_class, (copy_of(nbytes, dtype),), 1.0, label)


def leaf_options(op) -> list[list]:
    """Per option of a node's op, its leaves with their scales (option_ways says which way of
    running it each option belongs to): a Cheapest's ways in order, each of them one option, or
    one per combination of the Slowest sitting in its Derived parts (a strided convolution's
    input gradient, _dgrad: its one launch or its slowest phase alone)."""
    return [leaves for _, leaves in _ways(op)]


def option_ways(op) -> list[int]:
    """Per option of leaf_options(op), the way of running the op it belongs to: the node costs
    the fastest way (the slowest, for a Slowest node), each way the slowest of its options."""
    return [way for way, _ in _ways(op)]


def _ways(op) -> list[tuple[int, list]]:
    if isinstance(op, Cheapest) and not isinstance(op, Slowest):
        return [(i, leaves) for i, o in enumerate(op.options) for leaves in _bounds(o)]
    return [(0, leaves) for leaves in _bounds(op)]


def _bounds(op) -> list[list]:
    """The leaf lists (with scales) whose slowest op takes: one, unless a Slowest sits in it, as
    max(a, b) + c = max(a + c, b + c). A Cheapest inside a Derived counts its nominal (first)
    option, as leaf_ops does."""
    if isinstance(op, Slowest):
        return [leaves for o in op.options for leaves in _bounds(o)]
    if isinstance(op, Cheapest):
        return _bounds(op.options[0])
    if isinstance(op, Derived):
        return [[(p, op.scale * s) for leaves in combo for p, s in leaves]
                for combo in itertools.product(*(_bounds(part) for part in op.parts))]
    return [[(op, 1.0)]]


def leaf_ops(op) -> list:
    """The kit ops a node's op is made of, with the scale each is multiplied by (for a Cheapest,
    its nominal first option's; leaf_options gives them all)."""
    if isinstance(op, Cheapest):
        return leaf_ops(op.options[0])
    if isinstance(op, Derived):
        return [(p, op.scale * s) for part in op.parts for p, s in leaf_ops(part)]
    return [(op, 1.0)]


def row_reduction(rows: int, cols: int, out_bytes_per_row: int, dtype: str = "fp32",
                  label: str = "") -> Derived:
    """A reduction over the last dim of a contiguous (rows, cols) tensor (torch.sum(dim=-1),
    torch.max(dim=-1), ...): one TensorIterator reduce kernel that reads the tensor once and
    writes `out_bytes_per_row` a row (max.dim: the value and its int64 index). Costed as the
    capture costs a reduction (kit.workload.mapping: memory_bound over its inputs' and outputs'
    bytes)."""
    from kit.op_counts import dtype_bytes

    nbytes = rows * cols * dtype_bytes(dtype) + rows * out_bytes_per_row
    return memory_bound("reduction", nbytes, dtype, label)


def embedding_dense_backward(num_weights: int, dim: int, elem_bytes: int, grad_nbytes: float,
                             dtype: str) -> Derived:
    """torch's embedding_dense_backward: zero the (num_weights, dim) weight gradient, then
    scatter-add every row of the output gradient (grad_nbytes) into it, as the capture prices it
    (kit.workload.mapping). Two kernels when the indices are <= 3,072 (the zero-fill and
    embedding_backward_feature_kernel); past that torch sorts them first (not counted)."""
    return memory_bound("embedding", num_weights * dim * elem_bytes + 2 * grad_nbytes, dtype,
                        label="embedding_dense_backward")


def fill(numel: int, dtype: str, label: str = "fill") -> Derived:
    """A zero_() / fill_() of numel contiguous elements: it writes them and reads nothing, half
    the learned one-input pass (kit.workload.mapping_elementwise prices a fill so)."""
    from kit.ops import Elementwise

    return Derived("elementwise", (Elementwise("fill", numel, dtype, inputs=1),), 0.5, label)
