"""Measure decode steps of the zoo's decoders on this machine, beside the kit's prediction.

    python benchmarks/decode_steps.py --device cuda --models gpt2,opt-1.3b,llama3-8b \
        --batches 1,8,32 --contexts 512,2000,4096 --dtype bf16 [--kv-cache static|dynamic] \
        [--jsonl rows.jsonl] [--time-limit SECONDS] > out.json

For each model it builds the zoo model once with random weights on the device
(`kit.workload.zoo.build`, cast to the dtype on the meta device, then real memory), and for each
(batch, context) fills a static KV cache of `context` tokens (`decode_inputs`, the cache
`kit predict --mode decode` captures) and times one eager decode step: CUDA events around the
call, the mean of the fastest half of `--repeats` (after warm-up). On CUDA it also records the
step's GPU kernels with torch.profiler: their summed device time (the GPU's work, which the kit
predicts as kernel_ms, apart from the CPU's issue time) and the ten longest kernels by name.

Each measured row records when it was measured (measured_at, UTC). The zoo's decode step is a
program that changes with the kit (STEP_CHANGES): a row measured before its model's step last
changed timed another program than the one the kit now predicts, so it is stale (stale_reason)
and scores nothing (benchmarks/h200_measured.py lists it apart, with the reason); a rerun with
--jsonl measures it again.

A context the model cannot decode at (past its learned positions: `zoo.check_seq(model,
context, 1)`) is a row with "skipped" and the reason, not a crash. Any error in a row is recorded
in that row ("error"); a CUDA error that loses the context (device-side assert, illegal address)
stops the sweep (no CUDA call after it, empty_cache included), and the rows so far are kept.
With --jsonl each row is appended to that file (flushed and fsynced) as soon as it is measured,
and a rerun with the same file skips the rows already there (not stale ones); --time-limit starts no row after
that many seconds.

Output: JSON {"device", "torch", "rows": [{model, batch, context, dtype, measured_at, measured_ms,
measured_kernel_ms, kernels, top_kernels, predicted_ms, predicted_kernel_ms, predicted_gpu,
seconds}]} on stdout at the end. The prediction is for the kit's catalog entry of the device
(`--gpu`, or the CUDA device's name looked up in the catalog); on a CPU there is none. This is a
measurement script for a machine with a GPU (prepared for benchmarks/device_session.sh); the
tests run it on the CPU with small configs.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from kit.data.timing import is_fatal_cuda_error  # noqa: E402
from kit.data.records import append_jsonl, read_jsonl  # noqa: E402
from kit.errors import KitError, one_line  # noqa: E402
from kit.workload import zoo  # noqa: E402
from kit.workload.capture import TORCH_DTYPES  # noqa: E402
from kit.workload.modes import LLAMA_FAMILIES  # noqa: E402


class StepChange(NamedTuple):
    """A change to the zoo's decode step of some families (model_type) and cache kinds, from
    `at` (UTC, ISO 8601, the commit's time) on: rows measured before it timed another program."""
    at: str
    families: tuple
    kv_caches: tuple
    commit: str
    what: str


STEP_CHANGES = (
    StepChange("2026-12-07T19:10:42Z", LLAMA_FAMILIES, ("static",), "80b931a, df992a0",
               "masked as HF 5.25 masks a static cache (memory-efficient SDPA over the cache, "
               "no flash kernel) and written with StaticLayer's per-layer positions"),
    StepChange("2026-12-07T21:43:48Z", ("gpt2", "opt", "deepseek_v3"), ("static", "dynamic"),
               "83bfdaa", "HF 5.25's SDPA in place of HF 4's eager matmul-softmax-matmul; a static "
               "cache masked and written as HF 5.25's StaticLayer"),
)


def _model_type(model) -> str | None:
    try:
        cfg = zoo.config(model) if isinstance(model, str) else dict(model)
    except KitError:
        return None
    return cfg.get("model_type", "gpt2")


def stale_reason(row: dict, measured_at: str | None = None) -> str | None:
    """Why a measured row no longer measures the step the kit predicts (None: it does): its
    model's decode step changed (STEP_CHANGES) after the row was measured, at the row's own
    measured_at, else at `measured_at` (its session's date, for rows from before measured_at was
    recorded); a row with neither counts as measured before every change."""
    when = row.get("measured_at") or measured_at
    family, kind = _model_type(row.get("model")), row.get("kv_cache", "static")
    for change in STEP_CHANGES:
        if family in change.families and kind in change.kv_caches and (when is None or when < change.at):
            return (f"{row.get('model')}'s {kind}-cache decode step changed at {change.at} "
                    f"({change.commit}: {change.what}), after this row was measured "
                    f"({when or 'no date'}): it timed another program; measure it again")
    return None


def _now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def real_model(model, dtype: str, device: str) -> torch.nn.Module:
    """The zoo model with memory on `device`: weights N(0, 0.02), causal-mask buffers lower
    triangular, rotary frequencies as Llama's (random values would time the same, but NaNs
    could take slow paths)."""
    m = zoo.build(model).to(TORCH_DTYPES[dtype]).to_empty(device=device)  # never in fp32 first
    cfg = m.config
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.02)
        for name, buf in m.named_buffers():
            if buf.dtype == torch.bool:
                buf.copy_(torch.ones(buf.shape[-2:], dtype=torch.bool, device=device).tril())
            elif name.endswith("inv_freq"):
                d = 2 * buf.numel()
                theta = cfg.get("rope_theta", 10000.0)
                buf.copy_(1.0 / theta ** (torch.arange(0, d, 2, device=device).float() / d))
    return m.to(TORCH_DTYPES[dtype]).eval()


