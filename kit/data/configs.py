"""NeuSight's JSON side: whole-model labels, model configs and device configs.

    label/<GPU>/<model>-<train|inf>-<seq>-<batch>[-<option>].json
        {num_layer, e2e_latency, fw_latency, bwall_latency} in ms. option: "fusion"
        (torch.compile), "dp4", "tp4", "pp4_1" (4 GPUs, Megatron-style; only e2e is meaningful)
    label/<GPU>/<model>-....csv   per-FX-node latencies of a one-layer model
    data/DLmodel_configs/<name>.json       HF-style model configs
    data/device_configs/*.json (+ dataset*/{train,test}/device_configs/)
        Freq MHz, SingleFLOPs GFLOP/s, Mem_Bw GB/s, L2Cache MB, Dev_Mem GB
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from kit.data.csv_read import data_line, read_csv_strict
from kit.data.neusight import resolve_data_dir
from kit.errors import KitError, one_line

LABEL_NAME = re.compile(r"^(?P<model>[A-Za-z0-9_.]+)-(?P<mode>train|inf)-(?P<seq>\d+)-(?P<batch>\d+)"
                        r"(?:-(?P<option>[A-Za-z0-9_]+))?$")
LABEL_COLUMNS = ["gpu", "device_dir", "model", "mode", "seq", "batch", "option", "num_gpus",
                 "num_layer", "e2e_latency_ms", "fw_latency_ms", "bwall_latency_ms", "path"]
_GPUS_IN_OPTION = re.compile(r"^(?:dp|tp|pp)(\d+)")
# The largest batch and seq a label's name may give, and their product (tokens). No whole-model
# measurement comes near (NeuSight's labels: batch <= 16, seq <= 2048); beyond them the model's
# tensors overflow int64 sizes and the capture fails with a torch error instead of a prediction.
MAX_LABEL_BATCH = MAX_LABEL_SEQ = 2 ** 31
MAX_LABEL_TOKENS = 2 ** 40


def read_json(path: Path):
    """A JSON file's content; one KitError naming the file when it cannot be read or parsed."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise KitError(f"{path} is not valid JSON: {e.msg} at line {e.lineno}") from None
    except UnicodeDecodeError:  # before ValueError, its base class
        raise KitError(f"{path} is not JSON text (binary data, or not UTF-8)") from None
    except (ValueError, RecursionError) as e:  # a 5,000-digit number, arrays nested too deep
        raise KitError(f"{path} is not valid JSON: {one_line(e, with_type=False)}") from None
    except IsADirectoryError:
        raise KitError(f"{path} is a folder, not a JSON file") from None
    except OSError as e:
        raise KitError(f"cannot read {path}: {e.strerror or e}") from None


def _device_key(name: str, where: Path) -> str:
    from kit.hardware import get_gpu

    try:
        return get_gpu(name).key
    except KitError as e:
        raise KitError(f"device {name!r} ({where}) is not in the GPU catalog ({e})") from None


def parse_label_name(stem: str, where: Path | None = None) -> dict:
    """'gpt2_large-train-1024-4-dp4' -> {model, mode, seq, batch, option, num_gpus}."""
    hit = LABEL_NAME.match(stem)
    if not hit:
        raise KitError(f"label file {where or stem}: name must be "
                       "<model>-<train|inf>-<seq>-<batch>[-option]")
    sizes = {}
    for key, most in (("seq", MAX_LABEL_SEQ), ("batch", MAX_LABEL_BATCH)):
        digits = hit[key].lstrip("0") or "0"
        if len(digits) > len(str(most)) or int(digits) > most:  # no int() of a 5,000-digit name
            shown = digits if len(digits) <= 30 else digits[:12] + "..." + digits[-6:]
            raise KitError(f"label file {where or stem}: {key} {shown} is too large "
                           f"(at most {most:,})")
        sizes[key] = int(digits)
    if sizes["seq"] * sizes["batch"] > MAX_LABEL_TOKENS:
        raise KitError(f"label file {where or stem}: batch x seq = {sizes['batch'] * sizes['seq']:,} "
                       f"tokens is too large (at most 2^40 = {MAX_LABEL_TOKENS:,})")
    option = hit["option"]
    many = _GPUS_IN_OPTION.match(option or "")
    return {"model": hit["model"], "mode": hit["mode"], "seq": sizes["seq"],
            "batch": sizes["batch"], "option": option if option else np.nan,
            "num_gpus": int(many.group(1)) if many else 1}


