"""How the collectors time a call: the statistic, CPU and CUDA timers, the clock warm-up, the L2
flush, the profiler pass that gives kernel names and kernel_ms (kit.data.collect's docstring says
how they fit together), and which CUDA errors end a run."""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time


# errors whose call fails but whose context lives on (cudaErrorMemoryAllocation,
# cudaErrorInvalidConfiguration, cudaErrorLaunchOutOfResources): a failed row, and the sweep goes on.
# cuBLAS's argument, support and allocation statuses too: the library refuses the call on the host
# and launches nothing, yet torch words them "CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling
# `cublasLtMatmul(...)`", which "CUDA error" had called fatal: the sweep stopped at that shape,
# and every --resume stopped at it again (failed shapes are measured again), the shapes after it
# never reached
RECOVERABLE_CUDA = ("out of memory", "invalid configuration argument",
                    "too many resources requested for launch", "CUBLAS_STATUS_NOT_SUPPORTED",
                    "CUBLAS_STATUS_INVALID_VALUE", "CUBLAS_STATUS_ALLOC_FAILED")
FATAL_CUDA = ("CUDA error", "device-side assert", "illegal memory access", "illegal instruction",
              "unspecified launch failure", "CUBLAS_STATUS_EXECUTION_FAILED", "misaligned address",
              "cudaErrorLaunchFailure", "an illegal", "uncorrectable ECC")


def is_fatal_cuda_error(e: BaseException) -> bool:
    """A CUDA error that leaves the context unusable (sticky: illegal address, device-side assert,
    launch failure, ECC, ...): every later call, empty_cache included, raises again. Out of memory,
    an invalid launch configuration and cuBLAS's refusals (RECOVERABLE_CUDA) are not, whatever
    their type."""
    text = str(e)
    if any(s in text for s in RECOVERABLE_CUDA):
        return False
    try:
        import torch

        if isinstance(e, getattr(torch, "OutOfMemoryError", ())):
            return False
        acc = getattr(torch, "AcceleratorError", None)
        if acc is not None and isinstance(e, acc):
            return True
    except ImportError:
        pass
    return any(s in text for s in FATAL_CUDA)


def summarise_ms(times_ms: list[float]) -> float:
    """Mean of the fastest fifth (at least one) of the timed calls."""
    keep = max(1, len(times_ms) // 5)
    return float(sum(sorted(times_ms)[:keep]) / keep)


def _untimed(call, warmup: int, flush=None, before=None):
    """Run `warmup` calls (each after before()); return what runs ahead of each timed call:
    before() (e.g. a forward pass whose backward is timed), then flush() (an L2 flush, so that the
    timed call finds the L2 cold even after before()), each when given."""
    for _ in range(warmup):
        if before is not None:
            before()
        call()
    return lambda: [f() for f in (before, flush) if f is not None]


def time_cpu(call, warmup: int, repeats: int, flush=None, before=None) -> list[float]:
    """perf_counter times of `repeats` calls after `warmup`; before() then flush() (when given)
    run before each call, outside the timed region."""
    ahead, times = _untimed(call, warmup, flush, before), []
    for _ in range(repeats):
        ahead()
        t0 = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return times


def time_cuda(call, warmup: int, repeats: int, flush=None, before=None) -> list[float]:
    """CUDA event times of `repeats` calls after `warmup`; before() then flush() (when given) run
    before each call, outside the events."""
    import torch

    ahead = _untimed(call, warmup, flush, before)
    torch.cuda.synchronize()
    pairs = []
    for _ in range(repeats):
        ahead()
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
                                    "call and before each profiled call, outside the timed region"}


PROFILED_CALLS = 5  # kernel_ms is the median of this many profiled calls' kernel sums
CALL_MARK = "kit_profiled_call"


def profile_cuda(call, flush=None, calls: int = PROFILED_CALLS) -> dict:
    """Kernel names, the main (longest) kernel's launch dims and kernel_ms from `calls` profiled
    calls, each after flush() and each in its own record_function range (kernels_by_call): kernel_ms
    is the median of the calls' summed kernel durations, and the names and launch dims are those
    of the call at that median."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            if flush is not None:
                flush()
            torch.cuda.synchronize()
            with record_function(f"{CALL_MARK}_{i}"):
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
    return median_call(events)


def kernels_by_call(events: list[dict]) -> list[list[dict]]:
    """The kernel events of each CALL_MARK range, in call order: a kernel belongs to the range its
    launch (the runtime or driver event of the same correlation id) falls in; a kernel whose launch
    the trace lacks, to the range its own start falls in. Kernels outside every range (the L2
    flush's) belong to none."""
    marks = sorted((e for e in events if str(e.get("name", "")).startswith(CALL_MARK)
                    and e.get("cat") != "gpu_user_annotation"), key=lambda e: e.get("ts", 0))
    launches = {e["args"]["correlation"]: e.get("ts", 0) for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    calls: list[list[dict]] = [[] for _ in marks]
    for k in (e for e in events if e.get("cat") == "kernel"):
        t = launches.get(k.get("args", {}).get("correlation"), k.get("ts", 0))
        for i, m in enumerate(marks):
            if m.get("ts", 0) <= t <= m.get("ts", 0) + m.get("dur", 0):
                calls[i].append(k)
                break
    return calls


def median_call(events: list[dict]) -> dict:
    """kernels_from_trace of the call whose summed kernel time is the median's (the lower one of
    an even count), with kernel_ms the median itself; a trace without CALL_MARK ranges is one
    call."""
    calls = [c for c in kernels_by_call(events) if c] or [events]
    infos = sorted((kernels_from_trace(c) for c in calls), key=lambda k: k.get("kernel_ms") or 0.0)
    info = infos[(len(infos) - 1) // 2]
    sums = [k["kernel_ms"] for k in infos if k.get("kernel_ms")]
    if info and sums:
        info["kernel_ms"] = float(statistics.median(sums))
    return info


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
