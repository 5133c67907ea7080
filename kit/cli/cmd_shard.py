"""`kit shard --tables FILE.csv --system NAME`: plan where embedding tables live on a multi-GPU system."""
import argparse

from kit.cli import add_command, positive_float, positive_int
from kit.cli.outputs import nonempty


def run(args):
    from kit.api import shard_tables

    return shard_tables(args.tables, args.system, batch=args.batch, optimizer=args.optimizer,
                        memory_gib=args.memory_gib, nodes=args.nodes, time_budget_s=args.budget_s,
                        kinds=args.kinds, max_plans=args.max_plans)


def max_plans(s: str) -> int:
    """argparse type: a plan count from 1 to kit.sharding.search.MAX_PLANS_LIMIT."""
    from kit.sharding.search import MAX_PLANS_LIMIT

    n = positive_int(s)
    if n > MAX_PLANS_LIMIT:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_PLANS_LIMIT:,} plans, got {s!r}")
    return n


def search_end(r, budget: str) -> str:
    """How the plan search ended, in words (`budget`: the time budget's name to the reader)."""
    from kit.sharding.search_end import search_end as ended

    return ended(r, budget, "--max-plans")


def setup_note(r, budget: str) -> str | None:
    """Where building the cost model alone took longer than the search's budget: how long, and why."""
    if not r.get("setup_over_budget"):
        return None
    size = r["cost_model_size"]
    return (f"building the cost model and pricing the baselines took {r['setup_s']:.3g} s before "
            f"the search's {budget} {r['time_budget_s']:g}, which does not cap it: "
            f"{size['placements']:,} placements x {size['features']:,} features over "
            f"{r['world_size']:,} GPUs (it grows as the GPUs squared); plan fewer nodes (--nodes) "
            "or kinds (--kinds: tw and cw have a placement per GPU) for a shorter one")


def text(r) -> str:
    lines = [f"sharding {len(r['plan'])} tables on {r['system']} ({r['world_size']}x {r['gpu']}), "
             f"batch {r['batch_per_rank']} per rank, {r['optimizer']}",
             f"  iteration (embeddings) {r['cost_ms']:.3f} ms   imbalance {r['imbalance']:.3f} "
             f"(slowest rank / mean)",
             f"  all-to-all: input {r['parts']['input_alltoall_ms']:.3f} ms, output "
             f"{r['parts']['output_alltoall_ms']:.3f} ms, grad {r['parts']['grad_alltoall_ms']:.3f} ms;"
             f" all-reduce {r['parts']['allreduce_ms']:.3f} ms",
             "  per rank (lookup fwd+bwd ms, of it the fused kernels' fixed cost; memory GiB):"]
    for rank, (ms, fixed, mem) in enumerate(zip(r["per_rank_ms"], r["parts"]["fixed_ms"],
                                                r["parts"]["memory_bytes"])):
        bar = "#" * int(round(30 * ms / max(max(r["per_rank_ms"]), 1e-12)))
        lines.append(f"    rank {rank:>3}  {ms:8.3f} ms  (fixed {fixed:.3f})  {mem / 2**30:7.2f} GiB  {bar}")
    lines.append("  baselines:")
    for name, ms in r["baselines"].items():
        lines.append(f"    {name:<30} " + (f"{ms:8.3f} ms" if ms is not None else "no plan fits the cap"))
    vs = (f"{100 * r['improvement_vs_best_baseline']:.1f}% faster than {r['best_baseline']}"
          if r["best_baseline"] else "no baseline found a plan that fits")
    # the wall clock of the search alone (what --budget-s caps), not of the whole run: the
    # total had read as the search's ("18,079 plans priced in 1.01 s", the search 0.3 s of it)
    wall = r.get("search_wall_s", r["search_s"])
    lines.append(f"  search: {r['plans_evaluated']:,} plans priced in {wall:.2f} s of wall clock, "
                 f"{search_end(r, '--budget-s')}; {vs}")
    note = setup_note(r, "--budget-s")
    if note:
        lines.append(f"  budget: {note}")
    if "total_s" in r:
        setup = f" {r['setup_s']:.2f} s" if "setup_s" in r else ""
        lines.append(f"  run: {r['total_s']:.2f} s in all (the cost model and baselines{setup}, the search, "
                     "and the exact re-pricing of its best plans)")
    lines.append("  plan:")
    for p in r["plan"]:
        lines.append(f"    {p['table']:<24} {p['label']}")
    return "\n".join(lines)


def register(sub):
    p = add_command(sub, "shard", "plan embedding-table sharding over a multi-GPU system", run, text)
    p.add_argument("--tables", type=nonempty, required=True, metavar="FILE.csv",
                   help="CSV with columns name, rows, dim, pooling [, zipf_alpha, dtype]")
    p.add_argument("--system", required=True, help="system preset (see `kit systems`)")
    p.add_argument("--nodes", type=positive_int, default=None, help="number of nodes of the preset")
    p.add_argument("--batch", type=positive_int, default=512, help="samples per rank (default 512)")
    p.add_argument("--optimizer", default="rowwise_adagrad", choices=["sgd", "rowwise_adagrad"])
    p.add_argument("--memory-gib", type=positive_float, default=None,
                   help="memory cap per GPU for tables + optimizer state (default 90%% of what the GPU can use: "
                        "its memory less in-band ECC, 15 of a T4's 16 GiB)")
    p.add_argument("--kinds", default=None, help="allowed kinds, comma-separated: tw,cw,rw,twrw,dp")
    p.add_argument("--budget-s", type=positive_float, default=2.0,
                   help="time budget of the plan search (s): it may price a set number of plans "
                        "a second of it (kit.sharding.search.PLANS_PER_S: a count, so that a busy "
                        "machine gives the same plan), and stops at this much wall clock in any "
                        "case (then it says so). Building the cost model before the search (it "
                        "grows as the GPUs squared: seconds at 512 GPUs) and the exact re-pricing of "
                        "its best plans after it come on top: the output's run: line gives the "
                        "whole time, and a budget: line says where the setup alone took longer")
    p.add_argument("--max-plans", type=max_plans, default=None, metavar="N",
                   help="plans the search may price, in place of --budget-s x PLANS_PER_S (the "
                        "same N gives the same plan on any machine); --budget-s still caps its "
                        "wall clock")
