"""`kit gpus`: the GPU catalog."""
from kit.cli import add_command
from kit.cli.outputs import nonempty

COLUMNS = [("key", "{}"), ("sm_count", "{}"), ("boost_clock_mhz", "{:.0f}"), ("memory_gib", "{:g}"),
           ("usable_memory_gib", "{:g}"), ("mem_bw_gbs", "{:.0f}"), ("l2_cache_mib", "{:g}"), ("fp32_tflops", "{:.1f}"),
           ("bf16_tflops", "{:.0f}"), ("fp8_tflops", "{:.0f}")]


def run(args):
    from kit.hardware import load_gpu_file, list_gpus

    if args.add:
        load_gpu_file(args.add)
    return [g.to_dict() for g in list_gpus()]  # as a --gpu-file takes them back


def text(gpus):
    head = ["gpu", "SMs", "MHz", "GiB", "usable", "GB/s", "L2 MiB", "fp32 TF", "bf16 TF", "fp8 TF"]
    # beside the advertised size, what a program gets: less in-band ECC on GDDR cards (T4: 15)
    gpus = [{**g, "usable_memory_gib": g["memory_gib"] * (1 - g.get("ecc_reserved_fraction", 0.0))}
            for g in gpus]
    rows = [[("-" if g[c] is None else f.format(g[c])) for c, f in COLUMNS] for g in gpus]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(s.rjust(w) if i else s.ljust(w) for i, (s, w) in enumerate(zip(r, widths)))
             for r in [head, *rows]]
    return "\n".join(lines + [f"{len(gpus)} GPUs; usable: GiB less what in-band ECC keeps (1/16 on GDDR "
                               "cards with ECC on by default); `kit gpus --json` for every field and source"])


def register(sub):
    p = add_command(sub, "gpus", "list the GPU catalog", run, text)
    p.add_argument("--add", type=nonempty, metavar="FILE", help="also load your own GPU(s) from a JSON file")
