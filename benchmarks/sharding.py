"""Sharding planner benchmark: plan-pricing speed, optimality on small cases, and the
never-worse-than-greedy guarantee. Prints JSON.

    .venv/bin/python benchmarks/sharding.py [--cases 100] [--seed 0]

1. Speed: 60 tables on 8 GPUs (dgx-a100): plans priced per second by ShardingModel.cost on
   random plans (batches of 2048), and by the local search's own neighbourhood pricing.
2. Optimality: random small cases (4 tables on a100x4-nvlink, every kind allowed: up to 14
   options a table, fewer for a table too narrow to split; at most 38,416 plans); the share
   where local_search reaches the exhaustive optimum (same model).
   And small two-node cases (3 tables on dgx-h100-roce-400g-x2, 16 GPUs; ~52 options a table).
3. Guarantee: on every case, and on 10 cases of 60 tables on 8 GPUs, the chosen plan vs the best
   greedy baseline under the vectorised model, and after exact re-pricing (plan_sharding).
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from kit.embedding import Table, Zipf  # noqa: E402
from kit.hardware.system import get_system  # noqa: E402
from kit.sharding import ShardingModel, baselines, exhaustive, local_search, plan_sharding  # noqa: E402


def random_tables(rng, n):
    return [Table(rows=int(10 ** rng.uniform(3, 7.5)), dim=int(rng.choice([16, 32, 64, 128, 256])),
                  pooling=float(rng.integers(1, 80)), name=f"t{i}",
                  distribution=Zipf(float(rng.uniform(0.3, 1.3)))) for i in range(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--big-cases", type=int, default=10)
    ap.add_argument("--multi-cases", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    out = {}

    big = get_system("dgx-a100")
    t0 = time.perf_counter()
    m = ShardingModel(random_tables(rng, 60), big, batch=512)
    build_s = time.perf_counter() - t0
    plans = np.stack([[rng.integers(0, n) for n in m.n_options] for _ in range(40_000)])
    m.cost(plans[:2048])  # warm
    t0 = time.perf_counter()
    m.cost(plans)
    dt = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, _, n_eval, _ = local_search(m, time_budget_s=3.0)
    ls_s = time.perf_counter() - t0
    out["speed"] = {"tables": 60, "gpus": 8, "options_per_table_max": int(m.n_options.max()),
                    "model_build_s": build_s, "random_plans_per_s": len(plans) / dt,
                    "search_plans_priced": n_eval, "search_s": ls_s,
                    "search_plans_per_s": n_eval / ls_s,
                    "a2a_surrogate_max_rel_err": m.a2a_fit_rel_err}

    small = get_system("a100x4-nvlink")
    hits, worse, gaps, n_plans = 0, 0, [], None
    for _ in range(args.cases):
        mm = ShardingModel(random_tables(rng, 4), small, batch=int(rng.choice([128, 512, 2048])))
        best, cost, _, _ = local_search(mm, time_budget_s=5.0, seed=int(rng.integers(1 << 30)))
        _, opt, n_plans = exhaustive(mm)
        base = min(float(mm.cost(c[None])[0]) for c in baselines(mm).values())
        hits += cost <= opt * (1 + 1e-6)
        worse += cost > base + 1e-9
        gaps.append(cost / opt - 1)
    out["small_cases"] = {"cases": args.cases, "tables": 4, "gpus": 4, "plans_each": n_plans,
                          "found_optimum_pct": 100 * hits / args.cases,
                          "worst_gap_pct": 100 * max(gaps), "worse_than_best_greedy": worse}

    two = get_system("dgx-h100-roce-400g-x2")  # 2 nodes x 8: table-row-wise comes into play
    hits2, worse2, kinds2 = 0, 0, set()
    for _ in range(args.multi_cases):
        mm = ShardingModel(random_tables(rng, 3), two, batch=int(rng.choice([128, 512, 2048])))
        best, cost, _, _ = local_search(mm, time_budget_s=5.0, seed=int(rng.integers(1 << 30)))
        oc, opt, n2 = exhaustive(mm)
        base = min(float(mm.cost(c[None])[0]) for c in baselines(mm).values())
        hits2 += cost <= opt * (1 + 1e-6)
        worse2 += cost > base + 1e-9
        kinds2 |= {mm.options[t][o].kind for t, o in enumerate(oc)}
    out["small_cases_two_nodes"] = {"cases": args.multi_cases, "tables": 3, "gpus": 16, "plans_each": n2,
                                    "found_optimum_pct": 100 * hits2 / max(1, args.multi_cases),
                                    "worse_than_best_greedy": worse2, "kinds_in_optima": sorted(kinds2)}

    wins, worse_model, worse_exact = [], 0, 0
    for _ in range(args.big_cases):
        tabs = random_tables(rng, 60)
        r = plan_sharding(tabs, big, batch=512, time_budget_s=2.0)
        mm = ShardingModel(tabs, big, batch=512)
        best, cost, _, _ = local_search(mm, time_budget_s=2.0)
        base = min(float(mm.cost(c[None])[0]) for c in baselines(mm).values())
        worse_model += cost > base + 1e-9
        feasible = [v for v in r["baselines"].values() if v is not None]  # None: no plan fit
        worse_exact += bool(feasible) and r["cost_ms"] > min(feasible) + 1e-9
        if r["improvement_vs_best_baseline"] is not None:
            wins.append(r["improvement_vs_best_baseline"])
    out["large_cases"] = {"cases": args.big_cases, "tables": 60, "gpus": 8,
                          "worse_than_best_greedy_model": worse_model,
                          "worse_than_best_greedy_exact": worse_exact,
                          "mean_improvement_vs_best_greedy_pct": 100 * float(np.mean(wins)) if wins else None,
                          "min_improvement_vs_best_greedy_pct": 100 * float(np.min(wins)) if wins else None}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
