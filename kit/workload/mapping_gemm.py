"""GEMM-family aten ops as kit Gemms: what each matrix product costs.

mm, addmm and _addmm_activation (one matrix product, a bias, an epilogue), bmm and baddbmm (a
batch), torch._grouped_mm (MoE experts), and the rest of the family a model may call directly:

    addbmm    self + sum_b A_b B_b: one GEMM of inner size b*k ([A_0 .. A_b-1] @ [B_0; ..; B_b-1])
    mv, addmv a matrix-vector product (n = 1); dot, vdot one row by one column (m = n = 1)
    _trilinear (nn.Bilinear, forward and backward): torch's loop over one dimension, two GEMMs a
              step (aten/src/ATen/native/Linear.cpp: _trilinear, sumproduct_pair)
    _euclidean_dist (torch.cdist, p=2): one GEMM of inner size k+2 on padded rows, and the norms
    _cdist_forward, _cdist_backward (other p): a loop over every pair of rows and every column,
              costed as the GEMM of that shape
    _scaled_mm, _scaled_mm_v2 (torch._scaled_mm: FP8 operands, a per-tensor or per-row scale
              each), _scaled_grouped_mm: the GEMM, or grouped GEMM, in fp8 (see _scaled)

A complex GEMM is the real GEMM of its real and imaginary parts (complex_as_real): 4 real
multiplies per complex multiply-add, 4x the FLOPs of the real GEMM of its shape.
"""
from __future__ import annotations

import math

import torch

from kit.errors import KitError
from kit.ops import MAX_ALIGN_ELEMS, Elementwise, Gemm, dtype_bytes, lead_alignment
from kit.workload.kernels import Derived, copy_of
from kit.workload.mapping_elementwise import nbytes

# one matrix product (mm; addmm adds a bias, _addmm_activation a bias and ReLU/GELU epilogue)
MATMULS = ("mm", "addmm", "_addmm_activation")
# FP8 matrix products (torch._scaled_mm): (a, b, scales, ..., out_dtype)
SCALED_MM = ("_scaled_mm", "_scaled_mm_v2")
GEMM_OPS = {*MATMULS, "bmm", "baddbmm", "addbmm", "_grouped_mm", "mv", "addmv", "dot", "vdot",
            "_trilinear", "_euclidean_dist", "_cdist_forward", "_cdist_backward", *SCALED_MM,
            "_scaled_grouped_mm"}


def _copied(t: torch.Tensor) -> bool:
    """Whether PyTorch copies t's matrices contiguous before cuBLAS sees them. cuBLAS takes a
    matrix with one unit stride and the other at least that dimension's extent (its leading
    dimension); PyTorch clones any other (a slice of every other column, strides (2k, 2); a
    stride-0 broadcast row) with MemoryFormat::Contiguous first (prepare_matrix_for_cublas and
    prepare_batch_matrix_for_cublas, aten/src/ATen/native/cuda/Blas.cpp)."""
    if t.dim() < 2 or min(t.shape[-2:]) <= 1:
        return False
    rows, cols = t.shape[-2:]
    row_stride, col_stride = int(t.stride(-2)), int(t.stride(-1))
    return not ((col_stride == 1 and row_stride >= cols) or (row_stride == 1 and col_stride >= rows))


def _leading(t: torch.Tensor) -> int:
    """The leading dimension (stride, in elements) of the matrix in t's last two dims, as cuBLAS
    gets it: the stride that is not 1 (row- or column-major), or for an operand PyTorch copies
    first (_copied) the copy's, its column count; a vector (a dim of 1) has none that matters
    (MAX_ALIGN_ELEMS)."""
    if t.dim() < 2 or min(t.shape[-2:]) <= 1:
        return MAX_ALIGN_ELEMS
    if _copied(t):
        return int(t.shape[-1])
    return max(int(t.stride(-2)), int(t.stride(-1)), 1)


def _offsets(t: torch.Tensor) -> tuple[int, ...]:
    """Where t's matrices start, in elements: its storage offset and, for a batch of matrices,
    the batch stride (cuBLAS loads each matrix from base + i x stride); a copied operand
    (_copied) starts at 0 and packs its matrices. 0 constrains nothing."""
    batched = t.dim() == 3 and t.shape[0] > 1
    if _copied(t):
        return (0, int(t.shape[-2] * t.shape[-1]) if batched else 0)
    return (int(t.storage_offset()), int(t.stride(0)) if batched else 0)


def _align(a: torch.Tensor, b: torch.Tensor, n: int) -> int:
    """lead_alignment of both operands' leading dimensions, where their matrices start (a
    pointer off a 16-byte boundary, as a slice from an odd column gives, rules out the aligned
    kernels as an odd stride does) and the (contiguous) output's leading dimension, n (a
    one-column output has none that matters)."""
    return lead_alignment(_leading(a), _leading(b), *_offsets(a), *_offsets(b),
                          n if n > 1 else MAX_ALIGN_ELEMS)


