"""NeuSight's operator measurements (github.com/sitar-lab/NeuSight, scripts/asplos/) as schema tables.

The data folder (KIT_DATA, default <repo>/../shared/data/neusight) has NeuSight's own layout:

    data/dataset/train/collect/<op>/p2.1.0/<GPU>.csv   part "train-collect" (256,509 rows)
    data/dataset/train/{elem,ln,softmax}.csv           the large-shape subsets NeuSight trains on;
                                                       part "train" = these + collect bmm/linear
    data/dataset/test/{bmm,linear,elem,ln,softmax}.csv part "test" (test/vec.csv is elem+ln+softmax
                                                       again, so it is left out)
    data/dataset_amd/train/collect/<op>/p2.4.1/...     part "amd-train-collect"
    data/dataset_amd/train/{elem,ln,softmax}.csv       part "amd-train"
    data/dataset_amd/test/collect/<op>/p2.4.1/...      part "amd-test"

NeuSight's GEMM convention is mapped to the kit's (k = reduction), see kit.data.schema.
"""
from __future__ import annotations

import os
import re
import shlex
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from kit.data import schema
from kit.data.csv_read import data_line, read_csv_strict
from kit.errors import KitError, need_path

NEUSIGHT_COLUMNS = ("OPName", "Latency", "Device")  # how a NeuSight CSV is recognised
_RENAMES = {"Kernel Name": "kernel_name", "Warps per SM": "warps_per_sm",
            "Blocks per SM": "blocks_per_sm", "Grid x": "grid_x", "Grid y": "grid_y",
            "Grid z": "grid_z", "Block x": "block_x", "Block y": "block_y", "Block z": "block_z"}
_CONV_RENAMES = {"B": "b", "Input_Channel": "in_channels", "Output_Channel": "out_channels",
                 "Kernel_Szie": "kernel_size", "Kernel_Size": "kernel_size",
                 "Input_Size": "input_size", "Stride": "stride", "Padding": "padding"}
_STRINGS = {"OPName": "str", "Device": "str", "Kernel Name": "str", "Kernels": "str",
            "Torch Version": "str", "CUDNN Version": "str", "CUDA Version": "str"}

PARTS = {
    # part: (split, [glob patterns relative to the data dir])
    "train-collect": ("train", ["data/dataset/train/collect/*/*/*.csv"]),
    "train": ("train", ["data/dataset/train/elem.csv", "data/dataset/train/ln.csv",
                        "data/dataset/train/softmax.csv",
                        "data/dataset/train/collect/bmm/*/*.csv",
                        "data/dataset/train/collect/linear/*/*.csv"]),
    "test": ("test", [f"data/dataset/test/{n}.csv" for n in ("bmm", "linear", "elem", "ln", "softmax")]),
    "amd-train-collect": ("train", ["data/dataset_amd/train/collect/*/*/*.csv"]),
    "amd-train": ("train", ["data/dataset_amd/train/elem.csv", "data/dataset_amd/train/ln.csv",
                            "data/dataset_amd/train/softmax.csv"]),
    "amd-test": ("test", ["data/dataset_amd/test/collect/*/*/*.csv"]),
}


def default_data_dir() -> Path:
    """KIT_DATA, else <repo>/../shared/data/neusight, else the `kit data fetch` cache."""
    env = os.environ.get("KIT_DATA")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    shared = repo.parent / "shared" / "data" / "neusight"
    if shared.is_dir():
        return shared
    from kit.data.fetch import fetched_dir

    fetched = fetched_dir()
    return fetched if fetched.is_dir() else shared


def resolve_data_dir(path: str | Path | None = None) -> Path:
    """The NeuSight folder to read; KitError when it is not there."""
    root = Path(need_path(path, "the NeuSight data folder")) if path is not None else default_data_dir()
    if not (root / "data").is_dir() and not (root / "label").is_dir():
        raise KitError(f"NeuSight data not found at {root} (no data/ or label/ folder inside); pass "
                       "--data DIR, set KIT_DATA, or run `kit data fetch neusight`")
    from kit.data.fetch import INCOMPLETE_MARK, fetched_dir

    if (root / INCOMPLETE_MARK).exists():  # some files of the data set only: read as the whole
        again = "" if root.resolve() == fetched_dir().resolve() else f" --dest {shlex.quote(str(root))}"
        raise KitError(f"the download of NeuSight's data into {root} did not finish (some files are "
                       f"missing); run `kit data fetch neusight{again}` again to complete it")
    return root


