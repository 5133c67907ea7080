"""Where a table's shards live. Each table picks one option; a plan is one option per table.

Kinds (TorchRec's names):
  tw    table-wise: the whole table on one rank
  cw    column-wise: D split into k equal column shards on k consecutive ranks (mod world)
  rw    row-wise: E over every rank in blocks of ceil(E/W) from rank 0 (the last shorter, any
        past it empty); each rank sums its rows' part of every bag
  twrw  table-row-wise: E split over the ranks of one node (systems of several nodes)
  dp    data-parallel: a replica on every rank, gradients all-reduced
"""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("tw", "cw", "rw", "twrw", "dp")
KIND_NAMES = {"tw": "table-wise", "cw": "column-wise", "rw": "row-wise", "twrw": "table-row-wise",
              "dp": "data-parallel"}  # in words, as above
CW_SHARDS = (2, 4)  # column-shard counts tried
MIN_CW_DIM = 16  # no column shard narrower than this (fp32: 64 B, two sectors)


@dataclass(frozen=True)
class Option:
    """One table's placement: kind and the ranks holding its shards."""

    kind: str
    ranks: tuple[int, ...]

    def label(self) -> str:
        if self.kind in ("tw",):
            return f"tw@{self.ranks[0]}"
        if self.kind == "cw":
            return f"cw{len(self.ranks)}@{self.ranks[0]}"
        if self.kind == "twrw":
            return f"twrw@{min(self.ranks)}-{max(self.ranks)}"
        return self.kind


def count_options(table, world: int, gpus_per_node: int, kinds=KINDS) -> int:
    """len(options_for(...)), without building them: the planner checks its cost model's size
    first (building dgx-a100's 2.5 million placements at --nodes 100,000 took 15-35 s, only to
    be refused as too large)."""
    nodes = world // gpus_per_node
    cw = sum(k <= world and table.dim % k == 0 and table.dim // k >= MIN_CW_DIM for k in CW_SHARDS)
    return (world * ("tw" in kinds) + world * cw * ("cw" in kinds)
            + (world > 1) * (("rw" in kinds) + ("dp" in kinds))
            + nodes * ("twrw" in kinds and nodes > 1 and gpus_per_node > 1))


def options_for(table, world: int, gpus_per_node: int, kinds=KINDS) -> list[Option]:
    """Every placement of one table on `world` ranks of `gpus_per_node`-GPU nodes."""
    out = []
    if "tw" in kinds:
        out += [Option("tw", (r,)) for r in range(world)]
    if "cw" in kinds:
        for k in CW_SHARDS:
            if k <= world and table.dim % k == 0 and table.dim // k >= MIN_CW_DIM:
                out += [Option("cw", tuple((r + i) % world for i in range(k))) for r in range(world)]
    if "rw" in kinds and world > 1:
        out.append(Option("rw", tuple(range(world))))
    nodes = world // gpus_per_node
    if "twrw" in kinds and nodes > 1 and gpus_per_node > 1:
        out += [Option("twrw", tuple(range(h * gpus_per_node, (h + 1) * gpus_per_node)))
                for h in range(nodes)]
    if "dp" in kinds and world > 1:
        out.append(Option("dp", tuple(range(world))))
    return out