def _gemm(packet: str, args, dtype: str) -> Gemm:
    if packet in MATMULS:
        a, b = (args[0], args[1]) if packet == "mm" else (args[1], args[2])
        return Gemm(m=a.shape[0], n=b.shape[1], k=a.shape[1], b=1, dtype=dtype, kind="linear",
                    shared_rhs=True, align=_align(a, b, b.shape[1]))
    a, b = (args[0], args[1]) if packet == "bmm" else (args[1], args[2])
    m, n, k, batch = a.shape[1], b.shape[2], a.shape[2], a.shape[0]
    align = _align(a, b, n)
    if _expanded(b):  # x @ W on a non-contiguous 3-d x without grad: W expanded over the batch
        return Gemm(m=m, n=n, k=k, b=batch, dtype=dtype, kind="bmm", shared_rhs=True, align=align)
    if _expanded(a):  # C^T = B^T A^T: the expanded A is the shared operand
        return Gemm(m=n, n=m, k=k, b=batch, dtype=dtype, kind="bmm", shared_rhs=True, align=align)
    return Gemm(m=m, n=n, k=k, b=batch, dtype=dtype, kind="bmm", align=align)


def _grouped_gemm(args, kwargs, dtype: str) -> Gemm | Derived:
    """torch._grouped_mm (F.grouped_mm): one launch of many GEMMs, as MoE experts run (HF's
    grouped_mm experts, transformers 5). A 2-D operand is cut into groups along one dimension by
    `offs`, whose values the capture does not have: the groups are taken as even, over as many
    experts as there are rows to share (min(groups, rows)), and costed as that batch of GEMMs.

        (S, K) x (E, K, N)   tokens sorted by expert, one weight per expert (the forward and dx)
        (M, S) x (S, N)      the contraction cut per expert: the weight gradient, (E, M, N)
        (E, M, K) x (K, N')  the columns cut per group
        (E, M, K) x (E, K, N) a plain batch of E GEMMs (no offs)
    """
    a, b = args[0], args[1]
    offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
    if a.dim() == 3 and b.dim() == 3:
        return Gemm(m=a.shape[1], n=b.shape[2], k=a.shape[2], b=a.shape[0], dtype=dtype, kind="bmm")
    groups = offs.numel() if isinstance(offs, torch.Tensor) else (b.shape[0] if b.dim() == 3 else a.shape[0])
    if a.dim() == 2 and b.dim() == 3:
        total, cut = a.shape[0], lambda share, g: Gemm(m=share, n=b.shape[2], k=a.shape[1], b=g,
                                                       dtype=dtype, kind="bmm")
    elif a.dim() == 2 and b.dim() == 2:
        total, cut = a.shape[1], lambda share, g: Gemm(m=a.shape[0], n=b.shape[1], k=share, b=g,
                                                       dtype=dtype, kind="bmm")
    else:
        total, cut = b.shape[-1], lambda share, g: Gemm(m=a.shape[-2], n=share, k=a.shape[-1], b=g,
                                                        dtype=dtype, kind="bmm")
    g = max(1, min(groups, total))  # the groups that get a share
    share = max(1, math.ceil(total / g))
    op = cut(share, g)
    if share * g == total:
        return op
    # shares that do not divide evenly: the rounded-up batch, scaled to the real work (2·S·K·N)
    return Derived("gemm", (op,), total / (share * g), "grouped GEMM, uneven shares")


def _scaled(packet: str, args, kwargs, dtype: str) -> Gemm:
    """torch._scaled_mm (a (m, k) by b (k, n), each FP8 with its scales; cuBLASLt's FP8 kernel) as
    the Gemm of that shape in the operands' dtype, fp8: the predictors price an fp8 Gemm on the
    GPUs with an fp8 peak (kit.predict.tensor_core: the bf16 curve as a share of the fp8 peak) and
    refuse it on the others, which cannot run the op either. It had been an unknown op costed as a
    cube of its FLOPs: a decode step's (4, 4096) x (4096, 4096) as a 406^3 GEMM, reported under
    "unknown". Approximate in its bytes alone: a Gemm has one dtype, so its output (out_dtype,
    bf16 as a rule) is counted at a byte an element, and the scales (a float each, or one a row
    and column) not at all; the operands, which set a memory-bound GEMM's time, are exact.
    _scaled_grouped_mm (MoE experts in fp8) is _grouped_mm's grouped GEMM, its offs fifth
    (F.scaled_grouped_mm's _scaled_grouped_mm_v2 has no Meta kernel in torch 2.13: capture
    stops at it with torch's error, naming the op).
    FP4 operands (float4_e2m1fn_x2, NVFP4/MXFP4 on Blackwell: two values a byte, so K is twice
    the shape's) are refused: the kit has no fp4 peak, and taken as a byte an element they had
    been an fp8 GEMM of half their K (half the FLOPs), priced on GPUs that cannot run them."""
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)
    if any(isinstance(t, torch.Tensor) and t.dtype == fp4 for t in args[:2]):
        raise KitError(f"{packet} on fp4 operands (float4_e2m1fn_x2) is not modelled: the kit "
                       "prices fp32, tf32, fp16, bf16 and fp8 GEMMs only")
    if packet == "_scaled_grouped_mm":
        offs = kwargs.get("offs", args[4] if len(args) > 4 else None)
        return _grouped_gemm((args[0], args[1]), {"offs": offs}, dtype)
    a, b = args[0], args[1]
    return Gemm(m=a.shape[0], n=b.shape[1], k=a.shape[1], b=1, dtype=dtype, kind="linear",
                shared_rhs=True, align=_align(a, b, b.shape[1]))


