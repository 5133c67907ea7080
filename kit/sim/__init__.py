"""Simulation of multi-rank execution graphs: per-rank CPU threads and GPU streams, collectives
that synchronise ranks, a timeline of intervals and the critical path with its causes.

    g = ExecGraph(); g.gpu(0, "compute", 1.0, "gemm", launch_ms=0.005); ...
    res = simulate(g); res.timeline(); res.critical_path(); res.breakdown()
"""
from kit.sim.critical import CAUSES, breakdown, critical_path
from kit.sim.engine import SimResult, simulate
from kit.sim.graph import CPU_KINDS, GPU_KINDS, KINDS, ExecGraph

__all__ = ["CAUSES", "CPU_KINDS", "GPU_KINDS", "KINDS", "ExecGraph", "SimResult", "breakdown",
           "critical_path", "simulate"]
