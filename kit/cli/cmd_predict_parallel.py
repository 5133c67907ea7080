"""The multi-GPU part of `kit predict`: with --system, MODEL is trained on a parallel layout.

    kit predict gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200 --system dgx-h100 \\
        --nodes 128 --dp 8 --tp 8 --pp 16 --micro-batch 1 --global-batch 1536 --json

cmd_predict.py adds these options to its parser (add_parallel_args) and hands over to
run_parallel when --system is given. This module registers no command of its own.
"""
from __future__ import annotations

from kit.cli import positive_int


def add_parallel_args(p) -> None:
    g = p.add_argument_group("multi-GPU (with --system)")
    g.add_argument("--system", help="system preset (see `kit systems`): dgx-h100, dgx-a100, ...")
    g.add_argument("--nodes", type=positive_int, help="number of nodes of the preset on its network")
    g.add_argument("--dp", type=positive_int, default=1, help="data-parallel degree")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree")
    g.add_argument("--pp", type=positive_int, default=1, help="pipeline-parallel stages")
    g.add_argument("--ep", type=positive_int, default=1, help="expert-parallel degree (MoE)")
    g.add_argument("--micro-batch", type=positive_int, default=None, help="sequences per micro-batch (default --batch)")
    g.add_argument("--global-batch", type=positive_int, default=None, help="sequences per iteration")
    g.add_argument("--virtual-stages", type=positive_int, default=1, help="model chunks per stage (interleaved 1F1B)")
    g.add_argument("--schedule", default=None, choices=["1f1b", "gpipe", "interleaved"])
    g.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage (3 = FSDP)")
    g.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    g.add_argument("--sequence-parallel", action="store_true")
    g.add_argument("--no-overlap", action="store_true", help="all-reduce gradients after backward")
    g.add_argument("--grad-dtype", default=None, choices=["fp32", "bf16", "fp16"],
                   help="dtype gradients are kept and reduced in (default: fp32 for bf16 and fp32 "
                        "models, as Megatron-LM does; fp16 for fp16)")
    g.add_argument("--profile", default="default", help="host profile: default, megatron-a100, ...")
    g.add_argument("--kernels", default="auto", choices=["auto", "graph", "analytic"],
                   help="where the per-rank kernels come from: the model's captured op graph, or the "
                        "analytic Megatron layer (sequence and expert parallelism need it); auto: the "
                        "graph for zoo models where the layout allows it. Give the same choice to "
                        "runs you compare")
    p.set_defaults(func=_needs_system(p.get_default("func"), p))


_LAYOUT_FLAGS = ("nodes", "dp", "tp", "pp", "ep", "micro_batch", "global_batch", "virtual_stages", "schedule",
                 "zero", "recompute", "sequence_parallel", "no_overlap", "grad_dtype", "profile",
                 "kernels")


def _needs_system(func, parser):
    """Wrap `kit predict`'s func: a layout flag without --system is an error, not silently one GPU."""
    def run(args):
        if not getattr(args, "system", None):
            given = [f for f in _LAYOUT_FLAGS if getattr(args, f, None) != parser.get_default(f)]
            if given:
                from kit.errors import KitError

                raise KitError(f"--{given[0].replace('_', '-')} is a multi-GPU option: add --system "
                               "(see `kit systems`), or drop it to predict one GPU with --gpu")
        return func(args)
    return run


