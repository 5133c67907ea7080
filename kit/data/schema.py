"""The one measurement schema: a tidy pandas DataFrame, one row per measured operator call.

Every source (NeuSight's CSVs, the kit's own collector, later traces) is turned into this table,
so predictors train and are checked on one shape of data.

Columns (in this order; missing values: <NA> in nullable integer/boolean columns, NaN in float
and string columns; test with `pd.isna`)

=================  ========  ==================================================================
column             dtype     meaning
=================  ========  ==================================================================
op                 str       operator name as measured: "bmm", "linear", "add", "addu", "mul",
                             "mulu", "div", "divu", "pow", "powu", "relu", "gelu", "tanh",
                             "softmax", "ln", "conv" (NeuSight's names; a trailing "u" is the
                             tensor-scalar form, e.g. addu = x + 3.0)
op_class           str       "gemm" | "elementwise" | "softmax" | "layernorm" | "conv"
                             (the same words as kit.ops' op_class)
elem_kind          str       elementwise kind as in kit.op_counts.ELEMENTWISE_FLOPS ("add", "mul",
                             "div", "pow", "relu", "gelu", "tanh"); NaN for other classes
scalar             boolean   elementwise with a scalar second operand (the "u" forms)
gpu                str       catalog key (kit.hardware.get_gpu), e.g. "a100-pcie-40gb";
                             NaN for a CPU measurement
device_name        str       the device string as the source recorded it
dtype              str       "fp32", "tf32", "fp16", "bf16" (kit.op_counts.DTYPE_BYTES keys)
b, m, n, k         Int64     GEMM dims, kit convention C[b,m,n] = A[b,m,k]·B[b,k,n]: k is the
                             reduction.  NeuSight's bmm (B×M×N)·(B×N×K) gives b=B, m=M, k=N,
                             n=K.  NeuSight's linear, nn.Linear(N, K) on a (B, M, N) input,
                             gives b=1, m=B·M, k=N, n=K.  For conv, b is the batch.
rows, cols         Int64     vector ops on a (rows, cols) view; NeuSight's (B, H) -> rows=B,
                             cols=H; softmax and layer norm reduce over cols
in_channels, out_channels, kernel_size, input_size, stride, padding
                   Int64     conv2d dims (square kernel and input), NeuSight's conv files
latency_ms         float64   measured time of one call, in milliseconds
kernel_name        str       the main GPU kernel's name
kernels            str       every kernel the call launched, ";"-separated, in launch order
                             (NaN where the source did not list them: NeuSight's elementwise
                             and softmax files, and CPU rows)
n_kernels          Int64     how many kernels the call launched (<NA> likewise)
tile_m, tile_n, tile_k
                   Int64     thread-block tile parsed from kernel_name (see parse_tile), as the
                             library names it (cuBLAS is column-major: its m is PyTorch's n)
grid_x, grid_y, grid_z, block_x, block_y, block_z
                   Int64     launch dims of the main kernel
blocks_per_sm      float64   thread blocks per SM (grid blocks / SMs, as the profiler reports)
warps_per_sm       float64   warps per SM, likewise
source             str       where the row came from: "neusight:<part>" (train-collect, train,
                             test, amd-train-collect, amd-train, amd-test),
                             "neusight:<file name>" (load_measurements), "collector"
split              str       "train" | "test" (NeuSight's split; the collector writes "train")
torch_version      str       e.g. "2.1.0"
cuda_version       str       e.g. "12.1" (NaN on ROCm and CPU)
cudnn_version      str       e.g. "8902" (torch.backends.cudnn.version())
=================  ========  ==================================================================
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from kit.data.csv_read import data_line
from kit.errors import KitError

# the shortest time a measurement may hold, ms: 1 ns, a thousandth of the shortest kernel a GPU
# runs (a few µs); 5e-324 had passed as positive and scored an infinite APE
MIN_TIME_MS = 1e-6
# the longest: an hour, 290x NeuSight's longest row (12,297 ms, a GEMM in its data/dataset CSVs);
# no op call the kit or NeuSight times runs that long, so a larger time is a unit slip or a
# corrupt cell: 1e300 ms had been read, scored and trained on (kit train --extra) without a word
MAX_TIME_MS = 3.6e6

COLUMNS: dict[str, str] = {
    "op": "str", "op_class": "str", "elem_kind": "str", "scalar": "boolean",
    "gpu": "str", "device_name": "str", "dtype": "str",
    "b": "Int64", "m": "Int64", "n": "Int64", "k": "Int64", "rows": "Int64", "cols": "Int64",
    "in_channels": "Int64", "out_channels": "Int64", "kernel_size": "Int64",
    "input_size": "Int64", "stride": "Int64", "padding": "Int64",
    "latency_ms": "float64",
    "kernel_name": "str", "kernels": "str", "n_kernels": "Int64",
    "tile_m": "Int64", "tile_n": "Int64", "tile_k": "Int64",
    "grid_x": "Int64", "grid_y": "Int64", "grid_z": "Int64",
    "block_x": "Int64", "block_y": "Int64", "block_z": "Int64",
    "blocks_per_sm": "float64", "warps_per_sm": "float64",
    "source": "str", "split": "str",
    "torch_version": "str", "cuda_version": "str", "cudnn_version": "str",
    # the kit's own collector (kit.data.collect) since it keeps them: the summed device time of
    # the profiled call's kernels, and the median of the timed calls (latency_ms: the fastest fifth)
    "kernel_ms": "float64", "latency_median_ms": "float64",
}
LATER_COLUMNS = ("kernel_ms", "latency_median_ms")  # absent from kit CSVs written before them
GEMM_DIMS = ("b", "m", "n", "k")
VECTOR_DIMS = ("rows", "cols")
CONV_DIMS = ("b", "in_channels", "out_channels", "kernel_size", "input_size", "stride", "padding")

# op -> (op_class, elem_kind, scalar form)
ELEMENTWISE_OPS = {"add": "add", "mul": "mul", "div": "div", "pow": "pow",
                   "relu": "relu", "gelu": "gelu", "tanh": "tanh"}
OPS: dict[str, tuple[str, str | None, bool]] = {
    "bmm": ("gemm", None, False), "linear": ("gemm", None, False),
    "softmax": ("softmax", None, False), "ln": ("layernorm", None, False),
    "conv": ("conv", None, False),
    **{op: ("elementwise", kind, False) for op, kind in ELEMENTWISE_OPS.items()},
    **{op + "u": ("elementwise", op, True) for op in ("add", "mul", "div", "pow")},
}
OP_CLASSES = ("gemm", "elementwise", "softmax", "layernorm", "conv")


def op_info(op: str) -> tuple[str, str | None, bool]:
    """(op_class, elem_kind, scalar) of a schema op name; KitError naming the valid ones."""
    try:
        return OPS[op]
    except KeyError:
        raise KitError(f"unknown op {op!r}: the schema knows {', '.join(OPS)}") from None


# Tile patterns, most specific first. Each yields (m, n) or (m, n, k).
_TILE_PATTERNS = [
    re.compile(r"tilesize(\d+)x(\d+)x(\d+)"),                   # cutlass/xmma: ..._tilesize128x128x8_...
    re.compile(r"_MT(\d+)x(\d+)x(\d+)"),                       # rocBLAS/Tensile: Cijk_..._MT128x64x16_...
    # cuBLAS 12.8+ on Hopper/Blackwell: nvjet_<types>_<tileM>x<tileN>_<tileK>x<stages>_<cluster>_...,
    # e.g. nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNT; the whole structure must be there
    re.compile(r"^nvjet_(?:sm\d+_)?[a-z0-9]+_(\d+)x(\d+)_(\d+)x\d+_\d+x\d+(?:_|$)"),
    re.compile(r"cutlass\w*?gemm\w*?_(\d+)x(\d+)_(\d+)x\d+"),   # cutlass_80_simt_sgemm_128x256_8x4_tn
    # cuBLAS's Turing-style tensor-op kernels name no k: cutlass_75_tensorop_bf16_s1688gemm_bf16_64x64_tn_align1
    re.compile(r"cutlass\w*?gemm\w*?_(\d+)x(\d+)_[nt][nt]_align\d"),
    re.compile(r"(?<![a-z])[sdhc]gemm_(\d+)x(\d+)x(\d+)"),      # sgemm_128x128x8_NT
    re.compile(r"(?:maxwell|volta|turing|ampere|hopper|sm\d+)_\w*?gemm_(\d+)x(\d+)"),  # ampere_sgemm_128x64_tn
    re.compile(r"scudnn_(?:winograd_)?(\d+)x(\d+)"),             # cudnn_infer_volta_scudnn_128x64_relu_...
]


def parse_tile(kernel_name) -> tuple[int | None, int | None, int | None]:
    """Thread-block tile (m, n, k) named in a GEMM kernel's name; None for what it does not say.

    >>> parse_tile("ampere_sgemm_128x64_tn")
    (128, 64, None)
    >>> parse_tile("sm80_xmma_gemm_f32f32_tilesize64x64x8_stage3")
    (64, 64, 8)
    >>> parse_tile("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNT")
    (128, 256, 64)
    >>> parse_tile("cutlass_75_tensorop_bf16_s1688gemm_bf16_64x64_tn_align1")
    (64, 64, None)
    """
    if not isinstance(kernel_name, str):
        return (None, None, None)
    for pattern in _TILE_PATTERNS:
        hit = pattern.search(kernel_name)
        if hit:
            dims = [int(g) for g in hit.groups()]
            return (dims[0], dims[1], dims[2] if len(dims) > 2 else None)
    return (None, None, None)


def tile_columns(kernel_names: pd.Series) -> pd.DataFrame:
    """tile_m/tile_n/tile_k for a column of kernel names (parsed once per distinct name)."""
    names = kernel_names.astype(object)
    distinct = pd.unique(names)
    table = {name: parse_tile(name) for name in distinct}
    out = {}
    for i, col in enumerate(("tile_m", "tile_n", "tile_k")):
        lookup = {name: t[i] for name, t in table.items()}
        out[col] = pd.array(names.map(lookup).tolist(), dtype="Int64")
    return pd.DataFrame(out, index=kernel_names.index)


def op_columns(ops: pd.Series) -> pd.DataFrame:
    """op_class, elem_kind and scalar for a column of op names."""
    unknown = sorted(set(pd.unique(ops.astype(object))) - set(OPS), key=str)
    if unknown:
        raise KitError(f"unknown op(s) {', '.join(map(repr, unknown))}: "
                       f"the schema knows {', '.join(OPS)}")
    return pd.DataFrame({
        "op_class": ops.map({o: v[0] for o, v in OPS.items()}),
        "elem_kind": ops.map({o: v[1] for o, v in OPS.items()}),
        "scalar": pd.array(ops.map({o: v[2] for o, v in OPS.items()}).tolist(), dtype="boolean"),
    }, index=ops.index)


def gpu_keys_for(device_names: pd.Series, where: str = "") -> pd.Series:
    """Catalog key of each device string; a device not in the catalog is a KitError naming it."""
    from kit.hardware import get_gpu

    keys = {}
    for name in pd.unique(device_names.astype(object)):
        if not isinstance(name, str) or name.lower() == "cpu" or name.lower().startswith("cpu:"):
            keys[name] = np.nan
            continue
        try:
            keys[name] = get_gpu(name).key
        except KitError as e:
            at = f" in {where}" if where else ""
            raise KitError(f"device {name!r}{at} is not in the GPU catalog ({e}); "
                           "add it with kit.hardware.register_gpu, or give the command --gpu-file FILE "
                           "(`kit gpus --add FILE` only lists it)") from None
    return device_names.map(keys)


def conform(frame: pd.DataFrame, where: str = "") -> pd.DataFrame:
    """The frame with exactly the schema's columns, in order and with the schema's dtypes.

    Missing columns are added empty; extra columns are dropped. Values that cannot take the
    column's dtype (e.g. "abc" as an m) are a KitError naming the column, and, with `where` (the
    CSV file the frame was read from, header on line 1), the file and line.
    """
    out = {}
    n = len(frame)
    for col, dtype in COLUMNS.items():
        if col not in frame:
            out[col] = pd.Series(pd.array([None] * n, dtype=dtype), index=frame.index)
            continue
        values = frame[col]
        try:
            if dtype in ("Int64", "float64") and bool_values(values).any():
                raise ValueError("a bool is no number")  # pandas reads a column of True as 1
            if dtype == "Int64":
                numeric = pd.to_numeric(values, errors="raise")
                if numeric.dtype.kind == "f":
                    whole = numeric.dropna()
                    if not (whole == np.round(whole)).all():
                        raise ValueError("not whole numbers")
                out[col] = numeric.astype("Int64")
            elif dtype == "float64":
                out[col] = pd.to_numeric(values, errors="raise").astype("float64")
            elif dtype == "boolean":
                out[col] = _to_boolean(values)
            else:
                if values.dtype.kind == "f" and (values.dropna() == np.round(values.dropna())).all():
                    values = values.astype("Int64")  # 8902.0 -> "8902"
                out[col] = values.astype("str").where(values.notna(), np.nan)
        except (ValueError, TypeError, OverflowError):  # OverflowError: an integer past int64
            i, bad = _first_bad(values, dtype)
            at = ("" if i is None else f"{where}:{data_line(where, i)}: " if where else f"row {i}: ")
            raise KitError(f"{at}column {col!r} must hold {KINDS[dtype]}, got {bad!r}") from None
    return pd.DataFrame(out, index=frame.index)


KINDS = {"Int64": "whole numbers (of magnitude under 2^63)", "float64": "finite numbers",
         "boolean": "true or false", "str": "text"}


def bool_values(values: pd.Series) -> pd.Series:
    """True where a value is a bool (a CSV column of True/False is read as bool dtype)."""
    if values.dtype == bool or values.dtype == "boolean":
        return values.notna()
    if values.dtype != object:  # a numeric column holds no bool: not looked at value by value
        return pd.Series(False, index=values.index)
    return values.map(lambda v: isinstance(v, (bool, np.bool_))).astype(bool)


def _to_boolean(values: pd.Series) -> pd.Series:
    if values.dtype == "boolean" or values.dtype == bool:
        return values.astype("boolean")
    words = {"true": True, "false": False, "1": True, "0": False, "1.0": True, "0.0": False}
    mapped = values.map(lambda v: v if isinstance(v, bool) or pd.isna(v) else words.get(str(v).strip().lower(), "?"))
    if (mapped == "?").any():
        raise ValueError("expected true/false")
    return pd.array(mapped.tolist(), dtype="boolean")


def _first_bad(values: pd.Series, dtype: str) -> tuple[int | None, object]:
    """(position, value) of the first value that cannot take dtype; (None, None) if none stands out."""
    for i, v in enumerate(values):
        if pd.isna(v):
            continue
        if isinstance(v, (bool, np.bool_)) and dtype in ("Int64", "float64"):
            return i, v
        try:
            if dtype == "boolean":
                _to_boolean(pd.Series([v]))
                continue
            num = pd.to_numeric(pd.Series([v]), errors="raise").iloc[0]
            f = float(num)
            if dtype != "Int64":
                continue
            # an integer is checked as one: float(2^63 - 1) rounds up to 2^63, which had named
            # the int64 maximum the column holds as the bad value, not the 'abc' after it
            if isinstance(num, (int, np.integer)):
                if not -2 ** 63 <= int(num) < 2 ** 63:
                    return i, v
            elif f != round(f) or not -2.0 ** 63 <= f < 2.0 ** 63:
                return i, v
        except (TypeError, ValueError, OverflowError):
            return i, v
    return None, None


def empty() -> pd.DataFrame:
    """A schema table with no rows."""
    return conform(pd.DataFrame())


def check(frame: pd.DataFrame) -> None:
    """Raise KitError unless frame has exactly the schema's columns and dtypes (for tests/loaders)."""
    if list(frame.columns) != list(COLUMNS):
        missing = [c for c in COLUMNS if c not in frame]
        extra = [c for c in frame if c not in COLUMNS]
        raise KitError(f"not a measurement table: missing {missing}, extra {extra}")
    wrong = {c: str(frame[c].dtype) for c, d in COLUMNS.items() if str(frame[c].dtype) != d}
    if wrong:
        raise KitError(f"measurement table has wrong dtypes: {wrong}")


