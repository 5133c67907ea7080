"""Measure fused attention (torch's scaled_dot_product_attention) on this machine: forward, and
forward plus backward, over a seeded draw of shapes.

    python benchmarks/attention_sweep.py --device cuda --dtype bf16 --count 120 --seed 1 \
        --jsonl rows.jsonl [--time-limit SECONDS] [--repeats 20] > summary.json

No reference dataset times attention as one kernel: NeuSight's data has its parts (bmm, softmax)
only, so the kit costs a fused attention with its wave model at the tensor peak
(kit.predict.WavePredictor) and the backward as 2.5 forwards (kit.workload.mapping). These rows
are what that is judged against (benchmarks/h200_measured.py).

A shape is (batch, heads, seq, head_dim, causal), the query and the keys of the same length (a
prefill or a training step), drawn from batch in {1, 2, 4, 8, 16}, heads in {8, 12, 16, 32},
seq in {128, 256, ..., 8192}, head_dim in {64, 128}, causal or not, at most 2**31 score
elements (so the draw stays where a training step would be). Per shape, with the L2 flushed
(kit.data.timing.l2_flusher) before each timed call, outside the timed region:
* fwd_ms: the forward under no_grad (CUDA events, the mean of the fastest half of --repeats);
* train_ms: forward and backward with q, k, v requiring gradients, from a fixed output gradient;
* fwd_kernel_ms / train_kernel_ms and the kernel names, from the median of five profiled calls each
  (kit.data.timing.profile_cuda; on a VM with slow launches the event times of short calls carry the launch).
Rows are JSON lines, fsynced, one per shape; a rerun skips shapes already there; an error (out of
memory) is the row's "error"; a CUDA error that loses the context stops the sweep. The tests run
it on the CPU with a tiny draw.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from decode_steps import _free, _time_ms  # noqa: E402
from kit.data.timing import is_fatal_cuda_error, l2_flusher, profile_cuda  # noqa: E402
from kit.data.records import append_jsonl, read_jsonl  # noqa: E402
from kit.errors import KitError, one_line  # noqa: E402
from kit.workload.capture import TORCH_DTYPES  # noqa: E402

BATCHES = (1, 2, 4, 8, 16)
HEADS = (8, 12, 16, 32)
SEQS = tuple(2 ** i for i in range(7, 14))  # 128 .. 8192
HEAD_DIMS = (64, 128)
MAX_SCORES = 2 ** 31  # batch * heads * seq * seq
KEYS = ("batch", "heads", "seq", "head_dim", "causal")


def draw_shapes(count: int, seed: int, max_seq: int | None = None) -> list[tuple[int, int, int, int, bool]]:
    """`count` distinct shapes (batch, heads, seq, head_dim, causal), seeded, from the grid in the
    module doc (every shape of it when count is larger)."""
    grid = [s for s in itertools.product(BATCHES, HEADS, SEQS, HEAD_DIMS, (False, True))
            if s[0] * s[1] * s[2] * s[2] <= MAX_SCORES and (max_seq is None or s[2] <= max_seq)]
    if not grid:
        raise KitError(f"no attention shape has seq <= {max_seq}")
    rng = np.random.default_rng(seed)
    pick = rng.permutation(len(grid))[:count]
    return [grid[i] for i in pick]


def measure(shape, dtype: str, device: str, repeats: int, flush) -> dict:
    batch, heads, seq, head_dim, causal = shape
    tdt = TORCH_DTYPES[dtype]
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device=device, dtype=tdt, generator=gen)
               for _ in range(3))
    grad = torch.randn(batch, heads, seq, head_dim, device=device, dtype=tdt, generator=gen)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))

    def train():
        qg.grad = kg.grad = vg.grad = None
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(grad)

    for call in (fwd, train):  # warm-up: library choice, autotuning, clocks
        for _ in range(3):
            call()
    if device == "cuda":
        torch.cuda.synchronize()
    row = {"fwd_ms": _time_ms(fwd, device, repeats, flush),
           "train_ms": _time_ms(train, device, repeats, flush)}
    if device == "cuda":
        f, t = profile_cuda(fwd, flush), profile_cuda(train, flush)
        row.update(fwd_kernel_ms=f.get("kernel_ms"), fwd_kernels=f.get("kernels", "")[:400],
                   train_kernel_ms=t.get("kernel_ms"), train_kernels=t.get("kernels", "")[:600],
                   train_n_kernels=t.get("n_kernels", 0))
    return row


def sweep(shapes, dtype: str, device: str, repeats: int, jsonl: str | None,
          time_limit: float | None) -> dict:
    done = set()
    if jsonl and Path(jsonl).exists():
        done = {tuple(r[k] for k in KEYS) for r in read_jsonl(jsonl) if r.get("dtype") == dtype}
    flush, _ = l2_flusher(device, True)
    t0, rows, stopped = time.perf_counter(), [], None
    for shape in shapes:
        if shape in done:
            continue
        if time_limit is not None and time.perf_counter() - t0 > time_limit:
            stopped = f"time limit {time_limit:g} s reached"
            break
        row = dict(zip(KEYS, shape), dtype=dtype)
        t = time.perf_counter()
        try:
            row.update(measure(shape, dtype, device, repeats, flush))
        except Exception as e:  # noqa: BLE001 (out of memory and the like: the row says why)
            row["error"] = one_line(e)
            if is_fatal_cuda_error(e):
                stopped = f"CUDA error: {row['error']}"
        row["seconds"] = round(time.perf_counter() - t, 3)
        _free(device)
        rows.append(row)
        if jsonl:
            append_jsonl(jsonl, row)
        print(json.dumps({k: row.get(k) for k in (*KEYS, "fwd_ms", "train_ms", "error")}),
              file=sys.stderr, flush=True)
        if stopped:
            break
    return {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "torch": torch.__version__, "dtype": dtype, "stopped": stopped, "rows": rows}


def sweep_parser(doc: str, dtypes: tuple, count: int, seed: int) -> argparse.ArgumentParser:
    """The options of a shape sweep on one device (this script's and gemm_layouts.py's)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dtype", default="bf16", choices=dtypes)
    ap.add_argument("--count", type=int, default=count)
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--jsonl", default=None)
    ap.add_argument("--time-limit", type=float, default=None)
    return ap


def check_sweep(args) -> None:
    """KitError for a sweep's options that cannot run."""
    if args.count < 1 or args.repeats < 1:
        raise KitError("--count and --repeats must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise KitError("--device cuda: torch sees no CUDA device here")


def main(argv=None) -> int:
    ap = sweep_parser(__doc__, ("bf16", "fp16", "fp32"), 120, 1)
    ap.add_argument("--max-seq", type=int, default=None, help="draw only shapes with seq <= this")
    args = ap.parse_args(argv)
    try:
        check_sweep(args)
        shapes = draw_shapes(args.count, args.seed, args.max_seq)
        out = sweep(shapes, args.dtype, args.device, args.repeats, args.jsonl, args.time_limit)
    except KitError as e:
        print(f"attention_sweep: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
