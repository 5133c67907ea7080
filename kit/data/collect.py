"""The collector: benchmark ops with torch on the local device and append schema rows durably.

Timing (kit.data.timing; latency_ms = mean of the fastest fifth of `repeats` calls, at least one;
NeuSight takes the mean of the 5 fastest of 25; latency_median_ms = their median):
  * CUDA: before the first shape of each op (a shape group) its largest shape runs for at least
    `warmup_ms` (default 1000 ms on CUDA) so that clocks leave idle; each shape then gets `warmup`
    untimed calls. Each timed call has its own CUDA event pair. With `l2_flush` (the default on
    CUDA, as triton's do_bench) a buffer of twice the GPU's L2 (at least 8 MiB; the size from
    torch.cuda.get_device_properties, else the kit's catalog) is overwritten before each timed
    call, outside the event pair: operands are read from HBM as in a real step, not from L2.
    The flush kernel also puts the GPU behind the CPU, so the event pair holds the GPU's time
    with little of the host's dispatch. PROFILED_CALLS more calls (each after a flush) under
    torch.profiler give the kernel names, launch dims (grid, block, blocks/warps per SM) and
    kernel_ms, the median over those calls of each call's summed kernel durations (GPU time only).
  * CPU: time.perf_counter_ns around each call (no flush; warmup_ms defaults to 0).

Inputs: GEMMs and conv read signed data (activations standard normal, weights and bias
N(0, 0.02)); vector ops read U[0.5, 1.5) (no NaNs from pow, no denormals). linear has a bias
unless `bias=False` (Llama's projections have none; NeuSight's data has one).

Each finished measurement is one line appended with flush + fsync, so a killed run keeps
everything it finished, and `resume=True` skips every (op, shape, dtype, device) already in the
file: only when the earlier runs measured the same way (provenance.mixed_settings; a file without
its meta.json needs force=True). One run at a time writes a file (records.Lock). Beside
FILE.csv: FILE.meta.json (provenance: device, driver, versions, nvidia-smi snapshots of the timed
GPU, torch flags and every collector setting; written at the start of a run and updated at its
end, one entry per run; Ctrl-C and SIGTERM leave "interrupted") and FILE.failed.jsonl (one line
per failed measurement: out of memory, an invalid launch configuration, ...). A CUDA error that
loses the context (illegal address, device-side assert) stops the run cleanly and is recorded
`fatal`; FILE.measuring.json names the shape in progress, so that the next run knows the shape a
killed or crashed process died on. A resume measures failed shapes again, but skips and lists
those it could never get past (kit.data.failures: fatal, or died on twice) unless retry_failed.

Rows carry kernel_ms and latency_median_ms (kit.data.schema.COLUMNS, the last two); a file
from before them is resumed in its own format.
"""
from __future__ import annotations

import math
import os
import signal
import statistics
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

from kit.data import schema
from kit.data.failures import Failures
from kit.data.provenance import (Meta, _now, environment, gpu_snapshot, mixed_settings,
                                 run_record, torch_settings)
from kit.data.records import Appender, row_key
from kit.data.timing import (PROFILED_CALLS, is_fatal_cuda_error, l2_flusher, profile_cuda,
                             summarise_ms, time_cpu, time_cuda, warm_for)
from kit.errors import KitError, one_line

# re-exported: tests import them from here; collect() looks build_call up here (tests patch it)
from kit.data.op_calls import (OPS_OF_KIND, TORCH_DTYPES, _math_mode, build_call, expand_ops, plan,
                               shape_columns)

# the longest --cooldown-ms taken: an hour between measurements. 1e300 ms had passed the finite
# check and met time.sleep's OverflowError (a traceback) after the first row; 1e12 ms sleeps 31 years
MAX_COOLDOWN_MS = 3_600_000
# the longest --warmup-ms taken (kit collect and kit collect-embedding alike): an hour of running
# an op's largest shape. 1e12 ms had passed the finite check and would have warmed for 31 years
MAX_WARMUP_MS = 3_600_000


def check_wait_ms(flag: str, value, most_ms: float) -> None:
    """KitError unless value is a number of milliseconds from 0 to most_ms (an hour): not a
    bool, text, NaN, infinite or negative. flag names it as the user gave it (--warmup-ms)."""
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= most_ms):
        raise KitError(f"{flag} must be a number of milliseconds from 0 to {most_ms:,} (an hour), "
                       f"got {value!r}")