def label_e2e_ms(data: dict) -> float:
    """A label's e2e_latency: a finite number of ms > 0 (not a bool or a string); ValueError
    saying what is wrong. kit validate and load_labels share the rule."""
    if "e2e_latency" not in data:
        raise ValueError("missing key e2e_latency (the measured ms)")
    from kit.data.schema import MAX_TIME_MS, MIN_TIME_MS

    value = data["e2e_latency"]
    # 5e-324 had scored an APE of inf%; 1e300 one of 100% (NeuSight's longest label: 7,480 ms)
    if not _finite(value) or not MIN_TIME_MS <= value <= MAX_TIME_MS:
        raise ValueError(f"e2e_latency must be a positive number of ms, got {value!r} (the "
                         f"least taken is {MIN_TIME_MS:g} ms, the most {MAX_TIME_MS:g} ms: an hour)")
    return float(value)


def label_phase_ms(data: dict, key: str) -> float | None:
    """A label's optional phase time (fw_latency, bwall_latency): None when absent or null, else
    a finite number of ms >= 0 (NeuSight writes 0 where a phase was not measured); ValueError
    saying what is wrong."""
    value = data.get(key)
    if value is None:
        return None
    if not _finite(value) or value < 0:
        raise ValueError(f"{key} must be a number of ms >= 0, got {value!r}")
    return float(value)


PHASE_SLACK = 0.01  # a phase may exceed the step it is part of by this share (timer rounding)


def label_times_ms(data: dict) -> tuple:
    """(e2e, fw, bwall) of a label (label_e2e_ms, label_phase_ms), the phases no longer than
    the step they are parts of: ValueError saying which is not. (NeuSight's 99 labels hold: the
    forward is at most the step, forward + backward at most 1.0x it.)"""
    e2e = label_e2e_ms(data)
    fw, bwall = (label_phase_ms(data, k) for k in ("fw_latency", "bwall_latency"))
    top = e2e * (1 + PHASE_SLACK)
    if fw is not None and fw > top:
        raise ValueError(f"fw_latency {fw:g} ms is longer than the whole step, e2e_latency {e2e:g} ms")
    if fw is not None and bwall is not None and fw + bwall > top:
        raise ValueError(f"fw_latency + bwall_latency = {fw + bwall:g} ms is longer than the whole "
                         f"step, e2e_latency {e2e:g} ms")
    return e2e, fw, bwall


