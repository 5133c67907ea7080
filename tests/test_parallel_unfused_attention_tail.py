"""The unfused (bmm) attention's kernels after its scores, and BERT's LM-head gradients under
sequence parallelism, as megatron-core 0.16.1 runs them:

* DotProductAttention.forward ends with context.permute(2, 0, 1, 3).contiguous()
  (transformer/dot_product_attention.py line 245): a copy of tokens x hidden/tp, whose backward
  runs no kernel;
* FusedScaleMaskSoftmax's torch fallback with 0.16.1's defaults (apply_query_key_layer_scaling
  False, transformer_config.py line 339, so scale None; attention_softmax_in_fp32 True, line 343)
  casts, masks in place, softmaxes and casts back (fused_softmax.py lines 313-340); no scale
  multiply, and no causal mask built in the layer: the data loader hands the model one
  (GPTDatasetConfig.create_attention_mask defaults to True, datasets/gpt_dataset.py line 37), and
  forward_torch_softmax builds get_default_causal_mask only for a None mask (lines 323-327);
* BERT's LM-head dense and LayerNorm are `sequence_parallel` (models/bert/bert_lm_head.py
  lines 36-37, fusions/fused_layer_norm.py 116-120), so finalize_model_grads all-reduces their
  gradients over TP (distributed/finalize_model_grads.py lines 353-356).

Expected values come from those lines by hand and from torch's own view rules and CPU profile of
the same tensor code, not from the kit."""
import dataclasses

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from kit import ops
from kit.parallel import GPTSpec, Layout, parse_model
from kit.parallel.build import tp_norm_grad_bytes
from kit.parallel.gpt import layer_backward, layer_forward

torch.set_num_threads(1)
SPEC = GPTSpec(layers=2, hidden=1024, heads=16, seq=1024, vocab=50257, attention="unfused")
WORK = {"aten::copy_", "aten::fill_", "aten::triu", "aten::masked_fill_", "aten::_softmax",
        "aten::_softmax_backward_data", "aten::bmm", "aten::mm"}


def _after_second_bmm(blocks):
    """The ops between the context bmm and the output projection."""
    flat = [op for blk in blocks for op in blk.ops]
    bmm = [i for i, op in enumerate(flat) if isinstance(op, ops.Gemm) and op.kind == "bmm"]
    end = next(i for i in range(bmm[1] + 1, len(flat)) if isinstance(flat[i], ops.Gemm))
    return flat[bmm[1] + 1:end]


def _work(p, skip_accumulate=True):
    """The profile's aten ops that run a kernel (WORK), but a leaf's gradient accumulation."""
    out = []
    for e in p.events():
        if e.name not in WORK:
            continue
        chain, c = [], e
        while c is not None:
            chain.append(c.name)
            c = c.cpu_parent
        if skip_accumulate and any("AccumulateGrad" in n for n in chain):
            continue
        if any(n in WORK for n in chain[1:]):  # counted at its outermost working op
            continue
        out.append(e.name)
    return out


@pytest.mark.parametrize("b, tp, heads", [(1, 2, 16), (2, 8, 16), (1, 8, 8), (4, 1, 16)])
def test_the_context_permute_is_one_copy_where_torch_says_it_is_not_contiguous(b, tp, heads):
    spec = dataclasses.replace(SPEC, heads=heads)
    hd, np_ = spec.hidden // heads, heads // tp
    view = torch.empty(b, np_, spec.seq, hd, device="meta").permute(2, 0, 1, 3)
    want = [] if view.is_contiguous() else [view.numel()]  # .contiguous() copies, or returns it
    tail = _after_second_bmm(layer_forward(spec, b, tp, 1, False, "bf16"))
    assert [op.numel for op in tail] == want
    for op in tail:  # read once, written once, in the model's dtype
        assert op.bytes == 2 * 2 * b * spec.seq * spec.hidden // tp
    if b == 1 and np_ == 1:
        assert want == []  # the permute moves sq alone ahead of b = np = 1


def test_the_context_copy_has_no_backward_kernel():
    # torch: bmm -> view -> permute.contiguous -> view -> the output projection; its backward
    # runs the two mm and two bmm and no copy (CloneBackward0, PermuteBackward0, ViewBackward0)
    b, np_, s, hn = 2, 2, 64, 16
    probs = torch.randn(b * np_, s, s, requires_grad=True)
    value = torch.randn(s, b * np_, hn, requires_grad=True)
    w = torch.randn(np_ * hn, np_ * hn, requires_grad=True)
    ctx = torch.bmm(probs, value.transpose(0, 1)).view(b, np_, s, hn)
    out = ctx.permute(2, 0, 1, 3).contiguous().view(s, b, np_ * hn) @ w
    with profile(activities=[ProfilerActivity.CPU]) as p:
        out.backward(torch.randn_like(out))
    assert sorted(_work(p)) == ["aten::bmm", "aten::bmm", "aten::mm", "aten::mm"]
    # the kit: the layer's backward has no op of the copy's size (tokens x hidden / tp)
    tp = 2
    fwd = layer_forward(SPEC, 2, tp, 1, False, "bf16")
    n = 2 * SPEC.seq * SPEC.hidden // tp
    assert [op.numel for op in _after_second_bmm(fwd)] == [n]
    bwd = [op for blk in layer_backward(fwd, tp, False) for op in blk.ops]
    assert not [op for op in bwd if getattr(op, "numel", None) == n]


