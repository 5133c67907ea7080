"""`kit predict MODEL --gpu NAME ...`: one training step or inference pass of a whole model."""
from functools import partial
from pathlib import Path

from kit.cli import add_command, positive_int
from kit.cli.outputs import nonempty
from kit.workload.models import DTYPES as MODEL_DTYPES  # --dtype's choices (no torch imported)


def dtype_text(r: dict) -> str:
    """A result's dtype for the text output: "model (bf16; fp32 too)" when --dtype model gave
    it (its model_dtypes: the parameters in each dtype, most first), else the dtype."""
    held = r.get("model_dtypes")
    if held is None:
        return str(r.get("dtype"))
    others = [d for d in held if d != r.get("dtype")]
    total = sum(held.values()) or 1
    rest = "; " + ", ".join(f"{d} {100 * held[d] / total:.2g}% of parameters" for d in others) if others else ""
    return f"model ({r.get('dtype')}{rest})"


def optimizer_text(m: dict, fmt: str) -> str:
    """"optimizer X" (GiB), saying when it is AdamW's state assumed for a step timed without
    an optimizer."""
    assumed = (" (AdamW's state, assumed: the step timed has no optimizer; --optimizer adds its "
               "update, none drops the state)" if m.get("optimizer_assumed") else "")
    return f"optimizer {m['optimizer_bytes'] / 2**30:{fmt}}{assumed}"


def buffers_text(m: dict, fmt: str) -> str:
    """", buffers X" (GiB) for a memory dict whose module holds buffers, else nothing."""
    b = m.get("buffers_bytes", 0)
    return f", buffers {b / 2**30:{fmt}}" if b else ""


def add_model_args(p):
    """Arguments shared by predict and compare (the multi-GPU options extend this parser)."""
    from kit.workload.zoo import zoo_names

    p.add_argument("model", help="a zoo model (" + ", ".join(zoo_names()) + "), an HF-style "
                   "config .json file, or a Python path 'module:callable' returning an nn.Module, "
                   "an HF-style config dict or (module, inputs)")
    p.add_argument("--mode", default="train", choices=["train", "inference", "decode", "generate"],
                   help="train: forward + backward; inference: one forward pass over --seq tokens; "
                   "decode: one generated token per sequence, --seq tokens already in a KV cache; "
                   "generate: a --seq-token prompt's prefill, then --new-tokens decode steps")
    p.add_argument("--new-tokens", type=positive_int, default=None,
                   help="with --mode generate: tokens generated per sequence (default 128)")
    p.add_argument("--kv-cache", choices=["static", "dynamic"], default=None,
                   help="with --mode decode or generate: a static cache written in place (default) "
                   "or HF's DynamicCache, concatenated each step")
    p.add_argument("--disable-compile", action="store_true",
                   help="with --mode generate over a static cache: price the decode steps as "
                   "--fusion and --cuda-graphs ask, as HF's generate(disable_compile=True) runs "
                   "them (default: off, as HF 5.25's generate by default: its decode steps "
                   "compiled, CUDA graphs, mode reduce-overhead; the prefill always as asked)")
    p.add_argument("--batch", type=positive_int, default=None,
                   help="sequences or samples (default 1; none for a model whose own inputs fix it)")
    p.add_argument("--seq", type=positive_int, default=None, help="sequence length, or with --mode "
                   "decode the tokens in the KV cache (a static one preallocated for them and the step's "
                   "token), or with --mode generate the prompt (default: a "
                   "zoo model's own; 512 for a config or module, or the config's position table if "
                   "shorter; a 512-token prompt for generate)")
    p.add_argument("--dtype", default="fp32", choices=MODEL_DTYPES,
                   help="fp32: strict FP32 GEMMs and convolutions, as NeuSight measured (stock "
                        "PyTorch lets cuDNN's convolutions use TF32 on Ampere and later: --dtype "
                        "tf32 is closer for a CNN); tf32: FP32 tensors on TF32 tensor cores; fp16, "
                        "bf16: every parameter and floating input cast to it; model: each parameter "
                        "in the dtype your module holds (a bf16 body with an fp32 router), floating "
                        "inputs in its main dtype (the zoo and HF-style configs are fp32)")
    p.add_argument("--fusion", default="eager", choices=["eager", "compiled"])
    p.add_argument("--optimizer", default=None,
                   help="add an optimizer step to training: adamw, adamw-fused, adam, sgd (momentum 0.9), "
                        "none (no step and no state; without the option, no step is timed but the memory "
                        "counts AdamW's state)")
    p.add_argument("--no-loss", action="store_true",
                   help="train: start the backward pass at a language model's logits, leaving out "
                        "the cross-entropy over the vocabulary (as NeuSight's labels, kit validate)")
    p.add_argument("--predictor", default="auto", help="kernel predictor: auto, wave, roofline, ...")
    p.add_argument("--gpu-file", type=nonempty, metavar="FILE", help="load your own GPU(s) from a JSON file first")
    p.add_argument("--overhead-trace", type=nonempty, metavar="KINETO.json",
                   help="calibrate the CPU launch overhead from a Kineto trace")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="the step replays a CUDA graph (torch.compile mode reduce-overhead): no "
                   "per-op host cost")
    add_weights_option(p)


