"""Megatron's embedding group: with pp > 1 and a tied LM head the first and the last pipeline
stage each hold the word embedding and all-reduce its gradient between them every iteration,
after the data-parallel sync and before the optimizer step (Narayanan et al. SC'21;
Megatron's _allreduce_word_embedding_grads)."""
import warnings

import pytest

from kit.comm import predict_collective
from kit.hardware.system import get_system
from kit.parallel import Layout, parse_model, predict_parallel

SHAPE = "gpt:layers=4,hidden=1024,heads=16,seq=256,vocab=50257"
LABEL = "tied embedding grads all-reduce"


def _run(shape, **kw):
    lay = Layout(**{"dp": 2, "tp": 2, "pp": 4, "micro_batch": 1, "global_batch": 8, **kw})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = predict_parallel(shape, "dgx-a100", lay, nodes=-(-lay.world_size // 8), graph=False, keep=True)
    return lay, r["_result"]


def _ops(res, text, kind=None):
    """GPU ops (not their launches) whose label holds text."""
    g = res.graph
    return [i for i, label in enumerate(g.label) if text in label and g.kind[i] in (kind or ("compute", "comm"))]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_tied_embedding_grads_are_all_reduced_between_the_first_and_last_stage(dtype):
    lay, res = _run(SHAPE, dtype=dtype)
    ops = _ops(res, LABEL)
    first, last = lay.rank(0, 0, 0), lay.rank(lay.pp - 1, 0, 0)
    assert sorted(res.graph.rank[i] for i in ops) == [first, last]
    # this rank's shard of the padded vocabulary (50257 -> 50432, a multiple of 128 x tp 2), in
    # the gradient dtype (bf16 models keep fp32 gradients), over the slowest (first, last) pair
    grad_bytes = 2 if dtype == "fp16" else 4
    nbytes = 50432 // 2 * 1024 * grad_bytes
    system = get_system("dgx-a100", nodes=2)
    want = max(predict_collective("allreduce", nbytes, system,
                                  ranks=[lay.rank(0, d, t), lay.rank(lay.pp - 1, d, t)]).time_ms
               for d in range(lay.dp) for t in range(lay.tp))
    for i in ops:
        assert res.graph.dur_ms[i] == pytest.approx(want)
        # both copies leave the all-reduce at the same time: it is one collective
        assert res.end_ms[i] == pytest.approx(res.end_ms[ops[0]])
    # the optimizer steps of both stages wait for it (it is on the iteration's critical path)
    for rank in (first, last):
        step = [i for i in _ops(res, "optimizer step") if res.graph.rank[i] == rank]
        assert step and res.start_ms[step[0]] >= res.end_ms[ops[0]] - 1e-9


def test_the_embedding_all_reduce_waits_for_the_data_parallel_sync():
    lay, res = _run(SHAPE)
    ar = [i for i in _ops(res, LABEL) if res.graph.rank[i] == 0][0]
    dp = [i for i in _ops(res, "dp ", ("comm",)) if res.graph.rank[i] == 0]
    assert dp and res.start_ms[ar] >= max(res.end_ms[i] for i in dp) - 1e-9


@pytest.mark.parametrize("shape, pp", [(SHAPE + ",tied=false", 4),  # an LM head of its own
                                       (SHAPE, 1)])  # one stage holds the one embedding
def test_no_embedding_all_reduce_without_a_second_copy(shape, pp):
    assert parse_model(shape).tied == ("tied=false" not in shape)
    _, res = _run(shape, pp=pp)
    assert _ops(res, LABEL) == []


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_the_stages_embedding_copies_hold_the_padded_vocabulary_the_all_reduce_moves(tp):
    """The first stage's word embedding and the last stage's copy are [padded vocab / tp, hidden]
    (Megatron's _vocab_size_with_padding), as the lookup, the logits and the embedding group's
    all-reduce have them: their weights, gradients and optimizer state had counted 50,257 rows
    where the buffers hold 50,304 (tp 1) or 50,432 (tp 2)."""
    from kit.parallel.build import embedding_sync_bytes
    from kit.parallel.memory import edge_params

    spec = parse_model(SHAPE + ",rope=true,tied=true")  # no position table beside the word embedding
    lay = Layout(tp=tp, pp=4, dtype="bf16")
    first, _ = edge_params(spec, lay, 0)
    last = edge_params(spec, lay, lay.pp - 1)[1]
    norm = 2 * spec.hidden  # the final norm, beside the last stage's copy
    assert first * lay.grad_bytes == embedding_sync_bytes(spec, lay)
    assert (last - norm) * lay.grad_bytes == embedding_sync_bytes(spec, lay)
