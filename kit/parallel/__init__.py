"""Parallel strategies: turn a model and a layout (DP, TP with sequence parallelism, PP with
GPipe / 1F1B / interleaved schedules, EP, ZeRO-1/2/3) on a System into per-rank execution
graphs, simulate them, and report iteration time, its critical-path breakdown and memory."""
from kit.parallel.build import HostModel, build_iteration
from kit.parallel.gpt import GPTSpec, parse_model
from kit.parallel.layout import Layout
from kit.parallel.memory import memory_per_rank
from kit.parallel.predict import predict_parallel

__all__ = ["GPTSpec", "HostModel", "Layout", "build_iteration", "memory_per_rank", "parse_model",
           "predict_parallel"]
