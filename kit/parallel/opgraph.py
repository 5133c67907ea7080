"""Megatron tensor parallelism applied to a captured op graph (kit.workload), layer by layer.

The graph is what the model really runs (every aten op of forward and backward, with shapes and
the tensors each op reads). Sharding it for TP degree t follows Megatron-LM (Shoeybi et al. 2019)
by following the tensors, not the module names:

* a linear GEMM whose input is replicated is column-parallel: its output width N is split
  (W[K, N/t]) and its output is sharded;
* a linear GEMM whose input is sharded is row-parallel: its reduction K is split (W[K/t, N]) and
  an all-reduce of its [M, N] output follows (Megatron's g operator);
* a batched GEMM or attention kernel on a sharded tensor runs a/t heads; any other kernel that
  reads a sharded tensor runs on 1/t of it; kernels on replicated tensors run whole;
* backward: the data-gradient GEMM of a column-parallel layer (the one that contracts over N) is
  K-split and followed by the all-reduce of its input gradient (Megatron's f operator); the
  other backward GEMMs of a sharded layer have the sharded dimension split; the rest follows
  the tensors as in the forward. The all-reduce is Megatron's asynchronous one
  (LinearWithGradAccumulationAndAsyncCommunication, as kit.parallel.gpt._column_backward): issued
  after the data gradient, beside the layer's weight-gradient GEMM and bias sum, which the graph
  may have captured before it (HF's nn.Linear runs wgrad first) and are moved after it. Where
  q, k and v are separate linears their partial input gradients are summed first and the one
  all-reduce runs beside all three weight gradients, as Megatron's fused QKV linear does;
* the word embedding is vocab-parallel: a lookup in V/t rows and an all-reduce of its output; the
  LM head is column-parallel over the vocabulary, followed by the vocab-parallel cross entropy
  (softmax over V/t, an all-reduce of 3 floats per token). Megatron pads the vocabulary to a
  multiple of 128·t (make-vocab-size-divisible-by).

The result has the same shape as kit.parallel.gpt's analytic layer (Blocks of kernels separated
by collectives), so chunk_costs, the pipeline schedules and the simulator treat both alike.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from kit import ops
from kit.errors import KitError
from kit.parallel.gpt import Block, GPTSpec, vocab_per_rank
from kit.predict.norm_paths import VECTOR_ELEMS
from kit.workload.fusion import chain_bytes, tensor_readers
from kit.workload.graph import Region
from kit.workload.zoo_configs import hf_value


@dataclass
class GraphSource:
    """Per-rank kernels of a captured model under TP: the blocks chunk_costs consumes."""

    layer_blocks: dict = field(default_factory=dict)  # key -> (fwd blocks, bwd blocks)
    layer_keys: list = field(default_factory=list)  # layer index -> key
    embedding: tuple = ((), ())  # (fwd blocks, bwd blocks)
    head: tuple = ((), ())
    model: str = "model"
    nodes: int = 0  # kernels in the captured (fused) graph

    def layer_key(self, layer: int):
        return self.layer_keys[layer]

    def layer(self, layer: int) -> tuple:
        return self.layer_blocks[self.layer_key(layer)]


def capture_model(model, micro_batch: int, seq: int, dtype: str, fusion: str = "eager"):
    """The captured training graph (forward + backward, no optimizer) of one micro-batch, with
    free ops dropped (fusion "eager") or memory-bound chains fused ("compiled")."""
    from kit.workload.fusion import apply_fusion
    from kit.workload.models import graph_of

    graph = graph_of(model, micro_batch, seq, "train", dtype, None, loss=False)  # Megatron's loss is added
    kernels = apply_fusion(graph, "eager")
    if fusion == "eager":
        return kernels
    fused = apply_fusion(graph, fusion)
    return fused.with_nodes(fused.nodes, unfused_kernels=kernels)  # _Sharder follows partial sums in it


def _members(n) -> tuple:
    """The captured graph's kernels a node stands for (a fused node: several)."""
    return n.members or (n.id,)


