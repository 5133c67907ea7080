"""`kit collect-comm`: measure collectives through torch.distributed, write nccl-tests output."""
from kit.cli import add_command, non_negative_int, positive_int
from kit.errors import KitError, comma_names


def run(args):
    from pathlib import Path

    from kit.cli.outputs import output_path
    from kit.comm.measure import collect, rows_path

    output_path(args.out, "--out")
    if args.resume and args.force:
        raise KitError("--resume keeps the rows a stopped sweep measured and --force discards them; "
                       "pass one")
    # never clobber earlier measurements unasked; --resume over rows a stopped sweep kept writes
    # FILE anew with them all (they are the earlier measurements, not lost)
    resuming = args.resume and rows_path(Path(args.out)).exists()
    if Path(args.out).exists() and not args.force and not resuming:
        raise KitError(f"{args.out} already exists; pass --force to measure it again over it, or "
                       "choose another --out")

    kinds = comma_names(args.collectives, "--collectives")
    if not kinds:
        raise KitError("--collectives is empty; name at least one, e.g. allreduce")
    _, table = collect(backend=args.backend, ranks=args.ranks, sizes=args.sizes, kinds=kinds,
                       iters=args.iters, warmup=args.warmup, repeats=args.repeats, stat=args.stat,
                       timing=args.timing, out=args.out, resume=args.resume, force=args.force)
    return {"out": args.out, "backend": args.backend, "ranks": args.ranks, "rows": len(table),
            "wrong": int(table.wrong.sum()),
            "results": table[["kind", "size_bytes", "time_us", "algbw_gbs", "wrong"]].to_dict("records")}


def text(r):
    lines = [f"{x['kind']:>14} {x['size_bytes']:>12d} B  {x['time_us']:10.1f} us  "
             f"{x['algbw_gbs']:8.3f} GB/s" + (f"  WRONG {x['wrong']}" if x["wrong"] else "")
             for x in r["results"]]
    return "\n".join(lines + [f"wrote {r['rows']} rows ({r['backend']}, {r['ranks']} ranks) to {r['out']} "
                              "in the nccl-tests format"])


def register(sub):
    p = add_command(sub, "collect-comm", "measure collectives (NCCL on GPUs, gloo on CPU processes) "
                    "over a sweep of sizes; writes nccl-tests output", run, text)
    p.add_argument("--backend", choices=["nccl", "gloo"], default="gloo",
                   help="gloo: CPU processes (the default, on any machine); nccl: one process a GPU")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out, and discard "
                   "the rows a stopped sweep kept in FILE.rows.jsonl")
    p.add_argument("--resume", action="store_true", help="carry on with the rows a stopped sweep kept "
                   "in FILE.rows.jsonl (same settings): measure only the (collective, size) pairs "
                   "missing, then write --out with them all")
    p.add_argument("--ranks", type=positive_int, default=2, help="processes (one per GPU for nccl; default 2)")
    p.add_argument("--sizes", default="1K:1M", help="MIN:MAX[:FACTOR] or a comma list (K/M/G binary; default 1K:1M)")
    p.add_argument("--collectives", default="allreduce",
                   help="comma list of allreduce,reducescatter,allgather,broadcast,reduce,alltoall,sendrecv "
                        "(default allreduce)")
    p.add_argument("--iters", type=positive_int, default=20, help="calls per size in each round: a sample each (--timing call) or one "
                   "sample, their mean (batch) (default 20)")
    p.add_argument("--warmup", type=non_negative_int, default=5, help="untimed calls per size first (default 5)")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="rounds over all the sizes, each taking --iters samples per size (default 3)")
    p.add_argument("--stat", help="quantile each rank reports: min, median or pNN "
                   "(default p10 with gloo, median with nccl)")
    p.add_argument("--timing", choices=["call", "batch"],
                   help="sample = one call, or the mean of a batch of --iters calls as nccl-tests "
                        "(default call with gloo, batch with nccl)")
    p.add_argument("--out", required=True, help="output file (nccl-tests text format)")
