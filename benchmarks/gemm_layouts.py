"""Measure the three GEMMs of a Linear layer's training step on this machine: the forward, the
input gradient and the weight gradient, over a seeded draw of aligned shapes.

    python benchmarks/gemm_layouts.py --device cuda --dtype bf16 --count 150 --seed 51 \
        --jsonl rows.jsonl [--time-limit SECONDS] [--repeats 20] > summary.json

`kit collect` times the forward layout only (nn.Linear: x · Wᵀ). A training step also runs
dY · W (the input gradient, neither operand transposed) and dYᵀ · X (the weight gradient, which
reduces over the tokens), and cuBLAS picks other kernels for them. For a layer of `d_in` inputs
and `d_out` outputs on `tokens` rows (tokens log-uniform in [64, 16384], d_in and d_out multiples
of 64 log-uniform in [64, 16384], at most 2 GiB of operands), per shape and layout, with the L2
flushed (kit.data.timing.l2_flusher) before each timed call, outside the timed region:
* latency_ms: CUDA events around one call, the mean of the fastest half of --repeats;
* kernel_ms and the kernel names from the median of five profiled calls (kit.data.timing.profile_cuda).
The kit's orientation of each (kit.ops.Gemm: out m x n, reduce over k): fwd m=tokens, n=d_out,
k=d_in; dgrad m=tokens, n=d_in, k=d_out; wgrad m=d_out, n=d_in, k=tokens.
Rows are JSON lines, fsynced; a rerun skips rows already there; an error is the row's "error".
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attention_sweep import check_sweep, sweep_parser  # noqa: E402
from decode_steps import _free, _time_ms  # noqa: E402
from kit.data.timing import is_fatal_cuda_error, l2_flusher, profile_cuda  # noqa: E402
from kit.data.records import append_jsonl, read_jsonl  # noqa: E402
from kit.errors import KitError, one_line  # noqa: E402
from kit.workload.capture import TORCH_DTYPES  # noqa: E402

LAYOUTS = ("fwd", "dgrad", "wgrad")
MAX_BYTES = 2 ** 31


def draw_shapes(count: int, seed: int) -> list[tuple[int, int, int]]:
    """`count` distinct (tokens, d_in, d_out), seeded (see the module doc)."""
    rng = np.random.default_rng(seed)
    out: dict[tuple, None] = {}
    tries = 0
    while len(out) < count and tries < 50 * count:
        tries += 1
        t = int(round(math.exp(rng.uniform(math.log(64), math.log(16384)))))
        d_in, d_out = (64 * int(round(math.exp(rng.uniform(0, math.log(256))))) for _ in range(2))
        if 4 * (t * d_in + d_in * d_out + t * d_out) > MAX_BYTES:
            continue
        out[(t, d_in, d_out)] = None
    return list(out)


def kit_dims(layout: str, tokens: int, d_in: int, d_out: int) -> dict:
    """The GEMM's (m, n, k) in kit.ops.Gemm's orientation."""
    return {"fwd": {"m": tokens, "n": d_out, "k": d_in},
            "dgrad": {"m": tokens, "n": d_in, "k": d_out},
            "wgrad": {"m": d_out, "n": d_in, "k": tokens}}[layout]


def calls(tokens: int, d_in: int, d_out: int, dtype: str, device: str) -> dict:
    tdt = TORCH_DTYPES[dtype]
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(tokens, d_in, device=device, dtype=tdt, generator=gen)
    w = torch.randn(d_out, d_in, device=device, dtype=tdt, generator=gen) * 0.02
    dy = torch.randn(tokens, d_out, device=device, dtype=tdt, generator=gen)
    return {"fwd": lambda: F.linear(x, w), "dgrad": lambda: dy @ w, "wgrad": lambda: dy.t() @ x}


def sweep(shapes, dtype: str, device: str, repeats: int, jsonl: str | None, time_limit: float | None) -> dict:
    done = set()
    if jsonl and Path(jsonl).exists():
        done = {(r["layout"], r["tokens"], r["d_in"], r["d_out"]) for r in read_jsonl(jsonl)
                if r.get("dtype") == dtype}
    flush, _ = l2_flusher(device, True)
    t0, rows, stopped = time.perf_counter(), [], None
    for tokens, d_in, d_out in shapes:
        if time_limit is not None and time.perf_counter() - t0 > time_limit:
            stopped = f"time limit {time_limit:g} s reached"
            break
        try:
            fns = calls(tokens, d_in, d_out, dtype, device)
        except Exception as e:  # noqa: BLE001
            fns, err = {}, one_line(e)
        for layout in LAYOUTS:
            if (layout, tokens, d_in, d_out) in done:
                continue
            row = {"layout": layout, "tokens": tokens, "d_in": d_in, "d_out": d_out, "dtype": dtype,
                   **kit_dims(layout, tokens, d_in, d_out)}
            try:
                if not fns:
                    raise RuntimeError(err)
                fn = fns[layout]
                for _ in range(3):
                    fn()
                row["latency_ms"] = _time_ms(fn, device, repeats, flush)
                if device == "cuda":
                    k = profile_cuda(fn, flush)
                    row.update(kernel_ms=k.get("kernel_ms"), kernel_name=k.get("kernel_name"),
                               kernels=k.get("kernels", "")[:400])
            except Exception as e:  # noqa: BLE001 (out of memory and the like: the row says why)
                row["error"] = one_line(e)
                if is_fatal_cuda_error(e):
                    stopped = f"CUDA error: {row['error']}"
            rows.append(row)
            if jsonl:
                append_jsonl(jsonl, row)
            if stopped:
                break
        fns = None
        _free(device)
        if stopped:
            break
    return {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "torch": torch.__version__, "dtype": dtype, "stopped": stopped, "measured": len(rows)}


def main(argv=None) -> int:
    args = sweep_parser(__doc__, ("bf16", "fp16", "fp32", "tf32"), 150, 51).parse_args(argv)
    try:
        check_sweep(args)
        if args.dtype == "tf32":
            if args.device != "cuda":
                raise KitError("--dtype tf32 needs --device cuda (tf32 is a tensor-core mode)")
            torch.backends.cuda.matmul.allow_tf32 = True
        out = sweep(draw_shapes(args.count, args.seed), args.dtype, args.device, args.repeats,
                    args.jsonl, args.time_limit)
    except KitError as e:
        print(f"gemm_layouts: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