@contextmanager
def sigterm_interrupts():
    """While the block runs, SIGTERM (as `timeout` and batch systems send) raises
    KeyboardInterrupt("SIGTERM"), so that a run it stops records itself interrupted, as Ctrl-C
    does; the earlier handler is back afterwards. Off the main thread (no handler can be set) a
    no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old if old is not None else signal.SIG_DFL)


def stopped_by(e: BaseException) -> str:
    """The meta status of a run an exception ended: "interrupted: SIGTERM" (or KeyboardInterrupt,
    SystemExit) when it was stopped, else "failed: " and the error in one line."""
    if isinstance(e, (KeyboardInterrupt, SystemExit)):
        return f"interrupted: {e if isinstance(e, KeyboardInterrupt) and str(e) else type(e).__name__}"
    return f"failed: {one_line(e)}"


def _groups(todo: list) -> list[list]:
    """Runs of consecutive measurements of the same op (the plan lists an op's shapes together)."""
    out: list[list] = []
    for item in todo:
        if out and out[-1][0][0] == item[0]:
            out[-1].append(item)
        else:
            out.append([item])
    return out


def _work(shape: tuple) -> int:
    """How much one call of a shape computes, to pick a group's largest for the clock warm-up: the
    product of a GEMM's or vector op's dims; for a conv, B*Cin*Cout*ks^2 by its output side. The
    product of a conv's 7 dims had counted stride and padding: every padding-0 shape came to 0
    (a 1x1 conv of 64x256x256 at 56x56 was ranked below a 3x3 one of 1x3x8 at 8x8)."""
    if len(shape) == 7:
        b, cin, cout, ks, size, stride, pad = shape
        side = max(1, (size + 2 * pad - ks) // max(1, stride) + 1)
        return b * cin * cout * ks * ks * side * side
    return math.prod(shape)


def collect(ops, shapes, out, device: str = "cpu", dtype: str = "fp32", resume: bool = False,
            warmup: int = 5, repeats: int = 25, profile: bool = True, cooldown_ms: float = 0.0,
            progress: bool | None = None, threads: int | None = None, l2_flush: bool = True,
            warmup_ms: float | None = None, bias: bool = True, time_limit_s: float | None = None,
            force: bool = False, retry_failed: bool = False) -> dict:
    """Measure every (op, shape) not yet in `out`; returns counts and where the rows went.

    resume carries on with rows measured the same way only (mixed_settings); force: resume a file
    whose FILE.meta.json is missing or unreadable (how its rows were measured is unknown).

    l2_flush: overwrite twice the L2 before each timed call (CUDA). warmup_ms: run each op's
    largest shape this long before its first measurement (default 1000 on CUDA, 0 on CPU).
    bias: linear with a bias (NeuSight's form). time_limit_s: start no measurement after this
    many seconds (the run stops cleanly, and --resume carries on). retry_failed: with resume,
    measure again the shapes kit.data.failures.Failures.blocked skips (a failure that stopped an
    earlier run, or a shape the process died measuring twice).
    """
    import torch

    if device not in ("cpu", "cuda"):
        raise KitError(f"--device must be cpu or cuda, got {device!r}")
    if dtype not in TORCH_DTYPES:
        raise KitError(f"--dtype must be one of {', '.join(TORCH_DTYPES)}, got {dtype!r}")
    if dtype == "tf32" and device != "cuda":
        raise KitError("--dtype tf32 needs --device cuda (tf32 is a tensor-core mode)")
    if retry_failed and not resume:  # a fresh run skips nothing: the flag would do nothing
        raise KitError("--retry-failed needs --resume: only a resume skips the shapes an earlier "
                       "run could not get past (a fresh run measures every shape)")
    if force and not resume:  # --force adopts the rows of a resumed file: a fresh run has none
        raise KitError("--force needs --resume: it lets a resume add to a file whose FILE.meta.json "
                       "is missing; a fresh run starts a file of its own (to start over, move the "
                       "old file and its side files away, or choose another --out)")
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    if not (whole(warmup) and whole(repeats)) or warmup < 0 or repeats < 1:
        raise KitError(f"need whole numbers --warmup >= 0 and --repeats >= 1, got {warmup!r} and "
                       f"{repeats!r}")
    finite = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf")  # noqa: E731
    check_wait_ms("--cooldown-ms", cooldown_ms, MAX_COOLDOWN_MS)
    if warmup_ms is not None:
        check_wait_ms("--warmup-ms", warmup_ms, MAX_WARMUP_MS)
    if time_limit_s is not None and not (finite(time_limit_s) and time_limit_s > 0):
        raise KitError(f"--time-limit must be a finite number of seconds > 0, got {time_limit_s!r}")
    if threads is not None and not (whole(threads) and threads >= 1):
        raise KitError(f"--threads must be a whole number >= 1, got {threads!r}")
    cpus = os.cpu_count() or 1
    if threads is not None and threads > cpus:  # 100,000 threads: a MemoryError traceback mid-run
        raise KitError(f"--threads {threads} is more than this machine's {cpus} CPUs: the extra "
                       "threads would time their contention for the cores, not the op")
    t_start = time.monotonic()
    ops = expand_ops(ops)
    vec = [op for op in ops if op in OPS_OF_KIND["vec"]]
    if dtype == "tf32" and vec:
        # TF32 is a mode of the tensor cores' GEMMs and convolutions: a vector op under it runs
        # its fp32 kernel, so its rows were fp32 timings labelled tf32 (own_rows drops them, and
        # the capture marks only GEMMs and attention as tf32): device time spent on nothing
        runs = "runs its fp32 kernel: collect it" if len(vec) == 1 else "run their fp32 kernels: collect them"
        raise KitError(f"--dtype tf32 is a tensor-core mode of GEMMs and convolutions; "
                       f"{', '.join(vec)} {runs} with --dtype fp32")
    tasks, unmatched = plan(ops, shapes)
    env = environment(device)
    if threads:
        torch.set_num_threads(threads)
    if warmup_ms is None:
        warmup_ms = 1000.0 if device == "cuda" else 0.0
    base = {"dtype": dtype, "source": "collector", "split": "train", **env}
    timer = time_cuda if device == "cuda" else time_cpu
    sync = torch.cuda.synchronize if device == "cuda" else None
    measured, stopped = 0, None
    new = not (Path(out).is_file() and Path(out).stat().st_size > 0)
    fails = Failures(out, dtype, env["device_name"])
    failed = fails.new
    with Appender(out, resume=resume) as sink:
        # a run that died without a word (SIGKILL, a crash in a library) left its shape in progress
        died = None
        if resume:
            died = fails.earlier_death()
        else:
            fails.ended()  # a marker left beside a file this run starts afresh says nothing of it
        blocked = fails.blocked() if resume and not retry_failed else {}
        todo, planned, skipped_failed = [], set(), []
        for op, shape in tasks:
            row = {"op": op, **shape_columns(op, shape), **base}
            key = row_key(row)  # e.g. linear (2, 3, k, n) and (1, 6, k, n) are the same GEMM
            if key in blocked and key not in sink and key not in planned:
                skipped_failed.append({"op": op, "shape": list(shape), "error": blocked[key]["error"]})
            elif key not in sink and key not in planned:
                todo.append((op, shape, row))
            planned.add(key)
        in_file = sum(key in sink for key in planned)
        flush, policy = l2_flusher(device, l2_flush)
        profiled = bool(profile and device == "cuda")
        settings = {"device": device, "dtype": dtype, "ops": ops, "shapes": len(shapes),
                    "planned": len(tasks), "to_measure": len(todo), "warmup_calls": warmup,
                    "warmup_ms_per_op": warmup_ms, "repeats": repeats,
                    "statistic": "latency_ms: mean of the fastest fifth of the repeats; "
                                 "latency_median_ms: their median",
                    "timer": ("a CUDA event pair around each call" if device == "cuda"
                              else "time.perf_counter_ns around each call"),
                    **policy, "profile": profiled,
                    "kernel_ms": (f"median over {PROFILED_CALLS} profiled calls of each call's summed "
                                  "kernel durations" if profiled else None),
                    "profiled_calls": PROFILED_CALLS if profiled else 0,
                    "linear_bias": bool(bias),
                    "inputs": "bmm/linear/conv: activations N(0,1), weights and bias N(0,0.02); "
                              "vector ops: U[0.5,1.5)",
                    "cooldown_ms": cooldown_ms, "threads": threads, "time_limit_s": time_limit_s,
                    "skipped_failed": len(skipped_failed), "retry_failed": bool(retry_failed)}
        meta = Meta(out, {**run_record(device), **env, "settings": settings}, resume)
        if todo and sink.keys:  # resuming rows: measured the same way, or not at all
            if not meta.found and not force:
                raise KitError(f"{out} holds {len(sink.keys)} rows but no readable {meta.path.name} "
                               "says how they were measured; pass --force with --resume to add to "
                               "them anyway, or choose another --out")
            mixed = mixed_settings(meta.earlier(), meta.run)
            if mixed:
                raise KitError(f"--resume would mix methods in {out}: its earlier runs (see "
                               f"{meta.path.name}) differ in {'; '.join(mixed)}; rerun with their "
                               "settings, or choose another --out")
            if not meta.found:
                meta.run["adopted_rows"] = f"{len(sink.keys)} rows from before, with no meta.json (--force)"
        meta.write()
        show = progress if progress is not None else (sys.stderr.isatty() and len(todo) >= 20)
        bar = _progress(len(todo), show)

        def out_of_time() -> bool:
            return time_limit_s is not None and time.monotonic() - t_start >= time_limit_s

        try:
            with sigterm_interrupts(), _math_mode(dtype, device), torch.inference_mode():
                meta.run["torch"]["in_run"] = torch_settings(device)
                for group in _groups(todo):
                    if stopped:
                        break
                    if warmup_ms and not out_of_time():
                        op, shape, _ = max(group, key=lambda t: _work(t[1]))
                        fails.measuring(op, shape, "warm-up")
                        try:
                            warm_for(build_call(op, shape, dtype, device, bias), warmup_ms / 1000, sync)
                        except Exception as e:  # noqa: BLE001 - its measurement will say
                            if is_fatal_cuda_error(e):
                                stopped = f"CUDA error while warming up {op} {shape}: {_why(e)}"
                                fails.record(op, shape, stopped, fatal=True)
                                break
                            _release(device)
                    for op, shape, row in group:
                        if out_of_time():
                            stopped = f"time limit ({time_limit_s:g} s) reached"
                            break
                        fails.measuring(op, shape)
                        try:
                            call = build_call(op, shape, dtype, device, bias)
                            times = timer(call, warmup, repeats, flush=flush)
                            extra = _kernel_info(call, flush) if profiled else {}
                        except Exception as e:  # noqa: BLE001 - out of memory, unsupported dtype, ...
                            call = None
                            fatal = device == "cuda" and is_fatal_cuda_error(e)
                            fails.record(op, shape, _why(e), fatal=fatal)
                            bar.update(1)
                            if fatal:
                                stopped = f"CUDA error (the context is lost; rerun with --resume): {_why(e)}"
                                break
                            _release(device)
                            continue
                        latency = summarise_ms(times)
                        if not (latency > 0 and math.isfinite(latency)):
                            fails.record(op, shape, f"timer gave {latency}")
                            bar.update(1)
                            continue
                        info = schema.op_info(op)
                        row.update(op_class=info[0], elem_kind=info[1], scalar=info[2], latency_ms=latency,
                                   latency_median_ms=float(statistics.median(times)), **extra)
                        if row.get("kernel_name"):
                            row.update(zip(("tile_m", "tile_n", "tile_k"), schema.parse_tile(row["kernel_name"])))
                        sink.append(row)
                        fails.ended()  # written: a kill from here on (a cooldown) is no death of it
                        measured += 1
                        del call
                        bar.update(1)
                        if cooldown_ms:
                            time.sleep(cooldown_ms / 1000)
        except BaseException as e:  # Ctrl-C, SIGTERM, a full disk: say so in the metadata, then raise
            meta.run.update(status=stopped_by(e), finished=_now(), measured=measured, failed=len(failed))
            meta.write()
            raise
        finally:
            fails.ended()
            bar.close()
        total = len(sink.keys)
    meta.run.update(finished=_now(), status=("done" if not stopped else f"stopped: {stopped}"),
                    measured=measured, failed=len(failed), rows_in_file=total,
                    seconds=round(time.monotonic() - t_start, 3),
                    nvidia_smi_after=(gpu_snapshot() if device == "cuda" and not stopped else None))
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
            "planned": len(tasks), "skipped": in_file, "duplicates": len(tasks) - len(planned),
            "measured": measured, "failed": failed, "ops_without_shapes": unmatched,
            "rows_in_file": total, "stopped": stopped, "l2_flush": policy["l2_flush"],
            "meta": str(meta.path), "skipped_failed": skipped_failed, "died_earlier": died,
            "failures_file": str(fails.path) if failed or skipped_failed or died else None}


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