def add_weights_option(p):
    """--weights DIR on a command whose run and text add_command has set: the command runs with
    the learned predictors read from DIR (else $KIT_WEIGHTS, else the shipped weights), and its
    output says which weights whenever they are not the shipped ones."""
    p.add_argument("--weights", type=nonempty, metavar="DIR",
                   help="predictor weights folder from `kit train --out` for the learned predictors "
                        "(tile, mlp, li, habitat); default: $KIT_WEIGHTS if set, else the shipped "
                        "weights. The output names the folder (and the manifest's training GPUs "
                        "and sha256)")
    p.set_defaults(func=partial(run_checked, p.get_default("func")))
    if p.get_default("text") is not None:
        p.set_defaults(text=partial(text_with_weights, p.get_default("text")))


def run_checked(run, args):
    """run(args) under the chosen weights, after the checks a whole model's costing would hide
    (it falls back to the wave model, with a note, for an op type its predictor refuses): weights
    no chosen predictor reads, and an FP32-only baseline asked for another dtype. The result gets
    "predictor_weights" (kit.predict.weights_in_use) when they are not the shipped ones."""
    from kit.errors import KitError
    from kit.predict import (FP32_ONLY, LEARNED, PREDICTORS, fp32_only_message, resolve_name,
                             using_weights, weights_in_use)

    if getattr(args, "gpu_file", None):  # before the weights: they may name a GPU only the file has
        from kit.hardware import load_gpu_file

        try:
            load_gpu_file(args.gpu_file)
        except KitError:  # said by run(args), after its output checks (--trace onto the file)
            pass
    with using_weights(args.weights):
        name = resolve_name(args.predictor)
        if args.weights is not None and name in PREDICTORS and name not in LEARNED:
            raise KitError(f"--weights is for the learned predictors ({', '.join(LEARNED)}); "
                           f"--predictor {args.predictor} reads no weights")
        dtype = getattr(args, "dtype", "fp32")
        # model: the ops' own dtypes, which the baseline refuses op by op where not fp32
        if name in FP32_ONLY and dtype not in ("fp32", "model"):
            raise KitError(fp32_only_message(name, dtype))
        info = weights_in_use() if name in LEARNED else None  # a bad folder fails here, first
        result = run(args)
    if info is not None and isinstance(result, dict):
        return {**result, "predictor_weights": info}
    return result


def weights_line(info: dict) -> str:
    """The text output's line on weights that are not the shipped ones."""
    trained = f"; trained on {', '.join(info['train_gpus'])}" if info.get("train_gpus") else ""
    sha = f"; model.safetensors sha256 {info['sha256'][:16]}..." if info.get("sha256") else ""
    return (f"predictor weights {info['folder']} (from {info['from']}{trained}{sha}), not the "
            "shipped ones")


def text_with_weights(text, r) -> str:
    out = text(r)
    info = r.get("predictor_weights") if isinstance(r, dict) else None
    return f"{out}\n{weights_line(info)}" if info else out


def overhead_from(args):
    if getattr(args, "cuda_graphs", False):
        from kit.errors import KitError
        from kit.workload.iteration import CUDA_GRAPH

        if getattr(args, "overhead_trace", None):
            raise KitError("--cuda-graphs and --overhead-trace both set the host cost; give one")
        return CUDA_GRAPH
    if getattr(args, "overhead_trace", None):
        from kit.workload.overhead import calibrate

        return calibrate(args.overhead_trace)
    return None


def with_calibration(out: dict, overhead, args) -> dict:
    """out with the --overhead-trace file and the host costs calibrated from it (what the text's
    host line shows); out unchanged without --overhead-trace."""
    if not getattr(args, "overhead_trace", None):
        return out
    return {**out, "overhead": overhead.to_dict(), "overhead_trace": str(args.overhead_trace)}


