"""`kit evaluate`: score predictors against measured test rows (NeuSight's test format or the kit's)."""
from kit.cli import add_command
from kit.cli.outputs import nonempty


def run(args):
    from kit.api import evaluate_predictors
    from kit.hardware import load_gpu_file

    if args.gpu_file:  # test rows of a GPU the catalog lacks
        load_gpu_file(args.gpu_file)
    data = None
    if args.data:
        from kit.data import resolve_data_dir

        data = resolve_data_dir(args.data)
    rows = evaluate_predictors(args.test, args.predictors, weights=args.weights, data_dir=data,
                               target=args.target)
    from kit.predict import LEARNED, using_weights, weights_in_use

    if any(r["predictor"] in LEARNED for r in rows):
        with using_weights(args.weights):  # loaded already: the scores were made with them
            info = weights_in_use()
        if info is not None:  # not the shipped weights: a note (the JSON keeps its row format)
            import warnings

            from kit.cli.cmd_predict import weights_line

            warnings.warn(f"the learned predictors were scored with {weights_line(info)}")
    return rows


def text(rows):
    head = (f"{'predictor':<9} {'gpu':<16} {'op':<8} {'n':>6} {'MAPE%':>8} {'median%':>8} {'p90%':>8}"
            f" {'in band':>8}")
    lines = [head]
    for r in rows:
        cov = f"{100 * r['coverage_80']:7.1f}%" if "coverage_80" in r else f"{'-':>8}"
        lines.append(f"{r['predictor']:<9} {r['gpu']:<16} {r['op']:<8} {r['n']:>6} {r['mape']:>8.2f}"
                     f" {r['median_ape']:>8.2f} {r['p90_ape']:>8.2f} {cov}"
                     + (f"  ({r['fallback']} model: not learned)" if "fallback" in r else ""))
    return "\n".join(lines)


def register(sub):
    p = add_command(sub, "evaluate", "score predictors on measured test rows (APE in percent)",
                    run, text)
    p.add_argument("--test", type=nonempty, required=True, metavar="FILE_OR_DIR",
                   help="a test CSV or CSV.gz (NeuSight format: OPName, Latency, Device, B, M, N, K or B, H)"
                        " or a folder of them")
    p.add_argument("--data", type=nonempty, metavar="DIR",
                   help="NeuSight data folder: training measurements for habitat's reference")
    p.add_argument("--predictors", type=nonempty, metavar="LIST", help="comma-separated, default "
                   "roofline,habitat,li,mlp,tile")
    p.add_argument("--weights", type=nonempty, metavar="DIR", help="weights folder from `kit train --out` "
                   "(default: $KIT_WEIGHTS if set, else the shipped weights); the output names "
                   "weights that are not the shipped ones (a note on stderr)")
    p.add_argument("--target", choices=["latency", "kernel"], default="latency",
                   help="score against the timed call (latency_ms, default) or its summed GPU kernel "
                        "time (kernel_ms: the kit collector's rows only), which the learned predictors "
                        "meet with their in-stream time (less the dispatch floor of an isolated call)")
    p.add_argument("--gpu-file", type=nonempty, metavar="FILE", help="load your own GPU(s) from a JSON file first")
