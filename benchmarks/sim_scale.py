"""Simulator scale: a 3D-parallel GPT-3 175B iteration on 1,024 GPUs (goal: under 1 s), one rank
with 100k+ ops, and 1,024 explicitly simulated ranks synchronised by collectives.

    .venv/bin/python benchmarks/sim_scale.py      # prints JSON (wall and CPU seconds)
"""
import json
import sys
import time


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def gpt3_175b():
    from kit.parallel import Layout, predict_parallel

    lay = Layout(dp=8, tp=8, pp=16, micro_batch=1, global_batch=1536, dtype="bf16",
                 sequence_parallel=True, recompute="selective")
    return predict_parallel("gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200", "dgx-h100",
                            lay, nodes=128)


def one_rank_100k():
    from kit.sim import ExecGraph, simulate

    g = ExecGraph()
    for i in range(50_000):
        g.gpu(0, "compute", 0.01, "k", launch_ms=0.005)
    return simulate(g), len(g)


def ranks_1024():
    from kit.sim import ExecGraph, simulate

    g = ExecGraph()
    for step in range(50):
        for r in range(1024):
            a = g.gpu(r, "compute", 0.1 + 0.001 * (r % 7), "fwd", launch_ms=0.01)
            g.collective(r, "comm", 0.05, "allreduce", group=("ar", step), deps=(a,))
    return simulate(g), len(g)


def main():
    gpt3_175b()  # warm the predictor caches and imports, as a sweep would
    r, wall, cpu = timed(gpt3_175b)
    (res1, n1), w1, c1 = timed(one_rank_100k)
    (res2, n2), w2, c2 = timed(ranks_1024)
    print(json.dumps({
        "benchmark": "sim_scale",
        "gpt3_175b_1024_gpus": {"wall_s": wall, "cpu_s": cpu, "goal_s": 1.0,
                                "iteration_ms": r["iteration_ms"], "mfu": r["mfu"],
                                "simulated_ranks": r["simulated_ranks"], "ops": r["ops"]},
        "one_rank_ops": {"ops": n1, "wall_s": w1, "cpu_s": c1, "makespan_ms": res1.makespan_ms},
        "explicit_1024_ranks": {"ops": n2, "wall_s": w2, "cpu_s": c2,
                                "makespan_ms": res2.makespan_ms},
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
