"""The captured op graph's TP backward as Megatron runs it (kit.parallel.opgraph): a column-parallel
linear's input-gradient all-reduce runs asynchronously beside its weight-gradient GEMM (and bias
sum), the compute stream waiting only for its excess, as the analytic layer has it
(kit.parallel.gpt._column_backward). HF's separate q, k and v projections (and gate and up) sum
their partial input gradients first; the one all-reduce then runs beside all their weight
gradients, as beside Megatron's fused QKV (gate-up) GEMM. Before, the captured graph's all-reduce
was synchronous: gpt2-large tp4 bf16 micro-batch 4 on dgx-a100 had 18.98 ms of TP communication
on the critical path against the analytic layer's 13.0."""
import pytest
import torch

from kit import ops
from kit.hardware import get_system
from kit.parallel import HostModel, Layout, parse_model, predict_parallel
from kit.parallel.costs import Coster, Phase
from kit.parallel.opgraph import capture_model, graph_source, shard_graph
from tests.test_parallel_tp_async_backward import GemmMs

torch.set_num_threads(1)
NO_HOST = HostModel(launch_us=0.0, collective_us=0.0, p2p_sync=False)
# hidden 32, q 32 (16 a rank), k and v 16 (8), MLP 24 (12): no dim equals the 20 tokens, so a
# GEMM contracting over the tokens is a weight gradient
TINY_LLAMA = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 24,
              "vocab_size": 64}
BATCH, SEQ = 2, 10


@pytest.fixture(scope="module")
def llama_layer():
    """(forward, backward) blocks of the tiny HF llama's layer at tp 2, and its head's backward."""
    src = shard_graph(capture_model(TINY_LLAMA, BATCH, SEQ, "bf16"), 2)
    return src.layer(0), src.head[1]


@pytest.fixture(scope="module")
def gpt2_layer():
    spec = parse_model("gpt2", seq=SEQ)
    src = graph_source(spec, "gpt2", Layout(tp=2, micro_batch=BATCH, dtype="bf16"))
    return src.layer(0), src.head[1]


def _beside(blocks):
    """[(the all-reduce block, the ops it runs beside)] of the backward's TP all-reduces."""
    out = []
    for i, blk in enumerate(blocks):
        if blk.comm is not None:
            nxt = blocks[i + 1].ops if i + 1 < len(blocks) and blocks[i + 1].comm is None else []
            out.append((blk, nxt[:blk.overlap]))
    return out


@pytest.mark.parametrize("model, linears", [("gpt2", [1, 1]), ("llama", [2, 3])])
def test_the_captured_input_gradient_all_reduce_runs_beside_the_weight_gradients(
        model, linears, llama_layer, gpt2_layer):
    (fwd, bwd), head = gpt2_layer if model == "gpt2" else llama_layer
    tokens = BATCH * SEQ
    seen = []
    for blk, ops_beside in _beside(bwd):
        assert blk.comm[0] == "allreduce" and blk.overlap > 0  # every one async
        gemms = [op for op in ops_beside if isinstance(op, ops.Gemm)]
        # the weight gradients: GEMMs contracting over the tokens (the bias sums are the rest)
        assert gemms and all(g.k == tokens and g.b == 1 for g in gemms)
        seen.append(len(gemms))
    # MLP first in backward order: gpt2's fused c_fc and c_attn one linear each; HF llama's gate
    # and up, then q, k and v, whose partial input gradients are summed before the one all-reduce
    assert seen == linears
    # every weight gradient of the layer's column-parallel linears is beside one; the forward's
    # column-parallel linears are the GEMMs that read the replicated (whole-width) hidden state
    hidden = 32 if model == "llama" else 768
    cols = [op for b in fwd if b.comm is None for op in b.ops
            if isinstance(op, ops.Gemm) and op.b == 1 and op.k == hidden]
    assert sum(seen) == len(cols)
    # and the LM head's: its input gradient's all-reduce beside the logits' weight gradient
    (blk, beside), = _beside(head)
    assert [op.k for op in beside if isinstance(op, ops.Gemm)] == [tokens]


