"""What megatron-core 0.16.1 runs around the GPT layers that the analytic layer prices
(kit.parallel.gpt, kit.parallel.costs.AnalyticSource): the tied LM head's weight gradient at
pipeline-parallel 1. Expected kernels and bytes come from the source lines cited, counted by
hand."""
from dataclasses import replace

from kit import ops
from kit.parallel import GPTSpec, Layout
from kit.parallel.costs import AnalyticSource
from kit.parallel.gpt import padded_vocab

SPEC = GPTSpec(layers=2, hidden=1024, heads=16, seq=1024, vocab=50257, attention="unfused")


def _ops(blocks):
    return [(op, f) for blk in blocks for op, f in zip(blk.ops, blk.bwd_factor or [1.0] * len(blk.ops))]


def _extra(more, fewer):
    """The (op, factor) pairs of `more` that `fewer` lacks, as a multiset."""
    rest = list(fewer)
    out = []
    for x in more:
        if x in rest:
            rest.remove(x)
        else:
            out.append(x)
    assert not rest, rest
    return out


def test_tied_head_at_pp1_zeroes_a_dummy_wgrad_and_autograd_sums_the_two_gradients():
    """language_module.py lines 197-202: pp 1 and shared weights set zero_out_wgrad. layers.py
    lines 586-600: the head's backward then returns a zeroed [vocab/tp, hidden] dummy in the
    input's dtype (one fill: writes 2 bytes an element in fp16), and autograd adds it to the
    lookup's gradient before AccumulateGrad (one add: reads two, writes one, 6 bytes an element);
    the DDP hook's main_grad.add_ (distributed_data_parallel.py line 440) the untied model has
    too. At pp 2 the head's copy is on the last stage: neither kernel."""
    tp = 2
    n = padded_vocab(50257, tp) // tp * 1024
    untied = replace(SPEC, tied=False)
    for pp in (1, 2):
        lay = Layout(tp=tp, pp=pp, dp=1, micro_batch=2, global_batch=4, dtype="fp16")
        a, b = AnalyticSource(SPEC, lay), AnalyticSource(untied, lay)
        head = _extra(_ops(a.head[1]), _ops(b.head[1]))
        emb = _extra(_ops(a.embedding[1]), _ops(b.embedding[1]))
        if pp == 2:
            assert head == [] and emb == []
            continue
        assert len(head) == 1 and len(emb) == 1
        (fill, f_fill), (add, f_add) = head[0], emb[0]
        assert fill.numel == n and fill.bytes * f_fill == 2 * n  # the zero-fill writes n halves
        assert add.kind == "add" and add.numel == n and add.bytes * f_add == 6 * n
        # the fill runs after the head's wgrad GEMM (the last GEMM of its backward)
        flat = [op for op, _ in _ops(a.head[1])]
        last_gemm = max(i for i, op in enumerate(flat) if isinstance(op, ops.Gemm))
        assert [i for i, op in enumerate(flat) if op is fill][0] > last_gemm


def _copies(blocks, numel):
    """Plain copies of numel elements (not the masked_fill_ of the vocab-parallel rows)."""
    from kit.parallel.vocab_kernels import OutputMask

    return [op for blk in blocks for op in blk.ops if isinstance(op, ops.Elementwise)
            and not isinstance(op, OutputMask) and op.kind == "copy" and op.numel == numel]


def test_embedding_transposes_to_s_b_h_at_micro_batch_over_1():
    """language_model_embedding.py lines 118-120: embeddings.transpose(0, 1).contiguous(), one
    copy of [tokens, hidden] (reads and writes 2 bytes an element in fp16) at micro-batch 2; at
    micro-batch 1 the transposed tensor is contiguous and nothing runs (torch: a size-1
    dimension's stride does not count). Backward: each table's embedding_dense_backward copies
    the transposed gradient view to contiguous rows, one copy a table (the word table, and the
    learned position table where there is one)."""
    from kit.parallel.gpt import embedding_backward, embedding_forward

    rope = replace(SPEC, rope=True, tied=True)
    for spec, tables in ((SPEC, 2), (rope, 1)):
        for tp in (1, 4):
            for b in (1, 2):
                tok = b * spec.seq
                fwd = embedding_forward(spec, b, tp, "fp16")
                bwd = embedding_backward(spec, b, tp, "fp16", "fp32", fwd)
                n_fwd = 1 if b == 2 else 0
                assert len(_copies(fwd, tok * 1024)) == n_fwd
                assert sum(op.bytes for op in _copies(fwd, tok * 1024)) == n_fwd * 2 * tok * 1024 * 2
                # tp > 1 also clones the gradient for the masked rows' backward (its own test)
                clones = 1 if tp > 1 else 0
                assert len(_copies(bwd, tok * 1024)) == clones + (tables if b == 2 else 0)


def test_loss_transposes_labels_and_loss_at_micro_batch_over_1():
    """language_module.py line 139, labels.transpose(0, 1).contiguous() (int64 [b, s]: 16 bytes
    a token) and line 170, loss.transpose(0, 1).contiguous() (fp32: 8 bytes a token); none at
    micro-batch 1; their backward is a view."""
    from kit.parallel.gpt import head_backward, head_forward
    from kit.parallel.vocab_kernels import TokenKernel

    def small(blocks):
        return [op for blk in blocks for op in blk.ops if isinstance(op, TokenKernel)]
    for tp in (1, 4):
        one, two = small(head_forward(SPEC, 1, tp, "fp16")), small(head_forward(SPEC, 2, tp, "fp16"))
        tok = 2 * SPEC.seq
        assert len(two) == len(one) + 2
        scale = sum(op.bytes for op in one) / SPEC.seq  # the per-token kernels' bytes a token
        assert sum(op.bytes for op in two) == tok * (scale + 16 + 8)
        assert len(small(head_backward(SPEC, 2, tp, "fp16"))) == len(small(head_backward(SPEC, 1, tp, "fp16")))


def test_sequence_parallel_embedding_with_learned_positions_all_reduces_then_slices():
    """language_model_embedding.py lines 48-53: reduce_scatter_embeddings only without a position
    table. With one (GPT-3), lines 118-141 run the word table's all-reduce (layers.py line 300),
    the position add, the transpose, this rank's slice (a view) and its clone, [tokens/tp, hidden];
    the slice's backward is an all-gather of the gradient (mappings.py
    _ScatterToSequenceParallelRegion.backward). A rotary model keeps the reduce-scatter."""
    from kit.parallel.gpt import embedding_backward, embedding_forward

    tp, b = 4, 2
    tok = b * SPEC.seq
    act = tok * 1024 * 2
    for spec, fwd_comm in ((SPEC, "allreduce"), (replace(SPEC, rope=True, tied=True), "reducescatter")):
        fwd = embedding_forward(spec, b, tp, "fp16", sp=True)
        bwd = embedding_backward(spec, b, tp, "fp16", "fp32", fwd)
        assert [blk.comm for blk in fwd if blk.comm] == [(fwd_comm, act, "tp")]
        assert [blk.comm for blk in bwd if blk.comm] == [("allgather", act, "tp")]
        assert len(_copies(fwd, tok // tp * 1024)) == (1 if fwd_comm == "allreduce" else 0)
        # either way the embedding dropout (0.1, a non-gated model) runs on this rank's
        # tokens/tp only, after the clone (lines 130-141) or the reduce-scatter, and so does its
        # backward, before the all-gather
        for blocks in (fwd, bwd):
            drops = [op for blk in blocks for op in blk.ops if isinstance(op, ops.Dropout)]
            assert [op.numel for op in drops] == [tok // tp * 1024]
