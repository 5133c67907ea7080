"""Embedding lookups that know their data: unique rows, L2 hits, DRAM vs L2 time (see cost.py)."""
from kit.embedding.cost import LookupCost, Table, l2_bw_gbs, lookup_cost
from kit.embedding.distributions import Distribution, Uniform, Zipf, parse_distribution
from kit.embedding.index_streams import Empirical, ReuseHistogram

__all__ = ["Distribution", "Empirical", "LookupCost", "ReuseHistogram", "Table", "Uniform", "Zipf",
           "l2_bw_gbs", "lookup_cost", "parse_distribution"]