def host_lines(r) -> list[str]:
    """The text output's line on host costs calibrated from --overhead-trace (none without it)."""
    trace, o = r.get("overhead_trace"), r.get("overhead")
    if not trace or not o:
        return []
    detail = o["source"].removeprefix(f"{Path(trace).name}: ")
    return [f"  host      calibrated from {trace}: {o['cpu_op_us']:.2f} µs per op, {o['launch_us']:.2f} µs "
            f"per launch, {o['free_op_us']:.2f} µs per view op ({detail})"]


def check_decode_args(args) -> None:
    """--new-tokens and --kv-cache only where they mean something (never silently dropped)."""
    from kit.errors import KitError

    if getattr(args, "new_tokens", None) is not None and args.mode != "generate":
        raise KitError(f"--new-tokens goes with --mode generate (got --mode {args.mode})")
    if getattr(args, "kv_cache", None) is not None and args.mode not in ("decode", "generate"):
        raise KitError(f"--kv-cache goes with --mode decode or generate (got --mode {args.mode})")
    if getattr(args, "disable_compile", False) and args.mode != "generate":
        raise KitError(f"--disable-compile goes with --mode generate (got --mode {args.mode})")
    if args.mode == "generate" and args.optimizer:
        raise KitError("an optimizer step needs mode train (got mode generate)")
    if getattr(args, "cuda_graphs", False) and getattr(args, "kv_cache", None) == "dynamic":
        raise KitError("--cuda-graphs replays one captured step, and a dynamic KV cache changes "
                       "its tensors' shapes every step: use --kv-cache static with it")
    if getattr(args, "no_loss", False):
        if args.mode != "train":
            raise KitError(f"--no-loss goes with --mode train (got --mode {args.mode})")
        if getattr(args, "system", None):
            raise KitError("--no-loss is for one GPU (--gpu): a multi-GPU step (--system) runs "
                           "Megatron's vocab-parallel cross entropy")


def gpu_memory_text(m: dict) -> str:
    """The GPU's memory a step's need is held against: "80 GiB", or on a GDDR card with ECC
    "15 GiB usable (16 GiB less in-band ECC)"."""
    total = m["gpu_memory_bytes"] / 2**30
    usable = m.get("gpu_usable_memory_bytes", m["gpu_memory_bytes"]) / 2**30
    return f"{total:g} GiB" if usable == total else f"{usable:g} GiB usable ({total:g} GiB less in-band ECC)"


def pricing_text(priced: dict) -> list[str]:
    """The text output's lines on how a generate result priced its prefill and its decode steps
    (its "priced", kit.workload.generation.pricing)."""
    def one(p):
        host = "replayed as a CUDA graph" if p["cuda_graphs"] else "launched op by op"
        return f"{p['fusion']}, {host} ({p['why']})"
    return [f"  priced    prefill: {one(priced['prefill'])}",
            f"            decode steps: {one(priced['decode'])}"]


def generation_text(r) -> str:
    pre, steps = r["prefill"], r["decode_steps"]
    lines = [f"{r['model']} generate on {r['gpu']}: batch {r['batch']}, prompt {r['prompt']}, "
             f"{r['new_tokens']} new tokens, {dtype_text(r)}, {r['fusion']}, predictor {r['predictor']}",
             f"  total     {r['total_ms']:.1f} ms  ({r['tokens_per_s']:.1f} tokens/s over the batch)",
             f"  TTFT      {r['ttft_ms']:.2f} ms  (the prompt's prefill; GPU idle {pre['gpu_idle_ms']:.2f} ms)"]
    if steps:
        lines.append(f"  TPOT      {r['tpot_ms']:.2f} ms a token after the first (decode steps "
                     f"{steps[0]['ms']:.2f} ms at context {steps[0]['context']} to "
                     f"{steps[-1]['ms']:.2f} ms at {steps[-1]['context']}; GPU idle "
                     f"{steps[0]['gpu_idle_ms']:.2f}-{steps[-1]['gpu_idle_ms']:.2f} ms a step)")
    lines += pricing_text(r["priced"])
    lines += host_lines(r)
    m = r["memory"]
    lines.append(f"  memory    {m['total_bytes'] / 2**30:.1f} GiB (weights {m['weights_bytes'] / 2**30:.1f}, "
                 f"KV cache {m.get('kv_cache_bytes', 0) / 2**30:.2f}, activations "
                 f"{m['activations_bytes'] / 2**30:.2f}{buffers_text(m, '.2f')}) of {gpu_memory_text(m)}"
                 + ("" if m["fits"] else ": it would not fit on one GPU"))
    lines += [f"  note: {n}" for n in r.get("notes", ())]  # e.g. HF's auto-compiled static decode
    return "\n".join(lines)


