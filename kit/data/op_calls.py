"""What the collector runs: op names and classes (expand_ops), the (op, shape) pairs of a sweep
(plan), a shape's schema columns, and build_call, one op on fresh seeded inputs on the device,
under the math mode its dtype means (fp32: true FP32, no TF32)."""
from __future__ import annotations

from contextlib import contextmanager

from kit.data import schema
from kit.data.shapes import shape_kind
from kit.errors import KitError, comma_names

TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}
OPS_OF_KIND = {"gemm": ("bmm", "linear"), "conv": ("conv",),
               "vec": tuple(o for o, (c, _, _) in schema.OPS.items()
                            if c in ("elementwise", "softmax", "layernorm"))}
SCALAR = {"addu": 1.5, "mulu": 1.5, "divu": 1.5, "powu": 2.5}  # 2.5: not a special-cased exponent


def expand_ops(spec: str | list[str]) -> list[str]:
    """'gemm,softmax,gelu' -> op names; classes expand to every op of the class."""
    names = [s.strip() for s in (comma_names(spec, "--ops") if isinstance(spec, str) else spec) if s.strip()]
    if not names:
        raise KitError("--ops is empty: give op names or classes, e.g. gemm,elementwise,softmax")
    out: dict[str, None] = {}
    for name in names:
        if name in schema.OPS:
            out[name] = None
        elif name in schema.OP_CLASSES:
            out.update({o: None for o, v in schema.OPS.items() if v[0] == name})
        else:
            raise KitError(f"unknown op {name!r}: choose op classes ({', '.join(schema.OP_CLASSES)}) "
                           f"or ops ({', '.join(schema.OPS)})")
    return list(out)


def op_kind(op: str) -> str:
    return next(kind for kind, ops in OPS_OF_KIND.items() if op in ops)


def shape_columns(op: str, shape: tuple) -> dict:
    """Schema shape columns for a NeuSight-order shape (k is the reduction)."""
    if op == "bmm":
        B, M, N, K = shape
        return {"b": B, "m": M, "k": N, "n": K}
    if op == "linear":
        B, M, N, K = shape
        return {"b": 1, "m": B * M, "k": N, "n": K}
    if op == "conv":
        return dict(zip(schema.CONV_DIMS, shape))
    return {"rows": shape[0], "cols": shape[1]}


WEIGHT_STD = 0.02  # GEMM weights and biases: N(0, 0.02), as initialised transformer weights


def build_call(op: str, shape: tuple, dtype: str, device: str, bias: bool = True):
    """A zero-argument callable running op once on fresh seeded inputs (bias: linear's)."""
    import torch
    import torch.nn.functional as F

    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*size):  # in [0.5, 1.5): no NaNs from pow, no denormals; made on the device
        return (torch.rand(*size, generator=gen, device=device) + 0.5).to(dtype=tdtype)

    def randn(*size, std=1.0):  # signed, as real activations (std 1) and weights (std 0.02)
        return (torch.randn(*size, generator=gen, device=device) * std).to(dtype=tdtype)

    if op == "bmm":
        B, M, N, K = shape
        a, b = randn(B, M, N), randn(B, N, K)
        return lambda: torch.bmm(a, b)
    if op == "linear":
        B, M, N, K = shape
        x, w = randn(B, M, N), randn(K, N, std=WEIGHT_STD)
        b = randn(K, std=WEIGHT_STD) if bias else None
        return lambda: F.linear(x, w, b)
    if op == "conv":
        B, cin, cout, ks, size, stride, pad = shape
        x, w = randn(B, cin, size, size), randn(cout, cin, ks, ks, std=WEIGHT_STD)
        return lambda: F.conv2d(x, w, stride=stride, padding=pad)
    rows, cols = shape
    x = rand(rows, cols)
    if op in ("add", "mul", "div", "pow"):
        y = rand(rows, cols)
        fn = {"add": torch.add, "mul": torch.mul, "div": torch.div, "pow": torch.pow}[op]
        return lambda: fn(x, y)
    if op in SCALAR:
        fn = {"addu": torch.add, "mulu": torch.mul, "divu": torch.div, "powu": torch.pow}[op]
        s = SCALAR[op]
        return lambda: fn(x, s)
    if op == "ln":
        w, bias = rand(cols), rand(cols)
        return lambda: F.layer_norm(x, (cols,), w, bias)
    unary = {"relu": torch.relu, "gelu": F.gelu, "tanh": torch.tanh,
             "softmax": lambda t: torch.softmax(t, dim=-1)}
    fn = unary[op]
    return lambda: fn(x)


@contextmanager
def _math_mode(dtype: str, device: str):
    import torch

    if device != "cuda":
        yield
        return
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    tf32 = dtype == "tf32"  # fp32 means true fp32 (SIMT sgemm), as NeuSight measured
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


NEEDS = {"gemm": "B;M;N;K", "vec": "B;H", "conv": "B;Cin;Cout;ks;S;stride;pad"}


def plan(ops: list[str], shapes: list[tuple]) -> tuple[list[tuple[str, tuple]], list[str]]:
    """(op, shape) pairs, every op on every shape of its kind, and the ops no shape fits.

    KitError when no op fits any shape.
    """
    kinds = {shape_kind(s) for s in shapes}
    tasks, unmatched = [], []
    for op in ops:
        kind = op_kind(op)
        if kind not in kinds:
            unmatched.append(op)
        tasks += [(op, s) for s in shapes if shape_kind(s) == kind]
    if not tasks:
        need = " or ".join(sorted({NEEDS[op_kind(op)] for op in ops}))
        raise KitError(f"no shape fits the ops {', '.join(ops)}: they need {need} shapes")
    return tasks, unmatched
