"""Measure whole-model training steps and inference passes of zoo models on this machine, beside
the kit's prediction.

    python benchmarks/model_steps.py --device cuda \
        --configs gpt2:fp32:8:1024,bert-large:fp32:8:512,llama3-8b:bf16:1:2048 \
        [--modes train,inference] [--jsonl rows.jsonl] [--time-limit SECONDS] > out.json

A config is MODEL:DTYPE:BATCH:SEQ. For each it builds the zoo model once with random weights on
the device (benchmarks/decode_steps.real_model: cast on the meta device, then real memory) and
times, with CUDA events, the mean of the fastest half of `--repeats` calls after warm-up:
* train: the forward pass in train mode, the language-model loss where the output is over the
  vocabulary (fp32 cross-entropy against labels, as kit.workload.zoo.lm_loss), and the backward
  pass; no optimizer step (`kit predict --mode train`'s default). Gradients are dropped
  (set to None) before each step, so every step allocates and writes them afresh. The labels
  (and, for an output that is not over the vocabulary, the gradient backward starts from) are
  made once, outside the timed step, as a batch's labels are data the step is given.
* inference: one forward pass under no_grad in eval mode.
Token ids and labels are random (seeded) in the vocabulary: all-zero ids would make every
position's activations alike (identically so in a rotary model), data that a GPU multiplies at
lower power, so faster, than real text's.
The profiler records the step's GPU kernels: their summed device time (measured_kernel_ms, the
GPU's work, beside the step's wall time, which also holds the CPU's issue time) and the ten
longest kernels. TF32 is off for matmuls and cuDNN (torch's default for matmul; the kit's fp32),
on for a tf32 config only (what the kit predicts for dtype tf32).

Rows are written as decode_steps writes them (JSON lines, fsynced, rerun skips rows already
there); an error (out of memory, say) is the row's "error"; a CUDA error that loses the context
stops the sweep. Output on stdout: {"device", "torch", "predicted_for", "stopped", "rows":
[{model, dtype, batch, seq, mode, measured_ms, measured_kernel_ms, kernels, top_kernels,
predicted_ms, predicted_kernel_ms, predicted_gpu, seconds}]}. The tests run it on the CPU with a
tiny config.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from decode_steps import _free, _json_default, _kernels, _time_ms, prediction_gpu, real_model  # noqa: E402
from kit.data.timing import is_fatal_cuda_error  # noqa: E402
from kit.data.records import append_jsonl, read_jsonl  # noqa: E402
from kit.errors import KitError, one_line  # noqa: E402
from kit.workload import zoo  # noqa: E402
from kit.workload.capture import TORCH_DTYPES  # noqa: E402

MODES = ("train", "inference")


def parse_configs(text: str) -> list[tuple[str, str, int, int]]:
    """"MODEL:DTYPE:BATCH:SEQ,..." -> [(model, dtype, batch, seq)], or one KitError naming the bad one."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        parts = item.split(":")
        if len(parts) != 4:
            raise KitError(f"config {item!r}: expected MODEL:DTYPE:BATCH:SEQ")
        model, dtype, batch, seq = (x.strip() for x in parts)
        if not model:
            raise KitError(f"config {item!r}: no model name")
        if dtype not in TORCH_DTYPES:
            raise KitError(f"config {item!r}: unknown dtype {dtype!r} (choose {', '.join(TORCH_DTYPES)})")
        try:
            b, s = int(batch), int(seq)
        except ValueError:
            raise KitError(f"config {item!r}: batch and seq must be integers") from None
        if b < 1 or s < 1:
            raise KitError(f"config {item!r}: batch and seq must be at least 1")
        out.append((model, dtype, b, s))
    if not out:
        raise KitError("no configs given")
    return out