def _scores_ops(blocks):
    """(op, backward factor, kernels) of the ops between the two attention bmm (forward) or
    their gradients (backward), the dropout left out: the softmax and what runs around it."""
    flat = [(op, k, c) for blk in blocks if blk.comm is None
            for op, k, c in zip(blk.ops, blk.bwd_factor or [1.0] * len(blk.ops), blk.kernel_counts())]
    bmm = [i for i, (op, _, _) in enumerate(flat) if isinstance(op, ops.Gemm) and op.kind == "bmm"]
    span = next(flat[a + 1:z] for a, z in zip(bmm, bmm[1:])
                if any(isinstance(op, ops.Softmax) for op, _, _ in flat[a + 1:z]))
    return [item for item in span if not isinstance(item[0], ops.Dropout)]


def _loader_mask(s):
    """The data loader's mask, as _get_ltor_masks_and_position_ids builds it with
    create_attention_mask True (datasets/gpt_dataset.py lines 739-744, 776-778), batched."""
    return (torch.tril(torch.ones((s, s))).unsqueeze(0) < 0.5).unsqueeze(0)


def _torch_fallback(x, mask):
    """forward_torch_softmax (fused_softmax.py 313-340) with scale None and softmax_in_fp32, on
    the CPU, handed the data loader's mask (not None: no get_default_causal_mask)."""
    inp = x.float() if x.dtype != torch.float32 else x.clone()  # fp32: stands in for the scores
    inp.masked_fill_(mask, -10000.0)
    probs = torch.nn.Softmax(dim=-1)(inp)
    return probs.to(x.dtype) if x.dtype != torch.float32 else probs


def test_the_bf16_fallback_runs_torchs_four_kernels_no_scale_and_builds_no_mask():
    b, tp = 1, 8  # 2 attention batches: the fused kernel does not apply
    s = SPEC.seq
    n = b * (SPEC.heads // tp) * s * s
    fwd = layer_forward(SPEC, b, tp, 1, False, "bf16")
    mine = _scores_ops(fwd)
    # torch: cast, masked_fill_, softmax, cast; no mul, and the loader's mask (built once a
    # sample, outside the layer) keeps forward_torch_softmax from building one
    x = torch.randn(2, 2, 32, 32, dtype=torch.bfloat16, requires_grad=True)
    mask = _loader_mask(32)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        probs = _torch_fallback(x, mask)
    fwd_kernels = _work(p)
    assert fwd_kernels == ["aten::copy_", "aten::masked_fill_", "aten::_softmax", "aten::copy_"]
    assert len(mine) == len(fwd_kernels)
    assert not [op for op, _, _ in mine if getattr(op, "kind", None) == "mul"]
    # bytes by hand: bf16 -> fp32 cast 2n + 4n; masked_fill_ in place 8n; softmax 8n; the cast
    # back 4n + 2n
    assert [op.bytes for op, _, _ in mine] == pytest.approx([6 * n, 8 * n, 8 * n, 6 * n])
    # backward, torch: cast, softmax backward, masked_fill's clone and masked_fill_, cast
    with profile(activities=[ProfilerActivity.CPU]) as p:
        probs.backward(torch.randn_like(probs))
    bwd_kernels = _work(p, skip_accumulate=False)
    assert bwd_kernels == ["aten::copy_", "aten::_softmax_backward_data", "aten::copy_",
                           "aten::masked_fill_", "aten::copy_"]
    bwd = _scores_ops(layer_backward(fwd, tp, False))
    assert sum(c for _, _, c in bwd) == len(bwd_kernels)
    # bytes by hand: the casts 6n each, softmax backward reads y and dy and writes dx (12n),
    # the clone and the masked_fill_ 8n each
    assert [op.bytes * k for op, k, _ in bwd] == pytest.approx([6 * n, 12 * n, 16 * n, 6 * n])


def test_the_fp32_path_masks_then_softmaxes_and_bert_runs_the_same_kernels():
    b, tp = 1, 8
    s = SPEC.seq
    n = b * (SPEC.heads // tp) * s * s
    mine = _scores_ops(layer_forward(SPEC, b, tp, 1, False, "fp32"))
    x = torch.randn(2, 2, 32, 32, requires_grad=True)
    mask = _loader_mask(32)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        _torch_fallback(x, mask)
    # the clone stands in for the scores bmm's output; then the mask and the softmax
    assert _work(p)[1:] == ["aten::masked_fill_", "aten::_softmax"]
    assert [type(op).__name__ for op, _, _ in mine] == ["FallbackMaskFill", "FallbackSoftmax"]
    assert [op.bytes for op, _, _ in mine] == [8 * n, 8 * n]
    # BERT (bidirectional): its padding mask comes from the model; cast, mask, softmax, cast
    bert = dataclasses.replace(SPEC, pretraining_heads=True)
    assert not bert.causal
    kinds = [getattr(op, "kind", "softmax") for op, _, _ in
             _scores_ops(layer_forward(bert, b, tp, 1, False, "bf16"))]
    assert kinds == ["cast", "where", "softmax", "cast"]


@pytest.mark.parametrize("pp", [1, 2])
def test_berts_lm_head_dense_and_layernorm_gradients_are_all_reduced_under_sp(pp):
    bert = parse_model("bert-large")
    plain = dataclasses.replace(bert, pretraining_heads=False)
    lay = Layout(tp=2, pp=pp, sequence_parallel=True, dtype="bf16")
    h = bert.hidden
    last = [tp_norm_grad_bytes(bert, lay, s) - tp_norm_grad_bytes(plain, lay, s) for s in range(pp)]
    # the dense's h x h weight and h bias, the LayerNorm's weight and bias, in fp32 main_grad,
    # on the last stage only (the pooler and binary head are not sequence_parallel)
    assert last == [0] * (pp - 1) + [(1024 * 1024 + 3 * 1024) * 4]
    assert h == 1024
    assert tp_norm_grad_bytes(bert, Layout(tp=2, pp=pp, dtype="bf16"), pp - 1) == 0  # no SP
