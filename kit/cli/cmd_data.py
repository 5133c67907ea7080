"""`kit data summary|fetch`: the measured data the kit trains and checks on."""
from kit.cli import add_command
from kit.cli.outputs import nonempty
from kit.errors import KitError

SUMMARY_PARTS = ("train-collect", "train", "test", "amd-train-collect", "amd-train", "amd-test",
                 "labels")


def summary(args):
    from kit.data import load_labels, load_measurements, load_neusight

    if args.gpu_file:  # a CSV of a GPU the catalog lacks: its error says to give --gpu-file
        from kit.hardware import load_gpu_file

        load_gpu_file(args.gpu_file)
    if args.file:
        given = [flag for flag, on in (("--data", args.data), ("--part", args.part)) if on]
        if given:  # they name a NeuSight part; a file is summarised alone (they had been ignored)
            raise KitError(f"--file summarises one CSV; {' and '.join(given)} choose a NeuSight part "
                           "instead: give one or the other")
        frame = load_measurements(args.file)
        rows = frame.groupby(["op", "gpu"], dropna=False).size()
        part = args.file
    elif (args.part or "train-collect") == "labels":
        frame = load_labels(args.data)
        rows = frame.assign(op=frame["model"] + "-" + frame["mode"]).groupby(["op", "gpu"]).size()
        part = "labels"
    else:
        part = args.part or "train-collect"
        frame = load_neusight(part, data_dir=args.data)
        rows = frame.groupby(["op", "gpu"], dropna=False).size()
    return {"part": part, "total": int(len(frame)),
            "rows": [{"op": op, "gpu": (None if gpu != gpu else gpu), "n": int(n)}
                     for (op, gpu), n in rows.items()]}


def summary_text(r):
    ops = sorted({x["op"] for x in r["rows"]})
    gpus = sorted({x["gpu"] or "-" for x in r["rows"]})
    count = {(x["op"], x["gpu"] or "-"): x["n"] for x in r["rows"]}
    head = ["op", *gpus, "total"]
    table = [[op, *[str(count.get((op, g), "")) for g in gpus],
              str(sum(count.get((op, g), 0) for g in gpus))] for op in ops]
    table.append(["total", *[str(sum(count.get((op, g), 0) for op in ops)) for g in gpus], str(r["total"])])
    widths = [max(len(row[i]) for row in [head, *table]) for i in range(len(head))]
    lines = ["  ".join(s.rjust(w) if i else s.ljust(w) for i, (s, w) in enumerate(zip(row, widths)))
             for row in [head, *table]]
    return "\n".join([f"{r['part']}: {r['total']:,} rows", *lines])


def fetch(args):
    from kit.cli.outputs import output_path
    from kit.data.fetch import fetch_neusight

    output_path(args.dest, "--dest", folder=True)
    return fetch_neusight(dest=args.dest, force=args.force)


def fetch_text(r):
    import shlex  # a folder with a space is one word to the shell

    return (f"NeuSight @ {r['commit'][:12]}: {r['files']} files in {r['dest']} "
            f"({r['downloaded']} downloaded, {r['verified']} already there and verified)\n"
            f"use it with: export KIT_DATA={shlex.quote(r['dest'])}")


def _need_action(args):
    from kit.errors import KitError

    raise KitError("kit data: choose an action: summary, fetch (see `kit data --help`)")


def register(sub):
    p = sub.add_parser("data", help="measured kernel data: summary, fetch",
                       description="Measured kernel data: summary, fetch.")
    p.set_defaults(func=_need_action, text=None)
    data_sub = p.add_subparsers(dest="data_command", metavar="ACTION", parser_class=type(p))
    s = add_command(data_sub, "summary", "row counts per op and GPU of a NeuSight part or a CSV",
                    summary, summary_text)
    s.add_argument("--data", type=nonempty, metavar="DIR", help="NeuSight folder (default: $KIT_DATA, else "
                   "../shared/data/neusight, else the `kit data fetch` cache)")
    s.add_argument("--part", default=None, choices=SUMMARY_PARTS, help="default train-collect")
    s.add_argument("--file", type=nonempty, metavar="CSV", help="summarise a measurement CSV instead (kit or NeuSight format)")
    s.add_argument("--gpu-file", type=nonempty, metavar="FILE", help="load your own GPU(s) from a JSON file first")
    f = add_command(data_sub, "fetch", "download a public data set, pinned and hash-checked", fetch, fetch_text)
    f.add_argument("dataset", choices=["neusight"])
    f.add_argument("--dest", type=nonempty, metavar="DIR", help="where to put it (default: the kit cache)")
    f.add_argument("--force", action="store_true", help="download again even when files verify, replacing files that differ")
