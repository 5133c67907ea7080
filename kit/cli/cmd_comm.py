"""`kit comm fit|predict`: collective cost on a system, from presets or fitted curves."""
import warnings

from kit.cli import add_command, positive_int
from kit.cli.outputs import nonempty
from kit.errors import KitError


def _ranks(text):
    if text is None:
        return None
    try:
        from kit.errors import comma_items

        vals = [int(v) for v in comma_items(text)]
    except ValueError:
        raise KitError(f"--ranks takes a count (8) or a comma list of ranks (0,1,8,9), got {text!r}") from None
    if not vals:
        raise KitError("--ranks is empty")
    return vals[0] if len(vals) == 1 and "," not in str(text) else vals


def _bytes(text: str) -> float:
    """--bytes: one whole, positive byte count (1e9, 64M), as --sizes reads each size."""
    from kit.comm.sizes import TooLarge, parse_sizes

    try:
        sizes = parse_sizes(text)
    except TooLarge:  # its own reason (at most 1 TiB) says more than the generic one below
        raise
    except KitError:
        sizes = []
    if len(sizes) != 1 or sizes[0] < 1:
        raise KitError(f"--bytes takes one positive whole size in bytes (1e9, 64M), got {text!r}")
    return float(sizes[0])


def _system(args):
    from kit.hardware import get_system

    return get_system(args.system, nodes=args.nodes, network=args.network)


def predict(args):
    from kit.comm import collective_table, predict_collective
    from kit.comm.sizes import parse_sizes

    system = _system(args)
    ranks = _ranks(args.ranks)
    if args.sizes and args.bytes is not None:
        raise KitError(f"--bytes {args.bytes} and --sizes {args.sizes} both given: one size or a sweep, not both")
    if args.sizes:  # sized as nccl-tests runs them (conventions.nccl_tests_sizes), with a note
        t = collective_table(args.collective, parse_sizes(args.sizes), system, ranks, args.calibration,
                             nccl_tests=True)
        r = {"system": system.key, "table": t.to_dict("records"), "notes": t.attrs["notes"]}
    elif args.bytes is None:
        raise KitError("give --bytes SIZE (e.g. 1e9 or 64M) or --sizes MIN:MAX")
    else:
        r = predict_collective(args.collective, int(_bytes(args.bytes)), system, ranks, args.calibration,
                               nccl_tests=True).to_dict()
    return {**r, **_calibration_note(args, system, ranks)}


def _calibration_note(args, system, ranks) -> dict:
    """With --calibration: whether it answered. One that has no curve for this collective, rank
    count or node span leaves the preset to answer, which a [preset] tag alone did not say: a
    note on stderr, and the reason in the JSON (calibration_unused, null when it answered)."""
    from kit.comm.predict import calibration_unused

    if args.calibration is None:
        return {}
    why = calibration_unused(args.collective, system, ranks, args.calibration)
    if why:
        warnings.warn(f"calibration {args.calibration} not used: {why}; the preset answers")
    return {"calibration_unused": why}


def predict_text(r):
    if "table" in r:
        lines = [f"{x['size_bytes']:>14.0f} B  {x['time_ms'] * 1e3:11.1f} us  {x['algorithm']:>13}  "
                 f"busbw {x['busbw_gbs']:7.1f} GB/s" for x in r["table"]]
        return "\n".join([f"{r['table'][0]['kind']} on {r['system']} ({r['table'][0]['ranks']} ranks, "
                          f"{r['table'][0]['source']})", *lines]) + _notes_text(r)
    return (f"{r['kind']} of {r['size_bytes']:.4g} B on {r['system']} ({r['ranks']} ranks, {r['nodes_spanned']} "
            f"node(s)): {r['time_ms']:.4g} ms via {r['algorithm']}; algbw {r['algbw_gbs']:.1f} GB/s, busbw "
            f"{r['busbw_gbs']:.1f} GB/s (plateau {r['plateau_busbw_gbs']:.0f}); {r['bound']}-bound, crossover at "
            f"{r['crossover_bytes'] / 2**20:.3g} MiB [{r['source']}]" + _floor_note(r) + _notes_text(r))


def _notes_text(r) -> str:
    """The result's notes (one rank; sizes outside the calibrated range), a line each."""
    return "".join(f"\n  note: {n}" for n in r.get("notes", ()))


def _floor_note(r) -> str:
    """Where the host-side floor sets a collective's time, what that floor is: a framework
    call's launch and cross-rank skew (the systems' presets fit it on a measured all-reduce
    table), more than the collective's own latency, so a reader comparing with a device-side
    benchmark knows why."""
    floor, t = r.get("floor_ms", 0.0), r.get("time_ms", 0.0)
    if floor <= r.get("latency_ms", 0.0) or abs(t - floor) > 1e-9 * floor:
        return ""  # the time is latency + bandwidth, past the floor
    fitted = ("fitted on your calibration" if str(r.get("source", "")).startswith("calibration")
              else "fitted on vTrain's measured NCCL all-reduce table (kit/hardware/systems.json)")
    return (f"\n  the time is the floor of a framework-level call, {floor * 1e3:.1f} us: launch and "
            f"cross-rank skew, {fitted}; the collective's own latency (NCCL's fixed cost and its "
            f"steps) is {r['latency_ms'] * 1e3:.1f} us")


