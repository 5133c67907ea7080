"""The collector: benchmark ops with torch on the local device and append schema rows durably.

Timing (latency_ms = mean of the fastest fifth of `repeats` calls, at least one; NeuSight takes
the mean of the 5 fastest of 25):
  * CUDA: a CUDA event pair around each call after `warmup` calls; one extra call under
    torch.profiler gives the kernel names and launch dims (grid, block, blocks/warps per SM).
  * CPU: time.perf_counter_ns around each call.

Each finished measurement is one line appended with flush + fsync (kit.data.records.Appender), so
a killed run keeps everything it finished, and `resume=True` skips every (op, shape, dtype,
device) already in the file.
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

from kit.data import schema
from kit.data.records import Appender, row_key
from kit.data.shapes import shape_kind
from kit.errors import KitError

TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}
OPS_OF_KIND = {"gemm": ("bmm", "linear"), "conv": ("conv",),
               "vec": tuple(o for o, (c, _, _) in schema.OPS.items()
                            if c in ("elementwise", "softmax", "layernorm"))}
SCALAR = {"addu": 1.5, "mulu": 1.5, "divu": 1.5, "powu": 2.5}  # 2.5: not a special-cased exponent


def expand_ops(spec: str | list[str]) -> list[str]:
    """'gemm,softmax,gelu' -> op names; classes expand to every op of the class."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
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


def build_call(op: str, shape: tuple, dtype: str, device: str):
    """A zero-argument callable running op once on fresh seeded inputs."""
    import torch
    import torch.nn.functional as F

    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*size):  # in [0.5, 1.5): no NaNs from pow, no denormals; made on the device
        return (torch.rand(*size, generator=gen, device=device) + 0.5).to(dtype=tdtype)

    if op == "bmm":
        B, M, N, K = shape
        a, b = rand(B, M, N), rand(B, N, K)
        return lambda: torch.bmm(a, b)
    if op == "linear":
        B, M, N, K = shape
        x, w, bias = rand(B, M, N), rand(K, N), rand(K)
        return lambda: F.linear(x, w, bias)
    if op == "conv":
        B, cin, cout, ks, size, stride, pad = shape
        x, w = rand(B, cin, size, size), rand(cout, cin, ks, ks)
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


def summarise_ms(times_ms: list[float]) -> float:
    """Mean of the fastest fifth (at least one) of the timed calls."""
    keep = max(1, len(times_ms) // 5)
    return float(sum(sorted(times_ms)[:keep]) / keep)


def time_cpu(call, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return times


def time_cuda(call, warmup: int, repeats: int) -> list[float]:
    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in pairs]


def profile_cuda(call) -> dict:
    """Kernel names and the main (longest) kernel's launch dims, from one profiled call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        with open(tmp) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(tmp)
    return kernels_from_trace(events)


def kernels_from_trace(events: list[dict]) -> dict:
    """Schema kernel columns from Kineto trace events: every kernel's name, in launch order, and
    the longest one's name, grid, block and blocks/warps per SM."""
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e.get("ts", 0))
    if not kernels:
        return {}
    main = max(kernels, key=lambda e: e.get("dur", 0))
    args = main.get("args", {})
    grid, block = args.get("grid") or [None] * 3, args.get("block") or [None] * 3
    return {"kernel_name": main.get("name"), "kernels": ";".join(e.get("name", "") for e in kernels),
            "n_kernels": len(kernels),
            **dict(zip(("grid_x", "grid_y", "grid_z"), grid)),
            **dict(zip(("block_x", "block_y", "block_z"), block)),
            "blocks_per_sm": args.get("blocks per SM"), "warps_per_sm": args.get("warps per SM")}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def environment(device: str) -> dict:
    """device_name, gpu key and software versions of the device to measure on."""
    import torch

    versions = {"torch_version": torch.__version__,
                "cuda_version": torch.version.cuda if device == "cuda" else None,
                "cudnn_version": (str(torch.backends.cudnn.version())
                                  if device == "cuda" and torch.backends.cudnn.is_available() else None)}
    if device == "cpu":
        return {"device_name": f"cpu: {_cpu_name()}", "gpu": None, **versions}
    if not torch.cuda.is_available():
        raise KitError("--device cuda: no CUDA GPU is visible to torch here; use --device cpu")
    name = torch.cuda.get_device_name()
    from kit.hardware import get_gpu

    try:
        key = get_gpu(name).key
    except KitError:
        raise KitError(f"this GPU, {name!r}, is not in the catalog; add it with --gpu-file FILE "
                       "(the format of `kit gpus --json`) so its rows can be read back") from None
    return {"device_name": name, "gpu": key, **versions}


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