def _expanded(t: torch.Tensor) -> bool:
    """A bmm operand broadcast over the batch (batch stride 0, as torch.matmul passes a weight it
    does not fold into one mm): one matrix that the kernel reads from DRAM once, not b copies.
    cuBLAS takes the stride-0 batch as it is (strided-batched GEMM), so the batch stays."""
    return t.dim() == 3 and t.shape[0] > 1 and t.stride(0) == 0


def _vector(packet: str, args, dtype: str) -> Gemm:
    """mv(A, x), addmv(y, A, x): a GEMM of one column; dot(a, b), vdot: of one row and column."""
    if packet in ("dot", "vdot"):
        return Gemm(m=1, n=1, k=max(1, args[0].numel()), dtype=dtype, kind="mm")
    a, x = (args[0], args[1]) if packet == "mv" else (args[1], args[2])
    return Gemm(m=a.shape[0], n=1, k=a.shape[1], dtype=dtype, kind="linear", shared_rhs=True,
                align=_align(a, x, 1))


def _pair(left: list, right: list, summed: set, dtype: str) -> tuple[Gemm, list]:
    """torch's sumproduct_pair as the bmm it runs, and the product's sizes: dims in both operands
    and kept are the batch, dims in one only its rows (left) or columns (right), dims summed in
    both the inner size (a dim summed in one only is summed before, a small reduction)."""
    b = m = n = k = 1
    sizes = []
    for d, (lsize, rsize) in enumerate(zip(left, right)):
        both = lsize != 1 and rsize != 1
        if d in summed:
            k *= lsize if both else 1
            sizes.append(1)
            continue
        if both:
            b *= lsize
        elif lsize != 1:
            m *= lsize
        elif rsize != 1:
            n *= rsize
        sizes.append(max(lsize, rsize))
    return Gemm(m=m, n=n, k=k, b=b, dtype=dtype, kind="bmm"), sizes


def _trilinear(args, dtype: str) -> tuple[Derived, int]:
    """_trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1): for each index
    of unroll_dim, i1 x i2 summed over the dims i3 lacks, then x i3 summed over the rest, added
    into a zeroed output: two GEMMs and an add a step (nn.Bilinear loops over its outputs)."""
    i1, i2, i3, e1, e2, e3, sumdim = args[:7]
    unroll = int(args[7]) if len(args) > 7 else 1
    total = i1.dim() + len(e1)

    def full(t, expand):  # t's sizes over all dims, 1 where it is expanded
        sizes = iter(t.shape)
        return [1 if d in expand else int(next(sizes)) for d in range(total)]

    s1, s2, s3 = full(i1, e1), full(i2, e2), full(i3, e3)
    extent = [max(a, b, c) for a, b, c in zip(s1, s2, s3)]
    for s in (s1, s2, s3):  # each step reads one slice of unroll_dim
        s[unroll] = 1
    first, mid = _pair(s1, s2, {d for d in sumdim if d != unroll and d in e3}, dtype)
    second, step_out = _pair(mid, s3, {d for d in sumdim if d != unroll and d not in e3}, dtype)
    add = Elementwise("add", max(1, math.prod(step_out)), dtype, inputs=2)
    zeros = copy_of(math.prod(n for d, n in enumerate(extent) if d not in sumdim) * dtype_bytes(dtype),
                    dtype)  # the output, zeroed: written once
    steps = extent[unroll]
    loop = Derived("gemm", (first, second, add), steps, f"_trilinear: {steps} steps of 2 GEMMs")
    return Derived("gemm", (loop, zeros), 1.0, "_trilinear"), 3 * steps + 1


