"""Measure collectives for real through torch.distributed, written in the nccl-tests format.

    collect(backend="gloo", ranks=4, sizes=parse_sizes("1K:1M"), out="gloo4.txt")  # kit.comm.sizes

One process per rank (torch.multiprocessing spawn) on this host, rendezvous over TCP on
127.0.0.1 and a free port. NCCL runs one rank per GPU; gloo runs CPU processes.

Per collective: `warmup` untimed calls per size, then `repeats` rounds over all the sizes (so that
a slow spell of a shared machine hits every size alike, not a few neighbours), each round taking
`iters` samples per size. timing "batch" (NCCL's default, as nccl-tests): a sample is the mean of
`iters` back-to-back calls ended by one synchronize. timing "call" (gloo's default): every
blocking call is a sample. Each rank reports a quantile of its samples (`stat`: min, median or
pNN; gloo's default p10 is the steady lower edge on a loaded CPU, where a call either runs
through or waits a scheduler tick; NCCL's default is the median), and the row is the slowest
rank's. With `pin` (gloo's default) each rank runs on one core, round-robin, with one compute
thread (OMP/MKL/torch), so that ranks do not fight over threads. Each result is then validated
once (#wrong = elements that differ from the expected values), as nccl-tests does (the calls and
their checks: kit.comm.collective_ops). Sizes follow nccl-tests: all-gather and reduce-scatter
sizes are totals. sendrecv is a ring shift posted as one dist.batch_isend_irecv pair. Rank 0
appends each row (one fsynced JSON line) as its (collective, size) finishes, to FILE.rows.jsonl
beside --out (after a line of the settings), so a crash or hang keeps what was measured; the file
is removed once FILE is written. A rerun refuses to start over those rows: `resume` measures only
the pairs missing and writes FILE with them all (`force` discards them). One sweep at a time
writes FILE (kit.data.records.Lock).
"""
from __future__ import annotations

import os
import re
import socket
import tempfile
import time
import warnings
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

from kit.comm.collective_ops import collective_op as _op  # _worker calls it so: tests patch it here
from kit.comm.conventions import (KINDS, SPLIT_KINDS, WORD_BYTES, busbw_factor,  # WORD_BYTES: fp32
                                  canonical_kind, least_size_bytes, nccl_tests_size_bytes, split_unit_bytes)
from kit.comm.sizes import MAX_BYTES, parse_sizes  # MAX_BYTES: 1 TiB, no rank holds a buffer this big
from kit.errors import KitError
from kit.data.records import Lock, append_jsonl, read_jsonl
from kit.whole_file import replace_file

INTERLEAVE_BYTES = 1 << 30  # buffers held at once per rank while interleaving sizes
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _count(kind: str, size: int, n: int) -> int:
    """The float32 elements measured for `size` bytes: nccl-tests' own sizing
    (kit.comm.conventions.nccl_tests_size_bytes: whole words; for all-gather and reduce-scatter
    the same whole words a rank; for all-to-all the same whole 16 bytes a rank, as its
    AlltoAllGetCollByteCount aligns them), so that each row's size is one nccl-tests runs. A
    size nccl-tests would run as 0 B is measured at its least (least_size_bytes: one word, or
    one unit a rank) rather than not at all. An all-to-all of 1,000 B on 8 ranks: 896 B (224
    words), where the 31 words a rank of before had measured 992 B."""
    return max(nccl_tests_size_bytes(kind, size, n), least_size_bytes(kind, n)) // WORD_BYTES


def _printed_count(kind: str, count: int, n: int) -> int:
    """The count column nccl-tests prints for `count` elements in all: its per-rank count
    (nccl-tests' paramcount: args->nbytes / wordSize in src/common.cu), which is a rank's chunk
    for all-gather and reduce-scatter and its part for each peer in all-to-all, while the size
    column is the whole buffer. The total had been printed: an 8 KiB all-gather on 2 ranks
    said 2048 elements where nccl-tests says 1024."""
    return count // n if kind in SPLIT_KINDS else count