def part_files(part: str, root: Path) -> list[Path]:
    """The CSV files that make up a part, sorted, relative paths resolved under root."""
    if part not in PARTS:
        raise KitError(f"unknown NeuSight part {part!r}: choose one of {', '.join(PARTS)}")
    files = []
    for pattern in PARTS[part][1]:
        files += sorted(root.glob(pattern))
    if not files:
        raise KitError(f"NeuSight part {part!r}: no files under {root} match "
                       + ", ".join(PARTS[part][1]))
    return files


def read_neusight_csv(path: Path) -> pd.DataFrame:
    """A NeuSight-format CSV as it is on disk (columns unrenamed); KitError when malformed."""
    if Path(path).is_dir():  # e.g. a collect/<op>/p*/<GPU>.csv that is a folder
        raise KitError(f"{path} is a folder, not a CSV file")
    try:
        head = pd.read_csv(path, nrows=0)
    except FileNotFoundError:
        raise KitError(f"file not found: {path}") from None
    except (OSError, EOFError, zlib.error) as e:  # unreadable (permissions, a .gz cut short or damaged)
        raise KitError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    except pd.errors.EmptyDataError:
        raise KitError(f"{path} is empty (expected a NeuSight CSV with a header)") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise KitError(f"{path} is not a readable CSV: {e}") from None
    missing = [c for c in NEUSIGHT_COLUMNS if c not in head.columns]
    if missing:
        raise KitError(f"{path} is not a NeuSight CSV: missing column(s) {', '.join(missing)} "
                       f"(it has {', '.join(map(str, head.columns))})")
    dtypes = {c: t for c, t in _STRINGS.items() if c in head.columns}
    try:
        raw = read_csv_strict(path, str(path), dtype=dtypes, engine="c")
    except (pd.errors.ParserError, ValueError, UnicodeDecodeError) as e:
        raise KitError(f"{path} is malformed: {e}") from None
    except (OSError, EOFError, zlib.error) as e:  # a .gz whose header line read whole, cut short later
        raise KitError(f"cannot read {path}: {e}") from None
    if raw["OPName"].isna().any():
        raise KitError(f"{_where(raw.assign(_file=str(path), _row=np.arange(len(raw))), raw['OPName'].isna())}: "
                       "OPName is empty")
    for op in pd.unique(raw["OPName"]):
        try:
            op_class = schema.op_info(str(op).strip())[0]
        except KitError as e:  # name the first row of the unknown op
            line = data_line(path, int(np.flatnonzero((raw["OPName"] == op).to_numpy())[0]))
            raise KitError(f"{path}:{line}: {e}") from None
        needed = [c for c in _required_dims(op_class) if c not in raw.columns]
        if needed:
            raise KitError(f"{path}: {op} rows need column(s) {', '.join(needed)}; the file has "
                           f"{', '.join(map(str, raw.columns))}")
    return raw.assign(_file=str(path), _row=np.arange(len(raw)), _path_version=_version_from_path(path))


def _required_dims(op_class: str) -> tuple[str, ...]:
    if op_class == "gemm":
        return ("B", "M", "N", "K")
    if op_class == "conv":
        return ("B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride", "Padding")
    return ("B", "H")


def _version_from_path(path: Path) -> str | float:
    hit = re.search(r"(?:^|/)p(\d+\.\d+(?:\.\d+)?)(?:/|$)", Path(path).as_posix())
    return hit.group(1) if hit else np.nan


def _where(raw: pd.DataFrame, bad: pd.Series) -> str:
    """'file:line' of the first row flagged in bad (_row: its row in its own file)."""
    i = int(np.flatnonzero(bad.to_numpy())[0])
    return f"{raw['_file'].iloc[i]}:{data_line(raw['_file'].iloc[i], int(raw['_row'].iloc[i]))}"


