"""`kit collect`: benchmark ops on this machine's CPU or GPU into a schema CSV (resumable)."""
from pathlib import Path

from kit.cli import add_command, positive_int
from kit.cli.outputs import nonempty
from kit.errors import KitError


def run(args):
    from kit.cli.outputs import output_path
    from kit.data.collect import collect
    from kit.data.shapes import resolve_shapes
    from kit.hardware import load_gpu_file

    output_path(args.out, "--out", [args.shapes if Path(args.shapes).is_file() else None, args.gpu_file])
    if args.gpu_file:
        load_gpu_file(args.gpu_file)
    return collect(args.ops, resolve_shapes(args.shapes), args.out, device=args.device,
                   dtype=args.dtype, resume=args.resume, warmup=args.warmup, repeats=args.repeats,
                   profile=not args.no_profile, cooldown_ms=args.cooldown_ms,
                   progress=args.progress, threads=args.threads, l2_flush=not args.no_l2_flush,
                   warmup_ms=args.warmup_ms, bias=not args.no_bias, time_limit_s=args.time_limit,
                   force=args.force, retry_failed=args.retry_failed)


def text(r):
    twice = f", {r['duplicates']} repeated in the plan" if r.get("duplicates") else ""
    lines = [f"{r['measured']} measured, {r['skipped']} already in {r['out']}{twice} "
             f"({r['rows_in_file']} rows now) on {r['device']} ({r['dtype']})"]
    if r.get("died_earlier"):
        d = r["died_earlier"]
        lines.append(f"  the last run died while measuring {d['op']} {d['shape']} ({d['phase']}): "
                     f"recorded in {r.get('failures_file')}")
    skipped = r.get("skipped_failed") or []
    if skipped:
        lines.append(f"  {len(skipped)} skipped: an earlier run could not get past "
                     f"{'it' if len(skipped) == 1 else 'them'} (see {r.get('failures_file')}; "
                     "--retry-failed measures them again):")
        lines += [f"    {f['op']} {f['shape']}: {f['error']}" for f in skipped[:10]]
        if len(skipped) > 10:
            lines.append(f"    ... and {len(skipped) - 10} more")
    if r.get("stopped"):
        lines.append(f"  stopped early: {r['stopped']}")
    if r["ops_without_shapes"]:
        lines.append(f"  no shapes of their kind for: {', '.join(r['ops_without_shapes'])}")
    for f in r["failed"][:10]:
        lines.append(f"  failed: {f['op']} {f['shape']}: {f['error']}")
    if len(r["failed"]) > 10:
        lines.append(f"  ... and {len(r['failed']) - 10} more failures (see --json or "
                     f"{r.get('failures_file')})")
    return "\n".join(lines)


def _parsed(cast, what: str):
    """An argparse type: cast(s), or one KitError naming what was expected (the collector checks
    the range itself)."""
    def parse(s):
        try:
            return cast(s)
        except ValueError:
            raise KitError(f"expected {what}, got {s!r}") from None
    return parse


_seconds, _count = _parsed(float, "a number"), _parsed(int, "a whole number")


def register(sub):
    p = add_command(sub, "collect", "benchmark ops with torch on this machine into a CSV "
                    "(one durable row per measurement; --resume carries on)", run, text)
    p.add_argument("--ops", required=True, help="op classes (gemm, elementwise, softmax, layernorm, "
                   "conv) and/or ops (bmm, linear, add, addu, ..., ln), comma-separated")
    p.add_argument("--shapes", required=True, metavar="GRID_OR_FILE",
                   help="a dims file (B;M;N;K or B;H a line, NeuSight's format) or a grid: random-bmm, "
                   "random-linear, random-vec, aligned-linear, aligned-bmm, tiny-gemm, tiny-vec "
                   "[:COUNT[:SEED]], gpt2-layers, "
                   "gpt2-large-layers, bert-large-layers, gpt3-xl-layers, opt-1.3b-layers, decode-linear, "
                   "decode-bmm")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "tf32", "fp16", "bf16"])
    p.add_argument("--out", required=True, metavar="FILE.csv")
    p.add_argument("--resume", action="store_true", help="carry on with an existing --out file, "
                   "measured with the same --repeats, L2 flush, profiler, threads and bias")
    p.add_argument("--force", action="store_true", help="with --resume: carry on with a file whose "
                   "FILE.meta.json is missing (how its rows were measured is unknown); without --resume "
                   "it is an error")
    p.add_argument("--retry-failed", action="store_true", help="with --resume: measure again the "
                   "shapes an earlier run could not get past (a CUDA error that lost the context, "
                   "or the process dying twice on it), which a resume skips and lists")
    p.add_argument("--warmup", type=_count, default=5, help="untimed calls first (default 5)")
    p.add_argument("--repeats", type=_count, default=25,
                   help="timed calls; latency = mean of the fastest fifth (default 25)")
    p.add_argument("--warmup-ms", type=_seconds, default=None,
                   help="run each op's largest shape this long before its first measurement, so "
                   "clocks leave idle (default 1000 on CUDA, 0 on CPU)")
    p.add_argument("--no-l2-flush", action="store_true", help="CUDA: do not overwrite twice the L2 "
                   "before each timed call (operands then stay in L2 between repeats)")
    p.add_argument("--no-bias", action="store_true", help="linear without a bias (Llama's "
                   "projections; the default, with one, is NeuSight's form)")
    p.add_argument("--time-limit", type=_seconds, default=None, metavar="SECONDS",
                   help="start no measurement after this many seconds (stops cleanly; --resume "
                   "carries on)")
    p.add_argument("--cooldown-ms", type=float, default=0.0, help="sleep between measurements")
    p.add_argument("--no-profile", action="store_true", help="CUDA: skip the torch.profiler pass "
                   "(no kernel names or launch dims)")
    p.add_argument("--threads", type=positive_int, help="CPU: torch threads to use")
    p.add_argument("--progress", action="store_true", default=None,
                   help="always show the progress bar (default: on a terminal, for 20+ measurements)")
    p.add_argument("--gpu-file", type=nonempty, metavar="FILE", help="load your own GPU(s) from a JSON file first")