def run_parallel(args) -> dict:
    from kit.errors import KitError
    from kit.parallel import Layout, parse_model, predict_parallel
    from kit.parallel.profiles import get_profile

    dtype = args.dtype
    if dtype not in ("fp16", "bf16", "fp32"):
        raise KitError(f"--dtype {dtype}: multi-GPU training supports fp16, bf16 or fp32")
    if getattr(args, "mode", "train") != "train":
        raise KitError(f"--system predicts training iterations; drop --mode {args.mode}")
    if getattr(args, "gpu", None):
        raise KitError(f"--gpu and --system both given: --system {args.system} brings its own GPUs; drop --gpu "
                       "(or use --gpu alone for one GPU)")
    if getattr(args, "gpu_file", None):
        # run() has loaded it: an entry with the preset's own GPU key corrects that GPU's spec and
        # reaches the prediction (System.gpu looks its key up); any other GPU in it would not
        from kit.hardware import get_gpu, get_system, load_gpu_file

        own = get_system(args.system).gpu_key
        loaded = getattr(args, "gpu_file_gpus", None)
        if loaded is None:  # called without run()
            loaded = load_gpu_file(args.gpu_file)
        if get_gpu(own) not in loaded:  # its GPUs had been loaded and ignored
            raise KitError(f"--gpu-file goes with --gpu: --system {args.system} is a preset with its own "
                           f"GPUs ({own}; see `kit systems`), and the file does not give one with that key "
                           "(to correct its spec); drop --gpu-file")
    # single-GPU options the parallel model has no place for: refused, not silently dropped
    ignored = [flag for flag, on in (("--optimizer", getattr(args, "optimizer", None)),
                                     ("--fusion compiled", getattr(args, "fusion", "eager") != "eager"),
                                     ("--overhead-trace", getattr(args, "overhead_trace", None)),
                                     ("--cuda-graphs", getattr(args, "cuda_graphs", False))) if on]
    if ignored:
        raise KitError(f"{ignored[0]} is a single-GPU option (--gpu): with --system every step ends in an Adam "
                       "update and runs eager kernels, with the host costs of --profile; drop it")
    if args.micro_batch and args.batch is not None and args.batch != args.micro_batch:
        raise KitError(f"--batch {args.batch} and --micro-batch {args.micro_batch} disagree: with --system, "
                       "--batch is the micro-batch; give one of them (and --global-batch for the iteration)")
    if args.sequence_parallel and args.tp == 1:  # it had changed nothing, without a word
        raise KitError("--sequence-parallel splits the norms and dropout over --tp; with tp 1 it changes "
                       "nothing: raise --tp or drop it")
    if args.schedule not in (None, "interleaved") and args.virtual_stages > 1:
        raise KitError(f"--virtual-stages {args.virtual_stages} is the interleaved schedule; drop "
                       f"--schedule {args.schedule} or pass --schedule interleaved")
    spec = parse_model(args.model, seq=args.seq)
    lay = Layout(dp=args.dp, tp=args.tp, pp=args.pp, ep=args.ep,
                 micro_batch=args.micro_batch or args.batch or 1, global_batch=args.global_batch,
                 virtual_stages=args.virtual_stages,
                 schedule=args.schedule or ("interleaved" if args.virtual_stages > 1 else "1f1b"),
                 zero=args.zero, recompute=args.recompute, sequence_parallel=args.sequence_parallel,
                 dtype=dtype, grad_dtype=getattr(args, "grad_dtype", None),
                 overlap_grad_reduce=not args.no_overlap)
    kernels = getattr(args, "kernels", "auto")
    if kernels == "graph" and spec.zoo is None:
        raise KitError(f"--kernels graph: {spec.name!r} is an inline shape or a config file, with no zoo op "
                       "graph to capture; use a zoo model name or --kernels analytic")
    if kernels == "graph" and (lay.sequence_parallel or lay.ep > 1):
        raise KitError("--kernels graph: the captured op graph has no sequence or expert parallelism; "
                       "drop --sequence-parallel/--ep or use --kernels analytic")
    out = predict_parallel(spec, args.system, lay, nodes=args.nodes, predictor=args.predictor,
                           host=get_profile(args.profile), keep=bool(args.trace),
                           graph={"auto": "auto", "graph": True, "analytic": False}[kernels])
    res = out.pop("_result", None)
    if args.trace and res is not None:
        from kit.trace.perfetto import write_perfetto

        out["trace"] = write_perfetto(res.timeline(), args.trace,
                                      res.critical_path(out["breakdown"]["rank"], True).op)
    return out


def band_text(band) -> str:
    """" (band lo-hi ms)", or nothing for a predictor without a band (lo == hi)."""
    return f" (band {band[0]:.2f}-{band[1]:.2f} ms)" if band[1] > band[0] else ""


