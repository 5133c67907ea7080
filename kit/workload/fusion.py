"""Fusion modes: how many kernels a graph becomes.

* eager: one kernel per op (PyTorch eager). Free ops launch nothing.
* compiled: torch.compile-style. Chains of consecutive memory-bound ops (elementwise,
  reductions, dropout, softmax, norms, and the indexed stores Inductor generates) in one
  phase become one kernel that reads only the chain's
  external inputs and writes only the outputs something outside the chain still needs (the next
  GEMM, the backward pass, the model's output). GEMMs and attention stay library kernels.

    fused bytes = Σ external inputs (each read once) + Σ external outputs
                  + the inputs a looped reduction over rows too wide for any L2 reads again (_reread)

counted at tensor level from the capture's records (Node.reads, Node.writes):

* an external input is a distinct region of a tensor that members read and no earlier member
  wrote: a slice of a GEMM output counts its own bytes (q and k of one q|k|v output: two
  thirds of it), a whole tensor counts once however many members read it, and only the
  outputs of a multi-output producer that the chain reads count (a dropout's y, not its mask);
* an external output is a tensor a member wrote that a node outside the chain reads later (the
  next kernel, the backward pass, the optimizer) or that no node reads after it (a parameter's
  gradient; but not in a forward-only graph that names what it returns, where the unread output
  of a member whose other output is used, a max pool's indices, is dead code the compiler
  drops: see _tensor_level), or that the
  model returns (OpGraph.meta's output_tensors: also when a later member reads it), and any write into a tensor that outlives the step (a parameter or an optimizer
  state updated in place: once, however many members update it). A member with several
  outputs (native_dropout's y and mask, a layer norm's y, mean and rstd) is charged only those
  that leave the chain.

Graphs without records (built by hand) fall back to a node-level estimate from out_bytes and
op.bytes.
"""
from __future__ import annotations

from dataclasses import replace

from kit.errors import KitError
from kit import ops
from kit.ops import Elementwise
from kit.workload.graph import Node, OpGraph, renumber
from kit.workload.kernels import Cheapest, Derived, copy_of

FUSIONS = ("eager", "compiled")
FUSIBLE = {"elementwise", "reduction", "dropout", "softmax", "layernorm", "rmsnorm", "batchnorm",
           "groupnorm", "pooling", "upsample"}
# indexed stores Inductor generates as pointwise kernels (a static KV cache's index_copy_, a
# scatter), fused with their neighbours. Left out, a compiled gpt2 decode step (fp16, batch 4,
# context 512, H100) ran its static cache's writes as 2 kernels a layer more than the dynamic
# cache's fused cat: 2.46 ms against 2.10 ms, the cache written in place slower than the one that
# copies itself every step. The rest of the class stays one kernel per op: sort, topk, nonzero and
# the embedding backward are library kernels, and the gathers (Inductor's indexed loads) keep
# their own rows, which the expert-gather note of a MoE decode step reads (aten "index")
GENERATED_INDEXING = {"index_copy", "index_copy_", "index_put", "index_put_", "_index_put_impl_",
                      "scatter", "scatter_", "scatter_add", "scatter_add_", "index_add",
                      "index_add_"}


def fusible(n: Node) -> bool:
    """Whether a kernel node joins a compiled chain (FUSIBLE, GENERATED_INDEXING: a store only
    with the capture's tensor records, which say what it writes; see _waits)."""
    return n.op_class in FUSIBLE or (_store(n) and bool(n.writes))


def _store(n: Node) -> bool:
    return n.op_class == "indexing" and n.name() in GENERATED_INDEXING


def _targets(n: Node) -> set[int]:
    """The tensors an indexed store writes into: its output, and an out-of-place one's self
    (its first input: the output starts as it)."""
    out = {w.tensor for w in n.writes}
    if not n.name().endswith("_") and n.reads:
        out.add(n.reads[0].tensor)
    return out