# Bounds on a measured shape, far past any real measurement (NeuSight's largest: a dimension of
# 4,194,304 = 2^22, operands of 2^34 elements, a GEMM of 2^43.6 multiply-adds), that keep every
# product the kit forms from the dimensions exact in int64 and float64 (a linear row's m = B*M,
# element counts, FLOPs = 2 * MACs): one dimension <= 2^31, one operand <= 2^40 elements (4 TiB
# in FP32), one op <= 2^53 multiply-adds.
MAX_DIM = 2 ** 31
MAX_ELEMENTS = 2 ** 40
MAX_MACS = 2 ** 53


def _numbers(values: pd.Series) -> pd.Series:
    """values as numbers, NaN where one is none: a bool too (pandas reads a column of True as
    bool, which to_numeric takes for 1: a Latency of True had loaded as 1 ms)."""
    bools = schema.bool_values(values)
    return pd.to_numeric(values.where(~bools) if bools.any() else values, errors="coerce")


def _int_column(raw: pd.DataFrame, col: str, rows: pd.Series, positive: bool = False) -> pd.Series:
    """Whole, non-negative numbers in col where rows is true, or positive ones (a shape's
    dimensions: an op over 0 rows was never measured), at most MAX_DIM; KitError naming
    file:line and the column."""
    values = _numbers(raw[col])
    low = values <= 0 if positive else values < 0
    huge = values > MAX_DIM
    bad = rows & (values.isna() | (values != np.round(values)) | low | huge)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        got = str(raw[col].iloc[i])
        if huge.iloc[i]:
            raise KitError(f"{_where(raw, bad)}: column {col!r} must be at most 2^31 = {MAX_DIM:,} "
                           f"(no measured shape is that large), got {got!r}")
        what = "a positive" if positive else "a non-negative"
        raise KitError(f"{_where(raw, bad)}: column {col!r} must hold {what} whole number, got {got!r}")
    return values.where(rows).astype("Int64")


def _check_sizes(raw: pd.DataFrame, rows: pd.Series, sizes: list, most: int, unit: str) -> None:
    """KitError naming file:line and the columns of the first row (of rows) where a size exceeds
    most; sizes: [(what, columns, float Series), ...], each a product of columns."""
    for what, columns, size in sizes:
        bad = rows & (size > most)
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise KitError(f"{_where(raw, bad)}: {str(raw['OPName'].iloc[i]).strip()} row too large "
                           f"to be a measurement: {what} = {size.iloc[i]:.4g} {unit} (at most "
                           f"2^{most.bit_length() - 1}); check column(s) {', '.join(columns)}")


def _map_unique(values: pd.Series, fn) -> pd.Series:
    table = {v: fn(v) for v in pd.unique(values)}
    return values.map(table)


def _cuda_version(v) -> str | float:
    """'cu121' -> '12.1'."""
    if not isinstance(v, str):
        return np.nan
    hit = re.fullmatch(r"cu(\d+)(\d)", v.strip())
    return f"{hit.group(1)}.{hit.group(2)}" if hit else v