def text_parallel(r) -> str:
    from kit.parallel.layout import stage_of

    lay, m = r["layout"], r["model"]
    b = r["breakdown"]
    lines = [f"{m['name']} ({m['params'] / 1e9:.2f}B params) on {r['system']}: dp {lay['dp']} x tp "
             f"{lay['tp']} x pp {lay['pp']} = {lay['world_size']} GPUs"
             # ep splits the dp ranks, it is no factor of the product ("x ep 2 = 2 GPUs" at dp 2)
             + (f" (ep {lay['ep']} within dp)" if lay["ep"] > 1 else "")
             + f", {lay['schedule']}, micro-batch {lay['micro_batch']}, "
             f"global batch {lay['global_batch']} ({lay['micro_batches']} micro-batches), {lay['dtype']}"
             + (f" with {lay['grad_dtype']} gradients" if lay["grad_dtype"] != lay["dtype"] else ""),
             *(["  note: kernels from the analytic Megatron layer, which "
                + ("--sequence-parallel" if lay["sequence_parallel"] else "--ep")
                + " needs; without it this model is costed on its captured graph, other kernels"
                " (the two can differ widely: llama3-8b"
                + ("" if m["name"] == "llama3-8b" else ", not this model,")
                + " in bf16 at tp 8 on a dgx-h100 takes about 1.5x as long on its graph, HF's"
                " eager kernels, as on this layer): compare"
                " runs given --kernels analytic"] if r.get("kernels_switched") else []),
             f"  iteration {r['iteration_ms']:.2f} ms" + band_text(r["band_ms"])
             + (f", {r['tokens_per_s']:.0f} tokens/s" if r["tokens_per_s"] else "")
             + (f", MFU {100 * r['mfu']:.1f}%" if r["mfu"] else ""),
             "  critical path: " + ", ".join(f"{k} {b[k]:.2f} ms" for k in
                                             ("compute", "communication", "cpu", "wait") if b[k] > 0)
             + ("" if not b["communication"] else " (communication: " + ", ".join(
                 f"{k} {v:.2f} ms" for k, v in r.get("communication_by_group", {}).items() if v > 0) + ")"),
             f"  ideal pipeline bubble {100 * r['ideal_bubble_fraction']:.1f}% of the iteration; "
             f"stage {stage_of(r['rank_breakdown']['rank'], lay['dp'], lay['tp'])} (rank {r['rank_breakdown']['rank']}) "
             f"waits {r['rank_breakdown']['wait']:.2f} ms",
             "  memory per rank (GiB):  stage  weights  grads  optimizer  activations  total"]
    for s in r["memory_per_rank"]:
        flag = "" if s.get("fits", True) else "  > GPU memory!"
        lines.append(f"  {'':22}{s['stage']:>5}  {s['weights_gib']:7.2f}  {s['grads_gib']:5.2f}  "
                     f"{s['optimizer_gib']:9.2f}  {s['activations_gib']:11.2f}  {s['total_gib']:5.2f}{flag}")
    per = r["state_bytes_per_param"]
    # the optimizer column as Megatron-LM's distributed-optimizer docs count it (20 B a parameter
    # for fp16 with fp16 gradients): the fp32 copy of 16-bit gradients is optimizer state
    state = "master weights, momentum, variance" if lay["dtype"] != "fp32" else "momentum, variance"
    if lay["grad_dtype"] != "fp32":
        state += ", an fp32 copy of the gradients"
    lines.append(f"  (Megatron-LM's memory: {lay['dtype']} weights, {lay['grad_dtype']} gradients and fp32 Adam "
                 f"state ({state}), {per['weights']} + {per['grads']} + {per['optimizer']} "
                 "bytes a parameter, before ZeRO's sharding (ZeRO-1: Megatron's distributed optimizer); "
                 "activations by Korthikanti et al.'s count for its fused kernels, less than the "
                 "eager graph's saved tensors `kit predict --gpu` counts)")
    lines.append(f"  simulated {r['simulated_ranks']} representative ranks, {r['ops']} ops, "
                 f"{r['seconds']:.2f} s; kernels from the {r['kernels_from']}")
    if r.get("kernel_costing"):
        lines.append(f"  kernel times: {r['kernel_costing']['note']}")
    if r.get("trace"):
        lines.append(f"  trace written to {r['trace']} (open in ui.perfetto.dev)")
    return "\n".join(lines)


def register(sub) -> None:
    """No command of its own: `kit predict` uses add_parallel_args / run_parallel."""
