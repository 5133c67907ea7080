"""BERT's pooler under sequence parallelism, as megatron-core 0.16.1 runs it: Pooler.forward
(models/bert/pooler.py lines 44-49) all-gathers the encoder's [s/t, b, h] output over TP
(gather_from_sequence_parallel_region, tensor_parallel_output_grad=False) before it takes each
sequence's first token; the output layer's ColumnParallelLinear gathers the same tensor again
for the logits. The gather's backward (tensor_parallel/mappings.py lines 346-348) is no
reduce-scatter: _split_along_first_dim keeps this rank's rows, a .contiguous() copy (line 75).
Expected values are written from that source by hand, not read off the kit."""
from kit import ops
from kit.parallel import Layout, parse_model
from kit.parallel.costs import AnalyticSource


def _comms(blocks):
    return [blk.comm for blk in blocks if blk.comm is not None]


def _copies(blocks):
    return [op.numel for blk in blocks for op in blk.ops if isinstance(op, ops.Elementwise) and op.kind == "copy"]


def test_the_pooler_gathers_the_whole_sequence_under_sequence_parallelism():
    bert = parse_model("bert-large")  # h 1024, seq 512, vocab 30522
    bare = parse_model("gpt:layers=24,hidden=1024,heads=16,seq=512,vocab=30522,ffn=4096,positions=512")
    b, t, h, s = 8, 2, 1024, 512
    tok = b * s
    gather = ("allgather", tok * h * 2, "tp")  # [s, b, h] in bf16, 8 MiB: the gathered tensor's bytes
    ar = ("allreduce", tok * 4, "tp")  # the cross entropy's three, as for GPT
    for sp in (False, True):
        lay = Layout(dp=4, tp=t, micro_batch=b, dtype="bf16", sequence_parallel=sp)
        (fwd, bwd), (bare_fwd, bare_bwd) = AnalyticSource(bert, lay).head, AnalyticSource(bare, lay).head
        if sp:  # the pooler's gather, then the output layer's; GPT has the latter alone
            assert _comms(fwd) == [gather, gather, ar, ar, ar]
            assert _comms(bare_fwd) == [gather, ar, ar, ar]
        else:
            assert _comms(fwd) == _comms(bare_fwd) == [ar, ar, ar]
        # backward: no reduce-scatter for the pooler's gather, the same collectives as GPT's ...
        assert _comms(bwd) == _comms(bare_bwd)
        # ... and with sequence parallelism the split's copy of this rank's tok/t rows of h
        # (BERT's other extra copy is the logits bias's gradient sum, priced as one)
        rows = tok // t * h
        assert _copies(bwd).count(rows) - _copies(bare_bwd).count(rows) == (1 if sp else 0)
