"""Link a rank's execution trace (ET) to its Kineto trace, and derive GPU-side data dependencies.

1. ET node <-> Kineto CPU op. Newer Kineto writes the ET's rf_id as "Record function id"; then
   the link is exact. Older Kineto (PyTorch <= 2.0) only has "External id", which is numbered
   per thread in a different order, so each ET thread's operator names (in rf_id order) are
   aligned with each Kineto thread's (in External id order): start where most name matches
   agree on the External id - rf_id offset, walk both in step, and after a mismatch skip ahead
   in whichever gets back in step soonest. A pair is linked only where the names agree.
2. Op -> GPU work. A kernel's correlation names its runtime call (cudaLaunchKernel, ...); the
   call's op is the innermost enclosing Kineto CPU op on its thread that is linked to the ET.
3. Data flow. Walking the ET in execution order, every tensor remembers the GPU work that last
   wrote it (an op without GPU work of its own, e.g. a view, passes its inputs' writers on).
   An op's kernels then depend on the writers of its inputs; a host sync inside an op (e.g.
   aten::item's cudaStreamSynchronize) waits on the stream its data is on.

Everything is keyed by Kineto correlation ids, so kit.trace.build can map it onto graph ops.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from kit.errors import KitError
from kit.trace.et import ExecTrace, data_edges
from kit.trace.kineto import RankTrace, is_sync_call


@dataclass
class EtLink:
    et: ExecTrace
    method: str  # "record function id" | "name alignment"
    op_of_node: dict = field(default_factory=dict)  # ET node id -> index into trace.cpu_ops
    node_of_call: dict = field(default_factory=dict)  # runtime correlation -> ET node id
    kernel_inputs: dict = field(default_factory=dict)  # GPU correlation -> producer GPU corrs
    sync_inputs: dict = field(default_factory=dict)  # sync call correlation -> GPU corrs to wait on
    edges: list = field(default_factory=list)  # (producer node, consumer node) data dependencies

    def stats(self, trace: RankTrace) -> dict:
        gpu_corr = {e.correlation for e in trace.gpu if e.correlation is not None}
        launched = {c.correlation for c in trace.runtime} & gpu_corr
        kernels = sum(1 for c in self.node_of_call if c in gpu_corr)
        return {"rank": trace.rank, "et": self.et.source, "schema": self.et.schema,
                "method": self.method, "et_ops": len(self.et.nodes),
                "linked_ops": len(self.op_of_node),
                "gpu_ops": len(launched), "gpu_ops_linked": kernels,
                "gpu_ops_without_launch": len(trace.gpu) - len(launched),
                "data_edges": len(self.edges),
                **self._edge_order(trace),
                "gpu_deps": sum(len(v) for v in self.kernel_inputs.values()),
                "sync_deps": len(self.sync_inputs)}


    def _edge_order(self, trace: RankTrace) -> dict:
        """How the ET's CPU data dependencies sit on the replayed host thread: edges between the
        main and autograd threads, and edges whose consumer the trace shows starting before its
        producer (none, if the serial issuing thread honours every ET dependency)."""
        ops, tid = trace.cpu_ops, {n.id: n.tid for n in self.et.nodes}
        cross = backwards = 0
        for p, c in self.edges:
            if tid.get(p) != tid.get(c):
                cross += 1
            a, b = self.op_of_node.get(p), self.op_of_node.get(c)
            if a is not None and b is not None and ops[b].ts_us < ops[a].ts_us:
                backwards += 1
        return {"data_edges_cross_thread": cross, "data_edges_backwards": backwards}


WINDOW = 64  # how far the aligner looks ahead to resynchronise after a mismatch


def _anchor(a, a_rf, b, b_ext) -> int:
    """Where in b the ET's first op sits: the External id offset most name matches agree on
    (External id - rf_id), then the nearest spot where three names in a row agree."""
    where: dict = {}
    for j, name in enumerate(b):
        where.setdefault(name, []).append(j)
    votes: dict = {}
    for i in range(min(len(a), 300)):
        for j in where.get(a[i], ())[:500]:
            d = b_ext[j] - a_rf[i]
            votes[d] = votes.get(d, 0) + 1
    if not votes:
        return 0
    delta = max(votes, key=lambda d: (votes[d], -abs(d)))
    j0 = bisect.bisect_left(b_ext, a_rf[0] + delta)
    for k in range(WINDOW):
        for j in (j0 - k, j0 + k):
            if 0 <= j and a[:3] == b[j:j + 3]:
                return j
    return min(j0, max(len(b) - 1, 0))


def _align(a, a_rf, b, b_ext) -> list[tuple[int, int]]:
    """Matched (index in a, index in b): walk both in order from the anchor; after a mismatch
    skip ahead in whichever sequence gets both back in step soonest (two names in a row)."""
    out = []
    i, j = 0, _anchor(a, a_rf, b, b_ext)
    n, m = len(a), len(b)

    def agree(x, y):
        return a[x] == b[y] and (x + 1 >= n or y + 1 >= m or a[x + 1] == b[y + 1])

    while i < n and j < m:
        if a[i] == b[j]:
            out.append((i, j))
            i, j = i + 1, j + 1
            continue
        for k in range(1, WINDOW):
            if j + k < m and agree(i, j + k):
                j += k
                break
            if i + k < n and agree(i + k, j):
                i += k
                break
        else:
            i, j = i + 1, j + 1
    return out


def _link_ops(et: ExecTrace, trace: RankTrace) -> tuple[dict, str]:
    ops = trace.cpu_ops
    by_rf = {op.rf_id: i for i, op in enumerate(ops) if op.rf_id is not None}
    if by_rf:
        out = {n.id: by_rf[n.rf_id] for n in et.nodes
               if n.rf_id in by_rf and ops[by_rf[n.rf_id]].name == n.name}
        return out, "record function id"
    et_threads: dict = {}
    for n in et.nodes:
        et_threads.setdefault(n.tid, []).append(n)
    k_threads: dict = {}
    for i, op in enumerate(ops):
        k_threads.setdefault(op.tid, []).append(i)
    for idx in k_threads.values():
        idx.sort(key=lambda i: (ops[i].ext_id if ops[i].ext_id is not None else -1, ops[i].ts_us))
    out: dict = {}
    free = set(k_threads)
    for tid, nodes in sorted(et_threads.items(), key=lambda kv: -len(kv[1])):
        names = [n.name for n in nodes]
        rfs = [n.rf_id if n.rf_id is not None else k for k, n in enumerate(nodes)]
        best: list = []
        best_tid = None
        for ktid in free:
            idx = k_threads[ktid]
            pairs = _align(names, rfs, [ops[i].name for i in idx],
                           [ops[i].ext_id if ops[i].ext_id is not None else -1 for i in idx])
            if len(pairs) > len(best):
                best, best_tid = pairs, ktid
        if best_tid is None:
            continue
        free.discard(best_tid)
        for a, b in best:
            out[nodes[a].id] = k_threads[best_tid][b]
    return out, "name alignment"


def _calls_to_ops(trace: RankTrace, op_node: dict) -> dict:
    """runtime correlation -> ET node of the innermost linked CPU op enclosing the call."""
    ops = trace.cpu_ops
    by_tid: dict = {}
    for i, op in enumerate(ops):
        by_tid.setdefault(op.tid, []).append(i)
    calls: dict = {}
    for c in trace.runtime:
        calls.setdefault(c.tid, []).append(c)
    out: dict = {}
    for tid, cs in calls.items():
        idx = by_tid.get(tid, [])
        stack: list[int] = []
        k = 0
        for c in cs:  # both sorted by ts; ops by (ts, -dur) so parents come first
            while k < len(idx) and ops[idx[k]].ts_us <= c.ts_us:
                i = idx[k]
                while stack and ops[stack[-1]].ts_us + ops[stack[-1]].dur_us < ops[i].ts_us:
                    stack.pop()
                stack.append(i)
                k += 1
            while stack and ops[stack[-1]].ts_us + ops[stack[-1]].dur_us < c.ts_us:
                stack.pop()
            for i in reversed(stack):
                if i in op_node and ops[i].ts_us + ops[i].dur_us >= c.ts_us + c.dur_us:
                    if c.correlation is not None:
                        out[c.correlation] = op_node[i]
                    break
    return out


def link(et: ExecTrace, trace: RankTrace) -> EtLink:
    """Link one rank's ET and Kineto trace; KitError if they are not the same run."""
    if et.pid is not None and trace.pid is not None and str(et.pid) != str(trace.pid):
        raise KitError(f"{et.source} (pid {et.pid}) and {trace.source} (pid {trace.pid}) are not "
                       "from the same process: pass the execution trace recorded with this trace")
    op_of_node, method = _link_ops(et, trace)
    if not op_of_node:
        raise KitError(f"{et.source}: none of its {len(et.nodes)} operators match an op of "
                       f"{trace.source}; pass the execution trace recorded with this trace")
    lk = EtLink(et, method, op_of_node)
    op_node = {i: n for n, i in op_of_node.items()}
    lk.node_of_call = _calls_to_ops(trace, op_node)
    lk.edges = data_edges(et)
    gpu = {e.correlation: e for e in trace.gpu if e.correlation is not None}
    own: dict = {}  # node -> its own GPU correlations, in launch order
    syncs: dict = {}  # node -> its sync calls' correlations
    for c in trace.runtime:
        n = lk.node_of_call.get(c.correlation)
        if n is None:
            continue
        if c.correlation in gpu:
            own.setdefault(n, []).append(c.correlation)
        elif is_sync_call(c.name):
            syncs.setdefault(n, []).append(c.correlation)
    parent = {n.id: n.parent for n in et.nodes}
    has_gpu = set()
    for n in own:
        p, guard = n, 0
        while p is not None and p not in has_gpu and guard < 1000:
            has_gpu.add(p)
            p, guard = parent.get(p), guard + 1
    writers: dict = {}  # tensor id -> frozenset of GPU correlations that last wrote it
    for n in et.nodes:
        w_in = frozenset().union(*(writers.get(t, ()) for t in n.inputs)) if n.inputs else frozenset()
        mine = own.get(n.id)
        if mine:
            for c in mine:
                if w_in:
                    lk.kernel_inputs[c] = w_in
            new = frozenset([mine[-1]])
        elif n.id in has_gpu:
            continue  # its children launched the work and write the tensors themselves
        else:
            new = w_in
        for c in syncs.get(n.id, ()):
            lk.sync_inputs[c] = frozenset(mine or ()) | w_in
        for t in n.outputs:
            writers[t] = new
    return lk


