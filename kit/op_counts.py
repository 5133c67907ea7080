"""What kit.ops counts with: bytes per element of each dtype, FLOPs per element of each
elementwise kind and row op, the check every op applies to its dimensions, and how aligned a
GEMM's leading dimensions are. No GPU here either.
"""
from __future__ import annotations

import numbers

from kit.errors import KitError

# bytes per element; tf32 is stored as fp32
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}

# FLOPs per output element of each elementwise kind. Arithmetic counts one FLOP; a transcendental
# (exp, log, tanh, erf, sqrt via a polynomial/special-function unit) counts as 4, a common
# convention in roofline studies. gelu (tanh form) = x·0.5·(1 + tanh(√(2/π)(x + 0.044715x³))):
# 7 arithmetic + 1 tanh = 11.
ELEMENTWISE_FLOPS = {
    "add": 1, "sub": 1, "mul": 1, "div": 1, "pow": 8, "max": 1, "min": 1, "where": 1,
    "neg": 1, "abs": 1, "relu": 1, "sigmoid": 6, "tanh": 4, "gelu": 11, "silu": 7,
    "exp": 4, "log": 4, "sqrt": 4, "rsqrt": 4, "reciprocal": 1, "copy": 0, "cast": 0,
    "fill": 0, "clamp": 2, "square": 1, "erf": 4, "sin": 4, "cos": 4, "unknown": 0,
}
BINARY_KINDS = {"add", "sub", "mul", "div", "pow", "max", "min"}
TERNARY_KINDS = {"where"}  # torch.where(cond, a, b) reads three tensors
SOFTMAX_FLOPS_PER_ELEM = 8  # max (1), subtract (1), exp (4), sum (1), divide (1)
LAYERNORM_FLOPS_PER_ELEM = 8  # mean (1), centre (1), square+sum (2), normalise (2), scale+shift (2)
RMSNORM_FLOPS_PER_ELEM = 5  # square+sum (2), normalise (1), scale (1), rsqrt amortised (1)
DROPOUT_FLOPS_PER_ELEM = 3  # random draw compare (1), mask (1), scale by 1/(1-p) (1)


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except (KeyError, TypeError):  # TypeError: a list or dict, which no dict key can be
        raise KitError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPE_BYTES)}") from None


# no tensor has a dimension (or element or byte count) past int64, which torch and CUDA index
# with; below it an op's FLOPs and bytes (products of a few dims) stay finite as float64
MAX_DIM = 2**63 - 1


def _positive_ints(op: str, obj, **dims) -> None:
    """Each dim a positive whole number of at most MAX_DIM; a numpy integer is stored on obj as a
    Python int."""
    for name, value in dims.items():
        if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
            value = int(value)  # numpy integers (not numpy bools: they are not Integral)
            object.__setattr__(obj, name, value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KitError(f"{op}: {name} must be a positive whole number, got {value!r}")
        if value > MAX_DIM:  # shown by its digits: a float cannot hold 10**400
            raise KitError(f"{op}: {name} ~10^{len(str(value)) - 1} is more than any tensor holds (at most "
                           f"2**63 - 1, the int64 that torch and CUDA index with)")


GEMM_KINDS = ("bmm", "linear", "mm")
MAX_ALIGN_ELEMS = 8  # 16 bytes of a 16-bit dtype: the alignment cuBLAS's fastest kernels need


def lead_alignment(*dims: int) -> int:
    """The largest power of two, up to MAX_ALIGN_ELEMS, dividing every dim: how many elements
    a kernel may load at once along the leading dimensions (strides) of a GEMM's matrices."""
    align = MAX_ALIGN_ELEMS
    for d in dims:
        d = int(d)
        while align > 1 and d % align:
            align //= 2
    return align