def _finite(value) -> bool:
    """A JSON number (not a bool, a string or null) that is finite as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past float's range
        return False


def load_labels(data_dir: str | Path | None = None) -> pd.DataFrame:
    """Every whole-model label JSON, one row each (latencies in ms; num_layer <NA> where null)."""
    root = resolve_data_dir(data_dir)
    files = sorted((root / "label").glob("*/*.json"))
    if not files:
        raise KitError(f"no label JSON files under {root / 'label'} (expected label/<GPU>/<model>-....json)")
    rows = []
    for f in files:
        data = read_json(f)
        missing = [k for k in ("e2e_latency", "fw_latency", "bwall_latency", "num_layer")
                   if not isinstance(data, dict) or k not in data]
        if missing:
            raise KitError(f"label {f}: missing key(s) {', '.join(missing)}")
        try:  # the rules kit validate skips a label by
            e2e, fw, bwall = label_times_ms(data)
        except ValueError as e:
            raise KitError(f"label {f}: {e}") from None
        rows.append({"gpu": _device_key(f.parent.name, f), "device_dir": f.parent.name,
                     **parse_label_name(f.stem, f), "num_layer": _number(data, "num_layer", f),
                     "e2e_latency_ms": e2e, "fw_latency_ms": np.nan if fw is None else fw,
                     "bwall_latency_ms": np.nan if bwall is None else bwall, "path": str(f)})
    frame = pd.DataFrame(rows, columns=LABEL_COLUMNS)
    return frame.astype({"seq": "int64", "batch": "int64", "num_gpus": "int64", "num_layer": "Int64"})


def _number(data: dict, key: str, where: Path) -> float:
    """A label value as a float; null (NeuSight writes it for some num_layer) becomes NaN."""
    value = data[key]
    if value is None:
        return np.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KitError(f"label {where}: {key} must be a number, got {value!r}")
    return float(value)


NODE_COLUMNS = {"Name": "name", "op": "fx_op", "target": "target", "input_shapes": "input_shapes",
                "output_shape": "output_shape", "dtype": "dtype", "latency": "latency_ms",
                "fw_latency": "fw_latency_ms", "bw_latency": "bw_latency_ms",
                "acc_latency": "acc_latency_ms", "meta": "module_stack"}


def load_label_nodes(data_dir: str | Path | None = None,
                     labels_dir: str | Path | None = None) -> pd.DataFrame:
    """The per-FX-node label CSVs (a one-layer model, latencies in ms), one row per node, from
    data_dir/label or from labels_dir itself (a folder of <GPU>/<model>-....csv)."""
    root = Path(labels_dir) if labels_dir is not None else resolve_data_dir(data_dir) / "label"
    frames = []
    for f in sorted(root.glob("*/*.csv")):
        if f.is_dir():  # a folder named *.csv (read_csv had raised IsADirectoryError)
            continue
        try:
            raw = read_csv_strict(f, f"label CSV {f}")
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise KitError(f"label CSV {f} is malformed: {e}") from None
        except OSError as e:  # a link to nothing had been skipped without a word (not is_file)
            raise KitError(f"cannot read label CSV {f}: {e.strerror or e}") from None
        if "latency" not in raw.columns and "e2e_latency" in raw.columns:
            raw = raw.rename(columns={"e2e_latency": "latency"})  # one file names it so
        if "meta" not in raw.columns:
            raw = raw.assign(meta="")  # the module stack is optional: it only names modules
        missing = [c for c in NODE_COLUMNS if c not in raw.columns]
        if missing:
            raise KitError(f"label CSV {f}: missing column(s) {', '.join(missing)}")
        part = raw[list(NODE_COLUMNS)].rename(columns=NODE_COLUMNS)
        for name in ("latency", "fw_latency", "bw_latency", "acc_latency"):
            # text in a latency had reached label_kernel_pairs' comparison as a TypeError
            col = NODE_COLUMNS[name]
            values = pd.to_numeric(part[col], errors="coerce")
            bad = values.isna() & part[col].notna() & (part[col].astype(str).str.strip() != "")
            if bad.any():
                i = int(np.flatnonzero(bad.to_numpy())[0])
                raise KitError(f"label CSV {f}:{data_line(f, i)}: column {name!r} must hold a latency in ms, "
                               f"got {part[col].iloc[i]!r}")
            part[col] = values
        part["module_stack"] = part.module_stack.fillna("").astype(str)
        meta = {"gpu": _device_key(f.parent.name, f), "device_dir": f.parent.name,
                **parse_label_name(f.stem, f)}
        for key in ("num_gpus", "option"):
            meta.pop(key)
        frames.append(part.assign(**meta))
    if not frames:
        raise KitError(f"no per-node label CSVs under {root}")
    frame = pd.concat(frames, ignore_index=True)
    lead = ["gpu", "device_dir", "model", "mode", "seq", "batch"]
    return frame[lead + [c for c in frame.columns if c not in lead]]


def label_gemm_shape(fx_op: str, target: str, input_shapes: str, output_shape: str,
                     module_stack: str = ""):
    """(kind, b, m, n, k) of a per-node label's GEMM, in kit.ops.Gemm's orientation (output
    m x n, reduction k), or None for any other node. kind: "addmm" (HF GPT-2's Conv1D,
    addmm(bias, x[M,K], W[K,N]): both operands row-major), "linear" (an nn.Linear module,
    x @ W.t()) or "matmul" (a 4-d matmul, [B,H,S,D] by [B,H,D,T])."""
    import ast

    try:
        shp = ast.literal_eval(str(input_shapes))
    except (ValueError, SyntaxError):
        return None
    if not isinstance(shp, (list, tuple)):
        return None
    if "addmm" in target and len(shp) == 3 and len(shp[1]) == 2 and len(shp[2]) == 2:
        (m, k), (_, n) = shp[1], shp[2]
        return "addmm", 1, m, n, k
    if "matmul" in target and len(shp) == 2 and len(shp[0]) == 4 and len(shp[1]) == 4:
        a, b = shp
        return "matmul", a[0] * a[1], a[2], b[3], a[3]
    classes = re.findall(r"<class '([^']+)'>", str(module_stack))
    if (fx_op == "call_module" and classes and classes[-1].endswith(".Linear") and len(shp) == 1
            and shp[0]):
        try:
            n = ast.literal_eval(str(output_shape))[-1]
        except (ValueError, SyntaxError, TypeError, IndexError):
            return None
        return "linear", 1, math.prod(shp[0][:-1]), n, shp[0][-1]
    return None


def label_gemm_nodes(nodes: pd.DataFrame) -> pd.DataFrame:
    """The GEMM nodes of load_label_nodes' table, with kind, b, m, n, k (label_gemm_shape)."""
    found = [label_gemm_shape(*r) for r in zip(
        nodes.fx_op.astype(str), nodes.target.astype(str), nodes.input_shapes.astype(str),
        nodes.output_shape.astype(str), nodes.module_stack.astype(str))]
    keep = [i for i, f in enumerate(found) if f is not None]
    dims = pd.DataFrame([found[i] for i in keep], columns=["kind", "b", "m", "n", "k"],
                        index=nodes.index[keep])
    return nodes.loc[dims.index].join(dims)


