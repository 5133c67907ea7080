"""The collector: benchmark ops with torch on the local device and append schema rows durably.

Timing (latency_ms = mean of the fastest fifth of `repeats` calls, at least one; NeuSight takes
the mean of the 5 fastest of 25; latency_median_ms = their median):
  * CUDA: before the first shape of each op (a shape group) its largest shape runs for at least
    `warmup_ms` (default 1000 ms on CUDA) so that clocks leave idle; each shape then gets `warmup`
    untimed calls. Each timed call has its own CUDA event pair. With `l2_flush` (the default on
    CUDA, as triton's do_bench) a buffer of twice the GPU's L2 (at least 8 MiB; the size from
    torch.cuda.get_device_properties, else the kit's catalog) is overwritten before each timed
    call, outside the event pair: operands are read from HBM as in a real step, not from L2.
    The flush kernel also puts the GPU behind the CPU, so the event pair holds the GPU's time
    with little of the host's dispatch. One extra call (after a flush) under torch.profiler
    gives the kernel names, launch dims (grid, block, blocks/warps per SM) and kernel_ms, the
    summed device time of the call's kernels (GPU time only).
  * CPU: time.perf_counter_ns around each call (no flush; warmup_ms defaults to 0).

Inputs: GEMMs and conv read signed data (activations standard normal, weights and bias
N(0, 0.02)); vector ops read U[0.5, 1.5) (no NaNs from pow, no denormals). linear has a bias
unless `bias=False` (Llama's projections have none; NeuSight's data has one).

Each finished measurement is one line appended with flush + fsync, so a killed run keeps
everything it finished, and `resume=True` skips every (op, shape, dtype, device) already in the
file. Beside FILE.csv: FILE.meta.json (provenance: device, driver, versions, nvidia-smi
snapshots, torch flags and every collector setting; written at the start of a run and updated at
its end, one entry per run) and FILE.failed.jsonl (one line per failed measurement). A CUDA error
(illegal address, device-side assert: the context is lost) stops the run cleanly.

Rows carry kernel_ms and latency_median_ms (kit.data.schema.COLUMNS, the last two); a file
from before them is resumed in its own format.
"""
from __future__ import annotations

import csv
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from kit.data import schema
from kit.data.records import Appender, append_jsonl, row_key
from kit.data.shapes import shape_kind
from kit.errors import KitError, one_line

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


def summarise_ms(times_ms: list[float]) -> float:
    """Mean of the fastest fifth (at least one) of the timed calls."""
    keep = max(1, len(times_ms) // 5)
    return float(sum(sorted(times_ms)[:keep]) / keep)


def time_cpu(call, warmup: int, repeats: int, flush=None, before=None) -> list[float]:
    """perf_counter times of `repeats` calls after `warmup`; flush() and before() (when given) run
    before each call, outside the timed region."""
    for _ in range(warmup):
        if before is not None:
            before()
        call()
    times = []
    for _ in range(repeats):
        if flush is not None:
            flush()
        if before is not None:
            before()
        t0 = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return times


def time_cuda(call, warmup: int, repeats: int, flush=None, before=None) -> list[float]:
    """CUDA event times of `repeats` calls after `warmup`; flush() (an L2 flush) and before()
    (e.g. a forward pass whose backward is timed) run before each call, outside the events."""
    import torch

    for _ in range(warmup):
        if before is not None:
            before()
        call()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(repeats):
        if flush is not None:
            flush()
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in pairs]


def warm_for(call, seconds: float, sync=None, clock=time.perf_counter, max_calls: int = 1 << 20) -> int:
    """Run call back to back for at least `seconds` (sync()ed before the clock is read); returns
    the number of calls. Batches grow to what the time left allows, so a slow op overshoots by
    about one call, and a fast one needs few syncs."""
    if not seconds or seconds <= 0:
        return 0
    t0, n, batch = clock(), 0, 1
    while True:
        for _ in range(batch):
            call()
        n += batch
        if sync is not None:
            sync()
        spent = clock() - t0
        if spent >= seconds or n >= max_calls:
            return n
        per_call = spent / n
        left = int((seconds - spent) / per_call) + 1 if per_call > 0 else 2 * batch
        batch = max(1, min(2 * batch, left, max_calls - n))