# the shape columns each op class needs (positive, but a conv's padding may be 0)
CLASS_DIMS = {"gemm": ("b", "m", "n", "k"), "elementwise": ("rows", "cols"), "softmax": ("rows", "cols"),
              "layernorm": ("rows", "cols"), "conv": CONV_DIMS}


def _check_sizes(frame: pd.DataFrame, cls: pd.Series, first) -> None:
    """The operand bound NeuSight's reader puts on its rows (kit.data.neusight.MAX_ELEMENTS: at
    most 2^40 elements, past any GPU's memory), on a kit CSV's: a bmm with m = 2^63 - 1 had loaded
    and scored a MAPE of 1.5e17% under the roofline. Not NeuSight's 2^31 per dimension: a kit
    collect may time an add of 3e9 elements as 3e9 rows of 1 (12 GB in fp32, an H100 holds it),
    and a linear's m is NeuSight's B*M, each of the two at most 2^31 there."""
    from kit.data.neusight import MAX_ELEMENTS

    for op_class, dims in CLASS_DIMS.items():
        if op_class == "conv":  # kit.data.neusight bounds a convolution's operands alone
            continue
        rows = (cls == op_class).to_numpy()
        f = {c: frame[c].to_numpy(dtype=float) for c in dims}
        sizes = ([("b*m*k", f["b"] * f["m"] * f["k"]), ("b*n*k", f["b"] * f["n"] * f["k"]),
                  ("b*m*n", f["b"] * f["m"] * f["n"])] if op_class == "gemm"
                 else [("rows*cols", f["rows"] * f["cols"])])
        for name, size in sizes:
            bad = rows & (size > MAX_ELEMENTS)
            if bad.any():
                at, i = first(pd.Series(bad))
                raise KitError(f"{at}: a {frame['op'].iloc[i]} of {name} = {size[i]:.3g} elements "
                               f"is past the 2^40 any GPU holds; check the shape")


