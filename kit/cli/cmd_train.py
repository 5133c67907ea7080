"""`kit train`: fit the learned predictors (tile-MLP, tile chooser, Li, direct MLP) on measured data."""
from kit.cli import add_command
from kit.cli.outputs import nonempty


def run(args):
    import shlex

    from kit.api import train_predictors
    from kit.cli.outputs import output_path
    from kit.predict.training import default_threads

    output_path(args.out, "--out", folder=True, package_ok=True)  # the weights check rules there
    threads = args.threads or default_threads()  # named in the command, so a rerun matches
    from pathlib import Path

    from kit.data import resolve_data_dir

    data = str(Path(args.data).resolve()) if args.data else str(resolve_data_dir(None).resolve())  # named, so a rerun reads it
    # absolute too, for the same reason: a rerun from another folder had found no ../own.csv
    # (or another file of that name), and the manifest's extra_data named it relative to nowhere
    extra = [str(Path(e).resolve()) for e in args.extra] if args.extra else None
    command = " ".join(["kit train", "--data", shlex.quote(str(data)),
                        "--train-gpus", shlex.quote(args.train_gpus), "--out", shlex.quote(args.out),
                        "--seed", str(args.seed), "--threads", str(threads),
                        *(["--quick"] if args.quick else []),
                        *(["--no-direct"] if args.no_direct else []),
                        *(["--no-test-rows"] if args.no_test_rows else []),
                        *(["--replace-shipped"] if args.replace_shipped else []),
                        *(["--keep-suspect-rows"] if args.keep_suspect_rows else []),
                        *[a for e in (extra or []) for a in ("--extra", shlex.quote(e))]])
    return train_predictors(args.train_gpus, args.out, data_dir=args.data, seed=args.seed,
                            threads=threads, quick=args.quick, direct=not args.no_direct,
                            test_rows=not args.no_test_rows, progress=not args.json, command=command,
                            extra=extra, replace_shipped=args.replace_shipped,
                            suspect_rows=args.keep_suspect_rows)


def text(r):
    rows = ", ".join(f"{k} {v}" for k, v in r["rows"].items())
    return (f"trained on {', '.join(r['train_gpus'])} ({rows}) in {r['training_seconds']} s,"
            f" seed {r['seed']}\nweights written to {r['out']}")


def register(sub):
    from kit.cli import positive_int

    p = add_command(sub, "train", "fit the learned predictors on measured kernels", run, text)
    p.add_argument("--data", type=nonempty, metavar="DIR", help="NeuSight data folder (default: $KIT_DATA)")
    p.add_argument("--train-gpus", type=nonempty, required=True, metavar="LIST",
                   help="comma-separated GPUs to train on, e.g. P4,P100,T4,V100-PCIe-32GB,A100-PCIe-40GB")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the weights to")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads (default 2, or the cores if fewer; at most the cores)")
    p.add_argument("--quick", action="store_true", help="tiny settings (seconds; for checks)")
    p.add_argument("--no-direct", action="store_true", help="skip the direct-MLP baseline")
    p.add_argument("--extra", action="append", type=nonempty, metavar="PATH",
                   help="also train on your own measurements: a kit collect CSV (or .csv.gz) or a "
                        "folder of them; their FP32 rows of GEMMs, vector ops, softmax and layer "
                        "norm on a catalog GPU are used; name that GPU in --train-gpus (repeatable)")
    p.add_argument("--no-test-rows", action="store_true",
                   help="train on NeuSight's training parts alone, without the softmax and "
                        "layer-norm rows of its test part for the GPUs trained on (the model "
                        "then never meets a test shape, on any GPU)")
    p.add_argument("--keep-suspect-rows", action="store_true",
                   help="also train on the measured rows the kit leaves out as suspect "
                        "(kit.predict.training.SUSPECT_ROWS: NeuSight's P4 train-collect Linear "
                        "rows, 3-5x slower than the P4's own test rows); the manifest lists what "
                        "was left out")
    p.add_argument("--replace-shipped", action="store_true",
                   help="let --out be the kit's shipped weights folder (kit/predict/weights), "
                        "which every default prediction reads; refused without it")

