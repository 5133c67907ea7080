"""Workloads: capture any torch model into an op graph (kit.workload.capture), the op graph itself
(kit.workload.graph), fusion modes, the model zoo, and whole-model iteration time.

Importing this package does not import torch; kit.workload.capture and kit.workload.zoo do.
"""
from kit.workload.graph import FREE, PHASES, UNKNOWN, Node, OpGraph, renumber

__all__ = ["FREE", "PHASES", "UNKNOWN", "Node", "OpGraph", "renumber"]
