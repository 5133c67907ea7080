"""The op graph: what a model runs, in order, with dependencies, before any GPU is chosen.

A graph is a flat tuple of Nodes in issue order (the order the CPU launches them). Each node
names the aten op it came from, the kit op that costs it (None for free ops: views, reshapes,
metadata), its phase ("fwd" | "bwd" | "opt"), the nodes whose outputs it reads (deps), and the
module it ran in ("transformer.h.3.attn") with that module's layer index (3) where the module
path has one.

Everything downstream (fusion, iteration time, parallel strategies, simulation) reads graphs
through this file only; no stage mutates a graph, they build new ones.
"""
from __future__ import annotations

import itertools
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterator, NamedTuple

PHASES = ("fwd", "bwd", "opt")
FREE = "free"  # op_class of nodes that launch no kernel
UNKNOWN = "unknown"  # op_class of ops the mapping does not know (costed as memory-bound)


class Region(NamedTuple):
    """The part of one tensor an op reads or writes.

    tensor   the tensor's id: one storage, from the op that made it (a fresh output) until it
             is freed; in-place writes keep it. Negative for a storage no recorded op made
             (parameters, buffers, inputs, optimizer state): those outlive the step, so an
             in-place write to one is an output. Ids never repeat within a process
             (new_tensor_id), so the producer of a read is the latest node before it whose
             writes hold the same id, whatever the graph's node ids become (renumbered, fused,
             appended)
    offset   byte offset of the region in its storage
    nbytes   bytes of the region: the view's unique elements x itemsize (an expanded view's
             stride-0 repeats count once), at most the storage's
    storage  bytes of the whole storage (a cap on the regions of one tensor counted together)
    """

    tensor: int
    offset: int
    nbytes: int
    storage: int


# from a random start: a graph pickled by one process (the zoo's disk cache) and nodes a later
# process records cannot share an id by chance
_TENSOR_IDS = itertools.count(1 + (int.from_bytes(os.urandom(5), "big") << 20))


def new_tensor_id() -> int:
    """A tensor id not given out before in this process, nor (but by a 2^-40 chance) in
    another (Region.tensor)."""
    return next(_TENSOR_IDS)


@dataclass(frozen=True)
class Node:
    """One aten op in a captured model.

    id        position in the graph (0..n-1), also the issue order
    aten      the aten overload name, e.g. "aten.mm.default"
    op        the kit op that costs it (kit.ops.Gemm, ...) or None for a free op
    op_class  "gemm" | "attention" | "elementwise" | "softmax" | "layernorm" | "rmsnorm" |
              "dropout" | "embedding" | "reduction" | "memcpy" | "unknown" | "free" | ...
    phase     "fwd" | "bwd" | "opt"
    deps      ids of the nodes whose outputs this node reads (producers), sorted
    module    dotted module path it ran in ("" for the top level)
    layer     layer index parsed from the module path (".h.3." -> 3), or None
    out_bytes bytes of the tensors it produces
    shapes    input shapes, for reports ("[8,1024,768]x[768,2304]")
    kernels   number of GPU kernels it stands for (1; >1 once fused; 0 when free)
    reads     the tensors it reads, at tensor level: Regions (see Region), one per distinct
              region; recorded by the capture for kernels (free nodes and hand-built graphs: ())
    writes    the tensors it writes, as Regions (an op with several outputs writes several)

    reads and writes are what compiled fusion (kit.workload.fusion) counts a fused kernel's
    bytes from; they take no part in a node's equality or hash.
    """

    id: int
    aten: str
    op: object | None
    op_class: str
    phase: str
    deps: tuple[int, ...] = ()
    module: str = ""
    layer: int | None = None
    out_bytes: int = 0
    shapes: str = ""
    kernels: int = 1
    members: tuple[int, ...] = field(default=())  # ids in the captured graph this node stands for
    reads: tuple[Region, ...] = field(default=(), compare=False, repr=False)
    writes: tuple[Region, ...] = field(default=(), compare=False, repr=False)

    @property
    def free(self) -> bool:
        return self.op is None

    def name(self) -> str:
        """Short aten name: "aten.mm.default" -> "mm"."""
        parts = self.aten.split(".")
        return parts[1] if len(parts) > 1 and parts[0] == "aten" else self.aten


