"""Fusion modes: how many kernels a graph becomes.

* eager: one kernel per op (PyTorch eager). Free ops launch nothing.
* compiled: torch.compile-style. Chains of consecutive memory-bound ops (elementwise,
  reductions, dropout, softmax, norms) in one phase become one kernel that reads only the chain's
  external inputs and writes only the outputs something outside the chain still needs (the next
  GEMM, the backward pass, the model's output). GEMMs and attention stay library kernels.

    fused bytes = Σ external inputs (each read once) + Σ external outputs
"""
from __future__ import annotations

from kit.errors import KitError
from kit.workload.graph import Node, OpGraph, renumber
from kit.workload.kernels import Derived, copy_of

FUSIONS = ("eager", "compiled")
FUSIBLE = {"elementwise", "reduction", "dropout", "softmax", "layernorm", "rmsnorm", "batchnorm",
           "groupnorm", "pooling", "upsample"}


def apply_fusion(graph: OpGraph, fusion: str = "eager") -> OpGraph:
    """The kernel graph (free ops dropped, edges kept) under a fusion mode."""
    if fusion not in FUSIONS:
        raise KitError(f"unknown fusion {fusion!r}: choose eager or compiled")
    kernels = graph.without_free()
    if fusion == "eager":
        return kernels.with_nodes(kernels.nodes, fusion="eager")
    return fuse_chains(kernels)


def _in_bytes(n: Node) -> float:
    return max(float(n.op.bytes) - n.out_bytes, 0.0)


def _fused(group: list[Node], consumers: dict[int, list[int]], new_id: int, by_id: dict) -> Node:
    ids = {n.id for n in group}
    # each external producer's output is read once, however many members read it; reads of
    # tensors no node produced (parameters, inputs) are what a member reads beyond its deps
    producers = {d for n in group for d in n.deps if d not in ids}
    ext_in = sum(by_id[d].out_bytes for d in producers)
    ext_in += sum(max(_in_bytes(n) - sum(by_id[d].out_bytes for d in n.deps), 0.0) for n in group)
    ext_out = sum(n.out_bytes for n in group if not consumers[n.id] or
                  any(c not in ids for c in consumers[n.id]))
    dtype = getattr(group[0].op, "dtype", "fp32")
    op = Derived("fused", (copy_of(max(ext_in + ext_out, 1.0), dtype),), 1.0,
                 "+".join(n.name() for n in group))
    deps = tuple(sorted({d for n in group for d in n.deps if d not in ids}))
    names = "+".join(dict.fromkeys(n.name() for n in group))
    return Node(new_id, f"fused[{names}]", op, "fused", group[0].phase, deps, group[0].module,
                group[0].layer, int(ext_out), group[0].shapes, 1,
                tuple(m for n in group for m in (n.members or (n.id,))))


def fuse_chains(kernels: OpGraph) -> OpGraph:
    """Fuse runs of consecutive fusible kernels of one phase (see the module docstring)."""
    consumers = kernels.consumers()
    by_id = {n.id: n for n in kernels.nodes}
    out: list[Node] = []
    group: list[Node] = []
    remap: dict[int, int] = {}

    def flush():
        if not group:
            return
        if len(group) == 1:
            node = group[0]
        else:
            node = _fused(group, consumers, group[0].id, by_id)
        for n in group:
            remap[n.id] = node.id
        out.append(node)
        group.clear()

    for n in kernels.nodes:
        if n.op_class in FUSIBLE and (not group or group[0].phase == n.phase):
            group.append(n)
            continue
        flush()
        if n.op_class in FUSIBLE:
            group.append(n)
        else:
            remap[n.id] = n.id
            out.append(n)
    flush()
    # deps point at fused representatives; drop self-edges, then renumber
    fixed = []
    for n in out:
        deps = tuple(sorted({remap[d] for d in n.deps if remap.get(d, d) != n.id}))
        fixed.append(Node(n.id, n.aten, n.op, n.op_class, n.phase, deps, n.module, n.layer,
                          n.out_bytes, n.shapes, n.kernels, n.members))
    return renumber(kernels, fixed, fusion="compiled")