def from_neusight(raw: pd.DataFrame, source: str, split: str) -> pd.DataFrame:
    """Map NeuSight rows (one or many files from read_neusight_csv, concatenated) onto the schema."""
    ops = raw["OPName"].astype("str").str.strip()
    info = schema.op_columns(ops)
    out = pd.DataFrame({"op": ops}, index=raw.index).join(info)
    out["device_name"] = raw["Device"].astype("str").str.strip()
    if out["device_name"].isna().any():
        raise KitError(f"{_where(raw, out['device_name'].isna())}: Device is empty")
    first_file = raw.assign(_device=out["device_name"]).groupby("_device", sort=False)["_file"].first()
    keys = {name: schema.gpu_keys_for(pd.Series([name]), where=f).iloc[0]  # names the file
            for name, f in first_file.items()}
    out["gpu"] = out["device_name"].map(keys)
    out["dtype"] = "fp32"  # NeuSight measured FP32 only (SIMT sgemm, TF32 off)

    latency = _numbers(raw["Latency"])
    bad = ~(np.isfinite(latency) & (latency >= schema.MIN_TIME_MS)  # NaN, zero, negative, infinite, subnormal
            & (latency <= schema.MAX_TIME_MS))  # 1e300: a unit slip or a corrupt cell
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        value = raw["Latency"].iloc[i]
        got = "an empty cell (or NaN)" if pd.isna(value) or not str(value).strip() else repr(str(value))
        raise KitError(f"{_where(raw, bad)}: Latency must be a positive number of ms, got {got} "
                       f"(the least taken is {schema.MIN_TIME_MS:g} ms, the most {schema.MAX_TIME_MS:g} ms: an hour)")
    out["latency_ms"] = latency.astype("float64")

    cls = info["op_class"]
    is_bmm, is_linear, is_conv = (ops == "bmm"), (ops == "linear"), (cls == "conv")
    is_gemm = is_bmm | is_linear
    is_vec = cls.isin(["elementwise", "softmax", "layernorm"])

    def dim(c: str, rows: pd.Series) -> pd.Series:
        if c in raw.columns:
            return _int_column(raw, c, rows, positive=True)
        if rows.any():
            raise KitError(f"{_where(raw, rows)}: needs column {c!r}")
        return pd.Series(pd.NA, index=raw.index, dtype="Int64")

    B = dim("B", is_gemm | is_vec | is_conv)
    M, N, K = (dim(c, is_gemm) for c in ("M", "N", "K"))
    H = dim("H", is_vec)
    f = {name: col.astype("float64").fillna(0.0) for name, col in
         (("B", B), ("M", M), ("N", N), ("K", K), ("H", H))}
    # NeuSight's bmm is [B, M, N] @ [B, N, K]; its linear x [B*M, N] @ W [N, K]
    _check_sizes(raw, is_gemm, [("B*M*N", "BMN", f["B"] * f["M"] * f["N"]),
                                ("B*M*K", "BMK", f["B"] * f["M"] * f["K"])], MAX_ELEMENTS, "elements")
    _check_sizes(raw, is_bmm, [("B*N*K", "BNK", f["B"] * f["N"] * f["K"])], MAX_ELEMENTS, "elements")
    _check_sizes(raw, is_linear, [("N*K", "NK", f["N"] * f["K"])], MAX_ELEMENTS, "elements")
    _check_sizes(raw, is_gemm, [("B*M*N*K", "BMNK", f["B"] * f["M"] * f["N"] * f["K"])], MAX_MACS,
                 "multiply-adds")
    _check_sizes(raw, is_vec, [("B*H", "BH", f["B"] * f["H"])], MAX_ELEMENTS, "elements")
    out["b"] = B.where(is_bmm | is_conv, pd.Series(1, index=raw.index, dtype="Int64").where(is_linear))
    out["m"] = M.where(is_bmm, (B * M).where(is_linear))
    out["k"] = N.where(is_gemm)
    out["n"] = K.where(is_gemm)
    out["rows"] = B.where(is_vec)
    out["cols"] = H.where(is_vec)
    conv = {}
    for src, dst in _CONV_RENAMES.items():
        if src != "B" and src in raw.columns:
            # positive but the padding, as schema.check_rows has a kit CSV's: a Stride of 0 (or
            # 0 channels, a kernel or input of side 0) had loaded, where the kit format refused it
            out[dst] = _int_column(raw, src, is_conv, positive=dst != "padding")
            conv[dst] = out[dst].astype("float64").fillna(0.0)
    if is_conv.any():  # (read_neusight_csv made sure conv rows have every column)
        k_col = "Kernel_Size" if "Kernel_Size" in raw.columns else "Kernel_Szie"  # as out reads it
        b, cin, cout, k = f["B"], conv["in_channels"], conv["out_channels"], conv["kernel_size"]
        side = conv["input_size"] + 2 * conv["padding"]  # no output side is larger
        _check_sizes(raw, is_conv, [
            ("B*Input_Channel*Input_Size^2", ("B", "Input_Channel", "Input_Size"),
             b * cin * conv["input_size"] ** 2),
            (f"Output_Channel*Input_Channel*{k_col}^2", ("Output_Channel", "Input_Channel", k_col),
             cout * cin * k ** 2),
            ("B*Output_Channel*(Input_Size+2*Padding)^2", ("B", "Output_Channel", "Input_Size", "Padding"),
             b * cout * side ** 2)], MAX_ELEMENTS, "elements")
        _check_sizes(raw, is_conv, [
            (f"B*Output_Channel*Input_Channel*{k_col}^2*(Input_Size+2*Padding)^2",
             ("B", "Output_Channel", "Input_Channel", k_col, "Input_Size", "Padding"),
             b * cout * cin * k ** 2 * side ** 2)], MAX_MACS, "multiply-adds")

    for src, dst in _RENAMES.items():
        if src in raw.columns:
            out[dst] = raw[src]
    if "Kernels" in raw.columns:
        kernels = raw["Kernels"].astype("str").str.strip(";")
        out["kernels"] = kernels
        out["n_kernels"] = kernels.str.count(";").add(1).where(kernels.notna() & (kernels != ""))
    out = out.join(schema.tile_columns(raw["Kernel Name"] if "Kernel Name" in raw
                                       else pd.Series(np.nan, index=raw.index)))
    out["source"] = source
    out["split"] = split
    torch_v = raw["Torch Version"].str.lstrip("p") if "Torch Version" in raw else None
    out["torch_version"] = raw["_path_version"] if torch_v is None else torch_v.fillna(raw["_path_version"])
    if "CUDA Version" in raw.columns:
        out["cuda_version"] = _map_unique(raw["CUDA Version"], _cuda_version)
    if "CUDNN Version" in raw.columns:
        out["cudnn_version"] = raw["CUDNN Version"]
    return schema.conform(out)


