"""The kernels one layer of a GPT-style transformer (kit.parallel.gpt_spec's GPTSpec) runs on one
tensor-parallel rank.

A layer (Megatron-LM, Shoeybi et al. 2019) on TP rank of t, for a micro-batch of b sequences of
s tokens, hidden h, a heads, FFN width f:

    attention block: LN (RMSNorm without biases: norm), QKV = x·W[h, 3h/t], rotary positions on
                     q and k (_rope; Qwen3's per-head q/k norms first), core attention (a/t heads),
                     out = ·W[h/t, h],
                     TP all-reduce of [b·s, h] (sequence parallel: all-gather before LN and
                     reduce-scatter after, Korthikanti et al. 2022), dropout + residual
    MLP block:       LN, x·W[h, f/t], GeLU, ·W[f/t, h], TP all-reduce, dropout + residual

Backward: each GEMM becomes two (data grad, weight grad); memory-bound kernels move about twice
their forward bytes; flash attention's backward costs ATTENTION_BWD_SCALE (2.8) times its forward
(kit.workload.kernels). The TP collectives of the backward are Megatron's: a column-parallel
linear (QKV, the first MLP GEMM, the logits) reduces its input gradient asynchronously beside its
weight-gradient GEMM and, with sequence parallelism, first re-gathers its input beside the
data-gradient GEMM (_column_backward); a row-parallel all-reduce has an identity backward, a
sequence-parallel reduce-scatter an all-gather at the region boundary (layer_backward).
A MoE layer swaps the MLP for a router and top-k experts sharded over EP ranks, with an
all-to-all to dispatch tokens and one to combine them (Lepikhin et al. 2020); at TP > 1 each rank
dispatches its sequence shard's tokens and a TP all-gather / reduce-scatter brings the tp shards
to the experts and back (Megatron-core 0.9's MoEAlltoAllTokenDispatcher, _moe_blocks).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kit import ops
from kit.errors import KitError
# re-exported: the kit, tests and notebooks import them from here
from kit.parallel.gpt_spec import GPTSpec, parse_model  # noqa: F401
from kit.parallel.vocab_kernels import (OutputMask, TokenKernel, cross_entropy_backward_kernels,
                                        cross_entropy_forward_kernels, cross_entropy_loss_kernels,
                                        embedding_output_mask, id_mask_kernels,
                                        loss_transpose_kernels)
from kit.workload.kernels import (ATTENTION_BWD_SCALE, Derived, embedding_dense_backward, fill,
                                  leaf_ops, row_reduction)

BWD_FACTOR = {"attention": ATTENTION_BWD_SCALE, "default": 2.0}
VOCAB_MULTIPLE = 128  # Megatron-LM --make-vocab-size-divisible-by (default)


def padded_vocab(vocab: int, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of 128 x TP (_vocab_size_with_padding), so
    each rank's embedding and logits are a multiple of 128 wide."""
    m = VOCAB_MULTIPLE * tp
    return -(-vocab // m) * m


def vocab_per_rank(vocab: int, tp: int) -> int:
    """Rows of the padded vocabulary (padded_vocab) one TP rank holds: its embedding shard, its
    logits' width and its share of the loss."""
    return padded_vocab(vocab, tp) // tp


# The longest key sequence Megatron's fused scale-mask-softmax takes. The kit models megatron-core
# (its layer, loss and embedding are checked against 0.16.1): FusedScaleMaskSoftmax.
# is_kernel_available has 16 < sk <= 4096 in megatron-core 0.16.1 (fusions/fused_softmax.py line
# 256) as in 0.5.0 (line 156). The legacy megatron/model/fused_softmax.py of Megatron-LM, whose
# 16384 the kit had used, is not the Megatron it models; vTrain's rows (seq 1024) sit under both.
FUSED_SOFTMAX_MAX_SEQ = 4096


def fused_softmax_available(b: int, heads_rank: int, seq: int, causal: bool = True) -> bool:
    """Megatron's fused scale-mask-softmax kernel runs only when
    FusedScaleMaskSoftmax.is_kernel_available holds (megatron-core 0.16.1
    fusions/fused_softmax.py lines 238-268): fp16/bf16 input, 16 < sk <= FUSED_SOFTMAX_MAX_SEQ
    (4096), sq and sk multiples of 4, the attention batches b·(heads/tp) a multiple of 4
    (lines 254-260), and then, with the kernel's batches per block (get_batch_per_block: 4 for
    sk > 128, else 8), a causal mask (GPT) needs the attention batches a multiple of it (lines
    264-266), any other mask (BERT's padding mask, GPTSpec.causal False) sq (lines 267-269).
    Self-attention here: sq = sk = seq. Otherwise it falls back to PyTorch
    (_attention_softmax). BERT had been held to the causal rule."""
    attn_batches = b * heads_rank
    per_block = 4 if seq > 128 else 8
    if not (16 < seq <= FUSED_SOFTMAX_MAX_SEQ and seq % 4 == 0 and attn_batches % 4 == 0):
        return False
    return (attn_batches if causal else seq) % per_block == 0


@dataclass(frozen=True)
class ForwardOnly(ops.Elementwise):
    """A forward kernel with no backward kernel of its own (backward_of skips it): autograd
    passes its gradient through as a view, or it builds a tensor that needs none."""

    no_backward = True


@dataclass(frozen=True)
class ContextCopy(ForwardOnly):
    """The unfused attention's context [b, np, sq, hn] -> [sq, b, np, hn]
    `permute(2, 0, 1, 3).contiguous()` (megatron-core 0.16.1
    transformer/dot_product_attention.py line 245): one copy of tokens x hidden/tp, the last
    kernel of the core attention (so selective recompute reruns it: kit.parallel.costs
    _attention_core). Its backward has no kernel: autograd runs CloneBackward0 (the gradient
    as it is), PermuteBackward0 (a view) and ViewBackward0, whose reshape of the permuted
    gradient back to [b·np, sq, hn] merges b and np without a copy (stride of b = np x stride
    of np), and the context bmm's backward takes that strided gradient (torch 2.13's CPU profile
    of the same chain shows no copy_ in the backward)."""


def _context_copy(b: int, heads_rank: int, s: int, hd: int, dtype: str) -> list:
    """The ContextCopy, or none where the permuted context is already contiguous and
    .contiguous() returns it: sq = 1, or b = np = 1 (the permute moves sq alone ahead of b and
    np), as torch.Tensor.is_contiguous holds for [b, np, sq, hn].permute(2, 0, 1, 3)."""
    if s == 1 or b * heads_rank == 1:
        return []
    return [ContextCopy("copy", b * heads_rank * s * hd, dtype, inputs=1)]


@dataclass(frozen=True)
class KVRepeat(ops.Elementwise):
    """Grouped-query attention in the unfused path: megatron-core 0.16.1 DotProductAttention
    repeats the key and the value heads to the query heads, key.repeat_interleave(np // ng,
    dim=2) and the same for value, where np // ng > 1 (transformer/dot_product_attention.py
    lines 169-175). torch 2.13 runs an int repeat_interleave as unsqueeze, expand, clone,
    flatten: one copy that reads the ng heads and writes the np (numel: the output's elements,
    repeats: np // ng). Its backward (ExpandBackward0, CloneBackward0) is one sum over the
    repeats: reads the np heads' gradient, writes the ng heads', the same bytes (torch 2.13's
    CPU profile of the chain: aten::copy_ forward, aten::sum backward)."""

    repeats: int = 1
    bwd_factor = 1.0

    @property
    def bytes(self) -> float:
        return float(ops.dtype_bytes(self.dtype) * (self.numel + self.numel // self.repeats))


def _kv_repeat(b: int, heads_rank: int, kv_rank: int, s: int, hd: int, dtype: str) -> list:
    """The two KVRepeat copies (key, value) of a rank with heads_rank query heads and kv_rank
    key/value heads, none without grouping (heads_rank == kv_rank: the repeat is skipped)."""
    r = heads_rank // kv_rank
    if r <= 1:
        return []
    return [KVRepeat("copy", s * b * heads_rank * hd, dtype, inputs=1, repeats=r)] * 2


@dataclass(frozen=True)
class FallbackCast(ops.Elementwise):
    """A cast of the torch softmax fallback (.float() in, .half()/.bfloat16() out): its backward
    (ToCopyBackward0) is one cast the other way, the same bytes."""

    bwd_factor = 1.0


@dataclass(frozen=True)
class FallbackMaskFill(ops.Elementwise):
    """attention_mask_func's in-place masked_fill_ of the fp32 scores (megatron-core 0.16.1
    transformer/utils.py line 50): reads and writes them (the data loader's [b, 1, sq, sk] bool
    mask it broadcasts over the heads, 1/(8 x heads/tp) of those bytes, not counted). Its backward, MaskedFillBackward0, is grad.masked_fill(mask, 0): torch's
    out-of-place masked_fill is a clone and a masked_fill_ (torch 2.13's CPU profile:
    aten::masked_fill -> aten::clone, aten::masked_fill_), two kernels of the forward's bytes."""

    bwd_kernels = 2


@dataclass(frozen=True)
class FallbackSoftmax(ops.Softmax):
    """torch.softmax of the fallback: its backward, _softmax_backward_data, reads the output and
    its gradient and writes the input's: 1.5 x the forward's bytes (read one, write one)."""

    bwd_factor = 1.5


@dataclass(frozen=True)
class FusedSoftmax(FallbackSoftmax):
    """Megatron's fused scale-mask-softmax kernel (ScaledUpperTriangMaskedSoftmax, causal;
    ScaledMaskedSoftmax, a padding mask). Its backward is one kernel of the same byte count as
    the fallback's: megatron-core 0.16.1 fusions/fused_softmax.py saves only softmax_results
    (lines 36, 86) and calls scaled_upper_triang_masked_softmax_cuda.backward(output_grads,
    softmax_results, scale) (line 53) / scaled_masked_softmax_cuda.backward (line 104): read the
    output gradient and the output, write the input gradient, 3 passes of n elements against
    the forward's 2 (read the scores, write the output): 1.5 x the forward's bytes. It had been
    priced at BWD_FACTOR["default"], 2 x."""


def _attention_softmax(b: int, heads_rank: int, s: int, dtype: str, causal: bool = True) -> list:
    """The attention-score softmax kernels of the unfused (bmm) attention path, as megatron-core
    0.16.1 runs them with its defaults: apply_query_key_layer_scaling False
    (transformer/transformer_config.py line 339), so DotProductAttention hands
    FusedScaleMaskSoftmax scale None (dot_product_attention.py lines 83-107; the 1/sqrt(hn) is
    baddbmm's alpha), and attention_softmax_in_fp32 True (line 343). fp16/bf16 where the fused
    kernel applies (fused_softmax_available): that one kernel. Otherwise forward_torch_softmax
    (fused_softmax.py lines 313-340): in fp16/bf16 cast the scores to fp32, mask them
    in place, softmax, cast back, four kernels (no `input * scale`: scale is None); in fp32 the
    mask and the softmax, two. The mask is the one the model is handed: GPTDatasetConfig's
    create_attention_mask defaults to True (datasets/gpt_dataset.py line 37), so the data loader
    builds the causal [1, s, s] mask once a sample (lines 739-744, 776-778) and it reaches
    DotProductAttention not None; forward_torch_softmax builds get_default_causal_mask
    (transformer/utils.py lines 33-35) only where the mask is None (fused_softmax.py lines
    323-327: a data loader run with create_attention_mask off), which the kit does not model.
    BERT's padding mask comes from the model. The fallback had priced five kernels in
    fp16/bf16, a scale multiply among them (query-key layer scaling, off by default), and the
    softmax alone in fp32."""
    rows = b * heads_rank
    if dtype != "fp32" and fused_softmax_available(b, heads_rank, s, causal):
        return [FusedSoftmax(rows * s, s, dtype)]
    n = rows * s * s
    core = [FallbackMaskFill("where", n, "fp32", inputs=1), FallbackSoftmax(rows * s, s, "fp32")]
    if dtype == "fp32":
        return core
    return [FallbackCast("cast", n, dtype, inputs=2), *core, FallbackCast("cast", n, dtype, inputs=2)]


@dataclass
class Block:
    """Kernels that run back to back on the compute stream, or one collective."""

    label: str
    ops: list = field(default_factory=list)  # kit ops (compute)
    bwd_factor: list = field(default_factory=list)  # per op: time multiplier (1 for explicit ops)
    comm: tuple | None = None  # (kind, nbytes, group name) for a collective
    kernels: list = field(default_factory=list)  # per op: kernels it launches (empty: one each)
    # a collective issued asynchronously on the TP communicator's stream: it runs beside the
    # next `overlap` kernels (True: one; the weight-gradient GEMM after a grad_input reduction,
    # the data-gradient GEMM after sequence parallelism's re-gather; the captured graph's HF
    # q, k and v projections: their three wgrad GEMMs and bias sums, kit.parallel.opgraph) and the
    # kernel after them waits for it
    overlap: int = 0
    # forward: indices into ops of column-parallel linears, whose backward reduces the input
    # gradient over TP itself (layer_backward)
    column: set = field(default_factory=set)
    # forward collective whose backward is not its own: a row-parallel all-reduce's is the
    # identity, sequence parallelism's all-gather's is done by the column-parallel linear after it
    backward_in_linear: bool = False

    def kernel_counts(self) -> list:
        return self.kernels if self.kernels else [1.0] * len(self.ops)


def _gemm_bwd(g: ops.Gemm) -> list:
    if g.kind == "linear":
        return [ops.Gemm(m=g.m, n=g.k, k=g.n, dtype=g.dtype, kind="linear", shared_rhs=True),
                ops.Gemm(m=g.k, n=g.n, k=g.m, dtype=g.dtype, kind="linear", shared_rhs=True)]
    return [ops.Gemm(m=g.m, n=g.k, k=g.n, b=g.b, dtype=g.dtype),
            ops.Gemm(m=g.k, n=g.n, k=g.m, b=g.b, dtype=g.dtype)]


# the collective a forward collective's backward runs: sequence parallelism's all-gather (g) is
# a reduce-scatter backward and its reduce-scatter (g-bar) an all-gather (Korthikanti et al.,
# Megatron's _GatherFromSequenceParallelRegion / _ReduceScatterToSequenceParallelRegion); an
# all-reduce's backward is an all-reduce (f and g), an all-to-all's an all-to-all
BACKWARD_COMM = {"allgather": "reducescatter", "reducescatter": "allgather"}


@dataclass(frozen=True)
class RotaryEmbedding(ops.Elementwise):
    """The fused RoPE kernel (_rope): priced as an elementwise pass, but its backward is one
    kernel of the same bytes (TE's fused_rope_backward reads the output gradient, writes the
    input gradient, rotated back), not the two passes BWD_FACTOR gives other memory-bound ops."""

    bwd_factor = 1.0


def backward_of(block: Block) -> Block:
    comm = block.comm
    if comm is not None:
        comm = (BACKWARD_COMM.get(comm[0], comm[0]), *comm[1:])
    out = Block(block.label + " bwd", comm=comm)
    for op in reversed(block.ops):
        if getattr(op, "no_backward", False):  # ForwardOnly
            continue
        if isinstance(op, ops.Gemm):
            out.ops += _gemm_bwd(op)
            out.bwd_factor += [1.0, 1.0]
            out.kernels += [1.0, 1.0]
        else:
            out.ops.append(op)
            out.bwd_factor.append(getattr(op, "bwd_factor", None)
                                  or BWD_FACTOR.get(op.op_class, BWD_FACTOR["default"]))
            out.kernels.append(float(getattr(op, "bwd_kernels", 1)))
    return out


def _column_backward(op: ops.Gemm, sp: bool) -> list[Block]:
    """A column-parallel linear's backward as Megatron-LM runs it
    (tensor_parallel/layers.py, LinearWithGradAccumulationAndAsyncCommunication.backward, with
    CUDA_DEVICE_MAX_CONNECTIONS=1 so that the kernels start in issue order): the data gradient
    (dgrad) is a partial sum over the TP ranks; its all-reduce (sequence parallelism: its
    reduce-scatter to this rank's tokens) is issued asynchronously before the weight-gradient
    GEMM (wgrad) and runs beside it (Narayanan et al. SC'21 sec. 4's f operator). With sequence
    parallelism the forward's all-gathered input was not saved (Korthikanti et al. 2022 keep
    only this rank's sequence shard), so the backward first all-gathers it again, asynchronously,
    beside the dgrad GEMM, which does not need it; the wgrad GEMM does."""
    dgrad, wgrad = _gemm_bwd(op)
    nbytes = op.m * op.k * ops.dtype_bytes(op.dtype)  # the whole [tokens, in] input (gradient)
    out = []
    if sp:
        out.append(Block("sp re-gather input", comm=("allgather", nbytes, "tp"), overlap=True))
    out += [Block("dgrad", [dgrad], [1.0]),
            Block("tp " + ("reducescatter" if sp else "allreduce") + " grad input",
                  comm=("reducescatter" if sp else "allreduce", nbytes, "tp"), overlap=True),
            Block("wgrad", [wgrad], [1.0])]
    return out


def layer_backward(fwd: list[Block], tp: int, sp: bool) -> list[Block]:
    """The backward of a layer's forward blocks (layer_forward), in order. Each block mirrors
    (backward_of), except at TP > 1 Megatron's column-parallel linears (Block.column), whose
    backward reduces the input gradient itself (_column_backward), and the forward collectives
    that this leaves without a backward of their own (Block.backward_in_linear). Mirroring every
    collective had put the all-reduces at the row-parallel outputs, where the backward is the
    identity, serialised on the compute stream, and had left out sequence parallelism's
    re-gather of the input."""
    out: list[Block] = []
    for blk in reversed(fwd):
        if blk.comm is not None:
            if not blk.backward_in_linear:
                out.append(backward_of(blk))
            continue
        if not blk.column or tp == 1:
            out.append(backward_of(blk))
            continue
        # split at the column-parallel linears (backward_of costs each op by its class, so the
        # forward's factors and kernel counts need not follow); each part's backward in reverse
        parts, cur = [], Block(blk.label)
        for i, op in enumerate(blk.ops):
            if i in blk.column:
                if cur.ops:
                    parts.append(cur)
                parts.append(op)
                cur = Block(blk.label)
            else:
                cur.ops.append(op)
        if cur.ops:
            parts.append(cur)
        for part in reversed(parts):
            out += _column_backward(part, sp) if isinstance(part, ops.Gemm) else [backward_of(part)]
    return _merge(out)


def layer_forward(spec: GPTSpec, b: int, tp: int, ep: int, sp: bool, dtype: str,
                  layer: int = 0) -> list[Block]:
    """The forward blocks of one layer on one TP rank, in order (compute, comm, compute, ...)."""
    s, h, a, hd, f = spec.seq, spec.hidden, spec.heads, spec.head_dim, spec.f
    if a % tp or f % tp or (spec.kv_heads or a) % tp:
        raise KitError(f"--tp {tp} must divide heads {a}" + (f", key/value heads {spec.kv_heads}"
                       if spec.kv_heads else "") + f" and ffn {f}")
    if spec.is_moe(layer) and tp > 1 and not sp:
        # Megatron-core 0.9 moe_layer.py lines 103-112 (MoELayer.forward) raises
        # "performance may degrade if MoE and tensor parallelism are enabled without also
        # enabling sequence parallelism" in training: its dispatcher routes each rank's shard
        raise KitError(f"--tp {tp} on MoE layers needs --sequence-parallel (sequence_parallel): "
                       "Megatron-core refuses MoE with tensor parallelism without it")
    kv = (spec.kv_heads or a) * hd
    tok = b * s
    act = tok * h * ops.dtype_bytes(dtype)
    ln_rows = tok // tp if sp and tok % tp == 0 else tok
    gather = ("allgather", act, "tp") if sp else None
    reduce = ("reducescatter", act, "tp") if sp else ("allreduce", act, "tp")
    blocks: list[Block] = []
    if gather and tp > 1:
        blocks.append(Block("ln1", [norm(spec, ln_rows, dtype)]))
        blocks.append(Block("sp all-gather", comm=gather, backward_in_linear=True))
        attn = Block("attention")
    else:
        attn = Block("attention", [norm(spec, ln_rows, dtype)])
    attn.column.add(len(attn.ops))  # QKV
    attn.ops.append(ops.linear(tok, h, (h + 2 * kv) // tp, dtype))
    heads = a // tp
    if spec.qk_norm:  # one norm kernel over this rank's query heads, one over its key heads
        attn.ops += [norm(spec, tok * heads, dtype, hd), norm(spec, tok * kv // hd // tp, dtype, hd)]
    attn.ops += _rope(spec, tok, h // tp, kv // tp, dtype)
    # unfused, Megatron-core's DotProductAttention computes every score and masks the window
    # after (fused_softmax's get_sliding_window_causal_mask): no work skipped, priced as before
    if spec.attention == "flash":
        # a windowed layer (GPTSpec.window_of) as Megatron-core hands Transformer Engine its
        # window_size: flash attention (and cuDNN's fused attention) skip the key blocks outside
        # the band; at seq <= window the band is the causal triangle, priced as that op
        window = spec.window_of(layer)  # BERT's attention is not causal (GPTSpec.causal)
        attn.ops.append(ops.Attention(b, heads, s, s, hd, dtype, causal=spec.causal,
                                      window=window if window < s else 0))
    else:
        attn.ops += [*_kv_repeat(b, heads, kv // hd // tp, s, hd, dtype),
                     ops.Gemm(m=s, n=s, k=hd, b=b * heads, dtype=dtype),
                     *_attention_softmax(b, heads, s, dtype, spec.causal),
                     *_dropout(spec, b * heads * s * s, dtype),
                     ops.Gemm(m=s, n=hd, k=s, b=b * heads, dtype=dtype),
                     *_context_copy(b, heads, s, hd, dtype)]
    attn.ops.append(ops.linear(tok, h // tp, h, dtype))
    blocks.append(attn)
    if tp > 1:  # g: a plain all-reduce's backward is the identity
        blocks.append(Block("tp " + reduce[0], comm=reduce, backward_in_linear=not sp))
    res_numel = ln_rows * h
    mlp = Block("mlp", [*_dropout(spec, res_numel, dtype), ops.Elementwise("add", res_numel, dtype),
                        norm(spec, ln_rows, dtype)])
    if spec.is_moe(layer):
        blocks += _moe_blocks(spec, mlp, ln_rows, tp, ep, dtype)
    else:
        if gather and tp > 1:
            blocks.append(mlp)
            blocks.append(Block("sp all-gather", comm=gather, backward_in_linear=True))
            mlp = Block("mlp")
        mlp.column.add(len(mlp.ops))  # the first MLP linear (SwiGLU: gate and up as one GEMM)
        mlp.ops += _mlp_ops(spec, tok, tp, dtype)
        blocks.append(mlp)
        if tp > 1:
            blocks.append(Block("tp " + reduce[0], comm=reduce, backward_in_linear=not sp))
    blocks.append(Block("residual", [*_dropout(spec, res_numel, dtype),
                                     ops.Elementwise("add", res_numel, dtype)]))
    return _merge(blocks)


def _moe_blocks(spec: GPTSpec, pre: Block, rows: int, tp: int, ep: int, dtype: str) -> list[Block]:
    """A MoE layer's MLP as Megatron-core 0.9 runs it (MoEAlltoAllTokenDispatcher,
    transformer/moe/token_dispatcher.py), from `pre` (the residual and the norm) on this rank's
    `rows` tokens, its 1/tp sequence shard (MoE at tp > 1 needs sequence parallelism,
    moe_layer.py's forward). The router routes the shard; the shard's routed rows (its own
    capacity buffers with a capacity factor: topk_softmax_with_capacity counts the shard's
    tokens) go over the EP group's all-to-all (token_permutation); an all-gather over the TP
    group (gather_from_sequence_parallel_region) collects the tp shards' rows, on which each
    expert runs with its weights split over tp (moe_extended_tp False, model_parallel_config.py
    line 45: experts.py's GroupedMLP shards fc1 and fc2 over the TP world size, as
    memory.layer_rank_params holds them); on the way back a reduce-scatter over TP
    (reduce_scatter_to_sequence_parallel_region, which also sums fc2's partial outputs) and the
    combine all-to-all return the shard, unpermuted and weighted by the router's probabilities.
    Each tp rank's all-to-all had sent the whole micro-batch's routed rows (tp times the bytes:
    Mixtral-8x7b at tp 8, seq 4096, bf16, 4096 x 2 x 4096 x 2 = 128 MiB, not 16 MiB) after an
    all-gather of the tokens and before a reduce-scatter of them, tokens x hidden each, that
    Megatron-core does not run."""
    h, nbytes = spec.hidden, ops.dtype_bytes(dtype)
    pre.ops.append(ops.linear(rows, h, spec.experts, dtype))  # the router
    out = [pre]
    routed = spec.routed_rows(rows)  # the shard's rows x topk, or its experts' capacity buffers
    if ep > 1:
        out.append(Block("moe dispatch all-to-all", comm=("alltoall", routed * h * nbytes, "ep")))
    if tp > 1:
        out.append(Block("moe tp all-gather", comm=("allgather", tp * routed * h * nbytes, "tp")))
    out.append(Block("experts", _mlp_ops(spec, tp * routed, tp, dtype)))
    if tp > 1:
        out.append(Block("moe tp reducescatter", comm=("reducescatter", tp * routed * h * nbytes, "tp")))
    if ep > 1:
        out.append(Block("moe combine all-to-all", comm=("alltoall", routed * h * nbytes, "ep")))
    out.append(Block("moe out", [ops.Elementwise("mul", rows * h, dtype)]))
    return out


def norm(spec: GPTSpec, rows: int, dtype: str, cols: int | None = None):
    """A layer's (or the final) norm as the model runs it: LayerNorm, or RMSNorm where the spec
    has no biases (GPTSpec.bias: Llama, Mistral, Mixtral; Megatron's --normalization RMSNorm, TE's
    one rmsnorm kernel). The kit had run LayerNorm for every model, while GPTSpec.norm_params
    already counted RMSNorm's h weights alone for these. cols: the width normed (hidden; a head's
    for the q/k norms, which Megatron-core builds with the same --normalization)."""
    cols = cols or spec.hidden
    return ops.LayerNorm(rows, cols, dtype) if spec.bias else ops.RMSNorm(rows, cols, dtype)


def _rope(spec: GPTSpec, tokens: int, q_width: int, k_width: int, dtype: str) -> list:
    """Rotary positions on this rank's queries and keys (GPTSpec.rope): Megatron-core's
    apply_rotary_pos_emb, fused by default (--no-rope-fusion turns it off; TE's
    fused_apply_rotary_pos_emb), one kernel each for q and k that reads the tensor and writes it
    rotated (the cos/sin table is tokens x head_dim, small beside it). The layer had run none:
    Llama-3-8B at 2048 tokens rotates 8.4M query and 2.1M key values a layer, 4 kernels with
    the backward's. Costed as an elementwise pass of one input, once each way (RotaryEmbedding)."""
    if not spec.rope:
        return []
    return [RotaryEmbedding("mul", tokens * q_width, dtype, inputs=1),
            RotaryEmbedding("mul", tokens * k_width, dtype, inputs=1)]


def _dropout(spec: GPTSpec, numel: int, dtype: str) -> list:
    """The dropout kernel, or none at GPTSpec.dropout 0: torch's dropout then returns its input
    (at::dropout), so Megatron's bias-dropout-add is the add alone."""
    return [ops.Dropout(numel, dtype, spec.dropout)] if spec.dropout > 0 else []


def _mlp_ops(spec: GPTSpec, tokens: int, tp: int, dtype: str) -> list:
    """One MLP (or expert) on `tokens` rows, column- then row-parallel over tp ranks. SwiGLU runs
    the gate and up projections as one GEMM of width 2f, then silu(gate)·up, then down."""
    h, f = spec.hidden, spec.f // tp
    if spec.gated:
        return [ops.linear(tokens, h, 2 * f, dtype), ops.Elementwise("silu", tokens * f, dtype),
                ops.Elementwise("mul", tokens * f, dtype), ops.linear(tokens, f, h, dtype)]
    return [ops.linear(tokens, h, f, dtype), ops.Elementwise("gelu", tokens * f, dtype),
            ops.linear(tokens, f, h, dtype)]


def _merge(blocks: list[Block]) -> list[Block]:
    out: list[Block] = []
    for blk in blocks:
        if out and blk.comm is None and out[-1].comm is None:
            if blk.kernels or out[-1].kernels:
                out[-1].kernels = out[-1].kernel_counts() + blk.kernel_counts()
            out[-1].column |= {i + len(out[-1].ops) for i in blk.column}
            out[-1].ops += blk.ops
            out[-1].bwd_factor += blk.bwd_factor
        else:
            out.append(blk)
    return out


@dataclass(frozen=True)
class TransposeCopy(ops.Elementwise):
    """LanguageModelEmbedding's [b, s, h] -> [s, b, h] .contiguous() (megatron-core 0.16.1
    models/common/embeddings/language_model_embedding.py lines 118-120; VocabParallelEmbedding
    layers.py lines 292-294 where it reduce-scatters): one copy at micro-batch > 1, none at 1
    (transposing a size-1 dimension leaves the tensor contiguous). No backward kernel of its own:
    autograd hands the tables the gradient transposed back as a view, and each table's
    embedding_dense_backward makes it contiguous first, one copy each (embedding_backward)."""


@dataclass(frozen=True)
class ScatterClone(ops.Elementwise):
    """With sequence parallelism and a learned position table, megatron-core 0.16.1 does not
    reduce-scatter the embedding (reduce_scatter_embeddings needs no position table,
    language_model_embedding.py lines 48-53): it all-reduces it, adds the positions, transposes,
    takes this rank's sequence slice (scatter_to_sequence_parallel_region, a view) and clones it
    (clone_scatter_output_in_embedding, lines 133-141): this copy of [tokens/tp, hidden]. The
    slice's backward is an all-gather of the gradient (mappings.py
    _ScatterToSequenceParallelRegion.backward), the clone's passes the gradient through."""


def embedding_forward(spec: GPTSpec, b: int, tp: int, dtype: str, sp: bool = False) -> list[Block]:
    """Vocab-parallel lookup, position add, the [b, s, h] -> [s, b, h] transpose (TransposeCopy,
    micro-batch > 1) and dropout, with the TP reduction of the partial embeddings where
    megatron-core 0.16.1 runs it: VocabParallelEmbedding all-reduces its output (layers.py line
    300), before LanguageModelEmbedding adds the positions and transposes; with sequence
    parallelism and no position table (rotary) it transposes and reduce-scatters instead
    (reduce_scatter_embeddings), and the dropout runs on this rank's tokens only; with sequence
    parallelism and a learned table it all-reduces, then slices this rank's tokens and clones
    them (ScatterClone). A rotary model (GPTSpec.rope) has no position table and so no add
    (Megatron-core's LanguageModelEmbedding adds one only for learned absolute positions). At
    tp > 1 VocabParallelEmbedding.forward (layers.py lines 274-290) first masks the ids outside
    this rank's vocabulary (six per-token kernels, kit.parallel.vocab_kernels) and after the
    lookup zeroes their rows, a masked_fill_ over [tokens, hidden]; at tp 1 it looks the ids up
    as they are."""
    tok, h = b * spec.seq, spec.hidden
    v = vocab_per_rank(spec.vocab, tp)
    act = tok * h * ops.dtype_bytes(dtype)
    words = [ops.EmbeddingBag(tok, v, h, 1, dtype)]
    if tp > 1:  # megatron-core 0.16.1 layers.py lines 274-290: mask the ids, then the rows
        words = [*id_mask_kernels(tok), words[0], embedding_output_mask(tok, h, dtype)]
    if spec.token_types:  # BERT's token-type table, whole on every rank (megatron-core 0.16.1
        # language_model_embedding.py 76, 122-126): its lookup (and in embedding_backward its
        # table's gradient); its add to the embeddings is not priced
        words.append(ops.EmbeddingBag(tok, spec.token_types, h, 1, dtype))
    positions = [] if spec.rope else [ops.Elementwise("add", tok * h, dtype)]
    transpose = [TransposeCopy("copy", tok * h, dtype)] if b > 1 else []
    if tp == 1:
        return [Block("embedding", [*words, *positions, *transpose, *_dropout(spec, tok * h, dtype)])]
    rows = tok // tp if sp and tok % tp == 0 else tok
    if sp and spec.rope:
        drop = _dropout(spec, rows * h, dtype)
        return [Block("embedding", [*words, *transpose]),
                Block("embedding reduce-scatter", comm=("reducescatter", act, "tp")),
                *([Block("embedding dropout", drop)] if drop else [])]
    clone = [ScatterClone("copy", rows * h, dtype)] if sp else []
    tail = [*positions, *transpose, *clone, *_dropout(spec, rows * h, dtype)]
    return [Block("embedding", words), Block("embedding all-reduce", comm=("allreduce", act, "tp")),
            *([Block("embedding out", tail)] if tail else [])]


def embedding_backward(spec: GPTSpec, b: int, tp: int, dtype: str, grad_dtype: str,
                       fwd: list[Block], shared_head: bool = False) -> list[Block]:
    """The backward of the embedding's forward blocks (embedding_forward), in backward order: the
    dropout's, sequence parallelism's all-gather (the backward of its reduce-scatter, or of the
    slice a learned-position model takes, ScatterClone; the plain all-reduce's, Megatron's
    reduce_from_tensor_model_parallel_region, is the identity), then the tables' weight
    gradients. At micro-batch > 1 each table's embedding_dense_backward first copies the
    gradient, which reaches it as a transposed view (TransposeCopy's backward), to contiguous
    rows ([tokens, hidden]; torch 2.13's CPU profile of the same backward shows the
    aten::contiguous copy at batch 2 and none at batch 1; the CUDA kernel's grad_.contiguous()
    in aten/src/ATen/native/cuda/Embedding.cu is from torch's source, not in the wheel). The word table's lookup (F.embedding in megatron-core 0.16.1
    VocabParallelEmbedding.forward, tensor_parallel/layers.py line 287) has torch's
    embedding_dense_backward for its backward, which zero-fills this rank's [vocab/tp, hidden]
    gradient and scatter-adds the tokens' rows into it (kit.workload.kernels); Megatron's DDP
    hook then adds it into the fp32 (grad_dtype) main_grad, param.main_grad.add_(param.grad)
    (distributed/distributed_data_parallel.py line 440), every micro-batch: [vocab/tp, hidden]
    read in the model's dtype and in grad_dtype, written in grad_dtype. A learned position table
    (no rope) does the same over [positions, hidden], and the forward's add of the two has no
    kernel of its own backward (it passes the gradient to both). The lookup had been priced as
    twice its forward (its bytes: tokens x hidden read and written): GPT-3 175B at tp 8,
    micro-batch 1, bf16, 201 MB, where the zero-fill and scatter move 258 MB and the accumulation
    into main_grad 786 MB (6,400 x 12,288 x 10 bytes). At tp > 1 the forward's zeroing of the
    masked rows has autograd's IndexPutBackward0 first: a clone of the output gradient and a
    masked_fill_ of it, [tokens, hidden] each; the ids' mask kernels have no backward.

    shared_head: the LM head uses this word table on the same rank (tied, pp 1; tied_head_wgrad):
    autograd sums the table's two gradients, the head's zeroed dummy and the lookup's, before
    AccumulateGrad, one add over [vocab/tp, hidden] in the model's dtype (read two, write one)
    between the scatter and the main_grad add."""
    d = ops.dtype_bytes(dtype)
    tok = b * spec.seq
    grad = tok * spec.hidden * d  # the output gradient the tables' backward reads
    out = []
    transposed = b > 1  # the tables get the gradient as a transposed view (TransposeCopy)
    for blk in (backward_of(x) for x in reversed(fwd) if x.comm is None or x.comm[0] == "reducescatter"):
        if blk.comm is not None:
            out.append(blk)
            continue
        new = Block(blk.label)
        for op, f in zip(blk.ops, blk.bwd_factor):
            if isinstance(op, ScatterClone):  # the slice's backward: all-gather the gradient
                if new.ops:
                    out.append(new)
                out.append(Block("embedding sp all-gather", comm=("allgather", grad, "tp")))
                new = Block(blk.label)
                continue
            if isinstance(op, TransposeCopy):  # a view backward: the tables' copies below
                continue
            if isinstance(op, ops.EmbeddingBag):
                rows = op.rows
            elif isinstance(op, ops.Elementwise) and op.kind == "add" and not spec.rope:
                rows = spec.positions  # the position table's backward in place of the add's
            elif isinstance(op, TokenKernel):  # the ids' mask: no gradient
                continue
            elif isinstance(op, OutputMask):  # IndexPutBackward0: clone, then masked_fill_
                for k in op.backward_kernels():
                    new.ops.append(k)
                    new.bwd_factor.append(1.0)
                    new.kernels.append(1.0)
                continue
            else:
                new.ops.append(op)
                new.bwd_factor.append(f)
                new.kernels.append(1.0)
                continue
            table = [(ops.Elementwise("copy", tok * spec.hidden, dtype), 1.0)] if transposed else []
            table.append((embedding_dense_backward(rows, spec.hidden, d, grad, dtype), 2.0))
            if shared_head and isinstance(op, ops.EmbeddingBag):
                table.append((ops.Elementwise("add", rows * spec.hidden, dtype, inputs=2), 1.0))
            for kernel, launches in (*table, (main_grad_add(rows * spec.hidden, dtype, grad_dtype), 1.0)):
                for leaf, scale in leaf_ops(kernel):
                    new.ops.append(leaf)
                    new.bwd_factor.append(scale)
                    new.kernels.append(launches)
        if new.ops:
            out.append(new)
    return out


def main_grad_add(numel: int, dtype: str, grad_dtype: str):
    """Megatron's DDP hook param.main_grad.add_(param.grad) over numel elements: reads the
    gradient (dtype) and main_grad (grad_dtype), writes main_grad. The learned two-input add in
    grad_dtype, scaled to those bytes where the dtypes differ."""
    d, g = ops.dtype_bytes(dtype), ops.dtype_bytes(grad_dtype)
    op = ops.Elementwise("add", numel, grad_dtype, inputs=2)
    return op if d == g else Derived("elementwise", (op,), (d + 2 * g) / (3 * g), "main_grad.add_")


def _unscaled(kernel) -> list:
    """The kit ops an unscaled Derived kernel (kit.workload.kernels.memory_bound's copy of its
    bytes) is priced as, for a block without time factors."""
    leaves = leaf_ops(kernel)
    if any(scale != 1.0 for _, scale in leaves):
        raise KitError(f"{kernel!r} is scaled: give its block time factors")
    return [leaf for leaf, _ in leaves]


def pretraining_head_ops(spec: GPTSpec, rows: int, b: int, dtype: str) -> list:
    """BERT's heads before its logits (GPTSpec.pretraining_heads), as megatron-core 0.16.1 runs
    them: the LM head's dense, gelu and LayerNorm on each token (models/bert/bert_lm_head.py),
    the pooler's dense and tanh on each sequence's first token (pooler.py) and the binary head's
    h x 2 dense (bert_model.py 154, 380); [] for other models."""
    if not spec.pretraining_heads:
        return []
    h = spec.hidden
    return [ops.linear(rows, h, h, dtype), ops.Elementwise("gelu", rows * h, dtype),
            ops.LayerNorm(rows, h, dtype), ops.linear(b, h, h, dtype),
            ops.Elementwise("tanh", b * h, dtype), ops.linear(b, h, 2, dtype)]


def head_forward(spec: GPTSpec, b: int, tp: int, dtype: str, sp: bool = False) -> list[Block]:
    """Final LayerNorm, the logits GEMM over this rank's (padded) vocabulary slice, and
    Megatron's vocab-parallel cross entropy (megatron-core 0.16.1 tensor_parallel/cross_entropy.py,
    VocabParallelCrossEntropy, lines 28-80) on the logits cast to fp32: max over the vocabulary,
    TP all-reduce of it, subtract it in place, TP all-reduce of the target logit, exp in place,
    sum over the vocabulary, TP all-reduce of the sum, divide in place (the softmax kept for
    backward). Six passes over the [tokens, vocab/tp] tensor: the cast (reads it in the model's
    dtype, writes fp32), the in-place subtract, exp and divide (read and write it), and the two
    row reductions, torch.max(dim=-1) and sum(dim=-1), one reduce kernel each, which read it
    and write a row's value (max also its int64 index): tokens x 12 and tokens x 4 bytes. Priced
    as elementwise passes, the two reductions had been charged a [tokens, vocab/tp] write that
    they do not do. The all-reduces move tokens x 4 bytes, in the
    source's order: the max's; after the exp and sum, the target logit's and the sum's (lines
    148-158). Between the subtract and the exp, ten kernels over tokens elements mask the
    targets and gather their logits (lines 48-62), and log(sum) - predicted (line 77) two more
    before the divide (kit.parallel.vocab_kernels): at every tp, as Megatron runs them; at
    micro-batch > 1 the labels' and the loss's transposes (loss_transpose_kernels) around it. With sequence parallelism the LayerNorm runs on this
    rank's tokens and an all-gather of the activations feeds the column-parallel logits GEMM;
    BERT's pooler all-gathers the final norm's output too, before it picks each sequence's first
    token (megatron-core 0.16.1 models/bert/pooler.py lines 44-49,
    gather_from_sequence_parallel_region): a second [tokens, hidden] all-gather, which the kit
    had left out (bert-large, tp 2, micro-batch 8, bf16: 8 MiB a micro-batch)."""
    tok = b * spec.seq
    v = vocab_per_rank(spec.vocab, tp)
    n = tok * v
    ar = ("allreduce", tok * 4, "tp")
    if sp and tp > 1:
        rows = tok // tp if tok % tp == 0 else tok
        gather = ("allgather", tok * spec.hidden * ops.dtype_bytes(dtype), "tp")
        first = [Block("final ln", [norm(spec, rows, dtype)]),
                 *([Block("pooler all-gather", comm=gather)] if spec.pretraining_heads else []),
                 Block("bert heads", pretraining_head_ops(spec, rows, b, dtype)),
                 Block("sp all-gather", comm=gather),
                 Block("lm head", [])]
    else:
        first = [Block("lm head", [norm(spec, tok, dtype), *pretraining_head_ops(spec, tok, b, dtype)])]
    # BERT's output layer adds its bias after the GEMM (megatron-core 0.16.1 tensor_parallel/
    # layers.py 488-490: output = output + bias)
    bias = [ops.Elementwise("add", n, dtype)] if spec.pretraining_heads else []
    labels_t, loss_t = loss_transpose_kernels(tok, b)
    first[-1].ops += [ops.linear(tok, spec.hidden, v, dtype), *bias, *labels_t,
                      ops.Elementwise("cast", n, dtype, inputs=2),
                      *_unscaled(row_reduction(tok, v, 4 + 8, "fp32", "cross-entropy max"))]
    blocks = [*first,
              Block("cross-entropy max all-reduce", comm=ar),
              Block("cross-entropy", [ops.Elementwise("sub", n, "fp32", inputs=1),
                                      *cross_entropy_forward_kernels(tok),
                                      ops.Elementwise("exp", n, "fp32"),
                                      *_unscaled(row_reduction(tok, v, 4, "fp32", "cross-entropy sum"))]),
              Block("cross-entropy target all-reduce", comm=ar),
              Block("cross-entropy sum all-reduce", comm=ar),
              Block("cross-entropy", [*cross_entropy_loss_kernels(tok),
                                      ops.Elementwise("div", n, "fp32", inputs=1), *loss_t])]
    return _merge([blk for blk in blocks if blk.comm is None or tp > 1])


def tied_head_wgrad(spec: GPTSpec, tp: int, dtype: str) -> list:
    """What the LM head's weight gradient adds where it shares the word embedding on one rank
    (tied, pipeline-parallel 1). megatron-core 0.16.1 sets zero_out_wgrad on the shared weight
    only at pipeline_model_parallel_size == 1 (models/common/language_module/language_module.py
    lines 197-202). The head's column-parallel backward then accumulates its weight gradient into
    main_grad in the wgrad GEMM (gradient accumulation fusion) and, for zero_out_wgrad, hands
    autograd a zeroed dummy of main_grad's shape in the input's dtype (tensor_parallel/layers.py
    lines 586-600: TE's get_dummy_wgrad(..., zero=True), a cached buffer's fill_(0) in
    transformer-engine 2.20.2 pytorch/module/base.py lines 134-148, or torch.zeros): one fill of
    [vocab/tp, hidden]. Autograd sums it with the lookup's gradient (embedding_backward's
    shared_head add: torch 2.13's CPU profile of a weight shared by F.embedding and such a
    backward shows one aten::add_ more than two weights), and the DDP hook adds the sum into main_grad because zero_out_wgrad is set
    (distributed/distributed_data_parallel.py lines 437-440), the add the embedding already has.
    At pp > 1 the head's copy lives on the last stage and none of this runs."""
    return leaf_ops(fill(vocab_per_rank(spec.vocab, tp) * spec.hidden, dtype, "tied head dummy wgrad"))


def head_backward(spec: GPTSpec, b: int, tp: int, dtype: str, sp: bool = False,
                  shared_embedding: bool = False) -> list[Block]:
    """Cross-entropy backward (softmax - one-hot, scaled in place by the loss gradient, cast back
    to the model dtype: two passes; megatron-core 0.16.1 cross_entropy.py lines 114-117, the
    cast autograd's backward of forward's .float(); before them six kernels over tokens
    elements, the one-hot's subtraction among them, kit.parallel.vocab_kernels), then the logits
    GEMM's data and weight gradients, with the TP
    reduction of the data gradient's partial sums beside the weight gradient (the column-parallel
    GEMM's f operator: an all-reduce, or with sequence parallelism a reduce-scatter, and then
    also the re-gather of its input beside the data gradient: _column_backward), and the final
    LayerNorm's backward. shared_embedding (tied, pp 1): the weight gradient's zeroed dummy after
    the wgrad GEMM (tied_head_wgrad)."""
    tok = b * spec.seq
    v = vocab_per_rank(spec.vocab, tp)
    n = tok * v
    gemm = ops.linear(tok, spec.hidden, v, dtype)
    rows = tok // tp if sp and tp > 1 and tok % tp == 0 else tok
    ln = norm(spec, rows, dtype)
    per_token = cross_entropy_backward_kernels(tok)  # lines 97-99 and 114, at every tp
    blocks = [Block("lm head bwd", [*per_token, ops.Elementwise("mul", n, "fp32", inputs=1),
                                    ops.Elementwise("cast", n, dtype, inputs=2)],
                    [1.0] * (len(per_token) + 2))]
    if tp > 1:  # Megatron's parallel_lm_logits runs the column-parallel linear's backward
        blocks += _column_backward(gemm, sp)
    else:
        blocks.append(Block("lm head bwd", _gemm_bwd(gemm), [1.0, 1.0]))
    if shared_embedding:
        dummy = tied_head_wgrad(spec, tp, dtype)
        blocks.append(Block("tied head dummy wgrad", [op for op, _ in dummy], [f for _, f in dummy]))
    if spec.pretraining_heads:  # the bias's gradient, grad_output.sum(dim=0) (layers.py 615),
        # then BERT's heads backward: GEMMs' data and weight gradients, the others two passes
        bias_grad = _unscaled(row_reduction(v, tok, ops.dtype_bytes(dtype), dtype, "logits bias grad"))
        blocks.insert(1, Block("lm bias bwd", bias_grad, [1.0] * len(bias_grad)))
        heads = [(g, f) for op in reversed(pretraining_head_ops(spec, rows, b, dtype))
                 for g, f in ([(g, 1.0) for g in _gemm_bwd(op)] if isinstance(op, ops.Gemm)
                              else [(op, BWD_FACTOR["default"])])]
        if rows != tok:  # the pooler's all-gather: its backward (tensor_parallel_output_grad
            # False) is no reduce-scatter but _split_along_first_dim, a .contiguous() copy of
            # this rank's rows of the gathered gradient (tensor_parallel/mappings.py 346-348, 75)
            heads.append((ops.Elementwise("copy", rows * spec.hidden, dtype), 1.0))
        blocks.append(Block("bert heads bwd", [g for g, _ in heads], [f for _, f in heads]))
    blocks.append(Block("final ln bwd", [ln], [BWD_FACTOR["default"]]))
    return _merge(blocks)