def _split(op, attr: str, tp: int, what: str):
    v = getattr(op, attr)
    if v % tp:
        raise KitError(f"--tp {tp} must divide {what} ({attr} = {v})")
    if getattr(op, "align", None) is not None:  # the split dim is a weight's: it leads an operand
        return replace(op, **{attr: v // tp}, align=min(op.align, ops.lead_alignment(v // tp)))
    return replace(op, **{attr: v // tp})


def _split_value(op: ops.Gemm, value: int, tp: int, what: str, prefer=("n", "m", "k")):
    """Split the first of op's dims (in `prefer` order) that equals value."""
    for attr in prefer:
        if getattr(op, attr) == value:
            return _split(op, attr, tp, what)
    return op  # no such dim (an op the layer does not own): leave it whole


def _shard(op, tp: int):
    """The op on 1/tp of its tensor (a kernel reading a TP-sharded activation)."""
    if isinstance(op, ops.Attention):
        kv = op.kv_heads or op.heads
        return replace(op, heads=max(op.heads // tp, 1),
                       kv_heads=max(kv // tp, 1) if op.kv_heads else None)
    if isinstance(op, ops.Gemm):
        return replace(op, b=max(op.b // tp, 1)) if op.b > 1 else op
    if isinstance(op, (ops.Elementwise, ops.Dropout)):
        return replace(op, numel=max(math.ceil(op.numel / tp), 1))
    if isinstance(op, (ops.Softmax, ops.LayerNorm, ops.RMSNorm)):
        if op.rows % tp == 0 or op.rows >= op.cols:
            return replace(op, rows=max(math.ceil(op.rows / tp), 1))
        cols = max(math.ceil(op.cols / tp), 1)
        if op.cols % VECTOR_ELEMS == 0:  # a share of a vectorisable row stays one (kit.predict.norm_paths)
            cols = -(-cols // VECTOR_ELEMS) * VECTOR_ELEMS
        return replace(op, cols=cols)
    if isinstance(op, ops.Memcpy):
        return replace(op, nbytes=max(op.nbytes // tp, 1))
    parts = getattr(op, "parts", None)
    if parts is not None:  # kit.workload Derived: scale x sum(parts)
        return replace(op, parts=tuple(_shard(p, tp) for p in parts))
    options = getattr(op, "options", None)
    if options is not None:  # kit.workload Cheapest (a compiled chain): each way on 1/tp
        return replace(op, options=tuple(_shard(o, tp) for o in options))
    return op


def _shrunk(op, frac: float):
    """op with its elementwise passes over frac of their elements (a fused chain's copy)."""
    if isinstance(op, ops.Elementwise):
        return replace(op, numel=max(math.ceil(op.numel * frac), 1))
    parts = getattr(op, "parts", None)
    return op if parts is None else replace(op, parts=tuple(_shrunk(p, frac) for p in parts))


def _shard_chain(op, sharded: list, tp: int, frac: float | None = None):
    """A compiled chain (kit.workload.fusion: Cheapest of its one-pass copy and its members one
    by one, one part a member) on this rank, where only some members read a sharded tensor:
    those run on 1/tp, the rest whole. The copy moves frac of its bytes (_Sharder._chain_frac:
    its external tensors, the sharded ones cut to 1/tp); without records, the share its members
    keep. A chain of a column-parallel bias gradient (sharded) and the layer norm backward after
    it (replicated) runs its norm whole, as eager does."""
    whole = getattr(op, "options", None)
    if whole is None or len(whole) != 2 or len(getattr(whole[1], "parts", ())) != len(sharded) \
            or (frac is None and (all(sharded) or not any(sharded))):
        return _shard(op, tp)
    parts = whole[1].parts
    mine = tuple(_shard(p, tp) if s else p for p, s in zip(parts, sharded))
    if frac is None:
        frac = sum(float(p.bytes) for p in mine) / max(sum(float(p.bytes) for p in parts), 1.0)
    return replace(op, options=(_shrunk(whole[0], frac), replace(whole[1], parts=mine)))


class _Sharder:
    def __init__(self, graph, tp: int, vocab: int | None):
        self.tp = tp
        self.vocab = vocab
        self.vocab_rank = vocab_per_rank(vocab, tp) if vocab else None
        self.state: dict[int, str] = {}  # node id -> "R" replicated, "S" sharded, "P" partial sum
        # Partial sums are followed kernel by kernel, in the unfused graph a compiled one keeps
        # (capture_model): a fused kernel writes several tensors. Inductor fuses the sum of
        # BERT's q, k and v input gradients with the clone that makes the next projection's
        # output gradient, and a node-level state had read that clone as partial: 4 backward
        # all-reduces a layer at tp 2 where Megatron runs 2. Ids are the captured graph's
        # (Node.members); m_deps is what each kernel reads, m_add whether it is an add
        base = getattr(graph, "meta", {}).get("unfused_kernels") or graph
        orig = {k.id: (k.members[0] if k.members else k.id) for k in base.nodes}
        self.m_deps = {orig[k.id]: tuple(orig[d] for d in k.deps) for k in base.nodes}
        self.m_add = {orig[k.id]: isinstance(k.op, ops.Elementwise) and k.op.kind == "add"
                      for k in base.nodes}
        self.m_bytes = {orig[k.id]: k.out_bytes for k in base.nodes}
        self.partial: set = set()  # kernels (captured ids) whose output is an unreduced partial sum
        self.role: dict[str, tuple] = {}  # module -> ("col", N) | ("row", K) | ("vocab", V)
        self.bmm_modules: set = set()
        self.by_id = {n.id: n for n in graph.nodes}
        # column-parallel weight (and bias) gradients held back to run beside the next input
        # gradient all-reduce: their items and node ids
        self.deferred: list = []
        self.deferred_ids: set = set()
        self.open: set = set()  # partial sums (captured ids) no kernel has read yet
        self.sharded: set = set()  # kernels (captured ids) whose output is sharded
        # a compiled chain's tensor records (kit.workload.fusion.chain_bytes): its members'
        # kernels, the writers of each tensor (captured ids, ascending), who reads it, what the
        # model returns
        self.kernel = {orig[k.id]: k for k in base.nodes}
        self.writers: dict[int, list] = {}
        for k in base.nodes:
            for w in k.writes:
                self.writers.setdefault(w.tensor, []).append(orig[k.id])
        self.readers = tensor_readers(base) if base is not graph else {}
        self.returned = frozenset(getattr(base, "meta", {}).get("output_tensors", ()))

    def _vocab_split(self, op, attr: str):
        """The LM head's GEMM over this rank's share of the padded vocabulary (a multiple of
        128): the vocabulary no longer limits its alignment (Gemm.align), the hidden size, the
        other weight dim (k of the logits; n of the data and weight gradients), does."""
        new = replace(op, **{attr: self.vocab_rank})
        if getattr(op, "align", None) is None:
            return new
        hidden = getattr(new, "k" if attr == "n" else "n")
        return replace(new, align=ops.lead_alignment(hidden, self.vocab_rank))

    def _padded(self, n, op):
        """At TP 1, the op over the padded vocabulary where it spans the vocabulary: the LM head's
        GEMMs (its module's forward GEMM is vocabulary-wide; its backward GEMMs pad the dim that is
        the vocabulary) and the token lookup. Megatron pads it at every TP. Left unpadded at TP 1
        alone, GPT-2's 50,257-wide LM head had stayed unaligned (cuBLAS's legacy kernels in
        16-bit) while TP 2 padded it, and TP 2 came out faster than half of TP 1. By the module,
        as TP > 1 shards it: a GEMM of as many tokens as the vocabulary is not the head."""
        if not self.vocab or self.vocab_rank == self.vocab:
            return op
        if isinstance(op, ops.Gemm) and op.b == 1:
            if n.phase == "fwd" and op.n == self.vocab:
                self.role[n.module] = ("vocab", op.n)
                return self._vocab_split(op, "n")
            if n.phase != "fwd" and self.role.get(n.module, (None,))[0] == "vocab":
                # the data gradient contracts over the vocabulary (k), the weight gradient spans it
                attr = "k" if op.k == self.vocab else next(
                    (a for a in ("m", "n") if getattr(op, a) == self.vocab), None)
                return self._vocab_split(op, attr) if attr else op
            return op
        if isinstance(op, ops.EmbeddingBag) and op.rows == self.vocab:
            return replace(op, rows=self.vocab_rank)
        return op

    def node(self, n) -> list:
        """Items for one node: ("op", kit op, kernels) and ("comm", kind, bytes[, op items it
        runs beside, asynchronously]). A column-parallel layer's weight-gradient items are held
        back (take_deferred) and come after the all-reduce of its input gradient."""
        # a node that reads a held-back gradient (a tied head's weight gradient, added to the
        # embedding's) runs after it
        first = self.take_deferred() if self.deferred_ids.intersection(n.deps) else []
        items = [it + (max(n.kernels, 1),) if it[0] == "op" and len(it) == 2 else it
                 for it in self._node(n)]
        members = _members(n)
        # its partial sums first, then what its kernels read: a fused add + add of q, k and v's
        # gradients reads the first add's sum in the node, and left open that sum had drawn a
        # second all-reduce at the segment's end (2 a layer at tp 2 where eager runs 1)
        self.open.update(self.partial.intersection(members))
        self.open.difference_update(d for m in members for d in self.m_deps.get(m, ()))
        # only a GEMM (the weight gradient) or a sum (the bias's): HF's key projection also
        # owns the clone that makes its output gradient contiguous, on the data path, and
        # Inductor's chains fuse the bias sum with the layer norm's backward; held back, the
        # key's data gradient flushed them with the value's weight gradient before the all-reduce
        wgrad = isinstance(n.op, ops.Gemm) or n.aten.startswith("aten.sum")
        if (n.phase != "fwd" and self.tp > 1 and self.state.get(n.id) != "P" and wgrad
                and self.role.get(n.module, (None,))[0] == "col"):
            self.deferred += items  # a weight or bias gradient: see _node
            self.deferred_ids.add(n.id)
            return first
        return first + items

    def end_segment(self) -> list:
        """Items that close a layer's (or the head's) segment: the all-reduce of a partial input
        gradient whose reader lies in the next segment, beside the weight gradients held back
        for it, else those weight gradients alone. Megatron reduces the input gradient inside
        the layer whose linear made it. In a post-LN model (BERT) the reader of a layer's q, k, v
        input gradient is the next layer's output layer norm (backward order): flushed without
        the all-reduce, the held gradients had left it synchronous, 12 of bert-base's 25
        backward all-reduces at tp 2."""
        if not self.open:
            return self.take_deferred()
        nbytes = max(self.m_bytes[d] for d in self.open)
        self.partial.difference_update(self.open)
        self.open = set()
        held = self.take_deferred()
        return [("comm", "allreduce", nbytes, len(held))] + held

    def take_deferred(self) -> list:
        """The held-back weight-gradient items, to run now."""
        out, self.deferred = self.deferred, []
        self.deferred_ids = set()
        return out

    def _node(self, n) -> list:
        tp, op = self.tp, n.op
        if tp == 1:
            return [("op", self._padded(n, op))]
        items: list = []
        members = _members(n)
        # the partial sums its kernels read, and those of its kernels that add them up (q, k
        # and v's input gradients): still partial, unless another of its kernels reads them
        partial, summing, reduce = set(), set(), False
        for m in members:
            read = [d for d in self.m_deps.get(m, ()) if d in self.partial or d in summing]
            if read and self.m_add.get(m):
                summing.add(m)
            elif read:
                reduce = True
            partial.update(d for d in read if d not in summing)
        if reduce:
            # a partial sum (column-parallel input gradients) is read: all-reduce it first, once
            nbytes = max(self.m_bytes[d] for d in partial)
            # Megatron's async all-reduce (kit.parallel.gpt._column_backward): the weight
            # gradients held back (node) run beside it and the compute stream waits only for its
            # excess (Coster.add). Synchronous, it had put gpt2-large at tp 4 (bf16, micro-batch
            # 4, dgx-a100) at 18.98 ms of TP communication on the critical path, 13.0 analytic
            held = self.take_deferred()
            items += [("comm", "allreduce", nbytes, len(held))] + held
            self.partial.difference_update(partial)
            summing = set()
        self.partial.update(summing)
        ins = any(self.state.get(d) == "S" for d in n.deps)
        out = "R"
        if summing:
            out = "P"  # summing partial gradients (q, k and v's): still partial
        elif isinstance(op, ops.Gemm) and op.b == 1:
            op, out, comm = self._linear(n, op, ins)
            items.append(("op", op))
            if comm:
                items.append(("comm", "allreduce", op.m * op.n * ops.dtype_bytes(op.dtype)))
            if out == "P":
                self.partial.update(members)
            if out == "S":
                self.sharded.update(members)
            self.state[n.id] = out
            return items
        if isinstance(op, ops.EmbeddingBag) and self.vocab and op.rows == self.vocab:
            op = replace(op, rows=self.vocab_rank)  # vocab-parallel lookup + all-reduce
            items += [("op", op), ("comm", "allreduce", n.out_bytes)]
            self.state[n.id] = "R"
            return items
        if ins or (isinstance(op, ops.Gemm) and n.module in self.bmm_modules):
            if isinstance(op, ops.Gemm) and n.phase == "fwd":
                self.bmm_modules.add(n.module)
            # a compiled chain: the members that read a sharded tensor (or a member that did)
            flags = []
            for m in members:
                flags.append(any(d in self.sharded for d in self.m_deps.get(m, ())))
                if flags[-1]:
                    self.sharded.add(m)
            if not any(flags):  # the node's own state says sharded: all of it, as before
                self.sharded.update(members)
            op, out = (_shard_chain(op, flags, tp, self._chain_frac(members)) if len(members) > 1
                       else _shard(op, tp)), "S"
        self.state[n.id] = out
        return items + [("op", op)]

    def _chain_frac(self, members) -> float | None:
        """A compiled chain's bytes on this rank over its bytes whole, by the fusion rule on its
        members' tensor records with every tensor a sharded kernel wrote cut to 1/tp (None
        without records). Scaling the copy by its members' eager bytes instead had missed by up
        to 18% at tp 4 (a 256-wide GPT-2's [sum + layer norm backward + add + dropout backward]:
        0.896 MB for 0.758) and the replicated inputs of a chain read whole (Llama's rotary
        cos and sin: 0.139 MB for 0.164)."""
        group = [self.kernel.get(m) for m in members]
        if not self.readers or any(k is None or not k.writes for k in group):
            return None
        tp = self.tp

        def cut(r, at):
            made = [w for w in self.writers.get(r.tensor, ()) if w <= at]
            if not made or made[-1] not in self.sharded:
                return r
            return Region(r.tensor, r.offset // tp, -(-r.nbytes // tp), -(-r.storage // tp))

        mine = [replace(k, reads=tuple(cut(r, m) for r in k.reads),
                        writes=tuple(cut(w, m) for w in k.writes)) for k, m in zip(group, members)]
        whole = chain_bytes(group, self.readers, self.returned)
        return chain_bytes(mine, self.readers, self.returned) / whole

    def _linear(self, n, op, ins: bool):
        """(op on this rank, its output state, all-reduce after?) for a linear GEMM."""
        tp, where = self.tp, n.module or n.aten
        if n.phase == "fwd":
            if ins:  # row-parallel: K split, all-reduce of the output
                self.role[n.module] = ("row", op.k)
                return _split(op, "k", tp, f"the reduction of row-parallel {where}"), "R", True
            self.role[n.module] = ("col", op.n)  # column-parallel: N split
            if self.vocab and op.n == self.vocab:
                return self._vocab_split(op, "n"), "S", False
            return _split(op, "n", tp, f"the output width of column-parallel {where}"), "S", False
        kind, value = self.role.get(n.module, (None, None))
        vocab = bool(self.vocab) and value == self.vocab

        def split(o, attr):
            return self._vocab_split(o, attr) if vocab else _split(o, attr, tp, f"{where} backward")

        if kind == "col" and op.k == value:  # data gradient: contracts over N -> partial sum
            return split(op, "k"), "P", False
        if kind in ("col", "row"):
            attr = next((a for a in ("n", "m", "k") if getattr(op, a) == value), None)
            return (split(op, attr) if attr else op), "S", False
        return op, ("S" if ins else "R"), False


def _blocks(items: list, label: str) -> list[Block]:
    from kit.workload.kernels import leaf_ops

    out: list[Block] = []
    for i, it in enumerate(items):
        if it[0] == "comm":
            # an async collective runs beside its op items' kernels (each leaf op one)
            beside = sum(len(leaf_ops(x[1])) for x in items[i + 1:i + 1 + it[3]]) if len(it) > 3 else 0
            out.append(Block(f"{label} tp {it[1]}", comm=(it[1], float(it[2]), "tp"), overlap=beside))
            continue
        if not out or out[-1].comm is not None:
            out.append(Block(label))
        leaves = leaf_ops(it[1])
        kernels = (it[2] if len(it) > 2 else 1) / len(leaves)  # the node's kernels, spread
        for leaf, scale in leaves:
            out[-1].ops.append(leaf)
            out[-1].bwd_factor.append(scale)
            out[-1].kernels.append(kernels)
    return out


def shard_graph(graph, tp: int, spec: GPTSpec | None = None) -> GraphSource:
    """Split a captured (free-op-less) training graph into per-layer TP-sharded blocks."""
    layers = sorted({n.layer for n in graph.nodes if n.layer is not None})
    if not layers:
        raise KitError(f"model {graph.model!r}: the captured graph has no numbered layers to "
                       "pipeline (expected module paths like 'h.3' or 'layers.3')")
    cfg = graph.meta.get("config") or {}
    vocab = cfg.get("vocab_size") or (spec.vocab if spec else None)
    heads = cfg.get("n_head") or cfg.get("num_attention_heads") or (spec.heads if spec else None)
    # a Llama-family key left out is HF's default, as the captured module was built (a Mistral
    # dict's 8 KV heads, not one a query head: --tp 16 over 32 heads had passed with 8 KV heads)
    kv = hf_value(cfg, "num_key_value_heads") or heads
    if heads and (heads % tp or kv % tp):
        raise KitError(f"--tp {tp} must divide the attention heads ({heads}, key/value {kv}) of "
                       f"{graph.model}")
    moe = next((n.module for n in graph.nodes if n.aten == "aten._grouped_mm.default"
                or ".experts" in (n.module or "")), None)
    if tp > 1 and moe is not None:  # a router and expert GEMMs are not Megatron's linear pairs
        raise KitError(f"model {graph.model!r} has mixture-of-experts layers ({moe}); tensor "
                       "parallelism over its captured graph is not modelled (Megatron's column/row "
                       "pairs do not hold for a router and its experts): use --tp 1, or the "
                       "analytic layer (a moe: model) for expert parallelism")
    sh = _Sharder(graph, tp, vocab)
    fwd_first = min((n.id for n in graph.nodes if n.phase == "fwd" and n.layer is not None), default=0)
    bwd_first = min((n.id for n in graph.nodes if n.phase == "bwd" and n.layer is not None), default=0)
    seg: dict = {}
    head_tokens, head_vocab, has_loss = 0, 0, False
    last_key = None
    for n in graph.nodes:
        if n.phase not in ("fwd", "bwd") or n.op is None:
            continue
        if n.layer is not None:
            key = (n.layer, n.phase)
        elif n.phase == "fwd":
            key = ("emb" if n.id < fwd_first else "head", "fwd")
        else:
            key = ("head" if n.id < bwd_first else "emb", "bwd")
        if key != last_key and (sh.deferred or sh.open):  # see _Sharder.end_segment
            seg[last_key].extend(sh.end_segment())
        last_key = key
        # an op item carries its node's kernel launches (a layer-norm backward is two): node
        seg.setdefault(key, []).extend(sh.node(n))
        if key == ("head", "fwd"):
            has_loss = has_loss or "softmax" in n.aten or "cross_entropy" in n.aten
            if isinstance(n.op, ops.Gemm) and vocab and n.op.n == vocab:
                # the loss runs over the logits the head GEMM writes, padded at every TP
                # (_padded): at TP 1 it had stayed 50,257 wide beside gpt2's 50,304-wide logits
                head_tokens, head_vocab = n.op.m, sh.vocab_rank
    if sh.deferred or sh.open:
        seg.setdefault(last_key, []).extend(sh.end_segment())
    if head_tokens and not has_loss:  # the zoo captures up to the logits: add Megatron's loss
        ce = ops.Softmax(head_tokens, head_vocab, "fp32")
        seg.setdefault(("head", "fwd"), []).append(("op", ce))
        seg.setdefault(("head", "bwd"), []).insert(0, ("op", ops.Elementwise("mul", head_tokens * head_vocab,
                                                                            "fp32", inputs=2)))
        if tp > 1:
            seg[("head", "fwd")].append(("comm", "allreduce", 3 * head_tokens * 4))
    src = GraphSource(model=graph.model, nodes=len(graph.nodes))
    for layer in layers:
        fwd = _blocks(seg.get((layer, "fwd"), []), "layer")
        bwd = _blocks(seg.get((layer, "bwd"), []), "layer bwd")
        sig = _signature(fwd, bwd)
        src.layer_blocks.setdefault(sig, (fwd, bwd))
        src.layer_keys.append(sig)
    src.embedding = (_blocks(seg.get(("emb", "fwd"), []), "embedding"),
                     _blocks(seg.get(("emb", "bwd"), []), "embedding bwd"))
    src.head = (_blocks(seg.get(("head", "fwd"), []), "lm head"),
                _blocks(seg.get(("head", "bwd"), []), "lm head bwd"))
    return src


def _signature(fwd, bwd) -> tuple:
    return tuple((tuple(b.ops), tuple(b.bwd_factor), tuple(b.kernels), b.comm, b.overlap)
                 for b in list(fwd) + list(bwd))


def graph_source(spec: GPTSpec, model, layout, fusion: str = "eager") -> GraphSource:
    """Capture `model` (a zoo name or HF-style config) at the layout's micro-batch and shard it."""
    if layout.sequence_parallel or layout.ep > 1:
        raise KitError("the op-graph path shards for TP and PP; sequence parallelism and expert "
                       "parallelism use the analytic GPT layer (graph=False)")
    graph = capture_model(model, layout.micro_batch, spec.seq, layout.dtype, fusion)
    src = shard_graph(graph, layout.tp, spec)
    if len(src.layer_keys) != spec.layers:
        raise KitError(f"model {spec.name!r}: captured {len(src.layer_keys)} layers, its config "
                       f"says {spec.layers}")
    return src