def run(args):
    from kit.api import predict_model
    from kit.cli.outputs import model_files, output_path
    from kit.errors import KitError
    from kit.hardware import load_gpu_file

    output_path(args.trace, "--trace", [*model_files(args.model), args.gpu_file, args.overhead_trace])
    # the GPUs it registered (run_parallel: one must be the preset's own, to correct its spec)
    args.gpu_file_gpus = load_gpu_file(args.gpu_file) if args.gpu_file else []
    check_decode_args(args)  # before either path: neither may drop them silently
    if getattr(args, "system", None):  # multi-GPU: kit/cli/cmd_predict_parallel.py
        from kit.cli.cmd_predict_parallel import run_parallel

        return run_parallel(args)
    if args.gpu is not None and not args.gpu.strip():
        raise KitError("--gpu is empty: name a GPU (see `kit gpus`)")
    if not args.gpu:
        raise KitError("kit predict: give --gpu (one GPU) or --system (multi-GPU)")
    overhead = overhead_from(args)
    if args.mode == "generate":
        if args.trace:
            raise KitError("--trace shows one step; with --mode generate, trace a prefill "
                           "(--mode inference) or a step (--mode decode)")
        from kit.api import predict_generation

        return with_calibration(predict_generation(
            args.model, args.gpu, batch=args.batch or 1, prompt=args.seq or 512,
            new_tokens=args.new_tokens or 128, dtype=args.dtype, fusion=args.fusion,
            predictor=args.predictor, overhead=overhead, kv_cache=args.kv_cache or "static",
            disable_compile=args.disable_compile), overhead, args)
    it = predict_model(args.model, args.gpu, mode=args.mode, batch=args.batch, seq=args.seq,
                       dtype=args.dtype, fusion=args.fusion, optimizer=args.optimizer,
                       predictor=args.predictor, overhead=overhead,
                       kv_cache=args.kv_cache or "static", loss=not args.no_loss)
    out = with_calibration(it.to_dict(), overhead, args)  # with its memory need (kit.api.predict_model)
    if args.trace:
        from kit.trace.perfetto import write_json

        out["trace"] = write_json(it.to_trace(), args.trace)  # gzipped when named .gz
    return out


def bound_line(r) -> str:
    """Which side sets a step's time: the CPU when the GPU waits for launches more than a tenth
    of the step (the whole-model panel's rule), with what could close the gap; else the GPU, and
    the op class that takes most of it."""
    idle, total = max(r["gpu_idle_ms"], 0.0), r["total_ms"]
    if total > 0 and idle > 0.1 * total:
        # (a CUDA graph has no host cost per op, so a step under one is never CPU-bound)
        tips = ["--cuda-graphs (no host cost per op)"]
        if r.get("fusion") != "compiled":
            tips.insert(0, "--fusion compiled (fewer kernels)")
        return (f"  bound     CPU: the GPU waits {idle:.2f} ms ({100 * idle / total:.0f}%) for "
                f"launches; {' or '.join(tips)} could close the gap")
    top = max(r["by_class"], key=lambda c: c["ms"]) if r["by_class"] else None
    what = f"; {top['op_class']} kernels take {100 * top['share']:.0f}% of it" if top else ""
    return f"  bound     GPU: the CPU keeps ahead and the kernels set the time{what}"


