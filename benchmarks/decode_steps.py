"""Measure decode steps of the zoo's decoders on this machine, beside the kit's prediction.

    python benchmarks/decode_steps.py --device cuda --models gpt2,opt-1.3b,llama3-8b \
        --batches 1,8,32 --contexts 512,4096 --dtype bf16 [--kv-cache static|dynamic] > out.json

For each (model, batch, context) it builds the zoo model with random weights on the device
(`kit.workload.zoo.build`, then real memory), fills a static KV cache of `context` tokens
(`decode_inputs`, the cache `kit predict --mode decode` captures), and times one eager decode
step: CUDA events around the call, the mean of the fastest half of `--repeats` (after warm-up).
On CUDA it also records the step's GPU kernels with torch.profiler: their summed device time
(the GPU's work, which the kit predicts as kernel_ms, apart from the CPU's issue time) and the
ten longest kernels by name, so the GEMMs can be set beside the kit's tile predictions.

Output: JSON {"device", "torch", "rows": [{model, batch, context, dtype, measured_ms,
measured_kernel_ms, kernels, top_kernels, predicted_ms, predicted_kernel_ms, predicted_gpu}]}.
The prediction is for the kit's catalog entry of the device (`--gpu`, or the CUDA device's name
looked up in the catalog); on a CPU there is none. This is a measurement script for a machine
with a GPU (prepared for benchmarks/device_session.sh); no test times anything with it.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from kit.errors import KitError  # noqa: E402
from kit.workload import zoo  # noqa: E402
from kit.workload.capture import TORCH_DTYPES  # noqa: E402


def real_model(model, dtype: str, device: str) -> torch.nn.Module:
    """The zoo model with memory on `device`: weights N(0, 0.02), causal-mask buffers lower
    triangular, rotary frequencies as Llama's (random values would time the same, but NaNs
    could take slow paths)."""
    m = zoo.build(model).to_empty(device=device)
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
    kind, context and sliding window kept)."""
    ids, cache = m.decode_inputs(batch, context, kind)
    ids = torch.zeros(ids.shape, dtype=torch.long, device=device)

    def real(t):
        return torch.zeros(t.shape, dtype=TORCH_DTYPES[dtype], device=device)

    return ids, tuple(c._replace(keys=real(c.keys), values=real(c.values)) for c in cache)


def _time_ms(step, device: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if device == "cuda":
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


def measure(model, batch: int, context: int, dtype: str = "bf16", device: str = "cuda",
            warmup: int = 3, repeats: int = 20, gpu: str | None = None, kind: str = "static") -> dict:
    """One row of the output (see the module doc)."""
    m = real_model(model, dtype, device)
    ids, cache = real_inputs(m, batch, context, dtype, device, kind)

    def step():
        with torch.no_grad():
            m(ids, cache)

    for _ in range(warmup):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    name = model if isinstance(model, str) else model.get("name", model.get("model_type"))
    row = {"model": name, "batch": batch, "context": context, "dtype": dtype, "kv_cache": kind,
           "measured_ms": _time_ms(step, device, repeats)}
    if device == "cuda":
        row.update(_kernels(step))
    del m, cache
    if gpu is not None:
        from kit.api import predict_model

        it = predict_model(model, gpu, mode="decode", batch=batch, seq=context, dtype=dtype,
                           kv_cache=kind)
        row.update(predicted_ms=it.total_ms, predicted_kernel_ms=it.kernel_ms, predicted_gpu=it.gpu)
    return row


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


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--models", default="gpt2,opt-1.3b,llama3-8b")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--contexts", default="512,4096")
    ap.add_argument("--dtype", default="bf16", choices=list(TORCH_DTYPES))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--gpu", default=None, help="catalog GPU to predict for (default: this device)")
    ap.add_argument("--kv-cache", default="static", choices=["static", "dynamic"])
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("decode_steps: no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    gpu = catalog_gpu(args.device, args.gpu)
    rows = []
    for model in args.models.split(","):
        for batch in _ints(args.batches):
            for context in _ints(args.contexts):
                try:
                    rows.append(measure(model, batch, context, args.dtype, args.device,
                                        repeats=args.repeats, gpu=gpu, kind=args.kv_cache))
                except (RuntimeError, KitError) as e:  # out of memory, a context too long
                    rows.append({"model": model, "batch": batch, "context": context,
                                 "dtype": args.dtype, "error": str(e).splitlines()[0][:200]})
                    if args.device == "cuda":
                        torch.cuda.empty_cache()
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(json.dumps({"device": device, "torch": torch.__version__, "predicted_for": gpu,
                      "rows": rows}, indent=1, default=lambda x: None if isinstance(x, float)
                     and not math.isfinite(x) else str(x)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
