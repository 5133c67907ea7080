"""A MoE layer at TP > 1 dispatches as Megatron-core 0.9's MoEAlltoAllTokenDispatcher does
(transformer/moe/token_dispatcher.py): each tp rank sends its 1/tp sequence shard's routed
tokens over the EP all-to-all, then an all-gather over the TP group brings the tp shards to the
experts (weights split over tp, moe_extended_tp False) and a reduce-scatter takes them back
before the combine all-to-all. Each rank's all-to-all had sent the whole micro-batch's routed
tokens, tp times the bytes, beside a tokens x hidden all-gather and reduce-scatter of its own."""
import pytest

from kit import ops
from kit.errors import KitError
from kit.parallel import Layout
from kit.parallel.gpt import layer_backward, layer_forward, parse_model
from kit.parallel.predict import predict_parallel

SHAPE = "moe:layers=2,hidden=1024,heads=16,seq=512,experts=8,topk=2,moe_every=1"
B, H, BYTES = 2, 1024, 2  # micro-batch, hidden, fp16


def _comms(blocks):
    return [(blk.label, blk.comm) for blk in blocks if blk.comm is not None]


def _layer(tp, ep=2, spec=None):
    return layer_forward(spec or parse_model(SHAPE), B, tp, ep, tp > 1, "fp16", layer=0)


def _gemm_rows(blocks, label):
    return [op.m for blk in blocks if blk.label == label for op in blk.ops if isinstance(op, ops.Gemm)]


def test_tp1_dispatches_the_whole_micro_batch_and_runs_no_tp_collective():
    spec = parse_model(SHAPE)
    comms = _comms(_layer(1))
    routed = B * spec.seq * spec.topk
    assert [c for _, c in comms] == [("alltoall", routed * H * BYTES, "ep")] * 2


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_each_ranks_all_to_all_bytes_scale_one_over_tp(tp):
    one = [c[1] for _, c in _comms(_layer(1)) if c[0] == "alltoall"]
    many = [c[1] for _, c in _comms(_layer(tp)) if c[0] == "alltoall"]
    assert len(many) == 2 and many == [n / tp for n in one]


@pytest.mark.parametrize("tp", [2, 8])
def test_the_tp_all_gather_and_reduce_scatter_wrap_the_experts_with_the_routed_rows(tp):
    spec = parse_model(SHAPE)
    routed = B * spec.seq * spec.topk  # all tp shards' routed rows, gathered
    labels = [blk.label for blk in _layer(tp)]
    comms = dict(_comms(_layer(tp)))
    assert comms["moe tp all-gather"] == ("allgather", routed * H * BYTES, "tp")
    assert comms["moe tp reducescatter"] == ("reducescatter", routed * H * BYTES, "tp")
    i = labels.index
    assert (i("moe dispatch all-to-all") < i("moe tp all-gather") < i("experts")
            < i("moe tp reducescatter") < i("moe combine all-to-all"))
    # after the attention's (sp all-gather, reduce-scatter) the MoE's four and nothing else: the
    # router routes the shard, with no tokens x hidden all-gather before it or reduce-scatter after
    assert [label for label, _ in _comms(_layer(tp))][2:] == [
        "moe dispatch all-to-all", "moe tp all-gather", "moe tp reducescatter", "moe combine all-to-all"]


