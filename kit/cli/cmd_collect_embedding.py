"""`kit collect-embedding`: time embedding bags with controlled index distributions into a CSV."""
from kit.cli import add_command
from kit.errors import comma_names


def _ints(s, flag: str):
    from kit.errors import KitError

    vals = comma_names(s, flag)  # "1,,2": a value lost, a KitError
    try:
        vals = [int(x) for x in vals]
    except ValueError:
        raise KitError(f"{flag}: expected comma-separated whole numbers, got {s!r}") from None
    if not vals or min(vals) < 1:
        raise KitError(f"{flag}: expected positive whole numbers, got {s!r}")
    return vals


def _dists(s):
    """--dist's ';' list: a reuse distribution holds commas of its own (reuse:F0,F1,...)."""
    from kit.errors import KitError, comma_items

    try:
        return comma_items(s, ";")
    except ValueError:
        raise KitError(f"--dist: an empty item between semicolons in {s!r}") from None


def run(args):
    from kit.cli.outputs import output_path
    from kit.embedding.collect import collect, grid
    from kit.errors import KitError

    output_path(args.out, "--out")
    if args.optimizer and not args.backward:  # the forward pass has no optimizer step to time
        raise KitError(f"--optimizer {args.optimizer} times the backward's update: add --backward, or drop it")
    passes = ("forward", "backward") if args.backward else ("forward",)
    cfgs = grid(_ints(args.batch, "--batch"), _ints(args.rows, "--rows"), _ints(args.dim, "--dim"),
                _ints(args.pooling, "--pooling"), _dists(args.dist),
                tables=_ints(args.tables, "--tables"),
                modes=comma_names(args.mode, "--mode"), dtypes=comma_names(args.dtype, "--dtype"), passes=passes,
                optimizer=args.optimizer or "sgd")
    return collect(cfgs, args.out, device=args.device, backend=args.backend, repeats=args.repeats,
                   warmup=args.warmup, resume=args.resume, l2_flush=not args.no_l2_flush,
                   warmup_ms=args.warmup_ms)


def text(r):
    twice = f", {r['duplicates']} repeated in the grid" if r.get("duplicates") else ""
    lines = [f"{r['written']} rows written, {r['skipped']} already there{twice}, to {r['out']} "
             f"({r['backend']} on {r['device_name']})"]
    for f in r["failed"][:10]:
        lines.append(f"  failed: batch {f['batch']} rows {f['rows']} dim {f['dim']}: {f['error']}")
    return "\n".join(lines)


def register(sub):
    p = add_command(sub, "collect-embedding", "time embedding bags (torch EmbeddingBag or fbgemm "
                    "TBE) under controlled index distributions into a CSV", run, text)
    p.add_argument("--out", required=True, metavar="FILE.csv")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "fbgemm"])
    p.add_argument("--batch", default="256", help="comma-separated bags per table")
    p.add_argument("--rows", default="100000", help="comma-separated table rows")
    p.add_argument("--dim", default="64", help="comma-separated embedding dims")
    p.add_argument("--pooling", default="8", help="comma-separated rows per bag")
    p.add_argument("--tables", default="1", help="comma-separated number of equal tables")
    p.add_argument("--dist", default="uniform;zipf:1.05",
                   help="';'-separated distributions: uniform, zipf:ALPHA, reuse:F0,F1,...")
    p.add_argument("--mode", default="sum", help="sum and/or mean")
    p.add_argument("--dtype", default="fp32", help="fp32, fp16, bf16")
    p.add_argument("--backward", action="store_true", help="also time backward + optimizer step")
    p.add_argument("--optimizer", default=None, choices=["sgd", "rowwise_adagrad"],
                   help="the update --backward times (default sgd)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--warmup-ms", type=float, default=None, help="run the largest config this long "
                   "first, so that clocks leave idle (default 1000 on CUDA, 0 on CPU)")
    p.add_argument("--resume", action="store_true", help="carry on with an existing --out file")
    p.add_argument("--no-l2-flush", action="store_true", help="CUDA: do not overwrite twice the L2 "
                   "before each timed call")