def l2_bytes(device_index: int | None = None) -> tuple[int | None, str]:
    """The GPU's L2 in bytes and where the number came from: torch's device properties, else the
    kit's catalog entry of the device name; (None, "unknown") without either."""
    import torch

    idx = torch.cuda.current_device() if device_index is None else device_index
    try:
        size = int(getattr(torch.cuda.get_device_properties(idx), "L2_cache_size", 0) or 0)
    except Exception:  # noqa: BLE001 - an old torch, a driver that does not say
        size = 0
    if size > 0:
        return size, "torch.cuda.get_device_properties"
    try:
        from kit.hardware import get_gpu

        return int(get_gpu(torch.cuda.get_device_name(idx)).l2_cache_mib * 2**20), "kit catalog"
    except Exception:  # noqa: BLE001 - not in the catalog
        return None, "unknown"


FLUSH_FALLBACK_BYTES = 256 << 20  # triton's do_bench buffer, when the L2 size is unknown
FLUSH_MIN_BYTES = 8 << 20


def l2_flusher(device: str, enabled: bool):
    """(flush or None, policy dict): on CUDA with `enabled`, a callable that overwrites a buffer of
    twice the L2 (buf.zero_(), one memset kernel, as triton's do_bench)."""
    if device != "cuda" or not enabled:
        why = "off (--no-l2-flush)" if device == "cuda" else "not applicable (cpu)"
        return None, {"l2_flush": False, "l2_policy": why}
    import torch

    size, source = l2_bytes()
    flush_bytes = max(2 * size, FLUSH_MIN_BYTES) if size else FLUSH_FALLBACK_BYTES
    buf = torch.empty(flush_bytes // 4, dtype=torch.int32, device="cuda")
    return buf.zero_, {"l2_flush": True, "l2_bytes": size, "l2_bytes_from": source,
                       "flush_bytes": flush_bytes,
                       "l2_policy": f"flushed: {flush_bytes} B overwritten (zero_) before each timed "
                                    "call and before the profiled call, outside the timed region"}


def profile_cuda(call, flush=None) -> dict:
    """Kernel names, the main (longest) kernel's launch dims and kernel_ms (the summed device
    time of the call's kernels), from one profiled call (after flush(), outside the profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if flush is not None:
        flush()
    torch.cuda.synchronize()
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
    the longest one's name, grid, block and blocks/warps per SM; kernel_ms, the kernels' summed
    durations (the trace's dur is in microseconds)."""
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e.get("ts", 0))
    if not kernels:
        return {}
    main = max(kernels, key=lambda e: e.get("dur", 0))
    args = main.get("args", {})
    grid, block = args.get("grid") or [None] * 3, args.get("block") or [None] * 3
    kernel_ms = sum(float(e.get("dur", 0) or 0) for e in kernels) / 1e3
    return {"kernel_name": main.get("name"), "kernels": ";".join(e.get("name", "") for e in kernels),
            "n_kernels": len(kernels), "kernel_ms": kernel_ms if kernel_ms > 0 else None,
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


def side_path(out: str | Path, suffix: str) -> Path:
    """FILE.csv -> FILE<suffix> beside it (e.g. .meta.json, .failed.jsonl)."""
    out = Path(out)
    stem = out.name[:-4] if out.name.lower().endswith(".csv") else out.name
    return out.with_name(stem + suffix)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


SMI_FIELDS = ("name", "pci.bus_id", "driver_version", "pstate", "clocks.sm", "clocks.mem",
              "clocks.max.sm", "clocks.max.mem", "temperature.gpu", "power.draw", "power.limit",
              "utilization.gpu", "memory.used", "memory.total")
SMI_REASONS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # new name, old name


def nvidia_smi(index: int | None = None, timeout: float = 15.0) -> dict:
    """One nvidia-smi --query-gpu snapshot (clocks, power, temperature, throttle reasons) of GPU
    `index`, as {field: text}; {"error": ...} when nvidia-smi is missing or fails. Never raises."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"error": "nvidia-smi not found"}
    last = "no query ran"
    for extra in (*[(r,) for r in SMI_REASONS], ()):  # a driver that lacks a field refuses the query
        fields = SMI_FIELDS + extra
        cmd = [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
        if index is not None:
            cmd += ["-i", str(index)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.SubprocessError) as e:
            return {"error": f"nvidia-smi: {e}"}
        if r.returncode == 0 and r.stdout.strip():
            values = next(csv.reader([r.stdout.strip().splitlines()[0]], skipinitialspace=True), [])
            out = dict(zip(fields, (v.strip() for v in values)))
            out["time"] = _now()
            return out
        last = (r.stderr or r.stdout).strip().splitlines()[0] if (r.stderr or r.stdout).strip() else f"rc {r.returncode}"
    return {"error": f"nvidia-smi: {last}"}


def torch_settings(device: str) -> dict:
    """The torch flags that change what a GEMM or conv runs (read when the run starts)."""
    import torch

    out = {"float32_matmul_precision": torch.get_float32_matmul_precision(),
           "num_threads": torch.get_num_threads()}
    if device == "cuda":
        m = torch.backends.cuda.matmul
        for name in ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                     "allow_bf16_reduced_precision_reduction"):
            out[f"matmul.{name}"] = getattr(m, name, None)
        cudnn = torch.backends.cudnn
        out.update({"cudnn.allow_tf32": cudnn.allow_tf32, "cudnn.benchmark": cudnn.benchmark,
                    "cudnn.deterministic": cudnn.deterministic})
        try:
            out["cuda_driver_api"] = int(torch._C._cuda_getDriverVersion())
        except Exception:  # noqa: BLE001 - private, may be gone
            pass
    return out


class Meta:
    """FILE.meta.json: {"csv", "runs": [...]}, this run's entry written at its start and updated at
    its end (atomically: a temporary file renamed over it)."""

    def __init__(self, out: str | Path, run: dict, resume: bool):
        self.path = side_path(out, ".meta.json")
        self.doc = {"csv": Path(out).name, "runs": []}
        if resume and self.path.is_file():
            try:
                old = json.loads(self.path.read_text())
                if isinstance(old, dict) and isinstance(old.get("runs"), list):
                    self.doc = old
            except (OSError, ValueError):
                pass
        self.doc["runs"].append(run)
        self.run = run

    def earlier(self) -> list[dict]:
        return self.doc["runs"][:-1]

    def write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.doc, f, indent=1, default=str)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            raise KitError(f"cannot write {self.path}: {e.strerror or e}; choose another --out") from None


FATAL_CUDA = ("CUDA error", "device-side assert", "illegal memory access", "illegal instruction",
              "unspecified launch failure", "CUBLAS_STATUS_EXECUTION_FAILED", "misaligned address",
              "cudaErrorLaunchFailure", "an illegal", "uncorrectable ECC")


def is_fatal_cuda_error(e: BaseException) -> bool:
    """A CUDA error that leaves the context unusable (sticky): every later call, empty_cache
    included, raises again. Out of memory is not one (torch.OutOfMemoryError)."""
    try:
        import torch

        if isinstance(e, getattr(torch, "OutOfMemoryError", ())):
            return False
        acc = getattr(torch, "AcceleratorError", None)
        if acc is not None and isinstance(e, acc):
            return True
    except ImportError:
        pass
    text = str(e)
    if "out of memory" in text and "CUDA error" not in text:
        return False
    return any(s in text for s in FATAL_CUDA)


def _groups(todo: list) -> list[list]:
    """Runs of consecutive measurements of the same op (the plan lists an op's shapes together)."""
    out: list[list] = []
    for item in todo:
        if out and out[-1][0][0] == item[0]:
            out[-1].append(item)
        else:
            out.append([item])
    return out


def collect(ops, shapes, out, device: str = "cpu", dtype: str = "fp32", resume: bool = False,
            warmup: int = 5, repeats: int = 25, profile: bool = True, cooldown_ms: float = 0.0,
            progress: bool | None = None, threads: int | None = None, l2_flush: bool = True,
            warmup_ms: float | None = None, bias: bool = True, time_limit_s: float | None = None) -> dict:
    """Measure every (op, shape) not yet in `out`; returns counts and where the rows went.

    l2_flush: overwrite twice the L2 before each timed call (CUDA). warmup_ms: run each op's
    largest shape this long before its first measurement (default 1000 on CUDA, 0 on CPU).
    bias: linear with a bias (NeuSight's form). time_limit_s: start no measurement after this
    many seconds (the run stops cleanly, and --resume carries on).
    """
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
    finite = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf")  # noqa: E731
    if not finite(cooldown_ms):
        raise KitError(f"--cooldown-ms must be a finite number >= 0, got {cooldown_ms!r}")
    if warmup_ms is not None and not finite(warmup_ms):
        raise KitError(f"--warmup-ms must be a finite number >= 0, got {warmup_ms!r}")
    if time_limit_s is not None and not (finite(time_limit_s) and time_limit_s > 0):
        raise KitError(f"--time-limit must be a finite number of seconds > 0, got {time_limit_s!r}")
    if threads is not None and not (whole(threads) and threads >= 1):
        raise KitError(f"--threads must be a whole number >= 1, got {threads!r}")
    t_start = time.monotonic()
    ops = expand_ops(ops)
    tasks, unmatched = plan(ops, shapes)
    env = environment(device)
    if threads:
        torch.set_num_threads(threads)
    if warmup_ms is None:
        warmup_ms = 1000.0 if device == "cuda" else 0.0
    base = {"dtype": dtype, "source": "collector", "split": "train", **env}
    timer = time_cuda if device == "cuda" else time_cpu
    sync = torch.cuda.synchronize if device == "cuda" else None
    failed, measured, stopped = [], 0, None
    new = not (Path(out).is_file() and Path(out).stat().st_size > 0)
    failures = side_path(out, ".failed.jsonl")
    with Appender(out, resume=resume) as sink:
        todo, planned = [], set()
        for op, shape in tasks:
            row = {"op": op, **shape_columns(op, shape), **base}
            key = row_key(row)  # e.g. linear (2, 3, k, n) and (1, 6, k, n) are the same GEMM
            if key not in sink and key not in planned:
                todo.append((op, shape, row))
                planned.add(key)
        flush, policy = l2_flusher(device, l2_flush)
        settings = {"device": device, "dtype": dtype, "ops": ops, "shapes": len(shapes),
                    "planned": len(tasks), "to_measure": len(todo), "warmup_calls": warmup,
                    "warmup_ms_per_op": warmup_ms, "repeats": repeats,
                    "statistic": "latency_ms: mean of the fastest fifth of the repeats; "
                                 "latency_median_ms: their median",
                    "timer": ("a CUDA event pair around each call" if device == "cuda"
                              else "time.perf_counter_ns around each call"),
                    **policy, "profile": bool(profile and device == "cuda"),
                    "kernel_ms": ("summed kernel durations of one profiled call"
                                  if profile and device == "cuda" else None),
                    "linear_bias": bool(bias),
                    "inputs": "bmm/linear/conv: activations N(0,1), weights and bias N(0,0.02); "
                              "vector ops: U[0.5,1.5)",
                    "cooldown_ms": cooldown_ms, "threads": threads, "time_limit_s": time_limit_s}
        meta = Meta(out, {"started": _now(), "finished": None, "status": "running",
                          "host": socket.gethostname(), "python": sys.version.split()[0],
                          "argv": sys.argv, **env, "settings": settings,
                          "torch": torch_settings(device),
                          "nvidia_smi_before": nvidia_smi() if device == "cuda" else None},
                    resume)
        if any("linear" in r.get("settings", {}).get("ops", []) and
               r.get("settings", {}).get("linear_bias", True) != bool(bias) for r in meta.earlier()) \
                and "linear" in ops and todo:
            raise KitError(f"{out} holds linear rows measured {'without' if bias else 'with'} a bias "
                           f"(see {meta.path.name}); measure {'with' if bias else 'without'} one into "
                           "another --out")
        meta.write()
        show = progress if progress is not None else (sys.stderr.isatty() and len(todo) >= 20)
        bar = _progress(len(todo), show)

        def out_of_time() -> bool:
            return time_limit_s is not None and time.monotonic() - t_start >= time_limit_s

        def fail(op, shape, error):
            item = {"op": op, "shape": list(shape), "error": error}
            failed.append(item)
            try:
                append_jsonl(failures, {"time": _now(), "dtype": dtype, "device": env["device_name"], **item})
            except OSError:
                pass

        try:
            with _math_mode(dtype, device), torch.inference_mode():
                meta.run["torch"]["in_run"] = torch_settings(device)
                for group in _groups(todo):
                    if stopped:
                        break
                    if warmup_ms and not out_of_time():
                        op, shape, _ = max(group, key=lambda t: math.prod(t[1]))
                        try:
                            warm_for(build_call(op, shape, dtype, device, bias), warmup_ms / 1000, sync)
                        except Exception as e:  # noqa: BLE001 - its measurement will say
                            if is_fatal_cuda_error(e):
                                stopped = f"CUDA error while warming up {op} {shape}: {_why(e)}"
                                fail(op, shape, stopped)
                                break
                            _release(device)
                    for op, shape, row in group:
                        if out_of_time():
                            stopped = f"time limit ({time_limit_s:g} s) reached"
                            break
                        try:
                            call = build_call(op, shape, dtype, device, bias)
                            times = timer(call, warmup, repeats, flush=flush)
                            extra = _kernel_info(call, flush) if device == "cuda" and profile else {}
                        except Exception as e:  # noqa: BLE001 - out of memory, unsupported dtype, ...
                            call = None
                            fail(op, shape, _why(e))
                            bar.update(1)
                            if device == "cuda" and is_fatal_cuda_error(e):
                                stopped = f"CUDA error (the context is lost; rerun with --resume): {_why(e)}"
                                break
                            _release(device)
                            continue
                        latency = summarise_ms(times)
                        if not (latency > 0 and math.isfinite(latency)):
                            fail(op, shape, f"timer gave {latency}")
                            bar.update(1)
                            continue
                        info = schema.op_info(op)
                        row.update(op_class=info[0], elem_kind=info[1], scalar=info[2], latency_ms=latency,
                                   latency_median_ms=float(statistics.median(times)), **extra)
                        if row.get("kernel_name"):
                            row.update(zip(("tile_m", "tile_n", "tile_k"), schema.parse_tile(row["kernel_name"])))
                        sink.append(row)
                        measured += 1
                        del call
                        bar.update(1)
                        if cooldown_ms:
                            time.sleep(cooldown_ms / 1000)
        except BaseException as e:  # interrupted: say so in the metadata, then go on raising
            meta.run.update(status=f"interrupted: {type(e).__name__}", finished=_now(),
                            measured=measured, failed=len(failed))
            meta.write()
            raise
        finally:
            bar.close()
        total = len(sink.keys)
    meta.run.update(finished=_now(), status=("done" if not stopped else f"stopped: {stopped}"),
                    measured=measured, failed=len(failed), rows_in_file=total,
                    seconds=round(time.monotonic() - t_start, 3),
                    nvidia_smi_after=(nvidia_smi() if device == "cuda" and not stopped else None))
    if todo and not measured and new:  # the header alone would make the next run ask for --resume
        Path(out).unlink(missing_ok=True)
    if todo and not measured and not stopped:  # nothing written: a failure, not "0 measured"
        meta.run["status"] = "failed: every measurement failed"
        meta.write()
        first = failed[0]
        raise KitError(f"every measurement failed ({len(failed)}); nothing was written to {out}. "
                       f"First: {first['op']} {tuple(first['shape'])}: {first['error']}")
    meta.write()
    return {"out": str(out), "device": env["device_name"], "gpu": env["gpu"], "dtype": dtype,
            "planned": len(tasks), "skipped": len(tasks) - len(todo), "measured": measured,
            "failed": failed, "ops_without_shapes": unmatched, "rows_in_file": total,
            "stopped": stopped, "l2_flush": policy["l2_flush"], "meta": str(meta.path),
            "failures_file": str(failures) if failed else None}


def _why(e: BaseException) -> str:
    """A failed measurement's reason: the exception's first line, at most 300 characters."""
    return one_line(e, with_type=False)[:300]


def _kernel_info(call, flush=None) -> dict:
    """profile_cuda, or {} with a warning when the profiler cannot run (the timing still counts)."""
    try:
        return profile_cuda(call, flush)
    except Exception as e:  # CUPTI missing or busy, trace export failing, ...
        if is_fatal_cuda_error(e):
            raise
        warnings.warn(f"torch.profiler failed ({e}); rows get no kernel names", stacklevel=2)
        return {}


def _release(device: str) -> None:
    """Give cached blocks back after a failure (out of memory); never raises (after a sticky CUDA
    error empty_cache would raise again, and the caller stops instead of calling this)."""
    if device == "cuda":
        try:
            import torch

            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass


def _progress(total: int, show: bool):
    from tqdm import tqdm

    return tqdm(total=total, file=sys.stderr, unit="op", desc="collect", dynamic_ncols=True,
                disable=not show)
