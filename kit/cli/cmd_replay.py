"""`kit replay TRACE [--on GPU_OR_SYSTEM [--from SYSTEM]] [--et ET | --no-et]`: replay a Kineto trace, per-rank
step times and the critical path; with --on, predict the same step on another GPU or system.
PyTorch execution traces next to the Kineto files (or given with --et) are linked to them."""
from kit.cli import add_command
from kit.cli.outputs import nonempty


def run(args):
    from kit.cli.outputs import output_path
    from kit.trace import replay
    from kit.trace.perfetto import write_perfetto

    output_path(args.trace_out, "--trace", [args.trace, args.et, args.gpu_file])
    if args.gpu_file:
        from kit.errors import KitError
        from kit.hardware import load_gpu_file

        if not args.on:  # without --on the kernels keep their measured times: no GPU is looked up
            raise KitError("--gpu-file goes with --on: a replay without it keeps the measured "
                           "times and looks no GPU up; add --on GPU_OR_SYSTEM, or drop --gpu-file")
        load_gpu_file(args.gpu_file)

    r = replay(args.trace, on=args.on, et=False if args.no_et else args.et, source=args.source)
    out = r.to_dict()
    if args.trace_out:
        out["perfetto"] = write_perfetto(r.timeline(), args.trace_out, r.critical_path().op)
    return out


def text(r):
    head = f"{r['trace']} ({r['gpu'] or 'no GPU'})" + (f" on {r['on']}" if r["on"] else "")
    # an error column only where some rank has one: under --on the measured step ran on the
    # trace's GPU and the prediction is for another, so there is no error to show
    errors = any(x["error_pct"] is not None for x in r["ranks"])
    error_head = f"  {'error':>7}" if errors else ""
    lines = [head, f"  {'rank':>4}  {'measured ms':>12}  {'predicted ms':>12}{error_head}"]
    for x in r["ranks"]:
        m = f"{x['measured_ms']:.3f}" if x["measured_ms"] is not None else "-"
        e = f"{x['error_pct']:+.2f}%" if x["error_pct"] is not None else ""
        lines.append(f"  {x['rank']:>4}  {m:>12}  {x['predicted_ms']:>12.3f}" + (f"  {e:>7}" if errors else ""))
    if r["on"] and not errors:
        lines.append(f"  measured on {r['gpu'] or 'the trace GPU'}, predicted on {r['on']}: no error to give")
    if r["mean_abs_error_pct"] is not None:
        lines.append(f"  mean |error| {r['mean_abs_error_pct']:.2f}%, max {r['max_abs_error_pct']:.2f}%")
    for x in r.get("execution_traces", []):
        lines.append(f"  rank {x['rank']} execution trace: {x['linked_ops']}/{x['et_ops']} ops linked "
                     f"({x['method']}), {x['gpu_ops_linked']}/{x['gpu_ops']} GPU ops, "
                     f"{x['data_edges']} data dependencies ({x['data_edges_cross_thread']} across "
                     f"threads, {x['data_edges_backwards']} against the host order)")
    if r.get("host_syncs"):
        lines.append("  host syncs: " + ", ".join(f"{k} {v}" for k, v in r["host_syncs"].items()))
    cp = r["critical_path"]
    parts = ", ".join(f"{k} {cp[k]:.3f}" for k in ("compute", "communication", "memcpy", "cpu",
                                                    "wait", "idle") if cp[k] > 0)
    lines.append(f"  critical path of rank {cp['rank']} ({cp['total_ms']:.3f} ms): {parts}")
    lines += [f"  note: {n}" for n in r["notes"]]
    if r.get("perfetto"):
        lines.append(f"  Perfetto trace: {r['perfetto']}")
    return "\n".join(lines)


def register(sub):
    p = add_command(sub, "replay", "replay a Kineto trace (file, .gz, folder or tarball) and "
                    "compare each rank's step; --on predicts it on another GPU or system", run, text)
    p.add_argument("trace", help="Kineto JSON (.json/.json.gz), a folder of per-rank files, or a tarball")
    p.add_argument("--on", metavar="GPU_OR_SYSTEM", help="transfer to this GPU or system")
    p.add_argument("--from", dest="source", type=nonempty, metavar="SYSTEM", help="the preset system "
                   "the trace was recorded on (with --on SYSTEM; it prices the measured collectives and "
                   "peer copies); by default the first single-node preset of the trace's GPU that fits, "
                   "which the output names")
    p.add_argument("--gpu-file", type=nonempty, metavar="FILE", help="load your own GPU(s) from a "
                   "JSON file first (the --on target, or the GPU the trace was recorded on)")
    et = p.add_mutually_exclusive_group()
    et.add_argument("--et", type=nonempty, metavar="ET", help="PyTorch execution trace(s) of the same run (file, "
                   "folder or tarball); by default those found with TRACE are used")
    et.add_argument("--no-et", action="store_true", help="ignore execution traces")
    p.add_argument("--trace", dest="trace_out", metavar="OUT.json", help="write the replayed timeline "
                   "as Perfetto JSON")