def check_rows(frame: pd.DataFrame, where: str, lines: bool = True) -> None:
    """KitError naming `where` (a CSV, header on line 1) and the line of the first row whose
    op_class is not its op's (nor, on an elementwise row, its elem_kind or scalar), whose dtype the kit does not know, or whose shape has a missing,
    zero or negative dimension: what evaluate or a predictor would refuse later, or count
    silently. The gpu is not looked up: a collect on a GPU of the user's own file (--gpu-file)
    names one the catalog lacks, and whoever predicts it says so. lines=False: the frame was
    not read from a file (a caller's own table); a row is named by its index label."""
    from kit.hardware import DTYPES

    def first(bad: pd.Series) -> tuple[str, int]:
        i = int(np.flatnonzero(bad.to_numpy(dtype=bool))[0])
        return (f"{where}:{data_line(where, i)}" if lines else f"{where}, the row at index {frame.index[i]!r}"), i

    info = op_columns(frame["op"].astype("str"))
    cls = info["op_class"]
    bad = (frame["op_class"] != cls).fillna(True)
    if bad.any():
        at, i = first(bad)
        raise KitError(f"{at}: op {frame['op'].iloc[i]} is in op class {cls.iloc[i]}, but op_class says "
                       f"{frame['op_class'].iloc[i]!r}")
    elementwise = cls == "elementwise"  # the predictors read these two on its rows alone
    for col in ("elem_kind", "scalar"):
        bad = elementwise & (frame[col].astype(object) != info[col].astype(object)).fillna(True)
        if bad.any():
            at, i = first(bad)
            given, own = frame[col].iloc[i], info[col].iloc[i]
            word = lambda v: str(v).lower() if isinstance(v, (bool, np.bool_)) else repr(v)  # noqa: E731
            raise KitError(f"{at}: op {frame['op'].iloc[i]} has {col} {word(own)}, but the row's "
                           f"{col} says {'nothing' if pd.isna(given) else word(given)}")
    bad = frame["dtype"].notna() & ~frame["dtype"].isin(DTYPES)
    if bad.any():
        at, i = first(bad)
        raise KitError(f"{at}: unknown dtype {frame['dtype'].iloc[i]!r}; choose one of {', '.join(DTYPES)}")
    for op_class, dims in CLASS_DIMS.items():
        rows = cls == op_class
        for c in dims:
            bad = rows & (frame[c].isna() | (frame[c] < (0 if c == "padding" else 1))).fillna(True)
            if bad.any():
                at, i = first(bad)
                v = frame[c].iloc[i]
                what = "a whole number >= 0" if c == "padding" else "a positive whole number"
                raise KitError(f"{at}: a {frame['op'].iloc[i]} row needs {c} to be {what}, got "
                               f"{'nothing' if pd.isna(v) else v}")
    _check_sizes(frame, cls, first)
