"""Traces: read Kineto (PyTorch profiler) traces, and the PyTorch execution traces (ET) of the same
run where present, into execution graphs with measured durations; replay them, transfer them to
another GPU or system, and export timelines to Perfetto.

    replay("job/")                      # Kineto files (+ ETs found there, by their schema)
    replay("kineto.tar.gz", et="et.tar.gz")
"""
from kit.trace.build import TraceGraph, build_graph
from kit.trace.et import ExecTrace, load_et, parse_et
from kit.trace.kineto import RankTrace, load_kineto, read_json_text
from kit.trace.link import EtLink, link
from kit.trace.replay import Replay, replay

__all__ = ["EtLink", "ExecTrace", "RankTrace", "Replay", "TraceGraph", "build_graph", "link",
           "load_et", "load_kineto", "parse_et", "read_json_text", "replay"]