def _quantile(stat: str) -> float:
    """'min' -> 0, 'median' -> 0.5, 'p10' -> 0.1: the quantile of the samples a rank reports."""
    q = {"min": 0.0, "median": 0.5}.get(stat)
    m = re.fullmatch(r"p([0-9]{1,2})", str(stat))
    if q is None and m and 1 <= int(m.group(1)) <= 99:
        q = int(m.group(1)) / 100
    if q is None:
        raise KitError(f"stat must be min, median or a percentile p1..p99 (e.g. p10), got {stat!r}")
    return q


def _interleave_chunks(kind: str, sizes: list[int], n: int) -> list[list[int]]:
    """Runs of consecutive sizes whose buffers fit INTERLEAVE_BYTES together: each run is timed
    in rounds over its sizes (all buffers held at once), as one sweep."""
    chunks, cur, held = [], [], 0
    for size in sizes:
        need = 2 * _count(kind, size, n) * WORD_BYTES  # input and output buffer at most
        if cur and held + need > INTERLEAVE_BYTES:
            chunks.append(cur)
            cur, held = [], 0
        cur.append(size)
        held += need
    return chunks + [cur] if cur else chunks



def _pin(rank: int) -> None:
    """One core per rank (round-robin over the cores this process may use), one compute thread."""
    try:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    except (AttributeError, OSError):  # not Linux, or not allowed: leave the scheduler to it
        pass


def read_rows(path) -> list[dict]:
    """The rows a sweep appended to `path` (JSON lines); a line cut short by a crash is dropped."""
    return [r for r in read_jsonl(path) if "kind" in r]


def _kept(result: Path, settings: dict, resume: bool, force: bool) -> list[dict]:
    """The rows an earlier, stopped sweep kept in `result` that this one carries on with (resume),
    after checking they were measured the same way; KitError rather than losing them unasked."""
    lines = read_jsonl(result)
    rows = [r for r in lines if "kind" in r]
    if not rows or force:
        return []
    if not resume:
        raise KitError(f"{result} holds {len(rows)} row(s) a stopped sweep measured; pass --resume to "
                       "measure only the rest (the output keeps them), or --force to discard them")
    then = next((r["settings"] for r in lines if isinstance(r.get("settings"), dict)), None)
    if then is None:
        raise KitError(f"{result} does not say how its rows were measured (an older kit wrote it); "
                       "pass --force to discard them, or choose another --out")
    differ = [f"{k} {then.get(k)!r} then, {v!r} now" for k, v in settings.items() if then.get(k) != v]
    if differ:
        raise KitError(f"--resume would mix methods: {result}'s rows differ in {'; '.join(differ)}; "
                       "rerun with their settings, or pass --force to discard them")
    return rows


