"""Parallel strategies: turn a model and a layout (DP, TP with sequence parallelism, PP with
GPipe / 1F1B / interleaved schedules, EP, ZeRO-1/2/3) on a System into per-rank execution
graphs, simulate them, and report iteration time, its critical-path breakdown and memory.

The per-rank kernels come from the model's op graph captured by kit.workload and sharded
Megatron-style (kit.parallel.opgraph: zoo models), or from the analytic GPT layer
(kit.parallel.gpt: inline shapes, sequence/expert parallelism, and the fast path at scale)."""
from kit.parallel.build import HostModel, build_iteration
from kit.parallel.gpt import GPTSpec, parse_model
from kit.parallel.layout import Layout
from kit.parallel.memory import memory_per_rank
from kit.parallel.opgraph import GraphSource, graph_source, shard_graph
from kit.parallel.predict import predict_parallel

__all__ = ["GPTSpec", "GraphSource", "HostModel", "Layout", "build_iteration", "graph_source",
           "memory_per_rank", "parse_model", "predict_parallel", "shard_graph"]