def real_inputs(m, batch: int, seq: int, device: str, seed: int = 0) -> tuple:
    """The model's example inputs (meta tensors) on the device, dtypes kept: token ids (an integer
    (batch, seq) tensor of a model with a vocabulary) random in the vocabulary, the rest zeros
    (image pixels, class labels, table indices: values any model accepts)."""
    vocab = m.config.get("vocab_size")
    gen = torch.Generator().manual_seed(seed)

    def real(t):
        if not isinstance(t, torch.Tensor):
            return t
        if (isinstance(vocab, int) and vocab > 0 and not t.is_floating_point()
                and tuple(t.shape) == (batch, seq)):
            return torch.randint(0, vocab, tuple(t.shape), generator=gen, dtype=t.dtype).to(device)
        return torch.zeros(t.shape, dtype=t.dtype, device=device)

    return tuple(real(t) for t in m.example_inputs(batch, seq))


def _root(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else next(t for t in out if isinstance(t, torch.Tensor))


def step_fn(m, inputs: tuple, mode: str):
    """One call of the measured work (see the module doc)."""
    vocab = m.config.get("vocab_size")
    params = [p for p in m.parameters() if p.requires_grad]
    if mode == "inference":
        m.eval()

        def step():
            with torch.no_grad():
                m(*inputs)
        return step
    m.train()
    made: dict = {}  # the labels and backward seeds, made on the first call (a warm-up) and kept

    def labels(n: int, device) -> torch.Tensor:
        if ("labels", n) not in made:
            gen = torch.Generator().manual_seed(1)
            made["labels", n] = torch.randint(0, vocab, (n,), generator=gen).to(device)
        return made["labels", n]

    def start_grad(out: torch.Tensor) -> torch.Tensor:
        k = ("seed", tuple(out.shape), out.dtype)
        if k not in made:
            made[k] = torch.ones_like(out)
        return made[k]

    def train_step():
        for p in params:
            p.grad = None
        out = _root(m(*inputs))
        if vocab and out.dim() >= 2 and out.shape[-1] == vocab:
            flat = out.float().reshape(-1, vocab)
            out = F.cross_entropy(flat, labels(flat.shape[0], flat.device))
        if out.numel() == 1:
            out.backward()
        else:
            out.backward(start_grad(out))
    return train_step


def set_tf32(on: bool) -> None:
    """TF32 for fp32 matmuls and cuDNN convolutions: on for a tf32 config only."""
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def key(r: dict) -> tuple:
    return (str(r.get("model")), str(r.get("dtype")), int(r.get("batch", 0)), int(r.get("seq", 0)),
            str(r.get("mode")))


def measure(m, model: str, dtype: str, batch: int, seq: int, mode: str, device: str,
            warmup: int, repeats: int, gpu: str | None) -> dict:
    t0 = time.perf_counter()
    inputs = real_inputs(m, batch, seq, device)
    step = step_fn(m, inputs, mode)
    for _ in range(warmup):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    row = {"model": model, "dtype": dtype, "batch": batch, "seq": seq, "mode": mode,
           "measured_ms": _time_ms(step, device, repeats)}
    if device == "cuda":
        row.update(_kernels(step, steps=2))
        row["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    for p in m.parameters():
        p.grad = None
    inputs = step = None
    if gpu is not None:
        from kit.api import predict_model

        try:
            it = predict_model(model, gpu, mode=mode, batch=batch, seq=seq, dtype=dtype)
            row.update(predicted_ms=it.total_ms, predicted_kernel_ms=it.kernel_ms, predicted_gpu=it.gpu)
        except Exception as e:  # noqa: BLE001 - the measurement stands without it
            row["predict_error"] = one_line(e, with_type=False)[:200]
    row["seconds"] = round(time.perf_counter() - t0, 3)
    return row


def sweep(configs, modes, device: str, repeats: int, warmup: int, gpu: str | None, path: Path | None,
          time_limit: float | None = None) -> tuple[list, str | None]:
    rows, done = [], set()
    for r in read_jsonl(path) if path else []:
        if "model" in r and "error" not in r:
            rows.append(r)
            done.add(key(r))

    def add(row):
        rows.append(row)
        if "error" not in row:
            done.add(key(row))  # a config or mode listed twice is measured once
        if path:
            append_jsonl(path, row, default=_json_default)
        print(json.dumps({k: v for k, v in row.items() if k != "top_kernels"}, default=_json_default),
              file=sys.stderr, flush=True)

    t0 = time.monotonic()
    for model, dtype, batch, seq in configs:
        todo = [md for md in modes if key({"model": model, "dtype": dtype, "batch": batch, "seq": seq,
                                           "mode": md}) not in done]
        m = None
        for mode in todo:
            base = {"model": model, "dtype": dtype, "batch": batch, "seq": seq, "mode": mode}
            if time_limit is not None and time.monotonic() - t0 >= time_limit:
                return rows, f"time limit ({time_limit:g} s) reached before {model} {dtype} b{batch} s{seq} {mode}"
            failed = None
            try:
                zoo.check_seq(model, seq, 0)
                if m is None:
                    m = real_model(model, dtype, device)
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                set_tf32(dtype == "tf32")
                add(measure(m, model, dtype, batch, seq, mode, device, warmup, repeats, gpu))
            except Exception as e:  # noqa: BLE001 - out of memory, an unknown model, ...
                failed = e
            if failed is None:
                continue
            # out of the except block: its traceback held the failed step's frames (the
            # activations, the autograd graph) alive; now only `failed` does, dropped below
            fatal = device == "cuda" and is_fatal_cuda_error(failed)
            text = one_line(failed, with_type=False)[:300]
            add({**base, "error": f"{type(failed).__name__}: {text}", **({"fatal": True} if fatal else {})})
            failed = None
            if fatal:  # the context is gone: no CUDA call after this one
                return rows, f"CUDA error at {model} {dtype} b{batch} s{seq} {mode}: {text}"
            if m is not None:
                for p in m.parameters():
                    p.grad = None
            _free(device)
        m = None
        _free(device)
    return rows, None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--configs", default="gpt2:fp32:8:1024,bert-large:fp32:8:512,gpt2:bf16:8:1024",
                    help="MODEL:DTYPE:BATCH:SEQ, comma-separated")
    ap.add_argument("--modes", default="train,inference")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--gpu", default=None, help="catalog GPU to predict for (default: this device)")
    ap.add_argument("--no-predict", action="store_true", help="measure only")
    ap.add_argument("--jsonl", default=None, help="append each row to this file as it is measured "
                    "(and skip the rows already in it)")
    ap.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                    help="start no row after this many seconds")
    args = ap.parse_args(argv)
    try:
        configs = parse_configs(args.configs)
        modes = list(dict.fromkeys(x.strip() for x in args.modes.split(",") if x.strip()))
        bad = [x for x in modes if x not in MODES]
        if bad or not modes:
            raise KitError(f"--modes: choose from {', '.join(MODES)} (got {args.modes!r})")
        if args.repeats < 1 or args.warmup < 0:
            raise KitError(f"--repeats must be at least 1 and --warmup at least 0 "
                           f"(got {args.repeats} and {args.warmup})")
    except KitError as e:
        print(f"model_steps: {e}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("model_steps: no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    set_tf32(False)
    gpu = prediction_gpu("model_steps", args.device, args.gpu, args.no_predict)
    rows, stopped = sweep(configs, modes, args.device, args.repeats, args.warmup, gpu,
                          Path(args.jsonl) if args.jsonl else None, args.time_limit)
    if stopped:
        print(f"model_steps: stopped: {stopped}", file=sys.stderr, flush=True)
    fatal = bool(stopped and stopped.startswith("CUDA error"))
    device = "cpu"
    if args.device == "cuda":
        device = torch.cuda.get_device_name() if not fatal else "cuda (context lost)"
    print(json.dumps({"device": device, "torch": torch.__version__, "predicted_for": gpu,
                      "tf32": False, "stopped": stopped, "rows": rows}, indent=1, default=_json_default))
    return 3 if fatal else 0


if __name__ == "__main__":
    sys.exit(main())
