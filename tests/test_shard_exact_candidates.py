"""plan_sharding re-prices the search's best distinct plans exactly (POOL_EXACT of the pool
beside the best): descents from many starts mostly end on the same few plans, and the pool's
first six had been one plan six times (10 synthetic tables on dgx1-v100), so the exact
re-pricing, which the plan is chosen by, had compared one plan with itself."""

from kit.sharding import ShardingModel, planner, synthetic_tables


def test_the_candidates_re_priced_are_distinct_plans_of_the_pool(monkeypatch):
    priced = []
    real = ShardingModel.exact_cost

    def exact_cost(self, choice):
        priced.append(tuple(int(x) for x in choice))
        return real(self, choice)

    found = []
    real_search = planner.local_search

    def search(*a, **kw):
        found.append(real_search(*a, **kw))
        return found[-1]

    monkeypatch.setattr(ShardingModel, "exact_cost", exact_cost)
    monkeypatch.setattr(planner, "local_search", search)
    planner.plan_sharding(synthetic_tables(10, seed=1), "dgx1-v100", batch=1024, max_plans=30_000)
    best, _, _, pool = found[0]
    distinct = list(dict.fromkeys([tuple(int(x) for x in best)] + [tuple(int(x) for x in c) for _, c in pool]))
    want = distinct[:planner.POOL_EXACT + 1]
    assert len(want) > 1  # the case has more than one plan to compare
    searched = priced[3:3 + len(want)]  # after the three greedy baselines
    assert searched == want

