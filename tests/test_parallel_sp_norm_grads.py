"""Sequence parallelism's norm-gradient all-reduce: with SP a rank runs the norms and the
row-parallel biases' adds on 1/tp of the tokens, so its gradients of those replicated weights
are partial; Megatron all-reduces them over the TP group after the DP sync and before the
embedding group's and the optimizer step (finalize_model_grads -> _allreduce_layernorm_grads;
Korthikanti et al. 2022). It had been left out."""
import warnings

import pytest

from kit.comm import predict_collective
from kit.hardware.system import get_system
from kit.parallel import Layout, parse_model, predict_parallel
from kit.parallel.build import tp_norm_grad_bytes
from tests.test_parallel_embedding_group import SHAPE, _ops

LABEL = "sequence-parallel norm grads all-reduce"


def _run(shape=SHAPE, **kw):
    lay = Layout(**{"dp": 2, "tp": 2, "pp": 2, "micro_batch": 1, "global_batch": 8,
                    "sequence_parallel": True, **kw})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = predict_parallel(shape, "dgx-a100", lay, nodes=1, graph=False, keep=True)
    return lay, r["_result"]


@pytest.mark.parametrize("pp, chunks", [(1, 1), (2, 1), (2, 2)])
def test_the_bytes_are_each_stages_norm_and_row_bias_gradients(pp, chunks):
    spec = parse_model(SHAPE)
    lay = Layout(tp=2, pp=pp, virtual_stages=chunks, sequence_parallel=True, dtype="bf16")
    per_stage = [tp_norm_grad_bytes(spec, lay, s) for s in range(pp)]
    # every layer once (two norms' weight and bias, two row-parallel biases), the final norm
    # once, in fp32 main gradients; no stage without its layers
    assert sum(per_stage) == (spec.layers * 6 * spec.hidden + 2 * spec.hidden) * 4
    assert all(b >= spec.layers // pp * 6 * spec.hidden * 4 for b in per_stage)
    assert tp_norm_grad_bytes(spec, Layout(tp=2, pp=pp, virtual_stages=chunks), 0) == 0


def test_each_stage_all_reduces_its_norm_gradients_before_the_optimizer_step():
    lay, res = _run()
    ops = _ops(res, LABEL, ("comm",))
    assert sorted(res.graph.rank[i] for i in ops) == [lay.rank(s, 0, 0) for s in range(lay.pp)]
    spec = parse_model(SHAPE)
    system = get_system("dgx-a100")
    for i in ops:
        stage = [s for s in range(lay.pp) if lay.rank(s, 0, 0) == res.graph.rank[i]][0]
        want = max(predict_collective("allreduce", tp_norm_grad_bytes(spec, lay, stage), system,
                                      ranks=list(lay.tp_group(stage, d))).time_ms for d in range(lay.dp))
        assert res.graph.dur_ms[i] == pytest.approx(want) and want > 0
        rank = res.graph.rank[i]
        dp = [j for j in _ops(res, "dp ", ("comm",)) if res.graph.rank[j] == rank]
        step = [j for j in _ops(res, "optimizer step") if res.graph.rank[j] == rank]
        assert dp and res.start_ms[i] >= max(res.end_ms[j] for j in dp) - 1e-9
        assert step and res.start_ms[step[0]] >= res.end_ms[i] - 1e-9
    # the tied embedding's all-reduce (pp 2) comes after it, as finalize_model_grads runs them
    emb = [j for j in _ops(res, "tied embedding grads all-reduce") if res.graph.rank[j] == res.graph.rank[ops[0]]]
    assert emb and res.start_ms[emb[0]] >= res.end_ms[ops[0]] - 1e-9


def test_no_norm_all_reduce_without_sequence_parallelism():
    _, res = _run(sequence_parallel=False)
    assert _ops(res, LABEL, ("comm",)) == []


def test_a_moe_layer_all_reduces_its_router_weight():
    """Megatron-core's Router marks its weight (experts x hidden) `sequence_parallel`: it routes
    the rank's 1/tp of the tokens, and finalize_model_grads all-reduces its gradient with the
    norms'. A MoE layer has no dense second MLP bias; its router weight takes that place."""
    moe = parse_model("moe:layers=4,hidden=256,heads=4,experts=8,moe_every=2,seq=128,vocab=512")
    dense = parse_model("gpt:layers=4,hidden=256,heads=4,seq=128,vocab=512")
    lay = Layout(tp=2, sequence_parallel=True, dtype="bf16")
    moe_layers = sum(moe.is_moe(i) for i in range(moe.layers))
    assert moe_layers == 2
    extra = tp_norm_grad_bytes(moe, lay, 0) - tp_norm_grad_bytes(dense, lay, 0)
    assert extra == moe_layers * (moe.experts - 1) * moe.hidden * lay.grad_bytes