def _waits(n: Node, wrote: set[int], stored: set[int]) -> bool:
    """Whether n must start a kernel after the chain before it. An indexed store writes rows
    of its target at indices the kernel learns only as it runs, so Inductor runs what fills the
    target before it (the zeros an index_add_ or a gather's gradient accumulates into) and what
    reads the target after it (a sum over it) as kernels of their own; it fuses only the ops
    making the values stored. One chain with them had counted the target once, neither its fill
    nor its rows: a MoE combine (zeros, index_add_ of 8,192 rows of 256 fp32, sum) 12.7 MB
    against the 42.1 MB of its kernels one by one, a gather's gradient 6.3 against 11.5."""
    touched = {r.tensor for r in n.reads} | {w.tensor for w in n.writes}
    return bool(touched & stored) or (_store(n) and bool(_targets(n) & wrote))


def check_fusion(fusion) -> None:
    """KitError unless fusion names a fusion mode (a string of FUSIONS)."""
    if not isinstance(fusion, str) or fusion not in FUSIONS:
        raise KitError(f"unknown fusion {fusion!r}: choose eager or compiled")


def apply_fusion(graph: OpGraph, fusion: str = "eager") -> OpGraph:
    """The kernel graph (free ops dropped, edges kept) under a fusion mode."""
    check_fusion(fusion)
    kernels = graph.without_free()
    if fusion == "eager":
        return kernels.with_nodes(kernels.nodes, fusion="eager")
    return fuse_chains(kernels)


def _in_bytes(n: Node) -> float:
    return max(float(n.op.bytes) - n.out_bytes, 0.0)


def _node_level(group: list[Node], consumers: dict[int, list[int]],
                by_id: dict) -> tuple[float, float]:
    """(ext_in, ext_out) from node-level bytes, for nodes without tensor records: each external
    producer's whole output read once; reads of tensors no node produced (parameters, inputs)
    are what a member reads beyond its deps; a member's whole output written if any node outside
    reads it."""
    ids = {n.id for n in group}
    producers = {d for n in group for d in n.deps if d not in ids}
    ext_in = sum(by_id[d].out_bytes for d in producers)
    ext_in += sum(max(_in_bytes(n) - sum(by_id[d].out_bytes for d in n.deps), 0.0) for n in group)
    ext_out = sum(n.out_bytes for n in group if not consumers[n.id] or
                  any(c not in ids for c in consumers[n.id]))
    return ext_in, ext_out


def _capped(regions: dict) -> float:
    """Bytes of distinct regions, per tensor at most its storage's bytes."""
    per: dict[int, list[int]] = {}
    for r in regions:
        acc = per.setdefault(r.tensor, [0, r.storage])
        acc[0] += r.nbytes
    return float(sum(min(b, cap) for b, cap in per.values()))


def _tensor_level(group: list[Node], readers: dict[int, list[int]],
                  returned: frozenset = frozenset(), closed: bool = False) -> tuple[float, float]:
    """(ext_in, ext_out) from the members' tensor records (the module docstring).
    readers: tensor id -> ids of the nodes of the graph reading it, ascending; returned: the ids
    of the tensors the model returns (written out even where a later member reads them); closed:
    the graph is forward only and returned names what it leaves behind, so an output nobody
    reads of a member whose other output is used is dead and not written. Inductor drops such
    buffers (its scheduler's dead node elimination): an inference max_pool2d_with_indices's
    int64 indices, 4 times its bf16 output, had made vgg16's compiled chains 55.1 MB where
    30.6 MB move; a layer norm's mean and rstd. A member's only output stays written (the
    model's output in an object returned tensors cannot see into), and where a backward pass
    runs a tensor no node reads may be a parameter's gradient (a layer norm backward's dw)."""
    ids = {n.id for n in group}
    written: set[int] = set()
    ext_in: dict = {}
    ext_out: dict = {}
    for n in group:  # issue order: a tensor an earlier member wrote is read on chip
        # an indexed store reads its index and values, not its target (as kit.workload.mapping
        # costs it alone)
        skip = {w.tensor for w in n.writes} if _store(n) else set()
        for r in n.reads:
            if r.tensor not in written and r.tensor not in skip:
                ext_in[r] = None
        written.update(w.tensor for w in n.writes)
    for n in group:
        rows = _rows_written(n)
        later = {w: [r for r in readers.get(w.tensor, ()) if r > n.id] for w in rows}
        # a dead output: an output no node reads, of a member another output of which is used
        used = sum(bool(later[w]) or w.tensor in returned for w in rows)
        for w in rows:
            if w.tensor < 0 or w.tensor in returned or any(r not in ids for r in later[w]) \
                    or (not later[w] and not (closed and used)):
                ext_out[w] = None
    return _capped(ext_in) + _reread(group, ext_in), _capped(ext_out)


