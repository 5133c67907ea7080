"""Capture a few layers, then repeat the middle one: identical layers give identical ops.

A model of L identical layers is captured with 3 (layers 0, 1, 2); layer 1, which has a layer on
each side, is the template. The full graph keeps layers 0 and 1, inserts L-3 copies of layer 1
as layers 2..L-2, and renames layer 2 to L-1, in every phase (the backward pass runs the layers
in reverse, so copies go where the layers' own runs are). A dependency keeps its layer offset:
a node of layer m that read a node of layer m+δ reads the node at the same position of layer
m+δ's run. The result is the graph a full capture gives (tests compare the two), at the cost
of capturing three layers.

A stack that opens with layers of its own (DeepSeek's dense layers before its MoE ones, a
Qwen-MoE config's leading mlp_only_layers) keeps those `first` layers as they are and repeats one
of the alike layers after them; leading_layers reads `first` off the built model.

Returns None when the captured layers are not interchangeable (runs of different lengths or
interleaved): the caller then captures the full model.
"""
from __future__ import annotations

import re
from bisect import bisect_left

from kit.workload.graph import Node, OpGraph, Region, new_tensor_id

_FIRST_NUM = re.compile(r"(?:^|\.)(\d+)(?=\.|$)")


def _rename(path: str, layer: int) -> str:
    m = _FIRST_NUM.search(path)
    if not m:
        return path
    return path[:m.start(1)] + str(layer) + path[m.end(1):]


def leading_layers(model, n_layers: int) -> int | None:
    """How many layers a model's stack (its first ModuleList of n_layers) opens with before the
    rest are built alike (the same submodule types and parameter shapes); None without such a
    stack. n_layers - 1 when no two closing layers are alike."""
    from torch import nn

    stack = next((m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) == n_layers),
                 None)
    if stack is None:
        return None
    shape = [tuple((name, type(m).__name__, tuple(tuple(p.shape) for p in m.parameters(recurse=False)))
                   for name, m in layer.named_modules()) for layer in stack]
    first = n_layers - 1
    while first > 0 and shape[first - 1] == shape[-1]:
        first -= 1
    return first


def expand_layers(small: OpGraph, n_layers: int, first: int = 0) -> OpGraph | None:
    """The graph of n_layers from `small`, captured with first + 3 layers: layers 0..first-1 are
    kept as they are (a stack that opens with layers of their own, as DeepSeek's dense ones),
    layers first..first+2 are alike and first+1 is the template (the module doc)."""
    alike = (first, first + 1, first + 2)
    if first < 0 or n_layers < first + 3 or small.layers() != list(range(first + 3)):
        return None
    if n_layers == first + 3:
        return small
    runs: dict[tuple[str, int], list[int]] = {}
    for n in small.nodes:
        if n.layer is not None:
            runs.setdefault((n.phase, n.layer), []).append(n.id)
    for (phase, layer), ids in runs.items():
        if ids[-1] - ids[0] + 1 != len(ids):
            return None  # interleaved with other nodes: not a clean run
    for phase in {p for p, _ in runs}:
        lengths = {len(runs.get((phase, layer), ())) for layer in alike}
        if len(lengths) != 1:
            return None
    pos = {i: k for ids in runs.values() for k, i in enumerate(ids)}
    last, template = n_layers - 1, first + 1
    new_layer_of = {**{i: i for i in range(first + 1)}, first + 2: last}

    # output order: per node of the small graph, and the template run of each phase expanded
    order: list[tuple[int, int]] = []  # (small id, new layer)
    copies = list(range(first + 2, last))
    for n in small.nodes:
        if n.layer is None:
            order.append((n.id, -1))
            continue
        run = runs[(n.phase, n.layer)]
        if n.layer == template and n.id == run[0]:
            # the backward pass meets layers high to low: copies before the template run
            seq = copies[::-1] + [template] if n.phase != "fwd" else [template] + copies
            for layer in seq:
                order.extend((i, layer) for i in run)
        elif n.layer != template:
            order.append((n.id, new_layer_of[n.layer]))
    new_id = {key: k for k, key in enumerate(order)}

    def rep(small_id: int, layer: int) -> int | None:
        """New id of the node at small_id's position in `layer`'s run."""
        d = small.nodes[small_id]
        if d.layer is None:
            return new_id[(small_id, -1)]
        if layer < 0 or layer > last:
            return None
        src = layer if layer <= first else first + 2 if layer == last else template
        ids = runs.get((d.phase, src))
        if not ids:
            return None
        return new_id.get((ids[pos[small_id]], layer))

    def moved(d: int, n: Node, layer: int) -> int | None:
        """New id of the node that small node d, read by n, becomes for n's copy in `layer`."""
        dl = small.nodes[d].layer
        if dl is None or n.layer is None:
            return new_id.get((d, -1)) if dl is None else rep(d, new_layer_of.get(dl, dl))
        return rep(d, layer + (dl - n.layer))

    # tensor records (Node.reads/writes): a copy of the template writes tensors of its own
    # (fresh ids); a read goes to the tensor at the same place among its moved producer's writes
    writers: dict[int, list[int]] = {}  # tensor id -> small ids writing it, ascending
    for n in small.nodes:
        for w in n.writes:
            ids = writers.setdefault(w.tensor, [])
            if not ids or ids[-1] != n.id:
                ids.append(n.id)
    interned: dict = {}

    def region(r: Region, tid: int) -> Region:
        if tid == r.tensor:
            return r
        r = r._replace(tensor=tid)
        return interned.setdefault(r, r)

    copied = any(small.nodes[sid].layer == template and layer != template for sid, layer in order)
    # a tensor the step returns (a layer's grown dynamic KV cache) is returned by every copy
    returned = set(small.meta.get("output_tensors", ()))
    copied_returned: set[int] = set()
    writes: list[tuple[Region, ...]] = []
    for sid, layer in order:
        n = small.nodes[sid]
        if copied and n.layer == template and layer != template:
            writes.append(tuple(region(w, new_tensor_id() * (1 if w.tensor > 0 else -1))
                                for w in n.writes))
            copied_returned.update(c.tensor for w, c in zip(n.writes, writes[-1]) if w.tensor in returned)
        else:
            writes.append(n.writes)

    def read(r: Region, sid: int, n: Node, layer: int) -> Region:
        ids = writers.get(r.tensor)
        i = bisect_left(ids, sid) - 1 if ids else -1
        if i < 0:  # no node wrote it (a parameter, an input): the same tensor in every copy
            return r
        d = small.nodes[ids[i]]
        target = moved(d.id, n, layer)
        if target is None:
            return r
        j = next(j for j, w in enumerate(d.writes) if w.tensor == r.tensor)
        return region(r, writes[target][j].tensor)

    nodes = []
    for k, (sid, layer) in enumerate(order):
        n = small.nodes[sid]
        deps = [t for t in (moved(d, n, layer) for d in n.deps) if t is not None]
        lay = None if layer < 0 else layer
        reads = tuple(read(r, sid, n, layer) for r in n.reads) if copied else n.reads
        nodes.append(Node(k, n.aten, n.op, n.op_class, n.phase, tuple(sorted(set(deps))),
                          _rename(n.module, lay) if lay is not None else n.module, lay,
                          n.out_bytes, n.shapes, n.kernels, (), reads, writes[k]))
    meta = dict(small.meta)
    if copied_returned:
        meta["output_tensors"] = sorted(returned | copied_returned)
    return OpGraph(tuple(nodes), small.model, meta)
