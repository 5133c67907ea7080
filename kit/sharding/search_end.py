"""How a plan search ended, in words: the one wording of `kit shard`'s text and the sharding
panel's summary (the panel's had said "this machine is busy" of a cluster's search that its size
had cut short, after the CLI had learned better)."""
from __future__ import annotations

from kit.sharding.search import PLANS_PER_S, PLANS_PER_S_MAX_WORLD


def search_end(r, budget: str, max_plans: str | None = None) -> str:
    """How plan_sharding's result r's search ended. budget: the time budget's name to the reader
    (`--budget-s`, a panel's `budget_s`); max_plans: the plan count's, None where the reader has
    none to give (the panel), so that no advice names it."""
    by, secs = r["search_stopped_by"], f"{budget} {r['time_budget_s']:g}"
    count = max_plans or "max_plans"  # given only through a max_plans option
    if by == "finished":
        return "finished"
    if by == "plan budget":
        if r.get("max_plans_given"):
            return (f"not finished: stopped at the {r['max_plans']:,} plans of {count} (the same "
                    f"inputs give the same plan); a larger {count} searches further")
        more = f"{budget} or {max_plans}" if max_plans else budget
        return (f"not finished: stopped at its budget of {r['max_plans']:,} plans ({secs}; the same "
                f"inputs give the same plan); a larger {more} searches further")
    need_s = r["max_plans"] / PLANS_PER_S
    if r.get("max_plans_given") and need_s > r["time_budget_s"]:
        # a plan count past what its time budget prices on any machine: 100,000,000 plans under
        # --budget-s 0.5 had blamed "this machine is slow or busy", where they take ~667 s
        return (f"not finished: stopped by the wall clock at {secs} s before the {r['max_plans']:,} "
                f"plans of {count}, so another run may give another plan; they take about "
                f"{need_s:.3g} s at {PLANS_PER_S:,} plans a second: give {budget} at least that, "
                f"or fewer {count}")
    size = r.get("cost_model_size")
    if size and r["world_size"] > PLANS_PER_S_MAX_WORLD:  # the plans' size, not the machine's load
        other = f", or {max_plans} and a {budget} that covers it" if max_plans else ""
        return (f"not finished: stopped by the wall clock at {secs} s before its {r['max_plans']:,} "
                f"plans, so another run may give another plan; a plan of {r['world_size']:,} GPUs "
                f"is {size['features']:,} features, slower to price than the {PLANS_PER_S:,} a "
                f"second {budget} stands for (measured up to {PLANS_PER_S_MAX_WORLD} GPUs): give "
                f"a larger {budget}{other}")
    return (f"not finished: stopped by the wall clock at {secs} s before its {r['max_plans']:,} "
            f"plans, so another run may give another plan; this machine is slow or busy, give a larger {budget}")