GEMM_DIMS = ["gpu", "b", "m", "n", "k"]


def label_kernel_pairs(nodes: pd.DataFrame, kernels: pd.DataFrame, min_ms: float = 0.2,
                       by_op: bool = False) -> pd.DataFrame:
    """The GEMM label nodes (label_gemm_nodes) beside the fastest op-level measurement of the
    same GPU and shape in `kernels` (a measurement table, e.g. NeuSight's test sets): their
    columns plus kernel_ms and ratio = fw_latency_ms / kernel_ms. Nodes under min_ms (launch
    noise) and shapes with no measurement are left out; by_op keeps one row per kernel op
    (linear or bmm rows) matched, in column `op`."""
    gemm = kernels[kernels.op_class == "gemm"]
    keys = ["op", *GEMM_DIMS] if by_op else GEMM_DIMS
    fastest = gemm.groupby(keys).latency_ms.min().rename("kernel_ms").reset_index()
    timed = nodes[nodes.gpu.notna() & (nodes.fw_latency_ms > min_ms)]
    timed = timed.astype({c: int for c in GEMM_DIMS[1:]})
    pairs = timed.merge(fastest, on=GEMM_DIMS)
    return pairs.assign(ratio=pairs.fw_latency_ms / pairs.kernel_ms)


def load_model_configs(data_dir: str | Path | None = None) -> dict[str, dict]:
    """NeuSight's model configs: {"gpt2_large": {...HF config...}, ...}."""
    root = resolve_data_dir(data_dir)
    files = sorted((root / "data" / "DLmodel_configs").glob("*.json"))
    if not files:
        raise KitError(f"no model configs under {root / 'data' / 'DLmodel_configs'}")
    return {f.stem: read_json(f) for f in files}


DEVICE_FIELDS = {"Dev_Mem": "memory_gb", "Mem_Bw": "mem_bw_gbs", "Num_Sm": "sm_count",
                 "Core_Per_SM": "cores_per_sm", "Freq": "clock_mhz", "SingleFLOPs": "fp32_gflops",
                 "SingleFLOPsMM": "fp32_matrix_gflops", "SingleFLOPsVEC": "fp32_vector_gflops",
                 "L2Cache": "l2_cache_mb"}


def load_device_configs(data_dir: str | Path | None = None) -> pd.DataFrame:
    """Every NeuSight device config, one row per file, units in the column names.

    `gpu` is the catalog key of the config's Device string (NaN when the catalog lacks it);
    `folder` is where the file lives (data/device_configs, data/dataset/test/device_configs, ...).
    """
    from kit.hardware import get_gpu

    root = resolve_data_dir(data_dir)
    files = sorted(root.glob("data/device_configs/*.json")) + \
        sorted(root.glob("data/dataset*/*/device_configs/*.json"))
    if not files:
        raise KitError(f"no device configs under {root / 'data'}")
    rows = []
    for f in files:
        data = read_json(f)
        if not isinstance(data, dict) or "Device" not in data:
            raise KitError(f"device config {f}: missing key 'Device'")
        try:
            key = get_gpu(data["Device"]).key
        except KitError:
            key = np.nan
        row = {"device_name": data["Device"], "gpu": key, "config": f.stem,
               "folder": f.parent.relative_to(root).as_posix()}
        row.update({name: data.get(src, np.nan) for src, name in DEVICE_FIELDS.items()})
        rows.append(row)
    return pd.DataFrame(rows)