# A reduction's row that Inductor cannot hold (more than 1,024 elements: its persistent-reduction
# limit, torch/_inductor/choices.py should_use_persistent_reduction) runs as a looped reduction:
# a first loop over the row reduces it, a second reads it again for the ops that need it after
# the reduction (x / x.sum(-1, keepdim=True), a softmax's normalisation: 3 tensor passes, not
# the 2 counted from the chain's external bytes, which is what a row held in registers moves).
# The first loop's loads are marked evict_last so the second finds the row in L2, and it does
# while the rows resident at once (some 8 programs of 256 threads an SM, one row each) fit
# there, as PyTorch's own multi-pass rows do (kit.predict.row_reread). Fusion knows no GPU, so
# the re-read is counted from DRAM only for rows that spill every catalog GPU's L2 at that
# residency: the most L2 per SM is a B200's 872 KiB (an MI300X's Infinity Cache 862), whose
# ramp there reaches a full miss at 0.8 of it, 8 rows of 87 KiB. Those are vocabulary rows:
# gpt2's bf16 loss chain [_to_copy + _log_softmax + nll_loss] (4 x 512 tokens x 50,257) re-reads
# its 206 MB of logits, 618 -> 824 MB, and its backward the 412 MB fp32 gradient. Shorter rows
# (a norm's 2-16 kB) are re-read from L2 on today's large-L2 GPUs and stay counted once: an
# undercount where the resident rows spill a small L2 (V100, T4: rows of some 4 kB and more).
REREAD_ROW_BYTES = 87 * 1024
REREAD_MIN_COLS = 1024
SOFTMAX_FWD = ("_softmax", "_safe_softmax", "_log_softmax", "softmax")
SOFTMAX_BWD = ("_softmax_backward_data", "_log_softmax_backward_data")


def _rows_cols(n: Node) -> tuple[int, int]:
    """(rows, last dim) of n's first input, from its shapes ("[4,512,50257]x..."), or (0, 0)."""
    try:
        dims = [int(d) for d in n.shapes.split("x")[0].strip("[]").split(",")]
    except ValueError:
        return 0, 0
    rows = 1
    for d in dims[:-1]:
        rows *= d
    return rows, dims[-1]


def _reread(group: list[Node], ext_in: dict) -> float:
    """The bytes a chain's looped reductions read a second time from DRAM (the notes above):
    a softmax's external inputs (those its members up to it read; a log-softmax backward's
    gradient alone, the one its sum reads, or what the members before it made it from: a cast of
    a bf16 gradient), or a reduction's input that a later member reads
    again, where the reduced rows exceed REREAD_MIN_COLS elements and REREAD_ROW_BYTES."""
    again: dict = {}
    seen: list = []
    for i, n in enumerate(group):
        before = list(seen)  # what the members before n read from outside: n's inputs' sources
        seen.extend(r for r in n.reads if r in ext_in and r not in seen)
        name, (rows, cols) = n.name(), _rows_cols(n)
        if n.op_class == "reduction":
            rows, cols = _reduced(n, rows, cols)
        if cols <= REREAD_MIN_COLS or rows < 1:
            continue
        if name in SOFTMAX_FWD:
            regions = list(seen)
        elif name == "_log_softmax_backward_data":  # its gradient, or what a member made it from
            regions = ([n.reads[0]] if n.reads[0] in ext_in else
                       [r for r in before if r not in n.reads[1:]])
        elif name in SOFTMAX_BWD:
            regions = [r for r in n.reads if r in ext_in]
        elif n.op_class == "reduction":
            later = {r.tensor for m in group[i + 1:] for r in m.reads}
            regions = [r for r in n.reads if r in ext_in and r.tensor in later]
        else:
            continue
        # a row of the widest region (the logits, where a cast before the softmax widens them)
        if regions and max(r.nbytes for r in regions) / rows >= REREAD_ROW_BYTES:
            again.update(dict.fromkeys(regions))
    return _capped(again)


