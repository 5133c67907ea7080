"""How well the analytic unique-row and hit-rate models track a replayed stream. Prints JSON.

For each distribution (uniform, Zipf 0.6/0.9/1.05/1.2), table size and LRU capacity, a seeded
stream is sampled and replayed through an LRU cache access by access (the reference); the model
of the distribution, the Empirical model of the stream, and the reuse-histogram model of the
stream are compared with it. Also: lookup_cost calls per second.
"""
from __future__ import annotations

import json
import time

import numpy as np

from kit.embedding import Empirical, ReuseHistogram, Table, Uniform, Zipf, lookup_cost
from kit.embedding.replay import lru_hit_rate


def main():
    rng = np.random.default_rng(0)
    err = {"distribution": [], "empirical": [], "reuse_histogram": []}
    uniq = []
    cases = 0
    for dist in (Uniform(), Zipf(0.6), Zipf(0.9), Zipf(1.05), Zipf(1.2)):
        for rows in (10**4, 10**5, 10**6):
            n = 40_000
            s = dist.sample(n, rows, rng)
            uniq.append(abs(dist.expected_unique(n, rows) / np.unique(s).size - 1))
            for cap in (256, 2048, 16384):
                truth = lru_hit_rate(s, cap)
                err["distribution"].append(abs(dist.hit_rate(n, rows, cap) - truth))
                err["empirical"].append(abs(Empirical(s).hit_rate(n, rows, cap) - truth))
                err["reuse_histogram"].append(abs(ReuseHistogram.from_indices(s).hit_rate(n, rows, cap) - truth))
                cases += 1
    t = [Table(rows=int(10 ** rng.uniform(4, 8)), dim=64, pooling=20, distribution=Zipf(float(rng.uniform(0.5, 1.3))))
         for _ in range(200)]
    t0 = time.perf_counter()
    for x in t:
        lookup_cost(x, 2048, "a100-sxm4-40gb")
    calls_s = len(t) / (time.perf_counter() - t0)
    print(json.dumps({"cases": cases, "stream_length": 40_000,
                      "unique_rows_mean_abs_rel_err": float(np.mean(uniq)),
                      "unique_rows_max_abs_rel_err": float(np.max(uniq)),
                      "hit_rate_abs_err": {k: {"mean": float(np.mean(v)), "max": float(np.max(v))}
                                           for k, v in err.items()},
                      "lookup_cost_calls_per_s_cold": calls_s}, indent=2))


if __name__ == "__main__":
    main()