def _worker(rank, n, backend, port, work, iters, warmup, repeats, stat, timing, pin, result_path):
    import torch
    import torch.distributed as dist

    if pin:
        _pin(rank)
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set (a forked rank inherits the parent's pools)
        pass
    dev = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
        dev = torch.device(f"cuda:{rank}")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n, timeout=timedelta(seconds=300))
    sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
    pids = torch.zeros(n, dtype=torch.int64, device=dev)
    pids[rank] = os.getpid()
    dist.all_reduce(pids)  # each rank's own pid, for the output's "#  Rank" lines
    if rank == 0:
        append_jsonl(result_path, {"pids": [int(p) for p in pids.tolist()]})

    def sample(call):
        sync()
        dist.barrier()
        if timing == "batch":  # a batch of calls, then one sync: the mean call (nccl-tests)
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            sync()
            return [(time.perf_counter() - t0) / iters * 1e6]
        out = []
        for _ in range(iters):  # every blocking call timed on its own
            t0 = time.perf_counter()
            call()
            sync()
            out.append((time.perf_counter() - t0) * 1e6)
        return out

    for kind, sizes in work:
        for chunk in _interleave_chunks(kind, sizes, n):
            ops = [(size, *_op(kind, _count(kind, size, n), n, rank, dev)) for size in chunk]
            for _, call, _ in ops:
                for _ in range(warmup):
                    call()
            samples = {size: [] for size in chunk}
            for _ in range(repeats):  # rounds over the sizes, so that a slow spell hits them all
                for size, call, _ in ops:
                    samples[size] += sample(call)
            for size, _, check in ops:
                t = torch.tensor(samples[size], dtype=torch.float64)
                mine = torch.quantile(t, _quantile(stat))
                t = torch.tensor([float(mine)], dtype=torch.float64, device=dev)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's figure
                wrong = torch.tensor([check()], dtype=torch.float64, device=dev)
                dist.all_reduce(wrong)
                count = _count(kind, size, n)
                row = {"kind": kind, "size_bytes": count * WORD_BYTES, "count": _printed_count(kind, count, n),
                       "dtype": "float", "time_us": float(t.item()), "wrong": int(wrong.item())}
                if rank == 0:  # one fsynced line as each (kind, size) finishes: a crash keeps it
                    append_jsonl(result_path, row)
    dist.barrier()
    dist.destroy_process_group()


def _nccl_version():
    try:
        import torch

        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001
        return None


def rows_path(out) -> Path:
    """Where a sweep into `out` appends its rows as they are measured."""
    out = Path(out)
    return out.with_name(out.name + ".rows.jsonl")


