"""benchmarks/hf_fidelity.py: its per-class tally follows the graph, its family configs build in
the zoo, and without transformers (as in CI) it says what it needs instead of failing."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_modules import load_benchmark

from kit.workload import zoo

ROOT = Path(__file__).resolve().parents[1]


def test_every_family_config_builds_and_the_tally_adds_up_the_graph():
    bench = load_benchmark("hf_fidelity")
    for family, cfg in {**bench.FAMILIES, **bench.HF4_FAMILIES}.items():
        g = zoo.graph_for({"model_type": family, **cfg}, batch=2, seq=16, mode="inference",
                          dtype="bf16", disk=False)
        tally = bench.by_class(g)
        kernels = sum(n.kernels for n in g if n.op is not None)
        assert sum(v[0] for v in tally.values()) == kernels, family
        gemm = sum(n.op.flops for n in g if n.op_class == "gemm") / 1e9
        assert tally["gemm"][1] == pytest.approx(gemm, abs=1e-6), family  # rounded to 1e-6 GFLOP


@pytest.mark.skipif(importlib.util.find_spec("transformers") is not None,
                    reason="transformers is installed: the benchmark would run for real")
def test_without_transformers_it_says_what_it_needs():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hf_fidelity.py"), "--families", "llama"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "needs transformers" in r.stderr and "Traceback" not in r.stderr