def real_inputs(m, batch: int, context: int, dtype: str, device: str, kind: str = "static"):
    """decode_inputs on the device: token ids, and a zeroed cache in the model's dtype (its
    kind, context and sliding window kept), with a static layer's write counter on the device
    too (it had stayed a meta tensor, which a real step cannot add to its positions)."""
    ids, cache = m.decode_inputs(batch, context, kind)
    ids = torch.zeros(ids.shape, dtype=torch.long, device=device)

    def real(t):
        return torch.zeros(t.shape, dtype=TORCH_DTYPES[dtype], device=device)

    def counter(c):  # a static layer's cumulative_length (HF 5.25): the rows written so far
        if c.length is None:
            return None
        return torch.full((), c.context, dtype=torch.long, device=device)

    return ids, tuple(c._replace(keys=real(c.keys), values=real(c.values), length=counter(c))
                      for c in cache)


class _Rewind:
    """Each call of a timed step gets its own copy of the cache's write counters. A static
    layer's counter (HF 5.25's cumulative_length) advances in place every step (its add_), so
    the same step timed again would write one row further each time, past the cache's end after
    a few calls. ready() makes counters at `context` rows for the next call(s) before it, outside
    the timed region (filling them is a kernel); take() hands the next set to the step. A cache
    without counters (dynamic, or GPT-2/OPT's) is handed as it is."""

    def __init__(self, cache):
        self.cache, self.pool = cache, []
        self.counted = any(c.length is not None for c in cache)

    def ready(self, calls: int = 1) -> None:
        if not self.counted:
            return
        for _ in range(calls):
            self.pool.append(tuple(c if c.length is None else c._replace(length=torch.full_like(c.length, c.context))
                                   for c in self.cache))

    def take(self):
        if not self.counted:
            return self.cache
        if not self.pool:  # a call nobody readied: make its counters now (a fill kernel more)
            self.ready()
        return self.pool.pop(0)