def collect(backend: str = "gloo", ranks: int = 2, sizes="1K:1M", kinds=("allreduce",),
            iters: int = 20, warmup: int = 5, repeats: int = 3, stat: str | None = None, out=None,
            start_method: str = "spawn", timing: str | None = None, pin: bool | None = None,
            resume: bool = False, force: bool = False):
    """Run the sweep; returns (nccl-tests text, tidy DataFrame). Writes `out` when given.

    resume: carry on with the rows a stopped sweep into `out` kept (FILE.rows.jsonl, measured with
    the same settings): measure only the (collective, size) pairs missing, and write `out` with
    them all. force: discard those rows. Without either, they are refused, not lost.

    stat, timing and pin default by backend (module doc): gloo p10 / call / pinned, NCCL
    median / batch / not pinned.

    start_method "spawn" (default) starts clean interpreters; "fork" (gloo only) reuses this
    process's imports and starts in a fraction of the time, which the tests use."""
    import pandas as pd
    import torch

    from kit.comm.parsers import COLUMNS, format_nccl_tests, joined_devices

    if backend not in ("gloo", "nccl"):
        raise KitError(f"unknown backend {backend!r}; choose gloo (CPU processes) or nccl (GPUs)")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 2 <= ranks <= 64:
        raise KitError(f"ranks must be a whole number from 2 to 64, got {ranks!r}")
    if start_method not in ("spawn", "fork") or (start_method == "fork" and backend == "nccl"):
        raise KitError(f"start_method must be spawn, or fork with gloo (CUDA cannot fork), got {start_method!r}")
    if backend == "nccl":
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < ranks or not torch.distributed.is_nccl_available():
            raise KitError(f"nccl needs {ranks} GPUs (one per rank) and an NCCL build of torch; "
                           f"found {have} GPU(s); use --backend gloo on CPU")
    kinds = list(dict.fromkeys(canonical_kind(k) for k in kinds))  # allreduce,all_reduce: once
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise KitError(f"cannot measure {bad}; choose from {', '.join(KINDS)}")
    sizes = parse_sizes(sizes)
    stat = ("p10" if backend == "gloo" else "median") if stat is None else stat
    timing = ("call" if backend == "gloo" else "batch") if timing is None else timing
    _quantile(stat)
    if timing not in ("batch", "call"):
        raise KitError(f"timing must be batch (mean of a batch of calls, as nccl-tests) or call, got {timing!r}")
    pin = backend == "gloo" if pin is None else bool(pin)
    for name, v in (("iters", iters), ("warmup", warmup), ("repeats", repeats)):
        if not isinstance(v, int) or v < (0 if name == "warmup" else 1):
            raise KitError(f"{name} must be a whole number >= {0 if name == 'warmup' else 1}, got {v!r}")
    if out is not None and Path(out).is_dir():  # before minutes of measuring, not after
        raise KitError(f"--out {out} is a directory; give a file name (nccl-tests text)")
    too_big = [s for s in sizes if s > MAX_BYTES]
    if too_big:
        raise KitError(f"size {too_big[0]:.4g} B is more than any device holds (at most "
                       f"{MAX_BYTES // 2**30} GiB a buffer); give smaller --sizes")
    rounded = sorted({(k, s, _count(k, s, ranks) * WORD_BYTES) for k in kinds for s in sizes
                      if _count(k, s, ranks) * WORD_BYTES != s})
    if rounded:  # whole fp32 words, for the split kinds whole units a rank, as nccl-tests: say so
        shown = ", ".join(f"{s:,} B -> {m:,} B ({k})" for k, s, m in rounded[:4])
        units = sorted({f"{split_unit_bytes(k)} B a rank ({k})" for k, _, _ in rounded if k in SPLIT_KINDS})
        warnings.warn(f"{len(rounded)} size(s) rounded as nccl-tests runs them, to whole {WORD_BYTES}-byte "
                      f"words{' and ' + ', '.join(units) if units else ''}"
                      f": {shown}{', ...' if len(rounded) > 4 else ''}; the output has the sizes measured")
    settings = {"backend": backend, "ranks": ranks, "iters": iters, "repeats": repeats, "stat": stat,
                "timing": timing, "pinned": pin}
    with tempfile.TemporaryDirectory(prefix="kit-comm-") as tmp, \
            (Lock(out) if out is not None else nullcontext()):
        # rows land one line each as they are measured: beside --out (FILE.rows.jsonl, kept if
        # the sweep dies, removed once FILE is written), else in a temporary folder
        result = Path(tmp, "rows.jsonl") if out is None else rows_path(out)
        kept = _kept(result, settings, resume, force) if out is not None else []
        if not kept:  # a fresh rows file, saying how its rows are measured: an unwritable --out
            try:  # fails before any rank starts
                result.parent.mkdir(parents=True, exist_ok=True)
                result.write_text("")
                append_jsonl(result, {"settings": settings})
            except OSError as e:
                raise KitError(f"cannot write beside --out {out} ({result}): {e.strerror or e}; "
                               "choose another --out") from None
        have = {(r["kind"], r["size_bytes"]) for r in kept}
        # one size each per measured size: 1,000 and 1,002 B of all-reduce both run 250 words,
        # and had been measured twice into two rows of 1,000 B
        work = [(k, todo) for k in kinds
                if (todo := list({_count(k, s, ranks) * WORD_BYTES: s for s in reversed(sizes)
                                  if (k, _count(k, s, ranks) * WORD_BYTES) not in have}.values())[::-1])]
        if work:
            _spawn(work, ranks, backend, iters, warmup, repeats, stat, timing, pin, result, start_method,
                   resumed=bool(kept), keep=out is not None)
        lines = read_jsonl(result)
        # the count column from the size, not as kept: an older kit's stopped sweep kept the
        # total (2048 for an 8 KiB all-gather on 2 ranks), and --resume had mixed it with the
        # per-rank counts measured now (1024) in one file
        rows = [{**r, "count": _printed_count(r["kind"], r["size_bytes"] // WORD_BYTES, ranks)}
                for r in lines if "kind" in r]
        kinds += [k for k in dict.fromkeys(r["kind"] for r in rows) if k not in kinds]  # kept ones too
        rows.sort(key=lambda r: (kinds.index(r["kind"]), r["size_bytes"]))
        pids = next((r["pids"] for r in reversed(lines) if "pids" in r), None) or [os.getpid()] * ranks
        # the name ending each "#  Rank" line: `kit comm fit` checks it against --system's GPU
        names = ([torch.cuda.get_device_name(i) for i in range(ranks)] if backend == "nccl"
                 else ["[cpu] gloo process"] * ranks)
        devices = [f"Pid {pid:6d} on {socket.gethostname()} device {i:2d} {name}"
                   for i, (pid, name) in enumerate(zip(pids, names))]
        meta = (f"step: list warmup iters: {warmup} iters: {iters} agg iters: 1 validation: 1 graph: 0 "
                f"# kit collect-comm backend={backend} torch={torch.__version__} "
                f"nccl={_nccl_version() if backend == 'nccl' else None} stat={stat} timing={timing} "
                f"repeats={repeats} pinned={pin}; "
                "in-place columns repeat the measured call")
        text = "".join(format_nccl_tests([r for r in rows if r["kind"] == k], k, ranks, devices, meta)
                       for k in kinds if any(r["kind"] == k for r in rows))
        if out is not None:
            out = Path(out)
            try:  # whole or not at all: the rows file stays until the text is written
                replace_file(out, text.encode())
            except OSError as e:
                # the rows stay beside it: say how to get them written, not measured again
                raise KitError(f"cannot write the measurements to {out}: {e.strerror or e}; the "
                               f"{len(rows)} row(s) measured are kept in {result}: once there is room, "
                               "rerun with --resume to write them without measuring again") from None
            result.unlink(missing_ok=True)  # the text holds them now
    # every rank is spawned on this host: one node. The bandwidths and in-place columns as the
    # text has them (format_nccl_tests; the in-place call is the measured one): the table had
    # left busbw_gbs, time_us_in_place and busbw_gbs_in_place empty (NaN), which parsing `out`
    # gives
    def full(r):
        alg = r["size_bytes"] / r["time_us"] / 1e3 if r["time_us"] > 0 else 0.0
        bus = alg * busbw_factor(r["kind"], ranks)
        return {**r, "ranks": ranks, "nodes": 1, "algbw_gbs": alg, "busbw_gbs": bus,
                "time_us_in_place": r["time_us"], "busbw_gbs_in_place": bus,
                "source": str(out or ""), "device": joined_devices(names)}
    return text, pd.DataFrame([full(r) for r in rows]).reindex(columns=COLUMNS)


def _spawn(work, ranks, backend, iters, warmup, repeats, stat, timing, pin, result, start_method,
           resumed: bool, keep: bool) -> None:
    """Run the ranks over `work` ((kind, sizes) pairs), appending rows to `result`; KitError in one
    line when a rank fails, saying where the rows measured before it are."""
    import torch.multiprocessing as mp

    saved = {v: os.environ.get(v) for v in _THREAD_VARS}
    os.environ.update({v: "1" for v in _THREAD_VARS})  # spawned ranks start single-threaded
    try:
        mp.start_processes(_worker, args=(ranks, backend, _free_port(), work, iters, warmup, repeats,
                                          stat, timing, pin, str(result)), nprocs=ranks, join=True,
                           start_method=start_method)
    except Exception as e:  # a worker failed: say which and why, in one line
        msg = [m for m in str(e).strip().splitlines() if any(c.isalnum() for c in m)]
        kept = read_rows(result)
        where = (f"; the {len(kept)} row(s) measured before are in {result} (--resume measures the rest)"
                 if kept and keep else "")
        if not kept and keep and not resumed:  # the fresh rows file made above: nothing to keep
            Path(result).unlink(missing_ok=True)
        raise KitError(f"collect-comm ({backend}, {ranks} ranks) failed: "
                       f"{msg[-1].strip() if msg else type(e).__name__}{where}") from None
    finally:
        for v, old in saved.items():
            if old is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = old