@pytest.mark.parametrize("tp", [2, 4])
def test_router_runs_on_the_shard_and_experts_on_every_routed_row_at_f_over_tp(tp):
    spec = parse_model(SHAPE)
    blocks = _layer(tp)
    router = [op for blk in blocks for op in blk.ops
              if isinstance(op, ops.Gemm) and op.n == spec.experts]
    assert [op.m for op in router] == [B * spec.seq // tp]
    experts = [op for blk in blocks if blk.label == "experts" for op in blk.ops if isinstance(op, ops.Gemm)]
    assert {op.m for op in experts} == {B * spec.seq * spec.topk}
    assert experts[-1].k == spec.f // tp  # the down projection: this rank's 1/tp of each expert


def test_the_backward_reduce_scatters_what_the_forward_gathered_and_back():
    fwd = _layer(4)
    bwd = _comms(layer_backward(fwd, 4, True))
    sizes = dict(_comms(fwd))
    kinds = [c for _, c in bwd]
    assert ("reducescatter", *sizes["moe tp all-gather"][1:]) in kinds
    assert ("allgather", *sizes["moe tp reducescatter"][1:]) in kinds
    assert sum(c[0] == "alltoall" and c[1] == sizes["moe dispatch all-to-all"][1] for c in kinds) == 2


def test_a_capacity_factor_sizes_each_shards_buffers():
    # topk_softmax_with_capacity counts the rank's own tokens: ceil(1.1 x 256 x 2 / 3) = 188 rows
    # an expert for a 256-token shard, not ceil(1.1 x 1024 x 2 / 3) / 4 = 187.75
    spec = parse_model("moe:layers=2,hidden=1024,heads=16,seq=512,experts=3,topk=2,moe_every=1,"
                       "capacity_factor=1.1")
    comms = dict(_comms(_layer(4, ep=1, spec=spec)))
    assert comms["moe tp all-gather"][1] == 4 * 3 * 188 * H * BYTES
    assert _gemm_rows(_layer(4, ep=1, spec=spec), "experts")[0] == 4 * 3 * 188


def test_moe_at_tp_above_one_needs_sequence_parallelism():
    spec = parse_model(SHAPE)
    with pytest.raises(KitError, match="sequence-parallel"):
        layer_forward(spec, B, 2, 2, False, "fp16", layer=0)
    with pytest.raises(KitError, match="sequence-parallel"):
        predict_parallel(spec, "dgx-a100", Layout(tp=2, dp=2, ep=2, dtype="bf16"), graph=False)
    dense = parse_model("gpt:layers=2,hidden=1024,heads=16,seq=512")
    assert layer_forward(dense, B, 2, 1, False, "fp16")  # dense layers keep the all-reduce path


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_every_tp_rank_holds_the_gathered_expert_inputs(tp):
    """The experts' h-wide inputs, which fc1's weight gradient reads, are the rows the all-gather
    over TP collected: every tp rank holds all of them (topk x 2h bytes a token of the whole
    sequence), while the rest of the layer splits over tp under sequence parallelism. They had
    been divided by tp with the rest (Mixtral at seq 4096, tp 8: 8 MiB a layer, not 64)."""
    from kit.parallel.memory import activation_bytes_per_layer

    def per_rank(spec, t):
        return activation_bytes_per_layer(spec, Layout(micro_batch=B, tp=t, sequence_parallel=t > 1), 0)

    spec = parse_model(SHAPE)
    gathered = B * spec.seq * spec.topk * 2 * H  # 16-bit activations
    assert tp * per_rank(spec, tp) - per_rank(spec, 1) == pytest.approx((tp - 1) * gathered)
    dense = parse_model("gpt:layers=2,hidden=1024,heads=16,seq=512")  # all of it splits over tp
    assert tp * per_rank(dense, tp) == pytest.approx(per_rank(dense, 1))


def _saved_elements_a_token(topk, tokens=64, h=32, f=48, experts=4):
    """What autograd keeps of a GeLU MoE MLP run as Megatron-core 0.9 runs it at tp 1, ep 1
    (moe_utils.permute's gather, the experts' fc1 / gelu / fc2, unpermute's scatter, then the
    rows times the router's probs), in elements a token: the h- and f-wide tensors only (the
    norm output the router reads is counted with the layer's other GEMM inputs; the probs and
    indices are topk wide)."""
    import torch

    torch.manual_seed(0)
    x = torch.randn(tokens, h, requires_grad=True)
    w_router = torch.randn(h, experts, requires_grad=True)
    w1 = torch.randn(experts, h, f, requires_grad=True)
    w2 = torch.randn(experts, f, h, requires_grad=True)
    skip = {t.untyped_storage().data_ptr() for t in (x, w_router, w1, w2)}
    held = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if t.is_floating_point() and t.shape[-1] in (h, f) and ptr not in skip:
            held[ptr] = t.untyped_storage().nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        scores, idx = torch.topk(x @ w_router, topk, dim=1)
        probs = torch.softmax(scores, dim=-1)
        order = torch.argsort(idx.view(-1), stable=True)
        rows = torch.gather(x, 0, (order // topk).unsqueeze(1).expand(-1, h))
        counts = torch.bincount(idx.view(-1), minlength=experts).tolist()
        outs = [torch.nn.functional.gelu(chunk @ w1[e]) @ w2[e]
                for e, chunk in enumerate(torch.split(rows, counts))]
        back = torch.zeros(tokens * topk, h).scatter_add(0, order.unsqueeze(1).expand(-1, h),
                                                         torch.cat(outs))
        (back.reshape(-1, topk, h) * probs.unsqueeze(-1)).sum(dim=1).sum().backward()
    return sum(held.values()) / tokens


def test_a_moe_layer_counts_what_autograd_keeps_of_each_routed_copy():
    """Each routed copy of a token leaves fc1's input (h), its output and gelu's (f each) and,
    on the way back, the rows unpermute multiplies by the router's probs (h): that product saves
    them for the probs' gradient. The kit had counted the first h alone (Mixtral-8x7b, seq 4096,
    bf16, tp 1: 944 MiB a layer where 1008 are held)."""
    from kit.parallel.memory import activation_bytes_per_layer

    h, f = 32, 48
    per_copy = (_saved_elements_a_token(2, h=h, f=f) - _saved_elements_a_token(1, h=h, f=f)) * BYTES
    assert per_copy == 2 * (2 * h + 2 * f)  # the emulation itself: 2 h-wide and 2 f-wide rows

    def per_token(topk):
        spec = parse_model(f"moe:layers=1,hidden={h},heads=4,ffn={f},seq=64,experts=4,"
                           f"topk={topk},moe_every=1,dropout=0")
        return activation_bytes_per_layer(spec, Layout(micro_batch=1, dtype="fp16"), 0) / spec.seq

    assert per_token(2) - per_token(1) == pytest.approx(per_copy)