@dataclass(frozen=True)
class OpGraph:
    """A captured model: nodes in issue order plus what the model is.

    meta keys (all optional, filled by capture): params (count), param_bytes,
    trainable_param_bytes (the parameters that get gradients and optimizer state), buffer_bytes,
    activation_bytes (peak saved-for-backward estimate), output_tensors (the Region.tensor ids of
    what the model returns, of the grown dynamic KV caches, and of what the step made and left
    in its inputs), config (dict), mode ("train" | "inference"), batch, seq, dtype,
    optimizer, n_layers, fusion ("eager" | "compiled").
    """

    nodes: tuple[Node, ...]
    model: str = "model"
    meta: dict = field(default_factory=dict, hash=False, compare=False)

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __getitem__(self, i: int) -> Node:
        return self.nodes[i]

    # -- selections ----------------------------------------------------------------------
    def kernels(self) -> list[Node]:
        """Nodes that launch GPU work (not free), in issue order."""
        return [n for n in self.nodes if not n.free]

    def by_phase(self, phase: str) -> list[Node]:
        if phase not in PHASES:
            from kit.errors import KitError

            raise KitError(f"unknown phase {phase!r}: choose one of {', '.join(PHASES)}")
        return [n for n in self.nodes if n.phase == phase]

    def phases(self) -> list[str]:
        """Phases present, in PHASES order."""
        have = {n.phase for n in self.nodes}
        return [p for p in PHASES if p in have]

    def layers(self) -> list[int]:
        """Layer indices present, sorted."""
        return sorted({n.layer for n in self.nodes if n.layer is not None})

    def by_layer(self, layer: int | None) -> list[Node]:
        """Nodes of one layer (None: the nodes outside any numbered layer: embeddings, head, loss)."""
        return [n for n in self.nodes if n.layer == layer]

    def groups(self) -> dict[tuple[str, int | None], list[Node]]:
        """Nodes grouped by (phase, layer), each group in issue order."""
        out: dict[tuple[str, int | None], list[Node]] = {}
        for n in self.nodes:
            out.setdefault((n.phase, n.layer), []).append(n)
        return out

    def unknown_ops(self) -> Counter:
        """aten names the mapping did not know, with counts (they are costed as memory-bound)."""
        return Counter(n.aten for n in self.nodes if n.op_class == UNKNOWN)

    def op_classes(self) -> Counter:
        return Counter(n.op_class for n in self.nodes if not n.free)

    def consumers(self) -> dict[int, list[int]]:
        """id -> ids of the nodes reading its output."""
        out: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for d in n.deps:
                out[d].append(n.id)
        return out

    # -- derived graphs ------------------------------------------------------------------
    def with_nodes(self, nodes, **meta) -> "OpGraph":
        """A new graph over other nodes (renumbered by the caller), same model, meta updated."""
        return OpGraph(tuple(nodes), self.model, {**self.meta, **meta})

    def only(self, *phases: str) -> "OpGraph":
        """The subgraph of some phases (deps to dropped nodes are removed), ids renumbered."""
        keep = [n for n in self.nodes if n.phase in phases]
        return renumber(self, keep)

    def without_free(self) -> "OpGraph":
        """The kernels only: free nodes dropped, and a kernel that read a free node's output
        depends on whatever that free node depended on (transitively), so no edge is lost."""
        resolved: dict[int, tuple[int, ...]] = {}
        for n in self.nodes:
            deps = set()
            for d in n.deps:
                deps.update(resolved[d] if self.nodes[d].free else (d,))
            resolved[n.id] = tuple(sorted(deps))
        keep = [replace(n, deps=resolved[n.id], members=n.members or (n.id,))
                for n in self.nodes if not n.free]
        return renumber(self, keep)

    def to_frame(self):
        """One row per node: id, aten, op_class, phase, module, layer, out_bytes, shapes,
        flops, bytes, n_deps."""
        import pandas as pd

        rows = [(n.id, n.name(), n.op_class, n.phase, n.module, n.layer, n.out_bytes, n.shapes,
                 float(n.op.flops) if n.op is not None else 0.0,
                 float(n.op.bytes) if n.op is not None else 0.0, len(n.deps), n.kernels)
                for n in self.nodes]
        return pd.DataFrame(rows, columns=["id", "aten", "op_class", "phase", "module", "layer",
                                           "out_bytes", "shapes", "flops", "bytes", "n_deps",
                                           "kernels"])

    def summary(self) -> dict:
        return {"model": self.model, "nodes": len(self.nodes), "kernels": len(self.kernels()),
                "phases": {p: len(self.by_phase(p)) for p in self.phases()},
                "layers": len(self.layers()), "unknown_ops": dict(self.unknown_ops()),
                **{k: v for k, v in self.meta.items() if k != "config"}}


def renumber(graph: OpGraph, keep: list[Node], **meta) -> OpGraph:
    """A graph of `keep` (a subset of graph's nodes, in order) with ids 0..n-1 and deps remapped
    (deps on dropped nodes vanish)."""
    new_id = {n.id: i for i, n in enumerate(keep)}
    nodes = [replace(n, id=new_id[n.id], deps=tuple(sorted({new_id[d] for d in n.deps if d in new_id})))
             for n in keep]
    return graph.with_nodes(nodes, **meta)
