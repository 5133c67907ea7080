"""Qwen3's per-head q/k norms under tensor parallelism, as Megatron-core holds and syncs them:
q_layernorm and k_layernorm are built head_dim wide (transformer/attention.py), whole on every TP
rank, and finalize_model_grads' _allreduce_non_tensor_model_parallel_grads sums their gradients
over the TP group whenever config.qk_layernorm is set, with or without sequence parallelism
(megatron-core 0.16.1, distributed/finalize_model_grads.py lines 353-356). The kit had split them
by tp and all-reduced them with neither."""
import warnings
from dataclasses import replace

import pytest

from kit.parallel import Layout, parse_model, predict_parallel
from kit.parallel.build import tp_norm_grad_bytes
from kit.parallel.memory import layer_rank_params, local_params
from tests.test_parallel_embedding_group import _ops

# a Qwen3-style inline shape: 4 layers, 256 wide, 4 heads of 64, 2 KV heads, SwiGLU 512
SHAPE = "llama:layers=4,hidden=256,heads=4,kv_heads=2,ffn=512,seq=128,vocab=1000,qk_norm=true"
H, HD, KV, F, L = 256, 64, 2 * 64, 512, 4


def test_a_rank_holds_the_qk_norms_whole():
    spec = parse_model(SHAPE)
    for tp in (2, 4):
        # split over tp: q, k, v and o ([h, h + 2kv], [h, h]), gate, up, down (3 h f); whole:
        # the two RMSNorms (2h) and q_norm, k_norm (a head each)
        split = H * (H + 2 * KV) + H * H + 3 * H * F
        assert layer_rank_params(spec, Layout(tp=tp), 0) == (split / tp + 2 * H + 2 * HD, 0)


def test_qwen3_8b_at_tp8_holds_8064_more_weights_a_rank():
    spec = parse_model("qwen3-8b")
    lay = Layout(tp=8, dtype="bf16")
    plain = replace(spec, qk_norm=False)
    # 36 layers x (q_norm + k_norm, 128 each) whole on the rank, not 1/8 of them; the model
    # itself 73,728 weights larger
    assert spec.params - plain.params == 36 * 2 * 128
    assert local_params(spec, lay, 0) - local_params(plain, lay, 0) == 36 * 2 * 128


@pytest.mark.parametrize("sp", [False, True])
def test_the_tp_group_all_reduces_their_gradients_with_or_without_sp(sp):
    spec = parse_model(SHAPE)
    lay = Layout(tp=2, sequence_parallel=sp, dtype="bf16")  # fp32 main grads: 4 bytes each
    want = L * 2 * HD * 4
    if sp:  # and the norms' (2h a layer), the final norm's (h)
        want += (L * 2 * H + H) * 4
    assert tp_norm_grad_bytes(spec, lay, 0) == want
    assert tp_norm_grad_bytes(spec, Layout(tp=1, dtype="bf16"), 0) == 0
    assert tp_norm_grad_bytes(parse_model(SHAPE.replace("qk_norm=true", "qk_norm=false")), lay, 0) == (
        (L * 2 * H + H) * 4 if sp else 0)


def test_the_step_runs_the_qk_norm_all_reduce_without_sp():
    lay = Layout(tp=2, dp=2, micro_batch=1, global_batch=4, dtype="bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = predict_parallel(SHAPE, "dgx-a100", lay, nodes=1, graph=False, keep=True)["_result"]
    ops = _ops(res, "qk-norm grads all-reduce", ("comm",))
    assert [res.graph.rank[i] for i in ops] == [lay.rank(0, 0, 0)]
    step = [j for j in _ops(res, "optimizer step") if res.graph.rank[j] == lay.rank(0, 0, 0)]
    assert step and res.start_ms[step[0]] >= res.end_ms[ops[0]] - 1e-9
