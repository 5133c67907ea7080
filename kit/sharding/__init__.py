"""Embedding-table sharding planner: plans, their cost on a System, and the search (see model.py)."""
from kit.sharding.model import ShardingModel
from kit.sharding.plans import KINDS, Option, options_for
from kit.sharding.planner import plan_sharding
from kit.sharding.search import baselines, exhaustive, greedy, local_search
from kit.sharding.tables import as_tables, read_tables, synthetic_tables

__all__ = ["KINDS", "as_tables", "Option", "ShardingModel", "baselines", "exhaustive", "greedy", "local_search",
           "options_for", "plan_sharding", "read_tables",
           "synthetic_tables"]