def _distances(packet: str, args, dtype: str) -> tuple[object, int]:
    """torch.cdist: x1 (..., P, M), x2 (..., R, M) -> (..., P, R)."""
    if packet == "_cdist_backward":  # (grad, x1, x2, p, cdist) -> dx1: each (P, M) sums over R
        x1, x2 = args[1], args[2]
        rows, cols, inner = x1.shape[-2], x1.shape[-1], x2.shape[-2]
    else:
        x1, x2 = args[0], args[1]
        rows, cols, inner = x1.shape[-2], x2.shape[-2], x1.shape[-1]
    batch = max(1, math.prod(x1.shape[:-2]))
    if packet != "_euclidean_dist":  # a loop over every pair and column, as a GEMM of the shape
        return Gemm(m=max(1, rows), n=max(1, cols), k=max(1, inner), b=batch, dtype=dtype), 1
    # ||a||^2 + ||b||^2 - 2ab: the rows padded with their norms and ones (k + 2), one GEMM, then
    # clamp and sqrt over the output; the norms, pads and cats pass over x1 and x2 ~5 times
    gemm = Gemm(m=max(1, rows), n=max(1, cols), k=inner + 2, b=batch, dtype=dtype)
    out = max(1, batch * rows * cols)
    passes = copy_of(5 * (nbytes(x1) + nbytes(x2)), dtype)
    return Derived("gemm", (gemm, passes, Elementwise("clamp", out, dtype), Elementwise("sqrt", out, dtype)),
                   1.0, "_euclidean_dist"), 12


def complex_as_real(op):
    """A complex GEMM (m, n, k) as the real GEMM it is: A (m x k) by B (k x n) complex is the
    real product of two of them with doubled dims, [[Ar, -Ai], [Ai, Ar]] [Br; Bi] = [Cr; Ci]
    (m and k doubled) or the like with n and k, or m and n (then Cr = ArBr - AiBi, a cheap
    combine): 8mnk real FLOPs (4 real multiplies per complex multiply-add), each operand's
    bytes once, one read twice; the one chosen is the smallest."""
    if isinstance(op, Derived):
        return Derived(op.op_class, tuple(complex_as_real(p) for p in op.parts), op.scale, op.label)
    if not isinstance(op, Gemm):
        return op
    rhs = op.k * op.n * (1 if op.shared_rhs else op.b)
    excess = {"a": op.b * op.m * op.k, "b": rhs, "c": op.b * op.m * op.n}
    m, n, k = {"a": (2 * op.m, op.n, 2 * op.k), "b": (op.m, 2 * op.n, 2 * op.k),
               "c": (2 * op.m, 2 * op.n, op.k)}[min(excess, key=excess.get)]
    align = None if op.align is None else lead_alignment(2 * op.align)  # real words: twice as many
    return Gemm(m=m, n=n, k=k, b=op.b, dtype=op.dtype, kind=op.kind, shared_rhs=op.shared_rhs,
                align=align)


def map_gemm(packet: str, args, kwargs, dtype: str) -> tuple[object, str, int]:
    """(kit op, "gemm", kernels) of a GEMM_OPS op; dtype: the kit dtype of its operands (a
    complex one's real parts')."""
    kernels = 1
    if packet in (*MATMULS, "bmm", "baddbmm"):
        op = _gemm(packet, args, dtype)
    elif packet in SCALED_MM or packet == "_scaled_grouped_mm":
        op = _scaled(packet, args, kwargs, dtype)
    elif packet == "_grouped_mm":
        op = _grouped_gemm(args, kwargs, dtype)
    elif packet == "addbmm":  # (self, batch1 (b, m, k), batch2 (b, k, n))
        b1, b2 = args[1], args[2]
        op = Gemm(m=b1.shape[1], n=b2.shape[2], k=max(1, b1.shape[0] * b1.shape[2]), dtype=dtype,
                  kind="mm")
    elif packet == "_trilinear":
        op, kernels = _trilinear(args, dtype)
    elif packet in ("_euclidean_dist", "_cdist_forward", "_cdist_backward"):
        op, kernels = _distances(packet, args, dtype)
    else:
        op = _vector(packet, args, dtype)
    if any(isinstance(t, torch.Tensor) and t.is_complex() for t in args):
        op = complex_as_real(op)
    return op, "gemm", kernels


def flops_gemm(flops: float, dtype: str) -> Derived:
    """A GEMM doing `flops` (2mnk, m = n = k within rounding, scaled to the exact count): the
    least time an op of that many FLOPs takes at the GPU's peak for dtype."""
    side = max(1, round((flops / 2) ** (1 / 3)))
    gemm = Gemm(m=side, n=side, k=side, dtype=dtype, kind="mm")
    return Derived("gemm", (gemm,), flops / gemm.flops, "FLOPs at the GEMM rate")