def text(r) -> str:
    if r.get("mode") == "generate":
        return generation_text(r)
    if "iteration_ms" in r:
        from kit.cli.cmd_predict_parallel import text_parallel

        return text_parallel(r)
    from kit.cli.cmd_predict_parallel import band_text

    band = band_text(r["band_ms"])
    seq = f"seq {r['seq']}, " if r.get("seq") is not None else ""  # none: inputs given with the model
    if r.get("mode") == "decode" and r.get("context") is not None:
        seq = f"context {r['context']} ({r.get('kv_cache', 'static')} cache), "
    if r.get("image_size"):
        seq = f"images {r['image_size']}x{r['image_size']}, "
    lines = [f"{r['model']} {r['mode']} on {r['gpu']}: batch {r.get('batch')}, {seq}"
             f"{dtype_text(r)}, {r['fusion']}, predictor {r['predictor']}",
             f"  total     {r['total_ms']:.2f} ms" + (f"  {band.strip()}" if band else ""),
             "  phases    " + ", ".join(f"{k} {v:.2f} ms" for k, v in r["phases_ms"].items())
             + ("; the forward ends with the loss, cross-entropy over the vocabulary (--no-loss: "
                "from the logits)" if r.get("loss") else ""),
             *([f"  decode    {r['batch']} new token{'s' * (r['batch'] > 1)} a step (one per sequence): "
                f"{r['tokens_per_s']:.1f} tokens/s; KV cache {r['kv_cache_bytes'] / 2**30:.2f} GiB"]
               if r.get("mode") == "decode" else []),
             f"  kernels   {r['kernels']} launches, {r['kernel_ms']:.2f} ms of GPU work; CPU issue "
             f"{r['cpu_ms']:.2f} ms; GPU idle {max(r['gpu_idle_ms'], 0):.2f} ms",
             *host_lines(r),
             bound_line(r),
             *carried_lines(r),
             "  by class:"]
    for c in r["by_class"]:
        lines.append(f"    {c['op_class']:<12} {c['ms']:10.3f} ms  {100 * c['share']:5.1f}%  ({c['kernels']} kernels)")
    lines.append("  top kernels:")
    for k in r["top_kernels"]:
        lines.append(f"    {k['ms']:10.3f} ms  {k['count']:>4}x  {k['phase']:<3} {k['aten']:<28} "
                     f"{k['where']}  {k['shapes']}")
    if r.get("unknown_ops"):
        lines.append("  unknown ops (costed as memory-bound): "
                     + ", ".join(f"{k} x{v}" for k, v in r["unknown_ops"].items()))
    fast = r.get("fast_path") or {}
    if fast.get("taken"):
        lines.append("  torch's native inference fast path: " + ", ".join(
            f"{k} x{v}" for k, v in fast["taken"].items()))
    for why, n in (fast.get("declined") or {}).items():
        lines.append(f"  slow path (as torch would run it) x{n}: {why}")
    m = r.get("memory")
    if m and not m["fits"]:
        lines.append(f"  note: needs {m['total_bytes'] / 2**30:.1f} GiB (weights {m['weights_bytes'] / 2**30:.1f}, "
                     f"grads {m['grads_bytes'] / 2**30:.1f}, {optimizer_text(m, '.1f')}, "
                     f"activations {m['activations_bytes'] / 2**30:.1f}, KV cache "
                     f"{m.get('kv_cache_bytes', 0) / 2**30:.1f}{buffers_text(m, '.1f')}), more than {r['gpu']}'s "
                     f"{gpu_memory_text(m)}: it would not fit on one GPU")
    for t, why in r.get("fallbacks", {}).items():
        lines.append(f"  note: {t}: {why}")
    gather = r.get("expert_gather_ms", 0.0)  # kit.workload.iteration.Iteration.expert_gather_ms
    if gather:
        lines.append(f"  note: {gather:.4g} ms of this step gathers expert weights: HF's generate runs "
                     "a MoE decode step as batched_mm, each (token, expert) pair copying its expert's "
                     "matrices (kit.workload.zoo_experts), so batching gains little; a serving engine's "
                     "grouped GEMM reads each expert once")
    if r.get("trace"):
        lines.append(f"  trace written to {r['trace']} (open in ui.perfetto.dev)")
    return "\n".join(lines)


def carried_lines(r) -> list[str]:
    """The share of the kernel time that takes a curve carried from where it was measured
    (kit.workload.carried), if any."""
    carried = {k: v for k, v in (r.get("carried_ms") or {}).items() if v > 0}
    if not carried or not r.get("kernel_ms"):
        return []
    share = sum(carried.values()) / r["kernel_ms"]
    parts = ", ".join(f"the {k} curve {100 * v / r['kernel_ms']:.0f}%"
                      for k, v in sorted(carried.items(), key=lambda kv: -kv[1]))
    return [f"  carried   {100 * share:.0f}% of the kernel time takes kernel-time curves measured on"
            f" another GPU or dtype and carried to this one ({parts}; kit.predict.tensor_core): none"
            " of those kernels was timed here, so their band is wider"]


def register(sub):
    p = add_command(sub, "predict", "predict a whole model's training step or inference pass", run, text)
    add_model_args(p)
    p.add_argument("--gpu", help="GPU key, name or alias (see `kit gpus`); or --system")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome/Perfetto trace of the timeline")
    from kit.cli.cmd_predict_parallel import add_parallel_args

    add_parallel_args(p)