@pytest.mark.parametrize("hide", [0.01, 0.4, 10.0])
def test_the_compute_stream_pays_only_the_all_reduce_excess_over_the_weight_gradients(hide, llama_layer):
    """GEMMs of hide x the all-reduce's time: the compute stream waits for max(c - n x gemm, 0)
    per all-reduce, n its weight gradients (3 for q, k, v; 2 for gate, up). 0.4: the attention's
    three hide it, the MLP's two leave 0.2 c."""
    (_, bwd), _ = llama_layer
    lay = Layout(tp=2, micro_batch=BATCH, dtype="bf16")
    system = get_system("dgx-a100")
    probe = Coster(lay, system, GemmMs(0.0), host=NO_HOST, in_stream=False)
    c = [probe.comm_ms(*blk.comm[:2], probe.group("tp", 0)) * probe.tp_comm_scale
         for blk, _ in _beside(bwd)]
    assert len(c) == 2 and c[0] > 0 and c[0] == pytest.approx(c[1])
    gemm_ms = hide * c[0]
    coster = Coster(lay, system, GemmMs(gemm_ms), host=NO_HOST, in_stream=False)
    coster.predict_ops(op for blk in bwd for op in blk.ops)
    ph = Phase()
    compute = coster.add(ph, bwd, 0)
    wgrads = [sum(isinstance(op, ops.Gemm) for op in beside) for _, beside in _beside(bwd)]
    assert ph.async_comm_ms == pytest.approx(sum(c))
    assert ph.comm_ms == pytest.approx(sum(max(ci - n * gemm_ms, 0.0) for ci, n in zip(c, wgrads)))
    assert ph.paced_ms() == pytest.approx(compute + ph.comm_ms)


def test_captured_and_analytic_backward_run_the_same_async_all_reduces():
    """gpt2 at tp 2: both kernel sources put the same collectives beside the backward's GEMMs,
    so the captured graph's TP communication on the critical path drops by what it hides."""
    lay = Layout(tp=2, micro_batch=BATCH, global_batch=BATCH, dtype="bf16")
    spec = parse_model("gpt2", seq=128)
    runs = {g: predict_parallel(spec, "dgx-a100", lay, graph=g, host=NO_HOST) for g in (True, False)}
    mb = {g: r["per_microbatch_ms"][0] for g, r in runs.items()}
    assert mb[True]["tp_async_comm_ms"] > 0
    assert mb[True]["tp_async_comm_ms"] == pytest.approx(mb[False]["tp_async_comm_ms"])
    # the timeline's TP communication on the critical path is the exposed part alone
    tp_comm = runs[True]["communication_by_group"]["tensor/expert parallel"]
    assert tp_comm == pytest.approx(mb[True]["tp_ep_comm_ms"])


# post-LN (BERT): backward order reaches a layer's output layer norm, the reader of the next
# layer's q, k, v input gradient, only after the layer boundary
TINY_BERT = {"model_type": "bert", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
             "intermediate_size": 24, "vocab_size": 64}


def test_a_post_ln_layer_reduces_its_input_gradient_beside_its_own_weight_gradients():
    """The all-reduce of a layer's q, k, v input gradient belongs to that layer (Megatron's f
    operator is inside it; a pipeline stage sends the reduced gradient), async beside the
    weight gradients held back for it. Flushed at the layer boundary without it, those had run
    before it and the all-reduce, in the next layer's (or the embedding's) segment, was
    synchronous: 12 of bert-base's 25 backward all-reduces at tp 2."""
    src = shard_graph(capture_model(TINY_BERT, BATCH, SEQ, "bf16"), 2)
    tokens = BATCH * SEQ
    for layer in range(2):
        fwd, bwd = src.layer(layer)
        cols = [op for b in fwd if b.comm is None for op in b.ops
                if isinstance(op, ops.Gemm) and op.b == 1 and op.k == 32]  # q, k, v, intermediate
        pairs = _beside(bwd)
        assert len(pairs) == 2 and all(blk.overlap > 0 for blk, _ in pairs)
        # every weight gradient of the layer is in its own segment, the column-parallel ones
        # beside the all-reduces
        wgrads = [op for b in bwd if b.comm is None for op in b.ops
                  if isinstance(op, ops.Gemm) and op.b == 1 and op.k == tokens]
        beside = [op for _, ops_beside in pairs for op in ops_beside if isinstance(op, ops.Gemm)]
        assert len(wgrads) == len(cols) + 2  # + the row-parallel attention and output projections'
        assert [g.k for g in beside] == [tokens] * len(cols)  # q, k, v beside theirs, as the MLP's
    assert not [b for b in src.embedding[1] if b.comm is not None]  # layer 0 reduced its own


