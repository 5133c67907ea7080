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
from pathlib import Path

import numpy as np
import pandas as pd

from kit.data import schema
from kit.errors import KitError

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
    root = Path(path) if path is not None else default_data_dir()
    if not (root / "data").is_dir() and not (root / "label").is_dir():
        raise KitError(f"NeuSight data not found at {root} (no data/ or label/ folder inside); pass "
                       "--data DIR, set KIT_DATA, or run `kit data fetch neusight`")
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
    try:
        head = pd.read_csv(path, nrows=0)
    except FileNotFoundError:
        raise KitError(f"file not found: {path}") from None
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
        return pd.read_csv(path, dtype=dtypes, engine="c")
    except (pd.errors.ParserError, ValueError, UnicodeDecodeError) as e:
        raise KitError(f"{path} is malformed: {e}") from None


def _required_dims(op_class: str, op: str) -> tuple[str, ...]:
    if op_class == "gemm":
        return ("B", "M", "N", "K")
    if op_class == "conv":
        return ("B", "Input_Channel", "Output_Channel", "Input_Size", "Stride", "Padding")
    return ("B", "H")


def _version_from_path(path: Path) -> str | float:
    hit = re.search(r"(?:^|/)p(\d+\.\d+(?:\.\d+)?)(?:/|$)", path.as_posix())
    return hit.group(1) if hit else np.nan


def _int_column(raw: pd.DataFrame, col: str, path: Path) -> pd.Series:
    values = pd.to_numeric(raw[col], errors="coerce")
    bad = raw[col].notna() & (values.isna() | (values != np.round(values)) | (values < 0))
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise KitError(f"{path}: column {col!r} must hold whole numbers; row {row + 2} has "
                       f"{raw[col].iloc[row]!r}")
    return values.astype("Int64")


def from_neusight(raw: pd.DataFrame, path: Path, source: str, split: str) -> pd.DataFrame:
    """Map one NeuSight CSV (as read) onto the schema."""
    ops = raw["OPName"].astype("str").str.strip()
    info = schema.op_columns(ops) if ops.notna().all() else None
    if info is None:
        raise KitError(f"{path}: column 'OPName' has empty values")
    out = pd.DataFrame(index=raw.index)
    out["op"] = ops
    out = out.join(info)
    for op_class in pd.unique(info["op_class"]):
        needed = [c for c in _required_dims(op_class, "") if c not in raw.columns]
        if op_class == "conv" and "Kernel_Szie" not in raw and "Kernel_Size" not in raw:
            needed.append("Kernel_Size")
        if needed:
            raise KitError(f"{path}: {op_class} rows need column(s) {', '.join(needed)}; "
                           f"the file has {', '.join(map(str, raw.columns))}")
    out["device_name"] = raw["Device"].astype("str")
    out["gpu"] = schema.gpu_keys_for(out["device_name"], where=str(path))
    out["dtype"] = "fp32"  # NeuSight measured FP32 only (SIMT sgemm, TF32 off)

    latency = pd.to_numeric(raw["Latency"], errors="coerce")
    if latency.isna().any() or (latency <= 0).any():
        row = int(np.flatnonzero((latency.isna() | (latency <= 0)).to_numpy())[0])
        raise KitError(f"{path}: column 'Latency' must be a positive number of ms; row {row + 2} "
                       f"has {raw['Latency'].iloc[row]!r}")
    out["latency_ms"] = latency.astype("float64")

    cls = info["op_class"]
    dims = {c: _int_column(raw, c, path) for c in ("B", "M", "N", "K", "H") if c in raw.columns}
    na = pd.Series(pd.array([None] * len(raw), dtype="Int64"), index=raw.index)
    is_bmm, is_linear = (ops == "bmm"), (ops == "linear")
    is_vec = cls.isin(["elementwise", "softmax", "layernorm"])
    B, M, N, K, H = (dims.get(c, na) for c in ("B", "M", "N", "K", "H"))
    out["b"] = B.where(is_bmm, 1).where(is_bmm | is_linear, B.where(cls == "conv", na))
    out["m"] = M.where(is_bmm, B * M).where(is_bmm | is_linear, na)
    out["k"] = N.where(is_bmm | is_linear, na)
    out["n"] = K.where(is_bmm | is_linear, na)
    out["rows"] = B.where(is_vec, na)
    out["cols"] = H.where(is_vec, na)
    for src, dst in _CONV_RENAMES.items():
        if src != "B" and src in raw.columns:
            out[dst] = _int_column(raw, src, path).where(cls == "conv", na)

    for src, dst in _RENAMES.items():
        if src in raw.columns:
            out[dst] = raw[src]
    if "Kernels" in raw.columns:
        kernels = raw["Kernels"].astype("str").str.strip(";")
        out["kernels"] = kernels
        out["n_kernels"] = kernels.str.count(";").add(1).where(kernels.notna() & (kernels != ""))
    out = out.join(schema.tile_columns(raw.get("Kernel Name", pd.Series(np.nan, index=raw.index))))
    out["source"] = source
    out["split"] = split
    if "Torch Version" in raw.columns:
        out["torch_version"] = raw["Torch Version"].str.lstrip("p")
    else:
        out["torch_version"] = _version_from_path(path)
    if "CUDA Version" in raw.columns:  # "cu121" -> "12.1"
        cu = raw["CUDA Version"].str.extract(r"^cu(\d+)(\d)$")
        out["cuda_version"] = (cu[0] + "." + cu[1]).where(cu[0].notna(), raw["CUDA Version"])
    if "CUDNN Version" in raw.columns:
        out["cudnn_version"] = raw["CUDNN Version"]
    return schema.conform(out)


def read_part(part: str, root: Path) -> pd.DataFrame:
    """Every row of one part, uncached (see load_neusight for the cached, filtered version)."""
    split = PARTS[part][0]
    frames = [from_neusight(read_neusight_csv(f), f, f"neusight:{part}", split)
              for f in part_files(part, root)]
    return pd.concat(frames, ignore_index=True)


def _select(frame: pd.DataFrame, ops, gpus) -> pd.DataFrame:
    if ops is not None:
        wanted = [ops] if isinstance(ops, str) else list(ops)
        unknown = [o for o in wanted if o not in schema.OPS and o not in schema.OP_CLASSES]
        if unknown:
            raise KitError(f"unknown op(s) {unknown}: choose ops ({', '.join(schema.OPS)}) "
                           f"or op classes ({', '.join(schema.OP_CLASSES)})")
        frame = frame[frame["op"].isin(wanted) | frame["op_class"].isin(wanted)]
    if gpus is not None:
        from kit.hardware import get_gpu

        wanted = [gpus] if isinstance(gpus, str) else list(gpus)
        frame = frame[frame["gpu"].isin([get_gpu(g).key for g in wanted])]
    return frame.reset_index(drop=True)


def load_neusight(part: str = "train-collect", data_dir: str | Path | None = None, ops=None,
                  gpus=None, cache: bool = True) -> pd.DataFrame:
    """NeuSight measurements of one part as a schema table (cached as parquet after the first read).

    part: "train-collect" | "train" | "test" | "amd-train-collect" | "amd-train" | "amd-test".
    ops: op names ("bmm") and/or op classes ("gemm") to keep; gpus: GPU keys/names to keep.
    """
    from kit.data.cache import cached_table

    root = resolve_data_dir(data_dir)
    files = part_files(part, root)
    if cache:
        frame = cached_table(f"neusight-{part}", files, lambda: read_part(part, root))
    else:
        frame = read_part(part, root)
    return _select(frame, ops, gpus)