def _reduced(n: Node, rows: int, cols: int) -> tuple[int, int]:
    """(outputs, elements each reduces) of a reduction over more than its last dim (x.sum(), a
    column sum), from the bytes it reads and writes at its dtype; else (rows, cols) of its
    shape. Its "row" is then all it reduces into one output: h / h.sum() over an 8,192 x 8,192
    fp32 h must read all 256 MiB for the sum before the div writes anything, and the chain had
    been counted as one pass over h (512 MiB for the 768 its two passes and write move), taking
    its rows as 8,192 of 32 kB. A reduction over a middle dim shorter than the last writes more
    outputs than its input has rows: x.sum(1) over [2, 64, 32768] fp32 writes 65,536 sums of 64
    elements each, not 128 rows of 128 kB (a re-read, 3 passes where its 256 B columns take 2).
    A last-dim reduction writes a row's output in its dtype, or up to 8 times wider (an argmax's
    int64, a bf16 sum's fp32): outs a small power of two times rows is taken for that."""
    if not n.reads or not n.writes:
        return rows, cols
    size = ops.dtype_bytes(getattr(n.op, "dtype", "fp32"))
    outs = max(n.writes[0].nbytes // size, 1)
    if outs >= rows and outs % rows == 0 and outs // rows in (1, 2, 4, 8):
        return rows, cols
    return outs, n.reads[0].nbytes // size // outs


def _rows_written(n: Node) -> tuple:
    """n's write regions; an indexed store's capped at the bytes it writes (half of what
    kit.workload.mapping moves for it: its rows, and an out-of-place one's copy of self). Its
    region is the whole target: a static KV cache's index_copy_ of one token had been counted
    as writing both caches whole, gpt2's decode step (batch 4, context 512, fp16) 6.3 MB a layer
    for 12 kB of new rows."""
    if not _store(n):
        return n.writes
    rows = int(float(n.op.bytes) / 2)
    return tuple(w._replace(nbytes=min(w.nbytes, rows)) for w in n.writes)


def _fused(group: list[Node], consumers: dict[int, list[int]], new_id: int, by_id: dict,
           readers: dict[int, list[int]] | None = None, returned: frozenset = frozenset(),
           closed: bool = False) -> Node:
    ids = {n.id for n in group}
    recorded = readers is not None and all(n.writes for n in group)
    ext_in, ext_out = (_tensor_level(group, readers, returned, closed) if recorded
                       else _node_level(group, consumers, by_id))
    dtype = getattr(group[0].op, "dtype", "fp32")
    label = "+".join(n.name() for n in group)
    # one pass over the chain's external bytes, or (never slower than) its members as the
    # compiler's kernels one after another: priced as a copy, a bias-gradient sum and a
    # gelu_backward fused had come out 7% over the two kernels on a T4
    op = Cheapest("fused", (Derived("fused", (copy_of(max(ext_in + ext_out, 1.0), dtype),), 1.0, label),
                            Derived("fused", tuple(_generated(n.op) for n in group), 1.0, label + " (unfused)")),
                  label)
    deps = tuple(sorted({d for n in group for d in n.deps if d not in ids}))
    names = "+".join(dict.fromkeys(n.name() for n in group))
    # the fused kernel reads what its members read from outside and writes what they wrote
    written = {w.tensor for n in group for w in n.writes}
    reads = tuple(dict.fromkeys(r for n in group for r in n.reads if r.tensor not in written))
    writes = tuple(dict.fromkeys(w for n in group for w in n.writes))
    return Node(new_id, f"fused[{names}]", op, "fused", group[0].phase, deps, group[0].module,
                group[0].layer, int(ext_out), group[0].shapes, 1,
                tuple(m for n in group for m in (n.members or (n.id,))), reads, writes)


def _generated(op):
    """A memory-bound op as the compiler's own kernel runs it: Inductor generates an indexed
    kernel for a broadcast or strided input too, not PyTorch's generic elementwise loop
    (Elementwise.vectorized, kit.workload.kernel_times.generic_loop_ms)."""
    if isinstance(op, Elementwise) and not op.vectorized:
        return replace(op, vectorized=True)
    if isinstance(op, Derived):
        parts = tuple(_generated(p) for p in op.parts)
        return op if parts == op.parts else replace(op, parts=parts)
    return op


def chain_bytes(group: list[Node], readers: dict[int, list[int]],
                returned: frozenset = frozenset()) -> float:
    """The bytes one pass of a fused chain of recorded kernels (of a graph with a backward pass)
    moves: its external inputs and outputs, as _fused's copy. kit.parallel.opgraph prices a
    chain on a tensor-parallel rank from its members' records with the sharded tensors cut."""
    ext_in, ext_out = _tensor_level(group, readers, returned)
    return max(ext_in + ext_out, 1.0)


def tensor_readers(kernels: OpGraph) -> dict[int, list[int]]:
    """tensor id -> ids of the nodes reading it, ascending."""
    out: dict[int, list[int]] = {}
    for n in kernels.nodes:
        for r in n.reads:
            ids = out.setdefault(r.tensor, [])
            if not ids or ids[-1] != n.id:
                ids.append(n.id)
    return out


def fuse_chains(kernels: OpGraph) -> OpGraph:
    """Fuse runs of consecutive fusible kernels of one phase (see the module docstring)."""
    consumers = kernels.consumers()
    by_id = {n.id: n for n in kernels.nodes}
    readers = tensor_readers(kernels)
    returned = frozenset(kernels.meta.get("output_tensors", ()))
    closed = "output_tensors" in kernels.meta and all(n.phase == "fwd" for n in kernels.nodes)
    out: list[Node] = []
    group: list[Node] = []
    remap: dict[int, int] = {}

    def flush():
        if not group:
            return
        if len(group) == 1:  # a chain of one is a generated kernel too
            node = group[0]
            op = _generated(node.op)
            node = node if op is node.op else replace(node, op=op)
        else:
            node = _fused(group, consumers, group[0].id, by_id, readers, returned, closed)
        for n in group:
            remap[n.id] = node.id
        out.append(node)
        group.clear()

    wrote: set[int] = set()  # tensors the group's members wrote
    stored: set[int] = set()  # and its indexed stores (_waits)
    for n in kernels.nodes:
        if fusible(n):
            if group and (group[0].phase != n.phase or _waits(n, wrote, stored)):
                flush()
            if not group:
                wrote.clear()
                stored.clear()
            group.append(n)
            wrote.update(w.tensor for w in n.writes)
            if _store(n):
                stored.update(w.tensor for w in n.writes)
            continue
        flush()
        remap[n.id] = n.id
        out.append(n)
    flush()
    # deps point at fused representatives; drop self-edges, then renumber
    fixed = []
    for n in out:
        deps = tuple(sorted({remap[d] for d in n.deps if remap.get(d, d) != n.id}))
        fixed.append(replace(n, deps=deps))
    return renumber(kernels, fixed, fusion="compiled")