def pair(ets: list[ExecTrace], traces: list[RankTrace]) -> tuple[dict, list[str]]:
    """rank -> ExecTrace: by process id, else the number in the ET's file name, else one to one."""
    notes: list[str] = []
    out: dict = {}
    # ranks by process id: a pid names a rank only where one rank has it (each rank in its own
    # container, or on its own node, may run as the same pid: the first of two ranks of pid 42 had
    # taken the other's ET, and that rank's own was left "with no Kineto rank of its pid")
    pid_ranks: dict = {}
    for t in traces:
        if t.pid is not None:
            pid_ranks.setdefault(str(t.pid), []).append(t.rank)
    left = []
    for et in ets:
        rs = pid_ranks.get(str(et.pid), []) if et.pid is not None else []
        if len(rs) == 1 and rs[0] not in out:
            out[rs[0]] = et
        else:
            left.append(et)
    ranks = {t.rank for t in traces}
    for et in list(left):
        h = et.rank_hint
        rs = pid_ranks.get(str(et.pid), []) if et.pid is not None else []
        if h in ranks and h not in out and (h in rs if len(rs) > 1 else not rs):
            if et.pid is None or len(rs) > 1 or all(t.pid is None for t in traces if t.rank == h):
                out[h] = et
                left.remove(et)
    if left and len(ets) == 1 and len(traces) == 1:
        out[traces[0].rank] = left.pop()  # one and one: link() checks they are the same run
    for et in left:
        rs = pid_ranks.get(str(et.pid), []) if et.pid is not None else []
        notes.append(f"{et.source}: " + (f"ranks {', '.join(map(str, rs))} share its pid {et.pid} "
                                         "and its file name names none of them" if len(rs) > 1
                                         else f"no Kineto rank with its pid {et.pid}") + "; not used")
    return out, notes


__all__ = ["EtLink", "link", "pair"]