def collect(ops, shapes, out, device: str = "cpu", dtype: str = "fp32", resume: bool = False,
            warmup: int = 5, repeats: int = 25, profile: bool = True, cooldown_ms: float = 0.0,
            progress: bool | None = None, threads: int | None = None) -> dict:
    """Measure every (op, shape) not yet in `out`; returns counts and where the rows went."""
    import torch

    if device not in ("cpu", "cuda"):
        raise KitError(f"--device must be cpu or cuda, got {device!r}")
    if dtype not in TORCH_DTYPES:
        raise KitError(f"--dtype must be one of {', '.join(TORCH_DTYPES)}, got {dtype!r}")
    if dtype == "tf32" and device != "cuda":
        raise KitError("--dtype tf32 needs --device cuda (tf32 is a tensor-core mode)")
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    if not (whole(warmup) and whole(repeats)) or warmup < 0 or repeats < 1:
        raise KitError(f"need whole numbers --warmup >= 0 and --repeats >= 1, got {warmup!r} and "
                       f"{repeats!r}")
    if not (isinstance(cooldown_ms, (int, float)) and 0 <= cooldown_ms < float("inf")):
        raise KitError(f"--cooldown-ms must be a finite number >= 0, got {cooldown_ms!r}")
    if threads is not None and not (whole(threads) and threads >= 1):
        raise KitError(f"--threads must be a whole number >= 1, got {threads!r}")
    ops = expand_ops(ops)
    tasks, unmatched = plan(ops, shapes)
    env = environment(device)
    if threads:
        torch.set_num_threads(threads)
    base = {"dtype": dtype, "source": "collector", "split": "train", **env}
    timer = time_cuda if device == "cuda" else time_cpu
    failed, measured = [], 0
    new = not (Path(out).is_file() and Path(out).stat().st_size > 0)
    with Appender(out, resume=resume) as sink:
        todo, planned = [], set()
        for op, shape in tasks:
            row = {"op": op, **shape_columns(op, shape), **base}
            key = row_key(row)  # e.g. linear (2, 3, k, n) and (1, 6, k, n) are the same GEMM
            if key not in sink and key not in planned:
                todo.append((op, shape, row))
                planned.add(key)
        show = progress if progress is not None else (sys.stderr.isatty() and len(todo) >= 20)
        bar = _progress(len(todo), show)
        with _math_mode(dtype, device), torch.inference_mode():
            for op, shape, row in todo:
                try:
                    call = build_call(op, shape, dtype, device)
                    times = timer(call, warmup, repeats)
                    extra = _kernel_info(call) if device == "cuda" and profile else {}
                except (RuntimeError, MemoryError) as e:  # out of memory, unsupported dtype, ...
                    failed.append({"op": op, "shape": list(shape), "error": str(e).splitlines()[0]})
                    _release(device)
                    bar.update(1)
                    continue
                latency = summarise_ms(times)
                if not (latency > 0 and math.isfinite(latency)):
                    failed.append({"op": op, "shape": list(shape), "error": f"timer gave {latency}"})
                    bar.update(1)
                    continue
                info = schema.op_info(op)
                row.update(op_class=info[0], elem_kind=info[1], scalar=info[2], latency_ms=latency,
                           **extra)
                if row.get("kernel_name"):
                    row.update(zip(("tile_m", "tile_n", "tile_k"), schema.parse_tile(row["kernel_name"])))
                sink.append(row)
                measured += 1
                del call
                bar.update(1)
                if cooldown_ms:
                    time.sleep(cooldown_ms / 1000)
        bar.close()
        total = len(sink.keys)
    if todo and not measured:  # nothing written: a failure, not "0 measured"
        if new:  # the header alone would make the next run ask for --resume
            Path(out).unlink(missing_ok=True)
        first = failed[0]
        raise KitError(f"every measurement failed ({len(failed)}); nothing was written to {out}. "
                       f"First: {first['op']} {tuple(first['shape'])}: {first['error']}")
    return {"out": str(out), "device": env["device_name"], "gpu": env["gpu"], "dtype": dtype,
            "planned": len(tasks), "skipped": len(tasks) - len(todo), "measured": measured,
            "failed": failed, "ops_without_shapes": unmatched, "rows_in_file": total}


def _kernel_info(call) -> dict:
    """profile_cuda, or {} with a warning when the profiler cannot run (the timing still counts)."""
    try:
        return profile_cuda(call)
    except Exception as e:  # CUPTI missing or busy, trace export failing, ...
        warnings.warn(f"torch.profiler failed ({e}); rows get no kernel names", stacklevel=2)
        return {}


def _release(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def _progress(total: int, show: bool):
    from tqdm import tqdm

    return tqdm(total=total, file=sys.stderr, unit="op", desc="collect", dynamic_ncols=True,
                disable=not show)
