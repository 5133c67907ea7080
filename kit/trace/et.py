"""Read PyTorch execution traces (ET): the operators a rank ran, with their tensor inputs/outputs.

Two layouts are read:

* schema 1.0.x: each node has flat fields: id, name, rf_id, parent, tid, inputs, input_types,
  outputs, output_types (inputs/outputs are value lists, types say which values are tensors);
* schema 1.x-chakra.*: each node has id, name, ctrl_deps (its parent), inputs/outputs as
  {"values", "shapes", "types"} and the rest in attrs [{"name", "type", "value"}].

A tensor value is [tensor_id, storage_id, offset, numel, elem_bytes, device] (no device in
schema 1.0.0); a list of
tensors (GenericList[Tensor(..)..]) holds several. An operator's data dependencies are the
operators that last wrote the tensors it reads. rf_id is the RecordFunction id, the key that
links an ET node to the Kineto event of the same op (see kit.trace.link).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from kit.errors import KitError
from kit.trace.kineto import int_or_none

_ROOT = "[pytorch|profiler|execution_"  # the process/thread root nodes, not operators
_RANK = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.I)
_TRAILING = re.compile(r"[-_](\d+)$")


@dataclass
class EtNode:
    id: int
    name: str
    rf_id: int | None
    parent: int | None
    tid: int | None
    inputs: tuple  # tensor ids read
    outputs: tuple  # tensor ids written


@dataclass
class ExecTrace:
    """One rank's execution trace; nodes are the operators in execution (rf_id) order."""

    source: str
    schema: str
    pid: object
    nodes: list = field(default_factory=list)

    @property
    def rank_hint(self) -> int | None:
        """The rank in the file name (rank3_et.json, dlrm_eg_3.json -> 3), if it has one."""
        stem = Path(self.source.split(":")[-1]).name.split(".")[0]
        m = _RANK.search(stem) or _TRAILING.search(stem)
        return int(m.group(1)) if m else None


def _is_tensor(v) -> bool:
    """[tensor_id, storage_id, offset, numel, elem_bytes(, device)]: 5 ints (schema 1.0.0) + device."""
    return (isinstance(v, list) and len(v) >= 5
            and all(isinstance(x, int) and not isinstance(x, bool) for x in v[:5]))


def _tensor_ids(values, types, where: str) -> tuple:
    if not isinstance(values, list):
        raise KitError(f"{where}: inputs/outputs must be a list of values, got {type(values).__name__}")
    types = types if isinstance(types, list) else [""] * len(values)
    out = []
    for v, ty in zip(values, types):
        ty = ty if isinstance(ty, str) else ""
        if ty.startswith("Tensor(") and _is_tensor(v):
            out.append(v[0])
        elif ty.startswith(("GenericList[Tensor", "TensorList")) and isinstance(v, list):
            out += [x[0] for x in v if _is_tensor(x)]
    return tuple(out)


def _attr_map(node, where: str) -> dict:
    attrs = node.get("attrs", [])
    if not isinstance(attrs, list):
        raise KitError(f"{where}: 'attrs' must be a list of {{name, value}}")
    return {a["name"]: a.get("value") for a in attrs if isinstance(a, dict) and "name" in a}


def parse_et(doc, source: str) -> ExecTrace:
    """One loaded ET document -> ExecTrace; KitError naming the file and node if malformed."""
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise KitError(f"{source}: not a PyTorch execution trace (expected a JSON object with "
                       "'schema' and a 'nodes' list)")
    schema = str(doc.get("schema", ""))
    et = ExecTrace(source, schema, doc.get("pid"))
    for k, n in enumerate(doc["nodes"]):
        where = f"{source}: node {k}"
        if not isinstance(n, dict):
            raise KitError(f"{where}: each node must be a JSON object")
        nid, name = n.get("id"), n.get("name")
        if not isinstance(nid, int) or not isinstance(name, str):
            raise KitError(f"{where}: needs an integer 'id' and a string 'name' "
                           f"(got id={nid!r}, name={name!r})")
        if name.startswith(_ROOT):
            continue
        if isinstance(n.get("inputs"), dict) or "attrs" in n:  # chakra layout
            a = _attr_map(n, where)
            ins, outs = n.get("inputs", {}), n.get("outputs", {})
            if not isinstance(ins, dict) or not isinstance(outs, dict):
                raise KitError(f"{where}: inputs/outputs must be {{values, shapes, types}} objects")
            node = EtNode(nid, name, int_or_none(a.get("rf_id")), int_or_none(n.get("ctrl_deps")),
                          int_or_none(a.get("tid")),
                          _tensor_ids(ins.get("values", []), ins.get("types"), where),
                          _tensor_ids(outs.get("values", []), outs.get("types"), where))
        else:
            node = EtNode(nid, name, int_or_none(n.get("rf_id")), int_or_none(n.get("parent")),
                          int_or_none(n.get("tid")),
                          _tensor_ids(n.get("inputs", []), n.get("input_types"), where),
                          _tensor_ids(n.get("outputs", []), n.get("output_types"), where))
        et.nodes.append(node)
    if not et.nodes:
        raise KitError(f"{source}: the execution trace has no operator nodes")
    have_rf = sum(1 for x in et.nodes if x.rf_id is not None)
    if have_rf and have_rf < len(et.nodes):
        raise KitError(f"{source}: {len(et.nodes) - have_rf} of {len(et.nodes)} nodes lack 'rf_id'")
    et.nodes.sort(key=lambda x: (x.rf_id if x.rf_id is not None else x.id, x.id))
    return et


def load_et(path, docs=None) -> list[ExecTrace]:
    """Every execution trace in a file, .gz, folder or tarball (Kineto files there are skipped)."""
    from kit.trace.kineto import is_execution_trace, read_docs

    docs = read_docs(path) if docs is None else docs
    ets = [parse_et(d, src) for src, d in docs if is_execution_trace(d)]
    if not ets:
        bad = next((src for src, d in docs if isinstance(d, dict) and "nodes" in d), None)
        if bad is not None:
            raise KitError(f"{bad}: has 'nodes' but no 'schema': not a PyTorch execution trace")
        raise KitError(f"execution trace {path}: no PyTorch execution trace (a JSON object with "
                       "'schema' and 'nodes') found")
    return ets


def data_edges(et: ExecTrace) -> list[tuple[int, int]]:
    """(producer id, consumer id): the op that last wrote a tensor -> an op that reads it, in
    execution order; an op and its own ancestors are not each other's producers."""
    parent = {n.id: n.parent for n in et.nodes}

    def ancestors(i):
        seen = set()
        while i is not None and i in parent and i not in seen:
            seen.add(i)
            i = parent[i]
        return seen

    writer: dict = {}
    edges = set()
    for n in et.nodes:
        anc = None
        for t in n.inputs:
            w = writer.get(t)
            if w is not None and w != n.id:
                anc = ancestors(n.id) if anc is None else anc
                if w not in anc:
                    edges.add((w, n.id))
        for t in n.outputs:
            writer[t] = n.id
    return sorted(edges)


__all__ = ["EtNode", "ExecTrace", "data_edges", "load_et", "parse_et"]