def _time_ms(step, device: str, repeats: int, flush=None) -> float:
    """The mean of the faster half of `repeats` timed calls, ms (CUDA events on a GPU); flush,
    when given, runs before each call, outside the timed region (an L2 flush)."""
    times = []
    for _ in range(repeats):
        if flush is not None:
            flush()
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    fast = times[:max(1, len(times) // 2)]
    return sum(fast) / len(fast)


def _kernels(step, steps: int = 3) -> dict:
    """GPU kernels of `steps` calls (torch.profiler), per step: summed device time, count, and
    the ten longest kernel names."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    per: dict[str, list] = {}
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA"):
            us = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0) or 0.0
            per.setdefault(e.name, []).append(float(us))
    total_us = sum(sum(v) for v in per.values())
    top = sorted(per.items(), key=lambda kv: -sum(kv[1]))[:10]
    return {"measured_kernel_ms": total_us / steps / 1e3,
            "kernels": int(sum(len(v) for v in per.values()) / steps),
            "top_kernels": [{"name": n[:160], "count": len(v) // steps, "us": sum(v) / steps}
                            for n, v in top]}


def skip_reason(model, context: int) -> str | None:
    """Why a decode step at `context` cannot run on this model (None when it can): one new token
    after `context` cached ones needs context + 1 learned positions."""
    try:
        zoo.check_seq(model, context, 1)
    except KitError as e:
        return one_line(e, with_type=False)
    return None


def _name(model) -> str:
    return model if isinstance(model, str) else model.get("name", model.get("model_type"))


def measure(model, batch: int, context: int, dtype: str = "bf16", device: str = "cuda",
            warmup: int = 3, repeats: int = 20, gpu: str | None = None, kind: str = "static",
            m=None) -> dict:
    """One row of the output (see the module doc); `m`: the model, already built (real_model)."""
    reason = skip_reason(model, context)
    if reason:
        return {"model": _name(model), "batch": batch, "context": context, "dtype": dtype,
                "kv_cache": kind, "skipped": reason}
    t0 = time.perf_counter()
    own = m is None
    if own:
        m = real_model(model, dtype, device)
    ids, cache = real_inputs(m, batch, context, dtype, device, kind)
    rewind = _Rewind(cache)

    def step():
        with torch.no_grad():
            m(ids, rewind.take())

    for _ in range(warmup):
        rewind.ready()
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    row = {"model": _name(model), "batch": batch, "context": context, "dtype": dtype, "kv_cache": kind,
           "measured_at": _now_utc(), "measured_ms": _time_ms(step, device, repeats, flush=rewind.ready)}
    if device == "cuda":
        rewind.ready(3)  # _kernels' three steps, made before its profile starts
        row.update(_kernels(step, 3))
    ids = cache = step = rewind = None  # free the step's memory before the next row
    if own:
        del m
    if gpu is not None:
        from kit.api import predict_model

        try:
            it = predict_model(model, gpu, mode="decode", batch=batch, seq=context, dtype=dtype,
                               kv_cache=kind)
            row.update(predicted_ms=it.total_ms, predicted_kernel_ms=it.kernel_ms, predicted_gpu=it.gpu)
        except Exception as e:  # noqa: BLE001 - the measurement stands without it
            row["predict_error"] = one_line(e, with_type=False)[:200]
    row["seconds"] = round(time.perf_counter() - t0, 3)
    return row


class Rows:
    """Rows kept in memory and, with a path, appended to a JSON-lines file one fsynced line
    each (kit.data.records.append_jsonl); rows already in the file (measured or skipped) are
    not run again, but a stale one (stale_reason: its model's step changed since) is: it is left
    in the file and out of the rows."""

    def __init__(self, path: str | None):
        self.path, self.rows, self.done = (Path(path) if path else None), [], set()
        for r in read_jsonl(self.path) if self.path else []:
            if "model" in r and "error" not in r and not ("measured_ms" in r and stale_reason(r)):
                self.rows.append(r)
                self.done.add(self.key(r))

    @staticmethod
    def key(r) -> tuple:
        return (str(r.get("model")), int(r.get("batch", 0)), int(r.get("context", 0)),
                str(r.get("dtype")), str(r.get("kv_cache", "static")))

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if self.path:
            append_jsonl(self.path, row, default=_json_default)


def _json_default(x):
    return None if isinstance(x, float) and not math.isfinite(x) else str(x)


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        try:
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - never after a sticky error (the caller stops first)
            pass


def sweep(models, batches, contexts, dtype: str, device: str, repeats: int, gpu: str | None,
          kind: str, rows: Rows, time_limit: float | None = None, warmup: int = 3) -> str | None:
    """Every (model, batch, context) into rows; returns why it stopped early (None: it did not)."""
    t0 = time.monotonic()
    for model in models:
        todo = [(b, c) for b in batches for c in contexts
                if Rows.key({"model": _name(model), "batch": b, "context": c, "dtype": dtype,
                             "kv_cache": kind}) not in rows.done]
        if not todo:
            continue
        m = None
        for batch, context in todo:
            base = {"model": _name(model), "batch": batch, "context": context, "dtype": dtype, "kv_cache": kind}
            if time_limit is not None and time.monotonic() - t0 >= time_limit:
                return f"time limit ({time_limit:g} s) reached before {model} b{batch} c{context}"
            reason = skip_reason(model, context)
            if reason:
                rows.add({**base, "skipped": reason})
                print(json.dumps(rows.rows[-1]), file=sys.stderr, flush=True)
                continue
            try:
                if m is None:  # once per model
                    m = real_model(model, dtype, device)
                rows.add(measure(model, batch, context, dtype, device, warmup=warmup,
                                 repeats=repeats, gpu=gpu, kind=kind, m=m))
            except Exception as e:  # noqa: BLE001 - out of memory, a model that does not build, ...
                fatal = device == "cuda" and is_fatal_cuda_error(e)
                text = one_line(e, with_type=False)[:300]
                rows.add({**base, "error": f"{type(e).__name__}: {text}", **({"fatal": True} if fatal else {})})
                print(json.dumps(rows.rows[-1]), file=sys.stderr, flush=True)
                if fatal:  # the context is gone: no CUDA call after this one
                    return f"CUDA error at {model} b{batch} c{context}: {text}"
                _free(device)
                continue
            print(json.dumps(rows.rows[-1]), file=sys.stderr, flush=True)
        del m
        _free(device)
    return None


def catalog_gpu(device: str, given: str | None) -> str | None:
    """The catalog key to predict for: --gpu, else the CUDA device's name if the catalog knows it."""
    from kit.hardware import get_gpu

    if given:
        return get_gpu(given).key
    if device != "cuda":
        return None
    try:
        return get_gpu(torch.cuda.get_device_name()).key
    except KitError:
        return None


def prediction_gpu(prog: str, device: str, given: str | None, no_predict: bool) -> str | None:
    """catalog_gpu, or None (with one line on stderr saying why) when there is none to predict for."""
    if no_predict:
        return None
    try:
        return catalog_gpu(device, given)
    except KitError as e:
        print(f"{prog}: no prediction: {e}", file=sys.stderr)
        return None


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--models", default="gpt2,opt-1.3b,llama3-8b")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--contexts", default="512,2000,4096",
                    help="contexts past a model's learned positions are skipped with the reason")
    ap.add_argument("--dtype", default="bf16", choices=list(TORCH_DTYPES))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--gpu", default=None, help="catalog GPU to predict for (default: this device)")
    ap.add_argument("--no-predict", action="store_true", help="measure only")
    ap.add_argument("--kv-cache", default="static", choices=["static", "dynamic"])
    ap.add_argument("--jsonl", default=None, help="append each row to this file as it is measured "
                    "(and skip the rows already in it)")
    ap.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                    help="start no row after this many seconds")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("decode_steps: no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    gpu = prediction_gpu("decode_steps", args.device, args.gpu, args.no_predict)
    rows = Rows(args.jsonl)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    stopped = sweep(models, _ints(args.batches), _ints(args.contexts), args.dtype, args.device,
                    args.repeats, gpu, args.kv_cache, rows, args.time_limit, args.warmup)
    if stopped:
        print(f"decode_steps: stopped: {stopped}", file=sys.stderr, flush=True)
    fatal = bool(stopped and stopped.startswith("CUDA error"))
    device = "cpu"
    if args.device == "cuda":
        try:
            device = torch.cuda.get_device_name() if not fatal else "cuda (context lost)"
        except Exception:  # noqa: BLE001
            device = "cuda"
    print(json.dumps({"device": device, "torch": torch.__version__, "predicted_for": gpu,
                      "stopped": stopped, "rows": rows.rows}, indent=1, default=_json_default))
    return 3 if fatal else 0


if __name__ == "__main__":
    sys.exit(main())
