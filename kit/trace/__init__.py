"""Traces: read Kineto (PyTorch profiler) traces into execution graphs with measured durations,
replay them, transfer them to another GPU or system, and export timelines to Perfetto."""
from kit.trace.build import TraceGraph, build_graph
from kit.trace.kineto import RankTrace, load_kineto, read_json_text
from kit.trace.replay import Replay, replay

__all__ = ["RankTrace", "Replay", "TraceGraph", "build_graph", "load_kineto", "read_json_text",
           "replay"]