def fit(args):
    from kit.cli.outputs import output_path
    from kit.comm import fit_table
    from kit.comm.calibration import NOISY_FIT_MAPE, check_measured_gpu, check_plausible, slow_curves
    from kit.comm.parsers import read_measurements

    output_path(args.out, "--out", [args.file])
    system = _system(args)
    table = read_measurements(args.file, fmt=args.format, kind=args.kind, ranks=args.ranks_hint)
    for line in check_measured_gpu(table, system, where=str(args.file), any_gpu=args.any_gpu):
        warnings.warn(line)  # a device the catalog does not know, or another GPU under --any-gpu
    cal = fit_table(table, system=system.key, source=str(args.file))
    big = sorted({c.ranks for c in cal.curves if c.ranks > system.world_size})
    if big:
        raise KitError(f"{args.file}: measured on {big[-1]} ranks, but {system.key} has {system.world_size} "
                       "GPUs; pass --nodes (or the system it ran on)")
    spread = sorted({c.nodes for c in cal.curves if c.nodes and c.nodes > system.nodes})
    if spread:  # its curves would be keyed to more nodes than the system has, and never used
        raise KitError(f"{args.file}: its ranks ran on {spread[-1]} hosts, but {system.key} is "
                       f"{system.nodes} node(s); pass --nodes (or the system it ran on)")
    check_plausible(cal, system)  # before saving: a later predict would trust it
    for line in slow_curves(cal, system):
        warnings.warn(line)
    for c in cal.curves:
        if c.fit_mape > NOISY_FIT_MAPE:
            warnings.warn(f"{c.kind} x{c.ranks}'s curve is off by {100 * c.fit_mape:.0f}% on its own "
                          "points: noisy measurements (a loaded host?); its predictions are as rough")
    if args.out:
        cal.save(args.out)
    return {"out": args.out, **cal.to_dict()}


def fit_text(r):
    lines = []
    for c in r["curves"]:
        lines.append(f"{c['kind']:>14} x{c['ranks']:<3d} floor {c['floor_us']:9.1f} us  plateau {c['busbw_max_gbs']:9.3f} "
                     f"GB/s  half {c['half_bytes']:11.4g} B  k {c['steepness']:.2f}  fit MAPE {100 * c['fit_mape']:.1f}% "
                     f"({c['n_points']} sizes)")
        up = c
        while up.get("upper"):  # an algorithm switch: the regime that answers from switch_bytes up
            sw, up = up["switch_bytes"], up["upper"]
            lines.append(f"{'':>14}  from {sw:11.4g} B: floor {up['floor_us']:9.1f} us  plateau "
                         f"{up['busbw_max_gbs']:9.3f} GB/s  half {up['half_bytes']:11.4g} B  k {up['steepness']:.2f}")
    return "\n".join(lines + [f"wrote {r['out']}" if r["out"] else "(not saved: pass --out FILE)"])


def _need(args):
    raise KitError("choose a subcommand: `kit comm predict ...` or `kit comm fit FILE ...`")


def register(sub):
    p = add_command(sub, "comm", "collective communication: predict a collective, fit curves to data", _need)
    sub2 = p.add_subparsers(dest="comm_command", metavar="SUBCOMMAND")
    q = add_command(sub2, "predict", "time, algorithm, algbw and busbw of one collective", predict, predict_text)
    q.add_argument("collective", help="allreduce, reducescatter, allgather, broadcast, reduce, alltoall, sendrecv")
    q.add_argument("--bytes", help="nccl-tests size in bytes (1e9, 64M), rounded down as nccl-tests "
                   "runs it (a note says so): to whole 4-byte words; an all-gather's or "
                   "reduce-scatter's to the same whole words a rank, an all-to-all's to the same "
                   "whole 16 bytes a rank")
    q.add_argument("--sizes", help="a sweep instead: MIN:MAX[:FACTOR] or a comma list")
    q.add_argument("--system", default="dgx-h100", help="preset (see `kit systems`; default dgx-h100)")
    q.add_argument("--nodes", type=int, help="number of nodes (default: the preset's)")
    q.add_argument("--network", help="inter-node network (ib-hdr, ib-ndr, roce-400g, ...; ib-ndr-sharp and "
                   "ib-hdr-sharp reduce in the switches, as NCCL does with CollNet on)")
    q.add_argument("--ranks", help="a count (8) or a comma list of global ranks (0,1,8,9); default all")
    q.add_argument("--calibration", type=nonempty, help="a curve file from `kit comm fit`")
    f = add_command(sub2, "fit", "fit bandwidth curves to nccl-tests or PARAM comms output", fit, fit_text)
    f.add_argument("file", help="benchmark output (nccl-tests text, PARAM comms log, or collect-comm file)")
    f.add_argument("--system", required=True, help="the system it was measured on (its GPU must be the one "
                   "the file's '#  Rank' device lines name)")
    f.add_argument("--nodes", type=int)
    f.add_argument("--network")
    f.add_argument("--out", help="calibration file to write (JSON)")
    f.add_argument("--format", default="auto", choices=["auto", "nccl-tests", "param"])
    f.add_argument("--kind", help="collective, when the file does not say")
    f.add_argument("--ranks", dest="ranks_hint", type=positive_int, help="rank count, when the file does not say")
    f.add_argument("--any-gpu", action="store_true", help="fit even when the file's device lines name another "
                   "GPU than --system's (e.g. a variant no preset has), with a note")