@pytest.mark.parametrize("config", [TINY_BERT, TINY_LLAMA], ids=["bert", "llama"])
def test_a_compiled_graph_reduces_the_summed_input_gradients_once(config):
    """Under compiled fusion Inductor fuses the sum of q, k and v's partial input gradients with
    the clone that makes the next projection's output gradient; the sharder follows partial sums
    kernel by kernel (the unfused graph capture_model keeps), so the clone is not read as
    partial. At node level BERT's layer had 4 backward all-reduces at tp 2 (one before each of
    k's and q's data gradients), where eager and Megatron have 2: q, k, v's and the MLP's."""
    eager = shard_graph(capture_model(config, BATCH, SEQ, "bf16"), 2)
    compiled = shard_graph(capture_model(config, BATCH, SEQ, "bf16", "compiled"), 2)
    tokens = BATCH * SEQ
    for layer in range(2):
        pairs = _beside(compiled.layer(layer)[1])
        assert len(pairs) == len(_beside(eager.layer(layer)[1])) == 2
        assert all(blk.overlap > 0 and blk.comm[0] == "allreduce" for blk, _ in pairs)
        # the q, k, v one runs beside their three weight gradients (llama: the gate and up
        # projections' two come first, in backward order)
        wgrads = [[op for op in beside if isinstance(op, ops.Gemm) and op.k == tokens] for _, beside in pairs]
        assert sorted(len(w) for w in wgrads) == [2 if config is TINY_LLAMA else 1, 3]
    assert not [b for b in compiled.embedding[1] if b.comm is not None]


def test_a_fused_chain_of_sums_reduces_its_last_sum_alone():
    """Two adds of q, k and v's partial input gradients fused into one kernel (dq + dk, then + dv):
    the first add's sum is read inside the kernel, and only the second's is left to reduce. The
    first had been left open too, and the segment's end all-reduced it again: 2 backward
    all-reduces at tp 2 where the same graph eager has 1."""
    from kit.workload.fusion import apply_fusion
    from kit.workload.graph import Node, OpGraph

    t, h = 256, 512

    def gemm(i, module, deps, phase, layer=0):
        return Node(i, "aten.mm.default", ops.Gemm(t, h, h, dtype="bf16"), "gemm", phase, deps,
                    module, layer, t * h * 2)

    def ew(i, kind, deps, phase, layer=0):
        return Node(i, f"aten.{kind}.Tensor", ops.Elementwise(kind, t * h, "bf16", inputs=2),
                    "elementwise", phase, deps, "l.0", layer, t * h * 2)

    nodes = (ew(0, "mul", (), "fwd", None),
             gemm(1, "l.0.q", (0,), "fwd"), gemm(2, "l.0.k", (0,), "fwd"), gemm(3, "l.0.v", (0,), "fwd"),
             ew(4, "mul", (1, 2, 3), "fwd"), gemm(5, "l.0.o", (4,), "fwd"),  # row-parallel
             gemm(6, "l.0.o", (5,), "bwd"), ew(7, "mul", (6,), "bwd"),
             gemm(8, "l.0.q", (7,), "bwd"), gemm(9, "l.0.k", (7,), "bwd"), gemm(10, "l.0.v", (7,), "bwd"),
             ew(11, "add", (8, 9), "bwd"), ew(12, "add", (11, 10), "bwd"),  # partial sums
             gemm(13, "l.0.x", (12,), "bwd"), gemm(14, "emb", (13,), "bwd", None))
    graph = OpGraph(nodes, "chain", {})
    eager = apply_fusion(graph, "eager")
    fused = apply_fusion(graph, "compiled")
    assert [n.members for n in fused.nodes if len(n.members) > 1] == [(11, 12)]
    compiled = fused.with_nodes(fused.nodes, unfused_kernels=eager)

    def reduces(src):
        return [b.comm for b in src.layer(0)[1] + src.embedding[1] if b.comm is not None]

    want = reduces(shard_graph(eager, 2))
    assert want == [("allreduce", float(t * h * 2), "tp")]
    assert reduces(shard_graph(compiled, 2)) == want