def read_part(part: str, root: Path, files: list[Path] | None = None) -> pd.DataFrame:
    """Rows of one part (or of some of its files), uncached; see load_neusight."""
    split = PARTS[part][0]
    files = part_files(part, root) if files is None else files
    raw = pd.concat([read_neusight_csv(f) for f in files], ignore_index=True)
    return from_neusight(raw, f"neusight:{part}", split)


def _wanted(ops, gpus) -> tuple[list[str] | None, list[str] | None]:
    """Validated op names/classes and GPU catalog keys to keep (None: all)."""
    if ops is not None:
        ops = [ops] if isinstance(ops, str) else list(ops)
        unknown = [o for o in ops if o not in schema.OPS and o not in schema.OP_CLASSES]
        if unknown:
            raise KitError(f"unknown op(s) {unknown}: choose ops ({', '.join(schema.OPS)}) "
                           f"or op classes ({', '.join(schema.OP_CLASSES)})")
    if gpus is not None:
        from kit.hardware import keys_of

        gpus = keys_of(gpus)
    return ops, gpus


def _file_may_hold(path: Path, ops, gpus) -> bool:
    """False only for a per-op, per-GPU collect file (collect/<op>/p*/<GPU>.csv) of other ops/GPUs."""
    if path.parent.parent.parent.name != "collect" or path.parent.parent.name not in schema.OPS:
        return True
    op = path.parent.parent.name
    if ops is not None and op not in ops and schema.OPS[op][0] not in ops:
        return False
    if gpus is not None:
        from kit.hardware import get_gpu

        try:
            return get_gpu(path.stem).key in gpus
        except KitError:
            return True  # read it, so the unknown device is reported
    return True


def load_neusight(part: str = "train-collect", data_dir: str | Path | None = None, ops=None,
                  gpus=None, cache: bool = True) -> pd.DataFrame:
    """NeuSight measurements of one part as a schema table (cached as parquet after the first read).

    part: "train-collect" | "train" | "test" | "amd-train-collect" | "amd-train" | "amd-test".
    ops: op names ("bmm") and/or op classes ("gemm") to keep; gpus: GPU keys/names to keep.
    Per-op, per-GPU files that cannot hold a wanted row are not read at all.
    """
    import hashlib

    from kit.data.cache import cached_table

    root = resolve_data_dir(data_dir)
    ops, gpus = _wanted(ops, gpus)
    every = part_files(part, root)
    files = [f for f in every if _file_may_hold(f, ops, gpus)]
    if not files:
        return schema.empty()
    name = f"neusight-{part}"
    if len(files) < len(every):  # a subset gets its own cache entry
        name += "-" + hashlib.sha256("|".join(map(str, files)).encode()).hexdigest()[:10]
    build = lambda: read_part(part, root, files)  # noqa: E731
    frame = cached_table(name, files, build) if cache else build()
    if ops is not None:
        frame = frame[frame["op"].isin(ops) | frame["op_class"].isin(ops)]
    if gpus is not None:
        frame = frame[frame["gpu"].isin(gpus)]
    return frame.reset_index(drop=True)
